//! Attaching to canald: the control socket path, trust checks on its directory and the
//! daemon's uid, HELLO, mapping the region (memfd or ivshmem BAR), and the wait settings.
use crate::conn::ctl::ctl_exchange;
use crate::conn::ctl::recv_msg;
use crate::conn::ctl::send_msg;
use crate::conn::guest::Guest;
use crate::conn::guest::ATTACH_LOCK;
use crate::conn::guest::FALLBACK;
use crate::conn::guest::GUEST;
use crate::conn::sleep::YIELD_NS;
use crate::notify::{Mode, WaitSettings};
use crate::rt::debug;
use crate::rt::disabled_by_env;
use crate::rt::env;
use crate::rt::errno_name;
use crate::rt::lock;
use crate::rt::unlock;
use crate::rt::PID;
use crate::sys;
use canal_abi::control;
use canal_abi::control::kind as ck;
use canal_abi::control::CTL_HEADER;
use canal_abi::feature;
use canal_abi::sync::AtomicU32;
use canal_abi::sync::Ordering;
use canal_abi::Region;
use canal_abi::MAX_WORKERS;
use core::sync::atomic::AtomicI32;
use libc::c_int;

/// A page shared by every process of this guest connection for the control lock: a
/// memfd (so an exec'd image can map it again), else an anonymous shared page.
fn lock_page() -> Result<(*mut u8, c_int), AttachErr> {
    // SAFETY: memfd_create with a NUL-terminated name.
    let fd = unsafe {
        crate::sys::raw_syscall!(
            libc::SYS_memfd_create,
            c"canal-ctl-lock".as_ptr(),
            libc::MFD_CLOEXEC as libc::c_long,
        )
    } as c_int;
    if fd >= 0 {
        // SAFETY: sizing our own fresh memfd.
        let ok = unsafe {
            crate::sys::raw_syscall!(
                libc::SYS_ftruncate,
                fd as libc::c_long,
                4096 as libc::c_long,
            )
        } == 0;
        if ok {
            if let Ok(p) = sys::mmap_shared(fd, 4096) {
                return Ok((p, fd));
            }
        }
        let _ = sys::close(fd);
    }
    let p = sys::mmap_shared(-1, 4096).map_err(|e| (e, "cannot map the lock page"))?;
    Ok((p, -1))
}

/// The wait settings from the environment. Read by every way of attaching.
pub(crate) fn wait_settings() -> WaitSettings {
    // A process started under a seccomp filter (a sandboxing service manager) makes
    // only the calls such filters allow (sys.rs, "confinement"). Asked here, once per
    // attach, not in the constructor of every process that never uses a socket.
    if let Some(filters) = sys::seccomp_filters_at_start() {
        // `canal run --isolate`'s own filter (CANAL_SECCOMP=1) only notifies canald and
        // allows every call: alone it confines nothing (and confinement's backoff
        // waits would cost every wait up to a millisecond). Any other filter confines.
        let ours = env(c"CANAL_SECCOMP").is_some_and(|v| v == b"1");
        if !(ours && filters == 1) {
            sys::set_confined();
        }
    }
    let fixed = env(c"CANAL_SPIN").and_then(|v| core::str::from_utf8(v).ok()?.parse::<u32>().ok());
    let mode = env(c"CANAL_NOTIFY")
        .and_then(Mode::parse)
        .unwrap_or(Mode::Hybrid);
    if mode == Mode::Poll {
        sys::log_fmt(format_args!(
            "canal: warning: CANAL_NOTIFY=poll never sleeps and burns a core per waiting \
             thread (measurement only)\n"
        ));
    }
    WaitSettings {
        mode,
        spin: fixed.unwrap_or_else(calibrate_spin),
        fixed_spin: fixed.is_some(),
    }
}

/// The control socket path: $CANAL_SOCKET, else $XDG_RUNTIME_DIR/canal/canald.sock,
/// else /tmp/canal-$UID/canald.sock (the contract's rule).
pub(crate) fn socket_path(
    canal_socket: Option<&[u8]>,
    xdg: Option<&[u8]>,
    uid: u32,
    out: &mut [u8; 108],
) -> Option<usize> {
    let mut b = sys::LineBuf::new();
    use core::fmt::Write;
    match (canal_socket, xdg) {
        (Some(p), _) if !p.is_empty() => {
            return copy_path(p, out);
        }
        (_, Some(x)) if !x.is_empty() => {
            let n = copy_path(x, out)?;
            let suffix = b"/canal/canald.sock";
            if n + suffix.len() >= out.len() {
                return None;
            }
            out[n..n + suffix.len()].copy_from_slice(suffix);
            return Some(n + suffix.len());
        }
        _ => {
            let _ = write!(b, "/tmp/canal-{uid}/canald.sock");
        }
    }
    copy_path(b.as_bytes(), out)
}

fn copy_path(p: &[u8], out: &mut [u8; 108]) -> Option<usize> {
    if p.len() >= out.len() || p.contains(&0) {
        return None;
    }
    out[..p.len()].copy_from_slice(p);
    out[p.len()] = 0;
    Some(p.len())
}

/// Attaches on first use. `None`: use kernel sockets (no canald, disabled, dead).
pub(crate) fn ensure_attached() -> Option<&'static Guest> {
    if let Some(g) = GUEST.get() {
        return Some(g);
    }
    if FALLBACK.load(Ordering::Relaxed) {
        return None;
    }
    lock(&ATTACH_LOCK);
    let r = if let Some(g) = GUEST.get() {
        Some(g)
    } else if FALLBACK.load(Ordering::Relaxed) {
        None
    } else if disabled_by_env() {
        FALLBACK.store(true, Ordering::Relaxed);
        None
    } else {
        let mut path = [0u8; 108];
        let r = if env(c"CANAL_TRANSPORT").is_some_and(|t| t == b"ivshmem") {
            attach_ivshmem(&mut path)
        } else {
            attach(&mut path)
        };
        match r {
            Ok(g) => {
                let _ = GUEST.set(g);
                let g = GUEST.get();
                if let Some(g) = g {
                    vrss_setup(g);
                }
                g
            }
            Err((e, what)) => {
                let n = path.iter().position(|&c| c == 0).unwrap_or(0);
                sys::log_fmt(format_args!(
                    "canal: {what} ({}): {} (errno {e}); this process uses kernel sockets\n",
                    core::str::from_utf8(&path[..n]).unwrap_or("?"),
                    errno_name(e)
                ));
                FALLBACK.store(true, Ordering::Relaxed);
                None
            }
        }
    };
    unlock(&ATTACH_LOCK);
    r
}

type AttachErr = (i32, &'static str);

fn attach(path: &mut [u8; 108]) -> Result<Guest, AttachErr> {
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let plen = socket_path(env(c"CANAL_SOCKET"), env(c"XDG_RUNTIME_DIR"), uid, path)
        .ok_or((libc::ENAMETOOLONG, "bad control socket path"))?;
    let fd = sys::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0)
        .map_err(|e| (e, "cannot make a control socket"))?;
    let r = attach_on(fd, &path[..plen]);
    if r.is_err() {
        let _ = sys::close(fd);
    }
    r
}

/// Whether the control directory of `path` may be trusted (canald's `ctldir` rule for
/// clients): a real directory, owned by us and 0700, or owned by root and writable by
/// nobody else. A directory another user made could hold an impostor daemon.
fn check_dir(path: &[u8], uid: u32) -> Result<(), AttachErr> {
    let mut dir = [0u8; 109];
    let d: &[u8] = match path.iter().rposition(|&c| c == b'/') {
        Some(0) => b"/",
        Some(i) => &path[..i],
        None => b".",
    };
    let n = d.len().min(dir.len() - 1);
    dir[..n].copy_from_slice(&d[..n]);
    let (is_dir, owner, mode) =
        sys::lstat_dir(&dir[..=n]).map_err(|e| (e, "cannot inspect the control directory"))?;
    if !is_dir {
        return Err((
            libc::EACCES,
            "the control directory is a symlink or not a directory",
        ));
    }
    if owner != uid && owner != 0 {
        return Err((
            libc::EACCES,
            "the control directory belongs to another user",
        ));
    }
    // A user's own directory must be private; root's may be a system service's
    // (/run/canal, 0755): closed to writes is what matters there (canald::ctldir).
    if mode & 0o022 != 0 || (owner == uid && uid != 0 && mode & 0o077 != 0) {
        return Err((
            libc::EACCES,
            "the control directory is open to other users (not 0700)",
        ));
    }
    Ok(())
}

/// Whether the daemon at the other end of control socket `fd` runs as `uid` or root
/// (SO_PEERCRED; canald's `ctldir::trusted_daemon` rule).
pub(crate) fn daemon_trusted(fd: c_int, uid: u32) -> Result<bool, i32> {
    sys::peer_uid(fd).map(|u| u == uid || u == 0)
}

fn attach_on(fd: c_int, path: &[u8]) -> Result<Guest, AttachErr> {
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    check_dir(path, uid)?;
    // SAFETY: sockaddr_un is plain data.
    let mut sa: libc::sockaddr_un = unsafe { core::mem::zeroed() };
    sa.sun_family = libc::AF_UNIX as u16;
    for (d, s) in sa.sun_path.iter_mut().zip(path) {
        *d = *s as libc::c_char;
    }
    let salen = (core::mem::size_of::<libc::sa_family_t>() + path.len() + 1) as libc::socklen_t;
    // SAFETY: sa is a valid sockaddr_un of at least salen bytes.
    sys::check(unsafe {
        crate::sys::raw_syscall!(
            libc::SYS_connect,
            fd as libc::c_long,
            &sa as *const libc::sockaddr_un,
            salen as libc::c_long,
        )
    })
    .map_err(|e| (e, "no canald answers"))?;
    // Nothing is sent to a daemon of another user (it would get our payload bytes).
    match daemon_trusted(fd, uid) {
        Ok(true) => {}
        Ok(false) => {
            return Err((
                libc::EACCES,
                "the canald there runs as another user; refusing it",
            ))
        }
        Err(e) => return Err((e, "cannot learn who serves the control socket")),
    }
    let tv = libc::timeval {
        tv_sec: 5,
        tv_usec: 0,
    };
    for opt in [libc::SO_RCVTIMEO, libc::SO_SNDTIMEO] {
        // SAFETY: tv is a valid timeval of the given size.
        let _ = unsafe {
            crate::sys::raw_syscall!(
                libc::SYS_setsockopt,
                fd as libc::c_long,
                libc::SOL_SOCKET as libc::c_long,
                opt as libc::c_long,
                &tv as *const libc::timeval,
                core::mem::size_of::<libc::timeval>(),
            )
        };
    }
    let mut comm = [0u8; 16];
    // SAFETY: PR_GET_NAME writes at most 16 bytes into comm.
    unsafe { libc::prctl(libc::PR_GET_NAME, comm.as_mut_ptr()) };
    let body = control::Hello {
        pid: sys::getpid() as u32,
        flags: control::hello_flag::SHORTCUT
            | control::hello_flag::ZONES
            | control::hello_flag::VRSS
            | control::hello_flag::SPARES
            | control::hello_flag::ARENAS
            | control::hello_flag::PACKED_ARENAS
            | control::hello_flag::BELLS
            | control::hello_flag::ACCEPT_ONE
            | control::hello_flag::CLOSE_MARK
            | control::hello_flag::HOST_QUEUED
            | crate::direct::hello_flags()
            | crate::shortcut::fast::hello_flags(),
        comm,
    }
    .encode();
    send_msg(fd, ck::HELLO, &body, -1).map_err(|e| (e, "cannot send HELLO to canald"))?;
    let mut buf = [0u8; 512];
    let mut fds = [-1; 2];
    let (kind, n, nfds) =
        recv_msg(fd, &mut buf, &mut fds).map_err(|e| (e, "no HELLO reply from canald"))?;
    let close_fds = |fds: &[c_int]| {
        for &f in fds {
            if f >= 0 {
                let _ = sys::close(f);
            }
        }
    };
    let body = &buf[CTL_HEADER..n];
    if kind == ck::ERROR {
        close_fds(&fds);
        let e = control::leading_u32(body).map_or(libc::EPROTO, |e| e as i32);
        return Err((e, "canald refused this process"));
    }
    let ok = control::HelloOk::decode(body);
    let (Some(ok), ck::HELLO_OK, 2) = (ok, kind, nfds) else {
        close_fds(&fds);
        return Err((libc::EPROTO, "unexpected HELLO reply from canald"));
    };
    let region_size = ok.region_size;
    let (memfd, doorbell) = (fds[0], fds[1]);
    let r = map_region(memfd, region_size);
    let region = match r {
        Ok(r) => r,
        Err(e) => {
            let _ = sys::close(memfd);
            let _ = sys::close(doorbell);
            return Err(e);
        }
    };
    let (page, lockfd) = lock_page()?;
    // SAFETY: the page is fresh, 4096 bytes, page aligned, mapped for the life of the
    // process (never unmapped) and shared with forked children; an AtomicU32 at its
    // start is properly aligned and any bit pattern is valid.
    let ctl_lock = unsafe { &*(page as *const AtomicU32) };
    // Out of the program's way (ownfd.rs): it expects the numbers after 0-2 for itself.
    let [fd, doorbell, memfd, lockfd] = [fd, doorbell, memfd, lockfd].map(crate::ownfd::adopt);
    let features = region.header().features;
    let debug = env(c"CANAL_LOG").is_some_and(|v| v == b"debug");
    PID.store(sys::getpid(), Ordering::Relaxed);
    let g = Guest {
        region,
        ctl: AtomicI32::new(fd),
        doorbell: AtomicI32::new(doorbell),
        ctl_lock,
        ports: features & feature::PORT_EVENTFD != 0,
        wait: wait_settings(),
        debug,
        memfd: AtomicI32::new(memfd),
        region_size,
        lockfd: AtomicI32::new(lockfd),
        wdoor: Default::default(),
        nworkers: AtomicU32::new(0),
    };
    crate::sock::watch::attached(&g);
    debug!(
        g,
        "canal: attached as guest {} (region {} bytes, {} slots, {} sockets, spin {}{})\n",
        g.region.header().guest_id,
        region_size,
        g.region.layout().slot_count,
        g.region.layout().socket_count,
        g.wait.spin,
        if sys::confined() {
            "; confined by a seccomp filter: waits back off"
        } else {
            ""
        }
    );
    Ok(g)
}

/// Attaches over the ivshmem transport (`ivshmem.rs`): the region is the VM's canal
/// device; no control socket, no ports, backoff waits. `path` gets the device path for
/// error messages.
fn attach_ivshmem(path: &mut [u8; 108]) -> Result<Guest, AttachErr> {
    let dev = env(c"CANAL_IVSHMEM_DEVICE").unwrap_or(b"");
    let n = dev.len().min(path.len() - 1);
    path[..n].copy_from_slice(&dev[..n]);
    if dev.is_empty() {
        return Err((
            libc::ENOENT,
            "CANAL_TRANSPORT=ivshmem without CANAL_IVSHMEM_DEVICE",
        ));
    }
    let region = crate::conn::ivshmem::map_region(dev)?;
    let g_region_size = region.layout().region_size;
    let page = sys::mmap_shared(-1, 4096).map_err(|e| (e, "cannot map the lock page"))?;
    // SAFETY: as in attach_on: a fresh shared page, never unmapped; an AtomicU32 at its
    // start is aligned and valid for any bit pattern.
    let ctl_lock = unsafe { &*(page as *const AtomicU32) };
    let debug = env(c"CANAL_LOG").is_some_and(|v| v == b"debug");
    let poll_us = env(c"CANAL_VM_POLL_US")
        .and_then(|v| core::str::from_utf8(v).ok()?.parse::<i64>().ok())
        .unwrap_or(200)
        .clamp(0, 1_000_000);
    YIELD_NS.store(poll_us * 1000, Ordering::Relaxed);
    PID.store(sys::getpid(), Ordering::Relaxed);
    // ivshmem doorbells (protocol §9.5): kicks through the device's Doorbell register,
    // wake-ups as MSI-X interrupts on per-slot eventfds (in the one process family that
    // owns the VFIO device; the others back off).
    let mut bell = None;
    let mut why = (0, "");
    if region.header().features & feature::DOORBELL != 0 {
        let group = env(c"CANAL_IVSHMEM_VFIO_GROUP").filter(|g| !g.is_empty());
        bell = Some(crate::conn::ivshmem::setup_doorbell(
            &region, dev, group, &mut why,
        ));
    }
    let g = Guest {
        region,
        ctl: AtomicI32::new(-1),
        doorbell: AtomicI32::new(-1),
        ctl_lock,
        // Slots sleep on eventfds only with doorbell interrupts (no PORT: the eventfds
        // are the MSI-X vectors canald already knows).
        ports: bell.is_some_and(|b| b.irqs > 0),
        wait: wait_settings(),
        debug,
        // No memfd or control socket to hand to an exec'd image: no rejoin over ivshmem.
        memfd: AtomicI32::new(-1),
        region_size: g_region_size,
        lockfd: AtomicI32::new(-1),
        wdoor: Default::default(),
        nworkers: AtomicU32::new(0),
    };
    debug!(
        g,
        "canal: attached over ivshmem as guest {} ({} slots, {} sockets, spin {})\n",
        g.region.header().guest_id,
        g.region.layout().slot_count,
        g.region.layout().socket_count,
        g.wait.spin
    );
    match bell {
        None => debug!(g, "canal: no ivshmem doorbell: waits back off\n"),
        Some(b) => {
            debug!(
                g,
                "canal: ivshmem doorbell: kicks {}, wake-ups {}\n",
                if b.ring {
                    "ring the doorbell"
                } else {
                    "cannot ring (canald polls)"
                },
                if b.irqs > 0 {
                    "by interrupt"
                } else {
                    "by backoff"
                }
            );
            if why.0 != 0 {
                debug!(
                    g,
                    "canal: ivshmem doorbell: {} ({})\n",
                    why.1,
                    errno_name(why.0)
                );
            }
        }
    }
    Ok(g)
}

pub(crate) fn map_region(memfd: c_int, region_size: u64) -> Result<Region, AttachErr> {
    let size = sys::file_size(memfd).map_err(|e| (e, "cannot stat the region"))?;
    if region_size < canal_abi::HEADER_SIZE || size < region_size || region_size > (1 << 44) {
        return Err((libc::EPROTO, "region size does not match its memfd"));
    }
    let base =
        sys::mmap_shared(memfd, region_size as usize).map_err(|e| (e, "cannot map the region"))?;
    // SAFETY: base maps region_size bytes of the (sealed, so never shrinking) memfd,
    // read/write, page aligned, and is never unmapped.
    unsafe { Region::attach(base, region_size) }
        .map_err(|_| (libc::EPROTO, "canald's region header is invalid"))
}

/// Iterations of the poll loop for about 30 µs on this machine.
fn calibrate_spin() -> u32 {
    let t0 = sys::now_ns();
    for _ in 0..1000 {
        canal_abi::sync::spin_hint();
    }
    let dt = (sys::now_ns() - t0).max(1) as u64;
    ((30_000u64 * 1000) / dt).clamp(100, 100_000) as u32
}

/// Virtual RSS: with feature::VRSS, fetch one doorbell per canald worker (DOORBELLS).
/// Without them every kick goes to the home worker, and canald keeps this guest's
/// sockets there (it spreads them only once it has answered DOORBELLS).
pub(crate) fn vrss_setup(g: &'static Guest) {
    if g.region.header().features & feature::VRSS == 0 || g.ctl() < 0 {
        return;
    }
    let mut got = [-1; MAX_WORKERS];
    let r = ctl_exchange(g, ck::DOORBELLS, &[], -1, |k, body, fds| {
        if k != ck::DOORBELLS_OK {
            return None;
        }
        let n = body
            .get(..4)
            .map_or(0, |b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize);
        if n != fds.len() || n > MAX_WORKERS {
            // Malformed: drop what came and keep kicking the home worker.
            for &f in fds {
                let _ = sys::close(f);
            }
            return Some(0);
        }
        got[..n].copy_from_slice(fds);
        Some(n)
    });
    let n = match r {
        Ok(n) if n > 0 => n,
        _ => return,
    };
    for (i, &fd) in got[..n].iter().enumerate() {
        let fd = crate::ownfd::adopt(fd);
        let old = g.wdoor[i].swap(fd, Ordering::Relaxed);
        if old > 0 {
            crate::ownfd::using(|| crate::ownfd::close_own(old));
        }
    }
    // Release: the descriptors before the count.
    g.nworkers.store(n as u32, Ordering::Release);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(cs: Option<&str>, xdg: Option<&str>, uid: u32) -> Option<String> {
        let mut out = [0u8; 108];
        let n = socket_path(cs.map(str::as_bytes), xdg.map(str::as_bytes), uid, &mut out)?;
        assert_eq!(out[n], 0, "NUL terminated");
        Some(String::from_utf8(out[..n].to_vec()).unwrap())
    }

    #[test]
    fn default_path_rule() {
        assert_eq!(
            path(Some("/x/y.sock"), Some("/run/user/1"), 5).unwrap(),
            "/x/y.sock"
        );
        assert_eq!(
            path(None, Some("/run/user/1"), 5).unwrap(),
            "/run/user/1/canal/canald.sock"
        );
        assert_eq!(
            path(Some(""), Some(""), 1000).unwrap(),
            "/tmp/canal-1000/canald.sock"
        );
        assert_eq!(path(None, None, 0).unwrap(), "/tmp/canal-0/canald.sock");
        assert!(path(Some(&"a".repeat(200)), None, 0).is_none());
    }
}
