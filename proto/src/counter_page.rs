//! The counter page: one page of memory that the shim and the collector share, in which the
//! shim counts every event its process made. It lets the collector count what is missing
//! when the end of a stream never arrives (the shim's exit-time flush gave up on a starved or
//! stopped collector, the process was killed, the collector dropped the connection): the
//! events made minus the events received are the events lost, whatever the path.
//!
//! ```text
//! offset 0   magic u64 ("OOMTMADE", little-endian)
//! offset 8   made u64     events and step markers the process made (queued or counted lost):
//!                         one relaxed atomic add per event in the shim's hook
//! offset 16  ending u64   0 while the process runs; the `GoodbyeReason` it began its end of
//!                         stream with (`exit`, `_exit`, a detach) once it has
//! ```
//!
//! The shim makes it (a sealed memfd, [`CounterPage::create`]) when tracing starts, and hands
//! its descriptor to the collector with the stream's first bytes ([`send_with_page`],
//! `SCM_RIGHTS`), then closes it: the mapping stays, in both processes, until each unmaps it,
//! so the collector can read the count after the process has died. The collector takes it
//! from its first reads ([`recv_with_page`]), checks it ([`CounterPage::from_fd`]: a memfd
//! sealed against shrinking, one page, the magic) and maps it read-only. Nothing else of the
//! stream changes: an older collector reads the stream with `read`, which drops the
//! descriptor; an older shim sends none, and the collector then counts as before (the shim's
//! `Lost` frames). Why shared memory and not a frame: what the collector must learn is
//! exactly what cannot reach it through the stream when the stream is cut.
//!
//! Pinned: the magic, the offsets and the page size; a change in meaning is a new magic.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes mapped (the memfd's size).
pub const PAGE_BYTES: usize = 4096;
/// "OOMTMADE".
pub const PAGE_MAGIC: u64 = u64::from_le_bytes(*b"OOMTMADE");
const MADE_AT: usize = 8;
const ENDING_AT: usize = 16;

/// One mapped counter page (the shim's, read-write; the collector's, read-only).
#[derive(Debug)]
pub struct CounterPage {
    base: NonNull<u8>,
}

// SAFETY: the mapping is plain shared memory accessed only through atomics; it stays mapped
// until the `CounterPage` is dropped.
unsafe impl Send for CounterPage {}
// SAFETY: as above: every access is atomic.
unsafe impl Sync for CounterPage {}

/// A descriptor the shim made, with the identity it had at creation (device, inode), so that
/// it is never used or closed once the program has closed it and reused its number.
#[derive(Clone, Copy, Debug)]
pub struct PageFd {
    pub fd: RawFd,
    dev: u64,
    ino: u64,
}

impl PageFd {
    /// Whether `fd` still names the memfd it named at creation.
    pub fn still_ours(&self) -> bool {
        identity(self.fd) == Some((self.dev, self.ino))
    }

    /// Closes it if it is still ours (never a descriptor the program has reused).
    pub fn close(self) {
        if self.still_ours() {
            // SAFETY: `fd` is the memfd this process made (checked just above) and nothing
            // else closes it.
            drop(unsafe { OwnedFd::from_raw_fd(self.fd) });
        }
    }
}

fn identity(fd: RawFd) -> Option<(u64, u64)> {
    // SAFETY: an all-zero stat is a valid out-parameter.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes only into `st`; a closed descriptor is an error, not UB.
    let rc = unsafe { libc::fstat(fd, &mut st) };
    (rc == 0).then_some((st.st_dev, st.st_ino))
}

impl CounterPage {
    /// The shim's side: a fresh page (its magic set, counts 0), and its descriptor to hand to
    /// the collector. The memfd is sealed against shrinking and growing, so the collector's
    /// mapping can never fault.
    pub fn create() -> io::Result<(CounterPage, PageFd)> {
        // SAFETY: a valid NUL-terminated name; the flags are plain values.
        let fd = unsafe {
            libc::memfd_create(
                c"oomtrace-counters".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // Its identity at once, and a fresh memfd's seals (none) before it is sized: a
        // descriptor the program closed and reused in between is never truncated or closed.
        let (dev, ino) = identity(fd).ok_or_else(io::Error::last_os_error)?;
        // SAFETY: F_GET_SEALS only reads the descriptor's seals.
        if unsafe { libc::fcntl(fd, libc::F_GET_SEALS) } != 0 {
            return Err(io::Error::other("the memfd was replaced"));
        }
        // SAFETY: a descriptor memfd_create just returned (checked above), owned here until
        // handed over.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: plain calls on the memfd we own.
        let sized = unsafe {
            libc::ftruncate(fd, PAGE_BYTES as libc::off_t) == 0
                && libc::fcntl(
                    fd,
                    libc::F_ADD_SEALS,
                    libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL,
                ) == 0
        };
        if !sized {
            return Err(io::Error::last_os_error());
        }
        let page = map(fd, libc::PROT_READ | libc::PROT_WRITE)?;
        page.word(0).store(PAGE_MAGIC, Ordering::Release);
        // From here the descriptor is kept by number (see `PageFd`).
        let fd = owned.as_raw_fd();
        std::mem::forget(owned);
        Ok((page, PageFd { fd, dev, ino }))
    }

    /// The collector's side: maps a descriptor a peer sent, read-only, if it is a counter
    /// page: a memfd sealed against shrinking (so the mapping cannot fault, whatever the
    /// peer does later), at least one page, with the magic. The descriptor is closed either
    /// way.
    pub fn from_fd(fd: OwnedFd) -> Result<CounterPage, &'static str> {
        let raw = fd.as_raw_fd();
        // SAFETY: F_GET_SEALS only reads the descriptor's seals (an error if it has none).
        let seals = unsafe { libc::fcntl(raw, libc::F_GET_SEALS) };
        if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
            return Err("not a sealed memfd");
        }
        // SAFETY: an all-zero stat is a valid out-parameter.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fstat writes only into `st`.
        if unsafe { libc::fstat(raw, &mut st) } != 0
            || st.st_mode & libc::S_IFMT != libc::S_IFREG
            || (st.st_size as u64) < PAGE_BYTES as u64
        {
            return Err("not one page");
        }
        let page = map(raw, libc::PROT_READ).map_err(|_| "cannot be mapped")?;
        if page.word(0).load(Ordering::Acquire) != PAGE_MAGIC {
            return Err("no counter page magic");
        }
        Ok(page)
    }

    fn word(&self, at: usize) -> &AtomicU64 {
        // SAFETY: `at` is one of the pinned 8-aligned offsets inside the mapped page, which
        // lives as long as `self`; the memory is only ever accessed atomically.
        unsafe { &*self.base.as_ptr().add(at).cast::<AtomicU64>() }
    }

    /// Events and markers made (the shim adds one per event, relaxed).
    pub fn made(&self) -> &AtomicU64 {
        self.word(MADE_AT)
    }

    /// 0 while running; the `GoodbyeReason` value once the process began its end of stream.
    pub fn ending(&self) -> &AtomicU64 {
        self.word(ENDING_AT)
    }
}

impl Drop for CounterPage {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the page `map` mapped; nothing refers to it after this.
        unsafe { libc::munmap(self.base.as_ptr().cast(), PAGE_BYTES) };
    }
}

fn map(fd: RawFd, prot: i32) -> io::Result<CounterPage> {
    // SAFETY: a fresh shared mapping of one page of `fd`; the kernel picks the address.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            PAGE_BYTES,
            prot,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    NonNull::new(p.cast())
        .map(|base| CounterPage { base })
        .ok_or_else(|| io::Error::other("mmap returned null"))
}

/// Most descriptors one read accepts; more are closed by the kernel (MSG_CTRUNC).
const MAX_FDS: usize = 4;

/// The shim's first write: `buf` (or its start) with the page's descriptor attached
/// (`SCM_RIGHTS`), `MSG_NOSIGNAL` and `flags` (the shim passes `MSG_DONTWAIT`: it sends
/// under its descriptor guard's lock). Returns the bytes sent; the rest goes with plain sends.
pub fn send_with_page(socket: RawFd, buf: &[u8], page: RawFd, flags: i32) -> io::Result<usize> {
    let mut iov = libc::iovec {
        iov_base: buf.as_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // u64 elements: cmsghdr needs its alignment.
    let mut control = [0u64; 8];
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
    // SAFETY: an all-zero msghdr is valid; its pointers are set below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: `msg` points at `control`, which has room for one cmsg carrying one fd
    // (`space` <= 64 bytes); the CMSG macros stay inside it.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<RawFd>(), page);
    }
    loop {
        // SAFETY: `msg` and everything it points to are valid for the call.
        let n = unsafe { libc::sendmsg(socket, &msg, libc::MSG_NOSIGNAL | flags) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// The collector's read: like `read`, also taking a counter page the peer attached. The first
/// valid page is kept in `page`; any other descriptor is closed at once.
pub fn recv_with_page(
    socket: RawFd,
    buf: &mut [u8],
    page: &mut Option<CounterPage>,
) -> io::Result<usize> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut control = [0u64; 8];
    // SAFETY: an all-zero msghdr is valid; its pointers are set below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    // SAFETY: `msg` points at `buf` and `control`, both valid and writable for the call.
    let n = unsafe { libc::recvmsg(socket, &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut fds = Vec::new();
    // SAFETY: the kernel filled `control` up to `msg_controllen`; the CMSG macros walk only
    // inside it, and each SCM_RIGHTS payload holds whole descriptors that are now ours.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c);
                let payload = (*c).cmsg_len as usize - (data as usize - c as usize);
                for i in 0..(payload / std::mem::size_of::<RawFd>()).min(MAX_FDS) {
                    let fd = std::ptr::read_unaligned(data.cast::<RawFd>().add(i));
                    fds.push(OwnedFd::from_raw_fd(fd));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    for fd in fds {
        if page.is_none() {
            *page = CounterPage::from_fd(fd).ok();
        }
    }
    Ok(n as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    #[test]
    fn a_page_crosses_a_socket_and_counts_after_its_maker_unmapped_it() {
        let (a, b) = UnixStream::pair().unwrap();
        let (page, fd) = CounterPage::create().unwrap();
        page.made().fetch_add(41, Ordering::Relaxed);
        assert_eq!(
            send_with_page(a.as_raw_fd(), b"hello", fd.fd, 0).unwrap(),
            5
        );
        fd.close();
        let mut got = None;
        let mut buf = [0u8; 16];
        let n = recv_with_page(b.as_raw_fd(), &mut buf, &mut got).unwrap();
        assert_eq!(&buf[..n], b"hello");
        let seen = got.expect("the page arrived");
        page.made().fetch_add(1, Ordering::Relaxed);
        page.ending().store(1, Ordering::Relaxed);
        drop(page);
        assert_eq!(seen.made().load(Ordering::Relaxed), 42);
        assert_eq!(seen.ending().load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_descriptor_that_is_not_a_sealed_page_is_refused() {
        let f = std::fs::File::open("/proc/self/stat").unwrap();
        assert!(CounterPage::from_fd(f.into()).is_err());
        let (a, b) = UnixStream::pair().unwrap();
        let file = std::fs::File::open("/proc/self/stat").unwrap();
        send_with_page(a.as_raw_fd(), b"x", file.as_raw_fd(), 0).unwrap();
        let mut got = None;
        let mut buf = [0u8; 4];
        assert_eq!(
            recv_with_page(b.as_raw_fd(), &mut buf, &mut got).unwrap(),
            1
        );
        assert!(got.is_none());
    }
}
