//! How canald learns that a socket's last descriptor is gone; the dummy descriptor the
//! program holds for each canal socket (docs/architecture.md, "Closing").
//!
//! Two ways. *Watched*: the dummy is one end of a Unix stream socketpair whose other end
//! canald holds (control WATCH). The kernel counts that end's copies across dup, fork,
//! exec, SCM_RIGHTS, `_exit` and kill, and canald closes the socket at the hang-up.
//! *Marked* (feature CLOSE_MARK): while this process is the only one that can hold its
//! descriptors or its control connection — it has not forked, exec'd, spawned, started a
//! bridge or passed a descriptor — the hooks see every copy come and go. So the dummy is
//! a lone socket, the last close writes the entry's close mark (`sock::close`: no round
//! trip), and the process's death is its control connection's hang-up, on which canald
//! closes all its sockets. A WATCH pair costs a socket about 13 µs (creating it, handing
//! its end over, the hang-up; docs/bench/scale/README.md); a lone dummy about 5.
//!
//! The first event that could put a copy in another process calls `share` before that
//! process exists: every live socket is armed (a pair end put in place of each of its
//! dummies, under the same numbers) and from then on sockets are created watched. The
//! mode only ever goes from marked to watched. Arming replaces descriptor numbers, so it
//! must not race with the program's own close or dup of them (a number another thread
//! just closed may already name an unrelated file): the hooks that drop or copy a canal
//! descriptor hold the shared side of a lock (`hold`) while the process is unshared,
//! and arming takes the exclusive side.
use crate::conn::guest::Guest;
use crate::fdtable::TABLE;
use crate::sys;
use canal_abi::armlock::ArmLock;
use canal_abi::sync::Ordering;
use core::sync::atomic::{AtomicI32, AtomicU8};
use libc::c_int;

/// Sockets are watched (no CLOSE_MARK, shared, or not attached).
const WATCHED: u8 = 0;
/// Unshared: lone dummies, closes by mark.
const MARKED: u8 = 1;
/// `share` is arming the live sockets.
const ARMING: u8 = 2;

static MODE: AtomicU8 = AtomicU8::new(WATCHED);

/// The descriptor lock (canal-abi's `ArmLock`, model-checked there).
static LOCK: ArmLock = ArmLock::new();
/// The thread holding the exclusive side (0: none): its own hooks (a signal handler's
/// close during a fork's prepare) must not wait for it.
static OWNER: AtomicI32 = AtomicI32::new(0);

/// A fresh attach (HELLO): unshared, marked if canald takes close marks.
pub(crate) fn attached(g: &Guest) {
    let marks = g.region.header().features & canal_abi::feature::CLOSE_MARK != 0;
    let mode = if marks && g.ctl() >= 0 {
        MARKED
    } else {
        WATCHED
    };
    MODE.store(mode, Ordering::Release);
}

/// Whether the last close of a socket may be a close mark (this process is unshared).
pub(crate) fn marked() -> bool {
    MODE.load(Ordering::Acquire) == MARKED
}

/// The shared side of the descriptor lock, held while a hook drops or copies a canal
/// descriptor of an unshared process (nothing once it is shared).
pub(crate) struct Hold(bool);

thread_local! {
    /// Shared holds of the calling thread: a hook holding one may go on to `share`
    /// (dup2 onto a standard stream starts a bridge), which must not wait for it.
    static HELD: core::cell::Cell<u32> = const { core::cell::Cell::new(0) };
}

fn held_here() -> u32 {
    HELD.try_with(|h| h.get()).unwrap_or(0)
}

fn count_here(d: i32) {
    let _ = HELD.try_with(|h| h.set(h.get().wrapping_add_signed(d)));
}

pub(crate) fn hold() -> Hold {
    if MODE.load(Ordering::Acquire) == WATCHED {
        return Hold(false);
    }
    let owner = OWNER.load(Ordering::Relaxed);
    if owner != 0 && owner == sys::gettid() {
        return Hold(false);
    }
    let mut spins = 0u32;
    while !LOCK.try_shared() {
        back_off(&mut spins);
    }
    count_here(1);
    Hold(true)
}

impl Drop for Hold {
    fn drop(&mut self) {
        if self.0 {
            count_here(-1);
            LOCK.release_shared();
        }
    }
}

fn back_off(spins: &mut u32) {
    *spins += 1;
    if *spins < 64 {
        core::hint::spin_loop();
    } else {
        sys::sched_yield();
    }
}

/// Waits until no other thread holds either side; this thread's own shared holds stay
/// counted (and are dropped later as usual).
fn lock_exclusive() {
    let mine = held_here();
    let mut spins = 0u32;
    while !LOCK.try_exclusive(mine) {
        back_off(&mut spins);
    }
    OWNER.store(sys::gettid(), Ordering::Relaxed);
}

fn unlock_exclusive() {
    OWNER.store(0, Ordering::Relaxed);
    LOCK.release_exclusive();
}

/// A second process may hold this process's descriptors or control connection from
/// now on (exec, posix_spawn, a bridge's helper, SCM_RIGHTS): arm every live socket.
pub(crate) fn share(g: &'static Guest) {
    if MODE.load(Ordering::Acquire) == WATCHED {
        return;
    }
    lock_exclusive();
    arm_all(g);
    unlock_exclusive();
}

/// fork's prepare handler: arm every live socket and keep the lock until `fork_parent`/`fork_child`,
/// so that no descriptor changes between the arming and the copy of the table.
pub(crate) fn fork_prepare(g: Option<&'static Guest>) {
    if let (Some(g), true) = (g, MODE.load(Ordering::Acquire) != WATCHED) {
        lock_exclusive();
        arm_all(g);
    }
}

/// fork's parent handler: the lock `fork_prepare` took.
pub(crate) fn fork_parent() {
    if OWNER.load(Ordering::Relaxed) == sys::gettid() {
        unlock_exclusive();
    }
}

/// fork's child handler: its only thread is the one that forked; whatever the lock
/// says belonged to the parent's threads (and after `fork_prepare`, nothing did).
pub(crate) fn fork_child() {
    OWNER.store(0, Ordering::Relaxed);
    LOCK.reset();
}

/// Under the exclusive side: from now on sockets are watched; every live one is armed.
fn arm_all(g: &'static Guest) {
    if MODE.load(Ordering::Acquire) != MARKED {
        return;
    }
    // Before the table is read (store and fence, paired with the fence in `created`):
    // a socket being created now is either in the table below or sees the mode and
    // arms itself (loom: canal-abi tests/loom.rs).
    MODE.store(ARMING, Ordering::SeqCst);
    canal_abi::sync::fence(Ordering::SeqCst);
    // Each socket's descriptors together (dups share one dummy, and so one pair).
    let mut held: Vec<(u32, c_int)> = Vec::new();
    TABLE.for_each_canal(|fd, h| held.push((h, fd)));
    held.sort_unstable();
    for one in held.chunk_by(|a, b| a.0 == b.0) {
        let fds: Vec<c_int> = one.iter().map(|x| x.1).collect();
        arm(g, one[0].0, &fds);
    }
    MODE.store(WATCHED, Ordering::SeqCst);
}

/// A socket was just created with `fd` (its dummy, from `dummy`, already in the
/// table): if the process became shared meanwhile and no WATCH end went with it, it
/// arms itself now.
pub(crate) fn created(g: &'static Guest, h: u32, fd: c_int, peer: c_int) {
    if peer >= 0 {
        send(g, h, peer);
        return;
    }
    canal_abi::sync::fence(Ordering::SeqCst);
    if MODE.load(Ordering::Relaxed) != MARKED && crate::conn::ctl::watch_enabled(g) {
        arm(g, h, &[fd]);
    }
}

/// Hands a pair's other end to canald for `handle` (WATCH) and closes our copy.
fn send(g: &Guest, handle: u32, peer: c_int) {
    crate::conn::ctl::send_watch(g, handle, peer);
    let _ = sys::close(peer);
}

/// Puts one end of a fresh WATCH pair in place of socket `h`'s lone dummy at each of
/// `fds` (keeping each one's close-on-exec flag) and hands the other end to canald.
/// At most once per socket (the entry's ARMED flag): `arm_all` and `created` may both
/// see a socket created while the mode changes, and a second pair would replace the
/// first one's end here while canald kept the first watch, which then fires.
fn arm(g: &'static Guest, h: u32, fds: &[c_int]) {
    let Ok(s) = crate::sock::core::Sock::new(g, h) else {
        return;
    };
    let armed = crate::ready::local::ARMED;
    if s.e.guest_flags.fetch_or(armed, Ordering::AcqRel) & armed != 0 {
        return;
    }
    let Ok((end, peer)) = pair(true) else {
        crate::rt::debug!(g, "canal: cannot arm handle {h:#x}: no descriptor\n");
        return;
    };
    for &fd in fds {
        // The descriptor lock keeps the program from closing or reusing `fd` meanwhile.
        let _ = sys::replace_fd(end, fd);
    }
    let _ = sys::close(end);
    send(g, h, peer);
}

/// A Unix stream socketpair for a WATCH: our end shut for reading and non-blocking, so
/// a program that gets it without knowing it (exec'd without the library) reads EOF
/// and gets EAGAIN on writes instead of hanging (docs/compat.md); canald's end (second)
/// close-on-exec while we hold it.
fn pair(cloexec: bool) -> Result<(c_int, c_int), i32> {
    let ce = if cloexec { libc::SOCK_CLOEXEC } else { 0 };
    let mut sv = [-1 as c_int; 2];
    // SAFETY: sv is a writable array of two ints.
    sys::check(unsafe {
        crate::sys::raw_syscall!(
            libc::SYS_socketpair,
            libc::AF_UNIX as libc::c_long,
            (libc::SOCK_STREAM | libc::SOCK_NONBLOCK | ce) as libc::c_long,
            0 as libc::c_long,
            sv.as_mut_ptr(),
        )
    })?;
    if ce == 0 {
        let _ = sys::fcntl_int(sv[1], libc::F_SETFD, libc::FD_CLOEXEC as libc::c_long);
    }
    shut_rd(sv[0]);
    Ok((sv[0], sv[1]))
}

/// A lone AF_UNIX datagram socket, shut for reading, so code the hooks do not see
/// reads EOF and a send fails (ENOTCONN) instead of vanishing.
fn lone_socket(cloexec: bool) -> Result<c_int, i32> {
    let ce = if cloexec { libc::SOCK_CLOEXEC } else { 0 };
    let fd = sys::socket(libc::AF_UNIX, libc::SOCK_DGRAM | ce, 0)?;
    shut_rd(fd);
    Ok(fd)
}

/// The lone socket every marked dummy is a copy of (a library descriptor; -1 until the
/// first). While the process is unshared the hooks see every copy of a canal socket's
/// descriptor, so the dummy's only jobs are its number and what code the hooks do not
/// see meets there (`lone_socket`); a copy costs the kernel a table slot, a socket of
/// its own 2.2 KiB of slab (measured: 10,000 of each). What copies share, unlike
/// sockets of their own: their inode (fstat's st_ino) and the status flags other than
/// O_NONBLOCK, which the library keeps per socket (`hooks::fd` fcntl). Arming (`share`)
/// puts a pair end in place of each copy, as of each lone socket.
static LONE: AtomicI32 = AtomicI32::new(-1);

/// A copy of `LONE` at the lowest free number (where socket() would put one), made
/// first if need be; None if that fails (the caller makes a socket of its own).
fn lone_copy(cloexec: bool) -> Option<c_int> {
    let cmd = if cloexec {
        libc::F_DUPFD_CLOEXEC
    } else {
        libc::F_DUPFD
    };
    // At most: a stale number found closed, a new lone socket, its copy.
    for _ in 0..3 {
        let copy = crate::ownfd::using(|| {
            let base = LONE.load(Ordering::Acquire);
            (base >= 0).then(|| (base, sys::fcntl_int(base, cmd, 0)))
        });
        match copy {
            Some((_, Ok(fd))) => return Some(fd as c_int),
            // Closed behind the hooks' back (a raw system call): a new one.
            Some((base, Err(libc::EBADF))) => {
                let _ = LONE.compare_exchange(base, -1, Ordering::AcqRel, Ordering::Acquire);
            }
            Some((_, Err(_))) => return None,
            None => {
                crate::ownfd::adopt_once(&LONE, lone_socket(true).ok()?);
            }
        }
    }
    None
}

/// The lone dummy moved (`hooks::fd::make_room`); true if it was `old`.
pub(crate) fn retarget_lone(old: c_int, new: c_int) -> bool {
    crate::ownfd::retarget([&LONE], old, new)
}

fn shut_rd(fd: c_int) {
    // SAFETY: shutting down our own fresh socket.
    unsafe {
        crate::sys::raw_syscall!(
            libc::SYS_shutdown,
            fd as libc::c_long,
            libc::SHUT_RD as libc::c_long,
        )
    };
}

/// A fresh dummy descriptor, so numbers never collide and fstat says S_IFSOCK; the
/// second value is the WATCH end for `created` (-1 for a lone dummy).
///
/// Marked: a copy of the process's one lone dummy (`lone_copy`). Watched: a pair
/// (`pair`). Without the WATCH feature, or if no copy can be made: a lone socket of
/// its own.
pub(crate) fn dummy(g: &Guest, cloexec: bool) -> Result<(c_int, c_int), i32> {
    let watched = !marked() && crate::conn::ctl::watch_enabled(g);
    let copy = if watched { None } else { lone_copy(cloexec) };
    let (fd, peer) = match copy {
        Some(fd) => (fd, -1),
        None if watched => pair(cloexec)?,
        None => (lone_socket(cloexec)?, -1),
    };
    if fd as usize >= TABLE.capacity() {
        let _ = sys::close(fd);
        if peer >= 0 {
            let _ = sys::close(peer);
        }
        return Err(libc::EMFILE);
    }
    Ok((fd, peer))
}
