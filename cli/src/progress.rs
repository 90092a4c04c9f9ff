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
    /// The template the bar is drawn with now.
    template: &'static str,
    label: String,
}

/// The bar with the time left, once there is a rate to project it from.
const WITH_ETA: &str = "oomtrace: {msg} [{bar:30}] {bytes}/{total_bytes} ({eta} left)";
/// The bar before its first byte (or with nothing to read): indicatif's estimate is then
/// "0s", which reads as almost done.
const WITHOUT_ETA: &str = "oomtrace: {msg} [{bar:30}] {bytes}/{total_bytes}";

/// The template for `done` of `total` bytes read.
fn template(done: u64, total: u64) -> &'static str {
    if done == 0 || done >= total {
        WITHOUT_ETA
    } else {
        WITH_ETA
    }
}

fn style(template: &str) -> ProgressStyle {
    ProgressStyle::with_template(template)
        .map(|s| s.progress_chars("=> "))
        .unwrap_or_else(|_| ProgressStyle::default_bar())
}

impl Progress {
    /// Starts the clock for a command; nothing is drawn yet.
    pub fn new() -> Progress {
        Progress {
            start: Instant::now(),
            enabled: std::io::stderr().is_terminal(),
            bar: None,
            template: WITHOUT_ETA,
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
            self.template = template(done, total);
            bar.set_style(style(self.template));
            bar.set_message(self.label.clone());
            self.bar = Some(bar);
        }
        if let Some(bar) = &self.bar {
            let wanted = template(done, total);
            if wanted != self.template {
                self.template = wanted;
                bar.set_style(style(wanted));
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Nothing read yet (a trace of 0 B, or the first pass before its first byte): no time
    /// left is shown, never "0s left"; in between, it is.
    #[test]
    fn the_time_left_shows_only_once_there_is_a_rate() {
        assert_eq!(template(0, 0), WITHOUT_ETA);
        assert_eq!(template(0, 1 << 30), WITHOUT_ETA);
        assert_eq!(template(1, 1 << 30), WITH_ETA);
        assert_eq!(template(1 << 30, 1 << 30), WITHOUT_ETA);
        assert!(!WITHOUT_ETA.contains("left"));
        for t in [WITH_ETA, WITHOUT_ETA] {
            assert!(ProgressStyle::with_template(t).is_ok(), "{t}");
        }
    }
}
