//! Builds what the binary carries inside itself, as samply carries its preload library:
//! - the demo workload (`demo/train_demo.c`), against the simulated CUDA of `simcuda`;
//! - with the `embed-shim` feature, liboomtrace.so itself (a nested `cargo build` of the shim
//!   into its own target directory), so that a `cargo install`ed oomtrace is one file.
//!   Without the feature an empty placeholder is embedded and the CLI finds the library on
//!   disk (next to the binary or through OOMTRACE_LIB).

use std::path::{Path, PathBuf};
use std::process::Command;

fn embed_shim(out: &Path) {
    let target = out.join("liboomtrace.so");
    if std::env::var_os("CARGO_FEATURE_EMBED_SHIM").is_none() {
        std::fs::write(&target, b"").expect("write the empty placeholder");
        return;
    }
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("manifest dir"));
    let workspace = manifest_dir.parent().expect("workspace root");
    for dir in ["shim/src", "proto/src"] {
        println!("cargo:rerun-if-changed={}", workspace.join(dir).display());
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let target_dir = out.join("shim-target");
    // Its own target directory: the outer build holds the lock on the usual one.
    let status = Command::new(&cargo)
        .args([
            "build",
            "--release",
            "--locked",
            "-p",
            "oomtrace-shim",
            "--manifest-path",
        ])
        .arg(workspace.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target_dir)
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .status()
        .unwrap_or_else(|e| panic!("cannot run {cargo} to build the shim: {e}"));
    assert!(
        status.success(),
        "building liboomtrace.so for embedding failed"
    );
    std::fs::copy(target_dir.join("release/liboomtrace.so"), &target).expect("copy liboomtrace.so");
}

fn main() {
    let lib_dir = std::env::var("DEP_SIMCUDA_LIB_DIR").expect("simcuda exports lib_dir");
    let include_dir =
        std::env::var("DEP_SIMCUDA_INCLUDE_DIR").expect("simcuda exports include_dir");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    embed_shim(&out);
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
        // The library file itself rather than `-l:libcudart.so.12`, which zig's linker (the
        // wheel's manylinux build, docs/PACKAGING.md) does not take; the program still
        // needs it by its soname.
        .arg(Path::new(&lib_dir).join("libcudart.so.12"))
        .arg("-ldl")
        .status()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run the C compiler {}: {e}",
                compiler.path().display()
            )
        });
    assert!(status.success(), "compiling {} failed", src.display());
}
