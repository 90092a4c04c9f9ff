//! `oomtrace`: run a program under the tracer, collect traces, report culprits.
//!
//! One file per subcommand in `cmd/`; `render.rs` is the text report. Errors print as one line
//! (`oomtrace: ...`) with a non-zero exit; `run` exits with the traced program's own code.

mod cmd;
mod export;
mod locate;
mod render;
mod signals;

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
            // One line: clap's first line, without its "error: " prefix.
            let text = e.render().to_string();
            let first = text.lines().next().unwrap_or("invalid arguments");
            let first = first.strip_prefix("error: ").unwrap_or(first);
            eprintln!("oomtrace: {first} (see `oomtrace --help`)");
            return ExitCode::from(2);
        }
    };
    let result = match cli.command {
        Command::Run(a) => cmd::run::run(a),
        Command::Collect(a) => cmd::collect::run(a),
        Command::Report(a) => cmd::report::run(a),
        Command::Demo(a) => cmd::demo::run(a),
        Command::Export(a) => cmd::export::run(a),
    };
    match result {
        Ok(code) => code,
        Err(f) => {
            eprintln!("oomtrace: {}", f.message);
            ExitCode::from(f.code)
        }
    }
}
