//! The errno conventions every wrapper shares.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};

pub(crate) fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

pub(crate) fn cvt_size(r: libc::ssize_t) -> io::Result<usize> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// Wraps a descriptor a successful system call just returned.
pub(crate) fn owned(fd: libc::c_int) -> OwnedFd {
    // SAFETY: `fd` was just returned by a successful call that creates a descriptor;
    // nothing else owns it.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// The errno of an io::Error (EIO if it has none).
pub(crate) fn errno_of(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(libc::EIO)
}

pub(crate) fn set_nonblocking(fd: &OwnedFd) -> io::Result<()> {
    use rustix::fs::{fcntl_getfl, fcntl_setfl, OFlags};
    Ok(fcntl_setfl(fd, fcntl_getfl(fd)? | OFlags::NONBLOCK)?)
}

pub(crate) fn empty_msghdr() -> libc::msghdr {
    // SAFETY: msghdr is plain data; all-zero (null pointers, zero lengths) is valid.
    unsafe { std::mem::zeroed() }
}
