//! Who is on the other end of a connected Unix socket, from `SO_PEERCRED`: the collector
//! asks it of each traced process that connects (its uid, and its pid as the collector's pid
//! namespace sees it), the shim of the collector that listened (to read its state in /proc).

use std::os::fd::RawFd;

/// The credentials of the process at the other end of the Unix socket `fd` (as the kernel
/// recorded them when the connection was made; a pid of 0 means it is in a pid namespace
/// this process does not contain), or None when `getsockopt` fails, with its `errno` left
/// as it set it (the shim's descriptor guard reads it).
pub fn peer_cred(fd: RawFd) -> Option<libc::ucred> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `cred`, a live local of exactly that
    // size; an invalid or non-socket `fd` is an error return, never undefined behaviour.
    let rc = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (rc == 0).then_some(cred)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;

    #[test]
    fn a_socket_pair_names_this_process_and_a_non_socket_is_none() {
        let (a, _b) = UnixStream::pair().unwrap();
        let cred = peer_cred(a.as_raw_fd()).unwrap();
        assert_eq!(cred.pid as u32, std::process::id());
        // SAFETY: getuid has no preconditions.
        assert_eq!(cred.uid, unsafe { libc::getuid() });
        let file = std::fs::File::open("/proc/self/stat").unwrap();
        assert!(peer_cred(file.as_raw_fd()).is_none());
        assert!(peer_cred(-1).is_none());
    }
}
