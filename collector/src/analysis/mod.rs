//! The analysis: what turns a process's stream of allocations into findings, while the job
//! runs. It observes the model ([`crate::model::Observer`]) and imports only the model and
//! [`crate::units`]; the report reads it, it never reads the report. The live server and a
//! trace replay own one [`Analysis`] beside each process and feed it, so what `oomtrace run`
//! printed while the job ran is what `oomtrace report` shows later. History replays for
//! exporters run the model without it.
//!
//! - [`epoch`]: the epoch clock (the iterations a leak is measured in).
//! - [`growth`]: leaks per call site and device (docs/detection.md).
//! - [`site_growth`]: one buffer per call site growing while its allocations are replaced
//!   (reallocate-and-copy, concatenation), which no surviving generation shows.
//! - The growth detectors' shared vocabulary, which names no detector: [`trend`] (thresholds,
//!   warm-up, the statistics of a trend), [`window`] (the trend windows), [`evidence`] (what a
//!   leak or growth finding shows), [`leaks`] (the leak detector as the others may read it),
//!   [`advice`] (hint texts said alike) and `growth_finding` (the one builder of their
//!   findings).
//! - [`device_growth`]: the process's total on each device rising step after step, whoever
//!   allocates it (the view that still works when a caching allocator spreads a leak over
//!   many call sites).
//! - [`fragmentation`]: allocator retries, failures with free memory, reserved-minus-live creep.
//! - [`oom`]: forensics at each failed allocation (the report opens with them).
//! - [`threshold`]: 85 / 90 / 95 % of device capacity, once per crossing.
//! - [`births`]: live allocations by birth epoch ("generations"), shared by the leak and
//!   device-growth detectors; [`stats`]: their statistics.
//!
//! Each detector is one file behind [`Detector`]: O(1) work per event, its statistics once per
//! epoch, and the findings it stands by at any moment. Detectors never read each other: what
//! one needs of another (OOM records for fragmentation, the leaks' generations for device
//! growth, through [`leaks::Leaks`]) is handed over here, by [`Analysis`], in a fixed order.
//! What one detector's finding means beside the others' (leaks holding the memory at an OOM,
//! a device growth that fragmentation explains, where the cache grew under a leak) is
//! attached here too, in [`Analysis::findings`]; `tests/layers.rs` checks the rule.
//!
//! Detectors see call sites, not stacks: what needs the stacks (a device growth's
//! `python_lines`, whether its allocations are PyTorch's segments) is completed by the report.

pub mod advice;
pub mod anatomy;
pub mod births;
pub mod device_growth;
pub mod epoch;
pub mod evidence;
pub mod fragmentation;
pub mod growth;
mod growth_finding;
pub mod leaks;
pub mod oom;
pub mod refusal;
#[cfg(test)]
pub(crate) mod sim;
pub mod site_growth;
pub mod stats;
pub mod threshold;
pub mod together;
pub mod trend;
pub mod window;

use std::collections::BTreeMap;

use serde::{Serialize, Serializer};

use crate::model::{
    Alloc, DeviceState, EndState, FrameInfo, Free, MemInfo, Observer, OutOfMemory, Process, SiteId,
    TorchMemory,
};
use crate::units::fmt_bytes;
use epoch::EpochClock;
use leaks::Leaks;
use oomtrace_proto::wire::Frame;
use oomtrace_proto::{Api, MemoryClass};

/// How serious a finding is: OOMs, fragmentation, thresholds, and growth that is not a leak.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Severity {
    Info,
    Warning,
    Error,
}

impl Severity {
    pub fn name(self) -> &'static str {
        match self {
            Severity::Info => "info",
            Severity::Warning => "warning",
            Severity::Error => "error",
        }
    }
}

/// How sure a leak (or a device's growth) is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Confidence {
    Suspected,
    Likely,
    Confirmed,
}

impl Confidence {
    pub fn name(self) -> &'static str {
        match self {
            Confidence::Suspected => "suspected",
            Confidence::Likely => "likely",
            Confidence::Confirmed => "confirmed",
        }
    }
}

/// A finding's `level` in the report: a severity, or a leak's confidence. Not ordered: the two
/// do not compare.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Level {
    Severity(Severity),
    Confidence(Confidence),
}

impl Level {
    pub const INFO: Level = Level::Severity(Severity::Info);

    /// The report's word: `error`, `warning`, `info`, `suspected`, `likely`, `confirmed`.
    pub fn name(self) -> &'static str {
        match self {
            Level::Severity(s) => s.name(),
            Level::Confidence(c) => c.name(),
        }
    }
}

impl From<Severity> for Level {
    fn from(s: Severity) -> Level {
        Level::Severity(s)
    }
}

impl From<Confidence> for Level {
    fn from(c: Confidence) -> Level {
        Level::Confidence(c)
    }
}

impl Serialize for Level {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

/// What a finding is about. Its `name` is the report's `kind` (the JSON contract: names are
/// added, never changed).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Oom,
    /// A call site whose memory survives step after step.
    Leak,
    /// A device whose total keeps growing step after step, whoever allocates it.
    DeviceGrowth,
    Fragmentation,
    Threshold,
    /// A call site that looked like a leak but whose growth stopped, slowed or is shape-keyed.
    Growth,
    /// A call site still holding memory when its process ended (the report's own).
    LiveAtExit,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Oom => "oom",
            Kind::Leak => "leak",
            Kind::DeviceGrowth => "device_growth",
            Kind::Fragmentation => "fragmentation",
            Kind::Threshold => "threshold",
            Kind::Growth => "growth",
            Kind::LiveAtExit => "live_at_exit",
        }
    }

    /// Raised by a detector (not an OOM, not the report's live-at-exit list).
    pub fn detected(self) -> bool {
        matches!(
            self,
            Kind::Leak | Kind::DeviceGrowth | Kind::Fragmentation | Kind::Threshold | Kind::Growth
        )
    }
}

impl Serialize for Kind {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

/// The likely cause behind a finding's `hint`: what later layers (the report, the live line)
/// decide on, instead of comparing hint text.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Cause {
    /// Nothing said yet.
    #[default]
    Unknown,
    /// Leaks, by the site's allocation API: tensors kept across steps (`oomtrace_malloc`).
    TensorsKept,
    /// VMM physical memory never released.
    VmmNeverReleased,
    /// Stream-ordered allocations never returned.
    AsyncNeverFreed,
    /// Pinned host memory never freed.
    PinnedNeverFreed,
    /// A plain CUDA allocation never freed, outside PyTorch's allocator as far as the
    /// detector can tell (the report knows better when the stack passes through PyTorch).
    NativeLeak,
    /// A leak of PyTorch's caching-allocator segments (set by the report, from the stack).
    TorchCacheLeak,
    /// Growth that slowed or stopped: a cache filling up.
    CacheFilling,
    /// Growth made of sizes never live twice: a cache keyed by shape.
    ShapeKeyedCache,
    /// Growth whose memory was all freed while the program still ran its steps: a backlog
    /// that drained.
    Drained,
    /// A call site's allocations are replaced by larger ones step after step: one buffer
    /// (a tensor rebuilt by concatenation, a realloc-and-copy) grows.
    ReplacedButGrowing,
    /// A call site's allocations grow step after step but are all freed every step: the
    /// step's working set grows (longer sequences, larger batches), not a leak.
    WorkingSetGrowing,
    /// A device grows with tensor-level events: tensors kept.
    DeviceTensorsKept,
    /// A device grows with plain CUDA allocations.
    DeviceNative,
    /// The leaks on the device grow as fast as it does.
    LeaksExplainGrowth,
    /// PyTorch's segments make the device grow (set by the report): `certain` when the stacks
    /// pass through PyTorch, not just a Python program; `explained` when leaks account for it.
    TorchSegments { certain: bool, explained: bool },
    /// An allocation that succeeded after frees and a retry.
    RetriedAfterFree,
    /// A failure while the driver reported enough free memory.
    FreeButFragmented,
    /// One call site held most of the live memory at a failure.
    OneSiteHeldMost,
    /// Memory spread over many call sites at a failure.
    WorkloadTooLarge,
    /// A request larger than the device's free memory and all the process held together.
    RequestExceedsDevice,
    /// Sites that leak held memory at a failure (set by the report).
    LeaksHeldAtOom,
    /// An out-of-memory while PyTorch's cache held at least the request reserved but
    /// unallocated: the memory was there, in pieces.
    ReservedInPieces,
    /// PyTorch refused a tensor under the memory cap the program set
    /// (`set_per_process_memory_fraction`), before the driver was asked.
    MemoryCap,
    /// Reserved memory that the requests cannot use.
    Fragmented,
    /// Little of the device left.
    NearCapacity,
    /// Live at exit: the site also leaks.
    LiveAndLeaking,
    /// Live at exit: the process did not exit normally.
    EndedAbnormally,
    /// Live at exit: never freed before a normal exit.
    NeverFreed,
}

/// What changed when an alert was raised.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    New,
    Upgraded,
    /// Evidence now points away from a leak (growth slowed, sizes are all new).
    Downgraded,
    /// Growth stopped long enough ago.
    Resolved,
}

impl Change {
    /// What a series' verdict did at a step boundary, if it is worth a line: it resolved or
    /// was downgraded just now (`resolved`, `downgraded`: newly true), or its confidence rose
    /// to `likely` or above (`before` -> `after`). The leak, site-growth and device-growth
    /// detectors all say it this way.
    pub fn between(
        before: Option<Confidence>,
        after: Option<Confidence>,
        resolved: bool,
        downgraded: bool,
    ) -> Option<Change> {
        if resolved {
            Some(Change::Resolved)
        } else if downgraded {
            Some(Change::Downgraded)
        } else if after > before && after >= Some(Confidence::Likely) {
            Some(if before >= Some(Confidence::Likely) {
                Change::Upgraded
            } else {
                Change::New
            })
        } else {
            None
        }
    }
}

/// A finding as it happens: what the live collector prints. Sites are raw; the printer
/// symbolizes them.
#[derive(Clone, Debug)]
pub struct Alert {
    pub finding: Finding,
    pub change: Change,
    pub epoch: u32,
    pub ts_ns: u64,
}

/// One finding, from the detector that raised it to the `--json` report (the field names and
/// their order are the contract: add, never rename). A detector fills what it knows; the
/// report completes `pid`, `stack`, `oom`, what depends on stacks in `hint`, `cause` and
/// `evidence`.
#[derive(Clone, Debug, Serialize)]
pub struct Finding {
    pub kind: Kind,
    pub level: Level,
    pub pid: u32,
    /// The process's rank in a distributed job, when a launcher gave it one (set by the
    /// report).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rank: Option<u32>,
    pub device: i16,
    pub bytes: u64,
    pub growth_bytes_per_step: Option<f64>,
    pub steps: Option<u64>,
    /// Innermost frame first: the code that called the allocation API (set by the report).
    pub stack: Vec<FrameInfo>,
    /// What was seen, one sentence, without the call site (the report shows its stack).
    pub message: String,
    /// Allocations involved (live ones for live_at_exit).
    pub count: u64,
    /// The allocation API seen at this site (`""` if none).
    #[serde(serialize_with = "api_name")]
    pub api: Option<Api>,
    /// The likely cause, in a PyTorch user's words; what the evidence cannot show is not
    /// claimed.
    pub hint: String,
    pub growth_bytes_per_s: Option<f64>,
    /// The numbers behind a detector's finding (leak, growth, fragmentation, threshold).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub evidence: Option<Evidence>,
    /// For OOM findings: the state at the failure (set by the report).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub oom: Option<oom::OomDetail>,
    /// The call site (0: none).
    #[serde(skip)]
    pub site: SiteId,
    /// What `hint` says, typed.
    #[serde(skip)]
    pub cause: Cause,
    /// For OOM findings: their record, the state at the failure (the report turns it into
    /// `oom`, with the top sites' stacks).
    #[serde(skip)]
    pub record: Option<Box<oom::OomRecord>>,
    /// The frame of `stack` a one-line summary names (set by the report): the innermost frame
    /// of the user's own code, past CUDA runtime, allocator and interpreter internals.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub culprit: Option<FrameInfo>,
    /// For a call site in PyTorch's backward pass (no Python frames, an autograd node among
    /// its native frames): that node and the forward lines that made it (set by the report).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backward_node: Option<BackwardNode>,
    /// How the text names the call site of `stack` (set by the report,
    /// `report::names::site_name`): the culprit's `file:line function`, a backward-pass
    /// allocation as `backward of addmm at train.py:25`; absent without a stack.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub site_name: String,
    /// Where a `live_at_exit` call site's memory sits when PyTorch's tensors are traced on its
    /// device (set by the report): absent elsewhere.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held: Option<Held>,
    /// An out-of-memory's: what its device's memory was at that moment (docs/anatomy.md),
    /// where PyTorch's tensors are traced.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub anatomy: Option<anatomy::AnatomyMoment>,
    /// For a leak whose tensors are kept by one object with those of other call sites (an
    /// output with its autograd graph): every call site of it by role, the keeper (this
    /// finding's site) first ([`together`]); absent otherwise.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<together::Part>,
    /// For an out-of-memory or a fragmentation finding: the levers that would make the job fit
    /// (or take the most off its peak), best first, one or two (set by the report from
    /// `fit`: docs/fit.md); absent otherwise.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub levers: Vec<refusal::Lever>,
}

/// What a call site's memory is on a device where PyTorch's trace tracker reports tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Held {
    /// Tensors (the tracker's allocations), inside PyTorch's segments.
    Tensors,
    /// Segments of PyTorch's caching allocator (its reserve; listed with `report --segments`).
    TorchReserve,
    /// CUDA memory outside PyTorch's allocator (an extension's own `cudaMalloc`, cuBLAS
    /// workspaces, NCCL buffers).
    OutsideTorch,
}

/// The autograd node a backward-pass allocation ran in, and where its forward op ran.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BackwardNode {
    /// The node's class, e.g. `AddmmBackward0`.
    pub name: String,
    /// The forward operator it differentiates, e.g. `addmm` (`at::_ops::addmm`).
    pub forward_op: String,
    /// The Python lines whose allocations ran that forward op in the same process, most
    /// allocations first: the likely creators of the node (a heuristic, see
    /// docs/sites.md), empty when none was seen.
    pub forward_lines: Vec<PythonLine>,
}

fn api_name<S: Serializer>(api: &Option<Api>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(api.map_or("", |a| a.name()))
}

impl Finding {
    /// A finding of `kind` with nothing else said yet.
    pub fn new(kind: Kind, level: impl Into<Level>, device: i16) -> Finding {
        Finding {
            kind,
            level: level.into(),
            pid: 0,
            rank: None,
            device,
            bytes: 0,
            growth_bytes_per_step: None,
            steps: None,
            stack: Vec::new(),
            message: String::new(),
            count: 0,
            api: None,
            hint: String::new(),
            growth_bytes_per_s: None,
            evidence: None,
            oom: None,
            site: SiteId(0),
            cause: Cause::Unknown,
            record: None,
            culprit: None,
            backward_node: None,
            site_name: String::new(),
            held: None,
            anatomy: None,
            parts: Vec::new(),
            levers: Vec::new(),
        }
    }

    /// The API's name, `""` when none (as in the JSON).
    pub fn api_name(&self) -> &'static str {
        self.api.map_or("", |a| a.name())
    }
}

/// Where a device's memory grew: the innermost user Python frame of the allocations, or, for
/// allocations without Python frames, the kind of thread (filled in by the report).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PythonLine {
    /// `""`/`0` for allocations without Python frames.
    pub file: String,
    pub line: u32,
    pub function: String,
    pub bytes: u64,
    pub count: u64,
    /// How the text names it: `train.py:42`, or e.g. `autograd thread (no Python frames)`.
    pub description: String,
}

/// The numbers behind a finding.
#[derive(Clone, Debug, Serialize)]
#[serde(untagged)]
pub enum Evidence {
    /// Boxed: a leak's evidence (its samples and history) is several times the others'.
    Leak(Box<evidence::LeakEvidence>),
    DeviceGrowth(Box<device_growth::DeviceGrowthEvidence>),
    Fragmentation(Box<fragmentation::FragEvidence>),
    Threshold(threshold::ThresholdEvidence),
}

/// One allocation, as the detectors see it.
#[derive(Clone, Copy, Debug)]
pub struct AllocObs {
    pub device: i16,
    pub site: SiteId,
    pub size: u64,
    pub api: Api,
    /// The epoch it was born in.
    pub epoch: u32,
    pub ts_ns: u64,
    /// Tracked live bytes on the device after it.
    pub device_live: u64,
    pub capacity: Option<u64>,
}

/// What every detector may read at an epoch boundary or when the report is built.
pub struct Context<'a> {
    /// The epoch that just ended (at a boundary) or the current one (for a report).
    pub epoch: u32,
    pub ts_ns: u64,
    pub clock: &'a EpochClock,
    pub devices: &'a BTreeMap<i16, DeviceState>,
    /// The process has ended (said goodbye, or its stream ended): what it freed after its
    /// last step was freed on its way out.
    pub ended: bool,
}

pub trait Detector {
    fn on_alloc(&mut self, _a: &AllocObs, _out: &mut Alerts) {}
    /// A free of an allocation born in epoch `birth`.
    fn on_free(&mut self, _a: &AllocObs, _birth: u32) {}
    fn on_epoch_end(&mut self, _ctx: &Context<'_>, _out: &mut Alerts) {}
    /// The findings this detector stands by now.
    fn findings(&self, ctx: &Context<'_>) -> Vec<Finding>;
}

/// How many alerts a process keeps (a flapping site must not grow memory).
const MAX_ALERTS: usize = 4096;

/// Alerts raised so far, in order; the live printer keeps a cursor into them.
#[derive(Debug, Default)]
pub struct Alerts {
    pub list: Vec<Alert>,
    pub dropped: u64,
}

impl Alerts {
    pub fn push(&mut self, a: Alert) {
        if self.list.len() < MAX_ALERTS {
            self.list.push(a);
        } else {
            self.dropped += 1;
        }
    }
}

/// A device's growth that the fragmentation finding on the same device explains.
const FRAGMENTED_DEVICE_HINT: &str = "PyTorch's cache grows while the tensors it holds do not \
    keep up: the growth is memory reserved and not used (see the fragmentation finding on this \
    device), not tensors held across steps.";

/// The analysis of one process: its epoch clock and every detector, fed by the model, and the
/// coordinator between detectors.
#[derive(Debug, Default)]
pub struct Analysis {
    /// Epoch boundaries (markers, an auto-detected iteration, or time windows).
    pub clock: EpochClock,
    pub growth: growth::GrowthDetector,
    pub site_growth: site_growth::SiteGrowthDetector,
    pub device_growth: device_growth::DeviceGrowthDetector,
    pub fragmentation: fragmentation::FragmentationDetector,
    pub threshold: threshold::ThresholdDetector,
    pub oom: oom::OomDetector,
    /// What the memory is: the tensors' roles at the peak, each OOM and each step's end.
    pub anatomy: anatomy::Anatomy,
    pub alerts: Alerts,
    /// Set if a detector ever failed (a bug): the clock and the detectors stop, the process's
    /// accounting and its trace go on.
    pub failed: bool,
    /// What of the process it analyses: all of it, or what follows a step marker.
    window: Window,
    /// Per device, the most it held at once since the window opened (none without a window).
    pub window_peaks: BTreeMap<i16, WindowPeak>,
}

/// What a device held at most since a window opened ([`Analysis::since_mark`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct WindowPeak {
    /// Device memory the process held (PyTorch's segments, other CUDA allocations).
    pub peak_bytes: u64,
    /// PyTorch's tensors (what `torch.cuda.max_memory_allocated()` would say, counted from
    /// the window's start).
    pub tensor_peak_bytes: u64,
    /// What the device held when the window opened, as `peak_bytes` counts it.
    pub bytes_at_start: u64,
    /// PyTorch's tensors live when the window opened.
    pub tensor_bytes_at_start: u64,
}

/// What of a process the analysis sees. The model always sees everything (what is live, the
/// device's totals); a window only decides what the detectors and the anatomy are told.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
enum Window {
    #[default]
    Whole,
    /// Nothing until a step marker with this label.
    Waiting(String),
    /// Since that marker.
    Open,
}

/// What a device holds: its CUDA allocations, or PyTorch's reserve where the CUDA calls are
/// not seen (the library loaded into a running Python program sees PyTorch's segments only).
fn device_bytes(d: &crate::model::DeviceState) -> u64 {
    d.live_bytes.max(d.torch_reserved_bytes.unwrap_or(0))
}

/// The epoch an allocation made before a window opened is born in: never told to a detector,
/// so its free is not told either.
const BEFORE_WINDOW: u32 = u32::MAX;

impl Analysis {
    /// Analyses only what follows the first step marker labelled `label` (the block a
    /// program's `oomtrace.trace()` marks, `report --since-mark`): the detectors and the
    /// anatomy see nothing before it, and nothing of allocations made before it.
    pub fn since_mark(&mut self, label: &str) {
        if self.window == Window::Whole {
            self.window = Window::Waiting(label.to_owned());
        }
    }

    /// Whether a window was asked for and its marker never came.
    pub fn window_never_opened(&self) -> bool {
        matches!(self.window, Window::Waiting(_))
    }

    /// Whether the detectors are told what happens now.
    fn sees(&self) -> bool {
        !matches!(self.window, Window::Waiting(_))
    }

    /// The detectors' view of `p` now (for a report).
    pub fn context<'a>(&'a self, p: &'a Process) -> Context<'a> {
        Context {
            epoch: self.clock.epoch,
            ts_ns: p.last_ts_ns,
            clock: &self.clock,
            devices: &p.devices,
            ended: p.end != EndState::Running,
        }
    }

    /// Every finding, OOMs first.
    pub fn findings(&self, p: &Process) -> Vec<Finding> {
        let ctx = self.context(p);
        let mut v = self.oom.findings(&ctx);
        v.extend(self.growth.findings(&ctx));
        // Leaks kept by one object are one finding, at the keeper's line.
        for (device, g) in self.kept_together(p) {
            together::merge(&mut v, device, &g);
        }
        // One finding per site: the leak detector's when it has one.
        v.extend(
            self.site_growth
                .findings(&ctx)
                .into_iter()
                .filter(|f| !self.growth.reported(f.site, f.device)),
        );
        v.extend(self.device_growth.findings(&ctx));
        v.extend(self.fragmentation.findings(&ctx));
        v.extend(self.threshold.findings(&ctx));
        // "At this rate the device is full in ..." once the device has run out of memory
        // (an allocation refused and not recovered by a retry) is a forecast of the past.
        for f in &mut v {
            let ran_out = self
                .oom
                .records
                .iter()
                .any(|r| r.device == f.device && r.recovered.is_none());
            if !ran_out {
                continue;
            }
            match f.evidence.as_mut() {
                Some(Evidence::Leak(e)) => (e.steps_to_oom, e.time_to_oom_s) = (None, None),
                Some(Evidence::DeviceGrowth(e)) => (e.steps_to_oom, e.time_to_oom_s) = (None, None),
                _ => {}
            }
        }
        for f in &mut v {
            self.attach_causes(f);
        }
        v
    }

    /// What one detector's finding means beside the others' (the detectors never read each
    /// other): memory that leaking sites held at an OOM, a device's growth that its
    /// fragmentation explains, and where the device's cache grew, for a leak of PyTorch's
    /// segments (the report turns those call sites into `python_lines` when the stacks say
    /// they are PyTorch's segments).
    fn attach_causes(&self, f: &mut Finding) {
        let leaked_at_oom = f.record.as_ref().map_or(0, |o| {
            o.top_sites
                .iter()
                .filter(|(site, _, _)| self.is_leak(*site, o.device))
                .fold(0u64, |acc, &(_, bytes, _)| acc.saturating_add(bytes))
        });
        if leaked_at_oom > 0 {
            f.cause = Cause::LeaksHeldAtOom;
            f.hint = format!(
                "{} of the memory live at the failure was held by call sites that leak \
                 step by step (see the leak findings): without them this allocation \
                 would have had that much more room.",
                fmt_bytes(leaked_at_oom)
            );
        }
        let leaks = self.growth.leaks_on(f.device).0;
        match f.evidence.as_mut() {
            // Tensors that leak on the device grow too: the reserve's growth is not only the
            // cache's unused part, and the words never say the tensors are freed.
            Some(Evidence::Fragmentation(e))
                if leaks > 0 && e.gap_slope_bytes_per_step.is_some() =>
            {
                f.hint = fragmentation::gap_hint(e, leaks);
            }
            Some(Evidence::DeviceGrowth(_))
                if self.fragmentation.gap_growing(f.device) && leaks == 0 =>
            {
                // The reserve grows away from the tensors: what grows is the cache's unused
                // part, not memory any line holds.
                f.cause = Cause::Fragmented;
                f.hint = FRAGMENTED_DEVICE_HINT.into();
            }
            Some(Evidence::Leak(e)) => {
                e.cache_grew_at = self.device_growth.grew_at(f.device).to_vec();
            }
            _ => {}
        }
    }

    /// The leaks kept by one object on each device now ([`together`]): the leak detector's
    /// sites read with what the anatomy says each made.
    fn kept_together(&self, p: &Process) -> Vec<(i16, together::Group)> {
        let leaks = self.growth.leaks_by_step();
        let mut out = Vec::new();
        let mut i = 0;
        while i < leaks.len() {
            let device = leaks[i].1;
            let n = leaks[i..].iter().take_while(|l| l.1 == device).count();
            if !(2..=together::MAX_MEMBERS).contains(&n) {
                i += n;
                continue;
            }
            let members: Vec<together::Member<'_>> = leaks[i..i + n]
                .iter()
                .map(|&(site, _, by_step)| together::Member {
                    site,
                    by_step,
                    made: self.anatomy.site_made(site),
                    path: together::python_path(p, site),
                })
                .collect();
            out.extend(together::groups(&members).into_iter().map(|g| (device, g)));
            i += n;
        }
        out
    }

    /// Whether a call site is reported as a leak now, by either per-site detector.
    pub fn is_leak(&self, site: SiteId, device: i16) -> bool {
        self.growth.is_leak(site, device) || self.site_growth.is_leak(site, device)
    }

    /// What to tell the user once `failed` is set.
    pub fn failure_warning(pid: u32) -> String {
        format!(
            "oomtrace: internal error in the detectors for process {pid}; going on without \
             leak detection for it (please report this)"
        )
    }

    /// Runs the detectors' per-epoch work for the epoch the clock just closed.
    fn end_epoch(&mut self, p: &Process, ts: u64) {
        let ctx = Context {
            epoch: self.clock.epoch.saturating_sub(1),
            ts_ns: ts,
            clock: &self.clock,
            devices: &p.devices,
            ended: p.end != EndState::Running,
        };
        let first = self.alerts.list.len();
        self.growth.on_epoch_end(&ctx, &mut self.alerts);
        // Leaks kept by one object: one line, at the keeper's.
        let kept = self.kept_together(p);
        merge_alerts(&mut self.alerts, first, &kept, &self.growth, &ctx);
        // After the leaks: a site they report is theirs, and their generations say whether a
        // site's allocations survive.
        self.site_growth
            .on_epoch_end_after_leaks(&ctx, &self.growth, &mut self.alerts);
        // After the leaks: device growth reads their generations and findings, the leaks kept
        // by one object counted once.
        let leaks = KeptOnce {
            leaks: &self.growth,
            kept: &kept,
        };
        self.device_growth
            .on_epoch_end_after_leaks(&ctx, &leaks, &mut self.alerts);
        self.fragmentation.on_epoch_end(&ctx, &mut self.alerts);
        self.threshold.on_epoch_end(&ctx, &mut self.alerts);
    }
}

/// The leak detector as the device-growth detector reads it, with the leaks that one object
/// keeps counted as the one finding they are (a device growth is then "explained by 1 leak
/// finding", as the report has one).
struct KeptOnce<'a> {
    leaks: &'a growth::GrowthDetector,
    kept: &'a [(i16, together::Group)],
}

impl Leaks for KeptOnce<'_> {
    fn born_between(&self, device: i16, from: u32, upto: u32) -> Vec<leaks::GrewAt> {
        self.leaks.born_between(device, from, upto)
    }

    fn leaks_on(&self, device: i16) -> (u32, f64) {
        let (n, slope) = self.leaks.leaks_on(device);
        let parts: usize = self
            .kept
            .iter()
            .filter(|(d, _)| *d == device)
            .map(|(_, g)| g.members.len().saturating_sub(1))
            .sum();
        (
            n.saturating_sub(u32::try_from(parts).unwrap_or(u32::MAX)),
            slope,
        )
    }

    fn reported(&self, site: SiteId, device: i16) -> bool {
        self.leaks.reported(site, device)
    }

    fn generations(&self, site: SiteId, device: i16, from: u32, upto: u32) -> u32 {
        self.leaks.generations(site, device, from, upto)
    }
}

/// The leak alerts raised since `first` whose sites one object keeps together: the keeper's
/// becomes the group's (its parts listed, the sums), the others' are not said (the keeper's
/// line says them).
fn merge_alerts(
    alerts: &mut Alerts,
    first: usize,
    kept: &[(i16, together::Group)],
    leaks: &growth::GrowthDetector,
    ctx: &Context<'_>,
) {
    if kept.is_empty() || alerts.list.len() <= first {
        return;
    }
    let raised = |a: &Alert| {
        a.finding.kind == Kind::Leak && matches!(a.change, Change::New | Change::Upgraded)
    };
    for (device, g) in kept {
        let of_group = |a: &Alert| {
            raised(a)
                && a.finding.device == *device
                && g.members.iter().any(|m| m.0 == a.finding.site)
        };
        if let Some(k) = (first..alerts.list.len())
            .find(|&i| of_group(&alerts.list[i]) && alerts.list[i].finding.site == g.keeper)
        {
            let mut v: Vec<Finding> = g
                .members
                .iter()
                .filter_map(|m| leaks.finding_of(m.0, *device, ctx))
                .collect();
            if together::merge(&mut v, *device, g) {
                if let Some(f) = v.into_iter().find(|f| f.site == g.keeper) {
                    alerts.list[k].finding = f;
                }
            }
        }
        let mut i = first;
        while i < alerts.list.len() {
            let a = &alerts.list[i];
            if of_group(a) && g.is_part(a.finding.site) {
                alerts.list.remove(i);
            } else {
                i += 1;
            }
        }
    }
}

impl Analysis {
    /// A live allocation gone (freed, or become PyTorch's reserve), as the detectors see it.
    fn gone(&self, f: &Free) -> AllocObs {
        AllocObs {
            device: f.device,
            site: f.site,
            size: f.size,
            api: f.api,
            epoch: self.clock.epoch,
            ts_ns: f.ts_ns,
            device_live: f.device_live,
            capacity: f.capacity,
        }
    }
}

impl Observer for Analysis {
    fn alloc(&mut self, p: &Process, a: &Alloc) -> u32 {
        if !self.sees() {
            return BEFORE_WINDOW;
        }
        if self.window == Window::Open {
            // Told before the model counts it.
            let d = p.devices.get(&a.device);
            let (device, tensors) = if a.api.memory_class() == MemoryClass::Tensor {
                let tensors = d.map_or(0, |d| d.tensor_bytes).saturating_add(a.size);
                (d.map_or(0, device_bytes), tensors)
            } else if a.api.memory_class().on_device() {
                (a.device_live_before.saturating_add(a.size), 0)
            } else {
                (0, 0)
            };
            let w = self.window_peaks.entry(a.device).or_default();
            w.peak_bytes = w.peak_bytes.max(device);
            w.tensor_peak_bytes = w.tensor_peak_bytes.max(tensors);
        }
        if self.failed {
            return self.clock.epoch;
        }
        if self
            .clock
            .on_alloc(a.site, a.tid, a.ts_ns, a.device_live_before)
        {
            self.end_epoch(p, a.ts_ns);
            // Without step markers the epochs found are the anatomy's steps too.
            if p.markers == 0 {
                self.anatomy.on_step(a.ts_ns);
            }
        }
        let obs = AllocObs {
            device: a.device,
            site: a.site,
            size: a.size,
            api: a.api,
            epoch: self.clock.epoch,
            ts_ns: a.ts_ns,
            // A tracker tensor sits inside a segment already counted.
            device_live: if a.api.memory_class() == MemoryClass::Tensor {
                a.device_live_before
            } else {
                a.device_live_before.saturating_add(a.size)
            },
            capacity: a.capacity,
        };
        self.growth.on_alloc(&obs, &mut self.alerts);
        self.site_growth.on_alloc(&obs, &mut self.alerts);
        self.device_growth.on_alloc(&obs, &mut self.alerts);
        self.fragmentation.on_alloc(&obs, &mut self.alerts);
        self.threshold.on_alloc(&obs, &mut self.alerts);
        self.anatomy.on_alloc(p, a);
        if let Some(r) = self.oom.take_retry(&obs) {
            self.fragmentation
                .on_retry(&r, obs.epoch, obs.ts_ns, &mut self.alerts);
        }
        self.clock.epoch
    }

    fn free(&mut self, p: &Process, f: &Free) {
        if self.failed || !self.sees() || f.birth == BEFORE_WINDOW {
            return;
        }
        self.anatomy.on_free(p, f);
        let obs = self.gone(f);
        if !f.reserve {
            // A segment of PyTorch's allocator left the leak detectors when it became reserve.
            self.growth.on_free(&obs, f.birth);
            self.site_growth.on_free(&obs, f.birth);
        }
        self.device_growth.on_free(&obs, f.birth);
        self.fragmentation.on_free(&obs, f.birth);
        self.threshold.on_free(&obs, f.birth);
        self.oom.on_free(&obs, f.birth);
    }

    /// The caching allocator's segment is reserve: the leak detectors forget it as if freed
    /// (a line's memory is its tensors, traced one by one); device totals, fragmentation and
    /// the OOM view keep it.
    fn reserve(&mut self, p: &Process, f: &Free) {
        if self.failed || !self.sees() || f.birth == BEFORE_WINDOW {
            return;
        }
        let obs = self.gone(f);
        self.growth.on_free(&obs, f.birth);
        self.site_growth.on_free(&obs, f.birth);
        // Told before the segment counts in the reserve: what the cache held unallocated
        // when it needed another segment.
        let unallocated = p.devices.get(&f.device).map_or(0, |d| {
            d.torch_reserved_bytes
                .unwrap_or(0)
                .saturating_sub(d.tensor_bytes)
        });
        self.fragmentation
            .on_segment(f.device, f.site, f.size, unallocated);
    }

    fn step(&mut self, p: &Process, ts_ns: u64) {
        if let Window::Waiting(label) = &self.window {
            if p.last_marker.as_deref() == Some(label.as_str()) {
                self.window = Window::Open;
                // What each device holds as the window opens is its first peak.
                for (&device, d) in &p.devices {
                    self.window_peaks.insert(
                        device,
                        WindowPeak {
                            peak_bytes: device_bytes(d),
                            tensor_peak_bytes: d.tensor_bytes,
                            bytes_at_start: device_bytes(d),
                            tensor_bytes_at_start: d.tensor_bytes,
                        },
                    );
                }
            }
            return;
        }
        if self.failed {
            return;
        }
        self.clock.on_marker(ts_ns);
        self.end_epoch(p, ts_ns);
        self.anatomy.on_step(ts_ns);
    }

    fn out_of_memory(&mut self, p: &Process, o: &OutOfMemory) {
        if !self.sees() {
            return;
        }
        if !self.failed {
            self.anatomy.on_out_of_memory(p, o);
        }
        let record = oom::OomRecord {
            seq: o.seq,
            ts_ns: o.ts_ns,
            epoch: self.clock.epoch,
            api: o.api,
            result: o.result,
            device: o.device,
            size: o.size,
            site: o.site,
            tid: o.tid,
            free_bytes: None,
            total_bytes: None,
            live_bytes: o.live_bytes,
            allowed_bytes: o.allowed_bytes,
            capacity_bytes: p.devices.get(&o.device).and_then(|d| d.capacity),
            torch_reserved_bytes: p
                .devices
                .get(&o.device)
                .filter(|d| d.tensor_tally.allocations > 0)
                .and_then(|d| d.torch_reserved_bytes),
            tensor_bytes: p
                .devices
                .get(&o.device)
                .filter(|d| d.tensor_tally.allocations > 0)
                .map(|d| d.tensor_bytes),
            top_sites: if self.oom.keeps_next() {
                p.top_holders(o.device, oom::TOP_SITES)
            } else {
                Vec::new()
            },
            recovered: None,
        };
        self.oom.on_failure(record, &mut self.alerts);
    }

    fn mem_info(&mut self, _p: &Process, m: &MemInfo) {
        if !self.sees() {
            return;
        }
        // The reading the shim takes right after a failure belongs to it.
        if let Some(r) = self.oom.on_meminfo(m.device, m.tid, m.free, m.total) {
            self.fragmentation.on_failure_info(r, &mut self.alerts);
        }
    }

    /// PyTorch's own allocated and reserved, read after a step marker: fragmentation judges
    /// its reserve against its tensors with them when tensors are not traced.
    fn torch_memory(&mut self, _p: &Process, m: &TorchMemory) {
        if self.failed || !self.sees() {
            return;
        }
        self.fragmentation.torch_memory(m);
    }

    /// Applies the frame; a panic inside (a detector bug) switches the analysis off for this
    /// process instead of losing it: its accounting and its trace go on.
    fn apply_frame(&mut self, p: &mut Process, frame: &Frame<'_>) {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| p.apply(frame, self)));
        if r.is_err() {
            self.failed = true;
        }
    }
}

#[cfg(test)]
mod tests;
