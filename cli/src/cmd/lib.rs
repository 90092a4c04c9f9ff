//! `oomtrace lib`: where liboomtrace.so is, for `LD_PRELOAD` without `oomtrace run`.

use std::io::Write;
use std::process::ExitCode;

use crate::{locate, Failure};

/// Print the path of liboomtrace.so, for `LD_PRELOAD=$(oomtrace lib) python train.py`.
///
/// The library next to this binary, or (for the self-contained binary) the copy it carries,
/// written once to the cache directory. `OOMTRACE_LIB` overrides both.
#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> Result<ExitCode, Failure> {
    let lib = locate::shim_library()?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{}", lib.display())
        .and_then(|()| out.flush())
        .map_err(|e| Failure::new(format!("cannot write to standard output: {e}")))?;
    Ok(ExitCode::SUCCESS)
}
