//! The `/metrics` endpoint: a minimal HTTP/1.x server on a std `TcpListener`, one thread.
//!
//! Written here rather than taken from a crate: it answers one GET with one body and closes
//! the connection, which is a few dozen lines, while an HTTP crate would bring an async
//! runtime or a dependency tree into a collector that has neither. Each client gets a short
//! thread, at most [`MAX_CLIENTS`] at once (more are closed at once): a client that sends
//! nothing or reads nothing is cut after [`IO_TIMEOUT`] and cannot delay a scraper's request
//! behind it. Nothing here touches the connections that read the traced processes: they only
//! publish snapshots.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::exposition::CONTENT_TYPE;
use super::Registry;

/// How long a client may take to send its request, and to read the answer.
pub const IO_TIMEOUT: Duration = Duration::from_secs(2);

/// Longest request head read; a longer one is refused (431).
const MAX_HEAD: usize = 8 << 10;

/// Clients served at once; more are closed without an answer.
pub const MAX_CLIENTS: usize = 8;

/// Serves `/metrics` from `registry` on `listener`, on a thread of its own, until the process
/// exits.
pub fn spawn(listener: TcpListener, registry: Arc<Registry>) -> std::io::Result<()> {
    let clients = Arc::new(AtomicUsize::new(0));
    std::thread::Builder::new()
        .name("oomtrace-metrics".into())
        .spawn(move || {
            for stream in listener.incoming() {
                let s = match stream {
                    Ok(s) => s,
                    // Out of descriptors and the like: wait instead of spinning.
                    Err(_) => {
                        std::thread::sleep(Duration::from_millis(50));
                        continue;
                    }
                };
                if clients.fetch_add(1, Ordering::AcqRel) >= MAX_CLIENTS {
                    clients.fetch_sub(1, Ordering::AcqRel);
                    continue;
                }
                let (r, c) = (registry.clone(), clients.clone());
                let spawned = std::thread::Builder::new()
                    .name("oomtrace-metrics-client".into())
                    .spawn(move || {
                        handle(s, &r);
                        c.fetch_sub(1, Ordering::AcqRel);
                    });
                if spawned.is_err() {
                    clients.fetch_sub(1, Ordering::AcqRel);
                }
            }
        })
        .map(|_| ())
}

fn respond(s: &mut TcpStream, status: &str, extra: &str, content_type: &str, body: &[u8]) {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n{extra}Connection: close\r\n\r\n",
        body.len()
    );
    let _ = s.write_all(head.as_bytes());
    let _ = s.write_all(body);
}

fn handle(mut s: TcpStream, registry: &Registry) {
    let _ = s.set_read_timeout(Some(IO_TIMEOUT));
    let _ = s.set_write_timeout(Some(IO_TIMEOUT));
    let started = Instant::now();
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    loop {
        if head.windows(4).any(|w| w == b"\r\n\r\n") || head.windows(2).any(|w| w == b"\n\n") {
            break;
        }
        if head.len() > MAX_HEAD {
            respond(
                &mut s,
                "431 Request Header Fields Too Large",
                "",
                "text/plain",
                b"request too large\n",
            );
            // Read what the client still sends (bounded), so that closing does not reset
            // the connection before it reads the answer.
            let _ = s.shutdown(std::net::Shutdown::Write);
            let mut left = 1usize << 20;
            while let Ok(n @ 1..) = s.read(&mut buf) {
                left = left.saturating_sub(n);
                if left == 0 || started.elapsed() > IO_TIMEOUT {
                    break;
                }
            }
            return;
        }
        // A client trickling a byte at a time still ends at the timeout.
        if started.elapsed() > IO_TIMEOUT {
            return;
        }
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => head.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
    let line = head
        .split(|&b| b == b'\n')
        .next()
        .map(|l| String::from_utf8_lossy(l).trim_end().to_string())
        .unwrap_or_default();
    let mut parts = line.split(' ');
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    if !parts.next().is_some_and(|v| v.starts_with("HTTP/")) {
        respond(
            &mut s,
            "400 Bad Request",
            "",
            "text/plain",
            b"bad request\n",
        );
        return;
    }
    match (method, path) {
        ("GET" | "HEAD", "/metrics") => {
            let body = registry.render();
            let body = if method == "HEAD" { "" } else { body.as_str() };
            respond(&mut s, "200 OK", "", CONTENT_TYPE, body.as_bytes());
        }
        (_, "/metrics") => respond(
            &mut s,
            "405 Method Not Allowed",
            "Allow: GET, HEAD\r\n",
            "text/plain",
            b"only GET\n",
        ),
        _ => respond(
            &mut s,
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
}
