//! Never hang, never drown (issue 21, items 4 to 6): `oomtrace collect` stops within about 2 s
//! of SIGTERM whatever its clients do (a process it cannot see that keeps sending, a live
//! traced program); `--exit-when-idle` is not held by clients that never send a whole frame;
//! 60 clients holding a partial 16 MiB frame each cost the collector a bounded amount of
//! memory while a real program traced beside them loses nothing; and the metrics endpoint
//! answers every scrape among silent, trickling and rapid clients.
//!
//! The hostile clients are written here, with proto's own encoder for their frames.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::fd::FromRawFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use oomtrace_proto::event::{Api, Event, EventKind};
use oomtrace_proto::wire::{self, encode, Hello};
use oomtrace_tests::*;
use serde_json::Value;

/// Stop every client thread of a test when it ends, also when it fails.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// The stream header and a Hello claiming `pid`, as a shim sends them.
fn hello_bytes(pid: u32) -> Vec<u8> {
    let mut buf = wire::stream_header().to_vec();
    encode::hello(
        &mut buf,
        &Hello {
            pid,
            ppid: 1,
            start_unix_ns: 1_700_000_000_000_000_000,
            shim_version: "hangs-test".into(),
            exe: "/nonexistent/hostile-client".into(),
            argv: vec!["hostile-client".into()],
            ..Hello::default()
        },
    );
    buf
}

/// One Events frame of `pairs` cudaMalloc/cudaFree pairs, sequence numbers from `*seq`.
fn events_frame(seq: &mut u64, pairs: u64) -> Vec<u8> {
    let mut events = Vec::new();
    for i in 0..pairs {
        for kind in [EventKind::Alloc, EventKind::Free] {
            *seq += 1;
            let mut e = Event::new(kind, Api::cudaMalloc);
            e.seq = *seq;
            e.ts_ns = *seq * 1000;
            e.ptr = 0x7000_0000_0000 + (i << 20);
            e.size = 1 << 20;
            events.push(e);
        }
    }
    let mut buf = Vec::new();
    encode::events(&mut buf, &events);
    buf
}

/// A pid that names no process: above the kernel's largest.
fn pid_that_does_not_exist() -> u32 {
    let max: u32 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(4_194_304);
    let pid = max + 1000;
    assert!(!Path::new(&format!("/proc/{pid}")).exists());
    pid
}

/// A connection to `socket` made by a child process that exits at once, handing the
/// connection over: the pid the collector learns from the socket (SO_PEERCRED) is gone, as
/// is the pid of a program in a pid namespace the collector cannot see.
fn connect_from_a_gone_process(socket: &Path) -> UnixStream {
    use std::os::unix::ffi::OsStrExt;
    let (ours, theirs) = UnixStream::pair().expect("socketpair");
    // SAFETY: sockaddr_un is plain old data; all zeroes is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let path = socket.as_os_str().as_bytes();
    assert!(path.len() < addr.sun_path.len());
    for (d, s) in addr.sun_path.iter_mut().zip(path) {
        *d = *s as libc::c_char;
    }
    let theirs_fd = std::os::fd::AsRawFd::as_raw_fd(&theirs);
    // SAFETY: the child only makes async-signal-safe system calls on memory prepared before
    // the fork, then `_exit`s: safe in a multithreaded parent.
    let child = unsafe { libc::fork() };
    assert!(child >= 0, "fork");
    if child == 0 {
        // SAFETY: plain system calls on valid, prepared arguments (see above).
        unsafe {
            let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
            let rc = libc::connect(
                fd,
                (&addr as *const libc::sockaddr_un).cast(),
                std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
            );
            if fd < 0 || rc != 0 {
                libc::_exit(1);
            }
            let mut byte = [0u8; 1];
            let mut iov = libc::iovec {
                iov_base: byte.as_mut_ptr().cast(),
                iov_len: 1,
            };
            let mut control = [0u64; 8];
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = libc::CMSG_SPACE(std::mem::size_of::<i32>() as u32) as _;
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<i32>() as u32) as _;
            std::ptr::copy_nonoverlapping(
                (&fd as *const i32).cast::<u8>(),
                libc::CMSG_DATA(cmsg),
                std::mem::size_of::<i32>(),
            );
            let sent = libc::sendmsg(theirs_fd, &msg, 0);
            libc::_exit(if sent == 1 { 0 } else { 2 });
        }
    }
    drop(theirs);
    let mut status = 0;
    // SAFETY: waiting for the child forked above.
    unsafe { libc::waitpid(child, &mut status, 0) };
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the connecting child failed: {status:#x}"
    );
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    let mut control = [0u64; 8];
    // SAFETY: msghdr is plain old data; all zeroes is a valid value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    let ours_fd = std::os::fd::AsRawFd::as_raw_fd(&ours);
    // SAFETY: receiving into the buffers above, which outlive the call.
    let got = unsafe { libc::recvmsg(ours_fd, &mut msg, 0) };
    assert_eq!(got, 1, "recvmsg");
    // SAFETY: `msg` was filled by recvmsg; the header is checked before its data is read.
    let fd = unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        assert!(!cmsg.is_null() && (*cmsg).cmsg_type == libc::SCM_RIGHTS);
        let mut fd = -1i32;
        std::ptr::copy_nonoverlapping(
            libc::CMSG_DATA(cmsg),
            (&mut fd as *mut i32).cast::<u8>(),
            std::mem::size_of::<i32>(),
        );
        fd
    };
    assert!(fd >= 0);
    // SAFETY: the descriptor just received is ours alone.
    unsafe { UnixStream::from_raw_fd(fd) }
}

/// `oomtrace collect --quiet` on `socket` with `extra` flags, its stderr kept.
fn collect(socket: &Path, trace: &Path, extra: &[&str]) -> Collector {
    start_collector_with(socket, trace, extra)
}

/// SIGTERM, then how long the collector took to exit, and its stderr.
fn stop_and_time(collector: &mut Collector) -> (Duration, String) {
    signal(collector, libc::SIGTERM);
    let asked = Instant::now();
    let status = wait_within(collector, TIMEOUT, "the collector after SIGTERM");
    let took = asked.elapsed();
    let mut err = String::new();
    if let Some(e) = collector.stderr.as_mut() {
        let _ = e.read_to_string(&mut err);
    }
    assert!(status.success(), "collector failed: {status}\n{err}");
    (took, err)
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// A scenario traced through the standalone collector on `socket`.
fn traced_through(socket: &Path, name: &str, args: &[&str]) -> Guard {
    let mut c = base_command(scenario(name));
    c.args(args)
        .env("LD_PRELOAD", shim())
        .env("OOMTRACE_SOCKET", socket)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    Guard(c.spawn().expect("start the traced program"))
}

/// The report's process of `pid`.
fn process_of(report: &Value, pid: u32) -> &Value {
    processes(report)
        .into_iter()
        .find(|p| u(&p["pid"]) == u64::from(pid))
        .unwrap_or_else(|| panic!("no process {pid} in {report}"))
}

/// `threads` traced through the collector, whatever else is connected: exit code 0, nothing
/// lost, its exact live-at-exit bytes.
fn assert_threads_whole(report: &Value, pid: u32) {
    let p = process_of(report, pid);
    assert_eq!(p["status"], "exited", "{p}");
    assert_eq!(p["lost_events"], 0, "{p}");
    assert_eq!(
        device(p, 0)["live_at_exit_bytes"],
        10 * 64 * 1024 * 36,
        "{p}"
    );
}

#[test]
fn collect_stops_soon_after_sigterm_while_an_unseen_process_keeps_sending() {
    let dir = scratch("hangs-unseen");
    let socket = dir.join("c.sock");
    let trace = dir.join("c.oomt");
    let mut collector = collect(&socket, &trace, &[]);
    // Its Hello names a pid that does not exist, and the process that connected is gone (as
    // in another pid namespace); it sends events as fast as the collector reads.
    let mut client = connect_from_a_gone_process(&socket);
    client
        .write_all(&hello_bytes(pid_that_does_not_exist()))
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let _stop = StopOnDrop(stop.clone());
    let sent = Arc::new(AtomicU64::new(0));
    let (stop2, sent2) = (stop.clone(), sent.clone());
    let sender = std::thread::spawn(move || {
        let _ = client.set_write_timeout(Some(Duration::from_secs(1)));
        let mut seq = 0;
        let started = Instant::now();
        while !stop2.load(Ordering::SeqCst) && started.elapsed() < Duration::from_secs(40) {
            let frame = events_frame(&mut seq, 512);
            if client.write_all(&frame).is_err() {
                // Cut by the collector, or it stopped reading: keep the connection open.
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
            sent2.fetch_add(1024, Ordering::Relaxed);
        }
    });
    let start = Instant::now();
    while sent.load(Ordering::Relaxed) < 100_000 {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the collector reads nothing"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let (took, err) = stop_and_time(&mut collector);
    stop.store(true, Ordering::SeqCst);
    sender.join().unwrap();
    assert!(
        took < Duration::from_secs(5),
        "stopped {took:?} after SIGTERM\n{err}"
    );
    // What it read is in the trace, which is whole and readable; the process is said to have
    // been running when the trace ended, and the collector said it cut it.
    let r = report_json(&trace);
    assert_eq!(r["trace"]["complete"], true);
    let procs = processes(&r);
    assert_eq!(procs.len(), 1, "{r}");
    assert_eq!(
        procs[0]["status"], "running when the trace ended",
        "{}",
        procs[0]
    );
    assert!(
        err.contains("stopped while 1 traced process was still connected"),
        "{err}"
    );
    println!(
        "collect stopped {took:?} after SIGTERM ({} events sent)",
        sent.load(Ordering::Relaxed)
    );
}

#[test]
fn collect_stops_soon_after_sigterm_while_a_traced_program_runs() {
    let dir = scratch("hangs-live");
    let socket = dir.join("c.sock");
    let trace = dir.join("c.oomt");
    let mut collector = collect(&socket, &trace, &[]);
    let mut program = traced_through(&socket, "slow_loop", &["6"]);
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        matches!(program.0.try_wait(), Ok(None)),
        "slow_loop ended early"
    );
    let (took, err) = stop_and_time(&mut collector);
    assert!(
        took < Duration::from_secs(5),
        "stopped {took:?} after SIGTERM\n{err}"
    );
    // The program goes on untouched, to its own exit code.
    let status = wait_within(&mut program.0, TIMEOUT, "slow_loop");
    assert_eq!(status.code(), Some(7));
    let r = report_json(&trace);
    let p = process_of(&r, program.0.id());
    assert_eq!(p["status"], "running when the trace ended", "{p}");
    println!("collect stopped {took:?} after SIGTERM");
}

#[test]
fn exit_when_idle_is_not_held_by_clients_that_never_send_a_whole_frame() {
    let dir = scratch("hangs-idle");
    let socket = dir.join("c.sock");
    let trace = dir.join("c.oomt");
    let mut collector = collect(&socket, &trace, &["--exit-when-idle"]);
    // One sends the stream header only; another its Hello and the first bytes of a frame.
    let mut header_only = UnixStream::connect(&socket).unwrap();
    header_only.write_all(&wire::stream_header()).unwrap();
    let mut mid_frame = UnixStream::connect(&socket).unwrap();
    mid_frame
        .write_all(&hello_bytes(pid_that_does_not_exist()))
        .unwrap();
    mid_frame.write_all(&events_frame(&mut 0, 4)[..9]).unwrap();
    // A real program comes and goes.
    let mut program = traced_through(&socket, "threads", &[]);
    let status = wait_within(&mut program.0, TIMEOUT, "threads");
    assert!(status.success());
    let gone = Instant::now();
    // Both clients are still connected: the collector stops anyway (the header-only one after
    // 5 s without a Hello, the other after 10 s silent in the middle of a frame).
    let status = wait_within(&mut collector, Duration::from_secs(40), "an idle collector");
    assert!(status.success());
    println!("exited {:?} after the program", gone.elapsed());
    let r = report_json(&trace);
    assert_threads_whole(&r, program.0.id());
    drop((header_only, mid_frame));
}

/// Two clients that a shim never is: one that sends a byte of its frame every 2 s (a frame
/// never whole; each byte used to count as progress), and one whose process has exited while
/// its socket stays open elsewhere (here, in the test). Neither keeps an idle-exiting
/// collector running once the real program has gone.
#[test]
fn exit_when_idle_is_not_held_by_a_trickle_or_by_a_gone_process() {
    let dir = scratch("hangs-idle-trickle");
    let socket = dir.join("c.sock");
    let trace = dir.join("c.oomt");
    let mut collector = collect(&socket, &trace, &["--exit-when-idle"]);
    let mut gone = connect_from_a_gone_process(&socket);
    gone.write_all(&hello_bytes(pid_that_does_not_exist()))
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let _stop = StopOnDrop(stop.clone());
    let mut trickle = UnixStream::connect(&socket).unwrap();
    trickle
        .write_all(&hello_bytes(pid_that_does_not_exist()))
        .unwrap();
    let frame = events_frame(&mut 0, 64);
    let trickler = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            for byte in &frame[..frame.len() - 1] {
                if stop.load(Ordering::SeqCst) || trickle.write_all(&[*byte]).is_err() {
                    break;
                }
                for _ in 0..20 {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
            drop(trickle);
        })
    };
    let mut program = traced_through(&socket, "threads", &[]);
    let status = wait_within(&mut program.0, TIMEOUT, "threads");
    assert!(status.success());
    let left = Instant::now();
    // The trickle stops counting 10 s after its frame began, the gone one 1 s after its
    // last byte; then the idle grace.
    let status = wait_within(&mut collector, Duration::from_secs(40), "an idle collector");
    assert!(status.success());
    println!("exited {:?} after the program", left.elapsed());
    let r = report_json(&trace);
    assert_threads_whole(&r, program.0.id());
    stop.store(true, Ordering::SeqCst);
    let _ = trickler.join();
    drop(gone);
}

/// VmRSS of `pid`, in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS");
    kb * 1024
}

#[test]
fn partial_16_mib_frames_cost_the_collector_a_bounded_buffer() {
    const CLIENTS: usize = 60;
    /// Before: 16 MiB per client, about 1 GiB. After: 1.25 MiB per client and 32 MiB for
    /// all; the rest is the collector itself.
    const BOUND: u64 = 256 * MIB;
    let dir = scratch("hangs-partial");
    let socket = dir.join("c.sock");
    let trace = dir.join("c.oomt");
    let mut collector = collect(&socket, &trace, &[]);
    let before = rss(collector.id());
    // Each client: a Hello, then a frame claiming 16 MiB of which it sends all but the last
    // byte (as far as the collector takes them).
    let claimed = wire::MAX_FRAME as usize;
    let mut frame = vec![0u8; 4 + claimed - 1];
    frame[..4].copy_from_slice(&(claimed as u32).to_le_bytes());
    frame[4] = wire::frame_type::EVENTS;
    let frame = Arc::new(frame);
    let stop = Arc::new(AtomicBool::new(false));
    let _stop = StopOnDrop(stop.clone());
    let sent = Arc::new(AtomicU64::new(0));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| {
            let mut s = UnixStream::connect(&socket).unwrap();
            s.write_all(&hello_bytes(pid_that_does_not_exist()))
                .unwrap();
            s.set_write_timeout(Some(Duration::from_millis(200)))
                .unwrap();
            let (frame, stop, sent) = (frame.clone(), stop.clone(), sent.clone());
            std::thread::spawn(move || {
                let mut at = 0;
                while at < frame.len() && !stop.load(Ordering::SeqCst) {
                    match s.write(&frame[at..(at + (64 << 10)).min(frame.len())]) {
                        Ok(n) => {
                            at += n;
                            sent.fetch_add(n as u64, Ordering::Relaxed);
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(20)),
                    }
                }
                // Held open, the frame unfinished, until the test ends.
                while !stop.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(20));
                }
                drop(s);
            })
        })
        .collect();
    // A real program traced meanwhile loses nothing.
    let mut program = traced_through(&socket, "threads", &[]);
    // Until the collector takes no more (every client blocked or done).
    let mut last = 0;
    let mut still = 0;
    let mut peak = 0;
    let start = Instant::now();
    while still < 10 && start.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(200));
        let now = sent.load(Ordering::Relaxed);
        still = if now == last { still + 1 } else { 0 };
        last = now;
        peak = peak.max(rss(collector.id()));
    }
    let status = wait_within(&mut program.0, TIMEOUT, "threads");
    assert!(status.success());
    peak = peak.max(rss(collector.id()));
    println!(
        "collector RSS {} MiB before, {} MiB at most with {CLIENTS} partial frames \
         ({} MiB of them taken)",
        before / MIB,
        peak / MIB,
        last / MIB
    );
    assert!(peak < BOUND, "the collector holds {} MiB", peak / MIB);
    let (_, err) = stop_and_time(&mut collector);
    stop.store(true, Ordering::SeqCst);
    for c in clients {
        c.join().unwrap();
    }
    assert!(err.contains("read more slowly"), "{err}");
    let r = report_json(&trace);
    assert_threads_whole(&r, program.0.id());
    assert_eq!(processes(&r).len(), CLIENTS + 1);
}

/// One scrape: the whole answer within 5 s, or why not.
fn scrape(addr: &str) -> Result<(), String> {
    let mut s = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    write!(s, "GET /metrics HTTP/1.1\r\nHost: {addr}\r\n\r\n").map_err(|e| format!("send: {e}"))?;
    let mut text = String::new();
    s.read_to_string(&mut text)
        .map_err(|e| format!("read: {e} after {:?}", text.len()))?;
    if text.starts_with("HTTP/1.1 200 OK\r\n") && text.contains("oomtrace_collector_processes") {
        Ok(())
    } else {
        Err(format!("answer: {:?}", &text[..text.len().min(200)]))
    }
}

#[test]
fn every_scrape_succeeds_among_silent_trickling_and_rapid_clients() {
    let dir = scratch("hangs-metrics");
    let socket = dir.join("c.sock");
    let trace = dir.join("c.oomt");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let addr = format!("127.0.0.1:{port}");
    let mut collector = collect(&socket, &trace, &["--metrics", &addr]);
    let start = Instant::now();
    while scrape(&addr).is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no metrics on {addr}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let _stop = StopOnDrop(stop.clone());
    let mut threads = Vec::new();
    // 50 clients that connect and send nothing, reconnected as soon as they are cut.
    {
        let (stop, addr) = (stop.clone(), addr.clone());
        threads.push(std::thread::spawn(move || {
            let mut silent: Vec<Option<TcpStream>> = (0..50).map(|_| None).collect();
            while !stop.load(Ordering::SeqCst) {
                for slot in silent.iter_mut() {
                    let cut = slot.as_mut().is_none_or(|s| {
                        !matches!(s.read(&mut [0u8; 16]), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
                    });
                    if cut {
                        *slot = TcpStream::connect(&addr).ok();
                        if let Some(s) = slot {
                            let _ = s.set_nonblocking(true);
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }));
    }
    // 8 clients that send their request one byte a second, reconnected when cut.
    for _ in 0..8 {
        let (stop, addr) = (stop.clone(), addr.clone());
        threads.push(std::thread::spawn(move || {
            let request = format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\n\r\n");
            while !stop.load(Ordering::SeqCst) {
                let Ok(mut s) = TcpStream::connect(&addr) else {
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                };
                for b in request.bytes() {
                    if stop.load(Ordering::SeqCst) || s.write_all(&[b]).is_err() {
                        break;
                    }
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
        }));
    }
    // 1,000 rapid connections over the scrapes: closed at once, or a request whose answer is
    // never read, or half a request.
    {
        let (stop, addr) = (stop.clone(), addr.clone());
        threads.push(std::thread::spawn(move || {
            for i in 0..1000 {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                if let Ok(mut s) = TcpStream::connect(&addr) {
                    let _ = match i % 3 {
                        0 => Ok(()),
                        1 => s.write_all(b"GET /metrics HTTP/1.1\r\n\r\n"),
                        _ => s.write_all(b"GET /met"),
                    };
                }
                std::thread::sleep(Duration::from_millis(8));
            }
        }));
    }
    // A traced program meanwhile.
    let mut program = traced_through(&socket, "slow_loop", &["8"]);
    // A scrape every 0.5 s for 10 s: every one answered.
    let mut failures = Vec::new();
    let mut scrapes = 0;
    let begun = Instant::now();
    while begun.elapsed() < Duration::from_secs(10) {
        let t = Instant::now();
        if let Err(e) = scrape(&addr) {
            failures.push(format!("{:.1} s: {e}", begun.elapsed().as_secs_f64()));
        }
        scrapes += 1;
        std::thread::sleep(Duration::from_millis(500).saturating_sub(t.elapsed()));
    }
    stop.store(true, Ordering::SeqCst);
    for t in threads {
        t.join().unwrap();
    }
    assert!(
        failures.is_empty(),
        "{} of {scrapes} scrapes failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    let status = wait_within(&mut program.0, TIMEOUT, "slow_loop");
    assert_eq!(status.code(), Some(7));
    stop_and_time(&mut collector);
    let r = report_json(&trace);
    let p = process_of(&r, program.0.id());
    assert_eq!(p["status"], "exited", "{p}");
    assert_eq!(p["lost_events"], 0, "{p}");
    println!("{scrapes} scrapes, all answered");
}
