//! `oomtrace`: run a program under the tracer, collect traces, report culprits.
//!
//! One file per subcommand in `cmd/`; `render.rs` is the text report. Errors print as one line
//! (`oomtrace: ...`) with a non-zero exit; `run` exits with the traced program's own code.

mod cmd;
mod export;
mod locate;
mod output;
mod progress;
mod render;
mod signals;
mod simulated_gpu;
mod view;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "oomtrace",
    version,
    about = "Find the code that holds GPU memory: every CUDA allocation, with its call site.",
    long_about = None
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    Run(cmd::run::Args),
    Collect(cmd::collect::Args),
    Report(cmd::report::Args),
    Demo(cmd::demo::Args),
    Export(cmd::export::Args),
    Diff(cmd::diff::Args),
    View(cmd::view::Args),
    Whatif(cmd::whatif::Args),
    #[command(aliases = ["lib-path", "libpath", "preload"])]
    Lib(cmd::lib::Args),
}

/// An error for the user: one line, and the exit code to leave with.
#[derive(Debug)]
pub struct Failure {
    pub message: String,
    pub code: u8,
}

impl Failure {
    pub fn new(message: impl Into<String>) -> Failure {
        Failure {
            message: message.into(),
            code: 2,
        }
    }
    /// A failure whose one line was already printed (by a child that shares our stderr).
    pub fn already_said(code: u8) -> Failure {
        Failure {
            message: String::new(),
            code,
        }
    }
    pub fn with_code(mut self, code: u8) -> Failure {
        self.code = code;
        self
    }
}

impl<E: std::error::Error> From<E> for Failure {
    fn from(e: E) -> Failure {
        Failure::new(e.to_string())
    }
}

/// A clap error as one line: its message with the details clap puts on the lines below it
/// (which arguments are missing, which values are allowed), without "error: ", the usage and
/// the "For more information" tail.
fn one_line(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let mut parts: Vec<&str> = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with("Usage:") || line.starts_with("For more information") {
            break;
        }
        if !line.is_empty() {
            parts.push(line.strip_prefix("error: ").unwrap_or(line));
        }
    }
    let joined = parts.join(" ");
    if joined.is_empty() {
        "invalid arguments".into()
    } else {
        joined
    }
}

fn main() -> ExitCode {
    // A bug must still end in one line, never a backtrace over the user's output.
    std::panic::set_hook(Box::new(|info| {
        eprintln!("oomtrace: internal error: {info} (please report this)");
    }));
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(
                e.kind(),
                ErrorKind::DisplayHelp
                    | ErrorKind::DisplayVersion
                    | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) {
                let _ = e.print();
                return if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                    ExitCode::from(2)
                } else {
                    ExitCode::SUCCESS
                };
            }
            eprintln!("oomtrace: {} (see `oomtrace --help`)", one_line(&e));
            return ExitCode::from(2);
        }
    };
    let result = match cli.command {
        Command::Run(a) => cmd::run::run(a),
        Command::Collect(a) => cmd::collect::run(a),
        Command::Report(a) => cmd::report::run(a),
        Command::Demo(a) => cmd::demo::run(a),
        Command::Export(a) => cmd::export::run(a),
        Command::Diff(a) => cmd::diff::run(a),
        Command::View(a) => cmd::view::run(a),
        Command::Whatif(a) => cmd::whatif::run(a),
        Command::Lib(a) => cmd::lib::run(a),
    };
    match result {
        Ok(code) => code,
        Err(f) => {
            if !f.message.is_empty() {
                eprintln!("oomtrace: {}", f.message);
            }
            ExitCode::from(f.code)
        }
    }
}
