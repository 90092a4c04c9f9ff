//! Finds the Python sources that `src/host/cache.rs` embeds (the `oomtrace` package and the
//! `--torch` sitecustomize): `python/` beside the crates in the repository. In the Python
//! package's source distribution maturin puts pyproject.toml's directory (`python/`) at the
//! root, beside the crates, so there the root itself holds them.

use std::path::PathBuf;

const FILES: [&str; 5] = [
    "oomtrace/__init__.py",
    "oomtrace/_abi.py",
    "oomtrace/_session.py",
    "oomtrace/pytest_plugin.py",
    "boot/sitecustomize.py",
];

fn main() {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("manifest dir"));
    let root = manifest_dir.parent().expect("workspace root");
    let candidates = [root.join("python"), root.to_path_buf()];
    let dir = candidates
        .iter()
        .find(|d| FILES.iter().all(|f| d.join(f).is_file()))
        .unwrap_or_else(|| {
            panic!(
                "the Python sources ({}) are in none of {candidates:?}",
                FILES.join(", ")
            )
        });
    println!("cargo:rerun-if-changed=build.rs");
    for f in FILES {
        println!("cargo:rerun-if-changed={}", dir.join(f).display());
    }
    println!("cargo:rustc-env=OOMTRACE_PYTHON_DIR={}", dir.display());
}
