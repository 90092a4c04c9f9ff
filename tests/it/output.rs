//! What oomtrace writes when the output misbehaves: device nodes, symlinks, FIFOs, a full or
//! closed standard output, an export that fails half-way; reports of incomplete traces that
//! say why; progress on a terminal only.
//!
//! Device nodes are made with `mknod` in each test's private directory (never the system's
//! `/dev`): that needs root, which CI has; without it these tests fail and say so.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Instant;

use oomtrace_proto::trace_file as tf;
use oomtrace_proto::wire::{encode, GoodbyeReason, Hello};
use oomtrace_proto::{Api, Event, EventKind, StackId};
use oomtrace_tests::*;

/// How a synthetic trace ends.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// Goodbye, connection closed, end record: a complete trace.
    Complete,
    /// The connection closed (abruptly) but no end record: the collector never finished.
    NoEndRecord,
}

/// A synthetic one-process trace: `live` allocations that are never freed, then alloc/free
/// pairs over 256 recycled slots up to `events` events, 64 call sites, a step marker every
/// 1000 events (the shape of tests/benches/ingest.rs). `compress`: LZ4 chunks as the collector
/// writes them (smaller, slower to write in a debug build).
pub fn synthetic_trace(path: &Path, events: u64, live: u64, compress: bool, ending: Ending) {
    let mut f = std::io::BufWriter::new(File::create(path).expect("create the trace"));
    tf::write_header(&mut f, 1, "synthetic").unwrap();
    tf::write_conn_open(&mut f, 1, 1, 1).unwrap();
    let mut frames = Vec::new();
    encode::hello(
        &mut frames,
        &Hello {
            pid: 4242,
            argv: vec!["synthetic".into()],
            ..Default::default()
        },
    );
    for s in 1..=64u32 {
        encode::stack_def(
            &mut frames,
            StackId(s),
            &[0x40_0000 + u64::from(s) * 64, 0x40_1000, 0x40_2000],
        );
    }
    const BATCH: u64 = 512;
    let mut n = 0;
    while n < events {
        let end = (n + BATCH).min(events);
        let at = encode::begin_events(&mut frames);
        for i in n..end {
            let mut e = if i < live {
                let mut e = Event::new(EventKind::Alloc, Api::cudaMalloc);
                e.ptr = 0x1000_0000_0000 + i * 0x1000;
                e.size = 4096;
                e.stack = StackId((i % 64) as u32 + 1);
                e
            } else {
                let k = i - live;
                let slot = (k / 2) % 256;
                let mut e = if k.is_multiple_of(2) {
                    let mut e = Event::new(EventKind::Alloc, Api::cudaMalloc);
                    e.size = 4096 * (1 + (k / 2) % 64);
                    e.stack = StackId(((k / 2) % 64) as u32 + 1);
                    e
                } else {
                    Event::new(EventKind::Free, Api::cudaFree)
                };
                e.ptr = 0x7000_0000_0000 + slot * 0x10_0000;
                e
            };
            e.seq = i + 1;
            e.ts_ns = 1_000 + i * 100;
            e.device = 0;
            encode::push_event(&mut frames, &e);
        }
        encode::end_events(&mut frames, at);
        if end / 1000 != n / 1000 {
            encode::marker(&mut frames, end, 1_000 + end * 100, 1, StackId(0), "step");
        }
        n = end;
        if frames.len() > 4 << 20 || n == events {
            if n == events && ending == Ending::Complete {
                encode::goodbye(&mut frames, GoodbyeReason::Exit, events);
            }
            tf::write_chunk(&mut f, 1, &frames, compress).unwrap();
            frames.clear();
        }
    }
    if events == 0 {
        tf::write_chunk(&mut f, 1, &frames, compress).unwrap();
    }
    let reason = match ending {
        Ending::Complete => tf::CloseReason::Clean,
        Ending::NoEndRecord => tf::CloseReason::Abrupt,
    };
    tf::write_conn_close(&mut f, 1, 2, reason, "").unwrap();
    if ending == Ending::Complete {
        tf::write_end(&mut f, 3, 1).unwrap();
    }
    f.flush().unwrap();
}

/// `mknod DIR/NAME c MAJOR MINOR`, in a test's private directory. Needs root: a test that is
/// not root fails here with the reason, it never passes without having checked.
fn mknod(dir: &Path, name: &str, major: u32, minor: u32) -> PathBuf {
    let p = dir.join(name);
    let o = Command::new("mknod")
        .arg(&p)
        .args(["c", &major.to_string(), &minor.to_string()])
        .output()
        .expect("mknod (coreutils) must be installed");
    assert!(
        o.status.success(),
        "this test makes device nodes with mknod, which needs root (CI runs as root; run it \
         as root, e.g. in a container): {}",
        String::from_utf8_lossy(&o.stderr).trim()
    );
    p
}

fn is_char_device(p: &Path) -> bool {
    std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_char_device())
}

/// oomtrace with `args`, standard output to `stdout`.
fn oomtrace_to(args: &[&str], stdout: Stdio) -> Output {
    let mut cmd = base_command(oomtrace_bin());
    cmd.args(args).stdout(stdout).stderr(Stdio::piped());
    let child = cmd.spawn().expect("spawn oomtrace");
    // output_within would replace stdout with a pipe: wait here, with a bound of our own.
    let start = Instant::now();
    let pid = child.id();
    let waiter = std::thread::spawn(move || child.wait_with_output());
    while !waiter.is_finished() {
        if start.elapsed() > TIMEOUT {
            // SAFETY: killing the child we spawned.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            panic!("oomtrace {args:?} hung");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    waiter.join().unwrap().expect("wait")
}

fn oomtrace(args: &[&str]) -> Output {
    let mut cmd = base_command(oomtrace_bin());
    cmd.args(args);
    output_within(cmd, TIMEOUT)
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// One line on stderr, starting `oomtrace: `, exit 2, containing `needle`.
fn assert_one_line_error(o: &Output, needle: &str) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("oomtrace: "), "{err}");
    assert!(err.contains(needle), "{err:?} should mention {needle:?}");
    assert!(!err.contains("panicked"), "{err}");
}

fn export_args<'a>(trace: &'a str, format: &'a str, out: &'a str) -> Vec<&'a str> {
    vec!["export", trace, "--format", format, "-o", out]
}

#[test]
fn export_to_a_full_device_fails_and_keeps_the_device() {
    let traced = run_traced("runtime_basic", &[], &[]);
    let dir = scratch("out-full");
    let full = mknod(&dir, "full", 1, 7);
    let t = traced.trace.to_str().unwrap();
    for format in ["memory-viz", "chrome", "folded", "json"] {
        let o = oomtrace(&export_args(t, format, full.to_str().unwrap()));
        assert_one_line_error(&o, "No space left on device");
        assert!(
            stderr(&o).contains(full.to_str().unwrap()),
            "{}",
            stderr(&o)
        );
        assert!(
            is_char_device(&full),
            "{format}: the device node was removed"
        );
    }
    assert_eq!(names_in(&dir), ["full"], "nothing else created");
}

#[test]
fn export_to_a_null_device_succeeds_and_keeps_it() {
    let traced = run_traced("runtime_basic", &[], &[]);
    let dir = scratch("out-null");
    let null = mknod(&dir, "null", 1, 3);
    let t = traced.trace.to_str().unwrap();
    for format in ["memory-viz", "json"] {
        let o = oomtrace(&export_args(t, format, null.to_str().unwrap()));
        assert!(o.status.success(), "{}", stderr(&o));
        assert!(
            is_char_device(&null),
            "{format}: the device node was replaced"
        );
    }
    assert_eq!(names_in(&dir), ["null"]);
}

#[test]
fn export_through_a_symlink_is_refused_and_both_stay() {
    let traced = run_traced("runtime_basic", &[], &[]);
    let dir = scratch("out-link");
    let target = dir.join("target.json");
    std::fs::write(&target, b"the user's file").unwrap();
    let link = dir.join("link.json");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let o = oomtrace(&export_args(
        traced.trace.to_str().unwrap(),
        "json",
        link.to_str().unwrap(),
    ));
    assert_one_line_error(&o, "symbolic link");
    assert_eq!(std::fs::read(&target).unwrap(), b"the user's file");
    assert!(std::fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(std::fs::read_link(&link).unwrap(), target);
    // A dangling link is not followed either (that would create a file elsewhere).
    let dangling = dir.join("dangling");
    std::os::unix::fs::symlink(dir.join("nowhere"), &dangling).unwrap();
    let o = oomtrace(&export_args(
        traced.trace.to_str().unwrap(),
        "json",
        dangling.to_str().unwrap(),
    ));
    assert_one_line_error(&o, "symbolic link");
    assert!(!dir.join("nowhere").exists());
    assert_eq!(names_in(&dir), ["dangling", "link.json", "target.json"]);
    // A link to a stream (`-o /dev/stdout`) is written into, as the stream itself would be.
    let mut cmd = base_command(oomtrace_bin());
    cmd.args(export_args(
        traced.trace.to_str().unwrap(),
        "json",
        "/dev/stdout",
    ));
    let o = output_within(cmd, TIMEOUT);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        String::from_utf8_lossy(&o.stdout).starts_with("{\"format\":\"oomtrace-events\""),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
}

#[test]
fn a_failed_export_leaves_the_existing_file_intact() {
    let traced = run_traced("runtime_basic", &[], &[]);
    let dir = scratch("out-kept");
    let out = dir.join("out.json");
    std::fs::write(&out, b"yesterday's export").unwrap();
    // A file size limit makes the write fail half-way (EFBIG), as a full disk would.
    let mut cmd = base_command(oomtrace_bin());
    cmd.args(export_args(
        traced.trace.to_str().unwrap(),
        "json",
        out.to_str().unwrap(),
    ));
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let lim = libc::rlimit {
                rlim_cur: 8192,
                rlim_max: 8192,
            };
            libc::setrlimit(libc::RLIMIT_FSIZE, &lim);
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            Ok(())
        });
    }
    let o = output_within(cmd, TIMEOUT);
    assert_one_line_error(&o, "File too large");
    assert_eq!(std::fs::read(&out).unwrap(), b"yesterday's export");
    assert_eq!(
        names_in(&dir),
        ["out.json"],
        "the temporary file is removed"
    );

    // Without the limit, the export replaces the file whole.
    let o = oomtrace(&export_args(
        traced.trace.to_str().unwrap(),
        "json",
        out.to_str().unwrap(),
    ));
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(
        text.lines().next().unwrap().contains("\"type\":\"trace\""),
        "{text:.80}"
    );
    assert!(text.lines().last().unwrap().contains("process_end"));
    assert_eq!(names_in(&dir), ["out.json"]);
}

#[test]
fn export_into_a_fifo_with_a_reader() {
    let traced = run_traced("runtime_basic", &[], &[]);
    let dir = scratch("out-fifo");
    let fifo = dir.join("fifo");
    let st = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(st.success());
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::read_to_string(fifo).expect("read the FIFO"))
    };
    let o = oomtrace(&export_args(
        traced.trace.to_str().unwrap(),
        "json",
        fifo.to_str().unwrap(),
    ));
    assert!(o.status.success(), "{}", stderr(&o));
    let text = reader.join().unwrap();
    assert!(
        text.lines().last().unwrap().contains("process_end"),
        "{text}"
    );
    assert!(std::fs::symlink_metadata(&fifo)
        .unwrap()
        .file_type()
        .is_fifo());
    assert_eq!(names_in(&dir), ["fifo"]);
}

#[test]
fn a_full_standard_output_is_one_line_and_exit_2() {
    let traced = run_traced("runtime_basic", &[], &[]);
    let dir = scratch("stdout-full");
    let full = mknod(&dir, "full", 1, 7);
    let t = traced.trace.to_str().unwrap();
    let to_full = || Stdio::from(OpenOptions::new().write(true).open(&full).unwrap());
    for args in [vec!["report", t], vec!["report", "--json", t]] {
        let o = oomtrace_to(&args, to_full());
        assert_one_line_error(&o, "cannot write the report to standard output");
        assert!(
            stderr(&o).contains("No space left on device"),
            "{}",
            stderr(&o)
        );
    }
    let o = oomtrace_to(&export_args(t, "json", "-"), to_full());
    assert_one_line_error(&o, "cannot write the export to standard output");
    assert!(is_char_device(&full));
}

#[test]
fn a_closed_standard_output_ends_quietly() {
    let traced = run_traced("runtime_basic", &[], &[]);
    let t = traced.trace.to_str().unwrap();
    for args in [
        vec!["report", t],
        vec!["report", "--json", t],
        export_args(t, "json", "-"),
    ] {
        // A pipe whose reader is gone before the first write: EPIPE.
        let mut fds = [0; 2];
        // SAFETY: a plain pipe(2) into a local array.
        assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
        // SAFETY: closing our own read end; the write end becomes the child's stdout.
        unsafe { libc::close(fds[0]) };
        // SAFETY: fds[1] is a fresh descriptor that nothing else owns.
        let write_end = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fds[1]) };
        let o = oomtrace_to(&args, Stdio::from(write_end));
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).is_empty(), "{args:?}: {}", stderr(&o));
    }
}

#[test]
fn incomplete_traces_say_why_in_the_report_itself() {
    let dir = scratch("incomplete");
    // No end record, but nothing cut either: the reason is still in the text.
    let no_end = dir.join("no-end.oomt");
    synthetic_trace(&no_end, 2000, 10, true, Ending::NoEndRecord);
    let o = oomtrace_to(&["report", no_end.to_str().unwrap()], Stdio::piped());
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("(incomplete trace: the trace has no end record"),
        "{text}"
    );
    assert!(!text.contains("see the warning above"), "{text}");

    // Cut in the middle of a record: the truncation is the reason, printed with the report.
    let good = dir.join("good.oomt");
    synthetic_trace(&good, 2000, 10, true, Ending::Complete);
    let bytes = std::fs::read(&good).unwrap();
    let cut = dir.join("cut.oomt");
    std::fs::write(&cut, &bytes[..bytes.len() - 7]).unwrap();
    let o = oomtrace_to(&["report", cut.to_str().unwrap()], Stdio::piped());
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    let line = text
        .lines()
        .find(|l| l.contains("incomplete trace"))
        .unwrap_or_else(|| panic!("no incomplete line in {text}"));
    assert!(line.contains("ends in the middle of a record"), "{line}");
    // Every other warning is in the text too.
    let r = report_json(&cut);
    for w in r["trace"]["warnings"].as_array().unwrap() {
        assert!(
            text.contains(w.as_str().unwrap()),
            "{w} missing from {text}"
        );
    }

    // A complete trace says nothing of the kind.
    let o = oomtrace_to(&["report", good.to_str().unwrap()], Stdio::piped());
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(!text.contains("(incomplete trace"), "{text}");
}

/// A trace of `events` for the progress bar's tests, compressed as the collector writes them
/// (uncompressed, the 12.8 million events that `report` came to read in under the bar's 1 s
/// took 820 MB of disk).
fn big_trace(dir: &Path, events: u64) -> PathBuf {
    let p = dir.join("big.oomt");
    synthetic_trace(&p, events, 1000, true, Ending::Complete);
    p
}

#[test]
fn progress_only_on_a_terminal() {
    assert!(
        Path::new("/usr/bin/script").exists() || Command::new("script").arg("-V").output().is_ok(),
        "this test needs script(1) from util-linux (bsdutils) for a pseudo-terminal"
    );
    let dir = scratch("progress");
    // The bar shows after 1 s: the trace must take longer than that to read. How long a
    // trace takes depends on the machine and on `report`'s speed (which only grows), so it is
    // made larger until reading it takes over 1.5 s.
    let mut events = 400_000;
    let (mut big, took) = loop {
        let big = big_trace(&dir, events);
        let b = big.to_str().unwrap();
        // Standard error not a terminal: nothing but what the command always says.
        let start = Instant::now();
        let o = oomtrace_to(&["report", "--json", b], Stdio::null());
        let took = start.elapsed();
        assert!(o.status.success(), "{}", stderr(&o));
        assert!(stderr(&o).is_empty(), "{:?}", stderr(&o));
        if took.as_secs_f64() > 1.5 || events >= 102_400_000 {
            break (big, took);
        }
        events *= 2;
    };
    assert!(
        took.as_secs_f64() > 1.5,
        "the trace must take longer than the progress delay to read (took {took:?} for \
         {events} events)"
    );
    let b = big.to_str().unwrap();
    let out = dir.join("out.folded");
    let o = oomtrace(&export_args(b, "folded", out.to_str().unwrap()));
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        stderr(&o).trim(),
        format!(
            "oomtrace: wrote {} (flamegraph.pl or inferno-flamegraph draw it)",
            out.display()
        ),
        "only the usual line"
    );

    // A pseudo-terminal (script(1)): the bar appears, and is cleared before the report. This
    // read may be quicker than the one above (the machine's load changes between them): one
    // that took under 1.2 s may end before the bar shows, and the trace doubles then. One that
    // took longer and showed no bar fails.
    loop {
        let b = big.to_str().unwrap();
        let cmdline = format!("{} report --json {b} > /dev/null", oomtrace_bin().display());
        let mut cmd = base_command("script");
        cmd.args(["-qec", &cmdline, "/dev/null"]);
        let start = Instant::now();
        let o = output_within(cmd, TIMEOUT);
        let took = start.elapsed();
        let screen = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success(), "{screen} {}", stderr(&o));
        if screen.contains("oomtrace: reading big.oomt [") {
            assert!(screen.contains("MiB/"), "{screen:?}");
            break;
        }
        assert!(
            took.as_secs_f64() < 1.2 && events < 204_800_000,
            "no progress bar in {took:?} ({events} events): {screen:?}"
        );
        events *= 2;
        big = big_trace(&dir, events);
    }
}

/// Writes a big synthetic trace for bench/2026-11-24-export-memory.md (not a test):
/// `OOMTRACE_BENCH_TRACE=PATH OOMTRACE_BENCH_EVENTS=N OOMTRACE_BENCH_LIVE=M cargo test -p
/// oomtrace-tests --test it output::write_a_bench_trace -- --ignored`.
#[test]
#[ignore = "writes a benchmark input; run by hand"]
fn write_a_bench_trace() {
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("set {k}"));
    let path = PathBuf::from(var("OOMTRACE_BENCH_TRACE"));
    let events: u64 = var("OOMTRACE_BENCH_EVENTS").parse().expect("a number");
    let live: u64 = var("OOMTRACE_BENCH_LIVE").parse().expect("a number");
    synthetic_trace(&path, events, live, true, Ending::Complete);
}
