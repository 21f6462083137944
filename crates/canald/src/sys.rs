//! Small safe wrappers around the system calls canald needs (virtiofsd's `oslib.rs`
//! style). This is the only module of canald that contains `unsafe`; every block names
//! the invariant it relies on. Everything else in the crate is `forbid(unsafe_code)`.
#![allow(unsafe_code)]

use canal_abi::ring::RawRing;
use canal_abi::{CanalAddr, Layout, Region};
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn cvt_size(r: libc::ssize_t) -> io::Result<usize> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// Wraps a descriptor a successful system call just returned.
fn owned(fd: libc::c_int) -> OwnedFd {
    // SAFETY: `fd` was just returned by a successful call that creates a descriptor;
    // nothing else owns it.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// The errno of an io::Error (EIO if it has none).
pub(crate) fn errno_of(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(libc::EIO)
}

pub fn getuid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

// ---- shared memory ---------------------------------------------------------------

/// A shared mapping of a memfd (host side: created, sized and sealed here).
pub struct Mapping {
    base: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain shared memory; all accesses go through `Region`, whose
// accessors are atomics or byte copies.
unsafe impl Send for Mapping {}
// SAFETY: `Mapping` itself is only the base and length (never mutated after creation);
// a guest's home and virtual-RSS shadow instances on different workers share it
// through an Arc and access the memory only through `Region` (atomics, byte copies).
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Creates a sealed memfd of `layout.region_size` bytes, maps it and writes the
    /// region header with `Region::init`. Returns the memfd (to send to the guest),
    /// the mapping and the region view.
    pub(crate) fn create_region(
        layout: Layout,
        guest_id: u32,
        features: u64,
    ) -> io::Result<(OwnedFd, Mapping, Region)> {
        let name = CString::new("canal-region").expect("static name");
        // SAFETY: `name` is a valid NUL-terminated string.
        let fd = owned(cvt(unsafe {
            libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
        } as libc::c_int)?);
        let len = usize::try_from(layout.region_size)
            .map_err(|_| io::Error::from_raw_os_error(libc::ENOMEM))?;
        // SAFETY: plain calls on a descriptor we own.
        cvt(unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) })?;
        // The guest must not shrink the file under our mapping (SIGBUS on access).
        // SAFETY: plain fcntl on a descriptor we own.
        cvt(unsafe {
            libc::fcntl(
                fd.as_raw_fd(),
                libc::F_ADD_SEALS,
                libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL,
            )
        })?;
        let map = Mapping::map(&fd, len)?;
        // SAFETY: `map` covers region_size fresh (zeroed: a new memfd) writable bytes,
        // page aligned by mmap, and lives as long as the caller keeps `map`, which it
        // does for as long as it uses the returned Region (the Guest owns both).
        let region = unsafe { Region::init(map.base, layout, guest_id, features) };
        Ok((fd, map, region))
    }

    /// Maps the first `layout.region_size` bytes of a fresh (zero-filled) region file
    /// a hypervisor maps too (a VM guest's region) and writes the header.
    pub(crate) fn init_file_region(
        fd: &OwnedFd,
        layout: Layout,
        guest_id: u32,
        features: u64,
    ) -> io::Result<(Mapping, Region)> {
        let len = usize::try_from(layout.region_size)
            .map_err(|_| io::Error::from_raw_os_error(libc::ENOMEM))?;
        let map = Mapping::map(fd, len)?;
        // SAFETY: `map` covers region_size writable bytes of a file the caller has just
        // created and sized (so zeroed), page aligned by mmap; the caller keeps `map` as
        // long as it uses the returned Region (the Guest owns both).
        let region = unsafe { Region::init(map.base, layout, guest_id, features) };
        Ok((map, region))
    }

    /// Maps `len` bytes of `fd` shared, read/write.
    pub fn map(fd: &OwnedFd, len: usize) -> io::Result<Mapping> {
        // SAFETY: a fresh mapping chosen by the kernel; no existing memory is affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping {
            base: p as *mut u8,
            len,
        })
    }

    /// Guest side (tests): maps a region memfd and validates its header.
    pub fn attach_region(fd: &OwnedFd, len: usize) -> io::Result<(Mapping, Region)> {
        let map = Mapping::map(fd, len)?;
        // SAFETY: `len` bytes are mapped read/write at `map.base` and stay mapped as
        // long as the caller keeps `map` alongside the view.
        let region = unsafe { Region::attach(map.base, len as u64) }
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
        Ok((map, region))
    }

    /// Fills the whole mapping with bytes from `f` (the hostile-guest test).
    pub fn scribble(&self, mut f: impl FnMut() -> u64) {
        let words = self.len / 8;
        let p = self.base as *mut u64;
        for i in 0..words {
            // SAFETY: i < len/8 keeps the write inside the mapping, which is 8-byte
            // aligned (page aligned). Volatile: the memory is shared with another
            // process that reads it concurrently; it holds plain integers.
            unsafe { std::ptr::write_volatile(p.add(i), f()) };
        }
    }

    /// Overwrites bytes at `off` (clamped to the mapping).
    pub(crate) fn write_at(&self, off: usize, src: &[u8]) {
        if off >= self.len {
            return;
        }
        let n = src.len().min(self.len - off);
        // SAFETY: off + n <= len: inside the mapping; plain bytes.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.base.add(off), n) };
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: base/len describe a mapping we created and nobody uses any more
        // (the Region views that point into it are dropped with their owner first).
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.len) };
    }
}

// ---- ring I/O ------------------------------------------------------------------

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

/// Sends ring bytes `pos..pos+len` (contiguous or wrapping) as one datagram, to `to`
/// or to the connected peer.
pub(crate) fn sendmsg_ring(
    fd: &OwnedFd,
    ring: &RawRing,
    pos: u64,
    len: u64,
    to: Option<&CanalAddr>,
) -> io::Result<usize> {
    let (mut iov, n) = ring_iovecs(ring, pos, len);
    let mut ss: libc::sockaddr_storage = zeroed_storage();
    let mut msg = empty_msghdr();
    if let Some(a) = to {
        let sl = to_sockaddr(a, &mut ss);
        msg.msg_name = &mut ss as *mut _ as *mut libc::c_void;
        msg.msg_namelen = sl;
    }
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = n as _;
    // SAFETY: msg points at live locals (address, iovecs inside the mapped ring, see
    // readv_ring); the kernel only reads them.
    cvt_size(unsafe { libc::sendmsg(fd.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) })
}

pub(crate) fn ignore_sigpipe() {
    // SAFETY: setting a signal's disposition to SIG_IGN has no memory-safety impact.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
}

// ---- eventfd, epoll ---------------------------------------------------------------

/// A pidfd for `pid` (readable once the process has exited).
pub(crate) fn pidfd_open(pid: u32) -> io::Result<OwnedFd> {
    // SAFETY: plain syscall; a non-negative result is a new descriptor we own.
    let r = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_long, 0 as libc::c_long) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(owned(r as libc::c_int))
}

/// Whether `fd` is a pidfd (a VM_PID message's descriptor must be one).
pub(crate) fn is_pidfd(fd: &OwnedFd) -> bool {
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .is_ok_and(|l| l.as_os_str() == "anon_inode:[pidfd]")
}

pub fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: plain call.
    Ok(owned(cvt(unsafe {
        libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC)
    })?))
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
    let mut v: u64 = 0;
    // SAFETY: reads 8 bytes into a live local.
    let r = unsafe { libc::read(fd.as_raw_fd(), &mut v as *mut u64 as *mut libc::c_void, 8) };
    match cvt_size(r) {
        Ok(_) => Ok(v),
        Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => Ok(0),
        Err(e) => Err(e),
    }
}

/// poll() for readability of one descriptor, up to `ms` (-1: forever); whether it is
/// readable. EINTR counts as not readable.
pub(crate) fn poll_in(fd: &OwnedFd, ms: i32) -> bool {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one live pollfd.
    let r = unsafe { libc::poll(&mut p, 1, ms) };
    r > 0 && p.revents & libc::POLLIN != 0
}

/// Pins the calling thread to one CPU.
pub(crate) fn pin_to_cpu(cpu: usize) -> io::Result<()> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    // SAFETY: cpu_set_t is plain bytes; CPU_ZERO/CPU_SET write inside it (cpu is in
    // range); sched_setaffinity reads `size_of` bytes of the live local.
    let r = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_ZERO(&mut set);
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    cvt(r).map(|_| ())
}

/// Gives the core to another runnable thread (a spinning poller on a busy machine).
pub(crate) fn sched_yield() {
    // SAFETY: plain call.
    unsafe { libc::sched_yield() };
}

/// Whether `fd` is an eventfd (checked before canald ever writes to a guest's fd, so
/// a guest cannot hand it a pipe that blocks).
pub(crate) fn is_eventfd(fd: &OwnedFd) -> bool {
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .map(|p| p.as_os_str() == "anon_inode:[eventfd]")
        .unwrap_or(false)
}

pub(crate) fn set_nonblocking(fd: &OwnedFd) -> io::Result<()> {
    // SAFETY: plain fcntl calls on a descriptor we own.
    let fl = cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) })?;
    // SAFETY: as above.
    cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, fl | libc::O_NONBLOCK) })?;
    Ok(())
}

pub use libc::epoll_event as EpollEvent;

pub const EP_IN: u32 = libc::EPOLLIN as u32;
pub(crate) const EP_OUT: u32 = libc::EPOLLOUT as u32;
pub(crate) const EP_ERR: u32 = libc::EPOLLERR as u32;
pub(crate) const EP_HUP: u32 = libc::EPOLLHUP as u32;
pub(crate) const EP_RDHUP: u32 = libc::EPOLLRDHUP as u32;
pub(crate) const EP_ET: u32 = libc::EPOLLET as u32;

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
    let mut c = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: the kernel writes at most `len` bytes into `c`.
    cvt(unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut c as *mut _ as *mut libc::c_void,
            &mut len,
        )
    })?;
    Ok((c.pid as u32, c.uid))
}

fn empty_msghdr() -> libc::msghdr {
    // SAFETY: msghdr is plain data; all-zero (null pointers, zero lengths) is valid.
    unsafe { std::mem::zeroed() }
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
    // SAFETY: plain call on a descriptor we own.
    let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            return Ok(None);
        }
        return Err(e);
    }
    Ok(Some(f))
}

// ---- host (inet) sockets ---------------------------------------------------------

fn zeroed_storage() -> libc::sockaddr_storage {
    // SAFETY: sockaddr_storage is plain data; all-zero is valid.
    unsafe { std::mem::zeroed() }
}

/// Encodes `a` into `ss`; returns the sockaddr length.
fn to_sockaddr(a: &CanalAddr, ss: &mut libc::sockaddr_storage) -> libc::socklen_t {
    if a.family == canal_abi::addr::FAMILY_INET {
        let sin = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: a.port.to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from_ne_bytes(a.ip4()),
            },
            sin_zero: [0; 8],
        };
        // SAFETY: sockaddr_storage is larger than and suitably aligned for sockaddr_in.
        unsafe { std::ptr::write(ss as *mut _ as *mut libc::sockaddr_in, sin) };
        std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t
    } else {
        let sin6 = libc::sockaddr_in6 {
            sin6_family: libc::AF_INET6 as libc::sa_family_t,
            sin6_port: a.port.to_be(),
            sin6_flowinfo: a.flowinfo.to_be(),
            sin6_addr: libc::in6_addr { s6_addr: a.addr },
            sin6_scope_id: a.scope_id,
        };
        // SAFETY: sockaddr_storage is larger than and suitably aligned for sockaddr_in6.
        unsafe { std::ptr::write(ss as *mut _ as *mut libc::sockaddr_in6, sin6) };
        std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t
    }
}

fn from_sockaddr(ss: &libc::sockaddr_storage) -> Option<CanalAddr> {
    match ss.ss_family as i32 {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let sin = unsafe { &*(ss as *const _ as *const libc::sockaddr_in) };
            Some(CanalAddr::v4(
                sin.sin_addr.s_addr.to_ne_bytes(),
                u16::from_be(sin.sin_port),
            ))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let s6 = unsafe { &*(ss as *const _ as *const libc::sockaddr_in6) };
            Some(CanalAddr::v6(
                s6.sin6_addr.s6_addr,
                u16::from_be(s6.sin6_port),
                u32::from_be(s6.sin6_flowinfo),
                s6.sin6_scope_id,
            ))
        }
        _ => None,
    }
}

/// A non-blocking, close-on-exec inet socket.
pub(crate) fn socket(domain: i32, ty: i32, protocol: i32) -> io::Result<OwnedFd> {
    // SAFETY: plain call.
    Ok(owned(cvt(unsafe {
        libc::socket(
            domain,
            ty | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            protocol,
        )
    })?))
}

pub(crate) fn bind(fd: &OwnedFd, a: &CanalAddr) -> io::Result<()> {
    let mut ss = zeroed_storage();
    let len = to_sockaddr(a, &mut ss);
    // SAFETY: ss holds a valid sockaddr of `len` bytes.
    cvt(unsafe {
        libc::bind(
            fd.as_raw_fd(),
            &ss as *const _ as *const libc::sockaddr,
            len,
        )
    })
    .map(|_| ())
}

/// connect(AF_UNSPEC): dissolves a datagram socket's association.
pub(crate) fn disconnect(fd: &OwnedFd) -> io::Result<()> {
    // SAFETY: sockaddr is plain data; zeroed is AF_UNSPEC.
    let sa: libc::sockaddr = unsafe { core::mem::zeroed() };
    // SAFETY: sa is a valid sockaddr of the given size.
    cvt(unsafe {
        libc::connect(
            fd.as_raw_fd(),
            &sa,
            core::mem::size_of::<libc::sockaddr>() as libc::socklen_t,
        )
    })
    .map(|_| ())
}

pub(crate) fn connect(fd: &OwnedFd, a: &CanalAddr) -> io::Result<()> {
    let mut ss = zeroed_storage();
    let len = to_sockaddr(a, &mut ss);
    // SAFETY: ss holds a valid sockaddr of `len` bytes.
    cvt(unsafe {
        libc::connect(
            fd.as_raw_fd(),
            &ss as *const _ as *const libc::sockaddr,
            len,
        )
    })
    .map(|_| ())
}

pub(crate) fn listen(fd: &OwnedFd, backlog: i32) -> io::Result<()> {
    // SAFETY: plain call.
    cvt(unsafe { libc::listen(fd.as_raw_fd(), backlog) }).map(|_| ())
}

pub(crate) fn shutdown(fd: &OwnedFd, how: i32) -> io::Result<()> {
    // SAFETY: plain call.
    cvt(unsafe { libc::shutdown(fd.as_raw_fd(), how) }).map(|_| ())
}

/// Accepts one connection (non-blocking, close-on-exec) and its peer address.
/// Ok(None): none pending.
pub(crate) fn accept_inet(fd: &OwnedFd) -> io::Result<Option<(OwnedFd, Option<CanalAddr>)>> {
    let mut ss = zeroed_storage();
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: the kernel writes at most `len` bytes of address into `ss`.
    let r = unsafe {
        libc::accept4(
            fd.as_raw_fd(),
            &mut ss as *mut _ as *mut libc::sockaddr,
            &mut len,
            libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
        )
    };
    match cvt(r) {
        Ok(c) => Ok(Some((owned(c), from_sockaddr(&ss)))),
        Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => Ok(None),
        Err(e) => Err(e),
    }
}

fn name_of(
    fd: &OwnedFd,
    f: unsafe extern "C" fn(libc::c_int, *mut libc::sockaddr, *mut libc::socklen_t) -> libc::c_int,
) -> io::Result<CanalAddr> {
    let mut ss = zeroed_storage();
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: `f` is getsockname or getpeername; the kernel writes at most `len` bytes.
    cvt(unsafe {
        f(
            fd.as_raw_fd(),
            &mut ss as *mut _ as *mut libc::sockaddr,
            &mut len,
        )
    })?;
    from_sockaddr(&ss).ok_or_else(|| io::Error::from_raw_os_error(libc::EAFNOSUPPORT))
}

pub(crate) fn sockname(fd: &OwnedFd) -> io::Result<CanalAddr> {
    name_of(fd, libc::getsockname)
}

pub(crate) fn peername(fd: &OwnedFd) -> io::Result<CanalAddr> {
    name_of(fd, libc::getpeername)
}

pub(crate) fn setsockopt_bytes(fd: &OwnedFd, level: i32, name: i32, val: &[u8]) -> io::Result<()> {
    // SAFETY: the kernel reads val.len() bytes from a live slice.
    cvt(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            val.as_ptr() as *const libc::c_void,
            val.len() as libc::socklen_t,
        )
    })
    .map(|_| ())
}

/// Returns the option's length as the kernel reports it.
pub(crate) fn getsockopt_bytes(
    fd: &OwnedFd,
    level: i32,
    name: i32,
    out: &mut [u8],
) -> io::Result<usize> {
    let mut len = out.len() as libc::socklen_t;
    // SAFETY: the kernel writes at most `len` bytes into `out`.
    cvt(unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            level,
            name,
            out.as_mut_ptr() as *mut libc::c_void,
            &mut len,
        )
    })?;
    Ok((len as usize).min(out.len()))
}

/// Sets SO_LINGER on a host socket canald drives: `abort` = {1, 0}, so the socket's
/// close (canald's own, or the kernel's when canald dies) resets the connection
/// instead of ending it with a FIN; else {0, 0}, a close that never blocks and lets the
/// kernel deliver what is queued. canald never sets a lingering timeout (it would block
/// the poller in close); a guest's SO_LINGER is emulated (`guest::socket::HostSocket::linger`).
pub(crate) fn set_abortive_close(fd: &OwnedFd, abort: bool) -> io::Result<()> {
    let l = libc::linger {
        l_onoff: abort as libc::c_int,
        l_linger: 0,
    };
    // SAFETY: `l` is a live linger struct of the size passed.
    cvt(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            &l as *const libc::linger as *const libc::c_void,
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    })
    .map(|_| ())
}

/// Raises the soft RLIMIT_NOFILE to the hard limit; returns the soft limit in force.
pub(crate) fn raise_nofile() -> u64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `r` is a valid out-pointer for getrlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return 1024;
    }
    if r.rlim_cur < r.rlim_max {
        let want = libc::rlimit {
            rlim_cur: r.rlim_max,
            rlim_max: r.rlim_max,
        };
        // SAFETY: `want` is a valid rlimit; raising the soft limit up to the hard
        // one needs no privilege.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &want) } == 0 {
            return want.rlim_cur;
        }
    }
    r.rlim_cur
}

/// Returns free heap memory to the system (glibc's malloc_trim).
pub(crate) fn malloc_trim() {
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe { libc::malloc_trim(0) };
}

/// CLOCK_MONOTONIC in milliseconds.
pub(crate) fn monotonic_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

/// /dev/null, read-only, close-on-exec (a placeholder descriptor).
pub(crate) fn open_dev_null() -> io::Result<OwnedFd> {
    // SAFETY: open(2) with a static NUL-terminated path; the result is checked.
    let fd = cvt(unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) })?;
    Ok(owned(fd))
}

pub(crate) fn so_error(fd: &OwnedFd) -> i32 {
    let mut b = [0u8; 4];
    match getsockopt_bytes(fd, libc::SOL_SOCKET, libc::SO_ERROR, &mut b) {
        Ok(_) => i32::from_ne_bytes(b),
        Err(e) => errno_of(&e),
    }
}

/// Receives one datagram into `buf`: (bytes, source). Ok(None) when none is pending.
pub(crate) fn recvfrom(
    fd: &OwnedFd,
    buf: &mut [u8],
) -> io::Result<Option<(usize, Option<CanalAddr>)>> {
    let mut ss = zeroed_storage();
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: the kernel writes at most buf.len() bytes and `len` bytes of address.
    let r = unsafe {
        libc::recvfrom(
            fd.as_raw_fd(),
            buf.as_mut_ptr() as *mut libc::c_void,
            buf.len(),
            0,
            &mut ss as *mut _ as *mut libc::sockaddr,
            &mut len,
        )
    };
    match cvt_size(r) {
        Ok(n) => Ok(Some((n, from_sockaddr(&ss)))),
        Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => Ok(None),
        Err(e) => Err(e),
    }
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

// ---- pair segments (protocol §8) ---------------------------------------------------

/// As `create_segment`, with one buffer zone of `zone_size` bytes per direction after
/// the rings (protocol §10.4; 0: none). The zones' headers and free lists are written
/// by `Mapping::init_zones` before either guest maps the segment.
pub(crate) fn create_segment_zones(id: u32, ring_size: u64, zone_size: u64) -> io::Result<OwnedFd> {
    use canal_abi::segment;
    let name = CString::new("canal-segment").expect("static name");
    // SAFETY: `name` is a valid NUL-terminated string.
    let fd = owned(cvt(unsafe {
        libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
    } as libc::c_int)?);
    let len = segment::segment_size_zones(ring_size, zone_size);
    // SAFETY: plain call on a descriptor we own.
    cvt(unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) })?;
    let h = if zone_size == 0 {
        segment::encode_header(id, ring_size)
    } else {
        segment::encode_header_zones(id, ring_size, zone_size)
    };
    // SAFETY: h is a valid buffer of h.len() bytes.
    let n = cvt_size(unsafe { libc::pwrite(fd.as_raw_fd(), h.as_ptr().cast(), h.len(), 0) })?;
    if n != h.len() {
        return Err(io::Error::from_raw_os_error(libc::EIO));
    }
    // Neither guest may resize it under the other's mapping (SIGBUS), nor write through
    // a non-shared path: shrink/grow are sealed.
    // SAFETY: plain fcntl on a descriptor we own.
    cvt(unsafe {
        libc::fcntl(
            fd.as_raw_fd(),
            libc::F_ADD_SEALS,
            libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL,
        )
    })?;
    Ok(fd)
}

/// Reads the little-endian u64 at `off` of a file (a segment's index word). The value
/// is guest-written: callers treat it as untrusted.
pub(crate) fn pread_u64(fd: &OwnedFd, off: u64) -> Option<u64> {
    let mut b = [0u8; 8];
    // SAFETY: b is a valid writable buffer of 8 bytes.
    let n = unsafe { libc::pread(fd.as_raw_fd(), b.as_mut_ptr().cast(), 8, off as libc::off_t) };
    (n == 8).then(|| u64::from_le_bytes(b))
}

/// The host's own interface addresses (getifaddrs), for deciding whether a connect
/// target is this host.
pub(crate) fn local_addrs() -> Vec<CanalAddr> {
    let mut out = Vec::new();
    let mut ifa: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills ifa with a list we free below.
    if unsafe { libc::getifaddrs(&mut ifa) } != 0 {
        return out;
    }
    let mut p = ifa;
    while !p.is_null() {
        // SAFETY: p is a node of the list getifaddrs returned, not yet freed.
        let n = unsafe { &*p };
        if !n.ifa_addr.is_null() {
            let mut ss = zeroed_storage();
            // SAFETY: ifa_addr points to a sockaddr of its family's size; we copy at
            // most that many bytes into the (larger) storage.
            let fam = unsafe { (*n.ifa_addr).sa_family } as i32;
            let len = match fam {
                libc::AF_INET => std::mem::size_of::<libc::sockaddr_in>(),
                libc::AF_INET6 => std::mem::size_of::<libc::sockaddr_in6>(),
                _ => 0,
            };
            if len > 0 {
                // SAFETY: as above.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        n.ifa_addr as *const u8,
                        &mut ss as *mut _ as *mut u8,
                        len,
                    )
                };
                if let Some(a) = from_sockaddr(&ss) {
                    out.push(a);
                }
            }
        }
        p = n.ifa_next;
    }
    // SAFETY: ifa came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(ifa) };
    out
}

impl Mapping {
    /// Increments the u32 at `off` (4-aligned, inside the mapping) and FUTEX_WAKEs
    /// every waiter on it (shared futex: the word lives in a memfd that guests map).
    /// Used on a pair segment's `wake_seq` words; a guest may scribble on the word,
    /// which only costs it spurious or missed wake-ups of its own threads.
    pub(crate) fn futex_bump_wake(&self, off: usize) {
        if !off.is_multiple_of(4) || off + 4 > self.len {
            return;
        }
        // SAFETY: off is 4-aligned and inside the mapping (checked); an AtomicU32 over
        // shared memory accepts any bit pattern.
        let w = unsafe { &*(self.base.add(off) as *const std::sync::atomic::AtomicU32) };
        w.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        // SAFETY: a plain futex call on a valid, mapped, aligned word.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                w.as_ptr(),
                libc::FUTEX_WAKE,
                i32::MAX,
                std::ptr::null::<libc::timespec>(),
                std::ptr::null::<u32>(),
                0u32,
            )
        };
    }
}

impl Mapping {
    /// Writes both zones of a fresh segment with zones (`layout` from `zone::plan`,
    /// `layout.zone_size` bytes each): headers and full free lists. canald's own
    /// segment, before any guest has it; false if the mapping is too small.
    pub(crate) fn init_zones(&self, ring_size: u64, layout: &canal_abi::zone::ZoneLayout) -> bool {
        use canal_abi::segment;
        let zs = layout.zone_size;
        if segment::segment_size_zones(ring_size, zs) > self.len as u64 {
            return false;
        }
        for d in 0..2 {
            let off = segment::zone_offset(d, ring_size, zs) as usize;
            // SAFETY: the zone lies inside the mapping (checked), page-aligned.
            let z = unsafe { canal_abi::zone::MappedZone::new(self.base.add(off), *layout) };
            z.init();
        }
        true
    }

    /// A mapped pair segment (tests play a guest with it): its header and its two
    /// rings, if the mapping is large enough for the ring size its header claims.
    pub fn segment_view(&self) -> Option<(&canal_abi::segment::SegHeader, [RawRing; 2])> {
        use canal_abi::segment;
        if self.len < segment::SEG_HEADER_SIZE as usize {
            return None;
        }
        // SAFETY: the mapping holds at least the 4096-byte page 0; SegHeader (512
        // bytes) accepts any bit pattern and is used through shared references.
        let h = unsafe { &*(self.base as *const segment::SegHeader) };
        let rs = h.ring_size;
        if !rs.is_power_of_two() || segment::segment_size(rs) > self.len as u64 {
            return None;
        }
        // SAFETY: both rings lie inside the mapping (checked), rs is a power of two.
        let r =
            |d| unsafe { RawRing::new(self.base.add(segment::ring_offset(d, rs) as usize), rs) };
        Some((h, [r(0), r(1)]))
    }
}

/// Makes `cmd`'s child start a new session (setsid) before it execs, so that the
/// terminal's signals for the parent's process group never reach it.
pub fn new_session_on_exec(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: setsid() is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
}
