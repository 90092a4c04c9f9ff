//! `oomtrace demo`: a small training-like program with a planted leak and an OOM, on the
//! simulated GPU that ships inside this binary, traced and reported. No GPU needed.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::cmd::run::{trace_command, Session};
use crate::{locate, render, Failure};

/// The demo workload, built from `cli/demo/train_demo.c` against the simulated CUDA.
const DEMO_APP: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/train_demo"));

/// Trace a demo training loop on a simulated GPU and print the report.
#[derive(clap::Args)]
pub struct Args {
    /// Trace file to write.
    #[arg(long, short, value_name = "FILE", default_value = "oomtrace-demo.oomt")]
    pub output: PathBuf,
    /// Simulated device memory.
    #[arg(long, default_value = "4GiB", value_name = "SIZE")]
    pub device_memory: String,
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
/// private directory first, then renamed into place, so a concurrent demo never sees (or
/// runs) half-written files.
fn installed() -> Result<(PathBuf, PathBuf), Failure> {
    let dir = locate::cache_dir("-demo", &[DEMO_APP, simcuda::LIBCUDA, simcuda::LIBCUDART]);
    let app = dir.join("train_demo");
    if app.is_file() {
        return Ok((dir, app));
    }
    let fresh = locate::private_dir()?;
    install(&fresh)?;
    if let Some(parent) = dir.parent() {
        std::fs::create_dir_all(parent)?;
    }
    if std::fs::rename(&fresh, &dir).is_err() {
        // Another demo won the race (or the cache is not writable): use theirs, or ours.
        if app.is_file() {
            let _ = std::fs::remove_dir_all(&fresh);
        } else {
            let app = fresh.join("train_demo");
            return Ok((fresh, app));
        }
    }
    Ok((dir, app))
}

pub fn run(args: Args) -> Result<ExitCode, Failure> {
    let (dir, app) = installed()?;
    println!(
        "oomtrace demo: a training loop on a simulated {} GPU (no GPU needed)",
        args.device_memory
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
                OsString::from(&args.device_memory),
            ),
        ],
    };
    let outcome = trace_command(&[app.into_os_string()], &session)?;
    let report = outcome.report?;
    println!();
    print!("{}", render::full(&report));
    println!(
        "\nThe trace is in {}: `oomtrace report {}` prints this again, `--json` as JSON.",
        args.output.display(),
        args.output.display()
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
