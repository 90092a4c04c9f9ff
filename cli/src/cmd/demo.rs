//! `oomtrace demo`: a small training-like program with a planted leak and an OOM, on the
//! simulated GPU that ships inside this binary, traced and reported. No GPU needed.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::cmd::run::{trace_command, Session};
use crate::{locate, render, style, Failure};

/// The demo workload, built from `cli/demo/train_demo.c` against the simulated CUDA.
const DEMO_APP: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/train_demo"));

/// Trace a demo training loop on a simulated GPU and print the report.
#[derive(clap::Args)]
pub struct Args {
    /// Trace file to write.
    #[arg(long, short, value_name = "FILE", default_value = "oomtrace-demo.oomt")]
    pub output: PathBuf,
    /// Simulated device memory, 1GiB to 1TiB (units: B, KiB, MiB, GiB, TiB; K/M/G/T and
    /// KB/MB/GB/TB mean the same powers of 1024).
    #[arg(long, default_value = "4GiB", value_name = "SIZE", value_parser = parse_device_memory)]
    pub device_memory: DeviceMemory,
}

/// A simulated device size as given and in bytes.
#[derive(Clone, Debug)]
pub struct DeviceMemory {
    pub text: String,
    pub bytes: u64,
}

/// The demo's story (512 MiB of weights, a leak of 16 MiB a step, then a 3.4 GiB evaluation
/// buffer) needs at least 1 GiB to run; the simulated driver models at most 1 TiB.
const DEVICE_MEMORY_MIN: u64 = 1 << 30;
const DEVICE_MEMORY_MAX: u64 = 1 << 40;

fn parse_device_memory(text: &str) -> Result<DeviceMemory, String> {
    let bytes = parse_size(text)?;
    if !(DEVICE_MEMORY_MIN..=DEVICE_MEMORY_MAX).contains(&bytes) {
        return Err(format!(
            "{text} is out of range: the demo's simulated GPU takes 1GiB to 1TiB"
        ));
    }
    Ok(DeviceMemory {
        text: text.to_string(),
        bytes,
    })
}

/// `4GiB`, `512 MiB`, `2g`, `1073741824`: a whole number with an optional binary unit.
fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let bad = || format!("{text:?} is not a size (expected e.g. 4GiB, 512MiB)");
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(bad()),
    };
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("{text} is out of range"))
}

/// Writes the simulated CUDA libraries and the demo program into a private directory.
fn install(dir: &Path) -> Result<PathBuf, Failure> {
    simcuda::install(dir).map_err(|e| {
        Failure::new(format!(
            "cannot install the simulated GPU in {}: {e}",
            dir.display()
        ))
    })?;
    let app = dir.join("train_demo");
    std::fs::write(&app, DEMO_APP)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&app, std::fs::Permissions::from_mode(0o755))?;
    Ok(app)
}

/// The demo program and its simulated GPU, installed once into the cache directory and kept:
/// `oomtrace report` on the demo's trace later needs the program's symbols. Installed into a
/// private directory inside the cache first (`.<name>.tmp-XXXXXX`, on the cache's own
/// filesystem whatever `$TMPDIR` is), then renamed into place, so a concurrent demo never sees
/// (or runs) half-written files. The temporary directory is removed on every way out; one a
/// killed demo left is pruned with old builds (`locate::mark_used`).
fn installed() -> Result<Installed, Failure> {
    let dir = locate::cache_dir(
        "-demo",
        &[
            DEMO_APP,
            simcuda::LIBCUDA,
            simcuda::LIBCUDART,
            simcuda::LIBNVML,
        ],
    );
    let app = dir.join("train_demo");
    if app.is_file() {
        locate::mark_used(&dir);
        return Ok(Installed::cached(dir, app));
    }
    match install_into_cache(&dir) {
        Ok(()) => {
            locate::mark_used(&dir);
            Ok(Installed::cached(dir, app))
        }
        // A cache that cannot be written (a read-only home): this run uses a copy of its own,
        // removed when it is done.
        Err(why) => {
            let scratch = Scratch(locate::private_dir()?);
            let app = install(&scratch.0)?;
            eprintln!(
                "oomtrace demo: cannot cache the demo program in {} ({why}); running a \
                 temporary copy, removed afterwards",
                dir.display()
            );
            Ok(Installed {
                dir: scratch.0.clone(),
                app,
                _scratch: Some(scratch),
            })
        }
    }
}

/// Installs into a temporary directory beside `dir` in the cache, then renames it to `dir`.
/// Err: why the cache cannot be used (nothing of ours is left in it).
fn install_into_cache(dir: &Path) -> Result<(), String> {
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
        oomtrace_proto::private_dir::create(parent, &prefix)
            .map_err(|e| format!("{}: {e}", parent.display()))?,
    );
    install(&fresh.0).map_err(|f| f.message)?;
    match std::fs::rename(&fresh.0, dir) {
        Ok(()) => {
            std::mem::forget(fresh); // it is the cache directory now
            Ok(())
        }
        // Another demo won the race: theirs is as good as ours (ours goes with `fresh`).
        Err(_) if dir.join("train_demo").is_file() => Ok(()),
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

/// Where the demo program is, and the temporary copy to remove after the run, if it is one.
struct Installed {
    dir: PathBuf,
    app: PathBuf,
    _scratch: Option<Scratch>,
}

impl Installed {
    fn cached(dir: PathBuf, app: PathBuf) -> Installed {
        Installed {
            dir,
            app,
            _scratch: None,
        }
    }
}

pub fn run(args: Args) -> Result<ExitCode, Failure> {
    let installed = installed()?;
    let (dir, app) = (installed.dir.clone(), installed.app.clone());
    println!(
        "oomtrace demo: a training loop on a simulated {} GPU (no GPU needed)",
        args.device_memory.text
    );
    println!(
        "  program:  {}  (source: cli/demo/train_demo.c)",
        app.display()
    );
    println!(
        "  traced:   oomtrace run -- train_demo   (LD_PRELOAD=liboomtrace.so under the hood)\n"
    );
    let session = Session {
        lib: locate::shim_library()?,
        output: args.output.clone(),
        env: vec![
            (
                OsString::from("LD_LIBRARY_PATH"),
                dir.clone().into_os_string(),
            ),
            (
                OsString::from("SIMCUDA_MEMORY"),
                OsString::from(args.device_memory.bytes.to_string()),
            ),
        ],
        collector_args: Vec::new(),
    };
    let outcome = trace_command(&[app.into_os_string()], &session)?;
    let report = outcome.report?;
    println!();
    let text = render::full(&report);
    print!(
        "{}",
        style::paint(&text, style::enabled(style::Stream::Stdout))
    );
    println!(
        "\nThe trace is in {}: `oomtrace report {}` prints this again, `--json` as JSON.",
        outcome.trace_path.display(),
        outcome.trace_path.display()
    );
    if outcome.status.success() {
        Ok(ExitCode::SUCCESS)
    } else {
        Err(Failure::new(format!(
            "the demo program failed ({})",
            outcome.status
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_memory_takes_sizes_in_range_and_names_what_is_wrong() {
        assert_eq!(parse_device_memory("4GiB").unwrap().bytes, 4 << 30);
        assert_eq!(parse_device_memory("1tib").unwrap().bytes, 1 << 40);
        assert_eq!(parse_device_memory("2048 MiB").unwrap().bytes, 2 << 30);
        assert_eq!(parse_device_memory("1073741824").unwrap().bytes, 1 << 30);
        for (bad, says) in [
            ("banana", "not a size"),
            ("", "not a size"),
            ("4XB", "not a size"),
            ("-1GiB", "not a size"),
            ("0", "out of range"),
            ("512MiB", "out of range"),
            ("10TiB", "out of range"),
            ("99999999999999999999", "not a size"),
            ("9999999999TiB", "out of range"),
        ] {
            let e = parse_device_memory(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
