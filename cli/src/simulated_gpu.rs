//! The simulated GPU this binary carries (simcuda's driver and its NVML stand-in), for
//! `oomtrace run --simulate SIZE` and `oomtrace demo`: installed once into the cache
//! directory, then given to the traced program's environment only. Nothing is installed
//! system-wide and nothing of this process changes.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{locate, Failure};

/// The most device memory simcuda models.
pub const MAX_BYTES: u64 = 1 << 40;
/// The least device memory a size flag takes: a floor that catches a forgotten unit
/// (`--simulate 16` is 16 bytes).
pub const MIN_BYTES: u64 = 1 << 20;

/// A simulated device size as given and in bytes.
#[derive(Clone, Debug)]
pub struct DeviceMemory {
    pub text: String,
    pub bytes: u64,
}

impl DeviceMemory {
    /// How a report says the simulated GPU a run had: SIZE as given, and its bytes.
    pub fn as_simulated_device(&self) -> oomtrace_collector::report::SimulatedDevice {
        oomtrace_collector::report::SimulatedDevice {
            device_memory: self.text.clone(),
            device_memory_bytes: self.bytes,
        }
    }

    /// `text` as a device's memory: one rule for every size flag that names one (`run
    /// --simulate`, `demo --device-memory`, `fit --memory`), [`MIN_BYTES`] to [`MAX_BYTES`].
    pub fn parse(text: &str) -> Result<DeviceMemory, String> {
        let bytes = oomtrace_collector::units::parse_bytes(text)?;
        if !(MIN_BYTES..=MAX_BYTES).contains(&bytes) {
            return Err(format!(
                "{text} is out of range: a device's memory is 1MiB to 1TiB"
            ));
        }
        Ok(DeviceMemory {
            text: text.trim().to_string(),
            bytes,
        })
    }
}

/// What a directory of the cache holds, and how to fill it.
pub struct Contents<'a> {
    /// The cache directory's tag (`-demo`, `-simcuda`: lowercase, see `locate::mark_used`).
    pub tag: &'static str,
    /// What it is, for the line said when the cache cannot be written.
    pub what: &'static str,
    /// Everything written, so that another build's bytes get another directory.
    pub bytes: &'a [&'a [u8]],
    /// A file that is there once the directory is complete.
    pub ready: &'static str,
    pub install: &'a dyn Fn(&Path) -> Result<(), Failure>,
}

/// The driver and NVML stand-in alone, for the user's own program (which brings its own
/// runtime, as on a machine with a GPU: PyTorch's wheel, a statically linked cudart).
pub fn driver() -> Result<Installed, Failure> {
    installed(&Contents {
        tag: "-simcuda",
        what: "the simulated GPU",
        bytes: &[simcuda::LIBCUDA, simcuda::LIBNVML],
        ready: "libcuda.so.1",
        install: &|dir| simcuda::install_driver(dir).map_err(|e| cannot_install(dir, e)),
    })
}

/// Why the simulated GPU's libraries could not be written into `dir`.
pub fn cannot_install(dir: &Path, e: std::io::Error) -> Failure {
    Failure::new(format!(
        "cannot install the simulated GPU in {}: {e}",
        dir.display()
    ))
}

/// `contents`, installed once into its cache directory and kept (`oomtrace report` on a
/// trace later needs the program's symbols). Installed into a private directory inside the
/// cache first (`.<name>.tmp-XXXXXX`, on the cache's own filesystem whatever `$TMPDIR` is),
/// then renamed into place, so a concurrent run never sees (or runs) half-written files. The
/// temporary directory is removed on every way out; one a killed run left is pruned with old
/// builds (`locate::mark_used`). A cache that cannot be written: a copy of this run's own,
/// removed afterwards.
pub fn installed(contents: &Contents) -> Result<Installed, Failure> {
    let dir = locate::cache_dir(contents.tag, contents.bytes);
    if dir.join(contents.ready).is_file() {
        locate::mark_used(&dir);
        return Ok(Installed::cached(dir));
    }
    match install_into_cache(&dir, contents) {
        Ok(()) => {
            locate::mark_used(&dir);
            Ok(Installed::cached(dir))
        }
        // A cache that cannot be written (a read-only home): this run uses a copy of its own,
        // removed when it is done.
        Err(why) => {
            let scratch = Scratch(locate::private_dir()?);
            (contents.install)(&scratch.0)?;
            eprintln!(
                "oomtrace: cannot cache {} in {} ({why}); running a temporary copy, removed \
                 afterwards",
                contents.what,
                dir.display()
            );
            Ok(Installed {
                dir: scratch.0.clone(),
                _scratch: Some(scratch),
            })
        }
    }
}

/// Installs into a temporary directory beside `dir` in the cache, then renames it to `dir`.
/// Err: why the cache cannot be used (nothing of ours is left in it).
fn install_into_cache(dir: &Path, contents: &Contents) -> Result<(), String> {
    let (Some(parent), Some(name)) = (dir.parent(), dir.file_name()) else {
        return Err("no cache directory".into());
    };
    {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)
            .map_err(|e| format!("{}: {e}", parent.display()))?;
    }
    let prefix = format!(".{}.tmp-", name.to_string_lossy());
    let fresh = Scratch(
        oomtrace_proto::host::private_dir::create(parent, &prefix)
            .map_err(|e| format!("{}: {e}", parent.display()))?,
    );
    (contents.install)(&fresh.0).map_err(|f| f.message)?;
    match std::fs::rename(&fresh.0, dir) {
        Ok(()) => {
            std::mem::forget(fresh); // it is the cache directory now
            Ok(())
        }
        // Another run won the race: theirs is as good as ours (ours goes with `fresh`).
        Err(_) if dir.join(contents.ready).is_file() => Ok(()),
        Err(e) => Err(format!("{}: {e}", dir.display())),
    }
}

/// A directory of ours, removed when dropped (an install that failed half-way, a copy used
/// for one run).
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Where the files are, and the temporary copy to remove after the run, if it is one.
pub struct Installed {
    pub dir: PathBuf,
    _scratch: Option<Scratch>,
}

impl Installed {
    fn cached(dir: PathBuf) -> Installed {
        Installed {
            dir,
            _scratch: None,
        }
    }

    /// The program's environment on this simulated GPU of `memory`: the driver found first
    /// on the library path (before any other, a real one included: `libcuda.so.1` is loaded
    /// by name), its capacity, and lazy module loading, as a real driver does by default
    /// (simcuda loads every kernel of a module at once otherwise; one the user set is kept).
    pub fn environment(&self, memory: &DeviceMemory) -> Vec<(OsString, OsString)> {
        let mut library_path = self.dir.clone().into_os_string();
        if let Some(existing) = std::env::var_os("LD_LIBRARY_PATH").filter(|v| !v.is_empty()) {
            library_path.push(":");
            library_path.push(existing);
        }
        let mut env = vec![
            (OsString::from("LD_LIBRARY_PATH"), library_path),
            (
                OsString::from("SIMCUDA_MEMORY"),
                OsString::from(memory.bytes.to_string()),
            ),
        ];
        if std::env::var_os("CUDA_MODULE_LOADING").is_none() {
            env.push(("CUDA_MODULE_LOADING".into(), "LAZY".into()));
        }
        env
    }
}

/// Runs `cmd` with the address space laid out the same way every time (`setarch -R`): real
/// PyTorch's first cuBLAS GEMM on the simulated driver picks its kernel from where things
/// land, and sometimes fails when that changes (simcuda's README). Where it may not be
/// turned off (a seccomp filter refusing `personality`), the program runs as it would have.
pub fn without_address_randomization(cmd: &mut Command) {
    // SAFETY: personality(2) is async-signal-safe; it only sets flags that the exec keeps.
    unsafe {
        cmd.pre_exec(|| {
            // 0xffffffff reads the current persona without changing it.
            let current = libc::personality(0xffff_ffff);
            if current != -1 {
                libc::personality(
                    (current as libc::c_ulong) | libc::ADDR_NO_RANDOMIZE as libc::c_ulong,
                );
            }
            Ok(())
        });
    }
}

/// What the summary says of a run on the simulated GPU.
pub fn caveat(memory: &DeviceMemory) -> String {
    format!(
        "oomtrace: this ran on a simulated {} GPU (no GPU was used): kernels did not run, so \
         values computed on the device are meaningless\n  and control flow that depends on \
         them differs; allocation sizes and lifetimes are those of a real GPU for programs \
         whose shapes do not depend on data.\n",
        memory.text
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_binary_units_and_name_what_is_wrong() {
        let parse = DeviceMemory::parse;
        assert_eq!(parse("16GiB").unwrap().bytes, 16 << 30);
        assert_eq!(parse("1tib").unwrap().bytes, 1 << 40);
        assert_eq!(parse("2048 MiB").unwrap().bytes, 2 << 30);
        assert_eq!(parse("1048576").unwrap().bytes, 1 << 20);
        assert_eq!(parse(" 2g ").unwrap().text, "2g");
        for (bad, says) in [
            ("banana", "not a size"),
            ("", "not a size"),
            ("16XB", "not a size"),
            ("-1GiB", "not a size"),
            ("1.5GiB", "not a size"),
            ("16", "out of range: a device's memory is 1MiB to 1TiB"),
            ("2TiB", "out of range"),
            ("99999999999999999999", "not a size"),
            ("9999999999TiB", "out of range"),
        ] {
            let e = parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn the_driver_goes_first_on_the_library_path_with_its_capacity() {
        let installed = Installed::cached(PathBuf::from("/cache/sim"));
        let memory = DeviceMemory::parse("2GiB").unwrap();
        let env = installed.environment(&memory);
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        let path = get("LD_LIBRARY_PATH").unwrap();
        assert!(path.to_string_lossy().starts_with("/cache/sim"), "{path:?}");
        assert_eq!(get("SIMCUDA_MEMORY").unwrap(), OsString::from("2147483648"));
    }
}
