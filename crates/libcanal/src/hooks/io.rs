//! Hooks of the data calls: send*/recv*/read*/write* (with their _chk forms), mmsg, sendfile.
use crate::hooks::common::canal;
use crate::hooks::common::chk_fail;
use crate::hooks::common::dest_in;
use crate::hooks::common::dispatch;
use crate::hooks::common::leave_to_kernel;
use crate::hooks::common::real_result;
use crate::hooks::common::slice_iov;
use crate::hooks::poll::ts_ns;
use crate::sock::core::RecvMeta;
use crate::sock::core::Sock;
use crate::sockaddr;
use crate::sys;
use crate::sys::real;
use canal_abi::sync::Ordering;
use libc::c_int;
use libc::c_uint;
use libc::c_void;
use libc::iovec;
use libc::msghdr;
use libc::size_t;
use libc::sockaddr as SockAddr;
use libc::socklen_t;
use libc::ssize_t;

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

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn send(fd: c_int, buf: *const c_void, len: size_t, flags: c_int) -> ssize_t {
    dispatch!(fd, real!(c"send", FnSend)(fd, buf, len, flags), |s| {
        let v = [crate::iov::single(buf as *mut c_void, len)];
        crate::sock::data::send(s, &v, flags, None).map(|n| n as isize)
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
    crate::direct::at_reach(fd, addr, alen, flags);
    dispatch!(
        fd,
        real!(c"sendto", FnSendTo)(fd, buf, len, flags, addr, alen),
        |s| {
            let to = dest_in(s, addr, alen, flags)?;
            if let Some(a) = &to {
                if leave_to_kernel(fd, &s, a)? {
                    // SAFETY: forwarding to libc's sendto on the kernel socket now at `fd`.
                    let r = unsafe { real!(c"sendto", FnSendTo)(fd, buf, len, flags, addr, alen) };
                    return real_result(r);
                }
                crate::policy::commit(&s);
            }
            let v = [crate::iov::single(buf as *mut c_void, len)];
            crate::sock::data::send(s, &v, flags, to.as_ref()).map(|n| n as isize)
        }
    )
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t {
    // SAFETY: msg is the caller's message, as sendmsg requires.
    if let Err(e) = unsafe { bridge_passed_sockets(msg) } {
        sys::set_errno(e);
        return -1;
    }
    // SAFETY: msg is null or the caller's message.
    if let Some(m) = unsafe { msg.as_ref() } {
        crate::direct::at_reach(fd, m.msg_name as *const SockAddr, m.msg_namelen, flags);
    }
    dispatch!(fd, real!(c"sendmsg", FnSendMsg)(fd, msg, flags), |s| {
        sendmsg_one(s, msg, flags)
    })
}

/// msg_controllen, whose type differs between C libraries.
#[allow(clippy::unnecessary_cast)]
fn control_len(m: &msghdr) -> usize {
    m.msg_controllen as usize
}

/// A connected canal socket passed with SCM_RIGHTS is bridged first (bridge.rs): the
/// receiver, with the library or without, gets a kernel socket that carries the
/// connection, and this process uses the same one from now on (one socket for both).
/// A listener, a datagram socket or a stream not yet connected becomes the kernel
/// socket canald held for it (handoff.rs), here and in the receiver. One canald keeps
/// (see `pass_to_kernel`) has nothing a receiver could use — it would get the dummy
/// descriptor — so the call is refused with EOPNOTSUPP and a message, before anything
/// is sent.
///
/// # Safety
/// `msg` is null or a valid msghdr whose control buffer is readable.
unsafe fn bridge_passed_sockets(msg: *const msghdr) -> Result<(), i32> {
    // SAFETY: checked non-null; the caller's msghdr.
    let Some(m) = (unsafe { msg.as_ref() }) else {
        return Ok(());
    };
    if m.msg_control.is_null() || control_len(m) < core::mem::size_of::<libc::cmsghdr>() {
        return Ok(());
    }
    let Some(g) = crate::conn::guest::guest() else {
        return Ok(());
    };
    let Some(_r) = crate::hooks::common::Reentry::enter() else {
        return Ok(());
    };
    // SAFETY: the caller's control buffer (checked above to hold a header).
    unsafe { passed_canal_fds(m, |fd, h| pass_or_refuse(g, fd, h)) }?;
    // SAFETY: as above.
    unsafe {
        passed_canal_fds(m, |fd, h| {
            // The receiver holds a copy: counted by the kernel (sock/watch.rs).
            crate::sock::watch::share(g);
            crate::bridge::bridge_if_connected(g, fd, h);
            Ok(())
        })
    }
}

/// A passed canal socket that is not bridged: handed to the kernel (a listener, a
/// datagram socket or an unconnected stream), else refused with EOPNOTSUPP and the
/// reason on stderr.
fn pass_or_refuse(g: &'static crate::conn::guest::Guest, fd: c_int, h: u32) -> Result<(), i32> {
    if crate::bridge::bridgeable(g, h) {
        return Ok(());
    }
    let Ok(s) = Sock::new(g, h) else {
        return Ok(());
    };
    let what = match s.kind() {
        canal_abi::sock_kind::LISTENER => "a listening",
        canal_abi::sock_kind::DGRAM => "a datagram",
        _ => "an unconnected",
    };
    let why = match crate::handoff::pass_to_kernel(g, s) {
        Ok(()) => return Ok(()),
        Err(why) => why,
    };
    sys::log_fmt(format_args!(
        "canal: sendmsg: descriptor {fd} is {what} canal socket, which cannot be passed \
         with SCM_RIGHTS here ({why}; docs/compat.md, SCM_RIGHTS); refused with \
         EOPNOTSUPP. CANAL_EXCLUDE with its address keeps such a socket in the kernel.\n"
    ));
    Err(libc::EOPNOTSUPP)
}

/// Calls `f(fd, handle)` for every canal socket among the SCM_RIGHTS descriptors of
/// `m`, stopping at its first error.
///
/// # Safety
/// `m`'s control buffer is readable for msg_controllen bytes.
unsafe fn passed_canal_fds(
    m: &msghdr,
    mut f: impl FnMut(c_int, u32) -> Result<(), i32>,
) -> Result<(), i32> {
    // SAFETY: walking the caller's control buffer with the CMSG macros.
    let mut c = unsafe { libc::CMSG_FIRSTHDR(m) };
    while !c.is_null() {
        // SAFETY: c points to a cmsghdr inside the buffer (CMSG_FIRSTHDR/NXTHDR).
        let h = unsafe { &*c };
        if h.cmsg_level == libc::SOL_SOCKET && h.cmsg_type == libc::SCM_RIGHTS {
            // SAFETY: as above.
            let data = unsafe { libc::CMSG_DATA(c) } as *const c_int;
            // SAFETY: CMSG_LEN is arithmetic.
            let head = unsafe { libc::CMSG_LEN(0) } as usize;
            let n = (h.cmsg_len as usize).saturating_sub(head) / 4;
            for i in 0..n {
                // SAFETY: n ints follow the header within cmsg_len.
                let fd = unsafe { data.add(i).read_unaligned() };
                // Passed on: the receiver holds the kernel socket (direct.rs).
                crate::direct::settle_kernel(fd);
                if let Some(hd) = crate::fdtable::TABLE.handle(fd) {
                    f(fd, hd)?;
                }
            }
        }
        // SAFETY: as above.
        c = unsafe { libc::CMSG_NXTHDR(m, c) };
    }
    Ok(())
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, len: size_t) -> ssize_t {
    dispatch!(fd, real!(c"write", FnWrite)(fd, buf, len), |s| {
        let v = [crate::iov::single(buf as *mut c_void, len)];
        crate::sock::data::send(s, &v, 0, None).map(|n| n as isize)
    })
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const iovec, n: c_int) -> ssize_t {
    dispatch!(fd, real!(c"writev", FnIov)(fd, iov, n), |s| {
        crate::sock::data::send(s, slice_iov(iov, n)?, 0, None).map(|n| n as isize)
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
    let n = crate::sock::data::recv(s, &v, flags, &mut meta)?;
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
    if !m.msg_control.is_null() && control_len(m) > 0 {
        meta.control = Some((m.msg_control as *mut u8, control_len(m)));
    }
    let n = crate::sock::data::recv(s, iov, flags, &mut meta)?;
    if !m.msg_name.is_null() {
        match meta.from {
            // SAFETY: msg_name has msg_namelen writable bytes (the application's).
            Some(a) => unsafe {
                sockaddr::write_sockaddr(&a, m.msg_name as *mut SockAddr, &mut m.msg_namelen)
            },
            None => m.msg_namelen = 0,
        }
    }
    // Only a datagram's control messages (ancillary.rs); a stream gets none.
    m.msg_controllen = meta.control_len as _;
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
        dest_in(s, m.msg_name as *const SockAddr, m.msg_namelen, flags)?
    };
    if to.is_some() {
        crate::policy::commit(&s);
    }
    let control = match s.kind() {
        canal_abi::sock_kind::DGRAM if !m.msg_control.is_null() && control_len(m) > 0 => {
            if control_len(m) > i32::MAX as usize {
                return Err(libc::ENOBUFS);
            }
            // SAFETY: the application's control buffer: msg_controllen readable bytes.
            let raw =
                unsafe { core::slice::from_raw_parts(m.msg_control as *const u8, control_len(m)) };
            Some(crate::ancillary::outgoing(
                raw,
                s.e.family.load(Ordering::Relaxed) as c_int,
            )?)
        }
        _ => None,
    };
    let control = control.as_ref().map_or(&[][..], |c| c.bytes());
    crate::sock::data::send_msg(s, iov, flags, to.as_ref(), control).map(|n| n as isize)
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
    if vlen > 0 {
        // SAFETY: vec is null or the caller's `vlen` messages.
        if let Some(m) = unsafe { vec.as_ref() } {
            let h = &m.msg_hdr;
            crate::direct::at_reach(fd, h.msg_name as *const SockAddr, h.msg_namelen, flags);
        }
    }
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
        crate::sock::data::recv(s, slice_iov(iov, n)?, 0, &mut meta).map(|n| n as isize)
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
                crate::sys::raw_syscall!(
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
        let sent = match crate::sock::data::send(s, &v, 0, None) {
            Ok(n) => n,
            Err(e) => {
                if offset.is_null() {
                    let _ = sys::check(
                        // SAFETY: lseek has no memory preconditions.
                        unsafe {
                            crate::sys::raw_syscall!(
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
                    crate::sys::raw_syscall!(
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

type FnFdopen = unsafe extern "C" fn(c_int, *const libc::c_char) -> *mut libc::FILE;

/// fdopen: a stdio stream on a connected canal socket reads and writes with glibc's own
/// system calls, which the hooks never see, so the connection is bridged first
/// (bridge.rs) and the stream is opened on the kernel socket that carries it.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn fdopen(fd: c_int, mode: *const libc::c_char) -> *mut libc::FILE {
    if let (Some(h), Some(g)) = (
        crate::fdtable::TABLE.handle(fd),
        crate::conn::guest::guest(),
    ) {
        if !crate::hooks::exec::vfork_child() {
            if let Some(_r) = crate::hooks::common::Reentry::enter() {
                crate::bridge::bridge_if_connected(g, fd, h);
            }
        }
    }
    // SAFETY: forwarding the caller's arguments to libc's fdopen.
    unsafe { real!(c"fdopen", FnFdopen)(fd, mode) }
}
