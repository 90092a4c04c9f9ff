//! The view's data: a trace aggregated into what one HTML page can hold, whatever the trace's
//! length.
//!
//! Two passes over the file: the analysis (the same replay and report as `oomtrace report`)
//! gives the findings and each process's time span; a replay through the exporters' read API
//! ([`crate::export::view`]) gives memory over time by call site. Each event's change in a
//! device's live bytes, and in its PyTorch tensors' bytes, is put on one call site (the
//! allocation's site for a free, found in the state before the event), so the stacked layers
//! of each accounting ([`Memory`]) add up to its total.
//!
//! What is drawn: without tensors, device memory by call site. With PyTorch's tensors (its
//! trace tracker, `--torch`), the tensors by call site, PyTorch's reserve (its segments' bytes,
//! [`Level::reserve`]) as a line, and device memory outside its allocator by call site: the
//! sites whose allocations the allocator never called its segments. The time axis starts at
//! the first allocation. Labels follow [`super::label`].
//!
//! Bounds (so a 10^7-event trace stays a few MB): [`BUCKETS`] time buckets per device, each
//! giving at most three points (its maximum of the stacked bytes and of the device total,
//! where the snapshots of sites are taken, and its last value) with [`POINT_SITES`] sites
//! each; [`TOP_SITES`] layers in the chart; [`TABLE_SITES`] rows in the site table with
//! [`STACK_FRAMES`] frames each; flame graphs hold sites of at least [`FLAME_MIN_SHARE`] of
//! their total and children of at least that share of the root, [`FLAME_DEPTH`] frames deep;
//! [`MAX_MARKERS`] step markers per process (evenly thinned), and as many of PyTorch's own
//! readings per device (`torch_memory`: `[t, allocated, max allocated, reserved]`, read by the
//! step hook after each marker, in every mode). Work per event is O(1)
//! amortized: snapshots (of the bucket maxima, the peak, the last step) copy only the sites
//! changed since their previous copy.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::rc::Rc;

use oomtrace_collector::model::trace::Trace as AnalysisTrace;
use oomtrace_collector::report::Analysis;
use oomtrace_collector::report::{self, ReportOptions};
use oomtrace_proto::{EventKind, MemoryClass};
use serde_json::{json, Value};

use super::label::{distinct, elided, frame_label, site_details, site_label};
use crate::export::view::{
    self, in_backward, BackwardName, Frame, ProcessView, Seen, Site, Symbolizer, OUT_OF_MEMORY,
};
use crate::export::{device_label, frame_file, frame_name, short_name};
use crate::progress::Progress;
use crate::Failure;

/// Time buckets per device; each gives at most three points.
pub const BUCKETS: usize = 1000;
/// Sites kept per point (the rest are summed as "other").
pub const POINT_SITES: usize = 32;
/// Layers of the memory chart per device (the rest are "other").
pub const TOP_SITES: usize = 10;
/// Rows of the site table per device.
pub const TABLE_SITES: usize = 200;
/// Frames kept per stack (Python frames beyond them are kept too, up to as many again).
pub const STACK_FRAMES: usize = 48;
/// Frames kept per path of the native flame graph (the outermost).
pub const FLAME_DEPTH: usize = 128;
/// Flame graph nodes smaller than this share of the root are merged.
pub const FLAME_MIN_SHARE: f64 = 0.002;
/// Step markers kept per process.
pub const MAX_MARKERS: usize = 2000;
/// Steps whose holdings the icicle can be scrubbed to, per device: evenly spaced over the run
/// (the stride between them doubles whenever twice as many were kept).
pub const STEP_MOMENTS: usize = 12;

/// A moment the page opens its icicle on (`view --at`): after step N's marker, or the first
/// event at or after a time into the process's run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum At {
    Step(u64),
    Seconds(f64),
}

impl At {
    /// `12` (step 12, counted from 1) or `3.5s` (seconds into the run).
    pub fn parse(text: &str) -> Result<At, String> {
        let t = text.trim();
        let bad = || {
            format!(
                "bad moment {text:?} (expected a step, e.g. 12, or a time into the run, e.g. 3.5s)"
            )
        };
        if let Some(secs) = t.strip_suffix('s') {
            let v: f64 = secs.trim().parse().map_err(|_| bad())?;
            return (v.is_finite() && v >= 0.0)
                .then_some(At::Seconds(v))
                .ok_or_else(bad);
        }
        match t.parse::<u64>() {
            Ok(n) if n >= 1 => Ok(At::Step(n)),
            _ => Err(bad()),
        }
    }

    fn label(self) -> String {
        match self {
            At::Step(n) => format!("after step {n}"),
            At::Seconds(t) => format!("at {t:.2} s"),
        }
    }
}

/// Which of a device's two accountings bytes are in (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Memory {
    /// Device memory the process holds: every `cudaMalloc`, `cuMemCreate`, ..., PyTorch's
    /// segments among them.
    Device,
    /// PyTorch's tensors (its trace tracker's), which live inside its segments.
    Tensor,
}

/// A call site's bytes in one accounting.
pub type Key = (Memory, Site);

/// A device's levels at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Level {
    /// Device memory the process holds (PyTorch's segments included).
    pub total: u64,
    /// PyTorch's live tensors (inside its segments).
    pub tensors: u64,
    /// PyTorch's reserve: its segments, 0 before the first.
    pub reserve: u64,
}

impl Level {
    /// What the chart stacks: the tensors and the device memory outside PyTorch's reserve;
    /// without tensors, all device memory.
    pub fn stacked(self) -> u64 {
        self.tensors
            .saturating_add(self.total.saturating_sub(self.reserve))
    }
}

/// A copy of the per-site live bytes as they stood at one moment, brought up to date by
/// copying only the sites changed since (`dirty`).
#[derive(Default)]
struct Snapshot {
    bytes: HashMap<Key, u64>,
    dirty: HashSet<Key>,
}

impl Snapshot {
    fn capture(&mut self, now: &HashMap<Key, u64>) {
        for s in self.dirty.drain() {
            match now.get(&s) {
                Some(&b) if b > 0 => {
                    self.bytes.insert(s, b);
                }
                _ => {
                    self.bytes.remove(&s);
                }
            }
        }
    }
}

/// One point of a device's series: its time, levels and the largest sites' share of them.
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    pub t_ns: u64,
    pub level: Level,
    pub sites: Vec<(Key, u64)>,
}

/// The largest value of one measure in a bucket, when it was reached, and the sites then.
#[derive(Default)]
struct Extreme {
    value: u64,
    t: u64,
    level: Level,
    snap: Snapshot,
}

impl Extreme {
    fn offer(&mut self, value: u64, first: bool, t: u64, level: Level, now: &HashMap<Key, u64>) {
        if first || value > self.value {
            self.value = value;
            self.t = t;
            self.level = level;
            self.snap.capture(now);
        }
    }
}

/// Max-preserving downsampling of a stream of (time, levels) into at most three points per
/// time bucket: the moment of the bucket's largest stacked bytes and of its largest device
/// total (the same moment without tensors), each with the site snapshot of that moment, and
/// its last value.
pub struct Downsampler {
    t0: u64,
    span: u64,
    buckets: usize,
    bucket: Option<usize>,
    stacked: Extreme,
    total: Extreme,
    last: Level,
    last_t: u64,
    pub points: Vec<Point>,
}

impl Downsampler {
    /// Times from `t0` to `t1` (inclusive) into `buckets` buckets.
    pub fn new(t0: u64, t1: u64, buckets: usize) -> Downsampler {
        Downsampler {
            t0,
            span: t1.saturating_sub(t0),
            buckets: buckets.max(1),
            bucket: None,
            stacked: Extreme::default(),
            total: Extreme::default(),
            last: Level::default(),
            last_t: 0,
            points: Vec::new(),
        }
    }

    fn index(&self, t: u64) -> usize {
        let off = t.saturating_sub(self.t0) as u128;
        let i = off * self.buckets as u128 / (self.span as u128 + 1);
        (i as usize).min(self.buckets - 1)
    }

    /// Key `k` changed (before [`Downsampler::push`] of the new levels).
    fn touch(&mut self, k: Key) {
        self.stacked.snap.dirty.insert(k);
        self.total.snap.dirty.insert(k);
    }

    /// The levels after an event at `t`, with the per-site bytes at that moment.
    pub fn push(&mut self, t: u64, level: Level, sites: &HashMap<Key, u64>) {
        let i = self.index(t);
        let first = self.bucket != Some(i);
        if first {
            self.close(sites);
            self.bucket = Some(i);
        }
        self.stacked.offer(level.stacked(), first, t, level, sites);
        self.total.offer(level.total, first, t, level, sites);
        self.last = level;
        self.last_t = t;
    }

    fn close(&mut self, now: &HashMap<Key, u64>) {
        if self.bucket.is_none() {
            return;
        }
        let mut points = vec![Point {
            t_ns: self.stacked.t,
            level: self.stacked.level,
            sites: largest(&self.stacked.snap.bytes, POINT_SITES),
        }];
        if self.total.t != self.stacked.t {
            points.push(Point {
                t_ns: self.total.t,
                level: self.total.level,
                sites: largest(&self.total.snap.bytes, POINT_SITES),
            });
        }
        if self.last_t != self.stacked.t && self.last_t != self.total.t {
            points.push(Point {
                t_ns: self.last_t,
                level: self.last,
                sites: largest(now, POINT_SITES),
            });
        }
        points.sort_by_key(|p| p.t_ns);
        self.points.extend(points);
        self.bucket = None;
    }

    /// Closes the last bucket; `now` is the state after the last event.
    pub fn finish(&mut self, now: &HashMap<Key, u64>) {
        self.close(now);
    }
}

/// The `n` sites holding the most bytes, most first.
fn largest(bytes: &HashMap<Key, u64>, n: usize) -> Vec<(Key, u64)> {
    let mut v: Vec<(Key, u64)> = bytes
        .iter()
        .filter(|(_, &b)| b > 0)
        .map(|(&s, &b)| (s, b))
        .collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    v.truncate(n);
    v
}

#[derive(Default, Clone, Copy)]
struct SiteCounts {
    allocations: u64,
    frees: u64,
}

/// One device of one process, as the replay goes.
struct Series {
    live: HashMap<Key, u64>,
    level: Level,
    down: Downsampler,
    /// The most bytes stacked (see [`Level::stacked`]), when, and the sites then.
    peak: u64,
    peak_t: u64,
    peak_snap: Snapshot,
    /// The largest device total (and when), tensor and reserve levels.
    max: Level,
    total_peak_t: u64,
    counts: HashMap<Key, SiteCounts>,
    /// The sites at the first OOM on this device, its time and requested bytes.
    oom: Option<(u64, u64, HashMap<Key, u64>)>,
    first_mark: Option<HashMap<Key, u64>>,
    last_mark: Snapshot,
    marks: u64,
    /// Holdings after every `step_stride`-th step marker: (step, time, sites), at most
    /// 2 × [`STEP_MOMENTS`].
    step_snaps: Vec<(u64, u64, HashMap<Key, u64>)>,
    step_stride: u64,
    /// Holdings at the moment of `view --at`, once reached.
    at: Option<HashMap<Key, u64>>,
}

impl Series {
    fn new(t0: u64, t1: u64) -> Series {
        Series {
            live: HashMap::new(),
            level: Level::default(),
            down: Downsampler::new(t0, t1, BUCKETS),
            peak: 0,
            peak_t: 0,
            peak_snap: Snapshot::default(),
            max: Level::default(),
            total_peak_t: 0,
            counts: HashMap::new(),
            oom: None,
            first_mark: None,
            last_mark: Snapshot::default(),
            marks: 0,
            step_snaps: Vec::new(),
            step_stride: 1,
            at: None,
        }
    }

    /// The sites holding memory now.
    fn holdings(&self) -> HashMap<Key, u64> {
        self.live
            .iter()
            .filter(|(_, &b)| b > 0)
            .map(|(&s, &b)| (s, b))
            .collect()
    }

    /// Site `key` made its accounting go from `from` to `to` bytes.
    fn change(&mut self, key: Key, from: u64, to: u64) {
        let c = self.counts.entry(key).or_default();
        let held = self.live.entry(key).or_default();
        if to > from {
            c.allocations += 1;
            *held = held.saturating_add(to - from);
        } else {
            c.frees += 1;
            *held = held.saturating_sub(from - to);
        }
        self.down.touch(key);
        self.peak_snap.dirty.insert(key);
        self.last_mark.dirty.insert(key);
    }

    /// The levels now (at `t`) are a point of the series.
    fn record(&mut self, t: u64) {
        let level = self.level;
        self.down.push(t, level, &self.live);
        if level.stacked() > self.peak {
            self.peak = level.stacked();
            self.peak_t = t;
            self.peak_snap.capture(&self.live);
        }
        if level.total > self.max.total {
            self.total_peak_t = t;
        }
        self.max = Level {
            total: self.max.total.max(level.total),
            tensors: self.max.tensors.max(level.tensors),
            reserve: self.max.reserve.max(level.reserve),
        };
    }

    /// Whether PyTorch's tensors were traced on this device: the picture is about them.
    fn has_tensors(&self) -> bool {
        self.counts.keys().any(|k| k.0 == Memory::Tensor)
    }

    fn mark(&mut self, t: u64) {
        self.marks += 1;
        if self.first_mark.is_none() {
            self.first_mark = Some(self.holdings());
        }
        self.last_mark.capture(&self.live);
        if self.marks.is_multiple_of(self.step_stride) {
            self.step_snaps.push((self.marks, t, self.holdings()));
            if self.step_snaps.len() >= 2 * STEP_MOMENTS {
                self.step_stride *= 2;
                let stride = self.step_stride;
                self.step_snaps
                    .retain(|(step, _, _)| step.is_multiple_of(stride));
            }
        }
    }
}

/// The site an event's change belongs to: the live allocation (or tensor, or physical
/// allocation) it frees, else its own stack. VMM memory counts while mapped, and an unmap
/// names only the address: `vmm` remembers which site created what each mapping maps.
fn site_of(p: ProcessView<'_>, vmm: &mut Vmm, ev: &oomtrace_proto::Event, site: Site) -> Site {
    match ev.kind() {
        Some(EventKind::PhysCreate) => {
            vmm.handles.insert(ev.ptr, site);
            return site;
        }
        Some(EventKind::PhysRelease) => {
            let created = vmm.handles.remove(&ev.ptr);
            return p.handle(ev.ptr).map(|h| h.site).or(created).unwrap_or(site);
        }
        Some(EventKind::Map) => {
            let created = vmm
                .handles
                .get(&ev.aux)
                .copied()
                .or_else(|| p.handle(ev.aux).map(|h| h.site))
                .unwrap_or(site);
            vmm.maps.insert(ev.ptr, created);
            return created;
        }
        Some(EventKind::Unmap) => {
            if let Some(created) = vmm.maps.remove(&ev.ptr) {
                return created;
            }
        }
        _ => {}
    }
    if ev.ptr != 0 {
        // A tensor and the segment that holds it can share an address: each in its own table.
        let found = if ev.api().memory_class() == MemoryClass::Tensor {
            p.tensor(ev.ptr)
        } else {
            p.live(ev.ptr)
        };
        if let Some(a) = found {
            return a.site;
        }
    }
    site
}

/// The creating site of each physical handle and mapped address of one process.
#[derive(Default)]
struct Vmm {
    handles: HashMap<u64, Site>,
    maps: HashMap<u64, Site>,
}

#[derive(Default)]
struct ProcState {
    series: BTreeMap<i16, Series>,
    /// The last event's site, time and kind: its effect shows in the state at the next visit.
    pending: Option<(Site, u64, Option<EventKind>)>,
    markers: Vec<(u64, String)>,
    marker_count: u64,
    vmm: Vmm,
    /// The sites whose allocations PyTorch's caching allocator said are its segments.
    segment_sites: HashSet<Site>,
    /// When the first allocation (or failed one) was made: where the time axis starts.
    first_alloc_ns: Option<u64>,
    /// PyTorch's own statistics of each device after each step marker, as the program read
    /// them: (time, allocated, max allocated, reserved).
    torch_memory: BTreeMap<i16, Vec<(u64, u64, u64, u64)>>,
    /// The moment of `view --at` was reached in this process.
    at_reached: bool,
}

impl ProcState {
    /// Applies the pending event's effect; `next` is the kind of the record about to be
    /// shown. Half of a segment's birth or death (its `cudaMalloc` before the allocator's
    /// segment event, its segment-free event before the `cudaFree`) is applied without a
    /// point: the levels between the two halves are no moment of the program's (for one
    /// event the segment would count as memory outside PyTorch's reserve).
    fn settle(&mut self, p: ProcessView<'_>, span: (u64, u64), next: Option<EventKind>) {
        let Some((site, t, kind)) = self.pending.take() else {
            return;
        };
        let segment = |k: Option<EventKind>| {
            matches!(k, Some(EventKind::Segment) | Some(EventKind::SegmentFree))
        };
        let between = segment(next) || kind == Some(EventKind::SegmentFree);
        for (d, totals) in p.devices() {
            let s = self
                .series
                .entry(d)
                .or_insert_with(|| Series::new(span.0, span.1));
            let level = Level {
                total: totals.live_bytes,
                tensors: totals.tensor_bytes,
                reserve: totals.torch_reserved.unwrap_or(0),
            };
            if level == s.level {
                continue;
            }
            if level.total != s.level.total {
                s.change((Memory::Device, site), s.level.total, level.total);
            }
            if level.tensors != s.level.tensors {
                s.change((Memory::Tensor, site), s.level.tensors, level.tensors);
            }
            s.level = level;
            if !between {
                s.record(t);
            }
        }
    }

    /// The keys the picture shows: with tensors, the tensors and the device memory outside
    /// PyTorch's segments (the segments are the reserve line); without, all device memory.
    fn shown(&self, tensors: bool, key: Key) -> bool {
        match key.0 {
            Memory::Tensor => true,
            Memory::Device => !tensors || !self.segment_sites.contains(&key.1),
        }
    }
}

/// The page's view of a call site: its stack, its label and its flame graph paths.
struct SiteInfo {
    stack: Value,
    /// [`site_label`], and what may tell it apart from others of that label.
    label: String,
    details: Vec<String>,
    /// Outermost first: the Python frames (or, without any, a node that says so and the
    /// culprit), and every frame.
    python_path: Vec<String>,
    native_path: Vec<String>,
    has_python: bool,
}

impl SiteInfo {
    /// `backward`: the site's name in PyTorch's backward pass (labelled by it, and under its
    /// forward line's Python frames in the flame graph).
    fn new(frames: &[Frame], site: Site, backward: Option<BackwardName>) -> SiteInfo {
        let label = backward
            .as_ref()
            .map_or_else(|| site_label(frames), |b| b.name.clone());
        let python: Vec<String> = frames
            .iter()
            .rev()
            .filter(|f| f.python)
            .map(frame_label)
            .collect();
        let has_python = !python.is_empty();
        let python_path = match &backward {
            _ if has_python => python,
            Some(b) => {
                let mut path: Vec<String> = b.path.iter().map(frame_label).collect();
                path.push(b.leaf.clone());
                path
            }
            None => vec!["(no Python frames)".to_string(), label.clone()],
        };
        let mut native_path: Vec<String> = frames
            .iter()
            .rev()
            .take(FLAME_DEPTH)
            .map(|f| {
                if f.python {
                    frame_label(f)
                } else if !f.function.is_empty() {
                    elided(&f.function)
                } else {
                    frame_name(f)
                }
            })
            .collect();
        if frames.len() > FLAME_DEPTH {
            native_path.push(format!("({} more frames)", frames.len() - FLAME_DEPTH));
        }
        SiteInfo {
            stack: stack_json(frames, site),
            details: site_details(frames),
            label,
            python_path,
            native_path,
            has_python,
        }
    }
}

/// Symbolized sites of one process, each once.
struct Sites<'a> {
    p: ProcessView<'a>,
    sym: &'a mut Symbolizer,
    known: HashMap<Site, Rc<SiteInfo>>,
}

impl Sites<'_> {
    fn get(&mut self, site: Site) -> Rc<SiteInfo> {
        let (p, sym) = (self.p, &mut *self.sym);
        self.known
            .entry(site)
            .or_insert_with(|| {
                let frames = sym.site(p, site);
                let backward = sym.backward(p, &frames);
                Rc::new(SiteInfo::new(&frames, site, backward))
            })
            .clone()
    }
}

/// A page's data, and what to say about it on stderr.
pub struct Page {
    /// What [`super::html::write`] renders.
    pub data: Value,
    /// One line per module whose file changed since the trace was taken (also among the
    /// page's warnings): its frames show module and offset instead of names.
    pub stale_module_warnings: Vec<String>,
}

/// Builds the page's data for the trace at `path`.
pub fn build(path: &Path, at: Option<At>, progress: &mut Progress) -> Result<Page, Failure> {
    let name = path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    progress.pass(format!("analysing {name}"));
    let analysed =
        AnalysisTrace::<Analysis>::load_with_progress(path, &mut |d, t| progress.update(d, t))?;
    progress.end_pass();
    let mut warnings = report::analysis_failures(&analysed);
    let report = report::build(
        &analysed,
        &ReportOptions {
            top: 10,
            path: path.display().to_string(),
            symbolize: true,
        },
    );
    let spans: HashMap<u32, (u64, u64)> = analysed
        .processes
        .iter()
        .map(|p| (p.conn, (p.first_ts_ns, p.last_ts_ns)))
        .collect();
    // The detectors count a finding's seconds (a leak's onset, its detection) from the start
    // of their first step, the OOM's from the process's first event, as this page does.
    let clock_starts: HashMap<u32, u64> = analysed
        .processes
        .iter()
        .zip(&analysed.observers)
        .filter_map(|(p, a)| Some((p.conn, a.clock.start_of(0)?)))
        .collect();
    drop(analysed);
    warnings.extend(report.trace.warnings.iter().cloned());
    let stale_module_warnings: Vec<String> =
        report.stale_modules.iter().map(|m| m.warning()).collect();
    warnings.extend(stale_module_warnings.iter().cloned());
    let report_json = serde_json::to_value(&report)?;

    progress.pass(format!("aggregating {name}"));
    let mut procs: BTreeMap<u32, ProcState> = BTreeMap::new();
    let span_of = |conn: u32| spans.get(&conn).copied().unwrap_or((0, 0));
    let trace = view::replay(path, &mut |d, t| progress.update(d, t), |p, seen| {
        let span = span_of(p.conn());
        let st = procs.entry(p.conn()).or_default();
        let next = match seen {
            Seen::Event { event, .. } => event.kind(),
            Seen::Marker { .. } | Seen::TorchMemory { .. } => None,
        };
        st.settle(p, span, next);
        if let (Some(At::Seconds(t)), false) = (at, st.at_reached) {
            let now = match seen {
                Seen::Event { event, .. } => Some(event.ts_ns),
                Seen::Marker { ts_ns, .. } => Some(ts_ns),
                Seen::TorchMemory { .. } => None,
            };
            if now.is_some_and(|n| n.saturating_sub(span.0) as f64 >= t * 1e9) {
                for s in st.series.values_mut() {
                    s.at = Some(s.holdings());
                }
                st.at_reached = true;
            }
        }
        match seen {
            Seen::Event { event, site } => {
                let kind = event.kind();
                let site = site_of(p, &mut st.vmm, event, site);
                st.pending = Some((site, event.ts_ns, kind));
                if matches!(
                    kind,
                    Some(EventKind::Alloc | EventKind::AllocFailed | EventKind::PhysCreate)
                ) && st.first_alloc_ns.is_none()
                {
                    st.first_alloc_ns = Some(event.ts_ns);
                }
                if kind == Some(EventKind::Segment) {
                    // The allocation the segment is (its `cudaMalloc`, or the physical memory
                    // mapped at its address): a site of PyTorch's reserve.
                    let made = p
                        .live(event.ptr)
                        .map(|a| a.site)
                        .or_else(|| st.vmm.maps.get(&event.ptr).copied());
                    if let Some(made) = made {
                        st.segment_sites.insert(made);
                    }
                }
                let oom = kind == Some(EventKind::AllocFailed) && event.result == OUT_OF_MEMORY;
                if oom {
                    let s = st
                        .series
                        .entry(event.device)
                        .or_insert_with(|| Series::new(span.0, span.1));
                    if s.oom.is_none() {
                        let held = s
                            .live
                            .iter()
                            .filter(|(_, &b)| b > 0)
                            .map(|(&k, &b)| (k, b))
                            .collect();
                        s.oom = Some((event.ts_ns, event.size, held));
                    }
                }
            }
            Seen::Marker { ts_ns, label, .. } => {
                st.marker_count += 1;
                st.markers.push((ts_ns, label.to_string()));
                for s in st.series.values_mut() {
                    s.mark(ts_ns);
                }
                if at == Some(At::Step(st.marker_count)) {
                    for s in st.series.values_mut() {
                        s.at = Some(s.holdings());
                    }
                    st.at_reached = true;
                }
            }
            Seen::TorchMemory {
                device,
                ts_ns,
                allocated,
                max_allocated,
                reserved,
            } => {
                st.torch_memory.entry(device).or_default().push((
                    ts_ns,
                    allocated,
                    max_allocated,
                    reserved,
                ));
            }
        }
    })?;
    progress.end_pass();

    if let Some(at) = at {
        if !procs.values().any(|st| st.at_reached) {
            let most = procs.values().map(|st| st.marker_count).max().unwrap_or(0);
            let longest = spans
                .values()
                .map(|(a, b)| b.saturating_sub(*a) as f64 / 1e9)
                .fold(0.0, f64::max);
            return Err(Failure::new(match at {
                At::Step(n) => format!(
                    "--at {n}: the trace has {most} step{} (markers) in its longest process",
                    if most == 1 { "" } else { "s" }
                ),
                At::Seconds(t) => {
                    format!("--at {t}s: the trace's longest process ran {longest:.2} s")
                }
            }));
        }
    }
    let mut sym = Symbolizer::new();
    let mut processes = Vec::new();
    for (conn, mut st) in procs {
        let p = trace.by_conn(conn)?;
        let span = span_of(conn);
        st.settle(p, span, None);
        let t0 = span.0;
        let secs = |t: u64| t.saturating_sub(t0) as f64 / 1e9;
        let mut sites = Sites {
            p,
            sym: &mut sym,
            known: HashMap::new(),
        };
        let mut devices = Vec::new();
        for s in st.series.values_mut() {
            s.down.finish(&s.live);
        }
        for (&d, s) in &st.series {
            let mut dev = device_json(d, s, &st, at, &secs, &mut sites);
            // What the memory is (docs/anatomy.md), as the report says it: its roles over the
            // steps and at the peak, drawn beside the chart by call site.
            dev["anatomy"] = anatomy_of(&report_json, p.pid(), d);
            devices.push(dev);
        }
        let stride = st.markers.len().div_ceil(MAX_MARKERS).max(1);
        let markers: Vec<Value> = st
            .markers
            .iter()
            .enumerate()
            .step_by(stride)
            .map(|(i, (t, l))| json!({"t": secs(*t), "label": l, "step": i + 1}))
            .collect();
        processes.push(json!({
            "pid": p.pid(),
            "rank": p.launch().rank,
            "world_size": p.launch().world_size,
            "name": short_name(p),
            "command": p.command(),
            "duration_s": secs(span.1),
            "axis_start_s": secs(st.first_alloc_ns.unwrap_or(t0)),
            "analysis_t0_s": clock_starts.get(&conn).map(|&t| secs(t)),
            "markers": markers,
            "marker_count": st.marker_count,
            "devices": devices,
        }));
    }
    let mut findings = report_json["findings"].clone();
    label_findings(&mut findings);
    let data = json!({
        "version": 1,
        "producer": format!("oomtrace {}", env!("CARGO_PKG_VERSION")),
        "path": path.display().to_string(),
        "warnings": warnings,
        "simulated": report_json["trace"]["simulated"].clone(),
        "processes": processes,
        "findings": findings,
        "bounds": {
            "buckets": BUCKETS, "top_sites": TOP_SITES, "table_sites": TABLE_SITES,
            "flame_min_share": FLAME_MIN_SHARE, "max_markers": MAX_MARKERS,
        },
    });
    Ok(Page {
        data,
        stale_module_warnings,
    })
}

/// A frame of the report's JSON (`{function, file, line, module, ...}`) as a view frame.
fn frame_of_json(f: &Value) -> Frame {
    let text = |k: &str| f[k].as_str().unwrap_or("").to_string();
    Frame {
        function: text("function"),
        file: text("file"),
        line: f["line"].as_u64().unwrap_or(0) as u32,
        module: text("module"),
        address: text("address"),
        offset: text("offset"),
        python: f["python"].as_bool().unwrap_or(false),
        module_changed: f["module_changed"].as_bool().unwrap_or(false),
    }
}

/// Gives the report's findings the page's labels: `culprit_label` for the frame a finding is
/// named by, `label` for each site of an OOM's table ([`super::label`]'s rule).
fn label_findings(findings: &mut Value) {
    let frames_of = |stack: &Value| -> Vec<Frame> {
        stack
            .as_array()
            .map(|s| s.iter().map(frame_of_json).collect())
            .unwrap_or_default()
    };
    for f in findings.as_array_mut().into_iter().flatten() {
        // A backward-pass site is named by its forward line, which only the report (reading
        // the process's other sites) knows: its name.
        let backward = f["site_name"]
            .as_str()
            .filter(|_| in_backward(&frames_of(&f["stack"])))
            .map(str::to_string);
        let label = if backward.is_some() {
            backward
        } else if f["culprit"].is_object() {
            Some(frame_label(&frame_of_json(&f["culprit"])))
        } else {
            f["stack"]
                .as_array()
                .filter(|stack| !stack.is_empty())
                .map(|stack| site_label(&stack.iter().map(frame_of_json).collect::<Vec<_>>()))
        };
        if let (Some(label), Some(obj)) = (label, f.as_object_mut()) {
            obj.insert("culprit_label".into(), label.into());
        }
        let tops = f
            .get_mut("oom")
            .and_then(|o| o.get_mut("top_sites"))
            .and_then(Value::as_array_mut);
        for top in tops.into_iter().flatten() {
            let frames = frames_of(&top["stack"]);
            let label = match top["name"].as_str() {
                Some(name) if in_backward(&frames) => name.to_string(),
                _ => site_label(&frames),
            };
            if let Some(obj) = top.as_object_mut() {
                obj.insert("label".into(), label.into());
            }
        }
    }
}

/// A stack for the page: frames innermost first (as the report), each `[name, where,
/// python]`: the innermost [`STACK_FRAMES`], and the Python frames beyond them (a PyTorch
/// stack has tens of native frames before the first Python one), up to as many again.
fn stack_json(frames: &[Frame], site: Site) -> Value {
    let mut out: Vec<Value> = Vec::new();
    let mut left_out = 0;
    for (i, f) in frames.iter().enumerate() {
        if i >= STACK_FRAMES && !(f.python && out.len() < 2 * STACK_FRAMES) {
            left_out += 1;
            continue;
        }
        let file = frame_file(f);
        let at = if f.line > 0 {
            format!("{file}:{}", f.line)
        } else {
            file
        };
        out.push(json!([frame_name(f), at, f.python]));
    }
    if left_out > 0 {
        out.push(json!([format!("... {left_out} more frames"), "", false]));
    }
    if site.is_none() {
        out.push(json!(["(no stack recorded)", "", false]));
    }
    json!(out)
}

fn memory_name(tensors: bool, m: Memory) -> &'static str {
    match (tensors, m) {
        (_, Memory::Tensor) => "tensor",
        (true, Memory::Device) => "outside",
        (false, Memory::Device) => "device",
    }
}

fn device_json(
    d: i16,
    s: &Series,
    st: &ProcState,
    at: Option<At>,
    secs: &dyn Fn(u64) -> f64,
    sites: &mut Sites<'_>,
) -> Value {
    let p = sites.p;
    let tensors = s.has_tensors();
    let shown = |k: &Key| st.shown(tensors, *k);
    // Chart layers: the keys with the most bytes at any point, at the peak or at the end.
    let mut score: HashMap<Key, u64> = HashMap::new();
    let mut bump = |k: Key, b: u64| {
        let e = score.entry(k).or_default();
        *e = (*e).max(b);
    };
    for pt in &s.down.points {
        for &(k, b) in &pt.sites {
            bump(k, b);
        }
    }
    for (&k, &b) in s.peak_snap.bytes.iter().chain(s.live.iter()) {
        bump(k, b);
    }
    let mut ranked: Vec<(Key, u64)> = score.into_iter().filter(|(k, _)| shown(k)).collect();
    ranked.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut layers: Vec<Key> = ranked.iter().take(TOP_SITES).map(|x| x.0).collect();
    // Tensors first: they stack from zero, the memory outside PyTorch above its reserve.
    layers.sort_by_key(|k| k.0 != Memory::Tensor);
    let layer_index: HashMap<Key, usize> =
        layers.iter().enumerate().map(|(i, &k)| (k, i)).collect();
    let points: Vec<Value> = s
        .down
        .points
        .iter()
        .map(|pt| {
            let mut v = vec![0u64; layers.len()];
            for &(k, b) in &pt.sites {
                if let Some(&i) = layer_index.get(&k) {
                    v[i] = b;
                }
            }
            if tensors {
                json!([
                    secs(pt.t_ns),
                    pt.level.total,
                    v,
                    pt.level.tensors,
                    pt.level.reserve
                ])
            } else {
                json!([secs(pt.t_ns), pt.level.total, v])
            }
        })
        .collect();

    // The site table: every key shown that held or allocated anything, largest first.
    let mut rows: Vec<(Key, u64, u64, SiteCounts)> = s
        .counts
        .iter()
        .filter(|(k, _)| shown(k))
        .map(|(&k, &c)| {
            let peak = s.peak_snap.bytes.get(&k).copied().unwrap_or(0);
            let end = s.live.get(&k).copied().unwrap_or(0);
            (k, peak, end, c)
        })
        .collect();
    rows.sort_by(|a, b| {
        (b.1.max(b.2), b.3.allocations)
            .cmp(&(a.1.max(a.2), a.3.allocations))
            .then(a.0.cmp(&b.0))
    });
    let total_rows = rows.len();
    rows.truncate(TABLE_SITES);
    // One label per key of the page (rows and layers), unique within the device.
    let mut named: Vec<Key> = rows.iter().map(|r| r.0).collect();
    named.extend(layers.iter().filter(|k| !rows.iter().any(|r| r.0 == **k)));
    let infos: Vec<(u32, String, Vec<String>)> = named
        .iter()
        .map(|k| {
            let i = sites.get(k.1);
            (k.1.number(), i.label.clone(), i.details.clone())
        })
        .collect();
    let labels: HashMap<Key, String> = named.iter().copied().zip(distinct(&infos)).collect();
    let steps = s.marks;
    let first = s.first_mark.as_ref();
    let site_rows: Vec<Value> = rows
        .iter()
        .map(|&(k, peak, end, c)| {
            let info = sites.get(k.1);
            let growth = match first {
                Some(first) if steps >= 2 => {
                    let a = first.get(&k).copied().unwrap_or(0) as f64;
                    let b = s.last_mark.bytes.get(&k).copied().unwrap_or(0) as f64;
                    Some((b - a) / (steps - 1) as f64)
                }
                _ => None,
            };
            json!({
                "site": k.1.number(),
                "memory": memory_name(tensors, k.0),
                "label": labels[&k],
                "peak": peak,
                "end": end,
                "allocations": c.allocations,
                "temporaries": p.site_temporaries(k.1, d),
                "growth_per_step": growth,
                "stack": info.stack,
            })
        })
        .collect();
    let layer_json: Vec<Value> = layers
        .iter()
        .map(|&k| {
            json!({"site": k.1.number(), "memory": memory_name(tensors, k.0), "label": labels[&k]})
        })
        .collect();
    let held = |m: &HashMap<Key, u64>| -> HashMap<Key, u64> {
        m.iter()
            .filter(|(k, _)| shown(k))
            .map(|(&k, &b)| (k, b))
            .collect()
    };
    // The icicle's moments, in the order the page offers them: [key, label].
    let mut moments: Vec<(String, String, HashMap<Key, u64>)> =
        vec![("peak".into(), "at peak".into(), held(&s.peak_snap.bytes))];
    if let Some((_, _, at_oom)) = &s.oom {
        moments.push(("oom".into(), "at the OOM".into(), held(at_oom)));
    }
    if let (Some(at), Some(h)) = (at, &s.at) {
        moments.push(("at".into(), at.label(), held(h)));
    }
    moments.push(("end".into(), "at the end".into(), held(&s.live)));
    for (step, t, h) in &s.step_snaps {
        moments.push((
            format!("step:{step}"),
            format!("after step {step} ({:.2} s)", secs(*t)),
            held(h),
        ));
    }
    let mut flames = serde_json::Map::new();
    let mut python_flames = serde_json::Map::new();
    let mut has_python = false;
    for (name, _, held) in &moments {
        let mut native = |k: Key| sites.get(k.1).native_path.clone();
        flames.insert(name.clone(), flame(held, &mut native));
        let mut python = |k: Key| {
            let i = sites.get(k.1);
            has_python |= i.has_python;
            i.python_path.clone()
        };
        python_flames.insert(name.clone(), flame(held, &mut python));
    }
    let moment_list: Vec<Value> = moments.iter().map(|(k, l, _)| json!([k, l])).collect();
    let totals = p.device(d).unwrap_or_default();
    // PyTorch's own readings, thinned evenly like the markers they follow (the last kept).
    let readings = st
        .torch_memory
        .get(&d)
        .map(Vec::as_slice)
        .unwrap_or_default();
    let stride = readings.len().div_ceil(MAX_MARKERS).max(1);
    let torch_memory: Vec<Value> = readings
        .iter()
        .enumerate()
        .filter(|(i, _)| i % stride == 0 || i + 1 == readings.len())
        .map(|(_, &(t, allocated, max_allocated, reserved))| {
            json!([secs(t), allocated, max_allocated, reserved])
        })
        .collect();
    json!({
        "device": d,
        "label": device_label(d),
        "tensors": tensors,
        "peak": s.max.total,
        "peak_t": secs(s.total_peak_t),
        "stacked_peak": s.peak,
        "stacked_peak_t": secs(s.peak_t),
        "end": s.level.total,
        "tensor_peak": s.max.tensors,
        "tensor_end": s.level.tensors,
        "reserve_peak": s.max.reserve,
        "reserve_end": s.level.reserve,
        "free_bytes": totals.last_free,
        "layers": layer_json,
        "points": points,
        "oom": s.oom.as_ref().map(|(t, req, held)| json!({
            "t": secs(*t), "requested": req, "held": held.values().sum::<u64>(),
        })),
        "sites": site_rows,
        "site_count": total_rows,
        "flames": flames,
        "python_flames": python_flames,
        "moments": moment_list,
        "opens_at": if at.is_some() && s.at.is_some() { "at" } else { "peak" },
        "has_python": has_python,
        "torch_memory": torch_memory,
    })
}

/// The report's anatomy of `device` of process `pid` (null where it has none).
fn anatomy_of(report: &Value, pid: u32, device: i16) -> Value {
    report["processes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["pid"] == pid)
        .flat_map(|p| p["devices"].as_array().into_iter().flatten())
        .find(|d| d["device"] == device)
        .map(|d| d["anatomy"].clone())
        .unwrap_or(Value::Null)
}

/// A flame graph (an icicle, root at the top) of `held`: `{v: bytes, nodes: [[depth, name,
/// bytes], ...]}`, the nodes in depth-first order (each node's children follow it, one level
/// deeper, left to right), the root ("all") first; flat, so that a deep native stack is no
/// deep JSON. `path_of` gives a key's frames, outermost first.
fn flame(held: &HashMap<Key, u64>, path_of: &mut dyn FnMut(Key) -> Vec<String>) -> Value {
    #[derive(Default)]
    struct Node {
        v: u64,
        c: BTreeMap<String, Node>,
    }
    let total: u64 = held.values().sum();
    let min = ((total as f64) * FLAME_MIN_SHARE) as u64;
    let mut root = Node::default();
    let mut small = 0u64;
    for (&k, &b) in held {
        if b == 0 {
            continue;
        }
        root.v += b;
        if b < min {
            small += b;
            continue;
        }
        let mut node = &mut root;
        for name in path_of(k) {
            node = node.c.entry(name).or_default();
            node.v += b;
        }
    }
    if small > 0 {
        root.c.entry("(small sites)".into()).or_default().v += small;
    }
    fn emit(name: &str, n: &Node, depth: usize, min: u64, out: &mut Vec<Value>) {
        out.push(json!([depth, name, n.v]));
        let mut rest = 0u64;
        for (k, c) in &n.c {
            if c.v >= min.max(1) {
                emit(k, c, depth + 1, min, out);
            } else {
                rest += c.v;
            }
        }
        if rest > 0 {
            out.push(json!([depth + 1, "(other)", rest]));
        }
    }
    let mut nodes = Vec::new();
    emit("all", &root, 0, min, &mut nodes);
    json!({"v": root.v, "nodes": nodes})
}

#[cfg(test)]
mod tests;
