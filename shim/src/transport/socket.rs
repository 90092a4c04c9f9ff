//! The collector's Unix socket as a [`Sink`]: bounded writes that never raise SIGPIPE, and
//! whether the process that listens is stopped.

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

use super::sink::Sink;

/// How often the collector's process state is read while it takes nothing.
const PEER_CHECK_EVERY: Duration = Duration::from_millis(100);

/// A connected collector socket.
pub(super) struct UnixSink {
    stream: UnixStream,
    /// The collector's pid (SO_PEERCRED: the process that listened), 0 if unknown.
    peer_pid: i32,
    peer_checked: Instant,
    peer_was_stopped: bool,
}

impl Sink for UnixSink {
    fn connect(path: &Path) -> std::io::Result<UnixSink> {
        let stream = UnixStream::connect(path)?;
        Ok(UnixSink {
            stream,
            peer_pid: 0,
            // The first look at the collector's state is due at once.
            peer_checked: Instant::now()
                .checked_sub(PEER_CHECK_EVERY)
                .unwrap_or_else(Instant::now),
            peer_was_stopped: false,
        })
    }

    fn start(&mut self, head: &[u8], page: Option<i32>) -> std::io::Result<()> {
        let mut rest = head;
        if let Some(page) = page {
            // A socket that refuses the descriptor still takes the stream without it.
            if let Ok(n) =
                oomtrace_proto::counter_page::send_with_page(self.stream.as_raw_fd(), head, page)
            {
                rest = &head[n..];
            }
        }
        send_all(&self.stream, rest)?;
        let _ = self.stream.set_write_timeout(Some(SOCKET_WRITE_WAIT));
        self.peer_pid = peer_pid(&self.stream);
        Ok(())
    }

    fn send(
        &mut self,
        buf: &[u8],
        now_only: bool,
        taken: &mut dyn FnMut(usize),
    ) -> std::io::Result<usize> {
        let flags = if now_only { libc::MSG_DONTWAIT } else { 0 };
        send_some(&self.stream, buf, flags, taken)
    }

    /// Whether the collector's process is stopped (state `T` or `t`: SIGSTOP, a debugger),
    /// read from /proc at most every `PEER_CHECK_EVERY`. Unknown (another pid namespace, a
    /// collector that forked after `listen`, whose listening pid has gone): false.
    fn reader_stopped(&mut self, now: Instant) -> bool {
        if self.peer_pid <= 0 {
            return false;
        }
        if now.duration_since(self.peer_checked) >= PEER_CHECK_EVERY {
            self.peer_checked = now;
            self.peer_was_stopped = std::fs::read(format!("/proc/{}/stat", self.peer_pid))
                .ok()
                .and_then(|stat| {
                    // "pid (comm) S ...": the state follows the last ')'.
                    let at = stat.iter().rposition(|&c| c == b')')?;
                    stat.get(at + 2).copied()
                })
                .is_some_and(|state| state == b'T' || state == b't');
        }
        self.peer_was_stopped
    }

    fn fd(&self) -> i32 {
        self.stream.as_raw_fd()
    }

    /// Waits (bounded) for the collector to close its end: it does so after the process's
    /// data is in the trace file, so "program exited" implies "trace written" for whoever
    /// reads it next. Before closing, the collector may send one line this process's user
    /// must hear (its trace could not all be written: a full disk); that is returned.
    fn close(self) -> String {
        let s = self.stream;
        let _ = s.shutdown(std::net::Shutdown::Write);
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        let mut said = Vec::new();
        let mut buf = [0u8; 512];
        while said.len() < 4096 {
            match std::io::Read::read(&mut &s, &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => said.extend_from_slice(&buf[..n]),
            }
        }
        String::from_utf8_lossy(&said).into_owned()
    }
}

/// How long one write may wait for a collector that does not read (stopped, or slower than
/// the program): the drain thread never blocks longer, so it keeps emptying the queue.
const SOCKET_WRITE_WAIT: Duration = Duration::from_millis(20);

/// Sends as much of `buf` as the socket takes before its write timeout (or at once, with
/// `MSG_DONTWAIT` in `flags`), and for at most about `SOCKET_WRITE_WAIT` in all, so that the
/// drain thread gets back to the queue while a slow collector catches up (hooks waiting for
/// room then get some every ~20 ms, not once the whole backlog is out): Ok(bytes sent);
/// `taken` hears of every write that took bytes. A full socket is not an error; a dead
/// collector is (MSG_NOSIGNAL: never a SIGPIPE).
fn send_some(
    s: &UnixStream,
    buf: &[u8],
    flags: i32,
    taken: &mut dyn FnMut(usize),
) -> std::io::Result<usize> {
    let start = Instant::now();
    let mut sent = 0;
    while sent < buf.len() {
        // SAFETY: valid fd and buffer.
        let n = unsafe {
            libc::send(
                s.as_raw_fd(),
                buf[sent..].as_ptr().cast(),
                buf.len() - sent,
                libc::MSG_NOSIGNAL | flags,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            match e.kind() {
                std::io::ErrorKind::Interrupted => continue,
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => return Ok(sent),
                _ => return Err(e),
            }
        }
        sent += n as usize;
        taken(n as usize);
        if start.elapsed() >= SOCKET_WRITE_WAIT {
            break;
        }
    }
    Ok(sent)
}

/// The pid of the process that listened on the other end (SO_PEERCRED), 0 if unknown.
fn peer_pid(s: &UnixStream) -> i32 {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: valid fd and out-parameters of the right size.
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc == 0 {
        cred.pid
    } else {
        0
    }
}

/// `send` with MSG_NOSIGNAL: a dead collector must be an error, never a SIGPIPE for the host.
fn send_all(s: &UnixStream, mut buf: &[u8]) -> std::io::Result<()> {
    while !buf.is_empty() {
        // SAFETY: valid fd and buffer.
        let n = unsafe {
            libc::send(
                s.as_raw_fd(),
                buf.as_ptr().cast(),
                buf.len(),
                libc::MSG_NOSIGNAL,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        buf = &buf[n as usize..];
    }
    Ok(())
}
