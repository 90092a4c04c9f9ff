//! simcuda: a simulated CUDA driver (`libcuda.so.1`) and runtime
//! (`libcudart.so.12`) for testing oomtrace without a GPU, and for
//! `oomtrace demo`.
//!
//! The libraries are C, built by this crate's build script into `OUT_DIR`:
//! the driver from `src/driver/` (one file per area, `core.c` its core; see
//! `src/driver/internal.h`), the runtime from `src/libcudart.c`, the NVML
//! stand-in from `src/nvml/`.
//! They reproduce the real ABI of the memory-management part of CUDA 12.8:
//! function names and signatures, `_v2` / `_ptsz` variants, struct layouts,
//! enum values, error codes, `cuGetProcAddress` version/flag resolution and a
//! capacity limit that makes allocations fail with
//! `CUDA_ERROR_OUT_OF_MEMORY` at exactly the configured size.  The runtime
//! reaches the driver the way NVIDIA's does: `dlopen("libcuda.so.1")`, one
//! `dlsym` for `cuGetProcAddress_v2`, everything else through that.
//!
//! Run a program against them by putting [`LIB_DIR`] (or a directory filled by
//! [`install`], or by [`install_driver`] for a program that brings its own
//! runtime) on `LD_LIBRARY_PATH`.  Behaviour is configured with
//! environment variables read at `cuInit`:
//!
//! | variable | meaning | default |
//! | --- | --- | --- |
//! | `SIMCUDA_DEVICES` | number of devices, 0..=8 (0: `cuInit` fails with `CUDA_ERROR_NO_DEVICE`) | 1 |
//! | `SIMCUDA_MEMORY` | capacity of each device: bytes, or with K/M/G/T or KiB/MiB/GiB/TiB | 16GiB |
//! | `SIMCUDA_CONTEXT_BYTES` | device memory a context consumes when created | 0 |
//! | `SIMCUDA_HOST_MEMORY` | limit on pinned host memory | 64GiB |
//!
//! The C programs under `tests/c` are built too (see [`TEST_BIN_DIR`]); they
//! are plain CUDA clients, usable as workloads for tracer tests.

use std::io;
use std::path::Path;

/// Directory holding `libcuda.so.1`, `libcudart.so.12` and their unversioned
/// symlinks.
pub const LIB_DIR: &str = concat!(env!("OUT_DIR"), "/lib");

/// Directory holding simcuda's `cuda.h` and `cuda_runtime.h`.
pub const INCLUDE_DIR: &str = concat!(env!("OUT_DIR"), "/include");

/// Directory holding the C test programs (`drvtest`, `rttest`, `macros`,
/// `abi`) and `libsimcuda_spy.so`, a preload library that logs how the
/// runtime resolves the driver.
pub const TEST_BIN_DIR: &str = concat!(env!("OUT_DIR"), "/bin");

/// The simulated driver, `libcuda.so.1`.
pub const LIBCUDA: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/lib/libcuda.so.1"));

/// The simulated runtime, `libcudart.so.12`.
pub const LIBCUDART: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/lib/libcudart.so.12"));

/// The NVML stand-in, `libnvidia-ml.so.1`: a real driver ships NVML beside
/// `libcuda.so.1`, and PyTorch's expandable segments call it unchecked.
pub const LIBNVML: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/lib/libnvidia-ml.so.1"));

/// Writes `libcuda.so.1`, `libcudart.so.12`, `libnvidia-ml.so.1` and their
/// unversioned symlinks into `dir` (created if missing), replacing whatever
/// is there under those names.
pub fn install(dir: &Path) -> io::Result<()> {
    install_files(
        dir,
        &[
            ("libcuda.so.1", LIBCUDA, "libcuda.so"),
            ("libcudart.so.12", LIBCUDART, "libcudart.so"),
            ("libnvidia-ml.so.1", LIBNVML, "libnvidia-ml.so"),
        ],
    )
}

/// Writes what a machine's driver provides, `libcuda.so.1` and
/// `libnvidia-ml.so.1` (and their unversioned symlinks), into `dir` (created
/// if missing), replacing whatever is there under those names. No runtime: a
/// program run on the simulated driver keeps its own (PyTorch's wheel, a
/// statically linked one), as it would on a real machine.
pub fn install_driver(dir: &Path) -> io::Result<()> {
    install_files(
        dir,
        &[
            ("libcuda.so.1", LIBCUDA, "libcuda.so"),
            ("libnvidia-ml.so.1", LIBNVML, "libnvidia-ml.so"),
        ],
    )
}

/// Each `(name, bytes, link)`: the file `name` and the symlink `link` to it.
fn install_files(dir: &Path, files: &[(&str, &[u8], &str)]) -> io::Result<()> {
    use std::os::unix::fs::{symlink, PermissionsExt};

    std::fs::create_dir_all(dir)?;
    for &(name, bytes, link) in files {
        let path = dir.join(name);
        // Write beside and rename: a process may have the old file mapped.
        let tmp = dir.join(format!(".{name}.tmp{}", std::process::id()));
        std::fs::write(&tmp, bytes)?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))?;
        std::fs::rename(&tmp, &path)?;
        let link_path = dir.join(link);
        match std::fs::remove_file(&link_path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        symlink(name, &link_path)?;
    }
    Ok(())
}
