//! Socket activation (systemd's `LISTEN_FDS` protocol, sd_listen_fds(3)): the service
//! manager binds the control socket and hands it to canald as descriptor 3.

use super::util::{cvt, set_nonblocking};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;

/// The first descriptor a service manager passes.
const SD_LISTEN_FDS_START: RawFd = 3;

/// A listening socket handed over by the service manager, if this process was given
/// one (LISTEN_PID names it and LISTEN_FDS ≥ 1), with the path it is bound to. The
/// variables are removed so that nothing canald starts believes them. Err if the
/// descriptor is not a listening AF_UNIX SOCK_SEQPACKET socket
/// (`ListenSequentialPacket=` in the socket unit).
pub fn inherited_listener() -> io::Result<Option<(OwnedFd, Option<PathBuf>)>> {
    let pid = std::env::var("LISTEN_PID").ok();
    let fds = std::env::var("LISTEN_FDS").ok();
    for v in ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"] {
        std::env::remove_var(v);
    }
    let (Some(pid), Some(fds)) = (pid, fds) else {
        return Ok(None);
    };
    if pid.trim().parse::<u32>().ok() != Some(std::process::id()) {
        return Ok(None);
    }
    let n: RawFd = fds.trim().parse().unwrap_or(0);
    if n < 1 {
        return Ok(None);
    }
    if n > 1 {
        log::warn!("the service manager passed {n} sockets; canald serves the first only");
    }
    let fd = SD_LISTEN_FDS_START;
    let int = |level, name| -> io::Result<i32> {
        let mut v: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: v and len are valid for writing an int.
        cvt(unsafe { libc::getsockopt(fd, level, name, (&mut v as *mut i32).cast(), &mut len) })?;
        Ok(v)
    };
    let ok = int(libc::SOL_SOCKET, libc::SO_DOMAIN).ok() == Some(libc::AF_UNIX)
        && int(libc::SOL_SOCKET, libc::SO_TYPE).ok() == Some(libc::SOCK_SEQPACKET)
        && int(libc::SOL_SOCKET, libc::SO_ACCEPTCONN).ok() == Some(1);
    if !ok {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "descriptor 3 from the service manager is not a listening AF_UNIX \
             SOCK_SEQPACKET socket (the socket unit needs ListenSequentialPacket=)",
        ));
    }
    // SAFETY: descriptor 3 was handed to this process to own (LISTEN_PID is ours).
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: plain call on our descriptor.
    cvt(unsafe { libc::fcntl(owned.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) })?;
    set_nonblocking(&owned)?;
    Ok(Some((owned, bound_path(fd))))
}

/// The filesystem path a unix socket is bound to (None: unnamed or abstract).
fn bound_path(fd: RawFd) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: sockaddr_un is plain data; all-zero is valid.
    let mut sa: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
    // SAFETY: sa/len describe a writable sockaddr_un.
    cvt(unsafe { libc::getsockname(fd, (&mut sa as *mut libc::sockaddr_un).cast(), &mut len) })
        .ok()?;
    let path: Vec<u8> = sa
        .sun_path
        .iter()
        .map(|c| *c as u8)
        .take_while(|c| *c != 0)
        .collect();
    (!path.is_empty()).then(|| PathBuf::from(std::ffi::OsStr::from_bytes(&path)))
}

/// The channel a host-wide canald passed to a user's canald as descriptor `fd`
/// (`users.rs`): checked to be a connected AF_UNIX SOCK_SEQPACKET socket, then owned,
/// close-on-exec and non-blocking.
pub fn inherited_channel(fd: RawFd) -> io::Result<OwnedFd> {
    let int = |name| -> io::Result<i32> {
        let mut v: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: v and len are valid for writing an int.
        cvt(unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                name,
                (&mut v as *mut i32).cast(),
                &mut len,
            )
        })?;
        Ok(v)
    };
    if int(libc::SO_DOMAIN).ok() != Some(libc::AF_UNIX)
        || int(libc::SO_TYPE).ok() != Some(libc::SOCK_SEQPACKET)
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "descriptor {fd} is not the AF_UNIX SOCK_SEQPACKET channel of a host-wide canald"
            ),
        ));
    }
    // SAFETY: the descriptor was passed to this process to own (--user-channel).
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: plain call on our descriptor.
    cvt(unsafe { libc::fcntl(owned.as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) })?;
    set_nonblocking(&owned)?;
    Ok(owned)
}
