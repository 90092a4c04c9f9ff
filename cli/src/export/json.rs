//! Every event of a trace as JSON lines (one object per line, streamed: no size limit, `jq`
//! and pandas read it). Each object has a `type`:
//!
//! - `trace` (first line): `format` ("oomtrace-events"), `version` (1), `source` (the file).
//! - `process`: `pid`, `ppid`, `command`, `exe`, `start_unix_ns`; before its first event.
//! - `site`: `pid`, `site` (a number, unique within the process), `stack`: symbolized frames
//!   `{function, file, line, module, address, offset}` (and `python: true` for a Python
//!   frame), innermost first (as in `report --json`); before the first line that refers to
//!   it. Site 0 means "no stack" and is never defined. A site in PyTorch's backward pass also
//!   has `backward`, its name in the reports (`backward of addmm at train.py:25`), from the
//!   sites defined before its first use.
//! - `event`: `pid`, `seq`, `ts_ns` (CLOCK_MONOTONIC), `tid`, `kind`, `api`, `device`,
//!   `site` (of the call, 0 = none), `result` (when not 0), and per kind: `alloc`: `ptr`,
//!   `size`, `stream`, `pool`/`flags` when set; `free`: `ptr`, `stream`, and when the trace saw
//!   the allocation: `size`, `device`, `alloc_site`; `alloc_failed`: `size`;
//!   `phys_create`: `handle`, `size`; `phys_release`/`phys_retain`: `handle` (`va`);
//!   `map`: `va`, `size`, `handle`, `offset`; `unmap`/`va_reserve`/`va_free`: `va`, `size`;
//!   `meminfo`: `free_bytes`, `total_bytes`; `free_failed`: `ptr`.
//!   Addresses and handles are hex strings; sizes are numbers.
//! - `marker`: `pid`, `seq`, `ts_ns`, `tid`, `label`.
//! - `torch_memory`: `pid`, `ts_ns`, `device`, `allocated_bytes`, `max_allocated_bytes`,
//!   `reserved_bytes`: PyTorch's own statistics of the device as the program read them right
//!   after the marker before it (`torch.cuda.memory_allocated()`, `max_memory_allocated()`,
//!   `memory_reserved()`; the Python step hook, in every mode).
//! - `process_end` (after all events, per process): `pid`, `status`, `events`, `lost_events`,
//!   `devices`: `[{device, peak_bytes, live_bytes}]` (device -1: pinned host memory).

use std::collections::HashSet;
use std::io::Write;
use std::path::Path;

use oomtrace_proto::wire::GoodbyeReason;
use oomtrace_proto::{Event, EventKind};
use serde_json::{json, Map, Value};

use super::view::{self, End, Frame, ProcessView, Seen, Site, Symbolizer};
use super::write_failed;
use crate::progress::Progress;
use crate::Failure;

struct Lines<'a> {
    out: &'a mut dyn Write,
    error: Option<std::io::Error>,
}

impl Lines<'_> {
    fn line(&mut self, v: &Value) {
        if self.error.is_some() {
            return;
        }
        let r = serde_json::to_writer(&mut *self.out, v)
            .map_err(std::io::Error::from)
            .and_then(|()| self.out.write_all(b"\n"));
        if let Err(e) = r {
            self.error = Some(e);
        }
    }
}

fn hex(v: u64) -> Value {
    Value::String(format!("{v:#x}"))
}

fn kind_name(k: EventKind) -> &'static str {
    match k {
        EventKind::Alloc => "alloc",
        EventKind::Free => "free",
        EventKind::AllocFailed => "alloc_failed",
        EventKind::PhysCreate => "phys_create",
        EventKind::PhysRelease => "phys_release",
        EventKind::PhysRetain => "phys_retain",
        EventKind::Map => "map",
        EventKind::Unmap => "unmap",
        EventKind::VaReserve => "va_reserve",
        EventKind::VaFree => "va_free",
        EventKind::MemInfo => "meminfo",
        EventKind::Marker => "marker",
        EventKind::Init => "init",
        EventKind::FreeFailed => "free_failed",
        EventKind::Segment => "segment",
        EventKind::SegmentFree => "segment_free",
    }
}

fn status(p: ProcessView<'_>) -> &'static str {
    match p.end() {
        End::UnderscoreExit => "exited (_exit)",
        End::Detached => "detached",
        End::Exited => "exited",
        End::Abrupt => "ended without goodbye (killed or crashed)",
        End::Unheard(GoodbyeReason::Exit) => "exited (end of stream lost)",
        End::Unheard(GoodbyeReason::UnderscoreExit) => "exited (_exit, end of stream lost)",
        End::Unheard(GoodbyeReason::Detach) => "detached (end of stream lost)",
        End::Running => "running when the trace ended",
        End::ProtocolError => "dropped (protocol error)",
    }
}

/// A frame as `report --json` writes it: every field, `python` only when true.
pub(super) fn frame_json(f: &Frame) -> Value {
    let mut m = Map::new();
    m.insert("function".into(), f.function.clone().into());
    m.insert("file".into(), f.file.clone().into());
    m.insert("line".into(), f.line.into());
    m.insert("module".into(), f.module.clone().into());
    m.insert("address".into(), f.address.clone().into());
    m.insert("offset".into(), f.offset.clone().into());
    if f.python {
        m.insert("python".into(), true.into());
    }
    if f.module_changed {
        m.insert("module_changed".into(), true.into());
    }
    Value::Object(m)
}

/// The event's own fields; the sites it refers to are pushed on `sites`.
fn event_fields(
    p: ProcessView<'_>,
    ev: &Event,
    site: Site,
    sites: &mut Vec<Site>,
) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("type".into(), "event".into());
    m.insert("pid".into(), p.pid().into());
    m.insert("seq".into(), ev.seq.into());
    m.insert("ts_ns".into(), ev.ts_ns.into());
    m.insert("tid".into(), ev.tid.into());
    let kind = ev.kind();
    m.insert(
        "kind".into(),
        kind.map_or_else(
            || format!("unknown ({})", ev.kind),
            |k| kind_name(k).to_string(),
        )
        .into(),
    );
    m.insert("api".into(), ev.api().name().into());
    m.insert("device".into(), ev.device.into());
    m.insert("site".into(), site.number().into());
    sites.push(site);
    if ev.result != 0 {
        m.insert("result".into(), ev.result.into());
    }
    let mut put = |k: &str, v: Value| {
        m.insert(k.into(), v);
    };
    match kind {
        Some(EventKind::Alloc) => {
            put("ptr", hex(ev.ptr));
            put("size", ev.size.into());
            put("stream", hex(ev.aux));
            if ev.extra != 0 {
                let host = ev.api().memory_class() == oomtrace_proto::MemoryClass::HostPinned;
                put(if host { "flags" } else { "pool" }, hex(ev.extra));
            }
        }
        Some(EventKind::Free) => {
            put("ptr", hex(ev.ptr));
            put("stream", hex(ev.aux));
            let tensor = ev.api().memory_class() == oomtrace_proto::MemoryClass::Tensor;
            match if tensor {
                p.tensor(ev.ptr)
            } else {
                p.live(ev.ptr)
            } {
                Some(a) => {
                    put("size", a.size.into());
                    put("device", a.device.into());
                    put("alloc_site", a.site.number().into());
                    sites.push(a.site);
                }
                None if ev.size != 0 => put("size", ev.size.into()),
                None => {}
            }
        }
        Some(EventKind::AllocFailed) => put("size", ev.size.into()),
        Some(EventKind::PhysCreate) => {
            put("handle", hex(ev.ptr));
            put("size", ev.size.into());
        }
        Some(EventKind::PhysRelease) => put("handle", hex(ev.ptr)),
        Some(EventKind::PhysRetain) => {
            put("handle", hex(ev.ptr));
            put("va", hex(ev.aux));
        }
        Some(EventKind::Map) => {
            put("va", hex(ev.ptr));
            put("size", ev.size.into());
            put("handle", hex(ev.aux));
            put("offset", ev.extra.into());
        }
        Some(EventKind::Unmap | EventKind::VaReserve | EventKind::VaFree) => {
            put("va", hex(ev.ptr));
            put("size", ev.size.into());
        }
        Some(EventKind::MemInfo) => {
            put("free_bytes", ev.ptr.into());
            put("total_bytes", ev.size.into());
        }
        Some(EventKind::FreeFailed) => put("ptr", hex(ev.ptr)),
        Some(EventKind::Segment | EventKind::SegmentFree) => {
            put("ptr", hex(ev.ptr));
            put("size", ev.size.into());
            put("stream", hex(ev.aux));
        }
        Some(EventKind::Marker | EventKind::Init) => {}
        None => {
            put("ptr", hex(ev.ptr));
            put("size", ev.size.into());
            put("aux", hex(ev.aux));
            put("extra", hex(ev.extra));
        }
    }
    m
}

fn process_line(p: ProcessView<'_>) -> Value {
    json!({
        "type": "process",
        "pid": p.pid(),
        "ppid": p.ppid(),
        "command": p.command(),
        "exe": p.exe(),
        "start_unix_ns": p.start_unix_ns(),
    })
}

/// Writes the processes on connections `conns` of the trace at `path`.
pub fn write(
    path: &Path,
    conns: &[u32],
    progress: &mut Progress,
    out: &mut dyn Write,
) -> Result<(), Failure> {
    let wanted: HashSet<u32> = conns.iter().copied().collect();
    let mut w = Lines { out, error: None };
    w.line(&json!({
        "type": "trace",
        "format": "oomtrace-events",
        "version": 1,
        "source": path.display().to_string(),
    }));
    let mut started: HashSet<u32> = HashSet::new();
    let mut defined: HashSet<(u32, Site)> = HashSet::new();
    let mut sym = Symbolizer::new();
    let mut refs = Vec::new();
    let trace = view::replay(
        path,
        &mut |done, total| progress.update(done, total),
        |p, seen| {
            if !wanted.contains(&p.conn()) {
                return;
            }
            if started.insert(p.conn()) {
                w.line(&process_line(p));
            }
            refs.clear();
            let line = match seen {
                Seen::Event { event, site } => {
                    Value::Object(event_fields(p, event, site, &mut refs))
                }
                Seen::Marker {
                    seq,
                    ts_ns,
                    tid,
                    label,
                } => json!({
                    "type": "marker", "pid": p.pid(), "seq": seq, "ts_ns": ts_ns, "tid": tid,
                    "label": label,
                }),
                Seen::TorchMemory {
                    device,
                    ts_ns,
                    allocated,
                    max_allocated,
                    reserved,
                } => json!({
                    "type": "torch_memory", "pid": p.pid(), "ts_ns": ts_ns, "device": device,
                    "allocated_bytes": allocated, "max_allocated_bytes": max_allocated,
                    "reserved_bytes": reserved,
                }),
            };
            for &site in &refs {
                if !site.is_none() && defined.insert((p.conn(), site)) {
                    let frames = sym.site(p, site);
                    let stack: Vec<Value> = frames.iter().map(frame_json).collect();
                    let mut line = json!({
                        "type": "site", "pid": p.pid(), "site": site.number(), "stack": stack,
                    });
                    if let Some(b) = sym.backward(p, &frames) {
                        line["backward"] = b.name.into();
                    }
                    w.line(&line);
                }
            }
            w.line(&line);
        },
    )?;
    progress.end_pass();
    for &conn in conns {
        let p = trace.by_conn(conn)?;
        if started.insert(conn) {
            w.line(&process_line(p));
        }
        let devices: Vec<Value> = p
            .devices()
            .map(|(d, s)| json!({"device": d, "peak_bytes": s.peak_bytes, "live_bytes": s.live_bytes}))
            .collect();
        w.line(&json!({
            "type": "process_end",
            "pid": p.pid(),
            "status": status(p),
            "events": p.events(),
            "lost_events": p.lost_events(),
            "devices": devices,
        }));
    }
    if let Some(e) = w.error.take() {
        return Err(write_failed(e));
    }
    w.out.flush().map_err(write_failed)
}
