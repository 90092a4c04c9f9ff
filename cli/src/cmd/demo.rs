//! `oomtrace demo`: a small training-like program with a planted leak and an OOM, on the
//! simulated GPU that ships inside this binary, traced and reported. No GPU needed.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::cmd::run::{trace_command, Session};
use crate::simulated_gpu::{self, DeviceMemory};
use crate::{locate, render, style, Failure};

/// The demo workload, built from `cli/demo/train_demo.c` against the simulated CUDA.
const DEMO_APP: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/train_demo"));
const DEMO_NAME: &str = "train_demo";

/// Trace a demo training loop on a simulated GPU and print the report.
#[derive(clap::Args)]
pub struct Args {
    /// Trace file to write.
    #[arg(long, short, value_name = "FILE", default_value = "oomtrace-demo.oomt")]
    pub output: PathBuf,
    /// Simulated device memory, 1MiB to 1TiB like every size flag (units: B, KiB, MiB, GiB,
    /// TiB; K/M/G/T and KB/MB/GB/TB mean the same powers of 1024). The whole story needs about
    /// 1GiB; on less it ends early, in an out-of-memory error the report shows.
    #[arg(long, default_value = "4GiB", value_name = "SIZE", value_parser = DeviceMemory::parse)]
    pub device_memory: DeviceMemory,
    /// Colour the text: auto (on a terminal, unless NO_COLOR is set), always, never.
    #[arg(long, value_enum, value_name = "WHEN")]
    pub color: Option<crate::style::ColorChoice>,
}

/// The simulated CUDA libraries and the demo program, in the demo's cache directory.
fn installed() -> Result<simulated_gpu::Installed, Failure> {
    simulated_gpu::installed(&simulated_gpu::Contents {
        tag: "-demo",
        what: "the demo program",
        bytes: &[
            DEMO_APP,
            simcuda::LIBCUDA,
            simcuda::LIBCUDART,
            simcuda::LIBNVML,
        ],
        ready: DEMO_NAME,
        install: &install,
    })
}

/// Writes the simulated CUDA libraries (the demo links their runtime) and the demo program
/// into `dir`.
fn install(dir: &Path) -> Result<(), Failure> {
    simcuda::install(dir).map_err(|e| simulated_gpu::cannot_install(dir, e))?;
    let app = dir.join(DEMO_NAME);
    std::fs::write(&app, DEMO_APP)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&app, std::fs::Permissions::from_mode(0o755))?;
    Ok(())
}

pub fn run(args: Args) -> Result<ExitCode, Failure> {
    let installed = installed()?;
    let app = installed.dir.join(DEMO_NAME);
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
        env: installed.environment(&args.device_memory),
        collector_args: Vec::new(),
        without_address_randomization: false,
    };
    let outcome = trace_command(&[app.into_os_string()], &session)?;
    let report = outcome.replay()?;
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
