//! Chrome trace-event JSON (the "JSON Object Format"), which Perfetto (ui.perfetto.dev) and
//! chrome://tracing open: `{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {}}`.
//!
//! - One trace process per traced process (`pid` = its pid; `process_name` metadata =
//!   `program (pid N)`).
//! - A counter per device, `cuda:N` (and `pinned host`), with one series `live_bytes`: the
//!   tracked live bytes, as `oomtrace report` counts them, after every event that changed them.
//! - Who holds that memory: a counter per top call site of each device (the [`TOP_SITES`] sites
//!   that held the most bytes at once), `cuda:N site K: function (file:line)`, and, when the
//!   device has more sites, `cuda:N other sites` (the rest of `live_bytes`); series
//!   `live_bytes`. Tensors of PyTorch's caching allocator (`--torch`) lie inside its segments
//!   and are not among them: the segments' sites are.
//! - Instant events, thread-scoped (`"s": "t"`: Perfetto shows a process-scoped instant's
//!   arguments nowhere): `OOM cuda:N` on the failing thread for each out-of-memory failure
//!   (args: requested bytes, live bytes, the device's free memory, API, call site) and each
//!   step marker (`oomtrace_mark`), named by its label. `device_free_bytes` is the driver's
//!   reading the shim takes right after the failure (`device_free_when`: `after the failure`);
//!   without one, the last reading before it (`last reading before the failure`), or null.
//! - `ts` in microseconds since the first event of the exported processes.

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

/// `device_free_when` of an OOM instant: the reading the shim takes right after the failure.
const AFTER: &str = "after the failure";
/// ... or, without one, the driver's last reading before it.
const BEFORE: &str = "last reading before the failure";

/// The counter series of one device, in the order they are written.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Series {
    Device,
    Site(usize),
    Other,
}

/// One device's top call sites: (site, counter name), most bytes first.
struct DeviceSites {
    top: Vec<(Site, String)>,
    /// Whether other sites allocated on the device too.
    others: bool,
}

#[derive(Default)]
struct Track {
    /// Timestamp of the last event seen: its effect shows at the next visit.
    pending_ts: Option<u64>,
    last: BTreeMap<(i16, Series), u64>,
    sites: BTreeMap<i16, DeviceSites>,
    /// OOM instants waiting for the driver's reading the shim takes right after the failure,
    /// by thread: (device, the instant).
    pending_oom: BTreeMap<u32, (i16, Value)>,
}

struct Writer<'a> {
    out: &'a mut dyn Write,
    origin_ns: u64,
    first: bool,
    error: Option<std::io::Error>,
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

    fn counter(&mut self, p: ProcessView<'_>, ts_ns: u64, name: &str, bytes: u64) {
        let v = json!({
            "name": name,
            "ph": "C",
            "ts": self.ts(ts_ns),
            "pid": p.pid(),
            "args": {"live_bytes": bytes},
        });
        self.event(&v);
    }

    fn counters(&mut self, p: ProcessView<'_>, ts_ns: u64, track: &mut Track) {
        for (d, s) in p.devices() {
            let label = device_label(d);
            let mut values = vec![(Series::Device, label.clone(), s.live_bytes)];
            if let Some(sites) = track.sites.get(&d) {
                let mut held = 0u64;
                for (i, (site, name)) in sites.top.iter().enumerate() {
                    let bytes = p.site_live(*site, d);
                    held = held.saturating_add(bytes);
                    values.push((Series::Site(i), name.clone(), bytes));
                }
                if sites.others {
                    let rest = s.live_bytes.saturating_sub(held);
                    values.push((Series::Other, format!("{label} other sites"), rest));
                }
            }
            for (series, name, bytes) in values {
                if track.last.get(&(d, series)) != Some(&bytes) {
                    track.last.insert((d, series), bytes);
                    self.counter(p, ts_ns, &name, bytes);
                }
            }
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
/// frame has a name); `short`: the file's name without its directory (for track names).
fn site_text(p: ProcessView<'_>, site: Site, sym: &mut Symbolizer, short: bool) -> String {
    if site.is_none() {
        return String::new();
    }
    let Some(f) = sym
        .site(p, site)
        .into_iter()
        .find(|f| !f.function.is_empty())
    else {
        return String::new();
    };
    let file = frame_file(&f);
    let file = match Path::new(&file).file_name() {
        Some(name) if short => name.to_string_lossy().into_owned(),
        _ => file,
    };
    format!("{} ({file}:{})", frame_name(&f), f.line)
}

/// Writes the processes on connections `conns` (of `scan`, the replayed trace at `path`).
pub fn write(
    path: &Path,
    scan: &Trace,
    conns: &[u32],
    progress: &mut Progress,
    out: &mut dyn Write,
) -> Result<(), Failure> {
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
    }
    let trace = view::replay(
        path,
        &mut |done, total| progress.update(done, total),
        |p, seen| {
            if !wanted.contains(&p.conn()) {
                return;
            }
            let track = tracks.entry(p.conn()).or_default();
            if let Some(ts) = track.pending_ts.take() {
                w.counters(p, ts, track);
            }
            match seen {
                Seen::Event { event: ev, site } => {
                    track.pending_ts = Some(ev.ts_ns);
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
            }
        },
    )?;
    progress.end_pass();
    // The effect of each process's last event.
    for (conn, track) in &mut tracks {
        if let Some(ts) = track.pending_ts.take() {
            let p = trace.by_conn(*conn)?;
            w.counters(p, ts, track);
        }
        // Failures the trace ended after, with no reading behind them.
        for (_, (_, oom)) in std::mem::take(&mut track.pending_oom) {
            w.event(&oom);
        }
    }
    if let Some(e) = w.error.take() {
        return Err(write_failed(e));
    }
    let tail = json!({"exporter": "oomtrace", "version": env!("CARGO_PKG_VERSION")});
    write!(
        w.out,
        "\n], \"displayTimeUnit\": \"ms\", \"otherData\": {tail}}}\n"
    )
    .map_err(write_failed)?;
    w.out.flush().map_err(write_failed)
}
