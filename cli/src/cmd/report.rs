//! `oomtrace report`: culprits from a trace file, as text or as the JSON contract.

use std::path::PathBuf;
use std::process::ExitCode;

use oomtrace_collector::report::{self, ReportOptions};
use oomtrace_collector::trace::Trace;

use crate::{render, Failure};

/// Report peak, live-at-exit memory and the call sites that hold it, from a trace file.
#[derive(clap::Args)]
pub struct Args {
    /// A .oomt trace file (from `oomtrace run`, `collect`, or a plain LD_PRELOAD run).
    pub file: PathBuf,
    /// Print the stable JSON document instead of text.
    #[arg(long)]
    pub json: bool,
    /// Call sites listed per process and device.
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub top: usize,
}

pub fn run(args: Args) -> Result<ExitCode, Failure> {
    let trace = Trace::load(&args.file)?;
    let report = report::build(
        &trace,
        &ReportOptions {
            top: args.top,
            path: args.file.display().to_string(),
            symbolize: true,
        },
    );
    if args.json {
        let text = serde_json::to_string_pretty(&report)?;
        println!("{text}");
    } else {
        for w in &report.trace.warnings {
            eprintln!("oomtrace: warning: {w}");
        }
        print!("{}", render::full(&report));
    }
    Ok(ExitCode::SUCCESS)
}
