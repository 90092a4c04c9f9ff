//! `oomtrace`: run a program under the tracer, collect traces, report culprits.
//!
//! One file per subcommand in `cmd/`; `render.rs` is the text report, `style.rs` its colour.
//! Errors print as one line (`oomtrace: ...`) with a non-zero exit; an argument error points at
//! the subcommand's `--help`; `run` exits with the traced program's own code.

mod cmd;
mod export;
mod handoff;
mod locate;
mod output;
mod progress;
mod render;
mod signals;
mod simulated_gpu;
mod style;
mod view;

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

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
    /// Colour the text of `report`, `run` and `demo` (the commands that colour; each also
    /// takes it after its name): auto (on a terminal, unless NO_COLOR is set), always, never.
    #[arg(long, value_enum, value_name = "WHEN")]
    color: Option<style::ColorChoice>,
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
    Fit(cmd::fit::Args),
    Top(cmd::top::Args),
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

/// The subcommand the command line names (its canonical name, an alias resolved), if any: the
/// first argument that is not an option (or `--color`'s value).
fn subcommand_named(args: &[std::ffi::OsString]) -> Option<String> {
    let mut args = args.iter().skip(1);
    while let Some(arg) = args.next() {
        let arg = arg.to_str()?;
        if arg == "--color" {
            args.next();
            continue;
        }
        if arg.starts_with('-') {
            continue;
        }
        return Cli::command()
            .find_subcommand(arg)
            .map(|c| c.get_name().to_string());
    }
    None
}

/// An argument error as one line, pointing at the help that lists what is accepted: the
/// subcommand's when one was named.
fn argument_error(e: &clap::Error, args: &[std::ffi::OsString]) -> String {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    let help = match subcommand_named(args) {
        Some(name) => format!("oomtrace {name} --help"),
        None => "oomtrace --help".to_string(),
    };
    // An unknown option: named as such, with clap's suggestion of a similar one, but not its
    // tip to put it after `--` (for `run` that would make it the command to trace).
    if e.kind() == ErrorKind::UnknownArgument {
        if let Some(ContextValue::String(flag)) = e.get(ContextKind::InvalidArg) {
            let similar = match e.get(ContextKind::SuggestedArg) {
                Some(ContextValue::String(s)) => format!("; a similar one: '{s}'"),
                Some(ContextValue::Strings(v)) if !v.is_empty() => {
                    format!("; similar ones: '{}'", v.join("', '"))
                }
                _ => String::new(),
            };
            let what = if flag.starts_with('-') {
                "unknown option"
            } else {
                "unexpected argument"
            };
            return format!("{what} '{flag}'{similar} (see `{help}`)");
        }
    }
    format!("{} (see `{help}`)", one_line(e))
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
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let cli = match Cli::try_parse_from(&args) {
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
            eprintln!("oomtrace: {}", argument_error(&e, &args));
            return ExitCode::from(2);
        }
    };
    // Only the commands that colour take `--color` after their name.
    let asked = match &cli.command {
        Command::Run(a) => a.color,
        Command::Report(a) => a.color,
        Command::Demo(a) => a.color,
        _ => None,
    };
    style::set_choice(asked.or(cli.color).unwrap_or_default());
    let result = match cli.command {
        Command::Run(a) => cmd::run::run(a),
        Command::Collect(a) => cmd::collect::run(a),
        Command::Report(a) => cmd::report::run(a),
        Command::Demo(a) => cmd::demo::run(a),
        Command::Export(a) => cmd::export::run(a),
        Command::Diff(a) => cmd::diff::run(a),
        Command::View(a) => cmd::view::run(a),
        Command::Top(a) => cmd::top::run(a),
        Command::Whatif(a) => cmd::whatif::run(a),
        Command::Fit(a) => cmd::fit::run(a),
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
