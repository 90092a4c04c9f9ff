//! `oomtrace export`: a trace in another tool's format (see `crate::export`).

use std::fs::File;
use std::io::{self, BufWriter, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use oomtrace_collector::history;

use crate::export::{self, Format};
use crate::Failure;

/// Write a trace in another tool's format: memory-viz, chrome, folded or json.
///
/// memory-viz: a pickle for pytorch.org/memory_viz (one process); chrome: trace-event JSON
/// for ui.perfetto.dev; folded: flamegraph stacks weighted by bytes; json: every event as
/// JSON lines with symbolized call sites.
#[derive(clap::Args)]
pub struct Args {
    /// A .oomt trace file.
    pub file: PathBuf,
    /// Output format.
    #[arg(long, value_enum, value_name = "FORMAT")]
    pub format: Format,
    /// Output file (required); `-` writes to standard output.
    #[arg(short = 'o', long = "output", value_name = "OUT")]
    pub output: Option<PathBuf>,
    /// Export only this process (memory-viz: default the first process with GPU memory events).
    #[arg(long, value_name = "PID")]
    pub pid: Option<u32>,
}

/// Standard output that ends quietly when its reader goes away (`| head`).
struct Stdout {
    inner: io::Stdout,
    closed: bool,
}

impl Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.closed {
            return Ok(buf.len());
        }
        match self.inner.write(buf) {
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => {
                self.closed = true;
                Ok(buf.len())
            }
            r => r,
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self.inner.flush() {
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
            r => r,
        }
    }
}

pub fn run(args: Args) -> Result<ExitCode, Failure> {
    let Some(output) = args.output.clone() else {
        return Err(Failure::new(
            "export needs --output OUT (-o OUT): a file, or - for standard output",
        ));
    };
    // A first, quiet replay validates the file and picks the processes before any output.
    let scan = history::replay(&args.file, |_, _| {})?;
    for w in &scan.warnings {
        eprintln!("oomtrace: warning: {w}");
    }
    let conns: Vec<u32> = if args.format == Format::MemoryViz {
        vec![scan.processes[export::select_one(&scan, args.pid, &args.file)?].conn]
    } else {
        export::select(&scan, args.pid, &args.file)?
            .into_iter()
            .map(|i| scan.processes[i].conn)
            .collect()
    };

    let to_stdout = output.as_os_str() == "-";
    if to_stdout && args.format.binary() && io::stdout().is_terminal() {
        return Err(Failure::new(
            "memory-viz is a binary pickle: write it to a file with -o FILE, not a terminal",
        ));
    }
    let mut out: Box<dyn Write> = if to_stdout {
        Box::new(BufWriter::with_capacity(
            1 << 16,
            Stdout {
                inner: io::stdout(),
                closed: false,
            },
        ))
    } else {
        let f = File::create(&output)
            .map_err(|e| Failure::new(format!("cannot write {}: {e}", output.display())))?;
        Box::new(BufWriter::with_capacity(1 << 20, f))
    };
    let result = write(&args, &scan, &conns, &mut *out)
        .and_then(|()| out.flush().map_err(export::write_failed));
    drop(out);
    if let Err(e) = result {
        if !to_stdout {
            let _ = std::fs::remove_file(&output);
        }
        return Err(e);
    }
    if !to_stdout {
        let hint = match args.format {
            Format::MemoryViz => " (open it at https://pytorch.org/memory_viz)",
            Format::Chrome => " (open it at https://ui.perfetto.dev)",
            Format::Folded => " (flamegraph.pl or inferno-flamegraph draw it)",
            Format::Json => "",
        };
        eprintln!("oomtrace: wrote {}{hint}", output.display());
    }
    Ok(ExitCode::SUCCESS)
}

fn write(
    args: &Args,
    scan: &oomtrace_collector::trace::Trace,
    conns: &[u32],
    out: &mut dyn Write,
) -> Result<(), Failure> {
    let path: &Path = &args.file;
    match args.format {
        Format::MemoryViz => export::memory_viz::write(path, conns[0], out),
        Format::Chrome => export::chrome::write(path, scan, conns, out),
        Format::Folded => export::folded::write(path, scan, conns, out),
        Format::Json => export::json::write(path, conns, out),
    }
}
