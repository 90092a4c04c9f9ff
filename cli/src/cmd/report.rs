//! `oomtrace report`: culprits from a trace file, as text or as the JSON contract.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use oomtrace_collector::analysis::Analysis;
use oomtrace_collector::model::trace::Trace;
use oomtrace_collector::report::sections::{self, SectionOptions, SiteOrder};
use oomtrace_collector::report::{self, ReportOptions};

use crate::output::Output;
use crate::progress::Progress;
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
    /// Order of the call-site table in each process and device's sections: peak (most held
    /// at once), end (most live at exit, the default), count (most allocations) or growth
    /// (fastest growth per step).
    #[arg(long, default_value = "end", value_name = "ORDER")]
    pub sort: SiteOrder,
}

pub fn run(args: Args) -> Result<ExitCode, Failure> {
    let mut progress = Progress::new();
    let name = args.file.file_name().map_or_else(
        || args.file.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    progress.pass(format!("reading {name}"));
    let trace = Trace::<Analysis>::load_with_progress(&args.file, &mut |done, total| {
        progress.update(done, total)
    })?;
    drop(progress);
    for w in report::analysis_failures(&trace) {
        eprintln!("{w}");
    }
    let mut report = report::build(
        &trace,
        &ReportOptions {
            top: args.top,
            path: args.file.display().to_string(),
            symbolize: true,
        },
    );
    report.sections = sections::build(
        &trace,
        &SectionOptions {
            top: args.top,
            order: args.sort,
            symbolize: true,
        },
    );
    // Not println!: it panics when standard output fails (`> /dev/full`). A full or broken
    // output is one line and exit 2; a reader that went away (`| head`) ends it quietly.
    let mut out = Output::stdout().named("the report");
    if args.json {
        let _ = serde_json::to_writer_pretty(&mut out, &report)
            .map_err(std::io::Error::from)
            .and_then(|()| out.write_all(b"\n"));
    } else {
        for w in &report.trace.warnings {
            eprintln!("oomtrace: warning: {w}");
        }
        let _ = out.write_all(render::full(&report).as_bytes());
    }
    // A write error was kept by `out`; `finish` says it in one line.
    out.finish()?;
    Ok(ExitCode::SUCCESS)
}
