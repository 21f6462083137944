//! Unix sockets: the control socket (SEQPACKET, SCM_RIGHTS, SO_PEERCRED) and the lock file.

use super::util::{cvt, cvt_size, empty_msghdr, owned, set_nonblocking};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

fn unix_addr(path: &Path) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: sockaddr_un is plain data; all-zero is valid.
    let mut sa: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    sa.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let b = path.as_os_str().as_bytes();
    if b.len() >= sa.sun_path.len() {
        return Err(io::Error::from_raw_os_error(libc::ENAMETOOLONG));
    }
    for (d, s) in sa.sun_path.iter_mut().zip(b) {
        *d = *s as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + b.len() + 1;
    Ok((sa, len as libc::socklen_t))
}

fn seqpacket() -> io::Result<OwnedFd> {
    // SAFETY: plain call.
    Ok(owned(cvt(unsafe {
        libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0)
    })?))
}

/// A listening SOCK_SEQPACKET socket at `path` (non-blocking).
pub(crate) fn seqpacket_listen(path: &Path) -> io::Result<OwnedFd> {
    let fd = seqpacket()?;
    let (sa, len) = unix_addr(path)?;
    // SAFETY: sa is a valid sockaddr_un of `len` bytes.
    cvt(unsafe {
        libc::bind(
            fd.as_raw_fd(),
            &sa as *const _ as *const libc::sockaddr,
            len,
        )
    })?;
    // SAFETY: plain call.
    cvt(unsafe { libc::listen(fd.as_raw_fd(), 128) })?;
    set_nonblocking(&fd)?;
    Ok(fd)
}

/// Connects a (blocking) SOCK_SEQPACKET socket to `path`.
pub fn seqpacket_connect(path: &Path) -> io::Result<OwnedFd> {
    let fd = seqpacket()?;
    let (sa, len) = unix_addr(path)?;
    // SAFETY: sa is a valid sockaddr_un of `len` bytes.
    cvt(unsafe {
        libc::connect(
            fd.as_raw_fd(),
            &sa as *const _ as *const libc::sockaddr,
            len,
        )
    })?;
    Ok(fd)
}

/// Accepts a connection (non-blocking, close-on-exec); Ok(None) when none is pending.
pub(crate) fn accept_unix(fd: &OwnedFd) -> io::Result<Option<OwnedFd>> {
    // SAFETY: no address is requested.
    let r = unsafe {
        libc::accept4(
            fd.as_raw_fd(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
        )
    };
    match cvt(r) {
        Ok(c) => Ok(Some(owned(c))),
        Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ECONNABORTED) => Ok(None),
        Err(e) => Err(e),
    }
}

/// (pid, uid) of a Unix socket's peer.
pub(crate) fn peer_cred(fd: &OwnedFd) -> io::Result<(u32, u32)> {
    let c = rustix::net::sockopt::socket_peercred(fd)?;
    Ok((c.pid.as_raw_nonzero().get() as u32, c.uid.as_raw()))
}

const MAX_FDS: usize = 4;

/// Sends one message with descriptors attached. `dontwait`: fail with EAGAIN instead
/// of blocking.
pub fn send_with_fds(fd: &OwnedFd, data: &[u8], fds: &[RawFd], dontwait: bool) -> io::Result<()> {
    assert!(fds.len() <= MAX_FDS);
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    let mut cbuf = [0u64; 8]; // 64 bytes, aligned for cmsghdr
    let mut msg = empty_msghdr();
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        let payload = std::mem::size_of_val(fds) as u32;
        // SAFETY: CMSG_SPACE is a pure computation.
        let space = unsafe { libc::CMSG_SPACE(payload) } as usize;
        msg.msg_control = cbuf.as_mut_ptr() as *mut libc::c_void;
        msg.msg_controllen = space as _;
        // SAFETY: msg_control points at `space` <= 64 bytes of zeroed, aligned buffer,
        // so CMSG_FIRSTHDR returns a header inside it with room for MAX_FDS fds.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(payload) as _;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr() as *const u8,
                libc::CMSG_DATA(c),
                payload as usize,
            );
        }
    }
    let flags = libc::MSG_NOSIGNAL | if dontwait { libc::MSG_DONTWAIT } else { 0 };
    // SAFETY: msg points at live locals; the kernel only reads them.
    let n = cvt_size(unsafe { libc::sendmsg(fd.as_raw_fd(), &msg, flags) })?;
    if n != data.len() {
        return Err(io::Error::from_raw_os_error(libc::EMSGSIZE));
    }
    Ok(())
}

/// One received control message.
pub struct Received {
    pub len: usize,
    pub(crate) truncated: bool,
    pub fds: Vec<OwnedFd>,
}

/// Receives one message into `buf`, taking ownership of any descriptors (close-on-exec).
/// Ok(None): nothing pending (non-blocking socket). A zero-length read with no
/// descriptors is end of stream: `len == 0`.
pub fn recv_with_fds(fd: &OwnedFd, buf: &mut [u8]) -> io::Result<Option<Received>> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    let mut cbuf = [0u64; 16];
    let mut msg = empty_msghdr();
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr() as *mut libc::c_void;
    msg.msg_controllen = std::mem::size_of_val(&cbuf) as _;
    // SAFETY: msg points at live, writable locals of the stated sizes.
    let r = unsafe { libc::recvmsg(fd.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    let len = match cvt_size(r) {
        Ok(n) => n,
        Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut fds = Vec::new();
    // SAFETY: the CMSG_* macros walk the control buffer the kernel just filled, bounded
    // by msg_controllen; each SCM_RIGHTS payload holds descriptors now owned by us.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c);
                let bytes = (*c).cmsg_len as usize - (data as usize - c as usize);
                let n = bytes / std::mem::size_of::<RawFd>();
                for i in 0..n {
                    let raw = std::ptr::read_unaligned((data as *const RawFd).add(i));
                    fds.push(OwnedFd::from_raw_fd(raw));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    let truncated = msg.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0;
    Ok(Some(Received {
        len,
        truncated,
        fds,
    }))
}

/// Takes an exclusive, non-blocking flock on `path` (created 0600). Ok(None) if another
/// process holds it.
pub(crate) fn try_lock_file(path: &Path) -> io::Result<Option<std::fs::File>> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(path)?;
    match rustix::fs::flock(&f, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(Some(f)),
        Err(rustix::io::Errno::WOULDBLOCK) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

// ---- host (inet) sockets ---------------------------------------------------------

/// A connected pair of SOCK_SEQPACKET sockets (close-on-exec; both non-blocking), as a
/// control connection and its peer (the fuzz targets).
pub fn seqpacket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: fds has room for the two descriptors socketpair writes.
    cvt(unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
            fds.as_mut_ptr(),
        )
    })?;
    Ok((owned(fds[0]), owned(fds[1])))
}
