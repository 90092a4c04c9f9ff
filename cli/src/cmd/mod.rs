//! One module per subcommand: an `Args` struct (clap) and `run(Args) -> Result<ExitCode, Failure>`.
//! To add a command: a file here and one variant in `main.rs`.

pub mod collect;
pub mod demo;
pub mod diff;
pub mod export;
pub mod fit;
pub mod lib;
pub mod report;
pub mod run;
pub mod top;
pub mod view;
pub mod whatif;

/// `--top`'s default, the same in every command that lists call sites (`report`, `diff`, and
/// `run`'s report for `--json`).
pub const DEFAULT_TOP: usize = 10;
