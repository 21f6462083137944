//! The `extern "C"` entry points that shadow libc's when preloaded. Each is thin: one
//! bounds check and one load in the descriptor table; an ordinary descriptor goes
//! straight to the real libc function; a canal descriptor goes to `sock`/`poll`.
//!
//! `#[cfg_attr(not(test), no_mangle)]` keeps unit tests from interposing themselves.
#![allow(clippy::missing_safety_doc)]

use crate::client::{self, Guest};
use crate::cmd::{fcntl_action, FcntlAction};
use crate::fdtable::{Entry, FdTable, TABLE, TABLE_LEN};
use crate::sock::{self, RecvMeta, Sock};
use crate::sockaddr;
use crate::{epoll, poll, real, sys};
use core::cell::Cell;
use libc::{
    c_int, c_uint, c_ulong, c_void, iovec, msghdr, nfds_t, pollfd, size_t, sockaddr as SockAddr,
    socklen_t, ssize_t,
};
use std::panic::{catch_unwind, AssertUnwindSafe};

thread_local! {
    /// Set while this thread runs library code: a hook entered again (the library's
    /// own internals, or a signal handler interrupting them) goes to libc directly.
    static IN_LIB: Cell<bool> = const { Cell::new(false) };
}

struct Reentry;

impl Reentry {
    fn enter() -> Option<Reentry> {
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
fn run(f: impl FnOnce() -> Result<isize, i32>) -> isize {
    let saved = sys::errno();
    let r = catch_unwind(AssertUnwindSafe(f));
    let _ = catch_unwind(client::unpin);
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
fn sock_of(h: u32) -> Result<Sock, i32> {
    let g: &'static Guest = client::guest().ok_or(libc::EBADF)?;
    Sock::new(g, h)
}

#[inline(always)]
fn canal(fd: c_int) -> Option<u32> {
    FdTable::<TABLE_LEN>::decode(TABLE.raw(fd)).and_then(|e| match e {
        Entry::Canal(h) => Some(h),
        Entry::Internal | Entry::Epoll => None,
    })
}

/// Dispatches: ordinary (or re-entered) → `$real`, canal → `$body` with `$s: Sock`.
macro_rules! dispatch {
    ($fd:expr, $real:expr, |$s:ident| $body:expr) => {{
        let fd = $fd;
        #[allow(unused_unsafe)]
        match canal(fd) {
            // SAFETY: forwarding the caller's own arguments to the real libc function.
            None => unsafe { $real },
            Some(h) => match Reentry::enter() {
                // SAFETY: as above.
                None => unsafe { $real },
                Some(_g) => run(|| {
                    client::set_current_fd(fd);
                    let $s = sock_of(h)?;
                    $body
                }) as _,
            },
        }
    }};
}

type FnSocket = unsafe extern "C" fn(c_int, c_int, c_int) -> c_int;
type FnAddr = unsafe extern "C" fn(c_int, *const SockAddr, socklen_t) -> c_int;
type FnAddrOut = unsafe extern "C" fn(c_int, *mut SockAddr, *mut socklen_t) -> c_int;
type FnAccept4 = unsafe extern "C" fn(c_int, *mut SockAddr, *mut socklen_t, c_int) -> c_int;
type FnIntInt = unsafe extern "C" fn(c_int, c_int) -> c_int;
type FnInt = unsafe extern "C" fn(c_int) -> c_int;
type FnSend = unsafe extern "C" fn(c_int, *const c_void, size_t, c_int) -> ssize_t;
type FnSendTo = unsafe extern "C" fn(
    c_int,
    *const c_void,
    size_t,
    c_int,
    *const SockAddr,
    socklen_t,
) -> ssize_t;
type FnSendMsg = unsafe extern "C" fn(c_int, *const msghdr, c_int) -> ssize_t;
type FnRecv = unsafe extern "C" fn(c_int, *mut c_void, size_t, c_int) -> ssize_t;
type FnRecvFrom = unsafe extern "C" fn(
    c_int,
    *mut c_void,
    size_t,
    c_int,
    *mut SockAddr,
    *mut socklen_t,
) -> ssize_t;
type FnRecvMsg = unsafe extern "C" fn(c_int, *mut msghdr, c_int) -> ssize_t;
type FnRead = unsafe extern "C" fn(c_int, *mut c_void, size_t) -> ssize_t;
type FnWrite = unsafe extern "C" fn(c_int, *const c_void, size_t) -> ssize_t;
type FnIov = unsafe extern "C" fn(c_int, *const iovec, c_int) -> ssize_t;
type FnSetOpt = unsafe extern "C" fn(c_int, c_int, c_int, *const c_void, socklen_t) -> c_int;
type FnGetOpt = unsafe extern "C" fn(c_int, c_int, c_int, *mut c_void, *mut socklen_t) -> c_int;
type FnFcntl = unsafe extern "C" fn(c_int, c_int, c_ulong) -> c_int;
type FnIoctl = unsafe extern "C" fn(c_int, c_ulong, *mut c_void) -> c_int;
type FnPoll = unsafe extern "C" fn(*mut pollfd, nfds_t, c_int) -> c_int;
type FnPpoll = unsafe extern "C" fn(
    *mut pollfd,
    nfds_t,
    *const libc::timespec,
    *const libc::sigset_t,
) -> c_int;
type FnSelect = unsafe extern "C" fn(
    c_int,
    *mut libc::fd_set,
    *mut libc::fd_set,
    *mut libc::fd_set,
    *mut libc::timeval,
) -> c_int;
type FnPselect = unsafe extern "C" fn(
    c_int,
    *mut libc::fd_set,
    *mut libc::fd_set,
    *mut libc::fd_set,
    *const libc::timespec,
    *const libc::sigset_t,
) -> c_int;
type FnDup3 = unsafe extern "C" fn(c_int, c_int, c_int) -> c_int;
type FnRecvChk = unsafe extern "C" fn(c_int, *mut c_void, size_t, size_t, c_int) -> ssize_t;
type FnRecvFromChk = unsafe extern "C" fn(
    c_int,
    *mut c_void,
    size_t,
    size_t,
    c_int,
    *mut SockAddr,
    *mut socklen_t,
) -> ssize_t;
type FnReadChk = unsafe extern "C" fn(c_int, *mut c_void, size_t, size_t) -> ssize_t;
type FnChkFail = unsafe extern "C" fn() -> !;

fn chk_fail() -> ! {
    // SAFETY: __chk_fail takes no arguments and never returns (it aborts).
    unsafe { real!(c"__chk_fail", FnChkFail)() }
}

/// The application's (addr, len) sockaddr.
fn addr_in(addr: *const SockAddr, len: socklen_t) -> Result<canal_abi::CanalAddr, i32> {
    // SAFETY: the application passes (addr, len) describing its sockaddr (as to the
    // kernel); read_sockaddr checks null and reads at most len bytes.
    unsafe { sockaddr::read_sockaddr(addr, len) }
}

/// The selection policy: `a` is excluded (CANAL_EXCLUDE) and this is the socket's
/// first bind/connect/sendto, so the socket at `fd` becomes a kernel socket now.
fn leave_to_kernel(fd: c_int, s: &Sock, a: &canal_abi::CanalAddr) -> Result<bool, i32> {
    if !crate::policy::active() || !crate::policy::undecided(s) || !crate::policy::excluded(a) {
        return Ok(false);
    }
    crate::policy::handoff(s.g, fd, *s)?;
    Ok(true)
}

/// A real libc call's result as the hooks' Result (errno read right after it).
fn real_result(r: isize) -> Result<isize, i32> {
    if r < 0 {
        Err(sys::errno())
    } else {
        Ok(r)
    }
}

/// The destination of sendto/sendmsg. TCP ignores it entirely once the kernel has
/// copied it in (only the length is checked: EINVAL above sockaddr_storage), so a
/// stream socket never parses it — servers pass whatever recvfrom left there.
fn dest_in(
    s: Sock,
    addr: *const SockAddr,
    len: socklen_t,
) -> Result<Option<canal_abi::CanalAddr>, i32> {
    if addr.is_null() {
        return Ok(None);
    }
    if s.kind() != canal_abi::sock_kind::DGRAM {
        if len as usize > core::mem::size_of::<libc::sockaddr_storage>() {
            return Err(libc::EINVAL);
        }
        return Ok(None);
    }
    addr_in(addr, len).map(Some)
}

fn slice_iov(iov: *const iovec, n: c_int) -> Result<&'static [iovec], i32> {
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

fn supported(domain: c_int, ty: c_int, proto: c_int) -> Option<(c_int, bool, bool)> {
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

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn socket(domain: c_int, ty: c_int, proto: c_int) -> c_int {
    let real = || {
        // SAFETY: forwarding the caller's arguments to libc's socket.
        unsafe { real!(c"socket", FnSocket)(domain, ty, proto) }
    };
    let Some((base, nonblock, cloexec)) = supported(domain, ty, proto) else {
        return real();
    };
    let Some(_guard) = Reentry::enter() else {
        return real();
    };
    let Some(g) = client::ensure_attached() else {
        return real();
    };
    let need = if base == libc::SOCK_STREAM {
        canal_abi::feature::STREAM
    } else {
        canal_abi::feature::DGRAM
    };
    if client::is_dead(g) {
        // canald went away (or restarted): a kernel socket would escape its policy
        // unnoticed. New sockets fail until the program restarts under canal.
        client::mark_dead();
        sys::set_errno(libc::ENETDOWN);
        return -1;
    }
    if g.region.header().features & need == 0 {
        return real();
    }
    run(|| {
        sock::socket(g, domain, base, proto, nonblock, cloexec)
            .map(|fd| fd as isize)
            // canald vanished during the call: the same answer as after it.
            .map_err(|e| {
                if client::is_dead(g) {
                    libc::ENETDOWN
                } else {
                    e
                }
            })
    }) as c_int
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn bind(fd: c_int, addr: *const SockAddr, len: socklen_t) -> c_int {
    dispatch!(fd, real!(c"bind", FnAddr)(fd, addr, len), |s| {
        let a = addr_in(addr, len)?;
        if leave_to_kernel(fd, &s, &a)? {
            // SAFETY: forwarding to libc's bind on the kernel socket now at `fd`.
            return real_result(unsafe { real!(c"bind", FnAddr)(fd, addr, len) } as isize);
        }
        crate::policy::commit(&s);
        sock::bind(s, &a).map(|_| 0)
    }) as c_int
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn connect(fd: c_int, addr: *const SockAddr, len: socklen_t) -> c_int {
    dispatch!(fd, real!(c"connect", FnAddr)(fd, addr, len), |s| {
        if s.kind() == canal_abi::sock_kind::DGRAM
            && !addr.is_null()
            && len as usize >= core::mem::size_of::<libc::sa_family_t>()
            // SAFETY: the application passes at least `len` (≥ 2) readable bytes.
            && unsafe { core::ptr::read_unaligned(addr as *const libc::sa_family_t) }
                == libc::AF_UNSPEC as libc::sa_family_t
        {
            return sock::disconnect(s).map(|_| 0);
        }
        let a = addr_in(addr, len)?;
        if leave_to_kernel(fd, &s, &a)? {
            // SAFETY: forwarding to libc's connect on the kernel socket now at `fd`.
            return real_result(unsafe { real!(c"connect", FnAddr)(fd, addr, len) } as isize);
        }
        crate::policy::commit(&s);
        sock::connect(s, &a).map(|_| 0)
    }) as c_int
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn listen(fd: c_int, backlog: c_int) -> c_int {
    dispatch!(fd, real!(c"listen", FnIntInt)(fd, backlog), |s| {
        crate::policy::commit(&s);
        sock::listen(s, backlog).map(|_| 0)
    }) as c_int
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn accept(fd: c_int, addr: *mut SockAddr, lenp: *mut socklen_t) -> c_int {
    dispatch!(fd, real!(c"accept", FnAddrOut)(fd, addr, lenp), |s| {
        do_accept(s, addr, lenp, 0)
    }) as c_int
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn accept4(
    fd: c_int,
    addr: *mut SockAddr,
    lenp: *mut socklen_t,
    flags: c_int,
) -> c_int {
    dispatch!(
        fd,
        real!(c"accept4", FnAccept4)(fd, addr, lenp, flags),
        |s| do_accept(s, addr, lenp, flags)
    ) as c_int
}

fn do_accept(
    s: Sock,
    addr: *mut SockAddr,
    lenp: *mut socklen_t,
    flags: c_int,
) -> Result<isize, i32> {
    if flags & !(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC) != 0 {
        return Err(libc::EINVAL);
    }
    if !addr.is_null() && lenp.is_null() {
        return Err(libc::EFAULT);
    }
    // SAFETY: reading the application's addrlen (non-null when addr is).
    if !addr.is_null() && (unsafe { *lenp } as i32) < 0 {
        return Err(libc::EINVAL);
    }
    let (nfd, peer) = sock::accept(s, flags)?;
    if let Some(p) = peer {
        // SAFETY: (addr, lenp) are the application's out-parameters.
        unsafe { sockaddr::write_sockaddr(&p, addr, lenp) };
    } else if !lenp.is_null() && !addr.is_null() {
        // SAFETY: as above.
        unsafe { *lenp = 0 };
    }
    Ok(nfd as isize)
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn shutdown(fd: c_int, how: c_int) -> c_int {
    dispatch!(fd, real!(c"shutdown", FnIntInt)(fd, how), |s| {
        sock::shutdown(s, how).map(|_| 0)
    }) as c_int
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn getsockname(
    fd: c_int,
    addr: *mut SockAddr,
    lenp: *mut socklen_t,
) -> c_int {
    dispatch!(fd, real!(c"getsockname", FnAddrOut)(fd, addr, lenp), |s| {
        name_out(s, false, addr, lenp)
    }) as c_int
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn getpeername(
    fd: c_int,
    addr: *mut SockAddr,
    lenp: *mut socklen_t,
) -> c_int {
    dispatch!(fd, real!(c"getpeername", FnAddrOut)(fd, addr, lenp), |s| {
        name_out(s, true, addr, lenp)
    }) as c_int
}

fn name_out(s: Sock, peer: bool, addr: *mut SockAddr, lenp: *mut socklen_t) -> Result<isize, i32> {
    if addr.is_null() || lenp.is_null() {
        return Err(libc::EFAULT);
    }
    // SAFETY: lenp is the application's valid pointer (checked non-null).
    if (unsafe { *lenp } as i32) < 0 {
        return Err(libc::EINVAL);
    }
    let a = sock::name(s, peer)?;
    // SAFETY: (addr, lenp) are the application's out-parameters.
    unsafe { sockaddr::write_sockaddr(&a, addr, lenp) };
    Ok(0)
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn setsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *const c_void,
    len: socklen_t,
) -> c_int {
    dispatch!(
        fd,
        real!(c"setsockopt", FnSetOpt)(fd, level, name, val, len),
        |s| {
            if (len as i32) < 0 {
                return Err(libc::EINVAL);
            }
            let v: &[u8] = if len == 0 {
                &[]
            } else if val.is_null() {
                return Err(libc::EFAULT);
            } else {
                // SAFETY: the application passes `len` readable bytes at `val`.
                unsafe { core::slice::from_raw_parts(val as *const u8, len as usize) }
            };
            sock::setsockopt(s, level, name, v)?;
            crate::policy::record_option(&s, level, name, v);
            Ok(0)
        }
    ) as c_int
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn getsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    lenp: *mut socklen_t,
) -> c_int {
    dispatch!(
        fd,
        real!(c"getsockopt", FnGetOpt)(fd, level, name, val, lenp),
        |s| {
            if lenp.is_null() {
                return Err(libc::EFAULT);
            }
            // SAFETY: lenp is the application's valid pointer (checked non-null).
            let len = unsafe { *lenp } as i32;
            if len < 0 {
                return Err(libc::EINVAL);
            }
            let out: &mut [u8] = if len == 0 || val.is_null() {
                &mut []
            } else {
                // SAFETY: the application passes `len` writable bytes at `val`.
                unsafe { core::slice::from_raw_parts_mut(val as *mut u8, len as usize) }
            };
            let n = sock::getsockopt(s, level, name, out)?;
            // SAFETY: as above.
            unsafe { *lenp = n as socklen_t };
            Ok(0)
        }
    ) as c_int
}

// ---- data calls -------------------------------------------------------------------------------

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn send(fd: c_int, buf: *const c_void, len: size_t, flags: c_int) -> ssize_t {
    dispatch!(fd, real!(c"send", FnSend)(fd, buf, len, flags), |s| {
        let v = [crate::iov::single(buf as *mut c_void, len)];
        sock::send(s, &v, flags, None).map(|n| n as isize)
    })
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn sendto(
    fd: c_int,
    buf: *const c_void,
    len: size_t,
    flags: c_int,
    addr: *const SockAddr,
    alen: socklen_t,
) -> ssize_t {
    dispatch!(
        fd,
        real!(c"sendto", FnSendTo)(fd, buf, len, flags, addr, alen),
        |s| {
            let to = dest_in(s, addr, alen)?;
            if let Some(a) = &to {
                if leave_to_kernel(fd, &s, a)? {
                    // SAFETY: forwarding to libc's sendto on the kernel socket now at `fd`.
                    let r = unsafe { real!(c"sendto", FnSendTo)(fd, buf, len, flags, addr, alen) };
                    return real_result(r);
                }
                crate::policy::commit(&s);
            }
            let v = [crate::iov::single(buf as *mut c_void, len)];
            sock::send(s, &v, flags, to.as_ref()).map(|n| n as isize)
        }
    )
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t {
    dispatch!(fd, real!(c"sendmsg", FnSendMsg)(fd, msg, flags), |s| {
        sendmsg_one(s, msg, flags)
    })
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, len: size_t) -> ssize_t {
    dispatch!(fd, real!(c"write", FnWrite)(fd, buf, len), |s| {
        let v = [crate::iov::single(buf as *mut c_void, len)];
        sock::send(s, &v, 0, None).map(|n| n as isize)
    })
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const iovec, n: c_int) -> ssize_t {
    dispatch!(fd, real!(c"writev", FnIov)(fd, iov, n), |s| {
        sock::send(s, slice_iov(iov, n)?, 0, None).map(|n| n as isize)
    })
}

fn recv_into(
    s: Sock,
    buf: *mut c_void,
    len: size_t,
    flags: c_int,
    addr: *mut SockAddr,
    lenp: *mut socklen_t,
) -> Result<isize, i32> {
    let v = [crate::iov::single(buf, len)];
    let mut meta = RecvMeta::default();
    let n = sock::recv(s, &v, flags, &mut meta)?;
    if !addr.is_null() && !lenp.is_null() {
        match meta.from {
            // SAFETY: (addr, lenp) are the application's out-parameters.
            Some(a) => unsafe { sockaddr::write_sockaddr(&a, addr, lenp) },
            // Stream sockets report no address (Linux sets the length to 0).
            // SAFETY: as above.
            None => unsafe { *lenp = 0 },
        }
    }
    Ok(n as isize)
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn recv(fd: c_int, buf: *mut c_void, len: size_t, flags: c_int) -> ssize_t {
    dispatch!(fd, real!(c"recv", FnRecv)(fd, buf, len, flags), |s| {
        recv_into(
            s,
            buf,
            len,
            flags,
            core::ptr::null_mut(),
            core::ptr::null_mut(),
        )
    })
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn recvfrom(
    fd: c_int,
    buf: *mut c_void,
    len: size_t,
    flags: c_int,
    addr: *mut SockAddr,
    lenp: *mut socklen_t,
) -> ssize_t {
    dispatch!(
        fd,
        real!(c"recvfrom", FnRecvFrom)(fd, buf, len, flags, addr, lenp),
        |s| recv_into(s, buf, len, flags, addr, lenp)
    )
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t {
    dispatch!(fd, real!(c"recvmsg", FnRecvMsg)(fd, msg, flags), |s| {
        recvmsg_one(s, msg, flags)
    })
}

fn recvmsg_one(s: Sock, msg: *mut msghdr, flags: c_int) -> Result<isize, i32> {
    if msg.is_null() {
        return Err(libc::EFAULT);
    }
    // SAFETY: the application passes a valid msghdr it lets us update.
    let m = unsafe { &mut *msg };
    let iov = slice_iov(m.msg_iov, m.msg_iovlen as c_int)?;
    let mut meta = RecvMeta::default();
    let n = sock::recv(s, iov, flags, &mut meta)?;
    if !m.msg_name.is_null() {
        match meta.from {
            // SAFETY: msg_name has msg_namelen writable bytes (the application's).
            Some(a) => unsafe {
                sockaddr::write_sockaddr(&a, m.msg_name as *mut SockAddr, &mut m.msg_namelen)
            },
            None => m.msg_namelen = 0,
        }
    }
    // No ancillary data is produced.
    m.msg_controllen = 0;
    m.msg_flags = meta.msg_flags;
    Ok(n as isize)
}

fn sendmsg_one(s: Sock, msg: *const msghdr, flags: c_int) -> Result<isize, i32> {
    if msg.is_null() {
        return Err(libc::EFAULT);
    }
    // SAFETY: the application passes a valid msghdr.
    let m = unsafe { &*msg };
    let iov = slice_iov(m.msg_iov, m.msg_iovlen as c_int)?;
    let to = if m.msg_name.is_null() || m.msg_namelen == 0 {
        None
    } else {
        dest_in(s, m.msg_name as *const SockAddr, m.msg_namelen)?
    };
    if to.is_some() {
        crate::policy::commit(&s);
    }
    sock::send(s, iov, flags, to.as_ref()).map(|n| n as isize)
}

type FnSendMmsg = unsafe extern "C" fn(c_int, *mut libc::mmsghdr, c_uint, c_int) -> c_int;
type FnRecvMmsg =
    unsafe extern "C" fn(c_int, *mut libc::mmsghdr, c_uint, c_int, *mut libc::timespec) -> c_int;

/// sendmmsg: sendmsg per message; an error after the first message ends the batch
/// and the count so far is returned (as Linux does).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn sendmmsg(
    fd: c_int,
    vec: *mut libc::mmsghdr,
    vlen: c_uint,
    flags: c_int,
) -> c_int {
    dispatch!(
        fd,
        real!(c"sendmmsg", FnSendMmsg)(fd, vec, vlen, flags),
        |s| {
            let vlen = vlen.min(libc::UIO_MAXIOV as c_uint) as usize;
            if vlen > 0 && vec.is_null() {
                return Err(libc::EFAULT);
            }
            let mut done = 0;
            while done < vlen {
                // SAFETY: the application passes `vlen` mmsghdrs at `vec`.
                let mh = unsafe { &mut *vec.add(done) };
                match sendmsg_one(s, &mh.msg_hdr, flags) {
                    Ok(n) => mh.msg_len = n as c_uint,
                    Err(e) if done == 0 => return Err(e),
                    Err(_) => break,
                }
                done += 1;
            }
            Ok(done as isize)
        }
    ) as c_int
}

/// recvmmsg: recvmsg per message. MSG_WAITFORONE makes every message after the first
/// non-blocking; the timeout is checked after each message (Linux's semantics).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn recvmmsg(
    fd: c_int,
    vec: *mut libc::mmsghdr,
    vlen: c_uint,
    flags: c_int,
    timeout: *mut libc::timespec,
) -> c_int {
    dispatch!(
        fd,
        real!(c"recvmmsg", FnRecvMmsg)(fd, vec, vlen, flags, timeout),
        |s| {
            let vlen = vlen.min(libc::UIO_MAXIOV as c_uint) as usize;
            if vlen > 0 && vec.is_null() {
                return Err(libc::EFAULT);
            }
            let deadline = ts_ns(timeout)?.map(|t| sys::now_ns().saturating_add(t));
            let mut fl = flags & !libc::MSG_WAITFORONE;
            let mut done = 0;
            while done < vlen {
                // SAFETY: the application passes `vlen` mmsghdrs at `vec`.
                let mh = unsafe { &mut *vec.add(done) };
                match recvmsg_one(s, &mut mh.msg_hdr, fl) {
                    Ok(n) => mh.msg_len = n as c_uint,
                    Err(e) if done == 0 => return Err(e),
                    Err(_) => break,
                }
                done += 1;
                if flags & libc::MSG_WAITFORONE != 0 {
                    fl |= libc::MSG_DONTWAIT;
                }
                if deadline.is_some_and(|d| sys::now_ns() >= d) {
                    break;
                }
            }
            Ok(done as isize)
        }
    ) as c_int
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, len: size_t) -> ssize_t {
    dispatch!(fd, real!(c"read", FnRead)(fd, buf, len), |s| {
        recv_into(s, buf, len, 0, core::ptr::null_mut(), core::ptr::null_mut())
    })
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const iovec, n: c_int) -> ssize_t {
    dispatch!(fd, real!(c"readv", FnIov)(fd, iov, n), |s| {
        let mut meta = RecvMeta::default();
        sock::recv(s, slice_iov(iov, n)?, 0, &mut meta).map(|n| n as isize)
    })
}

// ---- fortified variants (glibc's _FORTIFY_SOURCE) -----------------------------------------

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn __recv_chk(
    fd: c_int,
    buf: *mut c_void,
    len: size_t,
    buflen: size_t,
    flags: c_int,
) -> ssize_t {
    if canal(fd).is_none() {
        // SAFETY: forwarding to glibc's own checked function.
        return unsafe { real!(c"__recv_chk", FnRecvChk)(fd, buf, len, buflen, flags) };
    }
    if len > buflen {
        chk_fail();
    }
    // SAFETY: same contract as recv.
    unsafe { recv(fd, buf, len, flags) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn __recvfrom_chk(
    fd: c_int,
    buf: *mut c_void,
    len: size_t,
    buflen: size_t,
    flags: c_int,
    addr: *mut SockAddr,
    lenp: *mut socklen_t,
) -> ssize_t {
    if canal(fd).is_none() {
        // SAFETY: forwarding to glibc's own checked function.
        return unsafe {
            real!(c"__recvfrom_chk", FnRecvFromChk)(fd, buf, len, buflen, flags, addr, lenp)
        };
    }
    if len > buflen {
        chk_fail();
    }
    // SAFETY: same contract as recvfrom.
    unsafe { recvfrom(fd, buf, len, flags, addr, lenp) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn __read_chk(
    fd: c_int,
    buf: *mut c_void,
    len: size_t,
    buflen: size_t,
) -> ssize_t {
    if canal(fd).is_none() {
        // SAFETY: forwarding to glibc's own checked function.
        return unsafe { real!(c"__read_chk", FnReadChk)(fd, buf, len, buflen) };
    }
    if len > buflen {
        chk_fail();
    }
    // SAFETY: same contract as read.
    unsafe { read(fd, buf, len) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn __poll_chk(
    fds: *mut pollfd,
    nfds: nfds_t,
    timeout: c_int,
    fdslen: size_t,
) -> c_int {
    if fdslen / core::mem::size_of::<pollfd>() < nfds as usize {
        chk_fail();
    }
    // SAFETY: same contract as poll.
    unsafe { poll(fds, nfds, timeout) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn __ppoll_chk(
    fds: *mut pollfd,
    nfds: nfds_t,
    ts: *const libc::timespec,
    ss: *const libc::sigset_t,
    fdslen: size_t,
) -> c_int {
    if fdslen / core::mem::size_of::<pollfd>() < nfds as usize {
        chk_fail();
    }
    // SAFETY: same contract as ppoll.
    unsafe { ppoll(fds, nfds, ts, ss) }
}

// ---- descriptors -----------------------------------------------------------------------------

/// A vfork child (or posix_spawn's) runs in our memory with its own descriptor table:
/// it must not change the table or the reference counts the parent owns. Checked on
/// slow paths only (one getpid system call).
fn vfork_child() -> bool {
    client::PID.load(core::sync::atomic::Ordering::Relaxed) != sys::getpid()
}

type FnCloseRange = unsafe extern "C" fn(c_uint, c_uint, c_int) -> c_int;
type FnCloseFrom = unsafe extern "C" fn(c_int);

/// close_range: canal descriptors in the range are released as by close(); the
/// library's own descriptors are skipped (the range is split around them). With
/// CLOSE_RANGE_CLOEXEC nothing is closed now and the call passes through.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    let real = |a: c_uint, b: c_uint| {
        // SAFETY: forwarding to libc's close_range.
        unsafe { real!(c"close_range", FnCloseRange)(a, b, flags) }
    };
    if client::guest().is_none()
        || vfork_child()
        || flags & (libc::CLOSE_RANGE_CLOEXEC as c_int) != 0
        || first > last
    {
        return real(first, last);
    }
    let Some(_g) = Reentry::enter() else {
        return real(first, last);
    };
    let mut canal_fds: Vec<(c_int, u32)> = Vec::new();
    let mut internal: Vec<c_uint> = Vec::new();
    let high = TABLE.high_water() as u64;
    for fd in (first as u64)..(last as u64 + 1).min(high) {
        match TABLE.get(fd as c_int) {
            Some(Entry::Canal(h)) => canal_fds.push((fd as c_int, h)),
            Some(Entry::Internal) => internal.push(fd as c_uint),
            Some(Entry::Epoll) => {
                TABLE.take(fd as c_int);
                epoll::forget_fd(fd as c_int);
            }
            None => {}
        }
    }
    if let Some(g) = client::guest() {
        // A panic here must not unwind into C; the descriptors are closed regardless.
        let _ = catch_unwind(AssertUnwindSafe(|| {
            for (fd, h) in canal_fds {
                if TABLE.take(fd).is_some() {
                    epoll::forget_fd(fd);
                    sock::release(g, h);
                }
            }
        }));
    }
    // Close the pieces between our own descriptors.
    let mut start = first;
    for i in internal {
        if i > start {
            let r = real(start, i - 1);
            if r < 0 {
                return r;
            }
        }
        start = i.saturating_add(1);
        if i == c_uint::MAX {
            return 0;
        }
    }
    if start <= last {
        real(start, last)
    } else {
        0
    }
}

/// closefrom(lowfd) is close_range(lowfd, ~0, 0).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn closefrom(low: c_int) {
    if client::guest().is_none() || vfork_child() {
        // SAFETY: forwarding to libc's closefrom.
        unsafe { real!(c"closefrom", FnCloseFrom)(low) };
        return;
    }
    // SAFETY: same contract.
    let r = unsafe { close_range(low.max(0) as c_uint, c_uint::MAX, 0) };
    if r < 0 {
        // closefrom cannot fail; glibc falls back to closing one by one.
        for fd in low.max(0)..(TABLE.high_water() as c_int) {
            // SAFETY: closing descriptors, as closefrom does.
            unsafe { close(fd) };
        }
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    let w = TABLE.raw(fd);
    if w == 0 {
        // SAFETY: forwarding to libc's close.
        return unsafe { real!(c"close", FnInt)(fd) };
    }
    if vfork_child() {
        // SAFETY: forwarding to libc's close.
        return unsafe { real!(c"close", FnInt)(fd) };
    }
    match FdTable::<TABLE_LEN>::decode(w) {
        // The library's own descriptors (control socket, eventfds) stay open: code that
        // closes every descriptor it did not open (daemonising) must not cut us off.
        Some(Entry::Internal) => 0,
        Some(Entry::Epoll) => {
            if TABLE.take(fd).is_some() {
                epoll::forget_fd(fd);
            }
            // SAFETY: forwarding to libc's close.
            unsafe { real!(c"close", FnInt)(fd) }
        }
        Some(Entry::Canal(_)) => {
            let Some(_g) = Reentry::enter() else {
                // SAFETY: forwarding to libc's close.
                return unsafe { real!(c"close", FnInt)(fd) };
            };
            run(|| {
                if let Some(Entry::Canal(h)) = TABLE.take(fd) {
                    epoll::forget_fd(fd);
                    if let Some(g) = client::guest() {
                        sock::release(g, h);
                    }
                }
                sys::close(fd).map(|_| 0)
            }) as c_int
        }
        // SAFETY: forwarding to libc's close.
        None => unsafe { real!(c"close", FnInt)(fd) },
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    dispatch!(fd, real!(c"dup", FnInt)(fd), |s| {
        let nfd = sys::fcntl_int(fd, libc::F_DUPFD, 0)? as c_int;
        install_dup(s, nfd)
    }) as c_int
}

fn install_dup(s: Sock, nfd: c_int) -> Result<isize, i32> {
    match TABLE.set_canal(nfd, s.handle) {
        Ok(prev) => {
            sock::add_ref(s.g, s.handle);
            if let Some(Entry::Canal(old)) = prev {
                sock::release(s.g, old);
            }
            Ok(nfd as isize)
        }
        Err(e) => {
            let _ = sys::close(nfd);
            Err(e)
        }
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    // SAFETY: forwarding to libc's dup3 / dup2 with the caller's arguments.
    unsafe { dup_common(old, new, 0, true) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    // SAFETY: as above.
    unsafe { dup_common(old, new, flags, false) }
}

unsafe fn dup_common(old: c_int, new: c_int, flags: c_int, is_dup2: bool) -> c_int {
    let real = || {
        if is_dup2 {
            // SAFETY: forwarding to libc's dup2.
            unsafe { real!(c"dup2", FnIntInt)(old, new) }
        } else {
            // SAFETY: forwarding to libc's dup3.
            unsafe { real!(c"dup3", FnDup3)(old, new, flags) }
        }
    };
    let (wo, wn) = (TABLE.raw(old), TABLE.raw(new));
    if (wo == 0 && wn == 0) || vfork_child() {
        return real();
    }
    if TABLE.get(new) == Some(Entry::Internal) {
        sys::set_errno(libc::EBUSY);
        return -1;
    }
    let Some(_g) = Reentry::enter() else {
        return real();
    };
    run(|| {
        let r = real();
        if r < 0 {
            return Err(sys::errno());
        }
        if old == new {
            return Ok(r as isize);
        }
        if wn != 0 {
            // Whatever `new` was (a canal socket, an epoll set) left every epoll set.
            epoll::forget_fd(new);
        }
        // `new` was closed by the kernel; whatever it was, it now is what `old` is.
        let g = client::guest();
        match (canal(old), g) {
            (Some(h), Some(g)) => {
                let s = Sock::new(g, h)?;
                install_dup(s, new)
            }
            _ => {
                if let (Some(Entry::Canal(h)), Some(g)) = (TABLE.take(new), g) {
                    sock::release(g, h);
                }
                Ok(r as isize)
            }
        }
    }) as c_int
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    // SAFETY: same contract as fcntl.
    unsafe { fcntl_common(fd, cmd, arg, false) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    // SAFETY: same contract as fcntl64.
    unsafe { fcntl_common(fd, cmd, arg, true) }
}

unsafe fn fcntl_common(fd: c_int, cmd: c_int, arg: c_ulong, is64: bool) -> c_int {
    let real = |cmd: c_int, arg: c_ulong| {
        if is64 {
            // SAFETY: forwarding the argument word unchanged (see cmd.rs).
            unsafe { real!(c"fcntl64", FnFcntl)(fd, cmd, arg) }
        } else {
            // SAFETY: as above.
            unsafe { real!(c"fcntl", FnFcntl)(fd, cmd, arg) }
        }
    };
    dispatch!(fd, real(cmd, arg), |s| {
        match fcntl_action(cmd, arg) {
            FcntlAction::GetFl => {
                let r = real(libc::F_GETFL, 0);
                if r < 0 {
                    return Err(sys::errno());
                }
                let nb = if s.nonblocking() { libc::O_NONBLOCK } else { 0 };
                Ok(((r & !libc::O_NONBLOCK) | nb) as isize)
            }
            FcntlAction::SetFl(v) => {
                s.set_nonblocking(v & libc::O_NONBLOCK != 0);
                // The dummy keeps the other flags (O_ASYNC etc. are not emulated) and
                // its own O_NONBLOCK (see sock::dummy).
                let keep = sys::fcntl_int(fd, libc::F_GETFL, 0).map_or(0, |f| f as c_int)
                    & libc::O_NONBLOCK;
                let r = real(libc::F_SETFL, ((v & !libc::O_NONBLOCK) | keep) as c_ulong);
                if r < 0 {
                    return Err(sys::errno());
                }
                Ok(0)
            }
            FcntlAction::Dup { .. } => {
                let r = real(cmd, arg);
                if r < 0 {
                    return Err(sys::errno());
                }
                install_dup(s, r)
            }
            FcntlAction::PassThrough => {
                let r = real(cmd, arg);
                if r < 0 {
                    Err(sys::errno())
                } else {
                    Ok(r as isize)
                }
            }
        }
    }) as c_int
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn ioctl(fd: c_int, req: c_ulong, arg: *mut c_void) -> c_int {
    dispatch!(fd, real!(c"ioctl", FnIoctl)(fd, req, arg), |s| {
        match req {
            libc::FIONBIO => {
                if arg.is_null() {
                    return Err(libc::EFAULT);
                }
                // SAFETY: FIONBIO takes an int*.
                let on = unsafe { *(arg as *const c_int) } != 0;
                s.set_nonblocking(on);
                Ok(0)
            }
            libc::FIONREAD => {
                if arg.is_null() {
                    return Err(libc::EFAULT);
                }
                let n = sock::fionread(s)?;
                // SAFETY: FIONREAD takes an int* out-parameter.
                unsafe { *(arg as *mut c_int) = n };
                Ok(0)
            }
            _ => {
                // SAFETY: other requests act on the dummy descriptor.
                let r = unsafe { real!(c"ioctl", FnIoctl)(fd, req, arg) };
                if r < 0 {
                    Err(sys::errno())
                } else {
                    Ok(r as isize)
                }
            }
        }
    }) as c_int
}

// ---- poll / select -------------------------------------------------------------------------------

fn pollfds<'a>(fds: *mut pollfd, nfds: nfds_t) -> &'a mut [pollfd] {
    if fds.is_null() || nfds == 0 {
        return &mut [];
    }
    // SAFETY: the application passes `nfds` pollfds at `fds`.
    unsafe { core::slice::from_raw_parts_mut(fds, nfds as usize) }
}

fn ts_ns(ts: *const libc::timespec) -> Result<Option<i64>, i32> {
    if ts.is_null() {
        return Ok(None);
    }
    // SAFETY: the application's timespec.
    let t = unsafe { *ts };
    if t.tv_sec < 0 || !(0..1_000_000_000).contains(&t.tv_nsec) {
        return Err(libc::EINVAL);
    }
    Ok(Some(
        t.tv_sec
            .saturating_mul(1_000_000_000)
            .saturating_add(t.tv_nsec),
    ))
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn poll(fds: *mut pollfd, nfds: nfds_t, timeout: c_int) -> c_int {
    let real = || {
        // SAFETY: forwarding to libc's poll.
        unsafe { real!(c"poll", FnPoll)(fds, nfds, timeout) }
    };
    let Some(g) = client::guest() else {
        return real();
    };
    let set = pollfds(fds, nfds);
    if !poll::has_canal(set) {
        return real();
    }
    let Some(_r) = Reentry::enter() else {
        return real();
    };
    let t = if timeout < 0 {
        None
    } else {
        Some(timeout as i64 * 1_000_000)
    };
    run(|| poll::poll(g, set, t, sys::SigMask::NONE).map(|n| n as isize)) as c_int
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn ppoll(
    fds: *mut pollfd,
    nfds: nfds_t,
    ts: *const libc::timespec,
    sigmask: *const libc::sigset_t,
) -> c_int {
    let real = || {
        // SAFETY: forwarding to libc's ppoll.
        unsafe { real!(c"ppoll", FnPpoll)(fds, nfds, ts, sigmask) }
    };
    let Some(g) = client::guest() else {
        return real();
    };
    let set = pollfds(fds, nfds);
    if !poll::has_canal(set) {
        return real();
    }
    let Some(_r) = Reentry::enter() else {
        return real();
    };
    run(|| poll::poll(g, set, ts_ns(ts)?, sys::SigMask(sigmask)).map(|n| n as isize)) as c_int
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn select(
    nfds: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    tv: *mut libc::timeval,
) -> c_int {
    let real = || {
        // SAFETY: forwarding to libc's select.
        unsafe { real!(c"select", FnSelect)(nfds, r, w, e, tv) }
    };
    let Some(g) = client::guest() else {
        return real();
    };
    if !poll::select_has_canal(nfds, r, w, e) {
        return real();
    }
    let Some(_r) = Reentry::enter() else {
        return real();
    };
    run(|| {
        let t = if tv.is_null() {
            None
        } else {
            // SAFETY: the application's timeval.
            let t = unsafe { *tv };
            if t.tv_sec < 0 || !(0..1_000_000).contains(&t.tv_usec) {
                return Err(libc::EINVAL);
            }
            Some(
                t.tv_sec
                    .saturating_mul(1_000_000_000)
                    .saturating_add(t.tv_usec * 1000),
            )
        };
        let start = sys::now_ns();
        let res = poll::select(g, nfds, r, w, e, t, sys::SigMask::NONE);
        if let (Some(t), false) = (t, tv.is_null()) {
            // Linux updates the timeout to the time not slept.
            let left = (t - (sys::now_ns() - start)).max(0);
            // SAFETY: the application's timeval.
            unsafe {
                (*tv).tv_sec = (left / 1_000_000_000) as libc::time_t;
                (*tv).tv_usec = ((left % 1_000_000_000) / 1000) as libc::suseconds_t;
            }
        }
        res.map(|n| n as isize)
    }) as c_int
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn pselect(
    nfds: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    ts: *const libc::timespec,
    sigmask: *const libc::sigset_t,
) -> c_int {
    let real = || {
        // SAFETY: forwarding to libc's pselect.
        unsafe { real!(c"pselect", FnPselect)(nfds, r, w, e, ts, sigmask) }
    };
    let Some(g) = client::guest() else {
        return real();
    };
    if !poll::select_has_canal(nfds, r, w, e) {
        return real();
    }
    let Some(_r) = Reentry::enter() else {
        return real();
    };
    run(|| poll::select(g, nfds, r, w, e, ts_ns(ts)?, sys::SigMask(sigmask)).map(|n| n as isize))
        as c_int
}

// ---- sendfile -----------------------------------------------------------------------------

type FnSendfile = unsafe extern "C" fn(c_int, c_int, *mut libc::off_t, size_t) -> ssize_t;

/// sendfile to a canal socket: read from `in_fd` and queue into the socket's ring (the
/// copy the kernel would do, done here). Bytes read but not queued (a non-blocking
/// socket filled up) are given back to the file position.
fn sendfile_canal(
    s: Sock,
    in_fd: c_int,
    offset: *mut libc::off_t,
    count: size_t,
) -> Result<isize, i32> {
    let mut buf = vec![0u8; count.clamp(1, 1 << 16)];
    let mut done = 0usize;
    while done < count {
        let want = (count - done).min(buf.len());
        let got = if offset.is_null() {
            sys::read(in_fd, &mut buf[..want])
        } else {
            // SAFETY: offset is the caller's valid off_t.
            let off = unsafe { *offset };
            // SAFETY: buf has `want` writable bytes.
            sys::check(unsafe {
                libc::syscall(
                    libc::SYS_pread64,
                    in_fd as libc::c_long,
                    buf.as_mut_ptr(),
                    want,
                    off,
                )
            })
        };
        let got = match got {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) => return if done > 0 { Ok(done as isize) } else { Err(e) },
        };
        let v = [crate::iov::single(buf.as_mut_ptr() as *mut c_void, got)];
        let sent = match sock::send(s, &v, 0, None) {
            Ok(n) => n,
            Err(e) => {
                if offset.is_null() {
                    let _ = sys::check(
                        // SAFETY: lseek has no memory preconditions.
                        unsafe {
                            libc::syscall(
                                libc::SYS_lseek,
                                in_fd as libc::c_long,
                                -(got as i64),
                                libc::SEEK_CUR as libc::c_long,
                            )
                        },
                    );
                }
                return if done > 0 { Ok(done as isize) } else { Err(e) };
            }
        };
        if offset.is_null() {
            if sent < got {
                let back = -((got - sent) as i64);
                // SAFETY: lseek has no memory preconditions.
                let _ = sys::check(unsafe {
                    libc::syscall(
                        libc::SYS_lseek,
                        in_fd as libc::c_long,
                        back,
                        libc::SEEK_CUR as libc::c_long,
                    )
                });
            }
        } else {
            // SAFETY: offset is the caller's valid off_t.
            unsafe { *offset += sent as libc::off_t };
        }
        done += sent;
        if sent < got {
            break;
        }
    }
    Ok(done as isize)
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn sendfile(
    out_fd: c_int,
    in_fd: c_int,
    offset: *mut libc::off_t,
    count: size_t,
) -> ssize_t {
    dispatch!(
        out_fd,
        real!(c"sendfile", FnSendfile)(out_fd, in_fd, offset, count),
        |s| sendfile_canal(s, in_fd, offset, count)
    )
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn sendfile64(
    out_fd: c_int,
    in_fd: c_int,
    offset: *mut libc::off_t,
    count: size_t,
) -> ssize_t {
    dispatch!(
        out_fd,
        real!(c"sendfile64", FnSendfile)(out_fd, in_fd, offset, count),
        |s| sendfile_canal(s, in_fd, offset, count)
    )
}

// ---- epoll ---------------------------------------------------------------------------------

type FnEpollCtl = unsafe extern "C" fn(c_int, c_int, c_int, *mut libc::epoll_event) -> c_int;
type FnEpollWait = unsafe extern "C" fn(c_int, *mut libc::epoll_event, c_int, c_int) -> c_int;
type FnEpollPwait = unsafe extern "C" fn(
    c_int,
    *mut libc::epoll_event,
    c_int,
    c_int,
    *const libc::sigset_t,
) -> c_int;
type FnEpollPwait2 = unsafe extern "C" fn(
    c_int,
    *mut libc::epoll_event,
    c_int,
    *const libc::timespec,
    *const libc::sigset_t,
) -> c_int;

/// epoll_ctl: a canal socket (or an epoll fd watching canal sockets) goes to the
/// library's interest list (`epoll.rs`); everything else to the kernel.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn epoll_ctl(
    epfd: c_int,
    op: c_int,
    fd: c_int,
    ev: *mut libc::epoll_event,
) -> c_int {
    let real = || {
        // SAFETY: forwarding the caller's arguments to libc's epoll_ctl.
        unsafe { real!(c"epoll_ctl", FnEpollCtl)(epfd, op, fd, ev) }
    };
    let w = TABLE.raw(fd);
    // No vfork-child check here (a getpid system call per call, and event loops such
    // as redis-benchmark call epoll_ctl several times per request): a vfork child that
    // changes an epoll set changes the instance its parent shares, as in the kernel.
    if w == 0 {
        return real();
    }
    let nested = match FdTable::<TABLE_LEN>::decode(w) {
        Some(Entry::Canal(_)) => false,
        Some(Entry::Epoll) => true,
        _ => return real(),
    };
    let Some(_g) = Reentry::enter() else {
        return real();
    };
    let event = (!ev.is_null()).then(|| {
        // SAFETY: the application passes a readable epoll_event (or null).
        unsafe { core::ptr::read_unaligned(ev) }
    });
    run(|| match epoll::ctl(epfd, op, fd, event) {
        // An epoll fd registered for real before it watched canal sockets.
        Err(libc::ENOENT) if nested => {
            let r = real();
            if r < 0 {
                Err(sys::errno())
            } else {
                Ok(0)
            }
        }
        r => r.map(|_| 0),
    }) as c_int
}

/// The common part of the epoll waits on an epoll fd watching canal sockets.
fn epoll_wait_canal(
    epfd: c_int,
    events: *mut libc::epoll_event,
    maxevents: c_int,
    timeout_ns: Result<Option<i64>, i32>,
    sigmask: *const libc::sigset_t,
) -> c_int {
    run(|| {
        let g = client::guest().ok_or(libc::EBADF)?;
        let max = maxevents as usize;
        if maxevents <= 0 || max > (i32::MAX as usize) / core::mem::size_of::<libc::epoll_event>() {
            return Err(libc::EINVAL);
        }
        if events.is_null() {
            return Err(libc::EFAULT);
        }
        let t = timeout_ns?;
        // SAFETY: the application passes room for maxevents events.
        let out = unsafe { core::slice::from_raw_parts_mut(events, max) };
        epoll::wait(g, epfd, out, t, sys::SigMask(sigmask)).map(|n| n as isize)
    }) as c_int
}

fn ms_ns(timeout: c_int) -> Option<i64> {
    (timeout >= 0).then(|| timeout as i64 * 1_000_000)
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn epoll_wait(
    epfd: c_int,
    events: *mut libc::epoll_event,
    maxevents: c_int,
    timeout: c_int,
) -> c_int {
    if TABLE.get(epfd) != Some(Entry::Epoll) {
        // SAFETY: forwarding the caller's arguments to libc's epoll_wait.
        return unsafe { real!(c"epoll_wait", FnEpollWait)(epfd, events, maxevents, timeout) };
    }
    let Some(_g) = Reentry::enter() else {
        // SAFETY: as above.
        return unsafe { real!(c"epoll_wait", FnEpollWait)(epfd, events, maxevents, timeout) };
    };
    epoll_wait_canal(
        epfd,
        events,
        maxevents,
        Ok(ms_ns(timeout)),
        core::ptr::null(),
    )
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn epoll_pwait(
    epfd: c_int,
    events: *mut libc::epoll_event,
    maxevents: c_int,
    timeout: c_int,
    sigmask: *const libc::sigset_t,
) -> c_int {
    let real = || {
        // SAFETY: forwarding the caller's arguments to libc's epoll_pwait.
        unsafe { real!(c"epoll_pwait", FnEpollPwait)(epfd, events, maxevents, timeout, sigmask) }
    };
    if TABLE.get(epfd) != Some(Entry::Epoll) {
        return real();
    }
    let Some(_g) = Reentry::enter() else {
        return real();
    };
    epoll_wait_canal(epfd, events, maxevents, Ok(ms_ns(timeout)), sigmask)
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn epoll_pwait2(
    epfd: c_int,
    events: *mut libc::epoll_event,
    maxevents: c_int,
    ts: *const libc::timespec,
    sigmask: *const libc::sigset_t,
) -> c_int {
    let real = || {
        // SAFETY: forwarding the caller's arguments to libc's epoll_pwait2.
        unsafe { real!(c"epoll_pwait2", FnEpollPwait2)(epfd, events, maxevents, ts, sigmask) }
    };
    if TABLE.get(epfd) != Some(Entry::Epoll) {
        return real();
    }
    let Some(_g) = Reentry::enter() else {
        return real();
    };
    epoll_wait_canal(epfd, events, maxevents, ts_ns(ts), sigmask)
}

// ---- exec -------------------------------------------------------------------------------------

type FnExecve = unsafe extern "C" fn(
    *const libc::c_char,
    *const *const libc::c_char,
    *const *const libc::c_char,
) -> c_int;
type FnFexecve =
    unsafe extern "C" fn(c_int, *const *const libc::c_char, *const *const libc::c_char) -> c_int;

/// Before exec: the kernel will close every close-on-exec descriptor, so their
/// references are dropped now (as close would). Only references another descriptor
/// still backs (refs > 1) are dropped, so a failed exec can restore them exactly; a
/// socket whose last reference goes away by exec stays open until the guest's control
/// connection closes. Descriptors without close-on-exec survive exec as bare dummies
/// the new image does not know (issue 3). A vfork child shares our memory and must not
/// touch the table: it is recognised by its pid differing from the one our state
/// belongs to.
fn before_exec() -> Vec<(c_int, u32)> {
    let mut dropped = Vec::new();
    let Some(g) = client::guest() else {
        return dropped;
    };
    if client::PID.load(core::sync::atomic::Ordering::Relaxed) != sys::getpid() {
        return dropped;
    }
    let Some(_r) = Reentry::enter() else {
        return dropped;
    };
    let _ = catch_unwind(AssertUnwindSafe(|| {
        TABLE.for_each_canal(|fd, h| {
            let cloexec = sys::fcntl_int(fd, libc::F_GETFD, 0)
                .is_ok_and(|f| f as c_int & libc::FD_CLOEXEC != 0);
            if !cloexec {
                return;
            }
            if let Ok(s) = Sock::new(g, h) {
                let o = core::sync::atomic::Ordering::AcqRel;
                let r = core::sync::atomic::Ordering::Relaxed;
                if s.e
                    .refs
                    .fetch_update(o, r, |n| (n > 1).then(|| n - 1))
                    .is_ok()
                {
                    dropped.push((fd, h));
                }
            }
        });
        for &(fd, _) in &dropped {
            TABLE.take(fd);
        }
    }));
    dropped
}

/// exec failed: the descriptors are still ours.
fn exec_failed(dropped: Vec<(c_int, u32)>) {
    let Some(g) = client::guest() else { return };
    let e = sys::errno();
    for (fd, h) in dropped {
        let _ = TABLE.set_canal(fd, h);
        sock::add_ref(g, h);
    }
    sys::set_errno(e);
}

extern "C" {
    static environ: *const *const libc::c_char;
}

/// Canal sockets without close-on-exec that the new image inherits.
fn inherited() -> Vec<(c_int, u32)> {
    let mut keep = Vec::new();
    if client::guest().is_none() || vfork_child() {
        return keep;
    }
    TABLE.for_each_canal(|fd, h| {
        let cloexec = sys::fcntl_int(fd, libc::F_GETFD, 0)
            .map_or(true, |f| f as c_int & libc::FD_CLOEXEC != 0);
        if !cloexec {
            keep.push((fd, h));
        }
    });
    keep
}

/// Runs an exec: references of close-on-exec sockets are dropped first; if sockets
/// are inherited, the new image gets CANAL_REJOIN in its environment (rejoin.rs) and
/// `$call` runs with the rewritten environment `$envp` names. A failed exec restores
/// everything.
macro_rules! exec_hook {
    ($orig_env:expr, |$envp:ident| $call:expr) => {{
        let dropped = before_exec();
        let keep = inherited();
        let entry = match (client::guest(), keep.is_empty()) {
            (Some(g), false) => {
                crate::rejoin::prepare(g, &keep).and_then(|e| std::ffi::CString::new(e).ok())
            }
            _ => None,
        };
        let rewritten = entry.as_ref().map(|e| {
            // SAFETY: the caller's environment, as exec requires it.
            unsafe { crate::rejoin::new_envp($orig_env, e) }
        });
        let $envp: *const *const libc::c_char = match &rewritten {
            Some(v) => v.as_ptr(),
            None => $orig_env,
        };
        // SAFETY: forwarding the caller's arguments (and an environment built from
        // theirs) to libc's exec function.
        let r = unsafe { $call };
        if entry.is_some() {
            if let Some(g) = client::guest() {
                crate::rejoin::undo(g);
            }
        }
        exec_failed(dropped);
        r
    }};
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn execve(
    path: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
) -> c_int {
    exec_hook!(envp, |e| real!(c"execve", FnExecve)(path, argv, e))
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn execv(
    path: *const libc::c_char,
    argv: *const *const libc::c_char,
) -> c_int {
    // SAFETY: reading libc's environ pointer.
    let env = unsafe { environ };
    exec_hook!(env, |e| real!(c"execve", FnExecve)(path, argv, e))
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn execvp(
    file: *const libc::c_char,
    argv: *const *const libc::c_char,
) -> c_int {
    // SAFETY: reading libc's environ pointer.
    let env = unsafe { environ };
    exec_hook!(env, |e| real!(c"execvpe", FnExecve)(file, argv, e))
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn execvpe(
    file: *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
) -> c_int {
    exec_hook!(envp, |e| real!(c"execvpe", FnExecve)(file, argv, e))
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn fexecve(
    fd: c_int,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
) -> c_int {
    exec_hook!(envp, |e| real!(c"fexecve", FnFexecve)(fd, argv, e))
}

/// At exit() the kernel closes every descriptor: drop this process's references so a
/// socket shared with another process (fork) is closed when the last one goes. A
/// process ended by _exit() or a signal skips this (see docs/compat.md).
pub fn at_exit() {
    if client::PID.load(core::sync::atomic::Ordering::Relaxed) != sys::getpid() {
        return;
    }
    let Some(g) = client::guest() else { return };
    if client::is_dead(g) {
        return;
    }
    let Some(_r) = Reentry::enter() else { return };
    let _ = catch_unwind(AssertUnwindSafe(|| {
        let mut all: Vec<(c_int, u32)> = Vec::new();
        TABLE.for_each_canal(|fd, h| all.push((fd, h)));
        for (fd, h) in all {
            if TABLE.take(fd).is_some() {
                sock::release(g, h);
            }
        }
    }));
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

    #[test]
    fn timespec_validation() {
        let ts = libc::timespec {
            tv_sec: 1,
            tv_nsec: 5,
        };
        assert_eq!(ts_ns(&ts), Ok(Some(1_000_000_005)));
        assert_eq!(ts_ns(core::ptr::null()), Ok(None));
        let bad = libc::timespec {
            tv_sec: 0,
            tv_nsec: 1_000_000_000,
        };
        assert_eq!(ts_ns(&bad), Err(libc::EINVAL));
    }
}
