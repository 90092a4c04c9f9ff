//! `oomtrace diff BEFORE AFTER`: what changed between two traces, call site by call site. The
//! comparison and its `--json` contract are the collector's (`report::diff`, whose module
//! comment says how sites and findings are matched and when sizes compare); the text is
//! `render::diff`. Here: the arguments, reading the two traces, and the exit codes.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use oomtrace_collector::model::trace::Trace;
use oomtrace_collector::report;
pub use oomtrace_collector::report::diff::Threshold;
use oomtrace_collector::report::diff::{self, DiffOptions, Side};
use oomtrace_collector::report::Analysis;

use crate::output::Output;
use crate::render;
use crate::Failure;

/// The exit code of `--fail-on-regression` when AFTER regressed.
pub const REGRESSION_EXIT: u8 = 3;

/// Compare two traces: per call site and device, peak, live at exit and growth per step;
/// findings that appeared or disappeared.
#[derive(clap::Args)]
pub struct Args {
    /// The trace before the change.
    pub before: PathBuf,
    /// The trace after the change.
    pub after: PathBuf,
    /// Print the JSON document (version 1) instead of text.
    #[arg(long)]
    pub json: bool,
    /// Exit 3 when AFTER regressed: a new leak or OOM finding, or a call site's or device's
    /// peak or live-at-exit bytes grew by more than --threshold (sizes only between runs that
    /// did the same work: peaks with the same steps, neither stopped early, out of memory at
    /// the same places or neither; live at exit unless a run stopped early or BEFORE alone
    /// ran out of memory).
    #[arg(long)]
    pub fail_on_regression: bool,
    /// How much a peak or live-at-exit may grow: a percentage (`10%`, of the BEFORE value, and
    /// at least 1 MiB) or bytes (`1048576`, `64KiB`, `2MiB`, `1GiB`).
    #[arg(long, default_value = "10%", value_name = "LIMIT")]
    pub threshold: Threshold,
    /// Call sites listed (the most changed first); regressions are looked for in all.
    #[arg(long, default_value_t = super::DEFAULT_TOP, value_name = "N")]
    pub top: usize,
}

fn load(path: &Path) -> Result<Side, Failure> {
    // Each error names the file, once: with two inputs, which one is wrong matters. The
    // reader's own errors name it already; only a bare format error does not.
    let trace = Trace::<Analysis>::load(path).map_err(|e| match e {
        oomtrace_collector::model::Error::Format(_) => {
            Failure::new(format!("{}: {e}", path.display()))
        }
        e => Failure::new(e.to_string()),
    })?;
    for w in report::analysis_failures(&trace) {
        eprintln!("{w}");
    }
    Ok(Side::of(&trace, path))
}

pub fn run(args: Args) -> Result<ExitCode, Failure> {
    let before = load(&args.before)?;
    let after = load(&args.after)?;
    let diff = diff::compare(
        &before,
        &after,
        &DiffOptions {
            before: args.before.display().to_string(),
            after: args.after.display().to_string(),
            threshold: args.threshold,
            top: args.top,
        },
    );
    if !args.json {
        for m in &diff.stale_modules {
            eprintln!("oomtrace: warning: {}: {}", m.trace, m.module.warning());
        }
    }
    let mut out = Output::stdout().named("the diff");
    if args.json {
        let _ = serde_json::to_writer_pretty(&mut out, &diff)
            .map_err(std::io::Error::from)
            .and_then(|()| out.write_all(b"\n"));
    } else {
        let _ = out.write_all(render::diff(&diff).as_bytes());
    }
    out.finish()?;
    if args.fail_on_regression && diff.regression {
        return Ok(ExitCode::from(REGRESSION_EXIT));
    }
    Ok(ExitCode::SUCCESS)
}
