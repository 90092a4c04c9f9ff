//! The frames of a call site's stack as the model keeps them, and as the report's
//! symbolizer reads them (`Stacks`) and fills them in (`FrameInfo`).

use oomtrace_proto::python::CodeDef;
use oomtrace_proto::wire::ModuleDef;
use rustc_hash::FxHashMap;

use super::Process;

/// One frame of a stack, resolved to its module when the stack arrived.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct RawFrame {
    pub addr: u64,
    /// Index into `Process::modules`, if the address lay in a known module.
    pub module: Option<usize>,
}

#[derive(Clone, Debug)]
pub struct Module {
    pub def: ModuleDef,
    pub gone: bool,
}

/// The tables a call site's frames are read with (sites, modules, Python code objects):
/// what symbolization needs of a process, and no more.
#[derive(Clone, Copy, Debug)]
pub struct Stacks<'a> {
    /// Frames of each site; index = [`SiteId`](super::SiteId).
    pub sites: &'a [Vec<RawFrame>],
    pub modules: &'a [Module],
    pub codes: &'a FxHashMap<u32, CodeDef>,
    /// Frames named by their producer: (module path, function) by address.
    pub named: &'a FxHashMap<u64, (String, String)>,
}

impl<'a> From<&'a Process> for Stacks<'a> {
    fn from(p: &'a Process) -> Stacks<'a> {
        Stacks {
            sites: &p.sites,
            modules: &p.modules,
            codes: &p.codes,
            named: &p.named_frames,
        }
    }
}

/// One symbolized frame (filled in by the report's symbolizer). Empty strings and 0 mean
/// unknown.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct FrameInfo {
    pub function: String,
    pub file: String,
    pub line: u32,
    /// File name of the module (executable or shared object).
    pub module: String,
    /// Absolute return address in the traced process, hex.
    pub address: String,
    /// Address within the module's file, hex (what `addr2line -e MODULE` takes).
    pub offset: String,
    /// A Python frame (`function` is the code object's qualified name, `line` its source
    /// line, `module` is "python", `offset` the bytecode offset).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub python: bool,
    /// Its module's file changed since the trace was taken (`report::module_file`): no name,
    /// `module` and `offset` say where it was.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub module_changed: bool,
}
