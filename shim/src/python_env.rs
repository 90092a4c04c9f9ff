//! Plain `LD_PRELOAD` into a Python program: the optimizer step hook `oomtrace run` installs,
//! so that a PyTorch job's steps come from its optimizer here too (without them, PyTorch's few
//! cache segments give no steps to measure growth in).
//!
//! The only code of ours that runs from a constructor, because Python reads `PYTHONPATH`
//! before any CUDA call could start the shim. It touches nothing but three environment
//! variables, and only when the program is a Python interpreter and nobody said what to do
//! (`OOMTRACE_TORCH` unset: `oomtrace run` always sets it, `OOMTRACE_TORCH=` turns the hook
//! off): `PYTHONPATH` gets the sitecustomize and the `oomtrace` package first (a
//! sitecustomize of the program's own still runs), `OOMTRACE_TORCH=steps`, and
//! `OOMTRACE_LIB` names this library. The files are written once into oomtrace's cache
//! directory (`oomtrace_proto::cache`). Children inherit all three and are left as they are.

use std::ffi::OsString;

#[used]
#[link_section = ".init_array"]
static PREPARE: extern "C" fn() = prepare;

extern "C" fn prepare() {
    let _ = std::panic::catch_unwind(prepare_python_env);
}

fn prepare_python_env() {
    let flag = |name: &str| std::env::var_os(name);
    if flag("OOMTRACE_TORCH").is_some() || flag("OOMTRACE_DISABLE").is_some_and(|v| v == "1") {
        return;
    }
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
    let dir = match oomtrace_proto::cache::python_files() {
        Ok(dir) => dir,
        Err(e) => {
            crate::log::warn(&format!(
                "cannot write the optimizer step hook (cannot write {e}); steps are found \
                 automatically"
            ));
            return;
        }
    };
    let Ok(path) = oomtrace_proto::cache::python_path(&dir, std::env::var_os("PYTHONPATH")) else {
        return;
    };
    let lib = crate::symbols::own_path();
    // Constructors run before main, on the only thread there is: nothing reads the
    // environment concurrently.
    std::env::set_var("PYTHONPATH", path);
    std::env::set_var("OOMTRACE_TORCH", "steps");
    if let Some(lib) = lib {
        std::env::set_var("OOMTRACE_LIB", OsString::from(lib));
    }
}
