//! The findings' vocabulary: what a finding is (`Finding`, its `Kind`, `Level`, `Cause`,
//! `Evidence`) and how its level moves (`Change`, `Alert`). These types are the `--json`
//! contract's; the detectors make them and the report completes them. Names nothing of the
//! analysis but the evidence types each detector defines.

use serde::{Serialize, Serializer};

use super::{anatomy, device_growth, evidence, fragmentation, oom, refusal, threshold, together};
use crate::model::{FrameInfo, SiteId};
use oomtrace_proto::Api;

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
    pub record: Option<Box<refusal::OomRecord>>,
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
