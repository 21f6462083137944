//! What every hook shares: the re-entry guard, the errno convention, the dispatch
//! between canal and ordinary descriptors, and argument checks.
use crate::conn::guest::Guest;
use crate::fdtable::Entry;
use crate::fdtable::FdTable;
use crate::fdtable::TABLE;
use crate::fdtable::TABLE_LEN;
use crate::sock::core::Sock;
use crate::sockaddr;
use crate::sys;
use crate::sys::real;
use core::cell::Cell;
use libc::c_int;
use libc::iovec;
use libc::sockaddr as SockAddr;
use libc::socklen_t;
use std::panic::catch_unwind;
use std::panic::AssertUnwindSafe;

thread_local! {
    /// Set while this thread runs library code: a hook entered again (the library's
    /// own internals, or a signal handler interrupting them) goes to libc directly.
    static IN_LIB: Cell<bool> = const { Cell::new(false) };
}

pub(crate) struct Reentry;

impl Reentry {
    pub(crate) fn enter() -> Option<Reentry> {
        IN_LIB
            .try_with(|c| if c.replace(true) { None } else { Some(Reentry) })
            .ok()
            .flatten()
    }
}

impl Drop for Reentry {
    fn drop(&mut self) {
        let _ = IN_LIB.try_with(|c| c.set(false));
    }
}

/// Runs a canal operation: re-entrancy guard, panic catch, errno convention (errno is
/// left as the caller had it on success).
pub(crate) fn run(f: impl FnOnce() -> Result<isize, i32>) -> isize {
    let saved = sys::errno();
    let r = catch_unwind(AssertUnwindSafe(f));
    let _ = catch_unwind(crate::sock::close::unpin);
    match r {
        Ok(Ok(v)) => {
            sys::set_errno(saved);
            v
        }
        Ok(Err(e)) => {
            sys::set_errno(e);
            -1
        }
        Err(_) => {
            sys::set_errno(libc::EIO);
            -1
        }
    }
}

/// The socket behind a canal descriptor's handle.
pub(crate) fn sock_of(h: u32) -> Result<Sock, i32> {
    let g: &'static Guest = crate::conn::guest::guest().ok_or(libc::EBADF)?;
    Sock::new(g, h)
}

#[inline(always)]
pub(crate) fn canal(fd: c_int) -> Option<u32> {
    FdTable::<TABLE_LEN>::decode(TABLE.raw(fd)).and_then(|e| match e {
        Entry::Canal(h) => Some(h),
        Entry::Internal | Entry::Epoll | Entry::Bridged(_) | Entry::Undecided(_) => None,
    })
}

/// For control calls (names, socket options): a canal socket, or the canal socket a
/// bridged descriptor carries (bridge.rs; its data calls go to the kernel).
#[inline]
pub(crate) fn canal_ctl(fd: c_int) -> Option<u32> {
    FdTable::<TABLE_LEN>::decode(TABLE.raw(fd)).and_then(|e| match e {
        Entry::Canal(h) | Entry::Bridged(h) => Some(h),
        Entry::Internal | Entry::Epoll | Entry::Undecided(_) => None,
    })
}

/// Dispatches: ordinary (or re-entered) → `$real`, canal → `$body` with `$s: Sock`.
macro_rules! dispatch {
    (ctl $fd:expr, $real:expr, |$s:ident| $body:expr) => {
        $crate::hooks::common::dispatch!(@with canal_ctl, $fd, $real, |$s| $body)
    };
    ($fd:expr, $real:expr, |$s:ident| $body:expr) => {
        $crate::hooks::common::dispatch!(@with canal, $fd, $real, |$s| $body)
    };
    (@with $pick:ident, $fd:expr, $real:expr, |$s:ident| $body:expr) => {{
        let fd = $fd;
        #[allow(unused_unsafe)]
        match $crate::hooks::common::$pick(fd) {
            // SAFETY: forwarding the caller's own arguments to the real libc function.
            None => unsafe { $real },
            Some(h) => match $crate::hooks::common::Reentry::enter() {
                // SAFETY: as above.
                None => unsafe { $real },
                Some(_g) => $crate::hooks::common::run(|| {
                    $crate::conn::pin::set_current_fd(fd);
                    let $s = $crate::hooks::common::sock_of(h)?;
                    #[allow(clippy::redundant_closure_call)]
                    let r: Result<isize, i32> = (|| $body)();
                    match r {
                        // Another process passed it on (handoff.rs): a listener or an
                        // unconnected stream, whose calls here fail; the kernel's
                        // socket now. Looked at only on failure: the data path pays
                        // nothing.
                        Err(e) if e != libc::EAGAIN && $s.handed_over() => {
                            $crate::handoff::follow(fd, $s)?;
                            // SAFETY: as above, on the kernel socket now at `fd`.
                            $crate::hooks::common::real_result(unsafe { $real } as isize)
                        }
                        r => r,
                    }
                }) as _,
            },
        }
    }};
}
pub(crate) use dispatch;

pub(crate) type FnIntInt = unsafe extern "C" fn(c_int, c_int) -> c_int;

pub(crate) type FnInt = unsafe extern "C" fn(c_int) -> c_int;

type FnChkFail = unsafe extern "C" fn() -> !;

pub(crate) fn chk_fail() -> ! {
    // SAFETY: __chk_fail takes no arguments and never returns (it aborts).
    unsafe { real!(c"__chk_fail", FnChkFail)() }
}

/// The application's (addr, len) sockaddr.
pub(crate) fn addr_in(addr: *const SockAddr, len: socklen_t) -> Result<canal_abi::CanalAddr, i32> {
    // SAFETY: the application passes (addr, len) describing its sockaddr (as to the
    // kernel); read_sockaddr checks null and reads at most len bytes.
    unsafe { sockaddr::read_sockaddr(addr, len) }
}

/// The selection policy: `a` is excluded (CANAL_EXCLUDE) and this is the socket's
/// first bind/connect/sendto, so the socket at `fd` becomes a kernel socket now.
pub(crate) fn leave_to_kernel(fd: c_int, s: &Sock, a: &canal_abi::CanalAddr) -> Result<bool, i32> {
    if !crate::policy::active() || !crate::policy::undecided(s) || !crate::policy::excluded(a) {
        return Ok(false);
    }
    crate::handoff::handoff(s.g, fd, *s)?;
    Ok(true)
}

/// A real libc call's result as the hooks' Result (errno read right after it).
pub(crate) fn real_result(r: isize) -> Result<isize, i32> {
    if r < 0 {
        Err(sys::errno())
    } else {
        Ok(r)
    }
}

/// The destination of sendto/sendmsg. TCP ignores it entirely once the kernel has
/// copied it in (only the length is checked: EINVAL above sockaddr_storage), so a
/// stream socket never parses it — servers pass whatever recvfrom left there — except
/// with MSG_FASTOPEN, where it is the address to connect to.
pub(crate) fn dest_in(
    s: Sock,
    addr: *const SockAddr,
    len: socklen_t,
    flags: c_int,
) -> Result<Option<canal_abi::CanalAddr>, i32> {
    if addr.is_null() {
        return Ok(None);
    }
    if s.kind() != canal_abi::sock_kind::DGRAM && flags & libc::MSG_FASTOPEN == 0 {
        if len as usize > core::mem::size_of::<libc::sockaddr_storage>() {
            return Err(libc::EINVAL);
        }
        return Ok(None);
    }
    addr_in(addr, len).map(Some)
}

pub(crate) fn slice_iov(iov: *const iovec, n: c_int) -> Result<&'static [iovec], i32> {
    if !(0..=libc::UIO_MAXIOV).contains(&n) {
        return Err(libc::EINVAL);
    }
    if n == 0 {
        return Ok(&[]);
    }
    if iov.is_null() {
        return Err(libc::EFAULT);
    }
    // SAFETY: the application passes `n` iovecs at `iov`.
    Ok(unsafe { core::slice::from_raw_parts(iov, n as usize) })
}

// ---- socket and control calls ---------------------------------------------------------------

pub(crate) fn supported(domain: c_int, ty: c_int, proto: c_int) -> Option<(c_int, bool, bool)> {
    if domain != libc::AF_INET && domain != libc::AF_INET6 {
        return None;
    }
    let extra = ty & !(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC);
    let ok = match extra {
        libc::SOCK_STREAM => proto == 0 || proto == libc::IPPROTO_TCP,
        libc::SOCK_DGRAM => proto == 0 || proto == libc::IPPROTO_UDP,
        _ => false,
    };
    ok.then_some((
        extra,
        ty & libc::SOCK_NONBLOCK != 0,
        ty & libc::SOCK_CLOEXEC != 0,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn supported_sockets() {
        let nb = libc::SOCK_NONBLOCK;
        let ce = libc::SOCK_CLOEXEC;
        assert_eq!(
            supported(libc::AF_INET, libc::SOCK_STREAM, 0),
            Some((libc::SOCK_STREAM, false, false))
        );
        assert_eq!(
            supported(
                libc::AF_INET6,
                libc::SOCK_DGRAM | nb | ce,
                libc::IPPROTO_UDP
            ),
            Some((libc::SOCK_DGRAM, true, true))
        );
        assert_eq!(
            supported(libc::AF_INET, libc::SOCK_STREAM, libc::IPPROTO_UDP),
            None
        );
        assert_eq!(supported(libc::AF_INET, libc::SOCK_RAW, 0), None);
        assert_eq!(supported(libc::AF_UNIX, libc::SOCK_STREAM, 0), None);
        assert_eq!(
            supported(libc::AF_INET, libc::SOCK_STREAM, 132),
            None,
            "SCTP passes through"
        );
        assert_eq!(supported(libc::AF_INET, libc::SOCK_SEQPACKET, 0), None);
    }

    #[test]
    fn iov_limits() {
        assert_eq!(slice_iov(core::ptr::null(), 0).unwrap().len(), 0);
        assert_eq!(slice_iov(core::ptr::null(), 1).unwrap_err(), libc::EFAULT);
        assert_eq!(slice_iov(core::ptr::null(), -1).unwrap_err(), libc::EINVAL);
        assert_eq!(
            slice_iov(core::ptr::null(), libc::UIO_MAXIOV + 1).unwrap_err(),
            libc::EINVAL
        );
    }
}
