//! The guest's connection to canald: attaching (HELLO), per-thread request slots and
//! their wake-up ports (PORT), requests, kicks, waits, and fork handling.

use crate::fdtable::TABLE;
use crate::notify;
use crate::sys;
use canal_abi::control::{self, kind as ck, CTL_HEADER};
use canal_abi::queue::QueueProducer;
use canal_abi::sync::{fence, AtomicU32, Ordering};
use canal_abi::{
    feature, sleep_kind, slot_state, Region, Slot, SocketEntry, MAX_WORKERS, SLOT_PAYLOAD, WAIT_ANY,
};
use core::cell::Cell;
use core::sync::atomic::{AtomicBool, AtomicI32};
use libc::c_int;
use std::sync::OnceLock;

/// A process attached to canald.
pub struct Guest {
    pub region: Region,
    /// The control socket (SEQPACKET); polled while sleeping so a dead canald wakes us.
    /// -1 over ivshmem (no control socket in a VM).
    pub ctl: c_int,
    /// canald's doorbell eventfd (kicks); -1 over ivshmem (canald polls instead).
    pub doorbell: c_int,
    /// Serialises control-socket use among all processes sharing the connection: a word
    /// in a MAP_SHARED page made at attach time, so forked children share it.
    ctl_lock: &'static AtomicU32,
    /// Whether slots sleep on registered eventfds (else bounded backoff).
    pub ports: bool,
    /// Iterations of a poll loop worth about 30 µs (or the fixed `CANAL_SPIN`).
    pub spin: u32,
    /// `CANAL_SPIN` fixed the budget (no adaptation).
    pub fixed_spin: bool,
    /// `CANAL_NOTIFY`: how threads wait (see `notify`).
    pub notify: crate::notify::Mode,
    pub debug: bool,
    /// Kept for an exec'd image to rejoin (rejoin.rs): the region memfd and its size,
    /// and the memfd behind the control-lock page (-1: anonymous, no rejoin).
    memfd: c_int,
    region_size: u64,
    lockfd: c_int,
    /// Virtual RSS (feature::VRSS): canald's doorbell per worker (DOORBELLS), and
    /// how many; 0 until received (then every kick goes to the home doorbell).
    wdoor: [AtomicI32; MAX_WORKERS],
    nworkers: AtomicU32,
}

/// (ctl, memfd, doorbell, lockfd, region_size) for an exec'd image (rejoin.rs).
pub fn rejoin_fds(g: &Guest) -> Option<(c_int, c_int, c_int, c_int, u64)> {
    (g.memfd >= 0 && g.lockfd >= 0 && g.ctl >= 0 && g.doorbell >= 0).then_some((
        g.ctl,
        g.memfd,
        g.doorbell,
        g.lockfd,
        g.region_size,
    ))
}

/// The calling thread's slot, if it holds one.
pub fn my_slot_index() -> Option<u32> {
    SLOT.try_with(|s| s.idx.get())
        .ok()
        .filter(|&i| i != NO_SLOT)
}

/// A page shared by every process of this guest connection for the control lock: a
/// memfd (so an exec'd image can map it again), else an anonymous shared page.
fn lock_page() -> Result<(*mut u8, c_int), AttachErr> {
    // SAFETY: memfd_create with a NUL-terminated name.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_memfd_create,
            c"canal-ctl-lock".as_ptr(),
            libc::MFD_CLOEXEC as libc::c_long,
        )
    } as c_int;
    if fd >= 0 {
        // SAFETY: sizing our own fresh memfd.
        let ok = unsafe {
            libc::syscall(
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

/// The inherited descriptors are what rejoin.rs says: four distinct ones, a control
/// socket served by a daemon we trust, the region memfd of the announced size, an
/// eventfd, and the one-page lock memfd.
fn check_rejoin_fds(p: &crate::rejoin::Parsed) -> Result<(), &'static str> {
    let fds = [p.ctl, p.memfd, p.doorbell, p.lockfd];
    if (0..4).any(|i| (i + 1..4).any(|j| fds[i] == fds[j])) {
        return Err("descriptors repeat");
    }
    let kind = |fd| sys::fd_kind(fd).map_err(|_| "a descriptor is missing");
    if kind(p.ctl)?.0 != libc::S_IFSOCK {
        return Err("the control descriptor is not a socket");
    }
    // SAFETY: getuid has no preconditions.
    if daemon_trusted(p.ctl, unsafe { libc::getuid() }) != Ok(true) {
        return Err("the control socket's daemon is not ours");
    }
    if kind(p.memfd)? != (libc::S_IFREG, p.region_size) || kind(p.lockfd)? != (libc::S_IFREG, 4096)
    {
        return Err("the region or lock page does not match");
    }
    if !sys::is_eventfd(p.doorbell) {
        return Err("the doorbell is not an eventfd");
    }
    Ok(())
}

/// The exec'd image's side of rejoin.rs: the same guest, from inherited descriptors.
pub fn rejoin(p: &crate::rejoin::Parsed) -> Option<&'static Guest> {
    let fail = |what: &str| {
        sys::log_fmt(format_args!(
            "canal: cannot rejoin the guest after exec ({what}); inherited sockets are not usable\n"
        ));
        None
    };
    // Validate everything before changing anything (a garbage CANAL_REJOIN must not
    // mark the program's own descriptors, e.g. 0-2, close-on-exec).
    if let Err(what) = check_rejoin_fds(p) {
        return fail(what);
    }
    for fd in [p.ctl, p.memfd, p.doorbell, p.lockfd] {
        if sys::fcntl_int(fd, libc::F_SETFD, libc::FD_CLOEXEC as libc::c_long).is_err() {
            return fail("a descriptor is missing");
        }
    }
    let Ok(region) = map_region(p.memfd, p.region_size) else {
        return fail("region");
    };
    let Ok(page) = sys::mmap_shared(p.lockfd, 4096) else {
        return fail("lock page");
    };
    // SAFETY: as in attach_on: a 4096-byte shared page, never unmapped.
    let ctl_lock = unsafe { &*(page as *const AtomicU32) };
    for fd in [p.ctl, p.memfd, p.doorbell, p.lockfd] {
        let _ = TABLE.set_internal(fd);
    }
    let features = region.header().features;
    let debug = env(c"CANAL_LOG").is_some_and(|v| v == b"debug");
    let (spin, fixed_spin, notify) = wait_settings();
    PID.store(sys::getpid(), Ordering::Relaxed);
    let g = Guest {
        region,
        ctl: p.ctl,
        doorbell: p.doorbell,
        ctl_lock,
        ports: features & feature::PORT_EVENTFD != 0,
        spin,
        fixed_spin,
        notify,
        debug,
        memfd: p.memfd,
        region_size: p.region_size,
        lockfd: p.lockfd,
        wdoor: Default::default(),
        nworkers: AtomicU32::new(0),
    };
    lock(&ATTACH_LOCK);
    let ok = GUEST.set(g).is_ok();
    unlock(&ATTACH_LOCK);
    let g = GUEST.get()?;
    if !ok {
        return Some(g);
    }
    // The doorbells are not inherited over exec: ask canald again.
    vrss_setup(g);
    // The exec'ing thread's slot: idle, and nobody in this image owns it.
    if p.old_slot != u32::MAX {
        release_slot(g, p.old_slot, -1);
    }
    debug!(
        g,
        "canal: rejoined guest {} after exec\n",
        g.region.header().guest_id
    );
    Some(g)
}

/// The wait settings from the environment: (spin budget in iterations, whether
/// CANAL_SPIN fixed it, notification mode). Read by every way of attaching.
fn wait_settings() -> (u32, bool, crate::notify::Mode) {
    let fixed = env(c"CANAL_SPIN").and_then(|v| core::str::from_utf8(v).ok()?.parse::<u32>().ok());
    let notify = env(c"CANAL_NOTIFY")
        .and_then(crate::notify::Mode::parse)
        .unwrap_or(crate::notify::Mode::Hybrid);
    if notify == crate::notify::Mode::Poll {
        sys::log_fmt(format_args!(
            "canal: warning: CANAL_NOTIFY=poll never sleeps and burns a core per waiting \
             thread (measurement only)\n"
        ));
    }
    (
        fixed.unwrap_or_else(calibrate_spin),
        fixed.is_some(),
        notify,
    )
}

static GUEST: OnceLock<Guest> = OnceLock::new();
/// Set once attaching failed or was disabled: this process uses kernel sockets.
static FALLBACK: AtomicBool = AtomicBool::new(false);
/// Set once canald is known to be gone.
static DEAD: AtomicBool = AtomicBool::new(false);
/// Process-local lock around attaching (taken by the fork prepare handler).
static ATTACH_LOCK: AtomicU32 = AtomicU32::new(0);
/// The pid this process's state belongs to (detects a vfork child sharing our memory).
pub static PID: AtomicI32 = AtomicI32::new(0);
/// Eventfd of each slot this process owns (for waking local sleepers on local events).
static SLOT_EFD: [AtomicI32; canal_abi::MAX_SLOTS as usize] =
    [const { AtomicI32::new(-1) }; canal_abi::MAX_SLOTS as usize];

macro_rules! debug {
    ($g:expr, $($t:tt)*) => {
        if $g.debug {
            $crate::sys::log_fmt(format_args!($($t)*));
        }
    };
}
pub(crate) use debug;

pub fn guest() -> Option<&'static Guest> {
    GUEST.get()
}

pub fn is_dead(g: &Guest) -> bool {
    DEAD.load(Ordering::Relaxed) || g.region.header().host_state.load(Ordering::Relaxed) == 2
}

/// Whether canald's end of the control connection is gone (a killed canald cannot
/// mark its regions abandoned): a zero-timeout ppoll for POLLHUP, for waits that
/// never sleep (poll-only mode), which would otherwise spin forever.
fn control_hung_up(g: &Guest) -> bool {
    if g.ctl < 0 {
        return false;
    }
    let mut pf = [libc::pollfd {
        fd: g.ctl,
        events: 0,
        revents: 0,
    }];
    matches!(sys::ppoll(&mut pf, Some(0), sys::SigMask::NONE), Ok(n) if n > 0)
        && pf[0].revents & (libc::POLLHUP | libc::POLLERR) != 0
}

pub fn mark_dead() {
    if !DEAD.swap(true, Ordering::Relaxed) {
        sys::log_fmt(format_args!(
            "canal: canald went away; calls on canal sockets now fail (ECONNRESET on data calls, EIO otherwise) and new sockets fail with ENETDOWN (kernel sockets would escape canald's policy): restart the program under canal run\n"
        ));
    }
}

// ---- small locks -----------------------------------------------------------------------

/// A spin-then-yield lock word (guest memory; holders never block while holding it).
pub fn lock(word: &AtomicU32) {
    let mut n = 0u32;
    loop {
        // L1: Acquire pairs with the Release in `unlock` (L2): the previous holder's
        // writes are visible to us.
        if word
            .compare_exchange_weak(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
        {
            return;
        }
        n += 1;
        backoff(n);
    }
}

/// The `n`th round of a wait for a lock held by a thread that does not block: spin
/// briefly, then give the CPU away (the holder may be waiting for it on 2 cores).
pub fn backoff(n: u32) {
    if n < 100 {
        canal_abi::sync::spin_hint();
    } else {
        sys::sched_yield();
    }
}

pub fn unlock(word: &AtomicU32) {
    // L2: Release pairs with L1.
    word.store(0, Ordering::Release);
}

/// The control-socket lock holds the holder's tid, so a lock left by a dead process
/// can be taken over.
fn ctl_lock(g: &Guest) {
    let me = sys::gettid() as u32;
    let start = sys::now_ns();
    loop {
        // Acquire pairs with the Release store in ctl_unlock.
        match g
            .ctl_lock
            .compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed)
        {
            Ok(_) => return,
            Err(holder) => {
                if sys::now_ns() - start > 1_000_000_000 && !sys::alive(holder as i32) {
                    let _ =
                        g.ctl_lock
                            .compare_exchange(holder, 0, Ordering::AcqRel, Ordering::Relaxed);
                }
                // Sleep until the holder unlocks (its FUTEX_WAKE), at most 10 ms (a
                // holder that died never wakes us). Polling instead (20 µs sleeps)
                // kept hundreds of threads registering their ports at once busy
                // waking up, starving the holder and canald on two cores.
                let _ = sys::futex_wait(g.ctl_lock, holder, 10_000_000);
            }
        }
    }
}

fn ctl_unlock(g: &Guest) {
    g.ctl_lock.store(0, Ordering::Release);
    // Control exchanges are rare (ports, segments): one wake per unlock is cheap.
    sys::futex_wake_one(g.ctl_lock);
}

// ---- attaching -------------------------------------------------------------------------

/// The control socket path: $CANAL_SOCKET, else $XDG_RUNTIME_DIR/canal/canald.sock,
/// else /tmp/canal-$UID/canald.sock (the contract's rule).
pub fn socket_path(
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

fn env(name: &core::ffi::CStr) -> Option<&'static [u8]> {
    // SAFETY: getenv with a NUL-terminated name; the result (if any) is a C string
    // owned by the environment. We use it before anything could change it.
    let p = unsafe { libc::getenv(name.as_ptr()) };
    if p.is_null() {
        None
    } else {
        // SAFETY: a non-null getenv result is a valid C string.
        Some(unsafe { core::ffi::CStr::from_ptr(p) }.to_bytes())
    }
}

pub fn disabled_by_env() -> bool {
    env(c"CANAL_DISABLE").is_some_and(|v| !v.is_empty() && v != b"0")
}

/// Attaches on first use. `None`: use kernel sockets (no canald, disabled, dead).
pub fn ensure_attached() -> Option<&'static Guest> {
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

pub fn errno_name(e: i32) -> &'static str {
    match e {
        libc::ENOENT => "ENOENT (no such file)",
        libc::ECONNREFUSED => "ECONNREFUSED (nobody listening)",
        libc::EACCES => "EACCES",
        libc::EPERM => "EPERM",
        libc::ETIMEDOUT | libc::EAGAIN => "timed out",
        libc::EPROTO => "protocol error",
        libc::ENAMETOOLONG => "path too long",
        libc::ECONNRESET => "ECONNRESET",
        libc::ENOMEM => "ENOMEM",
        _ => "error",
    }
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
    if mode & 0o022 != 0 || (owner == uid && mode & 0o077 != 0) {
        return Err((
            libc::EACCES,
            "the control directory is open to other users (not 0700)",
        ));
    }
    Ok(())
}

/// Whether the daemon at the other end of control socket `fd` runs as `uid` or root
/// (SO_PEERCRED; canald's `ctldir::trusted_daemon` rule).
fn daemon_trusted(fd: c_int, uid: u32) -> Result<bool, i32> {
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
        libc::syscall(
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
            libc::syscall(
                libc::SYS_setsockopt,
                fd as libc::c_long,
                libc::SOL_SOCKET as libc::c_long,
                opt as libc::c_long,
                &tv as *const libc::timeval,
                core::mem::size_of::<libc::timeval>(),
            )
        };
    }
    // HELLO: pid, flags, comm.
    let mut body = [0u8; control::HELLO_BODY];
    body[0..4].copy_from_slice(&(sys::getpid() as u32).to_le_bytes());
    let flags =
        control::hello_flag::SHORTCUT | control::hello_flag::ZONES | control::hello_flag::VRSS;
    body[4..8].copy_from_slice(&flags.to_le_bytes());
    let mut comm = [0u8; 16];
    // SAFETY: PR_GET_NAME writes at most 16 bytes into comm.
    unsafe { libc::prctl(libc::PR_GET_NAME, comm.as_mut_ptr()) };
    body[8..24].copy_from_slice(&comm);
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
        let e = if body.len() >= 4 {
            i32::from_le_bytes([body[0], body[1], body[2], body[3]])
        } else {
            libc::EPROTO
        };
        return Err((e, "canald refused this process"));
    }
    if kind != ck::HELLO_OK || body.len() < control::HELLO_OK_BODY || nfds != 2 {
        close_fds(&fds);
        return Err((libc::EPROTO, "unexpected HELLO reply from canald"));
    }
    let region_size = u64::from_le_bytes(body[8..16].try_into().unwrap());
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
    let _ = TABLE.set_internal(fd);
    let _ = TABLE.set_internal(doorbell);
    let _ = TABLE.set_internal(memfd);
    if lockfd >= 0 {
        let _ = TABLE.set_internal(lockfd);
    }
    let features = region.header().features;
    let debug = env(c"CANAL_LOG").is_some_and(|v| v == b"debug");
    let (spin, fixed_spin, notify) = wait_settings();
    PID.store(sys::getpid(), Ordering::Relaxed);
    let g = Guest {
        region,
        ctl: fd,
        doorbell,
        ctl_lock,
        ports: features & feature::PORT_EVENTFD != 0,
        spin,
        fixed_spin,
        notify,
        debug,
        memfd,
        region_size,
        lockfd,
        wdoor: Default::default(),
        nworkers: AtomicU32::new(0),
    };
    debug!(
        g,
        "canal: attached as guest {} (region {} bytes, {} slots, {} sockets, spin {})\n",
        g.region.header().guest_id,
        region_size,
        g.region.layout().slot_count,
        g.region.layout().socket_count,
        spin
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
    let region = crate::ivshmem::map_region(dev)?;
    let g_region_size = region.layout().region_size;
    let page = sys::mmap_shared(-1, 4096).map_err(|e| (e, "cannot map the lock page"))?;
    // SAFETY: as in attach_on: a fresh shared page, never unmapped; an AtomicU32 at its
    // start is aligned and valid for any bit pattern.
    let ctl_lock = unsafe { &*(page as *const AtomicU32) };
    let debug = env(c"CANAL_LOG").is_some_and(|v| v == b"debug");
    let (spin, fixed_spin, notify) = wait_settings();
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
        bell = Some(crate::ivshmem::setup_doorbell(
            &region, dev, group, &mut why,
        ));
    }
    let g = Guest {
        region,
        ctl: -1,
        doorbell: -1,
        ctl_lock,
        // Slots sleep on eventfds only with doorbell interrupts (no PORT: the eventfds
        // are the MSI-X vectors canald already knows).
        ports: bell.is_some_and(|b| b.irqs > 0),
        spin,
        fixed_spin,
        notify,
        debug,
        // No memfd or control socket to hand to an exec'd image: no rejoin over ivshmem.
        memfd: -1,
        region_size: g_region_size,
        lockfd: -1,
        wdoor: Default::default(),
        nworkers: AtomicU32::new(0),
    };
    debug!(
        g,
        "canal: attached over ivshmem as guest {} ({} slots, {} sockets, spin {})\n",
        g.region.header().guest_id,
        g.region.layout().slot_count,
        g.region.layout().socket_count,
        spin
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

fn map_region(memfd: c_int, region_size: u64) -> Result<Region, AttachErr> {
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

/// Sends one control message, optionally with one descriptor.
fn send_msg(fd: c_int, kind: u16, body: &[u8], pass: c_int) -> Result<(), i32> {
    let mut msg = [0u8; 64];
    let n = CTL_HEADER + body.len();
    msg[..CTL_HEADER].copy_from_slice(&control::encode_header(kind, body.len() as u32));
    msg[CTL_HEADER..n].copy_from_slice(body);
    let mut iov = libc::iovec {
        iov_base: msg.as_mut_ptr() as *mut _,
        iov_len: n,
    };
    #[repr(C)]
    struct Cmsg {
        h: libc::cmsghdr,
        fd: c_int,
        pad: c_int,
    }
    // SAFETY: plain data.
    let mut cm: Cmsg = unsafe { core::mem::zeroed() };
    // SAFETY: msghdr is plain data.
    let mut mh: libc::msghdr = unsafe { core::mem::zeroed() };
    mh.msg_iov = &mut iov;
    mh.msg_iovlen = 1;
    if pass >= 0 {
        // SAFETY: CMSG_LEN is pure arithmetic.
        cm.h.cmsg_len = unsafe { libc::CMSG_LEN(4) } as usize;
        cm.h.cmsg_level = libc::SOL_SOCKET;
        cm.h.cmsg_type = libc::SCM_RIGHTS;
        cm.fd = pass;
        mh.msg_control = &mut cm as *mut Cmsg as *mut _;
        // SAFETY: CMSG_SPACE is pure arithmetic.
        mh.msg_controllen = unsafe { libc::CMSG_SPACE(4) } as usize;
    }
    // SAFETY: mh points to live iovec/cmsg buffers for the duration of the call.
    let r = sys::check(unsafe {
        libc::syscall(
            libc::SYS_sendmsg,
            fd as libc::c_long,
            &mh as *const libc::msghdr,
            libc::MSG_NOSIGNAL as libc::c_long,
        )
    })?;
    if r != n {
        return Err(libc::EPROTO);
    }
    Ok(())
}

/// Receives one control message; returns (kind, total bytes, descriptors received).
fn recv_msg(fd: c_int, buf: &mut [u8], fds: &mut [c_int]) -> Result<(u16, usize, usize), i32> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut _,
        iov_len: buf.len(),
    };
    // Room for MAX_WORKERS descriptors (DOORBELLS_OK).
    let mut cbuf = [0u64; 16];
    // SAFETY: msghdr is plain data.
    let mut mh: libc::msghdr = unsafe { core::mem::zeroed() };
    mh.msg_iov = &mut iov;
    mh.msg_iovlen = 1;
    mh.msg_control = cbuf.as_mut_ptr() as *mut _;
    mh.msg_controllen = core::mem::size_of_val(&cbuf);
    // SAFETY: mh points to live buffers for the duration of the call.
    let n = sys::check(unsafe {
        libc::syscall(
            libc::SYS_recvmsg,
            fd as libc::c_long,
            &mut mh as *mut libc::msghdr,
            libc::MSG_CMSG_CLOEXEC as libc::c_long,
        )
    })?;
    let mut nfds = 0;
    // SAFETY: walking the control buffer the kernel filled, with the libc macros that
    // bound every header by msg_controllen.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&mh);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c) as *const c_int;
                let count = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / 4;
                for i in 0..count {
                    let f = core::ptr::read_unaligned(data.add(i));
                    if nfds < fds.len() {
                        fds[nfds] = f;
                        nfds += 1;
                    } else {
                        let _ = sys::close(f);
                    }
                }
            }
            c = libc::CMSG_NXTHDR(&mh, c);
        }
    }
    if n == 0 {
        return Err(libc::ECONNRESET);
    }
    let (kind, _) = control::decode(&buf[..n]).ok_or(libc::EPROTO)?;
    Ok((kind, n, nfds))
}

// ---- per-thread slots ------------------------------------------------------------------

const NO_SLOT: u32 = u32::MAX;

struct ThreadSlot {
    idx: Cell<u32>,
    efd: Cell<c_int>,
    /// A thread that found every keepable slot kept (it borrows instead) looks again
    /// only after this (monotonic ns): a look scans them all.
    retry_at: Cell<i64>,
}

/// How long a thread that could not keep a slot borrows before it looks again.
const BIND_RETRY_NS: i64 = 50_000_000;

impl Drop for ThreadSlot {
    fn drop(&mut self) {
        let idx = self.idx.replace(NO_SLOT);
        if idx != NO_SLOT {
            if let Some(g) = guest() {
                release_slot(g, idx, self.efd.replace(-1));
            }
        }
    }
}

thread_local! {
    static SLOT: ThreadSlot = const {
        ThreadSlot { idx: Cell::new(NO_SLOT), efd: Cell::new(-1), retry_at: Cell::new(0) }
    };
}

/// A slot in use by the calling thread. Temporary slots (a thread whose thread-locals
/// are already gone) are released on drop and wait by backoff.
pub struct SlotRef<'g> {
    pub g: &'g Guest,
    pub idx: u32,
    pub slot: &'g Slot,
    pub efd: c_int,
    temp: bool,
}

impl Drop for SlotRef<'_> {
    fn drop(&mut self) {
        if self.temp {
            release_slot(self.g, self.idx, -1);
        }
    }
}

fn release_slot(g: &Guest, idx: u32, efd: c_int) {
    if let Some(s) = g.region.slot(idx) {
        s.sleep.store(sleep_kind::AWAKE, Ordering::Relaxed);
        // A slot is only released IDLE (no request outstanding). Release pairs with
        // the Acquire CAS of the next claimer.
        let _ = s.state.compare_exchange(
            slot_state::IDLE,
            slot_state::FREE,
            Ordering::Release,
            Ordering::Relaxed,
        );
    }
    if efd >= 0 {
        if let Some(a) = SLOT_EFD.get(idx as usize) {
            a.store(-1, Ordering::Relaxed);
        }
        if crate::ivshmem::is_irq_efd(efd) {
            return; // an interrupt vector's eventfd: the next holder of the slot uses it
        }
        TABLE.take(efd);
        let _ = sys::close(efd);
    }
}

/// Slots a thread may keep for its lifetime: all but a quarter (at least one when
/// there are two or more), which stay for threads beyond that number to borrow one
/// request at a time (`claim_temp`), so any number of threads can make requests.
fn bindable(n: u32) -> u32 {
    match n {
        0 | 1 => n,
        2..=7 => n - 1,
        _ => n - n / 4,
    }
}

/// A free slot among the first `limit`; with `takeover`, also an idle one whose owner
/// thread is gone (one liveness check per idle slot: not for every borrow).
fn claim_slot(g: &Guest, limit: u32, takeover: bool) -> Result<u32, i32> {
    let n = g.region.layout().slot_count.min(limit);
    if n == 0 {
        return Err(libc::EAGAIN);
    }
    let tid = sys::gettid() as u32;
    let start = tid % n;
    for pass in 0..(1 + takeover as u32) {
        for i in 0..n {
            let idx = (start + i) % n;
            let Some(s) = g.region.slot(idx) else {
                continue;
            };
            let claimed = if pass == 0 {
                // A plain load first: most slots are kept by threads, and a failing
                // CAS would still take each one's line from the core using it.
                // Acquire pairs with the Release in release_slot.
                s.state.load(Ordering::Relaxed) == slot_state::FREE
                    && s.state
                        .compare_exchange(
                            slot_state::FREE,
                            slot_state::IDLE,
                            Ordering::Acquire,
                            Ordering::Relaxed,
                        )
                        .is_ok()
            } else {
                // Second pass: take over IDLE slots whose owner thread is gone (a
                // process that died without releasing them). The CAS on `owner` makes
                // exactly one claimer win.
                let owner = s.owner.load(Ordering::Relaxed);
                s.state.load(Ordering::Acquire) == slot_state::IDLE
                    && owner != 0
                    && !sys::alive(owner as i32)
                    && s.owner
                        .compare_exchange(owner, tid, Ordering::AcqRel, Ordering::Relaxed)
                        .is_ok()
            };
            if claimed {
                s.owner.store(tid, Ordering::Relaxed);
                s.sleep.store(sleep_kind::AWAKE, Ordering::Relaxed);
                return Ok(idx);
            }
        }
    }
    Err(libc::EAGAIN)
}

/// Whether canald takes WATCH messages (kernel-counted socket liveness).
pub fn watch_enabled(g: &Guest) -> bool {
    g.ctl >= 0 && g.region.header().features & feature::WATCH != 0
}

/// WATCH: hands `end` (the other end of a socket's dummy descriptor) to canald.
/// No reply; a failure only loses the backstop (the reference count still works).
pub fn send_watch(g: &Guest, handle: u32, end: c_int) {
    if send_msg(g.ctl, ck::WATCH, &handle.to_le_bytes(), end).is_err() {
        debug!(g, "canal: WATCH for handle {handle:#x} failed\n");
    }
}

/// One request/reply exchange on the control socket, serialised among all threads and
/// processes sharing it: sends `kind` with `body` (and `fd` if ≥ 0), then reads replies
/// until `accept(kind, body, fds)` takes one. Descriptors of replies it does not take
/// are closed; an ERROR reply ends the exchange with its errno; other replies are stale
/// ones (a process that died mid-exchange) and are skipped. A reset connection marks
/// canald dead.
fn ctl_exchange<T>(
    g: &Guest,
    kind: u16,
    body: &[u8],
    fd: c_int,
    mut accept: impl FnMut(u16, &[u8], &[c_int]) -> Option<T>,
) -> Result<T, i32> {
    if is_dead(g) {
        return Err(libc::EIO);
    }
    ctl_lock(g);
    let r = (|| {
        send_msg(g.ctl, kind, body, fd)?;
        let mut buf = [0u8; 256];
        let mut fds = [-1; MAX_WORKERS];
        loop {
            let (k, n, nfds) = recv_msg(g.ctl, &mut buf, &mut fds)?;
            let reply = &buf[CTL_HEADER..n];
            if let Some(v) = accept(k, reply, &fds[..nfds]) {
                return Ok(v);
            }
            for f in fds.iter_mut().take(nfds) {
                let _ = sys::close(*f);
                *f = -1;
            }
            if k == ck::ERROR {
                let e = reply
                    .get(..4)
                    .map_or(libc::EIO, |b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]));
                return Err(if e > 0 { e } else { libc::EIO });
            }
        }
    })();
    ctl_unlock(g);
    if matches!(r, Err(libc::ECONNRESET) | Err(libc::EPIPE)) {
        mark_dead();
    }
    r
}

/// The leading `u32` of a reply body, if it has one.
fn leading_u32(body: &[u8]) -> Option<u32> {
    body.get(..4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

/// Registers `efd` as the wake-up port of slot `idx` (PORT / PORT_OK).
fn register_port(g: &Guest, idx: u32, efd: c_int) -> Result<(), i32> {
    ctl_exchange(g, ck::PORT, &idx.to_le_bytes(), efd, |k, body, _| {
        (k == ck::PORT_OK && leading_u32(body) == Some(idx)).then_some(())
    })
}

/// Asks canald for pair segment `id` (SEGMENT / SEGMENT_OK): its memfd and size.
pub fn ctl_segment(g: &Guest, id: u32) -> Result<(c_int, u64), i32> {
    ctl_exchange(g, ck::SEGMENT, &id.to_le_bytes(), -1, |k, body, fds| {
        let ok = k == ck::SEGMENT_OK
            && body.len() >= control::SEGMENT_OK_BODY
            && leading_u32(body) == Some(id)
            && fds.len() == 1;
        ok.then(|| {
            let size = u64::from_le_bytes(body[8..16].try_into().unwrap_or([0; 8]));
            (fds[0], size)
        })
    })
}

/// A slot for one request of a thread that has none of its own: any free slot, waited
/// for if all are busy (borrowed slots are released after each request, so one frees).
fn claim_temp(g: &Guest) -> Result<u32, i32> {
    let n = g.region.layout().slot_count;
    let mut tries = 0u32;
    loop {
        // A dead owner's slot is taken over by threads that keep slots, not here.
        match claim_slot(g, n, false) {
            Ok(i) => return Ok(i),
            Err(_) if !is_dead(g) => {
                // Sleep, not yield: on few cores the holders need the CPU.
                tries = tries.saturating_add(1);
                sys::sleep_ns(20_000 * i64::from(tries.min(50)));
            }
            Err(e) => return Err(e),
        }
    }
}

fn claim_for_thread(g: &Guest) -> Result<(u32, c_int), i32> {
    let idx = claim_slot(g, bindable(g.region.layout().slot_count), true)?;
    if !g.ports {
        return Ok((idx, -1));
    }
    if g.ctl < 0 {
        // ivshmem with doorbell interrupts: slot idx's port is MSI-X vector idx's
        // eventfd, shared by this process family and never closed (-1 beyond the
        // routed vectors: that slot backs off).
        let efd = crate::ivshmem::irq_efd(idx);
        if let Some(a) = SLOT_EFD.get(idx as usize) {
            a.store(efd, Ordering::Relaxed);
        }
        return Ok((idx, efd));
    }
    let efd = match sys::eventfd() {
        Ok(f) => f,
        Err(e) => {
            release_slot(g, idx, -1);
            return Err(e);
        }
    };
    let _ = TABLE.set_internal(efd);
    if let Err(e) = register_port(g, idx, efd) {
        release_slot(g, idx, efd);
        return Err(e);
    }
    if let Some(a) = SLOT_EFD.get(idx as usize) {
        a.store(efd, Ordering::Relaxed);
    }
    Ok((idx, efd))
}

/// The thread's kept slot, claimed (and its port registered) on first use; EAGAIN
/// while every keepable slot is kept (looked at again after BIND_RETRY_NS).
fn bind_thread_slot(g: &Guest, s: &ThreadSlot) -> Result<(u32, c_int), i32> {
    if s.idx.get() == NO_SLOT {
        let now = sys::now_ns();
        if now < s.retry_at.get() {
            return Err(libc::EAGAIN);
        }
        match claim_for_thread(g) {
            Ok((idx, efd)) => {
                s.idx.set(idx);
                s.efd.set(efd);
            }
            Err(e) => {
                if e == libc::EAGAIN {
                    s.retry_at.set(now + BIND_RETRY_NS);
                }
                return Err(e);
            }
        }
    }
    Ok((s.idx.get(), s.efd.get()))
}

/// The calling thread's own slot, claimed (and its port registered) on first use;
/// None for a thread beyond the slots threads may keep (or past its thread-locals):
/// such a thread sleeps with `sleep_backoff` instead of holding a borrowed slot.
pub fn own_slot(g: &'static Guest) -> Option<SlotRef<'static>> {
    let (idx, efd) = SLOT.try_with(|s| bind_thread_slot(g, s)).ok()?.ok()?;
    Some(SlotRef {
        g,
        idx,
        slot: g.region.slot(idx)?,
        efd,
        temp: false,
    })
}

/// Sleeps once on readiness: on the thread's own slot (`sleep_events`), or, for a
/// thread without one, in backoff (`sleep_backoff`).
pub fn sleep_ready(
    g: &'static Guest,
    index: u32,
    timeout_ns: Option<i64>,
    cond: &mut dyn FnMut() -> bool,
    extra: &mut [libc::pollfd],
    sigmask: sys::SigMask,
) -> Result<usize, i32> {
    match own_slot(g) {
        Some(s) => sleep_events(&s, index, timeout_ns, cond, extra, sigmask),
        None => sleep_backoff(g, timeout_ns, cond, extra, sigmask),
    }
}

/// The calling thread's slot, claimed (and its port registered) on first use.
pub fn my_slot(g: &'static Guest) -> Result<SlotRef<'static>, i32> {
    let r = SLOT.try_with(|s| bind_thread_slot(g, s));
    let (idx, efd, temp) = match r {
        Ok(Ok((i, e))) => (i, e, false),
        // Every slot a thread may keep is kept by another thread: borrow one.
        Ok(Err(libc::EAGAIN)) => (claim_temp(g)?, -1, true),
        Ok(Err(e)) => return Err(e),
        // Thread-locals already destroyed (a late destructor): use a temporary slot.
        Err(_) => (claim_temp(g)?, -1, true),
    };
    let slot = g.region.slot(idx).ok_or(libc::EIO)?;
    Ok(SlotRef {
        g,
        idx,
        slot,
        efd,
        temp,
    })
}

// ---- kicks, requests, waits ------------------------------------------------------------

/// Tells the host there is new work (§6): fence, then wake it only if it sleeps.
pub fn kick(g: &Guest) {
    let h = g.region.header();
    // K1: SeqCst fence between our publication (request state / ring index /
    // attention bit) and the load of host_sleeping; pairs with the host's fence between
    // storing host_sleeping = 1 and re-checking for work (Dekker).
    fence(Ordering::SeqCst);
    if h.host_sleeping.load(Ordering::Relaxed) != 0
        && h.host_sleeping.swap(0, Ordering::AcqRel) == 1
    {
        if g.doorbell >= 0 {
            if sys::eventfd_signal(g.doorbell).is_err() {
                mark_dead();
            }
        } else {
            // Over ivshmem: the device's Doorbell register if the region has one and
            // this process mapped it (§9.5); else canald's sleep is bounded (§9.4).
            crate::ivshmem::ring();
        }
        h.kicks.fetch_add(1, Ordering::Relaxed);
    }
}

/// Marks socket `index` for the host's attention (A1) and kicks the worker that owns
/// it (virtual RSS, protocol §6.3), or the home worker.
pub fn attention(g: &Guest, index: u32) {
    g.region.raise_attention(index);
    let n = g.nworkers.load(Ordering::Acquire);
    if n == 0 {
        return kick(g);
    }
    // K1 as in kick: the bit before the owner and sleep words.
    fence(Ordering::SeqCst);
    let w = g
        .region
        .socket(index)
        .map_or(u32::MAX, |e| e.owner.load(Ordering::Relaxed));
    let h = g.region.header();
    let (Some(word), Some(door)) = (h.worker_sleeping.get(w as usize), g.wdoor.get(w as usize))
    else {
        return kick(g);
    };
    if w >= n {
        return kick(g);
    }
    if word.load(Ordering::Relaxed) != 0 && word.swap(0, Ordering::AcqRel) == 1 {
        if sys::eventfd_signal(door.load(Ordering::Relaxed)).is_err() {
            mark_dead();
        }
        h.kicks.fetch_add(1, Ordering::Relaxed);
    }
}

/// Virtual RSS: with feature::VRSS, fetch one doorbell per canald worker (DOORBELLS).
/// Without them every kick goes to the home worker, and canald keeps this guest's
/// sockets there (it spreads them only once it has answered DOORBELLS).
fn vrss_setup(g: &'static Guest) {
    if g.region.header().features & feature::VRSS == 0 || g.ctl < 0 {
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
        let old = g.wdoor[i].swap(fd, Ordering::Relaxed);
        let _ = TABLE.set_internal(fd);
        if old > 0 {
            let _ = sys::close(old);
        }
    }
    // Release: the descriptors before the count.
    g.nworkers.store(n as u32, Ordering::Release);
}

/// Runs one request on the calling thread's slot. `out` receives the payload the host
/// returned; the result is the value (≥ 0) and the payload length, or an errno.
pub fn request(
    g: &'static Guest,
    op: u32,
    handle: u32,
    args: [u64; 4],
    payload: &[u8],
    out: &mut [u8],
) -> Result<(i64, usize), i32> {
    if is_dead(g) {
        return Err(libc::EIO);
    }
    let s = my_slot(g)?;
    let slot = s.slot;
    if payload.len() > SLOT_PAYLOAD {
        return Err(libc::EINVAL);
    }
    slot.op.store(op, Ordering::Relaxed);
    slot.socket.store(handle, Ordering::Relaxed);
    for (a, v) in slot.args.iter().zip(args) {
        a.store(v, Ordering::Relaxed);
    }
    slot.in_len.store(payload.len() as u32, Ordering::Relaxed);
    slot.out_len.store(0, Ordering::Relaxed);
    slot.write_payload(0, payload);
    let seq = slot.seq.load(Ordering::Relaxed).wrapping_add(1);
    slot.seq.store(seq, Ordering::Relaxed);
    // S1: Release publishes every field above; pairs with the host's Acquire CAS
    // REQUESTED→BUSY.
    slot.state.store(slot_state::REQUESTED, Ordering::Release);
    let q = QueueProducer::new(g.region.queue_cells(), &g.region.header().queue_tail);
    if q.push(s.idx).is_err() {
        // Cannot happen with an honest region (capacity = slot count).
        slot.state.store(slot_state::IDLE, Ordering::Relaxed);
        return Err(libc::EIO);
    }
    kick(g);
    wait_done(&s)?;
    let result = slot.result.load(Ordering::Relaxed);
    let done_seq = slot.done_seq.load(Ordering::Relaxed);
    let n = (slot.out_len.load(Ordering::Relaxed) as usize)
        .min(SLOT_PAYLOAD)
        .min(out.len());
    slot.read_payload(0, &mut out[..n]);
    slot.state.store(slot_state::IDLE, Ordering::Relaxed);
    if done_seq != seq {
        return Err(libc::EIO);
    }
    if result < 0 {
        let e = result.checked_neg().unwrap_or(libc::EIO as i64);
        return Err(if (1..4096).contains(&e) {
            e as i32
        } else {
            libc::EIO
        });
    }
    Ok((result, n))
}

fn wait_done(s: &SlotRef) -> Result<(), i32> {
    let g = s.g;
    let slot = s.slot;
    let mut spins = 0u32;
    let mut backoff = 1_000i64;
    let budget = notify::spin_iters(g);
    let t0 = if notify::adaptive(g) {
        sys::now_ns()
    } else {
        0
    };
    let mut yield_start: Option<i64> = None;
    loop {
        // S2: Acquire pairs with the host's Release store of DONE: result, out_len and
        // the payload are visible.
        if slot.state.load(Ordering::Acquire) == slot_state::DONE {
            if t0 != 0 {
                notify::record(g, sys::now_ns() - t0);
            }
            return Ok(());
        }
        if spins < budget {
            spins += 1;
            canal_abi::sync::spin_hint();
            if spins.is_multiple_of(notify::POLL_YIELD_EVERY) && g.notify == notify::Mode::Poll {
                if is_dead(g) || control_hung_up(g) {
                    mark_dead();
                    return Err(libc::EIO);
                }
                sys::sched_yield();
                spins = 0; // poll mode: the budget never runs out
            }
            continue;
        }
        if is_dead(g) {
            mark_dead();
            return Err(libc::EIO);
        }
        if s.efd < 0 || g.ctl < 0 {
            // In a VM (ivshmem): yield for a while first (a sleeping thread wakes late,
            // by timer or by interrupt); then back off without a wake-up port (§9.4),
            // or sleep on the slot's interrupt eventfd (§9.5).
            let now = sys::now_ns();
            let start = *yield_start.get_or_insert(now);
            if now - start < YIELD_NS.load(Ordering::Relaxed) {
                sys::sched_yield();
                continue;
            }
            if s.efd < 0 {
                sys::sleep_ns(backoff);
                backoff = (backoff * 2).min(1_000_000);
                continue;
            }
        }
        slot.sleep.store(sleep_kind::COMPLETION, Ordering::Relaxed);
        // W1: SeqCst fence between publishing `sleep` and re-checking the state; pairs
        // with the host's fence between storing DONE and reading `sleep` (§6).
        fence(Ordering::SeqCst);
        if slot.state.load(Ordering::Acquire) == slot_state::DONE {
            slot.sleep.store(sleep_kind::AWAKE, Ordering::Relaxed);
            return Ok(());
        }
        let mut pf = [
            libc::pollfd {
                fd: s.efd,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: g.ctl,
                events: 0,
                revents: 0,
            },
        ];
        let _ = sys::ppoll(&mut pf, Some(1_000_000_000), sys::SigMask::NONE);
        slot.sleep.store(sleep_kind::AWAKE, Ordering::Relaxed);
        if pf[0].revents != 0 {
            sys::eventfd_drain(s.efd);
        }
        if pf[1].revents & (libc::POLLHUP | libc::POLLERR) != 0 {
            mark_dead();
        }
    }
}

/// How an event wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    Ready,
    Timeout,
    Interrupted,
    Dead,
}

/// Waits until `cond()` holds for socket `index` (or WAIT_ANY), up to `deadline`
/// (monotonic ns): polls first, then sleeps on the slot's eventfd (§6).
pub fn wait_until(
    g: &'static Guest,
    index: u32,
    deadline: Option<i64>,
    mut cond: impl FnMut() -> bool,
) -> Wait {
    let mut spins = 0u32;
    let budget = notify::spin_iters(g);
    // The adaptive budget needs each wait's gap, but a wait answered within its first
    // CLOCK_AFTER spins (the common case under request/response load) estimates it
    // from the spin count instead of reading the clock twice (notify::spins_ns).
    let adaptive = notify::adaptive(g);
    let mut t0 = 0i64;
    let mut seg_wait = false;
    let mut slept = false;
    let mut signals = crate::pollwait::SignalWindow::new();
    new_wait();
    loop {
        if is_dead(g) {
            mark_dead();
            return Wait::Dead;
        }
        if cond() {
            if adaptive {
                let gap = if t0 != 0 {
                    sys::now_ns() - t0
                } else {
                    notify::spins_ns(g, spins)
                };
                notify::record_wait(g, gap, slept);
            }
            return Wait::Ready;
        }
        if adaptive && t0 == 0 && (spins >= notify::CLOCK_AFTER || spins >= budget) {
            t0 = sys::now_ns() - notify::spins_ns(g, spins);
        }
        let now = if deadline.is_some() || spins >= budget {
            sys::now_ns()
        } else {
            0
        };
        if let Some(d) = deadline {
            if now >= d {
                return Wait::Timeout;
            }
        }
        if spins < budget {
            if spins == 0 {
                seg_wait = seg_of(g, index).is_some();
            }
            spins += 1;
            canal_abi::sync::spin_hint();
            if spins.is_multiple_of(notify::POLL_YIELD_EVERY) && g.notify == notify::Mode::Poll {
                // Poll mode: the budget never runs out.
                spins = 0;
                if control_hung_up(g) {
                    mark_dead();
                    return Wait::Dead;
                }
                match signals.yield_point(sys::SigMask::NONE) {
                    Ok(()) => {}
                    Err(_) if deadline.is_none() && all_handlers_restart() => {}
                    Err(_) => return Wait::Interrupted,
                }
                // A poll-only wait that spun this long is a blocked call: it holds the
                // socket (as a sleep does, below) and sees signals (pollwait.rs).
                if signals.active() && PINNED.with(|p| p.get().is_none()) {
                    let h = pin(g, index);
                    PINNED.with(|p| p.set(h.map(|h| (h, pin_fd(h)))));
                }
            } else if seg_wait
                && spins > budget / 8
                && spins.is_multiple_of(YIELD_EVERY)
                && peer_yield::worth_trying()
            {
                // Not a quick answer: the peer is another process that may share our
                // core (or wait for one), let it run.
                let t = sys::now_ns();
                sys::sched_yield();
                peer_yield::note(sys::now_ns() - t);
            }
            continue;
        }
        let remaining = deadline.map(|d| d - now);
        // From its first sleep (on the segment futex or the slot eventfd) until it
        // returns (`unpin`, called by the hook), the call holds a reference, as the
        // kernel's in-flight call holds the file: a
        // close() by another thread does not close the socket under it (the call goes
        // on and returns the peer's later data, as natively; for a short-circuited
        // socket it also keeps the pair segment mapped).
        if PINNED.with(|p| p.get().is_none()) {
            let h = pin(g, index);
            PINNED.with(|p| p.set(h.map(|h| (h, pin_fd(h)))));
        }
        // A short-circuited socket: sleep on its segment's futex (§8.4), at most 1 s
        // at a time so a vanished canald is noticed.
        slept = true;
        if let Some((seg, side)) = seg_of(g, index) {
            let t = remaining.map_or(1_000_000_000, |r| r.min(1_000_000_000));
            match crate::seg::futex_sleep(seg, side, t, &mut cond) {
                Ok(true) => return Wait::Ready,
                Ok(false) => continue,
                // The same restart rule as the eventfd sleep below.
                Err(libc::EINTR) if deadline.is_none() && all_handlers_restart() => continue,
                Err(_) => return Wait::Interrupted,
            }
        }
        let remaining = deadline.map(|d| d - now);
        let r = sleep_ready(g, index, remaining, &mut cond, &mut [], sys::SigMask::NONE);
        match r {
            Ok(_) => {}
            // A handler with SA_RESTART restarts a socket call without a timeout (the
            // kernel's ERESTARTSYS); with SO_RCVTIMEO/SO_SNDTIMEO it is EINTR.
            Err(libc::EINTR) if deadline.is_none() && all_handlers_restart() => {}
            Err(libc::EINTR) => return Wait::Interrupted,
            Err(_) => {}
        }
    }
}

thread_local! {
    /// The socket handle this thread's current call pinned while sleeping.
    static PINNED: Cell<Option<(u32, c_int)>> = const { Cell::new(None) };
    /// The descriptor the current canal call was made on (set by the hooks).
    static CURRENT_FD: Cell<c_int> = const { Cell::new(-1) };
}

/// Records the descriptor of the canal call this thread is making.
#[inline]
pub fn set_current_fd(fd: c_int) {
    let _ = CURRENT_FD.try_with(|c| c.set(fd));
}

/// A private copy of the current call's dummy descriptor, so that the kernel-counted
/// liveness (WATCH) also sees the in-flight call; -1 if there is none.
fn pin_fd(h: u32) -> c_int {
    let fd = CURRENT_FD.try_with(|c| c.get()).unwrap_or(-1);
    if fd < 0 || TABLE.handle(fd) != Some(h) {
        return -1;
    }
    match sys::fcntl_int(fd, libc::F_DUPFD_CLOEXEC, 0) {
        Ok(d) => {
            let d = d as c_int;
            // Hidden from the application like the library's other descriptors.
            if TABLE.set_internal(d).is_err() {
                let _ = sys::close(d);
                return -1;
            }
            d
        }
        Err(_) => -1,
    }
}

/// Drops the reference the current call took while sleeping, if any (the last one
/// closes the socket, as the kernel does when the in-flight call releases the file).
pub fn unpin() {
    if let Ok(Some((h, fd))) = PINNED.try_with(|p| p.take()) {
        if let Some(g) = guest() {
            crate::sock::release(g, h);
        }
        if fd >= 0 {
            TABLE.take(fd);
            let _ = sys::close(fd);
        }
    }
}

/// Takes one reference on socket `index` for a sleeping call; None if the socket is
/// already being closed (or `index` is WAIT_ANY).
fn pin(g: &'static Guest, index: u32) -> Option<u32> {
    let e = g.region.socket(index)?;
    let h = canal_abi::make_handle(index, e.generation.load(Ordering::Acquire));
    e.refs
        .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |r| {
            (r > 0).then(|| r + 1)
        })
        .ok()
        .map(|_| h)
}

/// Whether every signal with a handler has SA_RESTART (the interrupted call cannot
/// tell which signal ran, so it restarts only when any of them would have).
fn all_handlers_restart() -> bool {
    for sig in 1..=libc::SIGRTMAX() {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        // SAFETY: querying (not changing) the disposition into a zeroed struct.
        let old = unsafe {
            let mut old: libc::sigaction = core::mem::zeroed();
            if libc::sigaction(sig, core::ptr::null(), &mut old) != 0 {
                continue;
            }
            old
        };
        let h = old.sa_sigaction;
        if h != libc::SIG_DFL && h != libc::SIG_IGN && old.sa_flags & libc::SA_RESTART == 0 {
            return false;
        }
    }
    true
}

/// While polling a short-circuited socket, after the first eighth of the spin budget
/// (a few µs: a request-response peer answers well within it), yield the CPU every
/// this many spins.
const YIELD_EVERY: u32 = 64;

/// Whether the short-circuit wait's sched_yield gives the core to anyone. A yield
/// that comes back within FUTILE_NS ran nobody (the peer is on another core, or not
/// runnable): after FUTILE_MAX such yields in a row the thread stops yielding, except
/// at one chance in PROBE_EVERY (the peer may have moved to our core), so a peer on
/// another core no longer costs a system call per round trip (B7). A yield that ran
/// someone (or while the count is low) keeps the old behaviour.
mod peer_yield {
    use core::cell::Cell;
    const FUTILE_NS: i64 = 3_000;
    const FUTILE_MAX: u32 = 4;
    const PROBE_EVERY: u32 = 64;
    thread_local! {
        /// (futile yields in a row, yields skipped since the last probe)
        static STATE: Cell<(u32, u32)> = const { Cell::new((0, 0)) };
    }
    pub fn worth_trying() -> bool {
        STATE
            .try_with(|s| {
                let (futile, skipped) = s.get();
                if futile < FUTILE_MAX {
                    return true;
                }
                if skipped + 1 >= PROBE_EVERY {
                    s.set((futile, 0));
                    return true;
                }
                s.set((futile, skipped + 1));
                false
            })
            .unwrap_or(true)
    }
    pub fn note(took_ns: i64) {
        let _ = STATE.try_with(|s| {
            let (futile, skipped) = s.get();
            s.set(if took_ns < FUTILE_NS {
                (futile.saturating_add(1), skipped)
            } else {
                (0, 0)
            });
        });
    }
}

/// Yields the CPU from a spinning wait unless recent yields ran nobody (`peer_yield`):
/// on a 2-core machine the event a spinning event loop waits for may come from a
/// process queued behind it on its own core.
pub fn yield_while_spinning() {
    if peer_yield::worth_trying() {
        let t = sys::now_ns();
        sys::sched_yield();
        peer_yield::note(sys::now_ns() - t);
    }
}

/// The pair segment and side of socket `index`, if it is short-circuited and mapped.
fn seg_of(g: &Guest, index: u32) -> Option<(crate::seg::Seg, u32)> {
    if index == WAIT_ANY {
        return None;
    }
    let e = g.region.socket(index)?;
    let seg = crate::seg::mapped(e.segment.load(Ordering::Acquire))?;
    Some((seg, e.segment_side.load(Ordering::Relaxed).min(1)))
}

/// Backoff of event waits without a wake-up port: (monotonic ns when the wait began, 0
/// before its first sleep; next sleep step in ns).
const BACKOFF_MIN_NS: i64 = 1_000;
const BACKOFF_MAX_NS: i64 = 1_000_000;
/// How long a wait without a wake-up port polls (yielding) before it sleeps: set at
/// ivshmem attach ($CANAL_VM_POLL_US, default 200 µs).
static YIELD_NS: core::sync::atomic::AtomicI64 = core::sync::atomic::AtomicI64::new(0);
thread_local! {
    static BACKOFF: Cell<(i64, i64)> = const { Cell::new((0, BACKOFF_MIN_NS)) };
}

/// Starts a new wait for `sleep_events`' backoff (no wake-up port): its polling phase
/// and its backoff steps count from the wait's first sleep.
pub fn new_wait() {
    let _ = BACKOFF.try_with(|b| b.set((0, BACKOFF_MIN_NS)));
}

const NO_POLLFD: libc::pollfd = libc::pollfd {
    fd: -1,
    events: 0,
    revents: 0,
};

/// The descriptors of one sleep: the caller's `extra` (its two spare entries at the end
/// cleared for the wake-up port and the control socket), or `own` alone.
fn sleep_fds<'a>(
    own: &'a mut [libc::pollfd; 2],
    extra: &'a mut [libc::pollfd],
) -> &'a mut [libc::pollfd] {
    let fds: &mut [libc::pollfd] = if extra.is_empty() { own } else { extra };
    let n = fds.len() - 2;
    fds[n].revents = 0;
    fds[n + 1].revents = 0;
    fds
}

/// A sleep without a wake-up port: a VM guest over ivshmem without interrupts, or a
/// thread beyond the slots threads may keep (it has no slot to sleep on). A sleeping
/// thread in a VM wakes late (the VM's timer), so a wait first keeps checking, yielding
/// the CPU between checks, for YIELD_NS (0 for process guests); then it sleeps in
/// exponential backoff, 1 µs doubling to 1 ms (§6), polling `extra`'s descriptors.
pub fn sleep_backoff(
    g: &Guest,
    timeout_ns: Option<i64>,
    cond: &mut dyn FnMut() -> bool,
    extra: &mut [libc::pollfd],
    sigmask: sys::SigMask,
) -> Result<usize, i32> {
    let mut own = [NO_POLLFD; 2];
    let fds = sleep_fds(&mut own, extra);
    let n = fds.len() - 2;
    if cond() {
        return Ok(0);
    }
    let now = sys::now_ns();
    let step = BACKOFF.with(|b| {
        let (start, step) = b.get();
        // The first sleep of a wait (new_wait() cleared the start).
        let (start, step) = if start == 0 {
            (now, BACKOFF_MIN_NS)
        } else {
            (start, step)
        };
        if now - start < YIELD_NS.load(Ordering::Relaxed) {
            b.set((start, step));
            return 0;
        }
        b.set((start, (step * 2).min(BACKOFF_MAX_NS)));
        step
    });
    if step == 0 {
        canal_abi::sync::spin_hint();
        return Ok(0);
    }
    let t = timeout_ns.map_or(step, |t| t.min(step));
    fds[n].fd = -1;
    fds[n + 1] = libc::pollfd {
        fd: g.ctl,
        events: 0,
        revents: 0,
    };
    let r = sys::ppoll(fds, Some(t), sigmask)?;
    if fds[n + 1].revents & (libc::POLLHUP | libc::POLLERR) != 0 {
        mark_dead();
    }
    Ok(r.saturating_sub((fds[n + 1].revents != 0) as usize))
}

/// Longest single sleep on a wake-up port before readiness is checked again.
const RECHECK_NS: i64 = 1_000_000_000;

/// One sleep on readiness changes (§6): publish sleep=EVENTS, fence, re-check `cond`,
/// then ppoll on [extra fds..., slot eventfd, control socket]. `extra` must have two
/// spare entries at its end, which this fills. Returns the ppoll count of `extra`'s
/// own entries with events (0 if `cond` already held).
pub fn sleep_events(
    s: &SlotRef,
    index: u32,
    timeout_ns: Option<i64>,
    cond: &mut dyn FnMut() -> bool,
    extra: &mut [libc::pollfd],
    sigmask: sys::SigMask,
) -> Result<usize, i32> {
    let g = s.g;
    if s.efd < 0 {
        return sleep_backoff(g, timeout_ns, cond, extra, sigmask);
    }
    let h = g.region.header();
    let mut own = [NO_POLLFD; 2];
    let fds = sleep_fds(&mut own, extra);
    let n = fds.len() - 2;
    if g.ctl < 0 {
        // A VM guest with interrupt wake-ups (§9.5): the same polling phase as above
        // before the first sleep of a wait (an interrupt under emulation arrives
        // ~150 µs late), then sleep on the slot's interrupt eventfd.
        if cond() {
            return Ok(0);
        }
        let now = sys::now_ns();
        let polling = BACKOFF.with(|b| {
            let (start, step) = b.get();
            let start = if start == 0 { now } else { start };
            b.set((start, step));
            now - start < YIELD_NS.load(Ordering::Relaxed)
        });
        if polling {
            sys::sched_yield();
            return Ok(0);
        }
    }
    // §8: count ourselves as a sleeper of every short-circuited connection we wait
    // on, so its peer raises attention (and canald wakes us) after changing it.
    let mut seg_sleepers = SegSleepers::new();
    seg_sleepers.enter(g, index);
    s.slot.wait_socket.store(index, Ordering::Relaxed);
    s.slot.sleep.store(sleep_kind::EVENTS, Ordering::Relaxed);
    h.event_waiters.fetch_add(1, Ordering::Relaxed);
    // W2: SeqCst fence between publishing sleep/event_waiters and re-checking the
    // socket state; pairs with the host's fence between changing a socket and reading
    // event_waiters / sleep (§6).
    fence(Ordering::SeqCst);
    let r = if cond() {
        Ok(0)
    } else {
        fds[n] = libc::pollfd {
            fd: s.efd,
            events: libc::POLLIN,
            revents: 0,
        };
        fds[n + 1] = libc::pollfd {
            fd: g.ctl,
            events: 0,
            revents: 0,
        };
        // More short-circuited sockets than we can count on: sleep in short steps.
        // Otherwise at most RECHECK_NS: a missed wake-up costs at most that (one was
        // seen about once in 50 bursts of 400 threads each polling its own socket,
        // cause not found), and a vanished canald is noticed.
        let t = if seg_sleepers.overflow {
            Some(timeout_ns.map_or(1_000_000, |t| t.min(1_000_000)))
        } else {
            Some(timeout_ns.map_or(RECHECK_NS, |t| t.min(RECHECK_NS)))
        };
        if seg_sleepers.n > 0 {
            // Counted on a connection whose peer may publish without a fence: the
            // deferred barrier (barrier.rs) before sleeping longer than DEFER_NS.
            deferred_ppoll(fds, n, t, sigmask, cond)
        } else {
            sys::ppoll(fds, t, sigmask)
        }
    };
    s.slot.sleep.store(sleep_kind::AWAKE, Ordering::Relaxed);
    h.event_waiters.fetch_sub(1, Ordering::Relaxed);
    seg_sleepers.leave();
    let mut own_events = 0;
    if fds[n].revents != 0 && fds[n].fd >= 0 {
        sys::eventfd_drain(s.efd);
        own_events += 1;
    }
    if fds[n + 1].revents & (libc::POLLHUP | libc::POLLERR) != 0 {
        mark_dead();
        own_events += 1;
    }
    r.map(|c| c.saturating_sub(own_events))
}

/// `ppoll` for a sleeper counted on short-circuited connections (§8.4, barrier.rs):
/// at most DEFER_NS, then the global barrier and a re-check (`cond` true: returns 0
/// with no descriptor ready, as a wake-up would), then the rest of `timeout`.
fn deferred_ppoll(
    fds: &mut [libc::pollfd],
    n: usize,
    timeout: Option<i64>,
    sigmask: sys::SigMask,
    cond: &mut dyn FnMut() -> bool,
) -> Result<usize, i32> {
    let step = timeout.map_or(crate::barrier::DEFER_NS, |t| {
        t.min(crate::barrier::DEFER_NS)
    });
    let t0 = sys::now_ns();
    let r = sys::ppoll(fds, Some(step), sigmask)?;
    if r > 0 || timeout.is_some_and(|t| t <= step) {
        return Ok(r);
    }
    let barrier = crate::barrier::global();
    if cond() {
        return Ok(0);
    }
    let rest = timeout.map(|t| (t - (sys::now_ns() - t0)).max(0));
    // Without the barrier (the kernel refused it) re-check every DEFER_NS.
    let rest = if barrier {
        rest
    } else {
        Some(rest.map_or(crate::barrier::DEFER_NS, |r| {
            r.min(crate::barrier::DEFER_NS)
        }))
    };
    for f in fds.iter_mut().take(n + 2) {
        f.revents = 0;
    }
    sys::ppoll(fds, rest, sigmask)
}

/// Set once this process mapped a pair segment (`seg::get` succeeded): until then no
/// socket can have a sleeper word for `SegSleepers` to count.
static SEGMENT_MAPPED: AtomicBool = AtomicBool::new(false);

/// Whether this process has short-circuited connections (another guest is its peer).
pub fn segment_mapped() -> bool {
    SEGMENT_MAPPED.load(Ordering::Relaxed)
}

pub fn note_segment_mapped() {
    if !SEGMENT_MAPPED.load(Ordering::Relaxed) {
        SEGMENT_MAPPED.store(true, Ordering::Release);
    }
}

/// The sleeper counters (protocol §8.4) a sleeping thread incremented, so it
/// decrements exactly those.
struct SegSleepers {
    words: [*const AtomicU32; 64],
    n: usize,
    overflow: bool,
    active: bool,
}

impl SegSleepers {
    fn new() -> Self {
        SegSleepers {
            words: [core::ptr::null(); 64],
            n: 0,
            overflow: false,
            active: false,
        }
    }

    fn add(&mut self, e: &SocketEntry) {
        if e.kind.load(Ordering::Acquire) != canal_abi::sock_kind::STREAM {
            return;
        }
        let Some(seg) = crate::seg::mapped(e.segment.load(Ordering::Acquire)) else {
            return;
        };
        if self.n == self.words.len() {
            self.overflow = true;
            return;
        }
        let side = e.segment_side.load(Ordering::Relaxed);
        crate::barrier::announce(seg.deferred_barrier(side));
        let w = seg.sleepers(side);
        w.fetch_add(1, Ordering::Relaxed);
        self.words[self.n] = w;
        self.n += 1;
    }

    /// Before the sleeper's fence: one socket, or (WAIT_ANY) every mapped one.
    fn enter(&mut self, g: &Guest, index: u32) {
        if g.region.header().features & feature::SHORTCUT == 0 {
            return;
        }
        // A process that never mapped a pair segment has no sleeper word to count
        // (`add` skips unmapped ones): spare the WAIT_ANY walk over the whole socket
        // table (one cache line per entry: ~10 % of an epoll event loop's time).
        if index == WAIT_ANY && !SEGMENT_MAPPED.load(Ordering::Acquire) {
            return;
        }
        self.active = true;
        crate::seg::sleep_enter();
        if index != WAIT_ANY {
            if let Some(e) = g.region.socket(index) {
                self.add(e);
            }
            return;
        }
        for i in 0..g.region.layout().socket_count {
            if let Some(e) = g.region.socket(i) {
                if e.segment.load(Ordering::Relaxed) != 0 {
                    self.add(e);
                }
            }
        }
    }

    fn leave(&mut self) {
        for w in &self.words[..self.n] {
            // SAFETY: each pointer names a sleeper word of a segment that was mapped
            // when we counted ourselves; seg::forget defers every unmap while a
            // thread is between sleep_enter and sleep_exit.
            unsafe { &**w }.fetch_sub(1, Ordering::Relaxed);
        }
        self.n = 0;
        if self.active {
            self.active = false;
            crate::seg::sleep_exit();
        }
    }
}

/// Wakes this process's own threads sleeping on `index` (local events the host does
/// not see, e.g. shutdown(SHUT_RD) or close by another thread).
pub fn wake_local(g: &Guest, index: u32) {
    if let Some((seg, side)) = seg_of(g, index) {
        seg.futex_wake(side);
    }
    for (i, a) in SLOT_EFD
        .iter()
        .enumerate()
        .take(g.region.layout().slot_count as usize)
    {
        let efd = a.load(Ordering::Relaxed);
        if efd < 0 {
            continue;
        }
        if let Some(s) = g.region.slot(i as u32) {
            if s.sleep.load(Ordering::Relaxed) == sleep_kind::EVENTS {
                let w = s.wait_socket.load(Ordering::Relaxed);
                if w == index || w == WAIT_ANY {
                    let _ = sys::eventfd_signal(efd);
                }
            }
        }
    }
}

// ---- sockets' guest state ---------------------------------------------------------------

/// Initialises the guest line of a fresh entry (new socket or accepted connection).
pub fn init_guest_line(e: &SocketEntry, nonblock: bool, rcvtimeo: u64, sndtimeo: u64) {
    e.refs.store(1, Ordering::Relaxed);
    // Also here, not only by the host: a canald before minor 3 does not clear them.
    e.tx_tail_seen.store(0, Ordering::Relaxed);
    e.rx_head_seen.store(0, Ordering::Relaxed);
    e.guest_flags.store(
        if nonblock {
            canal_abi::guest_flag::NONBLOCK
        } else {
            0
        },
        Ordering::Relaxed,
    );
    e.tx_lock.store(0, Ordering::Relaxed);
    e.rx_lock.store(0, Ordering::Relaxed);
    e.clear_side_locks();
    e.rcvtimeo_ns.store(rcvtimeo, Ordering::Relaxed);
    e.sndtimeo_ns.store(sndtimeo, Ordering::Relaxed);
    e.linger.store(0, Ordering::Relaxed);
}

// ---- fork ---------------------------------------------------------------------------------

extern "C" fn fork_prepare() {
    lock(&ATTACH_LOCK);
    crate::seg::fork_prepare();
    if let Some(g) = guest() {
        // Every canal descriptor is about to exist twice: count the child's copies now,
        // before the parent could close its own and drop the last reference.
        TABLE.for_each_canal(|_, h| {
            if let Some(e) = g.region.socket(canal_abi::handle_index(h)) {
                e.refs.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
}

extern "C" fn fork_parent() {
    crate::seg::fork_done();
    unlock(&ATTACH_LOCK);
}

extern "C" fn fork_child() {
    crate::seg::fork_child();
    ATTACH_LOCK.store(0, Ordering::Relaxed);
    PID.store(sys::getpid(), Ordering::Relaxed);
    // The forking thread's slot belongs to the parent's thread: forget it (the child
    // claims its own on first use). The eventfd copy is closed; the region stays mapped.
    let _ = SLOT.try_with(|s| {
        let efd = s.efd.replace(-1);
        s.idx.set(NO_SLOT);
        if efd >= 0 && !crate::ivshmem::is_irq_efd(efd) {
            TABLE.take(efd);
            let _ = sys::close(efd);
        }
    });
    for a in SLOT_EFD.iter() {
        let efd = a.swap(-1, Ordering::Relaxed);
        if efd >= 0
            && !crate::ivshmem::is_irq_efd(efd)
            && TABLE.get(efd) == Some(crate::fdtable::Entry::Internal)
        {
            // Other threads' eventfds: those threads do not exist in the child.
            TABLE.take(efd);
            let _ = sys::close(efd);
        }
    }
}

/// Registered once from the library constructor.
pub fn register_fork_handlers() {
    // SAFETY: the handlers are plain extern "C" functions that live as long as the
    // process (the library is never unloaded).
    unsafe {
        libc::pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child));
    }
    PID.store(sys::getpid(), Ordering::Relaxed);
}

#[cfg(test)]
mod tests {

    /// The eventfd sleep of a poll/epoll counted on short-circuited connections
    /// (§8.4): a publish its re-check missed, with no wake-up, is found DEFER_NS into
    /// the sleep by the global barrier and re-check, not at the timeout.
    #[test]
    fn deferred_ppoll_rechecks_after_the_barrier() {
        let mut fds = [libc::pollfd {
            fd: -1,
            events: 0,
            revents: 0,
        }; 2];
        let mut checks = 0;
        let mut cond = || {
            checks += 1;
            true
        };
        let t0 = sys::now_ns();
        let r = deferred_ppoll(
            &mut fds,
            0,
            Some(10_000_000_000),
            sys::SigMask::NONE,
            &mut cond,
        );
        let waited = sys::now_ns() - t0;
        assert_eq!(r, Ok(0));
        assert_eq!(checks, 1);
        assert!(waited >= crate::barrier::DEFER_NS, "{waited}");
        assert!(waited < 5_000_000_000, "{waited}");
        // A short timeout ends within its first step, without a re-check.
        let mut never = || false;
        assert_eq!(
            deferred_ppoll(&mut fds, 0, Some(1_000_000), sys::SigMask::NONE, &mut never),
            Ok(0)
        );
    }
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

    #[test]
    fn futile_yields_stop_and_probe() {
        // A fresh thread: its own thread-local state.
        std::thread::spawn(|| {
            for _ in 0..4 {
                assert!(peer_yield::worth_trying());
                peer_yield::note(500); // came back at once: nobody ran
            }
            let tries: Vec<bool> = (0..128).map(|_| peer_yield::worth_trying()).collect();
            assert_eq!(tries.iter().filter(|&&t| t).count(), 2, "one probe per 64");
            assert!(tries[63] && tries[127]);
            peer_yield::note(50_000); // this one ran the peer: yield again
            assert!(peer_yield::worth_trying());
        })
        .join()
        .unwrap();
    }

    #[test]
    fn spin_lock_excludes() {
        static W: AtomicU32 = AtomicU32::new(0);
        static mut COUNT: u64 = 0;
        let ts: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(|| {
                    for _ in 0..10_000 {
                        lock(&W);
                        // SAFETY: COUNT is only touched while holding W.
                        unsafe { COUNT += 1 };
                        unlock(&W);
                    }
                })
            })
            .collect();
        for t in ts {
            t.join().unwrap();
        }
        lock(&W);
        // SAFETY: read while holding W.
        assert_eq!(unsafe { COUNT }, 40_000);
        unlock(&W);
    }
}
