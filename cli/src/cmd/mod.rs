//! One module per subcommand: an `Args` struct (clap) and `run(Args) -> Result<ExitCode, Failure>`.
//! To add a command: a file here and one variant in `main.rs`.

pub mod collect;
pub mod demo;
pub mod diff;
pub mod export;
pub mod lib;
pub mod report;
pub mod run;
pub mod view;
pub mod whatif;
