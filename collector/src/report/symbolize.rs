//! Addresses to function, file and line, from the modules' files on disk (DWARF when present,
//! ELF symbols otherwise). Runs only here, never in the traced process: the first symbolization
//! in a process costs tens of milliseconds and megabytes.
//!
//! Only from a file that is still the one the process ran ([`super::module_file`]: the same
//! build id, or size and modification time): a frame in a module whose file changed keeps its
//! module and offset and no name, and the module is listed ([`StackSymbolizer::stale_modules`]).
//!
//! Python frames (see `oomtrace_proto::python`) become file, function and line from the code
//! objects the shim sent, and are merged into the native stack: each native frame of the
//! interpreter loop is replaced by the Python frames it was running.
//!
//! Reads only a process's stack tables ([`Stacks`]: sites, modules, code objects); anything
//! that converts into them (a `&Process`) can be passed.

use std::collections::{HashMap, VecDeque};
use std::path::Path;

use blazesym::symbolize::source::{Elf, Source};
use blazesym::symbolize::{CodeInfo, Input, Symbolized, Symbolizer};

use oomtrace_proto::python::PyFrame;

use super::module_file::{ModuleFiles, StaleModule};
use super::roles::{backward_node_frame, FrameRole};
pub use crate::model::FrameInfo;
use crate::model::{is_library_file, is_oomtrace_python_file, RawFrame, SiteId, Stacks};

/// CPython's interpreter loop: one native frame per group of Python frames it runs.
fn is_eval_loop(function: &str) -> bool {
    matches!(
        function,
        "_PyEval_EvalFrameDefault" | "PyEval_EvalFrameEx" | "_PyEval_EvalFrame"
    )
}

/// The frame a one-line summary should name: the innermost Python frame in the user's own
/// code, else the innermost Python frame, else (PyTorch's backward pass, which has no Python
/// frames) the autograd node's `apply`, else the innermost named native frame (or frame of a
/// module whose file changed, which has no name) that is not CUDA runtime, allocator or
/// interpreter machinery ([`FrameRole`]), else the innermost named native frame. Every place
/// that names a call site in one line goes through here.
pub fn culprit(frames: &[FrameInfo]) -> Option<&FrameInfo> {
    python_culprit(frames)
        .filter(|_| runs_python(frames))
        .or_else(|| backward_node_frame(frames))
        .or_else(|| python_culprit(frames))
        .or_else(|| {
            // A frame of a module that changed since the trace has no name but is still the
            // code that ran there: naming the next named caller (`main`, libc's start) instead
            // would blame the wrong code.
            frames.iter().find(|f| {
                (!f.function.is_empty() || f.module_changed) && !FrameRole::of(f).is_internal()
            })
        })
        .or_else(|| frames.iter().find(|f| !f.function.is_empty()))
        .or(frames.first())
}

/// Whether a stack ran Python code other than oomtrace's own (a tracing hook that PyTorch
/// calls on its autograd thread leaves only oomtrace's frames there).
pub fn runs_python(frames: &[FrameInfo]) -> bool {
    frames
        .iter()
        .any(|f| f.python && !is_oomtrace_python_file(&f.file))
}

/// The innermost Python frame in the user's own code (outside site-packages, the standard
/// library and oomtrace's package), else the innermost Python frame; none without Python.
pub fn python_culprit(frames: &[FrameInfo]) -> Option<&FrameInfo> {
    frames
        .iter()
        .find(|f| f.python && !is_library_file(&f.file))
        .or_else(|| frames.iter().find(|f| f.python))
}

/// The library a Python frame's file belongs to (`torch.nn`, `stdlib`; see
/// [`crate::model::library_name`]), None for the user's own code and for native frames.
pub fn python_library(f: &FrameInfo) -> Option<String> {
    f.python
        .then(|| crate::model::library_name(&f.file))
        .flatten()
}

/// The Python frames of `site`, innermost first, from the code objects the shim sent: no
/// module file is read (cheap, and the same with or without native symbolization).
pub fn python_frames<'a>(stacks: impl Into<Stacks<'a>>, site: SiteId) -> Vec<FrameInfo> {
    let p: Stacks<'a> = stacks.into();
    p.sites
        .get(site.0 as usize)
        .map_or_else(Vec::new, |frames| {
            frames
                .iter()
                .filter_map(|f| PyFrame::decode(f.addr))
                .map(|py| python_frame(p, py))
                .collect()
        })
}

fn code_location(ci: Option<&CodeInfo<'_>>) -> (String, u32) {
    match ci {
        Some(ci) => {
            let file = match &ci.dir {
                Some(dir) => dir.join(&*ci.file).to_string_lossy().into_owned(),
                None => ci.file.to_string_lossy().into_owned(),
            };
            (file, ci.line.unwrap_or(0))
        }
        None => (String::new(), 0),
    }
}

/// Symbolizes stacks of one or more processes, caching per module file.
pub struct StackSymbolizer {
    symbolizer: Symbolizer,
    /// By (path, address in the file), for files that matched their trace (so all of one
    /// path's entries come from the same file).
    cache: HashMap<(String, u64), Vec<FrameInfo>>,
    files: ModuleFiles,
}

impl Default for StackSymbolizer {
    fn default() -> Self {
        Self::new()
    }
}

impl StackSymbolizer {
    pub fn new() -> StackSymbolizer {
        StackSymbolizer {
            symbolizer: Symbolizer::builder()
                .enable_code_info(true)
                .enable_inlined_fns(true)
                .enable_demangling(true)
                .build(),
            cache: HashMap::new(),
            files: ModuleFiles::default(),
        }
    }

    /// The modules met so far whose files no longer match their trace (their frames were
    /// left unnamed), each once, in the order met.
    pub fn stale_modules(&self) -> &[StaleModule] {
        self.files.found()
    }

    /// Frames of `site` in `stacks` (a process's), innermost first; inlined calls become
    /// frames of their own.
    pub fn site<'a>(&mut self, stacks: impl Into<Stacks<'a>>, site: SiteId) -> Vec<FrameInfo> {
        let p: Stacks<'a> = stacks.into();
        let Some(frames) = p.sites.get(site.0 as usize) else {
            return Vec::new();
        };
        let split = frames
            .iter()
            .position(|f| PyFrame::decode(f.addr).is_some())
            .unwrap_or(frames.len());
        let (native, python) = frames.split_at(split);
        // Python frames in groups, innermost first, one group per interpreter-loop call.
        let mut groups: VecDeque<Vec<FrameInfo>> = VecDeque::new();
        let mut group = Vec::new();
        for f in python {
            let Some(py) = PyFrame::decode(f.addr) else {
                continue;
            };
            group.push(python_frame(p, py));
            if py.group_end {
                groups.push_back(std::mem::take(&mut group));
            }
        }
        if !group.is_empty() {
            groups.push_back(group);
        }
        let mut out = Vec::with_capacity(frames.len());
        for f in native {
            let infos = self.frame(p, f);
            if !groups.is_empty() && infos.iter().any(|fi| is_eval_loop(&fi.function)) {
                out.extend(groups.pop_front().unwrap_or_default());
            } else {
                out.extend(infos);
            }
        }
        // The native unwind stopped before reaching every interpreter frame (depth limit, or
        // an interpreter without symbols): the rest go outermost.
        out.extend(groups.into_iter().flatten());
        out
    }

    fn frame(&mut self, p: Stacks<'_>, f: &RawFrame) -> Vec<FrameInfo> {
        if let Some(py) = PyFrame::decode(f.addr) {
            return vec![python_frame(p, py)];
        }
        let address = format!("{:#x}", f.addr);
        if let Some((path, function)) = p.named.get(&f.addr) {
            return vec![FrameInfo {
                function: function.clone(),
                module: Path::new(path)
                    .file_name()
                    .map_or_else(|| path.clone(), |n| n.to_string_lossy().into_owned()),
                address,
                ..Default::default()
            }];
        }
        let Some(m) = f.module.and_then(|i| p.modules.get(i)) else {
            return vec![FrameInfo {
                address,
                ..Default::default()
            }];
        };
        let path = m.def.path.clone();
        let module = Path::new(&path)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| path.clone());
        // The call instruction precedes the return address.
        let virt = f.addr.wrapping_sub(m.def.bias).wrapping_sub(1);
        let base = FrameInfo {
            function: String::new(),
            file: String::new(),
            line: 0,
            module,
            address: address.clone(),
            offset: format!("{virt:#x}"),
            python: false,
            module_changed: false,
        };
        // Checked before the cache: another process of the trace may have loaded another
        // build from the same path.
        if self.files.stale(&m.def).is_some() {
            return vec![FrameInfo {
                module_changed: true,
                ..base
            }];
        }
        let key = (path.clone(), virt);
        if let Some(hit) = self.cache.get(&key) {
            return hit
                .iter()
                .map(|fi| FrameInfo {
                    address: address.clone(),
                    ..fi.clone()
                })
                .collect();
        }
        let mut result = vec![base.clone()];
        if Path::new(&path).is_file() {
            let src = Source::Elf(Elf::new(&path));
            if let Ok(Symbolized::Sym(sym)) = self
                .symbolizer
                .symbolize_single(&src, Input::VirtOffset(virt))
            {
                // Innermost first: the instruction's own location belongs to the innermost
                // inlined function; each inlined call site belongs to its caller.
                result.clear();
                let mut callee_loc = code_location(sym.code_info.as_deref());
                for inl in sym.inlined.iter().rev() {
                    result.push(FrameInfo {
                        function: inl.name.to_string(),
                        file: callee_loc.0.clone(),
                        line: callee_loc.1,
                        ..base.clone()
                    });
                    callee_loc = code_location(inl.code_info.as_ref());
                }
                result.push(FrameInfo {
                    function: sym.name.to_string(),
                    file: callee_loc.0,
                    line: callee_loc.1,
                    ..base.clone()
                });
            }
        }
        self.cache.insert(key, result.clone());
        result
    }
}

fn python_frame(p: Stacks<'_>, py: PyFrame) -> FrameInfo {
    let mut fi = FrameInfo {
        module: "python".to_string(),
        offset: format!("{:#x}", py.offset),
        python: true,
        ..Default::default()
    };
    if let Some(code) = p.codes.get(&py.code) {
        fi.function = code.name.clone();
        fi.file = code.filename.clone();
        fi.line = code.line_at(py.offset).unwrap_or(0);
    }
    fi
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(function: &str, module: &str) -> FrameInfo {
        FrameInfo {
            function: function.into(),
            module: module.into(),
            ..Default::default()
        }
    }

    fn python(function: &str, file: &str) -> FrameInfo {
        FrameInfo {
            function: function.into(),
            file: file.into(),
            module: "python".into(),
            python: true,
            ..Default::default()
        }
    }

    /// The culprit looks past a static runtime inside an extension, names a backward-pass
    /// site by its autograd node (also when oomtrace's own hook left Python frames there), and
    /// still prefers the user's Python line.
    #[test]
    fn the_culprit_is_the_users_code_past_runtime_allocator_and_interpreter() {
        let ext = [
            frame("libcudart_static_93d2e8b04c1f6e77", "libext.so"),
            frame("cudaMalloc", "libext.so"),
            frame("scratch_forward", "libext.so"),
            frame("main", "app"),
        ];
        assert_eq!(culprit(&ext).unwrap().function, "scratch_forward");
        let all_internal = [
            frame("", "libcudart.so.12"),
            frame("cudaMalloc", "libext.so"),
        ];
        assert_eq!(culprit(&all_internal).unwrap().function, "cudaMalloc");
        let backward = [
            frame("oomtrace_malloc", "liboomtrace.so"),
            frame("at::detail::empty_generic", "libtorch_cpu.so"),
            frame(
                "torch::autograd::generated::MmBackward0::apply(std::vector<at::Tensor>&&)",
                "libtorch_cpu.so",
            ),
            frame("torch::autograd::Engine::thread_main", "libtorch_cpu.so"),
        ];
        let node = "torch::autograd::generated::MmBackward0::apply(std::vector<at::Tensor>&&)";
        assert_eq!(culprit(&backward).unwrap().function, node);
        let mut hooked = backward.to_vec();
        hooked.push(python(
            "_trace",
            "/root/.cache/oomtrace/0.1.0-python-0123456789abcdef/boot/sitecustomize.py",
        ));
        assert!(!runs_python(&hooked));
        assert_eq!(culprit(&hooked).unwrap().function, node);
        let mut forward = backward.to_vec();
        forward.push(python(
            "forward",
            "/venv/lib/python3.11/site-packages/torch/nn/linear.py",
        ));
        forward.push(python("<module>", "/home/u/train.py"));
        assert!(runs_python(&forward));
        assert_eq!(culprit(&forward).unwrap().file, "/home/u/train.py");
    }

    #[test]
    fn library_files_are_recognised_by_what_they_are_not_by_a_path_fragment() {
        for lib in [
            "<frozen importlib._bootstrap>",
            "/usr/lib/python3.11/threading.py",
            "/opt/py/lib/python3.13t/json/__init__.py",
            "/venv/lib/python3.12/site-packages/torch/nn/modules/module.py",
            "/usr/lib/python3/dist-packages/numpy/core.py",
            "/home/u/clone/python/oomtrace/__init__.py",
            "/root/.cache/oomtrace/0.1.0-python-0123456789abcdef/boot/sitecustomize.py",
        ] {
            assert!(is_library_file(lib), "{lib}");
        }
        for user in [
            "/home/u/oomtrace/train.py",
            "/src/oomtrace/tests/scenarios/python/train_leak.py",
            "/home/u/lib/python3-experiments/train.py",
            "/home/u/oomtrace/boot/sitecustomize.py",
            "train.py",
        ] {
            assert!(!is_library_file(user), "{user}");
        }
    }
}
