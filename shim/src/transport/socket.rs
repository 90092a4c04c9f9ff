//! The collector's Unix socket as a [`Sink`]: bounded writes that never raise SIGPIPE, and
//! whether the process that listens is stopped. The socket is the shim's own descriptor
//! (`fd_guard.rs`): every call on it is made under the guard's lock and only while the program
//! has not taken it, and none of them blocks there (waiting is `poll`, outside the lock).

use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::time::{Duration, Instant};

use oomtrace_proto::host::peer;

use super::fd_guard::{self, Owned};
use super::sink::Sink;

/// How often the collector's process state is read while it takes nothing.
const PEER_CHECK_EVERY: Duration = Duration::from_millis(100);

/// A connected collector socket.
pub(super) struct UnixSink {
    sock: Owned,
    /// The collector's pid (SO_PEERCRED: the process that listened), 0 if unknown.
    peer_pid: i32,
    peer_checked: Instant,
    peer_was_stopped: bool,
    /// When a send last found the socket full.
    full_at: Option<Instant>,
}

/// After a send found the socket full, a send that may not wait is not tried again for this
/// long: the drain loop asks after every message while a chunk waits, and each try costs two
/// system calls (the identity check and the send).
const FULL_RETRY: Duration = Duration::from_micros(100);

impl Sink for UnixSink {
    fn connect(path: &Path) -> std::io::Result<UnixSink> {
        let (addr, len) = unix_addr(path)?;
        let (sock, ()) = Owned::create(|| {
            // SAFETY: plain socket creation; the descriptor is handed to an OwnedFd at once.
            let fd =
                unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            // SAFETY: a descriptor we just made and own.
            Ok((unsafe { OwnedFd::from_raw_fd(fd) }, ()))
        })?;
        // A connect waits at most this long for room in the collector's backlog (then EAGAIN
        // and another try, the lock released in between), so it never holds the lock long.
        set_timeout(&sock, libc::SO_SNDTIMEO, SOCKET_WRITE_WAIT)?;
        loop {
            // SAFETY: connect of our socket to a valid address of `len` bytes.
            let r = sock.sys(|fd| unsafe {
                libc::connect(fd, (&addr as *const libc::sockaddr_un).cast(), len) as isize
            });
            match r {
                Ok(_) => break,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
                    ) =>
                {
                    // The collector's backlog is full (it is accepting others): wait, as a
                    // blocking connect would.
                    std::thread::yield_now();
                }
                Err(e) => return Err(e),
            }
        }
        Ok(UnixSink {
            sock,
            peer_pid: 0,
            // The first look at the collector's state is due at once.
            peer_checked: Instant::now()
                .checked_sub(PEER_CHECK_EVERY)
                .unwrap_or_else(Instant::now),
            peer_was_stopped: false,
            full_at: None,
        })
    }

    fn start(&mut self, head: &[u8], page: Option<i32>) -> std::io::Result<()> {
        let mut rest = head;
        if let Some(page) = page {
            // A socket that refuses the descriptor (or has no room yet) still takes the
            // stream without it: the count then goes in the `Made` frame.
            let sent = self.sock.sys(|fd| {
                oomtrace_proto::counter_page::send_with_page(fd, head, page, libc::MSG_DONTWAIT)
                    .map_or(-1, |n| n as isize)
            });
            if let Ok(n) = sent {
                rest = &head[n..];
            }
        }
        send_all(&self.sock, rest)?;
        self.peer_pid = peer_pid(&self.sock);
        Ok(())
    }

    fn send(
        &mut self,
        buf: &[u8],
        now_only: bool,
        taken: &mut dyn FnMut(usize),
    ) -> std::io::Result<usize> {
        if now_only && self.full_at.is_some_and(|t| t.elapsed() < FULL_RETRY) {
            return Ok(0);
        }
        let sent = send_some(&self.sock, buf, !now_only, taken)?;
        self.full_at = (sent < buf.len()).then(Instant::now);
        Ok(sent)
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
            let stat = format!("/proc/{}/stat", self.peer_pid);
            self.peer_was_stopped = fd_guard::read_own(std::path::Path::new(&stat))
                .and_then(Result::ok)
                .and_then(|stat| {
                    // "pid (comm) S ...": the state follows the last ')'.
                    let at = stat.iter().rposition(|&c| c == b')')?;
                    stat.get(at + 2).copied()
                })
                .is_some_and(|state| state == b'T' || state == b't');
        }
        self.peer_was_stopped
    }

    /// Waits (bounded) for the collector to close its end: it does so after the process's
    /// data is in the trace file, so "program exited" implies "trace written" for whoever
    /// reads it next. Before closing, the collector may send one line this process's user
    /// must hear (its trace could not all be written: a full disk); that is returned.
    fn close(self) -> String {
        // SAFETY: shutdown of our socket's sending side.
        let _ = self
            .sock
            .sys(|fd| unsafe { libc::shutdown(fd, libc::SHUT_WR) } as isize);
        let deadline = Instant::now() + Duration::from_secs(2);
        let mut said = Vec::new();
        let mut buf = [0u8; 512];
        while said.len() < 4096 {
            // SAFETY: recv into a valid buffer of its length, without waiting.
            let r = self.sock.sys(|fd| unsafe {
                libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT)
            });
            match r {
                Ok(0) => break,
                Ok(n) => said.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    wait_for(self.sock.fd(), libc::POLLIN, left);
                }
                Err(_) => break,
            }
        }
        // Dropping the socket closes it, if it is still ours.
        String::from_utf8_lossy(&said).into_owned()
    }
}

/// How long one write may wait for a collector that does not read (stopped, or slower than
/// the program): the drain thread never blocks longer, so it keeps emptying the queue.
const SOCKET_WRITE_WAIT: Duration = Duration::from_millis(20);

/// The address of the socket at `path`.
fn unix_addr(path: &Path) -> std::io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    // SAFETY: sockaddr_un is plain data; all-zero is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_encoded_bytes();
    if bytes.is_empty() || bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "socket path is empty, too long or holds a NUL byte",
        ));
    }
    for (dst, &b) in addr.sun_path.iter_mut().zip(bytes) {
        *dst = b as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1;
    Ok((addr, len as libc::socklen_t))
}

fn set_timeout(sock: &Owned, which: libc::c_int, d: Duration) -> std::io::Result<()> {
    let tv = libc::timeval {
        tv_sec: d.as_secs() as libc::time_t,
        tv_usec: d.subsec_micros() as libc::suseconds_t,
    };
    // SAFETY: setsockopt with a timeval of the right size.
    sock.sys(|fd| unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            which,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        ) as isize
    })
    .map(drop)
}

/// Waits until `fd` is ready for `events` or `d` passes. Outside the guard's lock: `poll`
/// only looks, so a number the program has taken meanwhile is not harmed (and the next call
/// through the guard says it is taken).
fn wait_for(fd: RawFd, events: libc::c_short, d: Duration) {
    let mut p = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    let ms = d.as_millis().clamp(1, i32::MAX as u128) as libc::c_int;
    // SAFETY: poll on one valid pollfd.
    unsafe { libc::poll(&mut p, 1, ms) };
}

/// Sends as much of `buf` as the socket takes within about `SOCKET_WRITE_WAIT` (or at once,
/// without `wait`), so that the drain thread gets back to the queue while a slow collector
/// catches up (hooks waiting for room then get some every ~20 ms, not once the whole backlog
/// is out): Ok(bytes sent); `taken` hears of every write that took bytes. A full socket is not
/// an error; a dead collector is (MSG_NOSIGNAL: never a SIGPIPE), and so is a socket the
/// program took.
fn send_some(
    s: &Owned,
    buf: &[u8],
    wait: bool,
    taken: &mut dyn FnMut(usize),
) -> std::io::Result<usize> {
    let start = Instant::now();
    let mut sent = 0;
    while sent < buf.len() {
        let rest = &buf[sent..];
        // SAFETY: valid buffer; the descriptor is ours (checked under the lock by `sys`).
        let r = s.sys(|fd| unsafe {
            libc::send(
                fd,
                rest.as_ptr().cast(),
                rest.len(),
                libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
            )
        });
        match r {
            Ok(n) => {
                sent += n;
                taken(n);
                if start.elapsed() >= SOCKET_WRITE_WAIT {
                    break;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                let left = SOCKET_WRITE_WAIT.saturating_sub(start.elapsed());
                if !wait || left.is_zero() {
                    break;
                }
                wait_for(s.fd(), libc::POLLOUT, left);
            }
            Err(e) => return Err(e),
        }
    }
    Ok(sent)
}

/// The pid of the process that listened on the other end (SO_PEERCRED), 0 if unknown.
fn peer_pid(s: &Owned) -> i32 {
    let mut pid = 0;
    // -1 with getsockopt's errno left for the guard to read, as a failed call returns.
    let rc = s.sys(|fd| match peer::peer_cred(fd) {
        Some(cred) => {
            pid = cred.pid;
            0
        }
        None => -1,
    });
    if rc.is_ok() {
        pid
    } else {
        0
    }
}

/// All of `buf`, waiting as long as that takes (the stream's first bytes, into a fresh
/// socket): MSG_NOSIGNAL, a dead collector is an error, never a SIGPIPE for the host.
fn send_all(s: &Owned, mut buf: &[u8]) -> std::io::Result<()> {
    while !buf.is_empty() {
        let n = send_some(s, buf, true, &mut |_| {})?;
        buf = &buf[n..];
    }
    Ok(())
}
