//! A progress bar for reading big traces (`report`, `export`): bytes of the trace file read.
//!
//! Drawn on standard error only when it is a terminal, and only once the command has run for
//! [`DELAY`] (short commands, pipes, logs and CI never see it); cleared when a pass ends, so
//! the lines printed after it stand alone. The library reads and calls back
//! (`Trace::load_with_progress`); only this module draws.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// How long a command runs before its progress appears.
pub const DELAY: Duration = Duration::from_secs(1);

/// Progress across the passes of one command (export reads the trace more than once).
pub struct Progress {
    start: Instant,
    /// Standard error is a terminal.
    enabled: bool,
    bar: Option<ProgressBar>,
    label: String,
}

impl Progress {
    /// Starts the clock for a command; nothing is drawn yet.
    pub fn new() -> Progress {
        Progress {
            start: Instant::now(),
            enabled: std::io::stderr().is_terminal(),
            bar: None,
            label: String::new(),
        }
    }

    /// A new pass over the trace, described by `label` (e.g. `reading trace.oomt`).
    pub fn pass(&mut self, label: impl Into<String>) {
        self.end_pass();
        self.label = label.into();
    }

    /// `done` of `total` bytes of the trace read in this pass.
    pub fn update(&mut self, done: u64, total: u64) {
        if !self.enabled {
            return;
        }
        if self.bar.is_none() {
            if self.start.elapsed() < DELAY {
                return;
            }
            let bar =
                ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr_with_hz(8));
            let style = ProgressStyle::with_template(
                "oomtrace: {msg} [{bar:30}] {bytes}/{total_bytes} ({eta} left)",
            )
            .map(|s| s.progress_chars("=> "))
            .unwrap_or_else(|_| ProgressStyle::default_bar());
            bar.set_style(style);
            bar.set_message(self.label.clone());
            self.bar = Some(bar);
        }
        if let Some(bar) = &self.bar {
            bar.set_length(total.max(done));
            bar.set_position(done);
        }
    }

    /// Clears the bar of the current pass, if one is drawn.
    pub fn end_pass(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.end_pass();
    }
}
