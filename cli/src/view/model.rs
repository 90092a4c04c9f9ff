//! The view's data: a trace aggregated into what one HTML page can hold, whatever the trace's
//! length.
//!
//! Two passes over the file: the analysis (the same replay and report as `oomtrace report`)
//! gives the findings and each process's time span; a replay through the exporters' read API
//! ([`crate::export::view`]) gives memory over time by call site. Each event's change in a
//! device's live bytes is put on one call site (the allocation's site for a free, found in the
//! state before the event), so the stacked layers add up to the device's total.
//!
//! Bounds (so a 10^7-event trace stays a few MB): [`BUCKETS`] time buckets per device, each
//! giving at most two points (its maximum, where the snapshot of sites is taken, and its last
//! value) with [`POINT_SITES`] sites each; [`TOP_SITES`] layers in the chart; [`TABLE_SITES`]
//! rows in the site table with [`STACK_FRAMES`] frames each; flame graphs hold sites of at
//! least [`FLAME_MIN_SHARE`] of their total and children of at least that share of the root;
//! [`MAX_MARKERS`] step markers per process (evenly thinned). Work per event is O(1)
//! amortized: snapshots (of the bucket maximum, the peak, the last step) copy only the sites
//! changed since their previous copy.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

use oomtrace_collector::analysis::Analysis;
use oomtrace_collector::model::trace::Trace as AnalysisTrace;
use oomtrace_collector::report::{self, ReportOptions};
use oomtrace_proto::EventKind;
use serde_json::{json, Value};

use crate::export::view::{self, Frame, ProcessView, Seen, Site, Symbolizer, OUT_OF_MEMORY};
use crate::export::{device_label, frame_file, frame_name, short_name};
use crate::progress::Progress;
use crate::Failure;

/// Time buckets per device; each gives at most two points.
pub const BUCKETS: usize = 1000;
/// Sites kept per point (the rest are summed as "other").
pub const POINT_SITES: usize = 32;
/// Layers of the memory chart per device (the rest are "other").
pub const TOP_SITES: usize = 10;
/// Rows of the site table per device.
pub const TABLE_SITES: usize = 200;
/// Frames kept per stack.
pub const STACK_FRAMES: usize = 48;
/// Flame graph nodes smaller than this share of the root are merged.
pub const FLAME_MIN_SHARE: f64 = 0.002;
/// Step markers kept per process.
pub const MAX_MARKERS: usize = 2000;

/// A copy of the per-site live bytes as they stood at one moment, brought up to date by
/// copying only the sites changed since (`dirty`).
#[derive(Default)]
struct Snapshot {
    bytes: HashMap<Site, u64>,
    dirty: HashSet<Site>,
}

impl Snapshot {
    fn capture(&mut self, now: &HashMap<Site, u64>) {
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

/// One point of a device's series: seconds since the process's first event, its live bytes
/// and the largest sites' share of them.
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    pub t_ns: u64,
    pub total: u64,
    pub sites: Vec<(Site, u64)>,
}

/// Max-preserving downsampling of a stream of (time, total) into at most two points per time
/// bucket: the bucket's maximum (with the site snapshot at that moment) and its last value.
pub struct Downsampler {
    t0: u64,
    span: u64,
    buckets: usize,
    bucket: Option<usize>,
    max: u64,
    max_t: u64,
    max_snap: Snapshot,
    last: u64,
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
            max: 0,
            max_t: 0,
            max_snap: Snapshot::default(),
            last: 0,
            last_t: 0,
            points: Vec::new(),
        }
    }

    fn index(&self, t: u64) -> usize {
        let off = t.saturating_sub(self.t0) as u128;
        let i = off * self.buckets as u128 / (self.span as u128 + 1);
        (i as usize).min(self.buckets - 1)
    }

    /// Site `s` changed (before [`Downsampler::push`] of the new total).
    fn touch(&mut self, s: Site) {
        self.max_snap.dirty.insert(s);
    }

    /// The total after an event at `t`, with the per-site bytes at that moment.
    pub fn push(&mut self, t: u64, total: u64, sites: &HashMap<Site, u64>) {
        let i = self.index(t);
        if self.bucket != Some(i) {
            self.close(sites);
            self.bucket = Some(i);
            self.max = total;
            self.max_t = t;
            self.max_snap.capture(sites);
        } else if total > self.max {
            self.max = total;
            self.max_t = t;
            self.max_snap.capture(sites);
        }
        self.last = total;
        self.last_t = t;
    }

    fn close(&mut self, now: &HashMap<Site, u64>) {
        if self.bucket.is_none() {
            return;
        }
        self.points.push(Point {
            t_ns: self.max_t,
            total: self.max,
            sites: largest(&self.max_snap.bytes, POINT_SITES),
        });
        if self.last_t != self.max_t {
            self.points.push(Point {
                t_ns: self.last_t,
                total: self.last,
                sites: largest(now, POINT_SITES),
            });
        }
        self.bucket = None;
    }

    /// Closes the last bucket; `now` is the state after the last event.
    pub fn finish(&mut self, now: &HashMap<Site, u64>) {
        self.close(now);
    }
}

/// The `n` sites holding the most bytes, most first.
fn largest(bytes: &HashMap<Site, u64>, n: usize) -> Vec<(Site, u64)> {
    let mut v: Vec<(Site, u64)> = bytes
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
    live: HashMap<Site, u64>,
    total: u64,
    down: Downsampler,
    peak: u64,
    peak_t: u64,
    peak_snap: Snapshot,
    counts: HashMap<Site, SiteCounts>,
    /// The sites at the first OOM on this device, its time and requested bytes.
    oom: Option<(u64, u64, HashMap<Site, u64>)>,
    first_mark: Option<HashMap<Site, u64>>,
    last_mark: Snapshot,
    marks: u64,
}

impl Series {
    fn new(t0: u64, t1: u64) -> Series {
        Series {
            live: HashMap::new(),
            total: 0,
            down: Downsampler::new(t0, t1, BUCKETS),
            peak: 0,
            peak_t: 0,
            peak_snap: Snapshot::default(),
            counts: HashMap::new(),
            oom: None,
            first_mark: None,
            last_mark: Snapshot::default(),
            marks: 0,
        }
    }

    /// The device's live bytes became `total` at `t`, by an event of site `site`.
    fn apply(&mut self, site: Site, t: u64, total: u64) {
        let c = self.counts.entry(site).or_default();
        let held = self.live.entry(site).or_default();
        if total > self.total {
            c.allocations += 1;
            *held = held.saturating_add(total - self.total);
        } else {
            c.frees += 1;
            *held = held.saturating_sub(self.total - total);
        }
        self.total = total;
        self.down.touch(site);
        self.peak_snap.dirty.insert(site);
        self.last_mark.dirty.insert(site);
        self.down.push(t, total, &self.live);
        if total > self.peak {
            self.peak = total;
            self.peak_t = t;
            self.peak_snap.capture(&self.live);
        }
    }

    fn mark(&mut self) {
        self.marks += 1;
        if self.first_mark.is_none() {
            self.first_mark = Some(
                self.live
                    .iter()
                    .filter(|(_, &b)| b > 0)
                    .map(|(&s, &b)| (s, b))
                    .collect(),
            );
        }
        self.last_mark.capture(&self.live);
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
        if let Some(a) = p.live(ev.ptr).or_else(|| p.tensor(ev.ptr)) {
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
    /// The last event's site and time: its effect shows in the state at the next visit.
    pending: Option<(Site, u64)>,
    markers: Vec<(u64, String)>,
    marker_count: u64,
    vmm: Vmm,
}

impl ProcState {
    fn settle(&mut self, p: ProcessView<'_>, span: (u64, u64)) {
        let Some((site, t)) = self.pending.take() else {
            return;
        };
        for (d, totals) in p.devices() {
            let s = self
                .series
                .entry(d)
                .or_insert_with(|| Series::new(span.0, span.1));
            if totals.live_bytes != s.total {
                s.apply(site, t, totals.live_bytes);
            }
        }
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
pub fn build(path: &Path, progress: &mut Progress) -> Result<Page, Failure> {
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
        st.settle(p, span);
        match seen {
            Seen::Event { event, site } => {
                let site = site_of(p, &mut st.vmm, event, site);
                st.pending = Some((site, event.ts_ns));
                let oom =
                    event.kind() == Some(EventKind::AllocFailed) && event.result == OUT_OF_MEMORY;
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
                    s.mark();
                }
            }
        }
    })?;
    progress.end_pass();

    let mut sym = Symbolizer::new();
    let mut processes = Vec::new();
    for (conn, mut st) in procs {
        let p = trace.by_conn(conn)?;
        let span = span_of(conn);
        st.settle(p, span);
        let t0 = span.0;
        let secs = |t: u64| t.saturating_sub(t0) as f64 / 1e9;
        let mut stacks: HashMap<Site, Value> = HashMap::new();
        let mut stack_of = |site: Site| -> Value {
            stacks
                .entry(site)
                .or_insert_with(|| stack_json(&sym.site(p, site), site))
                .clone()
        };
        let mut devices = Vec::new();
        for (d, mut s) in st.series {
            s.down.finish(&s.live);
            devices.push(device_json(d, &s, p, &secs, &mut stack_of));
        }
        let stride = st.markers.len().div_ceil(MAX_MARKERS).max(1);
        let markers: Vec<Value> = st
            .markers
            .iter()
            .step_by(stride)
            .map(|(t, l)| json!({"t": secs(*t), "label": l}))
            .collect();
        processes.push(json!({
            "pid": p.pid(),
            "rank": p.launch().rank,
            "world_size": p.launch().world_size,
            "name": short_name(p),
            "command": p.command(),
            "duration_s": secs(span.1),
            "analysis_t0_s": clock_starts.get(&conn).map(|&t| secs(t)),
            "markers": markers,
            "marker_count": st.marker_count,
            "devices": devices,
        }));
    }
    let data = json!({
        "version": 1,
        "producer": format!("oomtrace {}", env!("CARGO_PKG_VERSION")),
        "path": path.display().to_string(),
        "warnings": warnings,
        "processes": processes,
        "findings": report_json["findings"],
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

/// A stack for the page: frames outermost last (as the report), each `[name, where, python]`.
fn stack_json(frames: &[Frame], site: Site) -> Value {
    let mut out: Vec<Value> = frames
        .iter()
        .take(STACK_FRAMES)
        .map(|f| {
            let file = frame_file(f);
            let at = if f.line > 0 {
                format!("{file}:{}", f.line)
            } else {
                file
            };
            json!([frame_name(f), at, f.python])
        })
        .collect();
    if frames.len() > STACK_FRAMES {
        out.push(json!([
            format!("... {} more frames", frames.len() - STACK_FRAMES),
            "",
            false
        ]));
    }
    if site.is_none() {
        out.push(json!(["(no stack recorded)", "", false]));
    }
    json!(out)
}

/// A site's label: the first frame with a function name that is the user's (Python first).
fn label_of(stack: &Value) -> String {
    let frames = stack.as_array().cloned().unwrap_or_default();
    let named = |f: &&Value| {
        let n = f[0].as_str().unwrap_or("");
        !n.is_empty() && !n.starts_with("0x") && !n.contains('+')
    };
    frames
        .iter()
        .find(|f| f[2].as_bool() == Some(true))
        .or_else(|| {
            frames.iter().filter(named).find(|f| {
                let n = f[0].as_str().unwrap_or("");
                !n.starts_with("cuda") && !n.starts_with("cu") && !n.starts_with("oomtrace")
            })
        })
        .or_else(|| frames.iter().find(named))
        .or(frames.first())
        .map(|f| f[0].as_str().unwrap_or("?").to_string())
        .unwrap_or_else(|| "?".into())
}

fn device_json(
    d: i16,
    s: &Series,
    p: ProcessView<'_>,
    secs: &dyn Fn(u64) -> f64,
    stack_of: &mut dyn FnMut(Site) -> Value,
) -> Value {
    // Chart layers: the sites with the most bytes at any point, at the peak or at the end.
    let mut score: HashMap<Site, u64> = HashMap::new();
    let mut bump = |site: Site, b: u64| {
        let e = score.entry(site).or_default();
        *e = (*e).max(b);
    };
    for pt in &s.down.points {
        for &(site, b) in &pt.sites {
            bump(site, b);
        }
    }
    for (&site, &b) in s.peak_snap.bytes.iter().chain(s.live.iter()) {
        bump(site, b);
    }
    let mut ranked: Vec<(Site, u64)> = score.into_iter().collect();
    ranked.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let layers: Vec<Site> = ranked.iter().take(TOP_SITES).map(|x| x.0).collect();
    let layer_index: HashMap<Site, usize> =
        layers.iter().enumerate().map(|(i, &s)| (s, i)).collect();
    let points: Vec<Value> = s
        .down
        .points
        .iter()
        .map(|pt| {
            let mut v = vec![0u64; layers.len()];
            for &(site, b) in &pt.sites {
                if let Some(&i) = layer_index.get(&site) {
                    v[i] = b;
                }
            }
            json!([secs(pt.t_ns), pt.total, v])
        })
        .collect();

    // The site table: every site that held or allocated anything, largest first.
    let mut rows: Vec<(Site, u64, u64, SiteCounts)> = s
        .counts
        .iter()
        .map(|(&site, &c)| {
            let peak = s.peak_snap.bytes.get(&site).copied().unwrap_or(0);
            let end = s.live.get(&site).copied().unwrap_or(0);
            (site, peak, end, c)
        })
        .collect();
    rows.sort_by(|a, b| {
        (b.1.max(b.2), b.3.allocations)
            .cmp(&(a.1.max(a.2), a.3.allocations))
            .then(a.0.cmp(&b.0))
    });
    let total_rows = rows.len();
    rows.truncate(TABLE_SITES);
    let steps = s.marks;
    let first = s.first_mark.as_ref();
    let sites: Vec<Value> = rows
        .iter()
        .map(|&(site, peak, end, c)| {
            let stack = stack_of(site);
            let growth = match first {
                Some(first) if steps >= 2 => {
                    let a = first.get(&site).copied().unwrap_or(0) as f64;
                    let b = s.last_mark.bytes.get(&site).copied().unwrap_or(0) as f64;
                    Some((b - a) / (steps - 1) as f64)
                }
                _ => None,
            };
            json!({
                "site": site.number(),
                "label": label_of(&stack),
                "peak": peak,
                "end": end,
                "allocations": c.allocations,
                "temporaries": p.site_temporaries(site, d),
                "growth_per_step": growth,
                "stack": stack,
            })
        })
        .collect();
    let layer_json: Vec<Value> = layers
        .iter()
        .map(|&site| json!({"site": site.number(), "label": label_of(&stack_of(site))}))
        .collect();
    let mut flames = serde_json::Map::new();
    flames.insert("peak".into(), flame(&s.peak_snap.bytes, stack_of));
    if let Some((_, _, held)) = &s.oom {
        flames.insert("oom".into(), flame(held, stack_of));
    }
    flames.insert("end".into(), flame(&s.live, stack_of));
    let totals = p.device(d).unwrap_or_default();
    json!({
        "device": d,
        "label": device_label(d),
        "peak": s.peak,
        "peak_t": secs(s.peak_t),
        "end": s.total,
        "free_bytes": totals.last_free,
        "layers": layer_json,
        "points": points,
        "oom": s.oom.as_ref().map(|(t, req, held)| json!({
            "t": secs(*t), "requested": req, "held": held.values().sum::<u64>(),
        })),
        "sites": sites,
        "site_count": total_rows,
        "flames": flames,
    })
}

/// A flame graph (an icicle, root at the top) of `held`: `{n: name, v: bytes, c: [children]}`.
fn flame(held: &HashMap<Site, u64>, stack_of: &mut dyn FnMut(Site) -> Value) -> Value {
    #[derive(Default)]
    struct Node {
        v: u64,
        c: BTreeMap<String, Node>,
    }
    let total: u64 = held.values().sum();
    let min = ((total as f64) * FLAME_MIN_SHARE) as u64;
    let mut root = Node::default();
    let mut small = 0u64;
    for (&site, &b) in held {
        if b == 0 {
            continue;
        }
        root.v += b;
        if b < min {
            small += b;
            continue;
        }
        let stack = stack_of(site);
        let mut node = &mut root;
        // Outermost frame first.
        for f in stack.as_array().into_iter().flatten().rev() {
            let name = f[0].as_str().unwrap_or("?").to_string();
            node = node.c.entry(name).or_default();
            node.v += b;
        }
    }
    if small > 0 {
        root.c.entry("(small sites)".into()).or_default().v += small;
    }
    fn to_json(name: &str, n: &Node, min: u64) -> Value {
        let mut kids: Vec<Value> = Vec::new();
        let mut rest = 0u64;
        for (k, c) in &n.c {
            if c.v >= min.max(1) {
                kids.push(to_json(k, c, min));
            } else {
                rest += c.v;
            }
        }
        if rest > 0 {
            kids.push(json!({"n": "(other)", "v": rest, "c": []}));
        }
        json!({"n": name, "v": n.v, "c": kids})
    }
    to_json("all", &root, min)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(pairs: &[(u32, u64)]) -> HashMap<Site, u64> {
        pairs
            .iter()
            .map(|&(s, b)| (Site::from_number(s), b))
            .collect()
    }

    /// A million events give at most two points a bucket, and every bucket's maximum survives
    /// (a one-event spike included) with the sites as they stood at that moment.
    #[test]
    fn downsampling_bounds_points_and_keeps_maxima() {
        let n = 1_000_000u64;
        let mut d = Downsampler::new(0, n - 1, 100);
        let mut live = HashMap::new();
        let mut spikes = Vec::new();
        for t in 0..n {
            let base = t % 1000;
            let mut total = base;
            let site = Site::from_number(1 + (t % 3) as u32);
            if t % 77_777 == 5 {
                total = 10_000_000 + t;
                spikes.push(total);
                live.insert(Site::from_number(9), total);
                d.touch(Site::from_number(9));
            } else if live.remove(&Site::from_number(9)).is_some() {
                d.touch(Site::from_number(9));
            }
            live.insert(site, base);
            d.touch(site);
            d.push(t, total, &live);
        }
        d.finish(&live);
        assert!(d.points.len() <= 200, "{} points", d.points.len());
        for spike in spikes {
            let p = d
                .points
                .iter()
                .find(|p| p.total == spike)
                .expect("a spike was lost");
            assert_eq!(p.sites[0], (Site::from_number(9), spike));
        }
        assert!(d.points.windows(2).all(|w| w[0].t_ns <= w[1].t_ns));
        assert_eq!(d.points.last().unwrap().t_ns, n - 1);
    }

    #[test]
    fn a_bucket_keeps_its_last_value_after_its_maximum() {
        let mut d = Downsampler::new(0, 99, 1);
        let live = snap(&[(1, 5)]);
        d.touch(Site::from_number(1));
        d.push(10, 50, &live);
        d.push(20, 5, &live);
        d.finish(&live);
        assert_eq!(d.points.len(), 2);
        assert_eq!((d.points[0].t_ns, d.points[0].total), (10, 50));
        assert_eq!((d.points[1].t_ns, d.points[1].total), (20, 5));
    }

    #[test]
    fn flame_merges_small_sites_and_keeps_totals() {
        let held = snap(&[(1, 1000), (2, 1)]);
        let mut stack_of = |s: Site| {
            json!([
                [format!("leaf{}", s.number()), "", false],
                ["main", "", false]
            ])
        };
        let f = flame(&held, &mut stack_of);
        assert_eq!(f["v"], 1001);
        assert_eq!(f["c"][0]["n"], "main");
        assert_eq!(f["c"][0]["c"][0]["n"], "leaf1");
        // The small site is merged (into "(other)", being below the share itself).
        assert_eq!(f["c"][1]["n"], "(other)");
        assert_eq!(f["c"][1]["v"], 1);
    }
}
