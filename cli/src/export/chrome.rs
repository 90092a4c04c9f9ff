//! Chrome trace-event JSON (the "JSON Object Format"), which Perfetto (ui.perfetto.dev) and
//! chrome://tracing open: `{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {}}`.
//!
//! - One trace process per traced process (`pid` = its pid; `process_name` metadata =
//!   `program (pid N)`).
//! - A counter per device, `cuda:N` (and `pinned host`), with one series `live_bytes`: the
//!   tracked live bytes, as `oomtrace report` counts them, after every event that changed them.
//! - Instant events (process scope): `OOM cuda:N` for each out-of-memory failure (args:
//!   requested bytes, live bytes, the driver's last free reading, API, call site) and each step
//!   marker (`oomtrace_mark`), named by its label.
//! - `ts` in microseconds since the first event of the exported processes.

use std::collections::{BTreeMap, HashSet};
use std::io::Write;
use std::path::Path;

use oomtrace_proto::EventKind;
use serde_json::{json, Value};

use super::view::{self, ProcessView, Seen, Symbolizer, Trace, OUT_OF_MEMORY};
use super::{device_label, frame_file, frame_name, short_name, write_failed};
use crate::progress::Progress;
use crate::Failure;

#[derive(Default)]
struct Track {
    /// Timestamp of the last event seen: its effect shows at the next visit.
    pending_ts: Option<u64>,
    last: BTreeMap<i16, u64>,
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

    fn counters(&mut self, p: ProcessView<'_>, ts_ns: u64, track: &mut Track) {
        for (d, s) in p.devices() {
            if track.last.get(&d) != Some(&s.live_bytes) {
                track.last.insert(d, s.live_bytes);
                let v = json!({
                    "name": device_label(d),
                    "ph": "C",
                    "ts": self.ts(ts_ns),
                    "pid": p.pid(),
                    "args": {"live_bytes": s.live_bytes},
                });
                self.event(&v);
            }
        }
    }
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
                "args": {"name": format!("{} (pid {})", short_name(p), p.pid())},
            });
            w.event(&v);
        }
    }
    // Ordered by connection, so the last counters of each process come out in the same order
    // in every run (a HashMap made the output differ from run to run).
    let mut tracks: BTreeMap<u32, Track> = BTreeMap::new();
    let mut sym = Symbolizer::new();
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
                    let oom =
                        ev.kind() == Some(EventKind::AllocFailed) && ev.result == OUT_OF_MEMORY;
                    if !oom {
                        return;
                    }
                    let at = sym
                        .site(p, site)
                        .into_iter()
                        .find(|f| !f.function.is_empty())
                        .map(|f| format!("{} ({}:{})", frame_name(&f), frame_file(&f), f.line))
                        .unwrap_or_default();
                    let dev = p.device(ev.device);
                    let v = json!({
                        "name": format!("OOM {}", device_label(ev.device)),
                        "ph": "i",
                        "s": "p",
                        "ts": w.ts(ev.ts_ns),
                        "pid": p.pid(),
                        "tid": ev.tid,
                        "args": {
                            "requested_bytes": ev.size,
                            "live_bytes": dev.map_or(0, |d| d.live_bytes),
                            "device_free_bytes": dev.and_then(|d| d.last_free),
                            "api": ev.api().name(),
                            "site": at,
                        },
                    });
                    w.event(&v);
                }
                Seen::Marker {
                    ts_ns, tid, label, ..
                } => {
                    let v = json!({
                        "name": label,
                        "ph": "i",
                        "s": "p",
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
