//! Hooks of the socket family: socket, bind, connect, listen, accept, shutdown, names,
//! socket options.
use crate::fdtable::Entry;
use crate::fdtable::TABLE;
use crate::hooks::common::addr_in;
use crate::hooks::common::dispatch;
use crate::hooks::common::leave_to_kernel;
use crate::hooks::common::real_result;
use crate::hooks::common::run;
use crate::hooks::common::supported;
use crate::hooks::common::FnIntInt;
use crate::hooks::common::Reentry;
use crate::sock::core::Sock;
use crate::sockaddr;
use crate::sys;
use crate::sys::real;
use libc::c_int;
use libc::c_void;
use libc::sockaddr as SockAddr;
use libc::socklen_t;

type FnSocket = unsafe extern "C" fn(c_int, c_int, c_int) -> c_int;

type FnAddr = unsafe extern "C" fn(c_int, *const SockAddr, socklen_t) -> c_int;

type FnAddrOut = unsafe extern "C" fn(c_int, *mut SockAddr, *mut socklen_t) -> c_int;

type FnAccept4 = unsafe extern "C" fn(c_int, *mut SockAddr, *mut socklen_t, c_int) -> c_int;

type FnSetOpt = unsafe extern "C" fn(c_int, c_int, c_int, *const c_void, socklen_t) -> c_int;

type FnGetOpt = unsafe extern "C" fn(c_int, c_int, c_int, *mut c_void, *mut socklen_t) -> c_int;

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn socket(domain: c_int, ty: c_int, proto: c_int) -> c_int {
    let real = || {
        // SAFETY: forwarding the caller's arguments to libc's socket.
        unsafe { real!(c"socket", FnSocket)(domain, ty, proto) }
    };
    let Some((base, nonblock, cloexec)) = supported(domain, ty, proto) else {
        return real();
    };
    if crate::hooks::ns::left_netns() {
        return real(); // a socket of the namespace the process moved to
    }
    let Some(_guard) = Reentry::enter() else {
        return real();
    };
    let Some(g) = crate::conn::attach::ensure_attached() else {
        return real();
    };
    let need = if base == libc::SOCK_STREAM {
        canal_abi::feature::STREAM
    } else {
        canal_abi::feature::DGRAM
    };
    if crate::conn::guest::is_dead(g) {
        // canald went away (or restarted): a kernel socket would escape its policy
        // unnoticed. New sockets fail until the program restarts under canal.
        crate::conn::guest::mark_dead();
        sys::set_errno(libc::ENETDOWN);
        return -1;
    }
    if g.region.header().features & need == 0 {
        return real();
    }
    let guess = base == libc::SOCK_STREAM && crate::direct::guess_canal();
    if crate::direct::on(g) && !guess {
        // Undecided until its first use (direct.rs); a stream of a process whose
        // connects all go to canal ports starts as canal's (`direct::guess_canal`).
        // A kernel socket made after canald died would escape whatever the next
        // canald enforces: ENETDOWN, as for a canal socket (a spare's check,
        // sock/create.rs).
        if crate::conn::guest::control_hung_up(g) {
            crate::conn::guest::mark_dead();
            sys::set_errno(libc::ENETDOWN);
            return -1;
        }
        return run(|| {
            crate::direct::socket(domain, base, proto, nonblock, cloexec).map(|fd| fd as isize)
        }) as c_int;
    }
    if guess {
        crate::rt::debug!(
            g,
            "canal: a stream starts canal's (its process's connects go to canal ports)\n"
        );
    }
    run(|| {
        crate::sock::create::socket(g, domain, base, proto, nonblock, cloexec)
            .map(|fd| fd as isize)
            // canald vanished during the call: the same answer as after it.
            .map_err(|e| {
                if crate::conn::guest::is_dead(g) {
                    libc::ENETDOWN
                } else {
                    e
                }
            })
    }) as c_int
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn bind(fd: c_int, addr: *const SockAddr, len: socklen_t) -> c_int {
    crate::direct::at_serve(fd, addr, len);
    dispatch!(fd, real!(c"bind", FnAddr)(fd, addr, len), |s| {
        let a = addr_in(addr, len)?;
        if leave_to_kernel(fd, &s, &a)? {
            // SAFETY: forwarding to libc's bind on the kernel socket now at `fd`.
            return real_result(unsafe { real!(c"bind", FnAddr)(fd, addr, len) } as isize);
        }
        crate::policy::commit(&s);
        crate::sock::control::bind(s, &a).map(|_| 0)
    }) as c_int
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn connect(fd: c_int, addr: *const SockAddr, len: socklen_t) -> c_int {
    crate::direct::at_reach(fd, addr, len, libc::MSG_FASTOPEN);
    dispatch!(fd, real!(c"connect", FnAddr)(fd, addr, len), |s| {
        if !addr.is_null()
            && len as usize >= core::mem::size_of::<libc::sa_family_t>()
            // SAFETY: the application passes at least `len` (≥ 2) readable bytes.
            && unsafe { core::ptr::read_unaligned(addr as *const libc::sa_family_t) }
                == libc::AF_UNSPEC as libc::sa_family_t
        {
            return crate::sock::control::disconnect(s).map(|_| 0);
        }
        let a = addr_in(addr, len)?;
        if leave_to_kernel(fd, &s, &a)? || crate::direct::at_native_connect(&s, &a) {
            // SAFETY: forwarding to libc's connect on the kernel socket now at `fd`.
            return real_result(unsafe { real!(c"connect", FnAddr)(fd, addr, len) } as isize);
        }
        crate::policy::commit(&s);
        crate::sock::control::connect(s, &a).map(|_| 0)
    }) as c_int
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn listen(fd: c_int, backlog: c_int) -> c_int {
    crate::direct::at_serve(fd, core::ptr::null(), 0);
    dispatch!(fd, real!(c"listen", FnIntInt)(fd, backlog), |s| {
        crate::policy::commit(&s);
        crate::sock::control::listen(s, backlog).map(|_| 0)
    }) as c_int
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn accept(fd: c_int, addr: *mut SockAddr, lenp: *mut socklen_t) -> c_int {
    dispatch!(fd, real!(c"accept", FnAddrOut)(fd, addr, lenp), |s| {
        do_accept(fd, s, addr, lenp, 0)
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
        |s| do_accept(fd, s, addr, lenp, flags)
    ) as c_int
}

fn do_accept(
    fd: c_int,
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
    let (nfd, peer) = match crate::sock::accept::accept(s, flags) {
        Err(crate::sock::accept::HANDED_OVER) => {
            // Passed on by another process while this call waited: the kernel's now.
            crate::handoff::follow(fd, s)?;
            // SAFETY: the application's own arguments, on the kernel socket at `fd`.
            return real_result(unsafe {
                crate::sys::raw_syscall!(libc::SYS_accept4, fd, addr, lenp, flags)
            } as isize);
        }
        r => r?,
    };
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
    // The kernel socket keeps what shutdown did to it: it stays the kernel's.
    crate::direct::settle_kernel(fd);
    dispatch!(fd, real!(c"shutdown", FnIntInt)(fd, how), |s| {
        crate::sock::control::shutdown(s, how).map(|_| 0)
    }) as c_int
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn getsockname(
    fd: c_int,
    addr: *mut SockAddr,
    lenp: *mut socklen_t,
) -> c_int {
    dispatch!(ctl fd, real!(c"getsockname", FnAddrOut)(fd, addr, lenp), |s| {
        name_out(s, false, addr, lenp)
    }) as c_int
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn getpeername(
    fd: c_int,
    addr: *mut SockAddr,
    lenp: *mut socklen_t,
) -> c_int {
    dispatch!(ctl fd, real!(c"getpeername", FnAddrOut)(fd, addr, lenp), |s| {
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
    let a = crate::sock::control::name(s, peer)?;
    // SAFETY: (addr, lenp) are the application's out-parameters.
    unsafe { sockaddr::write_sockaddr(&a, addr, lenp) };
    Ok(0)
}

/// On a bridged descriptor the receive and send timeouts belong to its kernel socket,
/// which carries the data (bridge.rs); every other option is the canal socket's.
fn data_option_of_bridge(fd: c_int, level: c_int, name: c_int) -> bool {
    matches!(TABLE.get(fd), Some(Entry::Bridged(_))) && crate::sock::opts::is_timeout(level, name)
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn setsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *const c_void,
    len: socklen_t,
) -> c_int {
    if data_option_of_bridge(fd, level, name) {
        // SAFETY: forwarding the caller's arguments to libc's setsockopt.
        return unsafe { real!(c"setsockopt", FnSetOpt)(fd, level, name, val, len) };
    }
    if let Some(Entry::Undecided(_)) = TABLE.get(fd) {
        // SAFETY: forwarding the caller's arguments to libc's setsockopt.
        let r = unsafe { real!(c"setsockopt", FnSetOpt)(fd, level, name, val, len) };
        if r == 0 {
            if let (Ok(v), Some(_g)) = (option_value(val, len), Reentry::enter()) {
                crate::direct::record_option(fd, level, name, v);
            }
        }
        return r;
    }
    dispatch!(
        ctl fd,
        real!(c"setsockopt", FnSetOpt)(fd, level, name, val, len),
        |s| {
            let v = option_value(val, len)?;
            crate::sock::opts::setsockopt(s, level, name, v)?;
            crate::policy::record_option(&s, level, name, v);
            Ok(0)
        }
    ) as c_int
}

/// setsockopt's (val, len) as bytes, with the kernel's checks: EINVAL for a negative
/// length, EFAULT for a null value of non-zero length.
fn option_value<'a>(val: *const c_void, len: socklen_t) -> Result<&'a [u8], i32> {
    if (len as i32) < 0 {
        Err(libc::EINVAL)
    } else if len == 0 {
        Ok(&[])
    } else if val.is_null() {
        Err(libc::EFAULT)
    } else {
        // SAFETY: the application passes `len` readable bytes at `val` (for the
        // undecided socket's record, the kernel has just read them).
        Ok(unsafe { core::slice::from_raw_parts(val as *const u8, len as usize) })
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn getsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    lenp: *mut socklen_t,
) -> c_int {
    if data_option_of_bridge(fd, level, name) {
        // SAFETY: forwarding the caller's arguments to libc's getsockopt.
        return unsafe { real!(c"getsockopt", FnGetOpt)(fd, level, name, val, lenp) };
    }
    dispatch!(
        ctl fd,
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
            let n = crate::sock::opts::getsockopt(s, level, name, out)?;
            // SAFETY: as above.
            unsafe { *lenp = n as socklen_t };
            Ok(0)
        }
    ) as c_int
}

// ---- data calls -------------------------------------------------------------------------------
