//! Builds the demo workload (`demo/train_demo.c`) against the simulated CUDA from the
//! `simcuda` crate, so that `oomtrace demo` can carry it inside the binary, as samply carries
//! its preload library: a `cargo install`ed oomtrace is one file.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let lib_dir = std::env::var("DEP_SIMCUDA_LIB_DIR").expect("simcuda exports lib_dir");
    let include_dir =
        std::env::var("DEP_SIMCUDA_INCLUDE_DIR").expect("simcuda exports include_dir");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    let src = PathBuf::from("demo/train_demo.c");
    println!("cargo:rerun-if-changed={}", src.display());
    println!("cargo:rerun-if-changed=build.rs");
    let compiler = cc::Build::new().get_compiler();
    let target = out.join("train_demo");
    // No frame pointers on purpose: the demo shows stacks recovered by DWARF unwinding.
    let status = Command::new(compiler.path())
        .args(["-O1", "-g", "-fomit-frame-pointer", "-Wall", "-o"])
        .arg(&target)
        .arg(&src)
        .arg(format!("-I{include_dir}"))
        .arg(format!("-L{lib_dir}"))
        .args(["-l:libcudart.so.12", "-ldl"])
        .status()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run the C compiler {}: {e}",
                compiler.path().display()
            )
        });
    assert!(status.success(), "compiling {} failed", src.display());
}
