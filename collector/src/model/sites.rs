//! Call-site identity (docs/sites.md): which stacks are one call site. A stack's key is its
//! frames less those inside the Python interpreter, each Python frame by its line; the shim's
//! stack ids map to sites once, when their `StackDef` arrives.

use oomtrace_proto::python::{CodeDef, PyFrame};
use oomtrace_proto::wire::ModuleDef;
use oomtrace_proto::StackId;
use rustc_hash::FxHashMap;

use super::frames::{Module, RawFrame};
use super::Process;

/// A deduplicated call site within one process. 0 = no stack recorded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SiteId(pub u32);

/// Whether the module at `path` is the Python interpreter: `libpython3.11.so.1.0` (and any
/// other `libpython*.so*`), or an executable named `python`, `python3`, `python3.11`,
/// `python3.13t`, ... (a statically linked interpreter). Decided from the file name alone, so
/// it works without symbols. Extension modules (`_ctypes.cpython-311-x86_64-linux-gnu.so`),
/// libffi and the user's own libraries are not the interpreter.
pub fn is_interpreter_module(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    if let Some(rest) = name.strip_prefix("libpython") {
        return rest.contains(".so");
    }
    let Some(version) = name.strip_prefix("python") else {
        return false;
    };
    // The version, then the ABI flags of a build variant (debug `d`, free-threaded `t`,
    // the old pymalloc `m`).
    let flags = version.trim_start_matches(|c: char| c.is_ascii_digit() || c == '.');
    flags.chars().all(|c| matches!(c, 'd' | 't' | 'm'))
}

/// Shim stack id -> site, resolved once per stack (when its `StackDef` arrives) and looked up
/// by every allocation event. The shim numbers its stacks 1, 2, 3, ...: ids index a vector,
/// no hashing per event. An id far past the stacks defined so far (a damaged or hostile trace)
/// goes to a map instead, so that memory stays O(stacks) whatever the ids.
#[derive(Debug, Default)]
pub(super) struct StackSites {
    /// Site by id, `UNDEFINED` where none was defined (an id defined past its end is in
    /// `sparse`).
    pub(super) dense: Vec<u32>,
    sparse: FxHashMap<u32, SiteId>,
    defined: usize,
}

const UNDEFINED: u32 = u32::MAX;

impl StackSites {
    pub(super) fn insert(&mut self, id: u32, site: SiteId) {
        self.defined += 1;
        let i = id as usize;
        if i >= self.dense.len() && i <= 2 * self.defined + 1024 {
            self.dense.resize(i + 1, UNDEFINED);
        }
        match self.dense.get_mut(i) {
            Some(d) => {
                *d = site.0;
                // A later definition replaces an earlier one, wherever that one went.
                if !self.sparse.is_empty() {
                    self.sparse.remove(&id);
                }
            }
            None => {
                self.sparse.insert(id, site);
            }
        }
    }

    pub(super) fn get(&self, id: u32) -> Option<SiteId> {
        match self.dense.get(id as usize) {
            Some(&s) if s != UNDEFINED => Some(SiteId(s)),
            _ => self.sparse.get(&id).copied(),
        }
    }
}

/// A stack's identity as a call site: its frames less those inside the Python interpreter,
/// and each Python frame by its source line rather than its bytecode offset.
///
/// CPython specialises a call after a few executions (3.11+): the same Python line then
/// reaches the same native function through other interpreter functions (`PyObject_Vectorcall`
/// and `method_vectorcall_O` at first, a direct call after), and the frame's last instruction
/// moves from `CALL` to the specialised `PRECALL` of the same line. Counted apart, one leak
/// would be split into two sites (53 + 7 allocations) and the small one reported, then
/// resolved. Every frame outside the interpreter (extension modules, libffi, the user's own
/// libraries) still counts, and so does the Python line; two calls on one line that reach
/// the same native frames are one site (the report names lines anyway). A frame whose code
/// object was never sent keeps its offset.
fn site_key(
    frames: &[RawFrame],
    interpreter: &[bool],
    codes: &FxHashMap<u32, CodeDef>,
) -> Vec<RawFrame> {
    /// Marks an offset that holds a line instead.
    const LINE: u32 = 1 << 31;
    frames
        .iter()
        .filter(|f| {
            !f.module
                .is_some_and(|m| interpreter.get(m).copied().unwrap_or(false))
        })
        .map(|f| match PyFrame::decode(f.addr) {
            Some(py) => {
                let line = codes.get(&py.code).and_then(|c| c.line_at(py.offset));
                RawFrame {
                    addr: PyFrame {
                        offset: line.map_or(py.offset, |l| l | LINE),
                        ..py
                    }
                    .encode(),
                    module: None,
                }
            }
            None => f.clone(),
        })
        .collect()
}

impl Process {
    pub(super) fn define_module(&mut self, def: ModuleDef) {
        let id = def.id;
        self.interpreter_modules
            .push(is_interpreter_module(&def.path));
        self.modules.push(Module { def, gone: false });
        self.module_index.insert(id, self.modules.len() - 1);
    }

    fn module_of(&self, addr: u64) -> Option<usize> {
        // Return addresses point after the call; look up the call instruction.
        let a = addr.wrapping_sub(1);
        self.module_index.values().copied().find(|&i| {
            let d = &self.modules[i].def;
            d.start <= a && a < d.end
        })
    }

    pub(super) fn define_stack(&mut self, id: StackId, frames: &[u64]) {
        let raw: Vec<RawFrame> = frames
            .iter()
            .map(|&addr| RawFrame {
                addr,
                module: if PyFrame::decode(addr).is_some() {
                    None
                } else {
                    self.module_of(addr)
                },
            })
            .collect();
        let key = site_key(&raw, &self.interpreter_modules, &self.codes);
        let site = match self.site_index.get(&key) {
            Some(&s) => {
                if self.sites[s.0 as usize] != raw {
                    self.merged_stacks += 1;
                }
                s
            }
            None => {
                let s = SiteId(self.sites.len() as u32);
                self.sites.push(raw);
                self.site_index.insert(key, s);
                s
            }
        };
        self.stack_sites.insert(id.0, site);
    }

    /// The call site a shim stack id stands for (0 if none or not yet defined); counts nothing.
    pub fn stack_site(&self, stack: StackId) -> SiteId {
        self.stack_sites.get(stack.0).unwrap_or_default()
    }

    pub(super) fn site_of(&mut self, stack: StackId) -> SiteId {
        if stack.is_none() {
            return SiteId(0);
        }
        match self.stack_sites.get(stack.0) {
            Some(s) => s,
            None => {
                self.unknown_stacks += 1;
                SiteId(0)
            }
        }
    }
}

/// Files of the interpreter's own library and of installed packages: a frame there is rarely
/// the line a user can change.
pub fn is_library_file(file: &str) -> bool {
    file.starts_with('<')
        || file.contains("/site-packages/")
        || file.contains("/dist-packages/")
        || is_stdlib_file(file)
        || is_oomtrace_python_file(file)
}

/// The library a Python file of [`is_library_file`] belongs to, as a user names it: the
/// package and its subpackage under site-packages (`torch.nn` for
/// `.../site-packages/torch/nn/modules/module.py`, `torch` for `.../torch/_tensor.py`),
/// `stdlib` for the standard library and `<frozen ...>` code, `oomtrace` for oomtrace's own;
/// None for the user's own code.
pub fn library_name(file: &str) -> Option<String> {
    if is_oomtrace_python_file(file) {
        return Some("oomtrace".into());
    }
    let under = ["/site-packages/", "/dist-packages/"]
        .iter()
        .find_map(|m| file.rfind(m).map(|i| &file[i + m.len()..]));
    if let Some(rest) = under {
        let parts: Vec<&str> = rest.split('/').collect();
        let package = |p: &str| p.strip_suffix(".py").unwrap_or(p).to_string();
        return Some(match parts.as_slice() {
            [top, sub, _, ..] => format!("{}.{sub}", package(top)),
            [top, ..] => package(top),
            [] => "library".into(),
        });
    }
    (file.starts_with('<') || is_stdlib_file(file)).then(|| "stdlib".into())
}

/// `.../lib/python3.N/...`: the standard library of an installed interpreter (a user directory
/// that merely starts with `python3` is not).
fn is_stdlib_file(file: &str) -> bool {
    file.match_indices("/lib/python3.").any(|(i, m)| {
        let rest = &file[i + m.len()..];
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        digits > 0 && rest[digits..].starts_with(['/', 't'])
    })
}

/// oomtrace's own Python code, matched by what it is: the package is the modules
/// `oomtrace/__init__.py`, `_abi.py`, `_session.py` and `pytest_plugin.py`, and `run` adds `boot/sitecustomize.py`
/// beside it in its cache directory. Never by a path fragment such as `/oomtrace/`: a user's project cloned
/// into a directory of that name is still the user's code.
pub fn is_oomtrace_python_file(file: &str) -> bool {
    let mut parts = file.rsplit('/');
    let (Some(name), Some(dir)) = (parts.next(), parts.next()) else {
        return false;
    };
    match (dir, name) {
        ("oomtrace", "__init__.py" | "_abi.py" | "_session.py" | "pytest_plugin.py") => true,
        // <cache>/oomtrace/<version>-python-<hash>/boot/sitecustomize.py
        ("boot", "sitecustomize.py") => parts.next().is_some_and(|d| d.contains("-python-")),
        _ => false,
    }
}
