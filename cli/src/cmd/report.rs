//! `oomtrace report`: culprits from a trace file, as text or as the JSON contract.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use oomtrace_collector::analysis::Analysis;
use oomtrace_collector::model::trace::Trace;
use oomtrace_collector::report::sections::{self, SectionOptions, SiteOrder};
use oomtrace_collector::report::{self, merge, Report, ReportOptions};

use crate::output::Output;
use crate::progress::Progress;
use crate::{render, Failure};

/// Report peak, live-at-exit memory and the call sites that hold it, from a trace file (or
/// several: the traces of one job's nodes, merged into one report with a table of ranks).
#[derive(clap::Args)]
pub struct Args {
    /// .oomt trace files (from `oomtrace run`, `collect`, or a plain LD_PRELOAD run), or
    /// directories: every *.oomt file directly inside. Several are merged into one report.
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
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

/// The trace files `paths` name: files as given, directories replaced by the `*.oomt` files
/// directly inside them (sorted). A directory without any is an error, not an empty report.
pub fn trace_files(paths: &[PathBuf]) -> Result<Vec<PathBuf>, Failure> {
    let mut files = Vec::new();
    for path in paths {
        if !path.is_dir() {
            files.push(path.clone());
            continue;
        }
        let entries = std::fs::read_dir(path)
            .map_err(|e| Failure::new(format!("cannot read directory {}: {e}", path.display())))?;
        let mut found: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "oomt") && p.is_file())
            .collect();
        if found.is_empty() {
            return Err(Failure::new(format!(
                "{} holds no trace files (*.oomt)",
                path.display()
            )));
        }
        found.sort();
        files.extend(found);
    }
    Ok(files)
}

/// One trace's report, sections included.
fn report_of(file: &Path, args: &Args) -> Result<Report, Failure> {
    let mut progress = Progress::new();
    let name = file.file_name().map_or_else(
        || file.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    progress.pass(format!("reading {name}"));
    let trace = Trace::<Analysis>::load_with_progress(file, &mut |done, total| {
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
            path: file.display().to_string(),
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
    Ok(report)
}

pub fn run(args: Args) -> Result<ExitCode, Failure> {
    let files = trace_files(&args.files)?;
    let report = if let [one] = files.as_slice() {
        report_of(one, &args)?
    } else {
        let reports = files
            .iter()
            .map(|f| report_of(f, &args))
            .collect::<Result<Vec<_>, _>>()?;
        merge::merge(reports)
    };
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
        for w in render::stale_module_warnings(&report) {
            eprintln!("{w}");
        }
        let _ = out.write_all(render::full(&report).as_bytes());
    }
    // A write error was kept by `out`; `finish` says it in one line.
    out.finish()?;
    Ok(ExitCode::SUCCESS)
}
