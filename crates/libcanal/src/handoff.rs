//! Canal sockets that become kernel sockets, at the same descriptor numbers:
//! - an undecided socket whose first address is excluded (`policy`): a new kernel
//!   socket with the options set so far;
//! - a listener, a datagram socket or an unconnected stream the program passes with
//!   SCM_RIGHTS: canald's own host socket for it (control message HOST_SOCKET), since
//!   the receiving process needs the socket itself and canald cannot share one entry
//!   between two guests.
use crate::conn::guest::Guest;
use crate::fdtable::TABLE;
use crate::sock::core::Sock;
use crate::sys;
use canal_abi::addr::FAMILY_INET6;
use canal_abi::sock_kind;
use canal_abi::sync::Ordering;
use libc::c_int;

/// Replaces canal socket `s` behind `fd` by a kernel socket of the same family and
/// type with the options set so far, at the same descriptor number.
pub(crate) fn handoff(g: &'static Guest, fd: c_int, s: Sock) -> Result<(), i32> {
    let domain = if s.e.family.load(Ordering::Relaxed) == FAMILY_INET6 as u32 {
        libc::AF_INET6
    } else {
        libc::AF_INET
    };
    let ty = if s.kind() == sock_kind::DGRAM {
        libc::SOCK_DGRAM
    } else {
        libc::SOCK_STREAM
    };
    let nb = if s.nonblocking() {
        libc::SOCK_NONBLOCK
    } else {
        0
    };
    let nfd = sys::socket(domain, ty | nb | libc::SOCK_CLOEXEC, 0)?;
    let h = s.handle;
    for (level, name, v) in &crate::policy::SAVED.take(h) {
        set_opt(nfd, *level, *name, v);
    }
    // The number stops being canal's before the kernel socket takes it, and no WATCH
    // is put there meanwhile (sock/watch.rs).
    let held = crate::sock::watch::hold();
    let r = install(&s, nfd, &[fd]);
    let _ = sys::close(nfd);
    r?;
    drop(held);
    crate::sock::close::release(g, h);
    crate::rt::debug!(
        g,
        "canal: fd {fd} (handle {h:#x}) left to the kernel by CANAL_EXCLUDE\n"
    );
    Ok(())
}

/// Puts kernel socket `nfd` in place of canal socket `s` at each of `fds` (the library's
/// timeouts carried over, epoll interest moved); `nfd` stays open. On an error the
/// descriptors not yet replaced stay canal's.
fn install(s: &Sock, nfd: c_int, fds: &[c_int]) -> Result<(), i32> {
    for (name, ns) in [
        (libc::SO_RCVTIMEO, s.e.rcvtimeo_ns.load(Ordering::Relaxed)),
        (libc::SO_SNDTIMEO, s.e.sndtimeo_ns.load(Ordering::Relaxed)),
    ] {
        if ns != 0 {
            set_opt(
                nfd,
                libc::SOL_SOCKET,
                name,
                &crate::sock::opts::ns_to_timeval(ns),
            );
        }
    }
    for &fd in fds {
        TABLE.take(fd);
        if let Err(e) = sys::replace_fd(nfd, fd) {
            let _ = TABLE.set_canal(fd, s.handle);
            return Err(e);
        }
        crate::mux::epoll::move_to_kernel(fd);
    }
    Ok(())
}

fn set_opt(fd: c_int, level: c_int, name: c_int, v: &[u8]) {
    // SAFETY: v is a readable buffer of v.len() bytes for the kernel to copy.
    unsafe {
        crate::sys::raw_syscall!(
            libc::SYS_setsockopt,
            fd as libc::c_long,
            level as libc::c_long,
            name as libc::c_long,
            v.as_ptr(),
            v.len() as libc::c_long,
        )
    };
}

/// SCM_RIGHTS of listener, datagram socket or unconnected stream `s`: canald hands its
/// host socket over (HOST_SOCKET) and the kernel socket takes the place of every
/// descriptor of it in this process, blocking mode and timeouts kept, so the receiver
/// and this process share one kernel socket, as natively. canald marks the entry
/// HANDED_OVER: another process of the guest that holds it (a forked child) follows at
/// its next call (`follow`).
pub(crate) fn pass_to_kernel(g: &'static Guest, s: Sock) -> Result<(), String> {
    let h = s.handle;
    let mut fds = Vec::new();
    TABLE.for_each_canal(|fd, hd| {
        if hd == h {
            fds.push(fd);
        }
    });
    let nonblocking = s.nonblocking();
    let held = crate::sock::watch::hold();
    let nfd = crate::conn::ctl::ctl_host_socket(g, h).map_err(|(e, why)| match e {
        libc::ENOSYS => "canald is older than this library".to_string(),
        _ => why,
    })?;
    let fl = if nonblocking { libc::O_NONBLOCK } else { 0 };
    let _ = sys::fcntl_int(nfd, libc::F_SETFL, (libc::O_RDWR | fl) as libc::c_long);
    let r = install(&s, nfd, &fds);
    let _ = sys::close(nfd);
    drop(held);
    // The descriptors replaced were this process's references to the entry; the
    // guest's last one closes it in canald (CLOSE, or its WATCH).
    let replaced = match r {
        Ok(()) => fds.len(),
        Err(_) => fds
            .iter()
            .filter(|&&fd| TABLE.handle(fd) != Some(h))
            .count(),
    };
    for _ in 0..replaced {
        crate::sock::close::release(g, h);
    }
    crate::policy::forget(h);
    crate::rt::debug!(
        g,
        "canal: handle {h:#x} passed on: now the kernel's socket\n"
    );
    r.map_err(|e| format!("its descriptors could not be replaced (errno {e})"))
}

/// A call on socket `s` at `fd` that another process of the guest passed on (entry
/// HANDED_OVER): this process's descriptors of it become the kernel socket too, before
/// the call goes to the kernel.
pub(crate) fn follow(fd: c_int, s: Sock) -> Result<(), i32> {
    pass_to_kernel(s.g, s).map_err(|why| {
        sys::log_fmt(format_args!(
            "canal: descriptor {fd}: its socket was passed to another process, and this \
             process cannot follow ({why}); EBADF.\n"
        ));
        libc::EBADF
    })
}
