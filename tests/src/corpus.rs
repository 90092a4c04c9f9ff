//! The labeled leak-detection corpus (`scenarios/corpus/`): what each program is, what the
//! detector must say about it, and how to score a report against that. Shared by the
//! integration test (`it/corpus.rs`, through `oomtrace run`) and the benchmark
//! (`benches/detection.rs`), so both judge by the same rules.

use serde_json::Value;

use crate::{findings, functions};

/// Steps each corpus program runs (its default `CORPUS_STEPS`).
pub const STEPS: u32 = 60;
/// A leak of ≥ 1 MiB/step must be found within this many epochs of its onset (docs/targets.md),
/// counted from the end of warm-up when it starts earlier: growth during warm-up cannot be
/// told apart from warm-up itself.
pub const BUDGET_EPOCHS: u32 = 10;
/// The budget of a sparse stream (a few allocations per step, steps paced by time).
pub const SPARSE_BUDGET_EPOCHS: u32 = 20;
/// Without markers the clock must find the iteration itself.
const AUTO: &[&str] = &["auto"];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Label {
    /// Leaks at `function` from step `onset` on.
    Leak { function: &'static str, onset: u32 },
    /// Looks like growth, is not: no leak finding allowed.
    Clean,
    /// Grows, then stops: a leak alarm may come and go, none may remain.
    Bounded,
    /// Allocator retries: a fragmentation finding, no leak.
    Fragmentation,
}

/// The kind of program a case stands for: the benchmark reports each class on its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Class {
    /// A training loop of many allocations per step (the skeleton of `corpus.h`).
    Classic,
    /// A CUDA extension allocating once per step, and nothing else allocating (period 1).
    Extension,
    /// One buffer re-allocated every step (reallocate-and-copy, concatenation).
    Realloc,
    /// A framework's own pool: only its reservation and chunks reach CUDA.
    Pool,
    /// Iterations of a varying number of allocations of varying sizes.
    Irregular,
    /// Exactly one allocation per step (device or pinned host memory).
    OnePerStep,
    /// A few allocations per step, steps paced by time (a caching allocator's stream).
    Sparse,
    /// Several threads, each with its own loop.
    Threaded,
    /// A phase change: training, then evaluation.
    Phase,
}

impl Class {
    pub fn name(self) -> &'static str {
        match self {
            Class::Classic => "classic",
            Class::Extension => "extension",
            Class::Realloc => "realloc",
            Class::Pool => "pool",
            Class::Irregular => "irregular",
            Class::OnePerStep => "one_per_step",
            Class::Sparse => "sparse",
            Class::Threaded => "threaded",
            Class::Phase => "phase",
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub struct Case {
    pub name: &'static str,
    pub label: Label,
    pub env: &'static [(&'static str, &'static str)],
    pub class: Class,
    /// Epochs from onset within which a leak must be found ([`BUDGET_EPOCHS`] unless the class
    /// says otherwise: a sparse stream gets [`SPARSE_BUDGET_EPOCHS`]).
    pub budget: u32,
    /// The epoch sources the report may name when the program runs without markers.
    pub sources: &'static [&'static str],
}

const fn leak(name: &'static str, function: &'static str, onset: u32) -> Case {
    Case {
        name,
        label: Label::Leak { function, onset },
        env: &[],
        class: Class::Classic,
        budget: BUDGET_EPOCHS,
        sources: AUTO,
    }
}

const fn clean(name: &'static str) -> Case {
    Case {
        name,
        label: Label::Clean,
        env: &[],
        class: Class::Classic,
        budget: BUDGET_EPOCHS,
        sources: AUTO,
    }
}

impl Case {
    /// The case, of another class than [`Class::Classic`].
    const fn of(self, class: Class) -> Case {
        Case { class, ..self }
    }
}

pub const CORPUS: &[Case] = &[
    leak("leak_history", "history_append", 0),
    leak("leak_slow_sawtooth", "stash_metric", 0),
    leak("leak_periodic", "cache_eval_output", 0),
    leak("leak_late", "retain_after_switch", 30),
    leak("leak_ext", "ext_workspace_leak", 0),
    leak("leak_vmm", "grow_segment", 0),
    leak("leak_total_loss", "forward_layer", 0),
    leak("leak_async", "async_leak", 0),
    clean("clean_static"),
    clean("clean_dynamic"),
    clean("clean_grad_accum"),
    clean("clean_eval"),
    clean("clean_lru"),
    clean("clean_oneoff"),
    clean("clean_warmup"),
    clean("clean_empty_cache"),
    Case {
        name: "bounded_cache",
        label: Label::Bounded,
        env: &[],
        class: Class::Classic,
        budget: BUDGET_EPOCHS,
        sources: AUTO,
    },
    Case {
        name: "frag_retry",
        label: Label::Fragmentation,
        env: &[("SIMCUDA_MEMORY", "1073741824")],
        class: Class::Classic,
        budget: BUDGET_EPOCHS,
        sources: AUTO,
    },
    leak("leak_realloc", "grow_buffer", 0).of(Class::Realloc),
    clean("clean_realloc").of(Class::Realloc),
    leak("leak_pool", "pool_grow", POOL_ONSET).of(Class::Pool),
    // One reservation and nothing per step: no stream to find steps in.
    Case {
        sources: &["none", "windows"],
        ..clean("clean_pool").of(Class::Pool)
    },
    leak("leak_ext_step", "ext_step_keep", 0).of(Class::Extension),
    clean("clean_ext_step").of(Class::Extension),
    leak("leak_ext_static", "ext_step_keep", 0).of(Class::Extension),
    clean("clean_ext_static").of(Class::Extension),
    // The epoch clock's classes: irregular iterations, one allocation per step, sparse streams,
    // threads with their own loops, a phase change (scenarios/corpus/README.md).
    leak("leak_irregular", "keep_output", 0).of(Class::Irregular),
    clean("clean_irregular").of(Class::Irregular),
    leak("leak_one_per_step", "keep_buffer", 0).of(Class::OnePerStep),
    leak("leak_one_per_step_pinned", "keep_buffer", 0).of(Class::OnePerStep),
    clean("clean_one_per_step").of(Class::OnePerStep),
    Case {
        budget: SPARSE_BUDGET_EPOCHS,
        ..leak("leak_sparse", "stash_sample", 0).of(Class::Sparse)
    },
    Case {
        budget: SPARSE_BUDGET_EPOCHS,
        ..clean("clean_sparse").of(Class::Sparse)
    },
    leak("leak_threads", "thread_leak", 0).of(Class::Threaded),
    // 20,000 allocations per thread in well under a second: too short for time windows, and no
    // thread's loop has an iteration made of more than one call site.
    Case {
        sources: &["none", "windows"],
        ..clean("clean_threads").of(Class::Threaded)
    },
    leak("leak_phase", "keep_eval_output", 25).of(Class::Phase),
    clean("clean_phase").of(Class::Phase),
];

/// The step at which leak_pool's reservation is full and the pool starts growing.
const POOL_ONSET: u32 = 11;

pub fn case(name: &str) -> &'static Case {
    CORPUS
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no corpus case {name}"))
}

/// The environment for one run: the case's own plus the marker switch.
pub fn env(case: &Case, markers: bool) -> Vec<(&'static str, &'static str)> {
    let mut v = case.env.to_vec();
    v.push(("CORPUS_MARKERS", if markers { "1" } else { "0" }));
    v
}

/// What the detector said about one run, judged against the label.
#[derive(Clone, Debug)]
pub struct Score {
    pub case: &'static str,
    pub markers: bool,
    /// markers | auto | windows | none
    pub epoch_source: String,
    /// How sure the clock is of its steps (0..1; `epochs.confidence`).
    pub epoch_confidence: f64,
    /// The leak was reported at its function.
    pub found: bool,
    /// Epochs from onset (or from the end of warm-up) to the first likely/confirmed level.
    pub delay: Option<u32>,
    /// Functions of leak findings that are not the labeled leak.
    pub false_leaks: Vec<String>,
    pub fragmentation: bool,
    /// A problem with the run, in a sentence; None if it meets its label.
    pub failure: Option<String>,
}

/// The innermost named function of a finding.
fn site_name(f: &Value) -> String {
    functions(f)
        .into_iter()
        .find(|n| !n.is_empty())
        .unwrap_or_else(|| "??".into())
}

pub fn score(case: &Case, markers: bool, report: &Value) -> Score {
    let process = &report["processes"][0];
    let epochs = &process["epochs"];
    let count = epochs["count"].as_u64().unwrap_or(0) as u32;
    let warmup_end = epochs["warmup_end"].as_u64().unwrap_or(0) as u32;
    let leaks = findings(report, "leak");
    let mut s = Score {
        case: case.name,
        markers,
        epoch_source: epochs["source"].as_str().unwrap_or("?").to_string(),
        epoch_confidence: epochs["confidence"].as_f64().unwrap_or(0.0),
        found: false,
        delay: None,
        false_leaks: Vec::new(),
        fragmentation: !findings(report, "fragmentation").is_empty(),
        failure: None,
    };
    let expected = match case.label {
        Label::Leak { function, .. } => Some(function),
        _ => None,
    };
    for f in &leaks {
        let at = functions(f);
        if expected.is_some_and(|e| at.iter().any(|n| n == e)) {
            s.found = true;
            let detected = f["evidence"]["detected_step"].as_u64().map(|d| d as u32);
            if let (Some(d), Label::Leak { onset, .. }) = (detected, case.label) {
                // Without markers, epochs start when the clock locked: the steps before it
                // are not counted.
                let onset_epoch = if markers {
                    onset
                } else {
                    onset.saturating_sub(STEPS.saturating_sub(count))
                };
                let start = onset_epoch.max(warmup_end);
                s.delay = Some(d.saturating_sub(start));
            }
        } else {
            s.false_leaks.push(site_name(f));
        }
    }
    s.failure = match case.label {
        Label::Leak { function, .. } if !s.found => Some(format!("no leak finding at {function}")),
        Label::Leak { .. } if s.delay.is_none_or(|d| d > case.budget) => Some(format!(
            "found {} epochs after onset (budget {})",
            s.delay.map_or("?".into(), |d| d.to_string()),
            case.budget
        )),
        Label::Fragmentation if !s.fragmentation => Some("no fragmentation finding".into()),
        _ if !s.false_leaks.is_empty() => Some(format!("leak findings at {:?}", s.false_leaks)),
        _ => None,
    };
    s
}

/// Median of the detection delays of the runs that found their leak.
pub fn median_delay(scores: &[Score]) -> Option<f64> {
    let mut d: Vec<u32> = scores.iter().filter_map(|s| s.delay).collect();
    if d.is_empty() {
        return None;
    }
    d.sort_unstable();
    let m = d.len();
    Some(if m % 2 == 1 {
        f64::from(d[m / 2])
    } else {
        f64::from(d[m / 2 - 1] + d[m / 2]) / 2.0
    })
}
