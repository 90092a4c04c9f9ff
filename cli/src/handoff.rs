//! What `oomtrace run` prints and writes when its program is done ([`RunReport`]), and how
//! its collector hands it over.
//!
//! The collector `run` owns has watched every event of the run: at the end it holds the same
//! models a replay of the trace file rebuilds (`Trace<Analysis>`, applied frame by frame in
//! the same order). So it builds the report itself ([`RunReport::of_trace`]), once the trace
//! file is finished, and writes it on its stdout pipe as [`ToRun::Report`]; `run` then prints
//! it instead of reading the whole trace again (that replay was a fifth of a long run's wall
//! time: bench/2026-12-04-run-handoff.md). Both sides run this file's code, so the summary and
//! the JSON are the ones the replay gives, byte for byte: `oomtrace report --summary [--json]`
//! builds them from a file, and the tests compare the two on every corpus and real-PyTorch run
//! (`oomtrace_tests::assert_run_said_what_the_trace_says`, tests/it/run_handoff.rs).
//!
//! `run` replays the file as before whenever the collector hands nothing over: it died or was
//! killed, the trace is incomplete (a full disk: the file holds less than the collector saw,
//! and the report says what the file holds), or its name vanished during the run.

use std::ffi::OsString;
use std::path::Path;

use oomtrace_collector::model::trace::Trace;
use oomtrace_collector::report::{
    self, Analysis, Confidence, Kind, Level, Report, ReportOptions, SimulatedDevice,
};
use oomtrace_proto::host::collector_spawn::ToRun;
use serde::{Deserialize, Serialize};

use crate::render;

/// What `run` needs of the report: each field is what it prints or decides from.
#[derive(Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct RunReport {
    /// `render::summary` of the report, not yet coloured.
    pub summary: String,
    /// The trace is whole (the report's `trace.complete`).
    pub complete: bool,
    /// The report's trace warnings (said when the trace is not complete).
    pub warnings: Vec<String>,
    /// Leak findings at confirmed confidence (`--fail-on-leak`).
    pub confirmed_leaks: usize,
    /// A complete trace of no process: nothing the program ran used CUDA.
    pub no_process: bool,
    /// The JSON report as `--json` writes it (its final newline included), or why it could not
    /// be made; None when not asked for.
    pub json: Option<Result<String, String>>,
}

/// What `run` asks of the report besides the summary.
#[derive(Clone, Debug, Default)]
pub struct Wanted {
    /// The JSON report (`run --json`).
    pub json: bool,
    /// The simulated GPU as the user gave it (`run --simulate SIZE`): the report says SIZE as
    /// given.
    pub simulated: Option<SimulatedDevice>,
}

impl Wanted {
    /// The hidden `collect` options that ask `run`'s collector for this report.
    pub fn collector_args(&self) -> Vec<OsString> {
        let mut args: Vec<OsString> = vec!["--hand-report".into()];
        if self.json {
            args.push("--hand-json".into());
        }
        if let Some(s) = &self.simulated {
            args.push("--simulated-device".into());
            args.push(s.device_memory.clone().into());
        }
        args
    }
}

/// A trace file read for `run`'s report (with a progress bar on a terminal after 1 s: reading
/// a long run's trace takes a while), the detectors' internal errors said on stderr.
pub fn read_trace(path: &Path) -> Result<Trace<Analysis>, crate::Failure> {
    let mut progress = crate::progress::Progress::new();
    progress.pass("reading the trace");
    let loaded = Trace::<Analysis>::load_with_progress(path, &mut |done, total| {
        progress.update(done, total)
    });
    drop(progress);
    let trace = loaded.map_err(crate::Failure::from)?;
    for w in report::analysis_failures(&trace) {
        eprintln!("{w}");
    }
    Ok(trace)
}

/// The report `run` builds from a trace (its collector's models, or the file replayed): the
/// default top, symbols, the allocator remedies' predictions and the levers that make it fit
/// (each of which reads the trace file at `path` again, when a finding asks for it).
pub fn build_report(trace: &Trace<Analysis>, path: &Path) -> Report {
    let mut r = report::build(
        trace,
        &ReportOptions {
            top: crate::cmd::DEFAULT_TOP,
            path: path.display().to_string(),
            symbolize: true,
        },
    );
    if let Some(w) = report::remedies::predict(&mut r, trace, path) {
        r.trace.warnings.push(w);
    }
    if let Some(w) =
        report::levers::attach(&mut r, path, &mut report::symbolize::StackSymbolizer::new())
    {
        r.trace.warnings.push(w);
    }
    r
}

/// The JSON report as `--json` writes it (its final newline included), or why it cannot be
/// made.
pub fn json_of(r: &Report) -> Result<String, String> {
    serde_json::to_string_pretty(r)
        .map(|text| text + "\n")
        .map_err(|e| e.to_string())
}

impl RunReport {
    /// [`build_report`], then what `run` needs of it.
    pub fn of_trace(trace: &Trace<Analysis>, path: &Path, wanted: &Wanted) -> RunReport {
        RunReport::of(build_report(trace, path), wanted)
    }

    pub fn of(mut r: Report, wanted: &Wanted) -> RunReport {
        if wanted.simulated.is_some() {
            r.trace.simulated = wanted.simulated.clone();
        }
        let confirmed_leaks = r
            .findings
            .iter()
            .filter(|f| f.kind == Kind::Leak && f.level == Level::Confidence(Confidence::Confirmed))
            .count();
        let json = wanted.json.then(|| json_of(&r));
        RunReport {
            summary: render::summary(&r),
            complete: r.trace.complete,
            warnings: r.trace.warnings.clone(),
            confirmed_leaks,
            no_process: r.processes.is_empty() && r.trace.complete,
            json,
        }
    }

    /// The message that hands this report to `run`.
    pub fn message(&self) -> ToRun {
        // Plain data of strings, numbers and booleans: serializing it cannot fail.
        ToRun::Report(serde_json::to_string(self).unwrap_or_default())
    }

    /// The report in a [`ToRun::Report`] body; None for one this build cannot read.
    pub fn from_message(body: &str) -> Option<RunReport> {
        serde_json::from_str(body).ok()
    }
}
