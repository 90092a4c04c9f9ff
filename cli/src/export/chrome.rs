//! Chrome trace-event JSON (the "JSON Object Format"), which Perfetto (ui.perfetto.dev) and
//! chrome://tracing open: `{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {}}`.
//!
//! - One trace process per traced process (`pid` = its pid; `process_name` metadata =
//!   `program (pid N)`).
//! - A counter per device, `cuda:N` (and `pinned host`), with one series `live_bytes`: the
//!   tracked live bytes, as `oomtrace report` counts them, after every event that changed them.
//! - Who holds that memory: a counter per top call site of each device (the [`TOP_SITES`] sites
//!   that held the most bytes at once), `cuda:N site K: function (file:line)` (a site in
//!   PyTorch's backward pass as the reports name it, `backward of addmm at train.py:25`),
//!   and, when the device has more sites, `cuda:N other sites` (the rest of `live_bytes`); series
//!   `live_bytes`. Tensors of PyTorch's caching allocator (`--torch`) lie inside its segments
//!   and are not among them: the segments' sites are.
//! - Instant events, thread-scoped (`"s": "t"`: Perfetto shows a process-scoped instant's
//!   arguments nowhere): `OOM cuda:N` on the failing thread for each out-of-memory failure
//!   (args: requested bytes, live bytes, the device's free memory, API, call site) and each
//!   step marker (`oomtrace_mark`), named by its label. `device_free_bytes` is the driver's
//!   reading the shim takes right after the failure (`device_free_when`: `after the failure`);
//!   without one, the last reading before it (`last reading before the failure`), or null.
//! - A counter per device, `cuda:N PyTorch's statistics`, with series `allocated_bytes`,
//!   `max_allocated_bytes` and `reserved_bytes`: PyTorch's own statistics as the program read
//!   them after each step marker (the Python step hook, in every mode), thinned with the
//!   markers they follow.
//! - `ts` in microseconds since the first event of the exported processes.
//!
//! Bounded by default, whatever the trace's length: each device's counters are coalesced as
//! `oomtrace view` coalesces its chart, into [`COUNTER_BUCKETS`] time buckets over the
//! process's run, each written as at most two samples (the moment the device held the most in
//! it, with its sites' values then, and its last value) (a device with fewer events than two
//! per bucket is written whole); step markers are thinned evenly to
//! [`MAX_MARKERS`] per process and OOM instants kept for the first [`MAX_OOMS`] failures of
//! each process. The peak, every bucket's maximum and the final values are exact. With
//! `--all-samples` ([`Options::all_samples`]) every change is a sample, every marker and OOM
//! an instant (a 5x10^7-event trace then makes gigabytes). What was left out is counted in
//! `otherData.left_out` and in [`Summary`].

use std::collections::{BTreeMap, HashSet};
use std::io::Write;
use std::path::Path;

use oomtrace_proto::EventKind;
use serde_json::{json, Value};

use super::view::{self, ProcessView, Seen, Site, Symbolizer, Trace, OUT_OF_MEMORY};
use super::{device_label, frame_file, frame_name, short_name, write_failed};
use crate::progress::Progress;
use crate::Failure;

/// Call sites with a counter of their own, per device; the rest are summed as "other sites".
pub const TOP_SITES: usize = 8;

/// Time buckets per device over its process's run, each at most two samples (unless
/// `--all-samples`): a Perfetto track is a few thousand pixels wide.
pub const COUNTER_BUCKETS: usize = 2000;
/// Step-marker instants kept per process, evenly thinned (unless `--all-samples`).
pub const MAX_MARKERS: u64 = 10_000;
/// Out-of-memory instants kept per process: its first failures (unless `--all-samples`).
pub const MAX_OOMS: u64 = 1_000;

/// `device_free_when` of an OOM instant: the reading the shim takes right after the failure.
const AFTER: &str = "after the failure";
/// ... or, without one, the driver's last reading before it.
const BEFORE: &str = "last reading before the failure";

/// How much to write.
#[derive(Clone, Copy, Debug, Default)]
pub struct Options {
    /// Every counter change, marker and OOM (no coalescing).
    pub all_samples: bool,
}

/// What the default, coalesced export left out (all 0 with `--all-samples`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Counter samples (one per change of a device's values) merged into their bucket's.
    pub samples: u64,
    pub markers: u64,
    pub ooms: u64,
}

impl Summary {
    pub fn is_empty(&self) -> bool {
        *self == Summary::default()
    }
}

/// One device's top call sites: (site, counter name), most bytes first.
struct DeviceSites {
    top: Vec<(Site, String)>,
    /// Whether other sites allocated on the device too.
    others: bool,
}

/// The counters of one device: names, what was written, and the coalescing state.
struct DeviceTrack {
    /// Counter names, in series order: the device, its top sites, "other sites" (if any).
    names: Vec<String>,
    top: Vec<Site>,
    others: bool,
    /// The last value written of each series.
    written: Vec<Option<u64>>,
    /// The values after the last event (scratch, and what the next event is compared with).
    now: Vec<u64>,
    seen: bool,
    /// The bucket being filled: its index, the values when the device held the most in it
    /// (and when), and its last values (and when).
    bucket: Option<usize>,
    max_t: u64,
    max: Vec<u64>,
    last_t: u64,
    last: Vec<u64>,
    /// Samples taken into the current bucket.
    in_bucket: u64,
    /// Whether its samples are coalesced: not when it has so few events that every sample
    /// fits the bound anyway (a small trace is written exactly).
    coalesce: bool,
}

impl DeviceTrack {
    fn new(device: i16, sites: Option<&DeviceSites>, coalesce: bool) -> DeviceTrack {
        let label = device_label(device);
        let mut names = vec![label.clone()];
        let mut top = Vec::new();
        let mut others = false;
        if let Some(s) = sites {
            for (site, name) in &s.top {
                top.push(*site);
                names.push(name.clone());
            }
            if s.others {
                others = true;
                names.push(format!("{label} other sites"));
            }
        }
        let n = names.len();
        DeviceTrack {
            names,
            top,
            others,
            written: vec![None; n],
            now: vec![0; n],
            seen: false,
            bucket: None,
            max_t: 0,
            max: vec![0; n],
            last_t: 0,
            last: vec![0; n],
            in_bucket: 0,
            coalesce,
        }
    }

    /// Reads the device's values now into `now`; whether they changed since the last read.
    fn read(&mut self, p: ProcessView<'_>, device: i16, live_bytes: u64) -> bool {
        let before = self.now.clone();
        self.now[0] = live_bytes;
        let mut held = 0u64;
        for (i, &site) in self.top.iter().enumerate() {
            let bytes = p.site_live(site, device);
            held = held.saturating_add(bytes);
            self.now[i + 1] = bytes;
        }
        if self.others {
            let last = self.now.len() - 1;
            self.now[last] = live_bytes.saturating_sub(held);
        }
        let changed = !self.seen || before != self.now;
        self.seen = true;
        changed
    }
}

#[derive(Default)]
struct Track {
    /// Timestamp and device of the last event seen: its effect shows at the next visit.
    pending: Option<(u64, i16)>,
    devices: BTreeMap<i16, DeviceTrack>,
    sites: BTreeMap<i16, DeviceSites>,
    /// Each device's events in the whole trace (from the first replay).
    device_events: BTreeMap<i16, u64>,
    /// The process's run (first and last timestamp), which the buckets divide.
    span: (u64, u64),
    /// Every `marker_stride`-th marker is written.
    marker_stride: u64,
    markers: u64,
    ooms: u64,
    /// OOM instants waiting for the driver's reading the shim takes right after the failure,
    /// by thread: (device, the instant).
    pending_oom: BTreeMap<u32, (i16, Value)>,
}

impl Track {
    fn bucket(&self, t: u64) -> usize {
        let span = self.span.1.saturating_sub(self.span.0) as u128 + 1;
        let i = t.saturating_sub(self.span.0) as u128 * COUNTER_BUCKETS as u128 / span;
        (i as usize).min(COUNTER_BUCKETS - 1)
    }
}

struct Writer<'a> {
    out: &'a mut dyn Write,
    origin_ns: u64,
    first: bool,
    error: Option<std::io::Error>,
    options: Options,
    left_out: Summary,
}

impl Writer<'_> {
    fn ts(&self, ns: u64) -> f64 {
        ns.saturating_sub(self.origin_ns) as f64 / 1000.0
    }

    fn event(&mut self, v: &Value) {
        if self.error.is_some() {
            return;
        }
        let sep: &[u8] = if self.first { b"\n" } else { b",\n" };
        self.first = false;
        let r = self
            .out
            .write_all(sep)
            .and_then(|()| serde_json::to_writer(&mut *self.out, v).map_err(std::io::Error::from));
        if let Err(e) = r {
            self.error = Some(e);
        }
    }

    fn counter(&mut self, pid: u32, ts_ns: u64, name: &str, bytes: u64) {
        let v = json!({
            "name": name,
            "ph": "C",
            "ts": self.ts(ts_ns),
            "pid": pid,
            "args": {"live_bytes": bytes},
        });
        self.event(&v);
    }

    /// Writes the series of `d` whose values differ from what was written last.
    fn write_values(&mut self, pid: u32, d: &mut DeviceTrack, t: u64, values: &[u64]) {
        for (i, &v) in values.iter().enumerate() {
            if d.written[i] != Some(v) {
                d.written[i] = Some(v);
                self.counter(pid, t, &d.names[i], v);
            }
        }
    }

    /// Writes the current bucket of `d`: its maximum, then its last values.
    fn close_bucket(&mut self, pid: u32, d: &mut DeviceTrack) {
        if d.bucket.take().is_none() {
            return;
        }
        let (max, last) = (std::mem::take(&mut d.max), std::mem::take(&mut d.last));
        self.write_values(pid, d, d.max_t, &max);
        let mut points = 1;
        if d.last_t != d.max_t || last != max {
            self.write_values(pid, d, d.last_t, &last);
            points += 1;
        }
        self.left_out.samples += d.in_bucket.saturating_sub(points);
        d.in_bucket = 0;
        (d.max, d.last) = (max, last);
    }

    /// The values of the events of `p` up to the one at `ts_ns` (on `hint`, the device it
    /// names) have applied: a sample for each device whose values changed.
    fn counters(&mut self, p: ProcessView<'_>, ts_ns: u64, hint: i16, track: &mut Track) {
        let i = track.bucket(ts_ns);
        for (device, s) in p.devices() {
            let d = track.devices.entry(device).or_insert_with(|| {
                let events = track
                    .device_events
                    .get(&device)
                    .copied()
                    .unwrap_or(u64::MAX);
                let coalesce = !self.options.all_samples && events > 2 * COUNTER_BUCKETS as u64;
                DeviceTrack::new(device, track.sites.get(&device), coalesce)
            });
            // A device whose total did not move kept its sites too (an event changes one
            // device's total by its size), unless the event named it: cheap to skip.
            if d.seen && d.now[0] == s.live_bytes && device != hint {
                continue;
            }
            if !d.read(p, device, s.live_bytes) {
                continue;
            }
            if !d.coalesce {
                let now = std::mem::take(&mut d.now);
                self.write_values(p.pid(), d, ts_ns, &now);
                d.now = now;
                continue;
            }
            if d.bucket != Some(i) {
                self.close_bucket(p.pid(), d);
                d.bucket = Some(i);
                d.max.clone_from(&d.now);
                d.max_t = ts_ns;
            } else if d.now[0] > d.max[0] {
                d.max.clone_from(&d.now);
                d.max_t = ts_ns;
            }
            d.last.clone_from(&d.now);
            d.last_t = ts_ns;
            d.in_bucket += 1;
        }
    }
}

/// The top call sites of each device of `p`, named for their counters.
fn top_sites(p: ProcessView<'_>, sym: &mut Symbolizer) -> BTreeMap<i16, DeviceSites> {
    let mut all = BTreeMap::new();
    for (d, _) in p.devices() {
        let mut peaks: Vec<(Site, u64)> = p.site_peaks(d).filter(|&(_, b)| b > 0).collect();
        if peaks.is_empty() {
            continue;
        }
        // Most bytes first; the site number breaks ties, so every run names them alike.
        peaks.sort_unstable_by_key(|&(site, bytes)| (std::cmp::Reverse(bytes), site));
        let others = peaks.len() > TOP_SITES;
        let top = peaks
            .iter()
            .take(TOP_SITES)
            .enumerate()
            .map(|(i, &(site, _))| {
                let at = site_text(p, site, sym, true);
                let at = if at.is_empty() {
                    "[no stack]".into()
                } else {
                    at
                };
                (site, format!("{} site {}: {at}", device_label(d), i + 1))
            })
            .collect();
        all.insert(d, DeviceSites { top, others });
    }
    all
}

/// A call site as one line: its innermost named frame, `function (file:line)` ("" when no
/// frame has a name); in PyTorch's backward pass, as the reports name it (`backward of addmm
/// at train.py:25`); `short`: the file's name without its directory (for track names).
fn site_text(p: ProcessView<'_>, site: Site, sym: &mut Symbolizer, short: bool) -> String {
    if site.is_none() {
        return String::new();
    }
    let frames = sym.site(p, site);
    if let Some(b) = sym.backward(p, &frames) {
        return b.name;
    }
    let Some(f) = frames.into_iter().find(|f| !f.function.is_empty()) else {
        return String::new();
    };
    let file = frame_file(&f);
    let file = match Path::new(&file).file_name() {
        Some(name) if short => name.to_string_lossy().into_owned(),
        _ => file,
    };
    format!("{} ({file}:{})", frame_name(&f), f.line)
}

/// Writes the processes on connections `conns` (of `scan`, the replayed trace at `path`);
/// returns what the coalescing left out.
pub fn write(
    path: &Path,
    scan: &Trace,
    conns: &[u32],
    options: Options,
    progress: &mut Progress,
    out: &mut dyn Write,
) -> Result<Summary, Failure> {
    let wanted: HashSet<u32> = conns.iter().copied().collect();
    let origin_ns = scan
        .processes()
        .filter(|p| wanted.contains(&p.conn()) && p.first_ts_ns() > 0)
        .map(|p| p.first_ts_ns())
        .min()
        .unwrap_or(0);
    out.write_all(b"{\"traceEvents\": [")
        .map_err(write_failed)?;
    let mut w = Writer {
        out,
        origin_ns,
        first: true,
        error: None,
        options,
        left_out: Summary::default(),
    };
    let mut named = HashSet::new();
    for &conn in conns {
        let p = scan.by_conn(conn)?;
        if named.insert(p.pid()) {
            let v = json!({
                "name": "process_name",
                "ph": "M",
                "pid": p.pid(),
                "args": {"name": match p.launch().rank {
                    Some(rank) => format!("{} (pid {}, rank {rank})", short_name(p), p.pid()),
                    None => format!("{} (pid {})", short_name(p), p.pid()),
                }},
            });
            w.event(&v);
        }
    }
    // Ordered by connection, so the last counters of each process come out in the same order
    // in every run (a HashMap made the output differ from run to run).
    let mut tracks: BTreeMap<u32, Track> = BTreeMap::new();
    let mut sym = Symbolizer::new();
    for &conn in conns {
        let p = scan.by_conn(conn)?;
        let track = tracks.entry(conn).or_default();
        track.sites = top_sites(p, &mut sym);
        track.span = (p.first_ts_ns(), p.last_ts_ns());
        track.device_events = p.devices().map(|(d, s)| (d, s.events)).collect();
        track.marker_stride = if options.all_samples {
            1
        } else {
            p.markers().div_ceil(MAX_MARKERS).max(1)
        };
    }
    let trace = view::replay(
        path,
        &mut |done, total| progress.update(done, total),
        |p, seen| {
            if !wanted.contains(&p.conn()) {
                return;
            }
            let track = tracks.entry(p.conn()).or_default();
            if let Some((ts, device)) = track.pending.take() {
                w.counters(p, ts, device, track);
            }
            match seen {
                Seen::Event { event: ev, site } => {
                    track.pending = Some((ev.ts_ns, ev.device));
                    if let Some((device, mut oom)) = track.pending_oom.remove(&ev.tid) {
                        // The thread's next event: the reading taken right after the failure,
                        // or something else (the instant keeps the reading before it).
                        if ev.kind() == Some(EventKind::MemInfo) && ev.device == device {
                            oom["args"]["device_free_bytes"] = json!(ev.ptr);
                            oom["args"]["device_free_when"] = json!(AFTER);
                        }
                        w.event(&oom);
                    }
                    let oom =
                        ev.kind() == Some(EventKind::AllocFailed) && ev.result == OUT_OF_MEMORY;
                    if !oom {
                        return;
                    }
                    track.ooms += 1;
                    if !options.all_samples && track.ooms > MAX_OOMS {
                        w.left_out.ooms += 1;
                        return;
                    }
                    let dev = p.device(ev.device);
                    let free = dev.and_then(|d| d.last_free);
                    let v = json!({
                        "name": format!("OOM {}", device_label(ev.device)),
                        "ph": "i",
                        "s": "t",
                        "ts": w.ts(ev.ts_ns),
                        "pid": p.pid(),
                        "tid": ev.tid,
                        "args": {
                            "requested_bytes": ev.size,
                            "live_bytes": dev.map_or(0, |d| d.live_bytes),
                            "device_free_bytes": free,
                            "device_free_when": free.map(|_| BEFORE),
                            "api": ev.api().name(),
                            "site": site_text(p, site, &mut sym, false),
                        },
                    });
                    // A second failure before any reading: the first keeps what it has.
                    if let Some((_, earlier)) = track.pending_oom.insert(ev.tid, (ev.device, v)) {
                        w.event(&earlier);
                    }
                }
                Seen::Marker {
                    ts_ns, tid, label, ..
                } => {
                    track.markers += 1;
                    if !(track.markers - 1).is_multiple_of(track.marker_stride) {
                        w.left_out.markers += 1;
                        return;
                    }
                    let v = json!({
                        "name": label,
                        "ph": "i",
                        "s": "t",
                        "ts": w.ts(ts_ns),
                        "pid": p.pid(),
                        "tid": tid,
                        "args": {"marker": label},
                    });
                    w.event(&v);
                }
                Seen::TorchMemory {
                    device,
                    ts_ns,
                    allocated,
                    max_allocated,
                    reserved,
                } => {
                    // Thinned with the markers they follow: kept when their marker was.
                    if !(track.markers.max(1) - 1).is_multiple_of(track.marker_stride) {
                        return;
                    }
                    let v = json!({
                        "name": format!("{} PyTorch's statistics", device_label(device)),
                        "ph": "C",
                        "ts": w.ts(ts_ns),
                        "pid": p.pid(),
                        "args": {
                            "allocated_bytes": allocated,
                            "max_allocated_bytes": max_allocated,
                            "reserved_bytes": reserved,
                        },
                    });
                    w.event(&v);
                }
            }
        },
    )?;
    progress.end_pass();
    // The effect of each process's last event, and the buckets still open.
    for (conn, track) in &mut tracks {
        let p = trace.by_conn(*conn)?;
        if let Some((ts, device)) = track.pending.take() {
            w.counters(p, ts, device, track);
        }
        for d in track.devices.values_mut() {
            w.close_bucket(p.pid(), d);
        }
        // Failures the trace ended after, with no reading behind them.
        for (_, (_, oom)) in std::mem::take(&mut track.pending_oom) {
            w.event(&oom);
        }
    }
    if let Some(e) = w.error.take() {
        return Err(write_failed(e));
    }
    let left_out = w.left_out;
    let tail = json!({
        "exporter": "oomtrace",
        "version": env!("CARGO_PKG_VERSION"),
        "all_samples": options.all_samples,
        "left_out": {
            "counter_samples": left_out.samples,
            "markers": left_out.markers,
            "oom_instants": left_out.ooms,
        },
    });
    write!(
        w.out,
        "\n], \"displayTimeUnit\": \"ms\", \"otherData\": {tail}}}\n"
    )
    .map_err(write_failed)?;
    w.out.flush().map_err(write_failed)?;
    Ok(left_out)
}
