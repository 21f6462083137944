//! Handing an undecided socket to the kernel when its first address is excluded
//! (`policy`): a kernel socket with the options set so far replaces the dummy descriptor.
use crate::conn::guest::Guest;
use crate::fdtable::TABLE;
use crate::policy::with;
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
    let opts: Vec<(c_int, c_int, Vec<u8>)> = with(|_, o| {
        let mine = o
            .iter()
            .filter(|x| x.0 == h)
            .map(|x| (x.1, x.2, x.3.clone()))
            .collect();
        o.retain(|x| x.0 != h);
        mine
    });
    let set = |level: c_int, name: c_int, v: &[u8]| {
        // SAFETY: v is a readable buffer of v.len() bytes for the kernel to copy.
        unsafe {
            libc::syscall(
                libc::SYS_setsockopt,
                nfd as libc::c_long,
                level as libc::c_long,
                name as libc::c_long,
                v.as_ptr(),
                v.len() as libc::c_long,
            )
        }
    };
    for (level, name, v) in &opts {
        set(*level, *name, v);
    }
    for (name, ns) in [
        (libc::SO_RCVTIMEO, s.e.rcvtimeo_ns.load(Ordering::Relaxed)),
        (libc::SO_SNDTIMEO, s.e.sndtimeo_ns.load(Ordering::Relaxed)),
    ] {
        if ns != 0 {
            set(
                libc::SOL_SOCKET,
                name,
                &crate::sock::opts::ns_to_timeval(ns),
            );
        }
    }
    // The number stops being canal's before the kernel socket takes it, and no WATCH
    // is put there meanwhile (sock/watch.rs).
    let held = crate::sock::watch::hold();
    TABLE.take(fd);
    let r = sys::replace_fd(nfd, fd);
    let _ = sys::close(nfd);
    if let Err(e) = r {
        let _ = TABLE.set_canal(fd, h);
        return Err(e);
    }
    drop(held);
    crate::mux::epoll::move_to_kernel(fd);
    crate::sock::close::release(g, h);
    crate::rt::debug!(
        g,
        "canal: fd {fd} (handle {h:#x}) left to the kernel by CANAL_EXCLUDE\n"
    );
    Ok(())
}
