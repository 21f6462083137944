//! Descriptors canald reads and writes: ring I/O (readv/writev/sendmsg over ring slices), eventfds, pidfds, signals.

use super::inet::{to_sockaddr, zeroed_storage};
use super::util::{cvt, cvt_size, owned};
use canal_abi::ring::RawRing;
use canal_abi::CanalAddr;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

fn ring_iovecs(ring: &RawRing, pos: u64, len: u64) -> ([libc::iovec; 2], libc::c_int) {
    let segs = ring.segments(pos, len);
    let iov = [
        libc::iovec {
            iov_base: segs[0].0 as *mut libc::c_void,
            iov_len: segs[0].1,
        },
        libc::iovec {
            iov_base: segs[1].0 as *mut libc::c_void,
            iov_len: segs[1].1,
        },
    ];
    let n = if segs[1].1 == 0 { 1 } else { 2 };
    (iov, n)
}

/// Reads from `fd` straight into ring bytes `pos..pos+len` (`len <= ring size`).
///
/// The ring must come from a `Region` whose mapping the caller keeps alive.
pub(crate) fn readv_ring(fd: &OwnedFd, ring: &RawRing, pos: u64, len: u64) -> io::Result<usize> {
    let (iov, n) = ring_iovecs(ring, pos, len);
    // SAFETY: the iovecs lie inside the ring (RawRing::segments keeps them within
    // base..base+size for len <= size), which Region::ring checked lies inside the
    // mapped data area; the caller keeps the mapping alive. The kernel writes plain
    // bytes into shared memory no Rust reference points at.
    cvt_size(unsafe { libc::readv(fd.as_raw_fd(), iov.as_ptr(), n) })
}

/// Writes ring bytes `pos..pos+len` (`len <= ring size`) to `fd` in one call.
pub(crate) fn writev_ring(fd: &OwnedFd, ring: &RawRing, pos: u64, len: u64) -> io::Result<usize> {
    let (iov, n) = ring_iovecs(ring, pos, len);
    // SAFETY: as in readv_ring; the kernel only reads the bytes. MSG_NOSIGNAL is not
    // available to writev, so canald ignores SIGPIPE (see `ignore_sigpipe`).
    cvt_size(unsafe { libc::writev(fd.as_raw_fd(), iov.as_ptr(), n) })
}

/// Datagrams one `sendmmsg_ring` call sends at most.
pub(crate) const SEND_BATCH: usize = 32;

/// One datagram of a batch: ring bytes `pos..pos+len`, to `to` or the connected peer,
/// with the control messages at `control` of the batch's control bytes.
#[derive(Clone, Copy)]
pub(crate) struct RingDatagram {
    pub(crate) pos: u64,
    pub(crate) len: u64,
    pub(crate) to: Option<CanalAddr>,
    pub(crate) control: (u32, u32),
}

/// Sends up to SEND_BATCH datagrams of ring bytes with one `sendmmsg` (`more`: with
/// MSG_MORE, a part the next send completes); returns how many
/// went (as `sendmmsg`: an error only if the first one failed; the caller retries the
/// rest, whose first then reports its error).
pub(crate) fn sendmmsg_ring(
    fd: &OwnedFd,
    ring: &RawRing,
    dgrams: &[RingDatagram],
    control: &[u8],
    more: bool,
) -> io::Result<usize> {
    let n = dgrams.len().min(SEND_BATCH);
    if n == 0 {
        return Ok(0);
    }
    let mut iovs = [[libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }; 2]; SEND_BATCH];
    let mut names = [zeroed_storage(); SEND_BATCH];
    // SAFETY: mmsghdr is plain data; all-zero (null pointers, zero lengths) is valid.
    let mut msgs: [libc::mmsghdr; SEND_BATCH] = unsafe { std::mem::zeroed() };
    for (i, d) in dgrams[..n].iter().enumerate() {
        let (iov, k) = ring_iovecs(ring, d.pos, d.len);
        iovs[i] = iov;
        let m = &mut msgs[i].msg_hdr;
        if let Some(a) = &d.to {
            m.msg_namelen = to_sockaddr(a, &mut names[i]);
            m.msg_name = &mut names[i] as *mut _ as *mut libc::c_void;
        }
        m.msg_iov = iovs[i].as_mut_ptr();
        m.msg_iovlen = k as _;
        let (at, n) = (d.control.0 as usize, d.control.1 as usize);
        if let Some(c) = control.get(at..at + n).filter(|c| !c.is_empty()) {
            // The kernel only reads control bytes (const in spirit, mut in the type).
            m.msg_control = c.as_ptr() as *mut libc::c_void;
            m.msg_controllen = c.len() as _;
        }
    }
    // SAFETY: every msghdr points at live locals (addresses, iovecs inside the mapped
    // ring, see readv_ring; the borrowed control bytes) for the call's duration; the
    // kernel only reads them and writes msg_len.
    let r = unsafe {
        libc::sendmmsg(
            fd.as_raw_fd(),
            msgs.as_mut_ptr(),
            n as u32,
            libc::MSG_NOSIGNAL | if more { libc::MSG_MORE } else { 0 },
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

pub(crate) fn ignore_sigpipe() {
    // SAFETY: setting a signal's disposition to SIG_IGN has no memory-safety impact.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
}

/// A pidfd for `pid` (readable once the process has exited).
pub fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    let pid = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
        .ok_or_else(|| io::Error::from_raw_os_error(libc::ESRCH))?;
    Ok(rustix::process::pidfd_open(
        pid,
        rustix::process::PidfdFlags::empty(),
    )?)
}

/// Whether `fd` is a pidfd (a VM_PID message's descriptor must be one).
pub(crate) fn is_pidfd(fd: &OwnedFd) -> bool {
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .is_ok_and(|l| l.as_os_str() == "anon_inode:[pidfd]")
}

pub fn eventfd() -> io::Result<OwnedFd> {
    use rustix::event::EventfdFlags;
    Ok(rustix::event::eventfd(
        0,
        EventfdFlags::NONBLOCK | EventfdFlags::CLOEXEC,
    )?)
}

/// Adds 1 to an eventfd counter (a wake-up). Errors are ignored by callers: a full
/// counter already means "wake up".
pub fn eventfd_write(fd: RawFd) -> io::Result<()> {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a live local.
    let r = unsafe { libc::write(fd, &one as *const u64 as *const libc::c_void, 8) };
    cvt_size(r).map(|_| ())
}

/// Reads (and so resets) an eventfd counter; Ok(0) if it was zero (non-blocking fd).
pub fn eventfd_read(fd: &OwnedFd) -> io::Result<u64> {
    let mut v = [0u8; 8];
    match rustix::io::read(fd, &mut v) {
        Ok(_) => Ok(u64::from_ne_bytes(v)),
        Err(rustix::io::Errno::AGAIN) => Ok(0),
        Err(e) => Err(e.into()),
    }
}

/// poll() of one descriptor for `events`, up to `ms` (-1: forever; 0: no wait); the
/// events it reports, empty on a timeout or EINTR.
fn poll_one(fd: &OwnedFd, events: rustix::event::PollFlags, ms: i32) -> rustix::event::PollFlags {
    use rustix::event::{PollFd, PollFlags, Timespec};
    let mut p = [PollFd::new(fd, events)];
    let timeout = (ms >= 0).then(|| Timespec {
        tv_sec: i64::from(ms / 1000),
        tv_nsec: i64::from(ms % 1000) * 1_000_000,
    });
    match rustix::event::poll(&mut p, timeout.as_ref()) {
        Ok(n) if n > 0 => p[0].revents(),
        _ => PollFlags::empty(),
    }
}

/// poll() for readability of one descriptor, up to `ms` (-1: forever); whether it is
/// readable. EINTR counts as not readable.
pub(crate) fn poll_in(fd: &OwnedFd, ms: i32) -> bool {
    poll_one(fd, rustix::event::PollFlags::IN, ms).contains(rustix::event::PollFlags::IN)
}

/// SIOCOUTQ is TIOCOUTQ's number; SIOCOUTQNSD is from linux/sockios.h.
pub(crate) const SIOCOUTQ: u64 = libc::TIOCOUTQ;
pub(crate) const SIOCOUTQNSD: u64 = 0x894b;

/// An ioctl that writes one int (SIOCOUTQ and the like).
pub(crate) fn ioctl_int(fd: &OwnedFd, req: u64) -> io::Result<i32> {
    let mut v: libc::c_int = 0;
    // SAFETY: these requests write one int to a live local.
    cvt(unsafe { libc::ioctl(fd.as_raw_fd(), req as _, &mut v as *mut libc::c_int) })?;
    Ok(v)
}

/// Whether a stream socket has bytes queued to read (a peek, no wait).
pub(crate) fn has_unread(fd: &OwnedFd) -> bool {
    let mut b = [0u8; 1];
    // SAFETY: a one-byte peek into a live local buffer.
    let n = unsafe {
        libc::recv(
            fd.as_raw_fd(),
            b.as_mut_ptr() as *mut libc::c_void,
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    n > 0
}

/// Whether `fd` reports a hang-up now, without blocking: a WATCH end whose guest
/// descriptors are all closed (`Watches::take_if_hung_up`), a seccomp listener whose
/// programs are all gone.
pub fn hung_up(fd: &OwnedFd) -> bool {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one live pollfd, a zero timeout.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n > 0 && p.revents & (libc::POLLHUP | libc::POLLERR) != 0
}

/// Whether `fd` is an eventfd (checked before canald ever writes to a guest's fd, so
/// a guest cannot hand it a pipe that blocks).
pub(crate) fn is_eventfd(fd: &OwnedFd) -> bool {
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .map(|p| p.as_os_str() == "anon_inode:[eventfd]")
        .unwrap_or(false)
}

/// Blocks SIGINT and SIGTERM and returns a signalfd that reports them, so the poller
/// sees a shutdown request as an ordinary epoll event.
pub(crate) fn term_signalfd() -> io::Result<OwnedFd> {
    // SAFETY: sigset_t is plain data; sigemptyset initialises it.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a live local; these calls only edit it and the signal mask.
    unsafe {
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
    // SAFETY: `set` is initialised; -1 asks for a new descriptor.
    Ok(owned(cvt(unsafe {
        libc::signalfd(-1, &set, libc::SFD_NONBLOCK | libc::SFD_CLOEXEC)
    })?))
}

/// Reads one pending signal number from a signalfd (None if none).
pub(crate) fn read_signal(fd: &OwnedFd) -> Option<u32> {
    // SAFETY: signalfd_siginfo is plain data.
    let mut info: libc::signalfd_siginfo = unsafe { std::mem::zeroed() };
    let len = std::mem::size_of::<libc::signalfd_siginfo>();
    // SAFETY: reads at most `len` bytes into a live local.
    let r = unsafe {
        libc::read(
            fd.as_raw_fd(),
            &mut info as *mut _ as *mut libc::c_void,
            len,
        )
    };
    (r as usize == len).then_some(info.ssi_signo)
}
