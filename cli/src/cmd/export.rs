//! `oomtrace export`: a trace in another tool's format (see `crate::export`).

use std::io::{self, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::export::{self, folded, memory_viz, view, Format};
use crate::output::Output;
use crate::progress::Progress;
use crate::Failure;

/// Write a trace in another tool's format: memory-viz, chrome, folded or json.
///
/// memory-viz: a pickle for pytorch.org/memory_viz (one process); chrome (or perfetto, the
/// same named .perfetto.json): trace-event JSON for ui.perfetto.dev; folded: flamegraph stacks weighted by bytes; json: every event as
/// JSON lines with symbolized call sites.
#[derive(clap::Args)]
pub struct Args {
    /// A .oomt trace file.
    pub file: PathBuf,
    /// Output format.
    #[arg(short = 'f', long, value_enum, value_name = "FORMAT")]
    pub format: Format,
    /// Output file; `-` writes to standard output. An existing file is replaced only once the
    /// export is complete; a symlink is refused; a device or FIFO is written into. [default:
    /// beside the trace, its name without .oomt then .pickle, .chrome.json, .perfetto.json,
    /// .folded or .jsonl (never replacing a file there)]
    #[arg(short = 'o', long = "output", value_name = "OUT")]
    pub output: Option<PathBuf>,
    /// Export only this process (memory-viz: default the first process with GPU memory events).
    #[arg(long, value_name = "PID")]
    pub pid: Option<u32>,
    /// memory-viz: keep the most recent N trace entries per device, like PyTorch's
    /// `max_entries` (default 100000; 0 keeps all, and memory then grows with the trace).
    #[arg(long, value_name = "N")]
    pub max_entries: Option<usize>,
    /// folded: the moment whose holdings weigh the stacks: each device's peak of live bytes,
    /// just before the first out-of-memory failure, or the end of the trace (default: the end,
    /// or the peak for a device where nothing is live at the end).
    #[arg(long, value_enum, value_name = "MOMENT")]
    pub at: Option<folded::Moment>,
    /// chrome: write every change of every counter, every step marker and every OOM (by
    /// default counters are coalesced to 2000 time buckets per device, each its maximum and
    /// last value, markers thinned to 10000 and OOMs kept for the first 1000 per process).
    #[arg(long)]
    pub all_samples: bool,
}

pub fn run(args: Args) -> Result<ExitCode, Failure> {
    let (output, named) = match args.output.clone() {
        Some(o) => (o, true),
        None => (
            crate::output::beside(&args.file, args.format.default_suffix()),
            false,
        ),
    };
    let format = args.format.written();
    if args.max_entries.is_some() && format != Format::MemoryViz {
        return Err(Failure::new(
            "--max-entries is for --format memory-viz (the other formats stream every event; \
             see `oomtrace export --help`)",
        ));
    }
    if args.at.is_some() && format != Format::Folded {
        return Err(Failure::new(
            "--at is for --format folded (the other formats show the whole history; see \
             `oomtrace export --help`)",
        ));
    }
    if args.all_samples && format != Format::Chrome {
        return Err(Failure::new(
            "--all-samples is for --format chrome (the other formats do not coalesce samples; \
             see `oomtrace export --help`)",
        ));
    }
    if !named {
        // Said before the trace is read, which can take a while.
        crate::output::ensure_free(&output)?;
    }
    let to_stdout = output.as_os_str() == "-";
    if to_stdout && format.binary() && io::stdout().is_terminal() {
        return Err(Failure::new(
            "memory-viz is a binary pickle: write it to a file with -o FILE, not a terminal",
        ));
    }
    let mut progress = Progress::new();
    // A first, quiet replay validates the file and picks the processes before any output.
    progress.pass(format!("checking {}", file_name(&args.file)));
    let scan = view::replay(
        &args.file,
        &mut |done, total| progress.update(done, total),
        |_, _| {},
    )?;
    progress.end_pass();
    for w in scan.warnings() {
        eprintln!("oomtrace: warning: {w}");
    }
    for w in scan.stale_module_warnings() {
        eprintln!("oomtrace: warning: {w}");
    }
    let conns: Vec<u32> = if format == Format::MemoryViz {
        vec![export::select_one(&scan, args.pid, &args.file)?]
    } else {
        export::select(&scan, args.pid, &args.file)?
    };
    // Only chrome and folded need the first replay's final state; the others replay anew,
    // and holding two copies of every live allocation doubled the peak memory.
    let scan = match format {
        Format::Chrome | Format::Folded => Some(scan),
        Format::MemoryViz | Format::Json | Format::Perfetto => None,
    };

    // Nothing at OUT changes before this point, and a failure below leaves it as it was.
    let out = if named {
        Output::create(&output)?
    } else {
        Output::create_new(&output)?
    };
    let mut out = out.named("the export");
    progress.pass(format!("exporting {}", file_name(&args.file)));
    let path: &Path = &args.file;
    let mut dropped = 0;
    let mut coalesced = export::chrome::Summary::default();
    let result = match (format, &scan) {
        (Format::MemoryViz, _) => {
            let max = args.max_entries.unwrap_or(memory_viz::DEFAULT_MAX_ENTRIES);
            memory_viz::write(path, conns[0], max, &mut progress, &mut out)
                .map(|w| dropped = w.dropped_entries)
        }
        (Format::Chrome, Some(scan)) => {
            let options = export::chrome::Options {
                all_samples: args.all_samples,
            };
            export::chrome::write(path, scan, &conns, options, &mut progress, &mut out)
                .map(|s| coalesced = s)
        }
        (Format::Folded, Some(scan)) => {
            folded::write(path, scan, &conns, args.at, &mut progress, &mut out)
        }
        (Format::Json, _) => export::json::write(path, &conns, &mut progress, &mut out),
        (Format::Chrome | Format::Folded, None) | (Format::Perfetto, _) => {
            Err(Failure::new("internal: no scan"))
        }
    };
    drop(progress);
    let result = result.and_then(|()| out.flush().map_err(export::write_failed));
    if let Err(e) = result {
        // A write error is said in the output's words (which file, or standard output); the
        // exporters' own errors (a trace that changed meanwhile) as they are. Dropping `out`
        // removes only its temporary file.
        if out.reader_gone() {
            return Ok(ExitCode::SUCCESS);
        }
        return Err(out.failure().unwrap_or(e));
    }
    let reader_gone = out.reader_gone();
    out.finish()?;
    if dropped > 0 {
        let max = args.max_entries.unwrap_or(memory_viz::DEFAULT_MAX_ENTRIES);
        eprintln!(
            "oomtrace: memory-viz keeps the most recent {max} entries per device: {dropped} \
             older ones left out (the final segments are complete; --max-entries 0 keeps all)"
        );
    }
    if !coalesced.is_empty() {
        eprintln!(
            "oomtrace: chrome export coalesced to {} time buckets per device: {} counter \
             samples, {} step markers and {} OOM instants left out (--all-samples keeps all)",
            export::chrome::COUNTER_BUCKETS,
            coalesced.samples,
            coalesced.markers,
            coalesced.ooms
        );
    }
    if !to_stdout && !reader_gone {
        let hint = match format {
            Format::MemoryViz => " (open it at https://pytorch.org/memory_viz)",
            Format::Chrome | Format::Perfetto => " (open it at https://ui.perfetto.dev)",
            Format::Folded => " (flamegraph.pl or inferno-flamegraph draw it)",
            Format::Json => "",
        };
        eprintln!("oomtrace: wrote {}{hint}", output.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// The trace's file name, for the progress line.
fn file_name(path: &Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}
