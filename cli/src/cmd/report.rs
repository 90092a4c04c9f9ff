//! `oomtrace report`: culprits from a trace file, as text or as the JSON contract.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use oomtrace_collector::model::trace::Trace;
use oomtrace_collector::model::Observer;
use oomtrace_collector::model::Process;
use oomtrace_collector::report::merge::{Combined, How};
use oomtrace_collector::report::sections::{self, SectionOptions, SiteOrder};
use oomtrace_collector::report::symbolize::StackSymbolizer;
use oomtrace_collector::report::Analysis;
use oomtrace_collector::report::{self, merge, Report, ReportOptions, Skipped};
use oomtrace_proto::wire::Frame;

use crate::output::Output;
use crate::progress::Progress;
use crate::{render, style, Failure};

/// The exit code when the report was written but files of a directory could not be read.
pub const SKIPPED_EXIT: u8 = 1;

/// Report peak, live-at-exit memory and the call sites that hold it, from a trace file (or
/// several: the traces of one job's nodes, merged into one report with a table of ranks;
/// traces of separate runs side by side, unless --merge).
#[derive(clap::Args)]
pub struct Args {
    /// .oomt trace files (from `oomtrace run`, `collect`, or a plain LD_PRELOAD run), or
    /// directories: every *.oomt file directly inside. Traces of one job (a launcher job id
    /// in common) are merged into one report; traces of separate runs are reported side by
    /// side. The same trace twice is refused.
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// Merge traces of separate runs into one report too (one table of ranks across them).
    #[arg(long)]
    pub merge: bool,
    /// Print the stable JSON document instead of text.
    #[arg(long)]
    pub json: bool,
    /// Colour the text: auto (on a terminal, unless NO_COLOR is set), always, never.
    #[arg(long, value_enum, value_name = "WHEN")]
    pub color: Option<crate::style::ColorChoice>,
    /// Call sites listed per process and device.
    #[arg(long, default_value_t = super::DEFAULT_TOP, value_name = "N")]
    pub top: usize,
    /// Order of the call-site table in each process and device's sections: peak (most held
    /// at once), end (most live at exit, the default), count (most allocations) or growth
    /// (fastest growth per step).
    #[arg(long, default_value = "end", value_name = "ORDER")]
    pub sort: SiteOrder,
    /// Where PyTorch's tensors are traced, also list its caching allocator's segments (its
    /// reserve) as call sites, and make each device's sections count CUDA allocations
    /// instead of tensors (text and JSON).
    #[arg(long)]
    pub segments: bool,
    /// Show PyTorch's own C++ frames (c10, ATen, the autograd engine) one by one instead of
    /// folded into one line (text).
    #[arg(long)]
    pub native: bool,
    /// Show every Python frame of a stack, the libraries' (torch.nn, the standard library) too,
    /// instead of each run of them folded into one line, `(3 torch.nn frames)` (text).
    #[arg(long)]
    pub full: bool,
    /// Find and explain only what happens after the first step marker labelled LABEL (a
    /// block `oomtrace.trace()` marked in a Python program): findings and "what the memory
    /// is" cover the block; what the process held before it counts in the device's totals
    /// and is never a finding of the block.
    #[arg(long, value_name = "LABEL")]
    pub since_mark: Option<String>,
    /// Read a trace its collector is still writing as it is now, without waiting up to 5 s
    /// for the writer to finish (a program reading its own trace).
    #[arg(long)]
    pub no_wait: bool,
    /// Print the summary `oomtrace run` printed at the end of the run instead of the whole
    /// report (one trace); with --json, the JSON report `run --json` wrote (without the
    /// sections).
    #[arg(long, conflicts_with_all = ["merge", "segments", "since_mark", "native", "full", "top", "sort"])]
    pub summary: bool,
}

/// A trace file to read, and whether it was found in a directory (an unreadable one is then
/// skipped and named; a file named on the command line must be read).
pub struct TraceFile {
    pub path: PathBuf,
    pub in_dir: bool,
}

/// The trace files `paths` name: files as given, directories replaced by the `*.oomt` entries
/// directly inside them (sorted), whatever they are: one that is not a regular file (a FIFO,
/// a device, a link to one) is refused when read, in one line, like a corrupt one. A directory
/// without any is an error, not an empty report.
pub fn trace_files(paths: &[PathBuf]) -> Result<Vec<TraceFile>, Failure> {
    let mut files = Vec::new();
    for path in paths {
        if !path.is_dir() {
            files.push(TraceFile {
                path: path.clone(),
                in_dir: false,
            });
            continue;
        }
        let entries = std::fs::read_dir(path)
            .map_err(|e| Failure::new(format!("cannot read directory {}: {e}", path.display())))?;
        let mut found: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "oomt"))
            .collect();
        if found.is_empty() {
            return Err(Failure::new(format!(
                "{} holds no trace files (*.oomt)",
                path.display()
            )));
        }
        found.sort();
        files.extend(
            found
                .into_iter()
                .map(|path| TraceFile { path, in_dir: true }),
        );
    }
    Ok(files)
}

/// Why `path`, a member of a directory, is not even opened: anything but a regular file (a
/// link is followed: a link to a trace is a trace). Opening a FIFO would wait for a writer,
/// and opening a device can do things (a tape rewinds); a regular file is opened without
/// blocking and checked again by the reader.
fn not_a_file(path: &Path) -> Option<String> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => None,
        Ok(m) => Some(format!(
            "it is {}, not a trace file",
            oomtrace_proto::host::file_kind::describe(&m.file_type())
        )),
        Err(e) => Some(format!("cannot open it: {e}")),
    }
}

/// Why a trace could not be read: `reason` without the file's name (a skipped member is
/// named once, by the caller), `message` with it (an error of its own).
struct Unreadable {
    reason: String,
    message: String,
}

impl From<oomtrace_collector::model::Error> for Unreadable {
    fn from(e: oomtrace_collector::model::Error) -> Unreadable {
        use oomtrace_collector::model::Error;
        let reason = match &e {
            Error::Open { source, .. } => format!("cannot open it: {source}"),
            Error::BadTrace { source, .. } => source.to_string(),
            other => other.to_string(),
        };
        Unreadable {
            reason,
            message: e.to_string(),
        }
    }
}

/// One trace's report, sections included, symbolized with `sym` (kept across traces).
fn report_of(
    file: &Path,
    args: &Args,
    progress: Option<&mut Progress>,
    sym: &mut StackSymbolizer,
) -> Result<Report, oomtrace_collector::model::Error> {
    if args.no_wait {
        oomtrace_collector::model::trace::read_without_waiting();
    }
    let since = args.since_mark.as_deref();
    let mut apply = |p: &mut Process, a: &mut Analysis, f: &Frame<'_>| {
        if let Some(label) = since {
            a.since_mark(label);
        }
        a.apply_frame(p, f)
    };
    let trace = match progress {
        Some(progress) => {
            let name = file.file_name().map_or_else(
                || file.display().to_string(),
                |n| n.to_string_lossy().into_owned(),
            );
            progress.pass(format!("reading {name}"));
            let trace = Trace::<Analysis>::load_with(file, &mut apply, &mut |done, total| {
                progress.update(done, total)
            });
            progress.end_pass();
            trace?
        }
        None => Trace::<Analysis>::load_with(file, &mut apply, &mut |_, _| {})?,
    };
    if let Some(label) = since {
        if trace.observers.iter().all(Analysis::window_never_opened) {
            return Err(oomtrace_collector::model::Error::NoMark {
                path: file.to_path_buf(),
                label: label.to_owned(),
            });
        }
    }
    for w in report::analysis_failures(&trace) {
        eprintln!("{w}");
    }
    let mut report = report::build_with_segments(
        &trace,
        &ReportOptions {
            top: args.top,
            path: file.display().to_string(),
            symbolize: true,
        },
        args.segments,
        sym,
    );
    if let Some(w) = report::remedies::predict(&mut report, &trace, file) {
        report.trace.warnings.push(w);
    }
    if let Some(w) = report::levers::attach(&mut report, file, sym) {
        report.trace.warnings.push(w);
    }
    report.sections = sections::build_with(
        &trace,
        &SectionOptions {
            top: args.top,
            order: args.sort,
            symbolize: true,
            segments: args.segments,
        },
        sym,
    );
    Ok(report)
}

/// `--summary`: what `oomtrace run` said of its trace at the end (`crate::handoff`).
fn run_summary(files: &[TraceFile], args: &Args) -> Result<ExitCode, Failure> {
    let [one] = files else {
        return Err(Failure::new(format!(
            "--summary reports one trace, not {} (`oomtrace run` made one)",
            files.len()
        )));
    };
    if let Some(why) = not_a_file(&one.path).filter(|_| one.in_dir) {
        return Err(Failure::new(format!("{}: {why}", one.path.display())));
    }
    if args.no_wait {
        oomtrace_collector::model::trace::read_without_waiting();
    }
    let trace = crate::handoff::read_trace(&one.path)?;
    let wanted = crate::handoff::Wanted {
        json: args.json,
        simulated: None,
    };
    let said = crate::handoff::RunReport::of_trace(&trace, &one.path, &wanted);
    let mut out = Output::stdout().named("the report");
    let _ = match said.json {
        Some(json) => out.write_all(json.map_err(Failure::new)?.as_bytes()),
        None => out.write_all(
            style::paint(&said.summary, style::enabled(style::Stream::Stdout)).as_bytes(),
        ),
    };
    out.finish()?;
    Ok(ExitCode::SUCCESS)
}

/// Reads `files` on up to `available_parallelism` threads (each keeps its symbolizer, so a
/// module's debug information is read once per thread, not once per trace), showing how many
/// are done on a terminal. Results come back in the order of `files`.
fn read_all(files: &[TraceFile], args: &Args) -> Vec<Result<Report, Unreadable>> {
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(files.len())
        .max(1);
    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let bytes_done = AtomicU64::new(0);
    let total: u64 = files
        .iter()
        .map(|f| std::fs::metadata(&f.path).map_or(0, |m| m.len()))
        .sum();
    let results: Vec<Mutex<Option<Result<Report, _>>>> =
        files.iter().map(|_| Mutex::new(None)).collect();
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                let mut sym = StackSymbolizer::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(f) = files.get(i) else { break };
                    let r = match not_a_file(&f.path).filter(|_| f.in_dir) {
                        Some(why) => Err(Unreadable {
                            message: format!("{}: {why}", f.path.display()),
                            reason: why,
                        }),
                        None => report_of(&f.path, args, None, &mut sym).map_err(Unreadable::from),
                    };
                    let size = std::fs::metadata(&f.path)
                        .ok()
                        .filter(|m| m.is_file())
                        .map_or(0, |m| m.len());
                    *results[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
                    bytes_done.fetch_add(size, Ordering::Relaxed);
                    done.fetch_add(1, Ordering::Release);
                }
            });
        }
        let mut progress = Progress::new();
        progress.pass(format!("reading {} traces", files.len()));
        while done.load(Ordering::Acquire) < files.len() {
            progress.update(bytes_done.load(Ordering::Relaxed), total);
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    });
    results
        .into_iter()
        .map(|m| {
            m.into_inner()
                .unwrap_or_else(|e| e.into_inner())
                .expect("every file was read")
        })
        .collect()
}

/// Refuses a trace file named twice (directly, through a directory, or by another path to
/// it): its processes would be counted twice.
fn refuse_same_file(files: &[TraceFile]) -> Result<(), Failure> {
    use std::os::unix::fs::MetadataExt;
    let mut seen: Vec<((u64, u64), &Path)> = Vec::new();
    for f in files {
        let Ok(m) = std::fs::metadata(&f.path) else {
            continue;
        };
        let id = (m.dev(), m.ino());
        if let Some((_, first)) = seen.iter().find(|(s, _)| *s == id) {
            return Err(Failure::new(format!(
                "{} and {} are the same trace file: give each trace once",
                first.display(),
                f.path.display()
            )));
        }
        seen.push((id, &f.path));
    }
    Ok(())
}

/// Refuses two traces of the same processes (a copy of a trace): counted twice they would
/// double every number. A process is its host, pid and start time.
fn refuse_same_trace(reports: &[Report]) -> Result<(), Failure> {
    fn identity(r: &Report) -> Vec<(&str, u32, u64)> {
        let mut v: Vec<(&str, u32, u64)> = r
            .processes
            .iter()
            .map(|p| (p.host.as_str(), p.pid, p.start_unix_ns))
            .collect();
        v.sort_unstable();
        v
    }
    let ids: Vec<_> = reports.iter().map(identity).collect();
    for (i, a) in ids.iter().enumerate() {
        if a.is_empty() {
            continue;
        }
        if let Some(j) = ids[..i].iter().position(|b| b == a) {
            return Err(Failure::new(format!(
                "{} and {} are the same trace (the same processes): give each trace once",
                reports[j].trace.path, reports[i].trace.path
            )));
        }
    }
    Ok(())
}

pub fn run(args: Args) -> Result<ExitCode, Failure> {
    let files = trace_files(&args.files)?;
    refuse_same_file(&files)?;
    if args.summary {
        return run_summary(&files, &args);
    }
    let mut skipped = Vec::new();
    // The reports of separate runs, each on its own (text); empty when there is one report.
    let mut runs: Vec<Report> = Vec::new();
    let report = if let [one] = files.as_slice() {
        if let Some(why) = not_a_file(&one.path).filter(|_| one.in_dir) {
            return Err(Failure::new(format!("{}: {why}", one.path.display())));
        }
        let mut progress = Progress::new();
        report_of(
            &one.path,
            &args,
            Some(&mut progress),
            &mut StackSymbolizer::new(),
        )
        .map_err(|e| Failure::new(e.to_string()))?
    } else {
        let mut reports = Vec::new();
        for (f, r) in files.iter().zip(read_all(&files, &args)) {
            match r {
                Ok(r) => reports.push(r),
                // A member of a directory that is not a trace: named, and the others
                // reported (a job's report without one node is still worth reading).
                Err(e) if f.in_dir => {
                    eprintln!("oomtrace: skipped {}: {}", f.path.display(), e.reason);
                    skipped.push(Skipped {
                        path: f.path.display().to_string(),
                        reason: e.reason,
                    });
                }
                // A file named on the command line: the user asked for it.
                Err(e) => return Err(Failure::new(e.message)),
            }
        }
        if reports.is_empty() {
            return Err(Failure::new(format!(
                "none of the {} trace files could be read (each named above)",
                files.len()
            )));
        }
        refuse_same_trace(&reports)?;
        if reports.len() == 1 {
            reports.pop().expect("one report")
        } else {
            let groups = merge::runs(&reports);
            let n = reports.len();
            let (how, message) = match groups.len() {
                1 => {
                    let members: Vec<&Report> = reports.iter().collect();
                    let job = match merge::job_of(&members) {
                        Some(id) => format!("job {id}"),
                        None => "ranks of one world, no launcher job id".to_string(),
                    };
                    (
                        How::OneJob,
                        format!("{n} traces of one job ({job}), merged into one report"),
                    )
                }
                k if args.merge => (
                    How::MergedOnRequest,
                    format!(
                        "{n} traces of {k} separate runs (no launcher job id or world of ranks in \
                         common), merged into one report as asked (--merge)"
                    ),
                ),
                k => (
                    How::SeparateRuns,
                    format!(
                        "{n} traces of {k} separate runs (no launcher job id or world of ranks in \
                         common), reported one after another; --merge makes one report of them"
                    ),
                ),
            };
            let combined = Combined {
                how,
                runs: groups.len(),
                message,
            };
            if how == How::SeparateRuns {
                let (mut all, per_run) = merge::separate(reports, &groups);
                all.combined = Some(combined);
                runs = per_run;
                all
            } else {
                let mut all = merge::merge(reports);
                all.combined = Some(combined);
                all
            }
        }
    };
    let mut report = report;
    report.skipped = skipped;
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
        let opts = render::TextOptions {
            native: args.native,
            full: args.full,
            ..render::TextOptions::default()
        };
        let text = if runs.is_empty() {
            render::full_with(&report, &opts)
        } else {
            render::side_by_side(&report, &runs, &opts)
        };
        let text = style::paint(&text, style::enabled(style::Stream::Stdout));
        let _ = out.write_all(text.as_bytes());
    }
    // A write error was kept by `out`; `finish` says it in one line.
    out.finish()?;
    // The report is written, but it lacks what the skipped files held: a script must notice.
    Ok(if report.skipped.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(SKIPPED_EXIT)
    })
}
