//! epoll: the pollers' readiness sets.

use super::util::{cvt, owned};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

pub use libc::epoll_event as EpollEvent;

pub const EP_IN: u32 = libc::EPOLLIN as u32;

pub(crate) const EP_OUT: u32 = libc::EPOLLOUT as u32;

pub(crate) const EP_ERR: u32 = libc::EPOLLERR as u32;

pub(crate) const EP_HUP: u32 = libc::EPOLLHUP as u32;

pub(crate) const EP_RDHUP: u32 = libc::EPOLLRDHUP as u32;

pub(crate) const EP_ET: u32 = libc::EPOLLET as u32;

pub(crate) const EP_PRI: u32 = libc::EPOLLPRI as u32;

pub(crate) const EP_ONESHOT: u32 = libc::EPOLLONESHOT as u32;

/// What canald watches on a guest's host socket: every event, edge-triggered; PRI
/// tells urgent data (a read stops at its mark).
pub(crate) const EP_HOST_SOCKET: u32 = EP_IN | EP_OUT | EP_RDHUP | EP_PRI | EP_ET;

pub struct Epoll {
    fd: OwnedFd,
}

impl Epoll {
    pub fn new() -> io::Result<Epoll> {
        // SAFETY: plain call.
        let fd = cvt(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
        Ok(Epoll { fd: owned(fd) })
    }

    pub fn add(&self, fd: RawFd, events: u32, token: u64) -> io::Result<()> {
        let mut ev = libc::epoll_event { events, u64: token };
        // SAFETY: `ev` is a live local the kernel reads.
        cvt(unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) })
            .map(|_| ())
    }

    pub(crate) fn modify(&self, fd: RawFd, events: u32, token: u64) -> io::Result<()> {
        let mut ev = libc::epoll_event { events, u64: token };
        // SAFETY: `ev` is a live local the kernel reads.
        cvt(unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), libc::EPOLL_CTL_MOD, fd, &mut ev) })
            .map(|_| ())
    }

    pub(crate) fn delete(&self, fd: RawFd) {
        let mut ev = libc::epoll_event { events: 0, u64: 0 };
        // SAFETY: as in add.
        unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), libc::EPOLL_CTL_DEL, fd, &mut ev) };
    }

    /// Waits up to `timeout_ns` nanoseconds (epoll_pwait2: finer than a millisecond).
    /// EINTR counts as no events.
    pub(crate) fn wait_ns(&self, events: &mut [EpollEvent], timeout_ns: u64) -> io::Result<usize> {
        let max = events.len().min(i32::MAX as usize) as libc::c_int;
        let ts = libc::timespec {
            tv_sec: (timeout_ns / 1_000_000_000) as libc::time_t,
            tv_nsec: (timeout_ns % 1_000_000_000) as libc::c_long,
        };
        // SAFETY: the kernel writes at most `max` events into the buffer and reads the
        // live `ts`; no signal mask (NULL).
        let r = unsafe {
            libc::syscall(
                libc::SYS_epoll_pwait2,
                self.fd.as_raw_fd() as libc::c_long,
                events.as_mut_ptr(),
                max as libc::c_long,
                &ts as *const libc::timespec,
                std::ptr::null::<libc::sigset_t>(),
                0 as libc::c_long,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::EINTR) => Ok(0),
                // Kernels before 5.11: whole milliseconds, rounded up.
                Some(libc::ENOSYS) => self.wait(events, timeout_ns.div_ceil(1_000_000) as i32),
                _ => Err(e),
            };
        }
        Ok(r as usize)
    }

    /// Waits up to `timeout_ms` (-1: forever). EINTR counts as no events.
    pub fn wait(&self, events: &mut [EpollEvent], timeout_ms: i32) -> io::Result<usize> {
        let max = events.len().min(i32::MAX as usize) as libc::c_int;
        // SAFETY: the kernel writes at most `max` events into the buffer.
        let r =
            unsafe { libc::epoll_wait(self.fd.as_raw_fd(), events.as_mut_ptr(), max, timeout_ms) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                return Ok(0);
            }
            return Err(e);
        }
        Ok(r as usize)
    }
}

pub fn empty_events(n: usize) -> Vec<EpollEvent> {
    vec![libc::epoll_event { events: 0, u64: 0 }; n]
}

// ---- Unix control sockets ------------------------------------------------------
