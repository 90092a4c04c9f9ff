//! The `/metrics` endpoint: a minimal HTTP/1.x server on a std `TcpListener`: one thread that
//! waits on every client at once with `poll(2)`, each client with a deadline.
//!
//! Written here rather than taken from a crate: it answers one GET with one body and closes
//! the connection, which is a few dozen lines, while an HTTP crate would bring an async
//! runtime or a dependency tree into a collector that has neither.
//!
//! One polling thread rather than a thread per client: with threads, the clients served at
//! once had to be bounded (8), and 8 clients that sent nothing (or a byte a second), reopened
//! as soon as they were cut, held every place and starved the scrapes. Here a client costs a
//! descriptor and its bytes until its deadline, and a new connection can always be served:
//! at most [`MAX_CLIENTS`] are open, and one more evicts the oldest still sending its request
//! (a scraper sends its request as it connects and is answered at once, so the evicted one is
//! a client that sends nothing or trickles). A client has [`REQUEST_TIMEOUT`] in all (not per
//! byte) to send its request head, then [`ANSWER_TIMEOUT`] to take the answer. Nothing here
//! touches the connections that read the traced processes: they only publish snapshots.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::exposition::CONTENT_TYPE;
use super::Registry;

/// How long a client may take to send its whole request head.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a client may take to read the answer (and close).
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest request head read; a longer one is refused (431).
const MAX_HEAD: usize = 8 << 10;

/// What is read and dropped after the answer (a request body), so that closing does not reset
/// the connection before the client reads the answer.
const MAX_DRAIN: usize = 1 << 20;

/// Clients open at once; one more evicts the oldest still sending its request.
pub const MAX_CLIENTS: usize = 128;

/// Connections accepted per turn of the loop, between which the open ones are served.
const ACCEPT_BATCH: usize = 32;

/// Serves `/metrics` from `registry` on `listener`, on a thread of its own, until the process
/// exits.
pub fn spawn(listener: TcpListener, registry: Arc<Registry>) -> std::io::Result<()> {
    listener.set_nonblocking(true)?;
    std::thread::Builder::new()
        .name("oomtrace-metrics".into())
        .spawn(move || serve(&listener, &registry))
        .map(|_| ())
}

/// Where a client is.
enum Phase {
    /// Sending its request head (read so far).
    Request(Vec<u8>),
    /// Taking the answer (from `sent` on).
    Answer { out: Vec<u8>, sent: usize },
    /// Answered and our side shut: what it still sends is read and dropped until it closes.
    Drain { dropped: usize },
}

struct Client {
    stream: TcpStream,
    accepted: Instant,
    deadline: Instant,
    phase: Phase,
}

/// After `step`: keep the client, or close it.
#[derive(PartialEq)]
enum Keep {
    Open,
    Close,
}

fn serve(listener: &TcpListener, registry: &Registry) {
    let mut clients: Vec<Client> = Vec::new();
    let mut fds: Vec<libc::pollfd> = Vec::new();
    loop {
        let now = Instant::now();
        clients.retain(|c| c.deadline > now);
        fds.clear();
        fds.push(libc::pollfd {
            fd: listener.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        });
        for c in &clients {
            let events = match c.phase {
                Phase::Answer { .. } => libc::POLLOUT,
                Phase::Request(_) | Phase::Drain { .. } => libc::POLLIN,
            };
            fds.push(libc::pollfd {
                fd: c.stream.as_raw_fd(),
                events,
                revents: 0,
            });
        }
        // Until the next deadline (each client's is at most ANSWER_TIMEOUT away).
        let wait = clients
            .iter()
            .map(|c| c.deadline.saturating_duration_since(now))
            .min()
            .map_or(-1, |d| d.as_millis().clamp(1, 60_000) as libc::c_int);
        // SAFETY: `fds` is a valid, initialized array of `fds.len()` pollfd structs that
        // outlives the call.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, wait) };
        if ready < 0 {
            // EINTR; or out of memory: wait instead of spinning.
            if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                std::thread::sleep(Duration::from_millis(50));
            }
            continue;
        }
        let mut i = 0;
        clients.retain_mut(|c| {
            i += 1;
            fds[i].revents == 0 || step(c, registry) == Keep::Open
        });
        if fds[0].revents != 0 {
            accept(listener, &mut clients, registry);
        }
    }
}

/// Accepts what waits (a batch at most), each served at once as far as it can be.
fn accept(listener: &TcpListener, clients: &mut Vec<Client>, registry: &Registry) {
    for _ in 0..ACCEPT_BATCH {
        let stream = match listener.accept() {
            Ok((s, _)) => s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            // Out of descriptors and the like: back to the loop, which serves (and cuts) the
            // open clients first.
            Err(_) => return,
        };
        if stream.set_nonblocking(true).is_err() {
            continue;
        }
        if clients.len() >= MAX_CLIENTS {
            let oldest_sending = clients
                .iter()
                .enumerate()
                .filter(|(_, c)| matches!(c.phase, Phase::Request(_)))
                .min_by_key(|(_, c)| c.accepted)
                .or_else(|| clients.iter().enumerate().min_by_key(|(_, c)| c.accepted))
                .map(|(i, _)| i);
            if let Some(i) = oldest_sending {
                clients.swap_remove(i);
            }
        }
        let now = Instant::now();
        let mut c = Client {
            stream,
            accepted: now,
            deadline: now + REQUEST_TIMEOUT,
            phase: Phase::Request(Vec::new()),
        };
        // A scraper's request is usually there already.
        if step(&mut c, registry) == Keep::Open {
            clients.push(c);
        }
    }
}

/// Does what the client's phase allows without waiting.
fn step(c: &mut Client, registry: &Registry) -> Keep {
    let mut buf = [0u8; 4096];
    loop {
        match &mut c.phase {
            Phase::Request(head) => {
                let ended = match c.stream.read(&mut buf) {
                    Ok(0) => true,
                    Ok(n) => {
                        head.extend_from_slice(&buf[..n]);
                        false
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Keep::Open,
                    Err(_) => return Keep::Close,
                };
                let complete = head.windows(4).any(|w| w == b"\r\n\r\n")
                    || head.windows(2).any(|w| w == b"\n\n");
                if head.len() > MAX_HEAD {
                    c.phase = answer(
                        "431 Request Header Fields Too Large",
                        "",
                        "text/plain",
                        b"request too large\n",
                    );
                } else if complete || (ended && !head.is_empty()) {
                    c.phase = respond(head, registry);
                } else if ended {
                    return Keep::Close;
                } else {
                    continue;
                }
                c.deadline = Instant::now() + ANSWER_TIMEOUT;
            }
            Phase::Answer { out, sent } => {
                match c.stream.write(&out[*sent..]) {
                    Ok(n) => *sent += n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Keep::Open,
                    Err(_) => return Keep::Close,
                }
                if *sent == out.len() {
                    let _ = c.stream.shutdown(std::net::Shutdown::Write);
                    c.phase = Phase::Drain { dropped: 0 };
                }
            }
            Phase::Drain { dropped } => match c.stream.read(&mut buf) {
                Ok(0) => return Keep::Close,
                Ok(n) => {
                    *dropped += n;
                    if *dropped > MAX_DRAIN {
                        return Keep::Close;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Keep::Open,
                Err(_) => return Keep::Close,
            },
        }
    }
}

fn answer(status: &str, extra: &str, content_type: &str, body: &[u8]) -> Phase {
    let mut out = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n{extra}Connection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body);
    Phase::Answer { out, sent: 0 }
}

/// The answer to a request head.
fn respond(head: &[u8], registry: &Registry) -> Phase {
    let line = head
        .split(|&b| b == b'\n')
        .next()
        .map(|l| String::from_utf8_lossy(l).trim_end().to_string())
        .unwrap_or_default();
    let mut parts = line.split(' ');
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    if !parts.next().is_some_and(|v| v.starts_with("HTTP/")) {
        return answer("400 Bad Request", "", "text/plain", b"bad request\n");
    }
    match (method, path) {
        ("GET" | "HEAD", "/metrics") => {
            let body = registry.render();
            let body = if method == "HEAD" { "" } else { body.as_str() };
            answer("200 OK", "", CONTENT_TYPE, body.as_bytes())
        }
        (_, "/metrics") => answer(
            "405 Method Not Allowed",
            "Allow: GET, HEAD\r\n",
            "text/plain",
            b"only GET\n",
        ),
        _ => answer(
            "404 Not Found",
            "",
            "text/plain",
            b"oomtrace serves /metrics only\n",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(addr: std::net::SocketAddr, request: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(request).unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn serves_metrics_and_refuses_the_rest() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        spawn(listener, Arc::new(Registry::new())).unwrap();
        // Clients that connect and say nothing do not hold up the next one.
        let silent: Vec<TcpStream> = (0..3).map(|_| TcpStream::connect(addr).unwrap()).collect();
        let ok = ask(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        // Answered while they are still connected (served one after the other, each would
        // have been cut first).
        for mut c in silent {
            c.set_nonblocking(true).unwrap();
            let r = c.read(&mut [0u8; 16]);
            assert!(
                r.as_ref()
                    .is_err_and(|e| e.kind() == std::io::ErrorKind::WouldBlock),
                "a silent client was closed before the answer: {r:?}"
            );
        }
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        assert!(
            ok.contains("Content-Type: text/plain; version=0.0.4"),
            "{ok}"
        );
        assert!(ok.contains("\n# TYPE oomtrace_collector_processes gauge\n"));
        let nf = ask(addr, b"GET / HTTP/1.1\r\n\r\n");
        assert!(nf.starts_with("HTTP/1.1 404 "), "{nf}");
        let na = ask(addr, b"POST /metrics HTTP/1.1\r\n\r\n");
        assert!(na.starts_with("HTTP/1.1 405 "), "{na}");
        let bad = ask(addr, b"\x00\xff garbage\r\n\r\n");
        assert!(bad.starts_with("HTTP/1.1 400 "), "{bad}");
        let big = ask(addr, &vec![b'a'; 20_000]);
        assert!(big.starts_with("HTTP/1.1 431 "), "{big}");
    }

    #[test]
    fn silent_and_trickling_clients_never_starve_a_scrape() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        spawn(listener, Arc::new(Registry::new())).unwrap();
        // More silent clients than the endpoint keeps open, and one that trickles its request.
        let _silent: Vec<TcpStream> = (0..MAX_CLIENTS + 20)
            .map(|_| TcpStream::connect(addr).unwrap())
            .collect();
        let mut trickle = TcpStream::connect(addr).unwrap();
        trickle.write_all(b"GET /met").unwrap();
        let started = Instant::now();
        for _ in 0..3 {
            let ok = ask(addr, b"GET /metrics HTTP/1.1\r\n\r\n");
            assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        }
        // The trickling client is cut once its time to send the request is over, however
        // often it sends a byte.
        trickle
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let mut got = Vec::new();
        while started.elapsed() < Duration::from_secs(30) {
            if trickle.write_all(b"r").is_err() {
                break;
            }
            match trickle.read(&mut [0u8; 64]) {
                Ok(0) | Err(_) => break,
                Ok(n) => got.push(n),
            }
        }
        assert!(got.is_empty(), "the trickling client was answered");
        assert!(started.elapsed() < Duration::from_secs(20));
    }
}
