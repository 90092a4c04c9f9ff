//! Prometheus's text exposition format, version 0.0.4: each family once, `# HELP` and
//! `# TYPE` first, then its samples; label values escaped (`\\`, `\"`, `\n`).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::Ordering;

use super::{ProcessSnapshot, Registry};

/// The `Content-Type` of what [`render`] writes.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A label value as the format quotes it.
pub fn escape_label(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// A `# HELP` text as the format wants it (backslash and newline escaped).
fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

/// A sample value: Prometheus's spelling of the non-finite ones.
fn value(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        format!("{v}")
    }
}

/// Writes one family at a time.
pub struct Writer {
    out: String,
}

impl Default for Writer {
    fn default() -> Self {
        Writer::new()
    }
}

impl Writer {
    pub fn new() -> Writer {
        Writer {
            out: String::with_capacity(16 << 10),
        }
    }

    /// Opens family `name`: `kind` is `gauge` or `counter`.
    pub fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {}", escape_help(help));
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
    }

    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], v: f64) {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, val)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{k}=\"{}\"", escape_label(val));
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {}", value(v));
    }

    pub fn finish(self) -> String {
        self.out
    }
}

fn opt(v: Option<u32>) -> String {
    v.map(|v| v.to_string()).unwrap_or_default()
}

/// One family over every process: `each` writes its samples for one (with its `pid` and
/// `rank` labels ready).
fn per_process(
    w: &mut Writer,
    procs: &[std::sync::Arc<ProcessSnapshot>],
    name: &str,
    kind: &str,
    help: &str,
    mut each: impl FnMut(&mut Writer, &ProcessSnapshot, &str, &str),
) {
    w.family(name, kind, help);
    for p in procs {
        let pid = p.pid.to_string();
        let rank = opt(p.rank);
        each(w, p, &pid, &rank);
    }
}

/// One process's sites, by name.
#[derive(Default)]
struct Named {
    /// (device, site id) -> (per step, per second).
    rates: BTreeMap<(String, String), (Option<f64>, Option<f64>)>,
    live: BTreeMap<(String, String), u64>,
    /// id -> location.
    sites: BTreeMap<String, String>,
}

fn sum(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a + b),
        (a, b) => a.or(b),
    }
}

/// Everything the registry holds, in the exposition format.
pub fn render(r: &Registry) -> String {
    let procs = r.snapshots();
    let mut w = Writer::new();
    type DeviceValue = fn(&super::snapshot::DeviceSnapshot) -> u64;
    let device_families: [(&str, &str, &str, DeviceValue); 5] = [
        (
            "oomtrace_live_bytes",
            "gauge",
            "Bytes of GPU (or pinned host) memory allocated and not freed, per process and device.",
            |d| d.live_bytes,
        ),
        (
            "oomtrace_peak_bytes",
            "gauge",
            "The most bytes live at once, per process and device.",
            |d| d.peak_bytes,
        ),
        (
            "oomtrace_reserved_bytes",
            "gauge",
            "Bytes of segments PyTorch's caching allocator holds (--torch); 0 otherwise.",
            |d| d.reserved_bytes,
        ),
        (
            "oomtrace_allocations_total",
            "counter",
            "Successful allocations, per process and device.",
            |d| d.allocations,
        ),
        (
            "oomtrace_frees_total",
            "counter",
            "Frees of allocations this trace saw, per process and device.",
            |d| d.frees,
        ),
    ];
    for (name, kind, help, get) in device_families {
        per_process(&mut w, &procs, name, kind, help, |w, p, pid, rank| {
            for d in &p.devices {
                w.sample(
                    name,
                    &[("pid", pid), ("rank", rank), ("device", &d.device)],
                    get(d) as f64,
                );
            }
        });
    }
    per_process(
        &mut w,
        &procs,
        "oomtrace_lost_events_total",
        "counter",
        "Events the traced process could not deliver to the collector.",
        |w, p, pid, rank| {
            w.sample(
                "oomtrace_lost_events_total",
                &[("pid", pid), ("rank", rank)],
                p.lost_events as f64,
            )
        },
    );
    per_process(
        &mut w,
        &procs,
        "oomtrace_events_total",
        "counter",
        "Events received from the traced process.",
        |w, p, pid, rank| {
            w.sample(
                "oomtrace_events_total",
                &[("pid", pid), ("rank", rank)],
                p.events as f64,
            )
        },
    );
    per_process(
        &mut w,
        &procs,
        "oomtrace_findings",
        "gauge",
        "Current findings of the process, by kind and level (as the JSON report names them).",
        |w, p, pid, rank| {
            for (kind, level, n) in &p.findings {
                w.sample(
                    "oomtrace_findings",
                    &[
                        ("pid", pid),
                        ("rank", rank),
                        ("kind", kind),
                        ("level", level),
                    ],
                    *n as f64,
                );
            }
        },
    );
    // Sites by name (see `names`): not yet named ones are left out; two raw sites of one
    // process with the same key (the same code reached by two return addresses) are one
    // series, their sum.
    let named: Vec<Named> = r.names.with(|known| {
        procs
            .iter()
            .map(|p| {
                let name = |site| known.get(&(p.conn, site)).cloned();
                let mut n = Named::default();
                for l in &p.leak_rates {
                    if let Some((id, loc)) = name(l.site) {
                        let e = n.rates.entry((l.device.clone(), id.clone())).or_default();
                        e.0 = sum(e.0, l.bytes_per_step);
                        e.1 = sum(e.1, l.bytes_per_second);
                        n.sites.insert(id, loc);
                    }
                }
                for s in &p.top_sites {
                    if let Some((id, loc)) = name(s.site) {
                        *n.live.entry((s.device.clone(), id.clone())).or_default() += s.live_bytes;
                        n.sites.insert(id, loc);
                    }
                }
                n
            })
            .collect()
    });
    type Rate = fn(&(Option<f64>, Option<f64>)) -> Option<f64>;
    let rates: [(&str, &str, Rate); 2] = [
        (
            "oomtrace_leak_rate_bytes_per_step",
            "Growth of each current leak finding, bytes per step.",
            |r| r.0,
        ),
        (
            "oomtrace_leak_rate_bytes_per_second",
            "Growth of each current leak finding, bytes per second (when the steps have a \
             duration).",
            |r| r.1,
        ),
    ];
    for (name, help, get) in rates {
        w.family(name, "gauge", help);
        for (p, n) in procs.iter().zip(&named) {
            let (pid, rank) = (p.pid.to_string(), opt(p.rank));
            for ((device, site), r) in &n.rates {
                if let Some(v) = get(r) {
                    w.sample(
                        name,
                        &[
                            ("pid", &pid),
                            ("rank", &rank),
                            ("device", device),
                            ("site", site),
                        ],
                        v,
                    );
                }
            }
        }
    }
    w.family(
        "oomtrace_site_live_bytes",
        "gauge",
        "Live bytes of the process's top call sites (at most 10 per process).",
    );
    for (p, n) in procs.iter().zip(&named) {
        let (pid, rank) = (p.pid.to_string(), opt(p.rank));
        for ((device, site), v) in &n.live {
            w.sample(
                "oomtrace_site_live_bytes",
                &[
                    ("pid", &pid),
                    ("rank", &rank),
                    ("device", device),
                    ("site", site),
                ],
                *v as f64,
            );
        }
    }
    w.family(
        "oomtrace_site_info",
        "gauge",
        "Where each exported call site is: its culprit frame, file:line function.",
    );
    let mut seen = BTreeMap::new();
    for n in &named {
        for (id, loc) in &n.sites {
            seen.entry(id.as_str()).or_insert(loc.as_str());
        }
    }
    for (id, loc) in seen {
        w.sample(
            "oomtrace_site_info",
            &[("site", id), ("location", loc)],
            1.0,
        );
    }
    per_process(
        &mut w,
        &procs,
        "oomtrace_process_info",
        "gauge",
        "Each traced process: its launcher rank, local rank, world size and executable.",
        |w, p, pid, rank| {
            w.sample(
                "oomtrace_process_info",
                &[
                    ("pid", pid),
                    ("rank", rank),
                    ("local_rank", &opt(p.local_rank)),
                    ("world_size", &opt(p.world_size)),
                    ("exe", &p.exe),
                ],
                1.0,
            )
        },
    );
    per_process(
        &mut w,
        &procs,
        "oomtrace_process_running",
        "gauge",
        "1 while the process is connected, 0 once it ended (the last 64 ended stay exported).",
        |w, p, pid, rank| {
            w.sample(
                "oomtrace_process_running",
                &[("pid", pid), ("rank", rank)],
                if p.running { 1.0 } else { 0.0 },
            )
        },
    );
    let (write_failed, unwritten) = r.write_failure();
    let health: [(&str, &str, &str, f64); 8] = [
        (
            "oomtrace_collector_processes",
            "gauge",
            "Traced processes connected now.",
            r.connected.load(Ordering::Relaxed) as f64,
        ),
        (
            "oomtrace_collector_events_total",
            "counter",
            "Events received, all processes.",
            r.events.load(Ordering::Relaxed) as f64,
        ),
        (
            "oomtrace_collector_trace_write_failures_total",
            "counter",
            "Failures of the trace writer (it stops writing at the first: a full disk).",
            write_failed as f64,
        ),
        (
            "oomtrace_collector_unwritten_events_total",
            "counter",
            "Events received but not written to the trace file since the writer failed.",
            unwritten as f64,
        ),
        (
            "oomtrace_collector_resident_memory_bytes",
            "gauge",
            "The collector's resident memory.",
            resident_bytes() as f64,
        ),
        (
            "oomtrace_collector_start_time_seconds",
            "gauge",
            "When the collector started, Unix time.",
            r.start_time_s,
        ),
        (
            "oomtrace_collector_scrapes_total",
            "counter",
            "Times the metrics were rendered (HTTP scrapes and textfile writes), this one included.",
            r.scrapes.load(Ordering::Relaxed) as f64,
        ),
        (
            "oomtrace_collector_last_render_seconds",
            "gauge",
            "How long the previous rendering of the metrics took.",
            r.last_render_ns.load(Ordering::Relaxed) as f64 / 1e9,
        ),
    ];
    for (name, kind, help, v) in health {
        w.family(name, kind, help);
        w.sample(name, &[], v);
    }
    w.finish()
}

/// The collector's resident set, from `/proc/self/statm` (0 if unreadable).
fn resident_bytes() -> u64 {
    let pages = std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages.saturating_mul(if page > 0 { page as u64 } else { 4096 })
}

#[cfg(test)]
mod tests {
    use super::super::snapshot::{DeviceSnapshot, LeakRate, SiteLive};
    use super::*;
    use crate::model::SiteId;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape_label(r#"a\b"c"#), r#"a\\b\"c"#);
        assert_eq!(escape_label("x\ny"), "x\\ny");
        let mut w = Writer::new();
        w.family("m", "gauge", "h\\elp\nmore");
        w.sample("m", &[("exe", "/a \"b\"\n")], 1.5);
        w.sample("m", &[], f64::INFINITY);
        w.sample("m", &[], f64::NAN);
        assert_eq!(
            w.finish(),
            "# HELP m h\\\\elp\\nmore\n# TYPE m gauge\nm{exe=\"/a \\\"b\\\"\\n\"} 1.5\nm +Inf\nm NaN\n"
        );
    }

    #[test]
    fn every_family_has_help_and_type_once_and_samples_follow_them() {
        let r = Registry::new();
        r.publish(ProcessSnapshot {
            conn: 1,
            pid: 42,
            rank: Some(3),
            exe: "/bin/x\"y".into(),
            running: true,
            devices: vec![
                DeviceSnapshot {
                    device: "0".into(),
                    live_bytes: 100,
                    peak_bytes: 200,
                    allocations: 5,
                    frees: 4,
                    ..Default::default()
                },
                DeviceSnapshot {
                    device: "host".into(),
                    ..Default::default()
                },
            ],
            findings: vec![("leak", "likely", 2)],
            leak_rates: vec![LeakRate {
                device: "0".into(),
                site: SiteId(3),
                bytes_per_step: Some(1024.0),
                bytes_per_second: None,
            }],
            top_sites: vec![
                SiteLive {
                    device: "0".into(),
                    site: SiteId(3),
                    live_bytes: 100,
                },
                // The same code by another return address: one series, the sum.
                SiteLive {
                    device: "0".into(),
                    site: SiteId(4),
                    live_bytes: 20,
                },
                // Not named yet: left out.
                SiteLive {
                    device: "0".into(),
                    site: SiteId(5),
                    live_bytes: 7,
                },
            ],
            ..Default::default()
        });
        for site in [SiteId(3), SiteId(4)] {
            r.names
                .insert(1, site, ("0123456789ab".into(), "t.c:12 leak".into()));
        }
        let text = r.render();
        let mut families = std::collections::BTreeSet::new();
        let mut current = String::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let name = rest.split(' ').next().unwrap().to_string();
                assert!(families.insert(name.clone()), "{name} twice");
                current = name;
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let mut it = rest.split(' ');
                assert_eq!(it.next(), Some(current.as_str()));
                let kind = it.next().unwrap();
                assert!(kind == "gauge" || kind == "counter");
                assert_eq!(kind == "counter", current.ends_with("_total"), "{current}");
            } else {
                let name = line.split(['{', ' ']).next().unwrap();
                assert_eq!(name, current, "{line} outside its family");
            }
        }
        for line in [
            "oomtrace_live_bytes{pid=\"42\",rank=\"3\",device=\"0\"} 100",
            "oomtrace_live_bytes{pid=\"42\",rank=\"3\",device=\"host\"} 0",
            "oomtrace_allocations_total{pid=\"42\",rank=\"3\",device=\"0\"} 5",
            "oomtrace_findings{pid=\"42\",rank=\"3\",kind=\"leak\",level=\"likely\"} 2",
            "oomtrace_leak_rate_bytes_per_step{pid=\"42\",rank=\"3\",device=\"0\",site=\"0123456789ab\"} 1024",
            "oomtrace_site_info{site=\"0123456789ab\",location=\"t.c:12 leak\"} 1",
            "oomtrace_site_live_bytes{pid=\"42\",rank=\"3\",device=\"0\",site=\"0123456789ab\"} 120",
            "oomtrace_process_info{pid=\"42\",rank=\"3\",local_rank=\"\",world_size=\"\",exe=\"/bin/x\\\"y\"} 1",
            "oomtrace_process_running{pid=\"42\",rank=\"3\"} 1",
            "oomtrace_collector_scrapes_total 1",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing in:\n{text}");
        }
        assert!(!text.contains("oomtrace_leak_rate_bytes_per_second{"));
        assert_eq!(
            text.matches("oomtrace_site_live_bytes{").count(),
            1,
            "{text}"
        );
    }
}
