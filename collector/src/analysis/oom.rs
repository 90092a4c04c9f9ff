//! OOM forensics: every allocation the driver refused, with the state at that instant
//! (requested size, what the driver said was free, the largest holders), and whether the
//! program recovered by freeing and retrying (what PyTorch's caching allocator does before
//! it raises "CUDA out of memory").

use super::refusal::Remedy;
use super::refusal::{OomRecord, Retry};
use super::{Alert, Alerts, AllocObs, Cause, Change, Context, Detector, Finding, Kind, Severity};
use crate::model::FrameInfo;
use crate::units::fmt_bytes;
use oomtrace_proto::Api;

/// How many sites an OOM record lists.
pub const TOP_SITES: usize = 10;
/// How many OOM records a process keeps in full (a retry storm must not grow memory).
const MAX_RECORDS: usize = 64;
/// A successful allocation of the same size this soon after a failure is its retry.
const RETRY_WINDOW_NS: u64 = 10_000_000_000;

#[derive(Clone, Copy, Debug)]
struct Pending {
    record: Option<usize>,
    device: i16,
    size: u64,
    ts_ns: u64,
    frees: u64,
    freed_bytes: u64,
}

#[derive(Debug, Default)]
pub struct OomDetector {
    pub records: Vec<OomRecord>,
    /// All out-of-memory failures, kept in full or not.
    pub count: u64,
    /// Those that could be said live (not a refusal inside PyTorch's allocator).
    said: u64,
    pending: Option<Pending>,
}

impl OomDetector {
    /// Whether the next failure is kept in full (its top call sites are worth reading: only
    /// the first `MAX_RECORDS` are, so a storm of failures does not scan the sites each).
    pub fn keeps_next(&self) -> bool {
        self.records.len() < MAX_RECORDS
    }

    pub fn on_failure(&mut self, r: OomRecord, out: &mut Alerts) {
        self.count += 1;
        // Inside PyTorch's caching allocator (its tensors are traced), a refused cudaMalloc is
        // not yet an out-of-memory: PyTorch frees its cache and retries, and only a tensor it
        // cannot place is one (its own record follows). Said live then, not now.
        let inside_torch =
            r.tensor_bytes.is_some() && r.api.memory_class() != oomtrace_proto::MemoryClass::Tensor;
        let record = (self.records.len() < MAX_RECORDS).then_some(self.records.len());
        self.pending = Some(Pending {
            record,
            device: r.device,
            size: r.size,
            ts_ns: r.ts_ns,
            frees: 0,
            freed_bytes: 0,
        });
        // The first failure, and then every 10th: a retry storm must not flood stderr.
        if !inside_torch {
            self.said += 1;
        }
        if !inside_torch && (self.said == 1 || self.said.is_multiple_of(10)) {
            out.push(Alert {
                finding: finding_of(&r, self.count),
                change: Change::New,
                epoch: r.epoch,
                ts_ns: r.ts_ns,
            });
        }
        if record.is_some() {
            self.records.push(r);
        }
    }

    /// The driver's free/total reading taken right after a failure on thread `tid`.
    pub fn on_meminfo(
        &mut self,
        device: i16,
        tid: u32,
        free: u64,
        total: u64,
    ) -> Option<&OomRecord> {
        let r = self
            .records
            .iter_mut()
            .rev()
            .find(|o| o.device == device && o.tid == tid && o.free_bytes.is_none())?;
        r.free_bytes = Some(free);
        r.total_bytes = Some(total);
        Some(r)
    }

    /// A successful allocation: the retry of the pending failure, if it matches.
    pub fn take_retry(&mut self, a: &AllocObs) -> Option<Retry> {
        let p = self.pending?;
        if a.ts_ns.saturating_sub(p.ts_ns) > RETRY_WINDOW_NS {
            self.pending = None;
            return None;
        }
        if a.device != p.device || a.size != p.size || p.frees == 0 {
            return None;
        }
        self.pending = None;
        let retry = Retry {
            device: p.device,
            size: p.size,
            frees: p.frees,
            freed_bytes: p.freed_bytes,
            after_ns: a.ts_ns.saturating_sub(p.ts_ns),
        };
        if let Some(i) = p.record {
            self.records[i].recovered = Some(retry);
        }
        Some(retry)
    }
}

impl Detector for OomDetector {
    fn on_free(&mut self, a: &AllocObs, _birth: u32) {
        if let Some(p) = self.pending.as_mut().filter(|p| p.device == a.device) {
            p.frees += 1;
            p.freed_bytes = p.freed_bytes.saturating_add(a.size);
        }
    }

    fn findings(&self, _ctx: &Context<'_>) -> Vec<Finding> {
        let merged = merged_into_tensor(&self.records);
        self.records
            .iter()
            .enumerate()
            .filter(|(i, _)| !merged[*i])
            .map(|(i, r)| {
                let mut f = finding_of(r, i as u64 + 1);
                f.record = Some(Box::new(r.clone()));
                f
            })
            .collect()
    }
}

/// Which records are one out-of-memory with the tensor record after them: the cudaMalloc
/// refusals PyTorch's allocator met (before and after emptying its cache) while placing a
/// tensor it then could not place, on the same device and thread, unrecovered, just before
/// it. One OOM is one finding: the tensor's, which names the line that asked.
fn merged_into_tensor(records: &[OomRecord]) -> Vec<bool> {
    let mut merged = vec![false; records.len()];
    for (i, t) in records.iter().enumerate() {
        if t.api.memory_class() != oomtrace_proto::MemoryClass::Tensor || t.recovered.is_some() {
            continue;
        }
        for j in (0..i).rev() {
            let d = &records[j];
            let same = d.device == t.device
                && d.tid == t.tid
                && d.recovered.is_none()
                && d.api.memory_class() != oomtrace_proto::MemoryClass::Tensor
                && t.ts_ns.saturating_sub(d.ts_ns) <= RETRY_WINDOW_NS;
            if !same {
                break;
            }
            merged[j] = true;
        }
    }
    merged
}

fn result_name(rc: i32) -> &'static str {
    match rc {
        2 => "out of memory",
        1 => "invalid value",
        3 => "not initialized",
        201 => "invalid context",
        _ => "error",
    }
}

fn finding_of(r: &OomRecord, nth: u64) -> Finding {
    let free = match (r.free_bytes, r.total_bytes) {
        (Some(f), Some(0)) => format!(" with {} free", fmt_bytes(f)),
        (Some(f), Some(t)) => format!(" with {} free of {}", fmt_bytes(f), fmt_bytes(t)),
        _ => String::new(),
    };
    let (level, outcome, (cause, hint)) = match r.recovered {
        Some(rt) => (
            Severity::Warning,
            format!(
                "; it succeeded after {} free{} ({}) and a retry",
                rt.frees,
                if rt.frees == 1 { "" } else { "s" },
                fmt_bytes(rt.freed_bytes)
            ),
            (
                Cause::RetriedAfterFree,
                "The program freed memory and retried, as PyTorch's caching allocator does \
                 when its cache holds the memory a new block needs; each retry synchronizes the \
                 device. See the fragmentation finding."
                    .to_string(),
            ),
        ),
        None => (Severity::Error, String::new(), oom_hint(r)),
    };
    Finding {
        kind: Kind::Oom,
        level: level.into(),
        pid: 0,
        rank: None,
        device: r.device,
        site: r.site,
        stack: Vec::new(),
        oom: None,
        cause,
        bytes: r.size,
        growth_bytes_per_step: None,
        growth_bytes_per_s: None,
        steps: None,
        count: nth,
        api: Some(r.api),
        message: format!(
            "{} of {} failed ({}) on device {}{}; {} tracked live{}",
            what_failed(r.api),
            fmt_bytes(r.size),
            match r.cap() {
                Some(cap) => format!(
                    "out of memory under PyTorch's memory cap of {}, \
                     set_per_process_memory_fraction({})",
                    fmt_bytes(cap),
                    r.cap_fraction().unwrap_or(0.0)
                ),
                None => result_name(r.result).to_string(),
            },
            r.device,
            free,
            fmt_bytes(r.live_bytes),
            outcome
        ),
        hint,
        evidence: None,
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

/// What was refused, in a user's words: a tensor (PyTorch's allocator; never oomtrace's own
/// entry point's name), or the CUDA call.
fn what_failed(api: Api) -> &'static str {
    match api {
        Api::oomtrace_torch_alloc => "a tensor",
        Api::oomtrace_malloc => "a tensor (through oomtrace's allocator)",
        other => other.name(),
    }
}

impl OomRecord {
    /// The memory cap the program set (`torch.cuda.set_per_process_memory_fraction`), in bytes:
    /// what PyTorch's out-of-memory observer said its allocator was allowed to reserve, when
    /// that is less than the device's total (the observer says the total when no cap is set).
    pub fn cap(&self) -> Option<u64> {
        let allowed = self.allowed_bytes?;
        (allowed < self.total_bytes.or(self.capacity_bytes)?).then_some(allowed)
    }

    /// The cap as the fraction the program passed (PyTorch keeps `fraction * total`, rounded
    /// down), to two decimals.
    pub fn cap_fraction(&self) -> Option<f64> {
        let cap = self.cap()?;
        let f = cap as f64 / self.total_bytes.or(self.capacity_bytes)? as f64;
        Some((f * 100.0).round() / 100.0)
    }

    /// PyTorch's "reserved but unallocated" at the failure, when it was at least the request:
    /// the memory was there, in pieces.
    pub fn in_pieces(&self) -> Option<u64> {
        // Only PyTorch's own out-of-memory: a cudaMalloc it failed is followed by it giving
        // back its free segments and retrying, so the reserve then still held whole ones.
        if self.api != Api::oomtrace_torch_alloc {
            return None;
        }
        let unallocated = self
            .torch_reserved_bytes?
            .saturating_sub(self.tensor_bytes?);
        (unallocated >= self.size && self.size > 0).then_some(unallocated)
    }
}

fn oom_hint(r: &OomRecord) -> (Cause, String) {
    let under_cap = r
        .cap()
        .map(|cap| {
            format!(
                ", under the memory cap of {} the program set",
                fmt_bytes(cap)
            )
        })
        .unwrap_or_default();
    if let Some(unallocated) = r.in_pieces() {
        return (
            Cause::ReservedInPieces,
            format!(
                "The memory was there but in pieces: PyTorch's cache held {} reserved but \
                 unallocated ({} reserved, {} in tensors{under_cap}), more than the {} \
                 requested, in no block that large (fragmentation; see the remedies below). \
                 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True lets a segment grow instead.",
                fmt_bytes(unallocated),
                fmt_bytes(r.torch_reserved_bytes.unwrap_or(0)),
                fmt_bytes(r.tensor_bytes.unwrap_or(0)),
                fmt_bytes(r.size)
            ),
        );
    }
    if let Some(cap) = r.cap() {
        let held = match (r.torch_reserved_bytes, r.tensor_bytes) {
            (Some(reserved), Some(tensors)) => format!(
                " It held {} reserved, {} of it in tensors, and needed {} more.",
                fmt_bytes(reserved),
                fmt_bytes(tensors),
                fmt_bytes(r.size)
            ),
            _ => String::new(),
        };
        let free = match r.free_bytes {
            Some(free) if free >= r.size => format!(
                " The device itself had {} free: the cap refused it, not the GPU.",
                fmt_bytes(free)
            ),
            _ => String::new(),
        };
        return (
            Cause::MemoryCap,
            format!(
                "PyTorch refused it itself: the program capped its allocator at {} on this \
                 device (torch.cuda.set_per_process_memory_fraction({})).{held}{free} Raise the \
                 fraction, or make the job need less (see what held the memory below).",
                fmt_bytes(cap),
                r.cap_fraction().unwrap_or(0.0)
            ),
        );
    }
    match (r.free_bytes, r.top_sites.first()) {
        (Some(free), _) if free >= r.size => (
            Cause::FreeButFragmented,
            format!(
                "The driver reported {} free, enough for the request, yet it failed: the free \
                 memory is not in one piece (fragmentation). With PyTorch, \
                 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True avoids most of it.",
                fmt_bytes(free)
            ),
        ),
        (Some(free), _) if r.size > free.saturating_add(r.live_bytes) => (
            Cause::RequestExceedsDevice,
            format!(
                "The request alone ({}) is more than the device had free ({}) and this process \
                 held ({}) together: freeing everything would not make it fit. A tensor far \
                 larger than meant (a shape, a batch or a sequence length), or memory held \
                 outside what was traced (another process, a library's own allocations).",
                fmt_bytes(r.size),
                fmt_bytes(free),
                fmt_bytes(r.live_bytes)
            ),
        ),
        (_, Some(&(_, bytes, _)))
            if r.live_bytes > 0 && bytes.saturating_mul(2) >= r.live_bytes =>
        {
            (
                Cause::OneSiteHeldMost,
                format!(
                    "One call site held {} of the {} this process had live: look at it first (a \
                     leak finding below says whether it grew step by step).",
                    fmt_bytes(bytes),
                    fmt_bytes(r.live_bytes)
                ),
            )
        }
        _ => (
            Cause::WorkloadTooLarge,
            "The memory was spread over many call sites: the workload needs more than the \
             device has (batch size, sequence length, model size), or another process holds \
             part of the device."
                .to_string(),
        ),
    }
}

/// An OOM finding's state at the failure, in the report (its stacks symbolized).
#[derive(Clone, Debug, serde::Serialize)]
pub struct OomDetail {
    pub requested_bytes: u64,
    pub result: i32,
    pub free_bytes: Option<u64>,
    pub total_bytes: Option<u64>,
    /// Tracked live bytes on the device when the allocation failed.
    pub live_bytes: u64,
    /// Seconds from the process's first event.
    pub time_s: f64,
    /// When it failed, on the wall clock (Unix time, s): comparable across processes and
    /// hosts. Absent in traces whose shim did not record its monotonic start.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unix_s: Option<f64>,
    /// The largest holders at that instant.
    pub top_sites: Vec<SiteShare>,
    /// PyTorch's reserve and its tensors at the failure (tensors traced only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reserved_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allocated_bytes: Option<u64>,
    /// The memory cap the program set (`torch.cuda.set_per_process_memory_fraction`) that
    /// refused the request, in bytes, and as the fraction passed (absent: no cap seen).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_cap_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_fraction: Option<f64>,
    /// Reserved but unallocated, when at least the request: the memory was there, in pieces.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reserved_unallocated_bytes: Option<u64>,
    /// Settings that would (or would not) have fit the request, from a replay of the trace
    /// (filled in by the report when the memory was in pieces).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub remedies: Vec<Remedy>,
}

/// One holder at an OOM.
#[derive(Clone, Debug, serde::Serialize)]
pub struct SiteShare {
    pub bytes: u64,
    pub count: u64,
    pub stack: Vec<FrameInfo>,
    /// How the text names the holder (`report::names::site_name`): its Python line, a
    /// backward-pass allocation as `backward of addmm at train.py:25`.
    pub name: String,
}
