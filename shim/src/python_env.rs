//! Plain `LD_PRELOAD` into a Python program: what `oomtrace run` sets up, so that a PyTorch
//! job's tensors are traced (the allocator trace tracker, attached when PyTorch initialises
//! CUDA) and its steps come from its optimizer here too.
//!
//! The only code of ours that runs from a constructor, because Python reads `PYTHONPATH`
//! before any CUDA call could start the shim. It touches nothing but three environment
//! variables, and only when the program is a Python interpreter and nobody said what to do
//! (`OOMTRACE_TORCH` unset: `oomtrace run` always sets it, `OOMTRACE_TORCH=` turns it all
//! off) or said only `OOMTRACE_TORCH=segments` (no tensors: the step hook alone):
//! `PYTHONPATH` gets the sitecustomize and the `oomtrace` package first (a sitecustomize of
//! the program's own still runs), `OOMTRACE_TORCH=tracker,steps` (or `segments,steps`), and
//! `OOMTRACE_LIB` names this library. The files are written once into oomtrace's cache
//! directory (`oomtrace_proto::host::cache`); the tokens are `oomtrace_proto::host::torch_hooks`.
//! Children inherit all three and are left as they are. In a setuid or setgid process it does
//! nothing at all (`secure.rs`).

use std::ffi::OsString;

use oomtrace_proto::host::torch_hooks::{self, TorchHook};

#[used]
#[link_section = ".init_array"]
static PREPARE: extern "C" fn() = prepare;

extern "C" fn prepare() {
    let _ = std::panic::catch_unwind(prepare_python_env);
}

fn prepare_python_env() {
    // Before any environment variable is read: in a setuid or setgid program the environment
    // is the caller's, and nothing here may act on it.
    if crate::secure::secure_execution() {
        return;
    }
    let flag = |name: &str| std::env::var_os(name);
    if flag("OOMTRACE_DISABLE").is_some_and(|v| v == "1") {
        return;
    }
    // What the sitecustomize is told to do: tensors and steps, unless the user opted out of
    // tensors; anything else set (by `oomtrace run`, or `OOMTRACE_TORCH=` by hand) is left
    // alone.
    let wanted = match flag(torch_hooks::VAR) {
        None => [TorchHook::Tracker, TorchHook::Steps],
        // Said back with the step hook named, so that a Python child (which inherits the
        // variable and `PYTHONPATH`) is left alone instead of getting the paths again.
        Some(v) if v == TorchHook::Segments.token() => [TorchHook::Segments, TorchHook::Steps],
        Some(_) => return,
    };
    let Ok(exe) = std::fs::read_link("/proc/self/exe") else {
        return;
    };
    let is_python = exe
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("python"));
    if !is_python {
        return;
    }
    let dir = match oomtrace_proto::host::cache::python_files() {
        Ok(dir) => dir,
        Err(e) => {
            crate::log::warn(&format!(
                "cannot write the Python hooks (cannot write {e}): tensors are not traced \
                 (segments only) and steps are found automatically"
            ));
            return;
        }
    };
    let Ok(path) = oomtrace_proto::host::cache::python_path(&dir, std::env::var_os("PYTHONPATH"))
    else {
        return;
    };
    let lib = crate::symbols::own_path();
    // Constructors run before main, on the only thread there is: nothing reads the
    // environment concurrently.
    std::env::set_var("PYTHONPATH", path);
    std::env::set_var(torch_hooks::VAR, torch_hooks::value(&wanted));
    if let Some(lib) = lib {
        std::env::set_var("OOMTRACE_LIB", OsString::from(lib));
    }
}
