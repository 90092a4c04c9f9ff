//! The growth detectors' evidence: what a leak or growth finding shows in the JSON report
//! (`evidence` of kind `leak` and `growth`), and the pieces the device's evidence shares with
//! it (`LevelChange`, `AtDetection`). [`super::growth`] and [`super::site_growth`] both report
//! in `LeakEvidence`; [`super::device_growth`] has its own evidence built of the same pieces.
//! This file names no detector.

use serde::Serialize;

use super::leaks::GrewAt;
use super::trend::Trend;
use super::window::Window;
use super::PythonLine;
use crate::units::fmt_bytes;

/// What a call site's growth is, as its evidence says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Class {
    Leak,
    /// Growth that slowed down: a cache filling up to its capacity.
    Bounded,
    /// Growth made of sizes never live twice: a cache keyed by shape.
    ShapeKeyed,
}

/// One change of a finding's level, in its `history`.
#[derive(Clone, Debug, Serialize)]
pub struct LevelChange {
    pub level: &'static str,
    pub step: u32,
    pub time_s: f64,
}

/// The evidence as it stood when the finding was first raised (`likely`): what the live line
/// said then. Kept as it was, whatever the site does afterwards.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct AtDetection {
    pub step: u32,
    pub time_s: f64,
    /// The level it was raised at (`likely`, or `confirmed` when both came at once).
    pub level: &'static str,
    /// Live bytes and allocations at the site at that step boundary.
    pub bytes: u64,
    pub count: u64,
    /// Distinct steps (after warm-up) whose allocations here were still live.
    pub surviving_epochs: u32,
    pub slope_bytes_per_step: f64,
    pub slope_bytes_per_s: Option<f64>,
}

/// What became of a growing series' memory by the end: what its final level and words rest on
/// (docs/findings.md). A series that grew step after step is a leak only if no step gave its
/// memory back: freeing it on the way out (a cleanup loop before exit, an interpreter's
/// teardown) leaves it one, as it grew for the whole run and would grow with more steps; a
/// step boundary that finds none of it left means the program gave it back while it still
/// ran (a backlog that drained), which is no leak.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Fate {
    /// Some of it is still live.
    Held,
    /// None is live; it was kept through the last step boundary and freed after it, as the
    /// process ended.
    FreedAtExit,
    /// None is live; it was kept through the last step boundary and freed after it, in a
    /// process that had not ended (a trace that ends while it runs).
    FreedAfterLastStep,
    /// None is live, and a step boundary already found none: freed while the program still
    /// ran its steps.
    Drained,
}

impl Fate {
    /// The fate of a series with `count` live allocations now, `last_step_bytes` at its last
    /// step boundary, in a process that has `ended` or not.
    pub fn of(count: u64, last_step_bytes: u64, ended: bool) -> Fate {
        match (count, last_step_bytes, ended) {
            (1.., _, _) => Fate::Held,
            (0, 0, _) => Fate::Drained,
            (0, _, true) => Fate::FreedAtExit,
            (0, _, false) => Fate::FreedAfterLastStep,
        }
    }
}

/// The step boundary that found a drained series' memory all gone: `judged`, the one that
/// resolved it, or else, for a series whose `fate` a report finds drained before a boundary
/// judged it, the first of its `samples` (step, live bytes) after its peak step that found
/// nothing. None when it did not drain.
pub(crate) fn drained_at(
    judged: Option<u32>,
    fate: Fate,
    peak_step: u32,
    mut samples: impl Iterator<Item = (u32, u64)>,
) -> Option<u32> {
    judged.or_else(|| {
        if fate != Fate::Drained {
            return None;
        }
        samples
            .find(|&(step, live)| step > peak_step && live == 0)
            .map(|(step, _)| step)
    })
}

/// What a drained series did, after "grew (+1.00 MiB/step) ": "to 30.00 MiB by step 29, then
/// all of it was freed (none left at step 30)", and what it holds again now, if anything.
pub(crate) fn drained_clause(peak: u64, peak_step: u32, drained: u32, live: u64) -> String {
    let mut text = format!(
        "to {} by step {peak_step}, then all of it was freed (none left at step {drained})",
        fmt_bytes(peak)
    );
    if live > 0 {
        text.push_str(&format!("; {} held now", fmt_bytes(live)));
    }
    text
}

/// What became of the site's memory by the end of the trace (the report's moment).
#[derive(Clone, Copy, Debug, Serialize)]
pub struct AtEnd {
    /// Live bytes and allocations at the site at the end (the finding's `bytes`/`count`).
    pub bytes: u64,
    pub count: u64,
    /// `held` (some of it is still live) or `freed` (none is).
    pub state: &'static str,
    /// The last step boundary, and the site's live bytes there.
    pub last_step: u32,
    pub last_step_bytes: u64,
    /// Bytes freed after the last step boundary (by the program's end, when it has ended).
    pub freed_after_last_step_bytes: u64,
    /// Whether the process had ended: frees after its last step happened on its way out.
    pub process_ended: bool,
    /// What that makes of it: `held`, `freed_at_exit`, `freed_after_last_step` or `drained`.
    pub fate: Fate,
}

impl AtEnd {
    /// What became of a series' memory: its live bytes and allocations now, and its last
    /// step-boundary sample (step and bytes; none yet: step 0, 0 bytes).
    pub(crate) fn new(bytes: u64, count: u64, last: Option<(u32, u64)>, ended: bool) -> AtEnd {
        let (last_step, last_step_bytes) = last.unwrap_or((0, 0));
        AtEnd {
            bytes,
            count,
            state: if count > 0 { "held" } else { "freed" },
            last_step,
            last_step_bytes,
            freed_after_last_step_bytes: last_step_bytes.saturating_sub(bytes),
            process_ended: ended,
            fate: Fate::of(count, last_step_bytes, ended),
        }
    }

    /// How a leak's message ends when its memory was kept through the last step and freed
    /// after it: "kept through the last step (40.00 MiB at step 39) and only freed at exit".
    /// Never "all of it was freed": beside the leak's level that reads as a contradiction, and
    /// no step gave the memory back. None for the other fates.
    pub fn freed_after_last_step(&self) -> Option<String> {
        let when = match self.fate {
            Fate::FreedAtExit => "at exit",
            Fate::FreedAfterLastStep => "after it",
            Fate::Held | Fate::Drained => return None,
        };
        Some(format!(
            "kept through the last step ({} at step {}) and only freed {when}",
            fmt_bytes(self.last_step_bytes),
            self.last_step
        ))
    }
}

/// "9.00 MiB held in 9 allocations surviving from 6 different steps".
pub(crate) fn held_in(bytes: u64, count: u64, surviving: u32) -> String {
    format!(
        "{} held in {count} allocation{} surviving from {surviving} different step{}",
        fmt_bytes(bytes),
        if count == 1 { "" } else { "s" },
        if surviving == 1 { "" } else { "s" }
    )
}

/// The end of a leak's message: what became of the memory by the end of the trace. A leak's
/// memory is still held, or was kept through the last step and freed after it (drained memory
/// is growth, worded by its detector).
pub(crate) fn end_clause(end: &AtEnd) -> String {
    if end.count > 0 {
        let mut text = format!(
            "by the end {} still held in {} allocation{}",
            fmt_bytes(end.bytes),
            end.count,
            if end.count == 1 { "" } else { "s" }
        );
        if end.freed_after_last_step_bytes > 0 {
            text.push_str(&format!(
                " ({} freed after the last step{})",
                fmt_bytes(end.freed_after_last_step_bytes),
                if end.process_ended { ", at exit" } else { "" }
            ));
        }
        return text;
    }
    end.freed_after_last_step()
        .unwrap_or_else(|| "by the end none of it is held".into())
}

/// Steps a small leak is projected over: what it reaches in a long job.
pub const SMALL_PROJECTION_STEPS: f64 = 1e6;

/// A leak too small to pass the trend's floor of growth, found because every step since
/// warm-up left allocations that survive and none of them was ever freed (`evidence.small`).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct SmallLeak {
    /// Allocations (tensors, under PyTorch) kept per step, on average over the steps read.
    pub allocations_per_step: f64,
    pub bytes_per_step: f64,
    /// What it holds after [`SMALL_PROJECTION_STEPS`] steps at this rate.
    pub after_million_steps_bytes: f64,
}

impl SmallLeak {
    /// "small but steady: 1 tensor a step kept, none freed (+512 B/step); 488.28 MiB after
    /// 10^6 steps". `unit`: what an allocation is called (`tensor`, `allocation`).
    pub fn words(&self, unit: &str) -> String {
        let n = self.allocations_per_step;
        let count = if (n - n.round()).abs() < 0.05 {
            format!("{}", n.round() as u64)
        } else {
            format!("{n:.1}")
        };
        format!(
            "small but steady: {count} {unit}{} a step kept, none freed (+{}/step); {} after \
             10^6 steps",
            if count == "1" { "" } else { "s" },
            fmt_bytes(self.bytes_per_step.max(0.0).round() as u64),
            fmt_bytes(self.after_million_steps_bytes.max(0.0).round() as u64)
        )
    }
}

/// A leak found on what its site holds (`evidence.kept`): allocations that keep arriving,
/// however irregularly and however the rate thins, none ever freed since warm-up.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct KeptLeak {
    /// Kept allocations born since warm-up (all still live), and their bytes.
    pub allocations: u64,
    pub bytes: u64,
    /// Steps that left survivors, and the steps from the first of them to the last.
    pub steps_with_survivors: u32,
    pub over_steps: u32,
    /// The longest run of steps between two of them.
    pub longest_gap_steps: u32,
    /// Steps since the last one, and how long none may come before the growth counts as
    /// stopped (max(8, twice the longest gap, half the steps they came over)).
    pub steps_since_last: u32,
    pub quiet_limit_steps: u32,
    /// Every live allocation has a size no other has: a cache keyed by input shape.
    pub one_per_distinct_size: bool,
}

impl KeptLeak {
    /// What it kept per step, on average over the steps they came over.
    pub fn bytes_per_step(&self) -> f64 {
        self.bytes as f64 / f64::from(self.over_steps.max(1))
    }

    /// "a cache keyed by input shape: 44 tensors, one per distinct size, never evicted", or
    /// "44 tensors kept over 110 steps, none freed" (`unit`: what an allocation is called).
    pub fn words(&self, unit: &str) -> String {
        let n = self.allocations;
        let units = format!("{n} {unit}{}", if n == 1 { "" } else { "s" });
        if self.one_per_distinct_size {
            format!("a cache keyed by input shape: {units}, one per distinct size, never evicted")
        } else {
            format!(
                "{units} kept over {} steps, none freed, arriving irregularly",
                self.over_steps
            )
        }
    }
}

/// The evidence of a leak finding in the JSON report.
#[derive(Clone, Debug, Serialize)]
pub struct LeakEvidence {
    pub class: Class,
    pub trend: Option<Trend>,
    pub slope_bytes_per_s: Option<f64>,
    /// Distinct epochs whose allocations at this site are still live (after warm-up).
    pub surviving_epochs: u32,
    pub live_count: u64,
    pub first_seen_step: u32,
    pub first_seen_s: f64,
    /// The oldest epoch with a live allocation at this site.
    pub onset_step: u32,
    pub onset_s: Option<f64>,
    pub detected_step: Option<u32>,
    pub detected_s: Option<f64>,
    /// When the device would be full at this rate; none once it ran out of memory.
    pub steps_to_oom: Option<f64>,
    pub time_to_oom_s: Option<f64>,
    /// Live bytes at the last epoch boundaries, oldest first.
    pub samples: Vec<u64>,
    pub history: Vec<LevelChange>,
    /// The evidence when the finding was first raised (absent if it never was).
    pub at_detection: Option<AtDetection>,
    /// The site's highest live bytes at a step boundary, and that step.
    pub peak_bytes: u64,
    pub peak_step: u32,
    /// What became of the memory by the end.
    pub at_end: AtEnd,
    /// For a leak of PyTorch's caching-allocator segments: the lines whose allocations made
    /// the device's cache grow over the device's growth window (the report fills it in
    /// from `cache_grew_at`); absent otherwise.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub python_lines: Vec<PythonLine>,
    /// Where the device's cache grew over its growth window (the device growth detector's
    /// call sites, attached by the analysis): the report's `python_lines` come from them.
    #[serde(skip)]
    pub cache_grew_at: Vec<GrewAt>,
    /// For growth of one buffer whose allocations are replaced by larger ones (the
    /// site-growth detector): what was replaced; absent for surviving allocations.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replaced: Option<Replaced>,
    /// For a leak below the trend's floor of growth, found because every step's allocations
    /// survive and none is ever freed: how small; absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub small: Option<SmallLeak>,
    /// For a leak found on what it holds (allocations kept, none ever freed, still
    /// arriving): the counts; absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kept: Option<KeptLeak>,
}

/// What was replaced, in a leak's evidence (`evidence.replaced`).
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Replaced {
    /// Allocations made and freed at the site over the trend window (in the steps after its
    /// first sample, up to its last).
    pub allocations_in_window: u64,
    pub frees_in_window: u64,
    /// The largest single allocation at the site over the window: the buffer itself.
    pub largest_allocation_bytes: u64,
    /// The window: the site's live bytes at its first and last step.
    pub window: Window,
}
