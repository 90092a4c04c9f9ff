//! The collector's Unix socket: bounded writes that never raise SIGPIPE, and who listens.

use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

/// How long one write may wait for a collector that does not read (stopped, or slower than
/// the program): the drain thread never blocks longer, so it keeps emptying the queue.
pub(super) const SOCKET_WRITE_WAIT: Duration = Duration::from_millis(20);

/// Sends as much of `buf` as the socket takes before its write timeout (or at once, with
/// `MSG_DONTWAIT` in `flags`), and for at most about `SOCKET_WRITE_WAIT` in all, so that the
/// drain thread gets back to the queue while a slow collector catches up (hooks waiting for
/// room then get some every ~20 ms, not once the whole backlog is out): Ok(bytes sent);
/// `taken` hears of every write that took bytes. A full socket is not an error; a dead
/// collector is (MSG_NOSIGNAL: never a SIGPIPE).
pub(super) fn send_some(
    s: &UnixStream,
    buf: &[u8],
    flags: i32,
    mut taken: impl FnMut(usize),
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
pub(super) fn peer_pid(s: &UnixStream) -> i32 {
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
pub(super) fn send_all(s: &UnixStream, mut buf: &[u8]) -> std::io::Result<()> {
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
