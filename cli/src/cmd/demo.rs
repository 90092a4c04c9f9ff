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
    /// Simulated device memory, 1GiB to 1TiB (units: B, KiB, MiB, GiB, TiB; K/M/G/T and
    /// KB/MB/GB/TB mean the same powers of 1024).
    #[arg(long, default_value = "4GiB", value_name = "SIZE", value_parser = parse_device_memory)]
    pub device_memory: DeviceMemory,
}

/// The demo's story (512 MiB of weights, a leak of 16 MiB a step, then a 3.4 GiB evaluation
/// buffer) needs at least 1 GiB to run; the simulated driver models at most 1 TiB.
const DEVICE_MEMORY_MIN: u64 = 1 << 30;

fn parse_device_memory(text: &str) -> Result<DeviceMemory, String> {
    DeviceMemory::parse(
        text,
        DEVICE_MEMORY_MIN,
        "the demo's simulated GPU takes 1GiB to 1TiB",
    )
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
