//! The collector side of docs/targets.md: ingest rate on one core, trace bytes per event, report
//! time for 10^7 events, and collector memory over 10^8 events; each beside a baseline taken
//! in the same run.
//!
//! `cargo bench -p oomtrace-tests --bench ingest` (env `EVENTS`, default 10^7; `BIG_EVENTS`,
//! default 10^8, for the memory run (0: skip it); `PROCESSES` (64) and `LIVE` (10^6) for the
//! collector's memory per traced process and per live allocation; `ONLY_PROCESSES=1` runs
//! only that). Prints `metric<TAB>value<TAB>baseline<TAB>target` lines, read by
//! `scripts/bench.sh`. The socket run is repeated with the metrics on (`--metrics`: snapshots
//! published by the connection, rendered every 100 ms), beside the run without.
//!
//! The stream is synthetic but shaped like a training loop: 64 call sites, 256 live
//! allocations recycled, a step marker every 1000 events, batches of 512 events, so the
//! detectors and the epoch clock do their real work.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use oomtrace_collector::analysis::Analysis;
use oomtrace_collector::metrics::{ProcessSnapshot, Registry};
use oomtrace_collector::model::trace::Trace;
use oomtrace_collector::model::Process;
use oomtrace_collector::report::{self, ReportOptions};
use oomtrace_collector::server::{Collector, Options};
use oomtrace_proto::trace_file::TraceReader;
use oomtrace_proto::wire::{self, encode, Frame, GoodbyeReason, Hello, Next};
use oomtrace_proto::{Api, Event, EventKind, StackId};
use oomtrace_tests::{oomtrace_bin, scratch};

const BATCH: u64 = 512;

/// Frames for events `from..to` of the synthetic stream (the first call adds the Hello and
/// the stack definitions).
fn stream(from: u64, to: u64, out: &mut Vec<u8>) {
    stream_of(4242, from, to, out)
}

/// [`stream`] of the process `pid`.
fn stream_of(pid: u32, from: u64, to: u64, out: &mut Vec<u8>) {
    if from == 0 {
        encode::hello(
            out,
            &Hello {
                pid,
                argv: vec!["synthetic".into()],
                ..Default::default()
            },
        );
        for s in 1..=64u32 {
            encode::stack_def(
                out,
                StackId(s),
                &[0x40_0000 + u64::from(s) * 64, 0x40_1000, 0x40_2000],
            );
        }
    }
    let mut i = from;
    while i < to {
        let end = (i + BATCH).min(to);
        let at = encode::begin_events(out);
        for n in i..end {
            // Pairs: even = alloc, odd = free of the same slot.
            let slot = (n / 2) % 256;
            let mut e = if n % 2 == 0 {
                let mut e = Event::new(EventKind::Alloc, Api::cudaMalloc);
                e.size = 4096 * (1 + (n / 2) % 64);
                e.stack = StackId(((n / 2) % 64) as u32 + 1);
                e
            } else {
                Event::new(EventKind::Free, Api::cudaFree)
            };
            e.ptr = 0x7000_0000_0000 + slot * 0x10_0000 + (n / 512) % 2;
            e.seq = n + 1;
            e.ts_ns = 1_000 + n * 100;
            e.device = 0;
            encode::push_event(out, &e);
        }
        encode::end_events(out, at);
        if end / 1000 != i / 1000 {
            encode::marker(out, end, 1_000 + end * 100, 1, StackId(0), "step");
        }
        i = end;
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn line(metric: &str, value: String, baseline: String, target: &str) {
    println!("{metric}\t{value}\t{baseline}\t{target}");
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// VmHWM of a process, in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    status_kib(pid, "VmHWM:")
}

/// One `/proc/PID/status` line's value, in KiB (0 if unreadable).
fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// Events per second through a collector thread's socket into `dir/ingest.oomt`; with
/// `metrics`, the connection publishes its snapshots and a thread renders them every 100 ms.
fn through_socket(dir: &std::path::Path, frames: &[u8], events: u64, metrics: bool) -> f64 {
    use std::sync::atomic::Ordering;
    use std::sync::Arc;
    let socket = dir.join("c.sock");
    let trace = dir.join("ingest.oomt");
    let _ = std::fs::remove_file(&trace);
    let mut opts = Options::new(socket.clone(), trace);
    opts.exit_when_idle = true;
    opts.idle_grace = Duration::from_millis(50);
    let registry = Arc::new(Registry::new());
    if metrics {
        opts.metrics = Some(registry.clone());
    }
    let collector = Collector::bind(opts).expect("collector");
    let stop = Arc::new(AtomicBool::new(false));
    let server = {
        let stop = stop.clone();
        std::thread::spawn(move || collector.serve(&stop))
    };
    let done = Arc::new(AtomicBool::new(false));
    let scraper = metrics.then(|| {
        let (done, registry) = (done.clone(), registry.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                let _ = registry.render();
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    });
    let t = Instant::now();
    let mut c = UnixStream::connect(&socket).expect("connect");
    c.write_all(&wire::stream_header()).unwrap();
    c.write_all(frames).unwrap();
    let mut bye = Vec::new();
    encode::goodbye(&mut bye, GoodbyeReason::Exit, events);
    c.write_all(&bye).unwrap();
    let mut ack = [0u8; 1];
    let _ = std::io::Read::read(&mut c, &mut ack);
    let rate = events as f64 / t.elapsed().as_secs_f64();
    server.join().expect("server").expect("serve");
    done.store(true, Ordering::Relaxed);
    if let Some(s) = scraper {
        s.join().expect("scraper");
    }
    if metrics {
        assert!(registry.render().contains("oomtrace_process_running{"));
    }
    rate
}

/// Seconds one render of the metrics takes for `n` processes (2 devices, 10 top sites and a
/// leak each), and its size in bytes.
fn render_cost(n: u32) -> (f64, usize) {
    use oomtrace_collector::metrics::snapshot::{DeviceSnapshot, LeakRate, SiteLive};
    use oomtrace_collector::model::SiteId;
    let r = Registry::new();
    for i in 0..n {
        for k in 0..10 {
            r.names.insert(
                i + 1,
                SiteId(k),
                (
                    format!("{:012x}", u64::from(i * 100 + k) * 7919),
                    format!("/home/u/model/layer_{k}.py:{} forward", 100 + k),
                ),
            );
        }
        r.publish(ProcessSnapshot {
            conn: i + 1,
            pid: 10_000 + i,
            rank: Some(i),
            local_rank: Some(i % 8),
            world_size: Some(n),
            exe: "/usr/bin/python3.11".into(),
            running: true,
            events: 1 << 30,
            lost_events: 0,
            devices: ["0", "host"]
                .iter()
                .map(|d| DeviceSnapshot {
                    device: d.to_string(),
                    live_bytes: 1 << 33,
                    peak_bytes: 1 << 34,
                    reserved_bytes: 1 << 33,
                    allocations: 123_456_789,
                    frees: 123_456_700,
                })
                .collect(),
            findings: vec![("leak", "confirmed", 1), ("device_growth", "likely", 1)],
            leak_rates: vec![LeakRate {
                device: "0".into(),
                site: SiteId(0),
                bytes_per_step: Some(4_194_304.0),
                bytes_per_second: Some(1.5e7),
            }],
            top_sites: (0..10)
                .map(|k| SiteLive {
                    device: "0".into(),
                    site: SiteId(k),
                    live_bytes: 1 << 20,
                })
                .collect(),
        });
    }
    let mut times = Vec::new();
    let mut len = 0;
    for _ in 0..11 {
        let t = Instant::now();
        len = r.render().len();
        times.push(t.elapsed().as_secs_f64());
    }
    (median(times), len)
}

/// A real `oomtrace collect` on a socket in `dir`, once it listens.
fn spawn_collector(dir: &std::path::Path, name: &str) -> (std::process::Child, std::path::PathBuf) {
    let socket = dir.join(format!("{name}.sock"));
    let child = std::process::Command::new(oomtrace_bin())
        .args(["collect", "--quiet", "--socket"])
        .arg(&socket)
        .arg("--output")
        .arg(dir.join(format!("{name}.oomt")))
        .spawn()
        .expect("oomtrace collect");
    while UnixStream::connect(&socket).is_err() {
        std::thread::sleep(Duration::from_millis(10));
    }
    (child, socket)
}

/// Waits until the collector has taken everything sent (its RSS stops moving) and returns it.
fn settled_rss_kib(pid: u32) -> u64 {
    let mut last = status_kib(pid, "VmRSS:");
    loop {
        std::thread::sleep(Duration::from_millis(300));
        let now = status_kib(pid, "VmRSS:");
        if now == last {
            return now;
        }
        last = now;
    }
}

/// 5. What one more traced process costs a collector: `PROCESSES` synthetic processes (64
///    call sites, 256 live allocations, 20,000 events each) connected at once to one real
///    `oomtrace collect`; baseline: the collector with one. Then what a live allocation costs:
///    one process that allocates `LIVE` and frees none; baseline: the same collector before.
fn memory_per_process() {
    let n = env_u64("PROCESSES", 64).max(2) as u32;
    let live = env_u64("LIVE", 1_000_000);
    let dir = scratch("ingest-processes");
    let (mut child, socket) = spawn_collector(&dir, "many");
    let mut conns = Vec::new();
    let mut one = 0;
    for i in 0..n {
        let mut c = UnixStream::connect(&socket).expect("connect");
        let mut buf = Vec::new();
        stream_of(10_000 + i, 0, 20_000, &mut buf);
        c.write_all(&wire::stream_header()).unwrap();
        c.write_all(&buf).unwrap();
        conns.push(c);
        if i == 0 {
            one = settled_rss_kib(child.id());
        }
    }
    let all = settled_rss_kib(child.id());
    line(
        "collector_kib_per_process",
        format!("{:.0}", (all - one) as f64 / f64::from(n - 1)),
        format!("{one}"),
        &format!("(baseline: collector RSS KiB with 1 process; {all} KiB with {n})"),
    );
    // Live allocations: one more process that only allocates, at distinct addresses.
    let before = all;
    let mut c = UnixStream::connect(&socket).expect("connect");
    c.write_all(&wire::stream_header()).unwrap();
    let mut buf = Vec::new();
    encode::hello(
        &mut buf,
        &Hello {
            pid: 99_999,
            ..Default::default()
        },
    );
    encode::stack_def(&mut buf, StackId(1), &[0x40_0000, 0x40_1000]);
    let mut sent = 0;
    while sent < live {
        let at = encode::begin_events(&mut buf);
        for k in sent..(sent + BATCH).min(live) {
            let mut e = Event::new(EventKind::Alloc, Api::cudaMalloc);
            e.ptr = 0x7000_0000_0000 + k * 512;
            e.size = 512;
            e.stack = StackId(1);
            e.seq = k + 1;
            e.ts_ns = 1_000 + k * 100;
            e.device = 0;
            encode::push_event(&mut buf, &e);
        }
        encode::end_events(&mut buf, at);
        sent = (sent + BATCH).min(live);
        if buf.len() > 1 << 20 {
            c.write_all(&buf).unwrap();
            buf.clear();
        }
    }
    c.write_all(&buf).unwrap();
    let after = settled_rss_kib(child.id());
    line(
        "collector_bytes_per_live_allocation",
        format!("{:.0}", (after - before) as f64 * 1024.0 / live as f64),
        format!("{before}"),
        &format!("(baseline: collector RSS KiB before; {after} KiB with {live} live)"),
    );
    drop(c);
    drop(conns);
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

fn main() {
    if env_u64("ONLY_PROCESSES", 0) == 1 {
        memory_per_process();
        return;
    }
    for n in [64, 1000] {
        let (secs, bytes) = render_cost(n);
        line(
            &format!("metrics_render_ms_for_{n}_processes"),
            format!("{:.2}", secs * 1e3),
            "-".into(),
            &format!("({bytes} bytes of text; a scrape renders once)"),
        );
    }
    let events = env_u64("EVENTS", 10_000_000);
    let mut frames = Vec::with_capacity(events as usize * 66);
    stream(0, events, &mut frames);

    // 1. Ingest on one core: decode + per-process state + detectors; baseline: decode only.
    let (mut decode, mut ingest) = (Vec::new(), Vec::new());
    let mut last = None;
    for _ in 0..3 {
        let t = Instant::now();
        let mut used = 0;
        let mut n = 0u64;
        while let Ok(Next::Frame(f, len)) = wire::next_frame(&frames[used..]) {
            if let Frame::Events(b) = f {
                n += b.iter().count() as u64;
            }
            used += len;
        }
        assert_eq!(n, events);
        decode.push(events as f64 / t.elapsed().as_secs_f64());
        let t = Instant::now();
        let mut p: Option<(Process, Analysis)> = None;
        let mut used = 0;
        while let Ok(Next::Frame(f, len)) = wire::next_frame(&frames[used..]) {
            match (&f, p.as_mut()) {
                (Frame::Hello(h), None) => {
                    p = Some((Process::new(1, h.clone()), Analysis::default()))
                }
                (_, Some((p, a))) => p.apply(&f, a),
                _ => {}
            }
            used += len;
        }
        ingest.push(events as f64 / t.elapsed().as_secs_f64());
        let (p, a) = p.expect("process");
        assert_eq!(p.events, events);
        last = Some((p, a));
    }
    // What a connection spends on the metrics every 500 ms: one snapshot of its process.
    if let Some((p, a)) = &last {
        let registry = Registry::new();
        let mut asked = oomtrace_collector::metrics::Asked::default();
        let mut times = Vec::new();
        for _ in 0..11 {
            let t = Instant::now();
            let s = ProcessSnapshot::of(p, a, &registry.names, &mut asked);
            times.push(t.elapsed().as_secs_f64());
            assert!(!s.devices.is_empty());
        }
        line(
            "metrics_snapshot_us_per_publication",
            format!("{:.1}", median(times) * 1e6),
            "-".into(),
            "(at most every 500 ms per connection)",
        );
    }
    line(
        "ingest_events_per_s",
        format!("{:.0}", median(ingest)),
        format!("{:.0}", median(decode)),
        ">= 5000000",
    );

    // 2. Through the socket into a trace file (a collector thread; this thread is the client);
    //    then again with the metrics on and a scraper rendering them every 100 ms (their
    //    snapshots must not slow the connection down).
    let dir = scratch("ingest");
    let trace = dir.join("ingest.oomt");
    // Alternated, three of each, medians: the machine's noise falls on both.
    let (mut without, mut with) = (Vec::new(), Vec::new());
    let mut size = 0;
    for _ in 0..3 {
        without.push(through_socket(&dir, &frames, events, false));
        size = std::fs::metadata(&trace).expect("trace").len();
        with.push(through_socket(&dir, &frames, events, true));
    }
    let (socket_rate, with_metrics) = (median(without), median(with));
    line(
        "socket_ingest_events_per_s",
        format!("{socket_rate:.0}"),
        "-".into(),
        ">= 5000000",
    );
    line(
        "socket_ingest_events_per_s_with_metrics",
        format!("{with_metrics:.0}"),
        format!("{socket_rate:.0}"),
        "(baseline: the same without --metrics)",
    );
    line(
        "trace_bytes_per_event",
        format!("{:.1}", size as f64 / events as f64),
        format!("{:.1}", frames.len() as f64 / events as f64),
        "(baseline: uncompressed wire bytes)",
    );

    // 3. Report time for the trace; baseline: reading its records without replay.
    let (mut read, mut rep) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        let t = Instant::now();
        let mut r = TraceReader::new(std::fs::File::open(&trace).unwrap()).unwrap();
        while r.next_record().unwrap().is_some() {}
        read.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        let tr = Trace::<Analysis>::load(&trace).expect("load");
        let _ = report::build(
            &tr,
            &ReportOptions {
                top: 10,
                path: String::new(),
                symbolize: false,
            },
        );
        rep.push(t.elapsed().as_secs_f64());
    }
    line(
        &format!("report_s_for_{events}_events"),
        format!("{:.2}", median(rep)),
        format!("{:.2}", median(read)),
        "(baseline: reading the file only)",
    );
    let _ = std::fs::remove_dir_all(&dir);

    memory_per_process();

    // 4. Collector memory over BIG_EVENTS through the real `oomtrace collect` process;
    //    baseline: its memory after the first 1 % of them.
    let big = env_u64("BIG_EVENTS", 100_000_000);
    if big == 0 {
        return;
    }
    let dir = scratch("ingest-big");
    let (mut child, socket) = spawn_collector(&dir, "big");
    let mut c = UnixStream::connect(&socket).expect("connect");
    c.write_all(&wire::stream_header()).unwrap();
    let chunk = 1_000_000;
    let mut buf = Vec::with_capacity(chunk as usize * 66);
    let mut early = 0;
    let t = Instant::now();
    let mut sent = 0;
    while sent < big {
        buf.clear();
        let to = (sent + chunk).min(big);
        stream(sent, to, &mut buf);
        c.write_all(&buf).unwrap();
        sent = to;
        if early == 0 && sent >= big / 100 {
            std::thread::sleep(Duration::from_millis(200));
            early = peak_rss_kib(child.id());
        }
    }
    buf.clear();
    encode::goodbye(&mut buf, GoodbyeReason::Exit, big);
    c.write_all(&buf).unwrap();
    let _ = std::io::Read::read(&mut c, &mut [0u8; 1]);
    let peak = peak_rss_kib(child.id());
    let secs = t.elapsed().as_secs_f64();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    line(
        &format!("collector_peak_rss_kib_for_{big}_events"),
        format!("{peak}"),
        format!("{early}"),
        &format!(
            "bounded (baseline: after 1 %; {:.1} M events/s through the process)",
            big as f64 / secs / 1e6
        ),
    );
}
