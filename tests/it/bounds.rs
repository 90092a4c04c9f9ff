//! Bounded work on any input: numbers a process claims (world size, rank, devices) and traces
//! crafted to make the readers work (`report`, `view`, `export`, `diff`) cost what the trace
//! holds, never what it says; `report DIR` with members that are not traces.
//!
//! The bounds asserted are generous (20 s, 200 MiB for a debug build on a loaded machine):
//! before, these inputs took minutes and gigabytes.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use oomtrace_proto::trace_file as tf;
use oomtrace_proto::wire::{encode, GoodbyeReason, Hello, Lost};
use oomtrace_proto::{Api, Event, EventKind, StackId};
use oomtrace_tests::*;
use serde_json::Value;

use crate::output::{synthetic_trace, Ending};

/// What one command may take here, at most.
const LIMIT: Duration = Duration::from_secs(20);
/// ... and how much memory (its maximum resident set).
const MAX_RSS_KIB: i64 = 200 << 10;

/// What a bounded command did.
struct Measured {
    code: Option<i32>,
    stdout: Vec<u8>,
    stderr: String,
    took: Duration,
    max_rss_kib: i64,
}

/// Runs `cmd` to its end, killed (and the test failed) past [`LIMIT`] x 3; its time and its
/// maximum resident set, its own: measured by the `peak_rss` scenario, which runs it. (wait4's
/// rusage of a child of this test binary counts the test binary's resident set too: Linux
/// keeps the larger of the old image's and the new one's at exec, and this binary holds
/// hundreds of MiB while another test reads a report of 10^7 allocations.)
#[allow(clippy::zombie_processes)] // reaped by waitpid
fn measured(cmd: Command) -> Measured {
    let rss_dir = scratch("peak_rss");
    let rss_file = rss_dir.join("kib");
    let mut cmd = through_peak_rss(&cmd, &rss_file);
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let start = Instant::now();
    let mut child = cmd.spawn().expect("spawn");
    let pid = child.id() as libc::pid_t;
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        v
    });
    let err_reader = std::thread::spawn(move || {
        let mut v = String::new();
        let _ = err.read_to_string(&mut v);
        v
    });
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watch = {
        let done = done.clone();
        std::thread::spawn(move || {
            while start.elapsed() < LIMIT * 3 {
                if done.load(std::sync::atomic::Ordering::Relaxed) {
                    return false;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            // SAFETY: kill has no memory preconditions; the pid is our child, not yet reaped
            // (the waitpid below reaps it only once it ended). Its own child, the command,
            // dies with it (`peak_rss` asks for that signal).
            unsafe { libc::kill(pid, libc::SIGKILL) };
            true
        })
    };
    let mut status = 0;
    // SAFETY: waits for our own child, writing into the local above.
    let rc = unsafe { libc::waitpid(pid, &mut status, 0) };
    assert_eq!(rc, pid, "waitpid");
    let took = start.elapsed();
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let killed = watch.join().unwrap();
    assert!(!killed, "{cmd:?} was killed after {:?}", LIMIT * 3);
    let stderr = err_reader.join().unwrap();
    let max_rss_kib = std::fs::read_to_string(&rss_file)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("{cmd:?}: peak_rss wrote no figure ({status:#x})\n{stderr}"));
    Measured {
        code: libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status)),
        stdout: reader.join().unwrap(),
        stderr,
        took,
        max_rss_kib,
    }
}

/// `cmd` run by the `peak_rss` scenario (same arguments, environment and directory), which
/// writes its maximum resident set to `rss_file`.
fn through_peak_rss(cmd: &Command, rss_file: &Path) -> Command {
    let mut wrapped = Command::new(scenario("peak_rss"));
    wrapped.arg(cmd.get_program()).args(cmd.get_args());
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => wrapped.env(k, v),
            None => wrapped.env_remove(k),
        };
    }
    if let Some(dir) = cmd.get_current_dir() {
        wrapped.current_dir(dir);
    }
    wrapped.env("PEAK_RSS_FILE", rss_file).stdin(Stdio::null());
    wrapped
}

/// `oomtrace ARGS...`, measured; it must succeed within the bounds.
fn bounded(what: &str, args: &[&std::ffi::OsStr]) -> Measured {
    let mut cmd = base_command(oomtrace_bin());
    cmd.args(args);
    let m = measured(cmd);
    assert_eq!(m.code, Some(0), "{what}: {}", m.stderr);
    assert!(m.took < LIMIT, "{what} took {:?}", m.took);
    assert!(
        m.max_rss_kib < MAX_RSS_KIB,
        "{what} used {} MiB",
        m.max_rss_kib >> 10
    );
    m
}

fn os(s: &str) -> &std::ffi::OsStr {
    std::ffi::OsStr::new(s)
}

/// A crafted one-process trace that claims `devices` devices: on each device a memory
/// reading and an allocation, a step marker after every `per_step` devices (so that per-step
/// work over every device seen so far adds up to devices² / per_step), then an out-of-memory
/// failure on each with its reading, and the free; a loss report naming 255 devices. About
/// 2 MB for 32,767 devices.
pub fn many_devices_trace(path: &Path, devices: i16, per_step: i16) {
    let mut f = std::io::BufWriter::new(File::create(path).expect("create the trace"));
    tf::write_header(&mut f, 1, "crafted").unwrap();
    tf::write_conn_open(&mut f, 1, 1, 1).unwrap();
    let mut frames = Vec::new();
    encode::hello(
        &mut frames,
        &Hello {
            pid: 4343,
            argv: vec!["many-devices".into()],
            ..Default::default()
        },
    );
    for s in 1..=64u32 {
        encode::stack_def(
            &mut frames,
            StackId(s),
            &[0x40_0000 + u64::from(s) * 64, 0x40_1000],
        );
    }
    let seq = std::cell::Cell::new(0u64);
    let event = |kind, api, device: i16, ptr: u64, size: u64| {
        seq.set(seq.get() + 1);
        let mut e = Event::new(kind, api);
        e.seq = seq.get();
        e.ts_ns = 1_000 + seq.get() * 1_000;
        e.device = device;
        e.ptr = ptr;
        e.size = size;
        e.tid = 1;
        e.stack = StackId((device as u32 % 64) + 1);
        e
    };
    let flush = |frames: &mut Vec<u8>, f: &mut std::io::BufWriter<File>| {
        tf::write_chunk(f, 1, frames, true).unwrap();
        frames.clear();
    };
    for d in 0..devices {
        let ptr = 0x7000_0000_0000 + u64::from(d as u16) * 0x1000_0000;
        let at = encode::begin_events(&mut frames);
        let info = event(
            EventKind::MemInfo,
            Api::cuMemGetInfo_v2,
            d,
            80 << 30,
            80 << 30,
        );
        encode::push_event(&mut frames, &info);
        let alloc = event(EventKind::Alloc, Api::cudaMalloc, d, ptr, 1 << 20);
        encode::push_event(&mut frames, &alloc);
        encode::end_events(&mut frames, at);
        if d % per_step == per_step - 1 {
            let ts = 1_000 + seq.get() * 1_000;
            encode::marker(&mut frames, seq.get(), ts, 1, StackId(0), "step");
        }
        if frames.len() > 1 << 20 {
            flush(&mut frames, &mut f);
        }
    }
    for d in 0..devices {
        let ptr = 0x7000_0000_0000 + u64::from(d as u16) * 0x1000_0000;
        let at = encode::begin_events(&mut frames);
        let mut oom = event(EventKind::AllocFailed, Api::cudaMalloc, d, 0, 1 << 40);
        oom.result = 2;
        encode::push_event(&mut frames, &oom);
        let info = event(
            EventKind::MemInfo,
            Api::cuMemGetInfo_v2,
            d,
            1 << 30,
            80 << 30,
        );
        encode::push_event(&mut frames, &info);
        let free = event(EventKind::Free, Api::cudaFree, d, ptr, 0);
        encode::push_event(&mut frames, &free);
        encode::end_events(&mut frames, at);
        if frames.len() > 1 << 20 {
            flush(&mut frames, &mut f);
        }
    }
    encode::lost(
        &mut frames,
        &Lost {
            events: 255,
            by_device: (0..255).map(|d| (d * 128, 1)).collect(),
            ..Default::default()
        },
    );
    encode::goodbye(&mut frames, GoodbyeReason::Exit, seq.get());
    flush(&mut frames, &mut f);
    tf::write_conn_close(&mut f, 1, 2, tf::CloseReason::Clean, "").unwrap();
    tf::write_end(&mut f, 3, 1).unwrap();
    f.flush().unwrap();
}

/// Two ranks of `rank_job`, each under `oomtrace run` writing `rank<N>.oomt` into `dir`,
/// with `env` and `args`; `run` itself must stay within the bounds.
fn two_ranks(dir: &Path, env: &[(&str, &str)], args: &[&str]) -> Vec<PathBuf> {
    (0..2)
        .map(|rank| {
            let trace = dir.join(format!("rank{rank}.oomt"));
            let mut cmd = base_command(oomtrace_bin());
            cmd.current_dir(dir)
                .arg("run")
                .arg("-o")
                .arg(&trace)
                .arg("--")
                .arg(scenario("rank_job"))
                .args(args)
                .env("RANK", rank.to_string())
                // One job: its traces merge into one report with a rank table.
                .env("SLURM_JOB_ID", "7")
                .env("SIMCUDA_MEMORY", "4GiB");
            for (k, v) in env {
                cmd.env(k, v);
            }
            let m = measured(cmd);
            assert_eq!(m.code, Some(0), "rank {rank}: {}", m.stderr);
            assert!(m.took < LIMIT, "run took {:?}", m.took);
            assert!(
                m.max_rss_kib < MAX_RSS_KIB,
                "run used {} KiB",
                m.max_rss_kib
            );
            trace
        })
        .collect()
}

/// report (text and JSON), view and diff of a two-rank job whose world size is `said`: each
/// within the bounds, with small output, the world size unknown and said to be implausible.
fn assert_world_size_is_unknown(dir: &Path, traces: &[PathBuf], said: u64) {
    let t: Vec<&std::ffi::OsStr> = traces.iter().map(|p| p.as_os_str()).collect();
    let json = bounded(
        "report --json",
        &[&[os("report"), os("--json")], &t[..]].concat(),
    );
    assert!(json.stdout.len() < 1 << 20, "{} bytes", json.stdout.len());
    let r: Value = serde_json::from_slice(&json.stdout).unwrap();
    let ranks = &r["ranks"];
    assert!(ranks["world_size"].is_null(), "{ranks}");
    assert_eq!(ranks["implausible_world_size"], said, "{ranks}");
    assert_eq!(ranks["missing_count"], 0, "{ranks}");
    assert_eq!(ranks["missing"].as_array().unwrap().len(), 0);
    assert_eq!(ranks["rows"].as_array().unwrap().len(), 2);
    for p in processes(&r) {
        assert!(p["world_size"].is_null(), "{p}");
        assert_eq!(p["implausible_world_size"], said, "{p}");
    }
    let text = bounded("report", &[&[os("report")], &t[..]].concat());
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(text.len() < 1 << 20, "{} bytes", text.len());
    assert!(
        text.lines().all(|l| l.len() < 1000),
        "a line of the report is long"
    );
    assert!(
        text.contains(&format!(
            "Ranks (2; world size unknown: {said} is implausible"
        )),
        "{text}"
    );
    assert!(text.contains("(rank 1, world size implausible)"), "{text}");
    let page = dir.join("view.html");
    bounded("view", &[os("view"), t[0], os("-o"), page.as_os_str()]);
    assert!(std::fs::metadata(&page).unwrap().len() < 4 << 20);
    let diff = bounded("diff", &[os("diff"), t[0], t[1]]);
    assert!(diff.stdout.len() < 1 << 20);
}

#[test]
fn a_world_of_four_billion_ranks_is_unknown() {
    let dir = scratch("bounds_world");
    let traces = two_ranks(&dir, &[("WORLD_SIZE", "4000000000")], &[]);
    assert_world_size_is_unknown(&dir, &traces, 4_000_000_000);
}

#[test]
fn oomtrace_set_rank_with_int_max_is_unknown() {
    let dir = scratch("bounds_set_rank");
    let traces = two_ranks(&dir, &[], &["say_world=2147483647"]);
    assert_world_size_is_unknown(&dir, &traces, i32::MAX as u64);
}

/// The largest world believed (2^20 ranks) with two present: the missing ranks are counted,
/// and only the first of them listed.
#[test]
fn missing_ranks_are_counted_not_listed() {
    let dir = scratch("bounds_missing");
    let traces = two_ranks(&dir, &[("WORLD_SIZE", "1048576")], &[]);
    let t: Vec<&std::ffi::OsStr> = traces.iter().map(|p| p.as_os_str()).collect();
    let json = bounded(
        "report --json",
        &[&[os("report"), os("--json")], &t[..]].concat(),
    );
    let r: Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(r["ranks"]["world_size"], 1 << 20);
    assert_eq!(r["ranks"]["missing_count"], (1 << 20) - 2);
    let listed = r["ranks"]["missing"].as_array().unwrap();
    assert_eq!(listed.len(), 64);
    assert_eq!(listed[0], 2);
    let text = bounded("report", &[&[os("report")], &t[..]].concat());
    let text = String::from_utf8(text.stdout).unwrap();
    // One sentence, wrapped at 200 characters like every line of the text report.
    let at = find_wrapped(&text, "no trace holds 1048574 ranks: 2, 3, 4,")
        .unwrap_or_else(|| panic!("{text}"));
    let sentence = &text[at..];
    let end = find_wrapped(sentence, "and 1048510 more").unwrap_or_else(|| panic!("{text}"));
    assert!(
        !sentence[..end].contains("\n\n") && sentence[end..].starts_with("and 1048510 more\n"),
        "{text}"
    );
    assert!(text.lines().all(|l| l.chars().count() <= 200), "{text}");
}

#[test]
fn a_trace_claiming_32767_devices_costs_what_it_holds() {
    let dir = scratch("bounds_devices");
    let trace = dir.join("devices.oomt");
    many_devices_trace(&trace, i16::MAX, 8);
    let size = std::fs::metadata(&trace).unwrap().len();
    assert!((1 << 20..4 << 20).contains(&size), "{size} bytes");
    let t = trace.as_os_str();
    let json = bounded("report --json", &[os("report"), os("--json"), t]);
    let r: Value = serde_json::from_slice(&json.stdout).unwrap();
    let p = processes(&r)[0];
    let devices = p["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 64, "the plausible devices are accounted");
    assert_eq!(device(p, 63)["peak_bytes"], 1 << 20);
    let warnings = r["trace"]["warnings"].to_string();
    assert!(
        warnings.contains("events name a device no process has (the first: device 64"),
        "{warnings}"
    );
    let text = bounded("report", &[os("report"), t]);
    assert!(text.stdout.len() < 4 << 20, "{} bytes", text.stdout.len());
    let page = dir.join("view.html");
    bounded("view", &[os("view"), t, os("-o"), page.as_os_str()]);
    assert!(std::fs::metadata(&page).unwrap().len() < 8 << 20);
    let chrome = dir.join("chrome.json");
    bounded(
        "export chrome",
        &[
            os("export"),
            os("--format"),
            os("chrome"),
            os("-o"),
            chrome.as_os_str(),
            t,
        ],
    );
    assert!(std::fs::metadata(&chrome).unwrap().len() < 8 << 20);
    let diff = bounded("diff", &[os("diff"), t, t]);
    assert!(diff.stdout.len() < 1 << 20);
}

/// Counter samples of a Chrome export: (name, ts, live bytes), in file order.
fn counters(path: &Path) -> (Value, Vec<(String, f64, u64)>) {
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let c = doc["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "C")
        .map(|e| {
            (
                e["name"].as_str().unwrap().to_string(),
                e["ts"].as_f64().unwrap(),
                e["args"]["live_bytes"].as_u64().unwrap(),
            )
        })
        .collect();
    (doc, c)
}

#[test]
fn the_chrome_export_is_coalesced_unless_all_samples() {
    let dir = scratch("bounds_chrome");
    let trace = dir.join("big.oomt");
    const EVENTS: u64 = 100_000;
    synthetic_trace(&trace, EVENTS, 1000, true, Ending::Complete);
    let t = trace.as_os_str();
    let (coalesced, all) = (dir.join("coalesced.json"), dir.join("all.json"));
    let c = bounded(
        "export chrome",
        &[
            os("export"),
            os("--format"),
            os("chrome"),
            os("-o"),
            coalesced.as_os_str(),
            t,
        ],
    );
    assert!(c.stderr.contains("--all-samples keeps all"), "{}", c.stderr);
    bounded(
        "export chrome --all-samples",
        &[
            os("export"),
            os("--format"),
            os("chrome"),
            os("--all-samples"),
            os("-o"),
            all.as_os_str(),
            t,
        ],
    );
    let (doc_c, few) = counters(&coalesced);
    let (doc_a, every) = counters(&all);
    let device = |v: &[(String, f64, u64)]| -> Vec<(f64, u64)> {
        v.iter()
            .filter(|(n, _, _)| n == "cuda:0")
            .map(|(_, t, b)| (*t, *b))
            .collect()
    };
    let (dc, da) = (device(&few), device(&every));
    // Every event changes the device's total: all of them with --all-samples; at most two
    // per bucket by default.
    assert!(da.len() as u64 >= EVENTS - 1, "{}", da.len());
    assert!(dc.len() <= 2 * 2000, "{}", dc.len());
    assert!(few.len() <= 2 * 2000 * 10, "{}", few.len());
    // The peak and the end are exact; time goes forward.
    let max = |v: &[(f64, u64)]| v.iter().map(|x| x.1).max();
    assert_eq!(max(&dc), max(&da));
    assert_eq!(dc.last().unwrap().1, da.last().unwrap().1);
    assert!(dc.windows(2).all(|w| w[0].0 <= w[1].0));
    let (size_c, size_a) = (
        std::fs::metadata(&coalesced).unwrap().len(),
        std::fs::metadata(&all).unwrap().len(),
    );
    assert!(
        size_c < 2 << 20 && size_c * 4 < size_a,
        "{size_c} vs {size_a}"
    );
    // Markers: one per 1000 events, all kept (under the bound) either way.
    let markers = |d: &Value| {
        d["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["ph"] == "i" && e["name"] == "step")
            .count()
    };
    assert_eq!(markers(&doc_c), markers(&doc_a));
    assert!(
        doc_c["otherData"]["left_out"]["counter_samples"]
            .as_u64()
            .unwrap()
            > 0
    );
    assert_eq!(doc_a["otherData"]["left_out"]["counter_samples"], 0);
}

/// `report DIR` whose members include a corrupt trace, a FIFO and a link to /dev/zero: each
/// named in one line, the others reported, exit 1 (a report, but not of everything).
#[test]
fn a_directory_names_each_member_it_cannot_read() {
    let dir = scratch("bounds_dir");
    // Traces of one job (copies of one trace would be refused: the same processes twice).
    const GOOD: usize = 6;
    for i in 0..GOOD {
        let rank = i.to_string();
        let env = [
            ("SLURM_JOB_ID", "4243"),
            ("SLURM_PROCID", rank.as_str()),
            ("SLURM_NTASKS", "6"),
        ];
        let t = run_traced("runtime_basic", &[], &env);
        std::fs::copy(&t.trace, dir.join(format!("good{i:02}.oomt"))).unwrap();
    }
    let good = std::fs::read(dir.join("good00.oomt")).unwrap();
    let mut bad = good.clone();
    let n = bad.len();
    for b in &mut bad[n / 2..n / 2 + 64] {
        *b ^= 0x5a;
    }
    std::fs::write(dir.join("corrupt.oomt"), &bad).unwrap();
    let fifo = dir.join("fifo.oomt");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
    std::os::unix::fs::symlink("/dev/zero", dir.join("zero.oomt")).unwrap();

    let mut cmd = base_command(oomtrace_bin());
    cmd.arg("report").arg(&*dir);
    let m = measured(cmd);
    assert_eq!(m.code, Some(1), "{}", m.stderr);
    let skipped: Vec<&str> = m.stderr.lines().filter(|l| l.contains("skipped")).collect();
    assert_eq!(skipped.len(), 3, "{}", m.stderr);
    for (name, why) in [
        ("corrupt.oomt", "corrupt"),
        ("fifo.oomt", "it is a FIFO, not a trace file"),
        ("zero.oomt", "it is a character device, not a trace file"),
    ] {
        let line = skipped
            .iter()
            .find(|l| l.contains(name))
            .unwrap_or_else(|| panic!("{name} not named: {}", m.stderr));
        assert!(line.starts_with("oomtrace: skipped "), "{line}");
        assert!(line.contains(why), "{line}");
        assert_eq!(line.matches(name).count(), 1, "{line}");
    }
    let text = String::from_utf8(m.stdout).unwrap();
    assert!(text.contains(&format!("Processes ({GOOD})")), "{text}");
    assert!(text.contains("(skipped "), "{text}");

    let mut cmd = base_command(oomtrace_bin());
    cmd.args(["report", "--json"]).arg(&*dir);
    let m = measured(cmd);
    assert_eq!(m.code, Some(1), "{}", m.stderr);
    let r: Value = serde_json::from_slice(&m.stdout).unwrap();
    assert_eq!(r["traces"].as_array().unwrap().len(), GOOD);
    let skipped = r["skipped"].as_array().unwrap();
    assert_eq!(skipped.len(), 3, "{skipped:?}");
    assert!(skipped
        .iter()
        .all(|s| s["reason"].as_str().is_some_and(|r| !r.is_empty())));
    assert!(fifo.exists(), "the FIFO is left as it was");
}

/// `diff` names a file it cannot read once, not twice.
#[test]
fn diff_names_the_bad_file_once() {
    let dir = scratch("bounds_diff");
    let traced = run_traced("runtime_basic", &[], &[]);
    let good = &traced.trace;
    let mut bytes = std::fs::read(good).unwrap();
    let n = bytes.len();
    for b in &mut bytes[n / 2..n / 2 + 64] {
        *b ^= 0x5a;
    }
    let flipped = dir.join("flipped.oomt");
    std::fs::write(&flipped, &bytes).unwrap();
    let garbage = dir.join("garbage.oomt");
    std::fs::write(&garbage, b"not a trace").unwrap();
    for bad in [&flipped, &garbage, &dir.join("missing.oomt")] {
        let mut cmd = base_command(oomtrace_bin());
        cmd.arg("diff").arg(good).arg(bad);
        let out = output_within(cmd, TIMEOUT);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        let name = bad.file_name().unwrap().to_str().unwrap();
        assert_eq!(err.matches(name).count(), 1, "{err}");
    }
}
