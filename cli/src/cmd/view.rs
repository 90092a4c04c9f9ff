//! `oomtrace view`: one self-contained HTML page of a trace (see `crate::view`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::output::Output;
use crate::progress::Progress;
use crate::view::{html, model};
use crate::Failure;

/// Write one HTML page of a trace that opens offline: memory over time per device by call
/// site, step markers and findings, the OOM, a flame graph and a table of call sites.
#[derive(clap::Args)]
pub struct Args {
    /// A .oomt trace file.
    pub file: PathBuf,
    /// The HTML file to write; `-` writes to standard output. An existing file is replaced
    /// only once the page is complete. [default: the trace's name with .html, beside it
    /// (never replacing a file there)]
    #[arg(short = 'o', long = "output", value_name = "OUT")]
    pub output: Option<PathBuf>,
    /// Open the icicle of what was held at this moment: a step (`12`: just after the 12th step
    /// marker) or a time into the run (`3.5s`). Every page also offers peak, the OOM, the end
    /// and evenly spaced steps to scrub to.
    #[arg(long, value_name = "STEP|TIME", value_parser = model::At::parse)]
    pub at: Option<model::At>,
}

pub fn run(args: Args) -> Result<ExitCode, Failure> {
    let (output, chosen) = match args.output {
        Some(o) => (o, true),
        None => (crate::output::beside(&args.file, ".html"), false),
    };
    write_page_to(&args.file, &output, chosen, args.at)?;
    if output.as_os_str() != "-" {
        eprintln!(
            "oomtrace: wrote {} (open it in a browser; it needs no network)",
            output.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Builds the page of the trace at `trace` and writes it to `output` (`-`: standard output).
/// Nothing at `output` changes when the trace cannot be read.
pub fn write_page(trace: &Path, output: &Path) -> Result<(), Failure> {
    write_page_to(trace, output, true, None)
}

/// `write_page`; `named` false: `output` is a default name, written only if nothing is there.
fn write_page_to(
    trace: &Path,
    output: &Path,
    named: bool,
    at: Option<model::At>,
) -> Result<(), Failure> {
    if !named {
        // Said before the trace is read, which can take a while.
        crate::output::ensure_free(output)?;
    }
    let mut progress = Progress::new();
    let page = model::build(trace, at, &mut progress)?;
    drop(progress);
    for w in &page.stale_module_warnings {
        eprintln!("oomtrace: warning: {w}");
    }
    let data = page.data;
    let out = if named {
        Output::create(output)?
    } else {
        Output::create_new(output)?
    };
    let mut out = out.named("the view");
    let result = html::write(&data, &mut out).and_then(|()| out.flush());
    if result.is_err() && out.reader_gone() {
        return Ok(());
    }
    if let Err(e) = result {
        return Err(out
            .failure()
            .unwrap_or_else(|| crate::export::write_failed(e)));
    }
    out.finish()?;
    Ok(())
}
