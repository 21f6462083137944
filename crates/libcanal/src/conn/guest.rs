//! The attached guest: the `Guest` handle (region, control socket, doorbells, wait
//! settings), the process-wide attach state, liveness of canald, and the control-socket
//! lock shared by every process of one connection.
use crate::sys;
use canal_abi::sync::AtomicU32;
use canal_abi::sync::Ordering;
use canal_abi::Region;
use canal_abi::MAX_WORKERS;
use core::sync::atomic::AtomicBool;
use core::sync::atomic::AtomicI32;
use libc::c_int;
use std::sync::OnceLock;

/// A process attached to canald.
pub(crate) struct Guest {
    pub(crate) region: Region,
    /// The control socket (SEQPACKET); polled while sleeping so a dead canald wakes us.
    /// -1 over ivshmem (no control socket in a VM).
    pub(crate) ctl: AtomicI32,
    /// canald's doorbell eventfd (kicks); -1 over ivshmem (canald polls instead).
    pub(crate) doorbell: AtomicI32,
    /// Serialises control-socket use among all processes sharing the connection: a word
    /// in a MAP_SHARED page made at attach time, so forked children share it.
    pub(crate) ctl_lock: &'static AtomicU32,
    /// Whether slots sleep on registered eventfds (else bounded backoff).
    pub(crate) ports: bool,
    /// How threads wait (`CANAL_NOTIFY`, `CANAL_SPIN`; see `notify`).
    pub(crate) wait: crate::notify::WaitSettings,
    pub(crate) debug: bool,
    /// Kept for an exec'd image to rejoin (rejoin.rs): the region memfd and its size,
    /// and the memfd behind the control-lock page (-1: anonymous, no rejoin).
    pub(crate) memfd: AtomicI32,
    pub(crate) region_size: u64,
    pub(crate) lockfd: AtomicI32,
    /// Virtual RSS (feature::VRSS): canald's doorbell per worker (DOORBELLS), and
    /// how many; 0 until received (then every kick goes to the home doorbell).
    pub(crate) wdoor: [AtomicI32; MAX_WORKERS],
    pub(crate) nworkers: AtomicU32,
}

impl Guest {
    /// The control socket's current number (ownfd.rs may move it; -1 over ivshmem).
    #[inline]
    pub(crate) fn ctl(&self) -> c_int {
        self.ctl.load(Ordering::SeqCst)
    }

    #[inline]
    pub(crate) fn doorbell(&self) -> c_int {
        self.doorbell.load(Ordering::SeqCst)
    }

    pub(crate) fn memfd(&self) -> c_int {
        self.memfd.load(Ordering::SeqCst)
    }

    pub(crate) fn lockfd(&self) -> c_int {
        self.lockfd.load(Ordering::SeqCst)
    }

    /// Points whichever of this guest's descriptor holders holds `old` at `new` (the
    /// descriptor moved: ownfd.rs); true if one did.
    pub(crate) fn retarget(&self, old: c_int, new: c_int) -> bool {
        let holders = [&self.ctl, &self.doorbell, &self.memfd, &self.lockfd];
        crate::ownfd::retarget(holders.into_iter().chain(self.wdoor.iter()), old, new)
    }
}

/// (ctl, memfd, doorbell, lockfd, region_size) for an exec'd image (rejoin.rs).
pub(crate) fn rejoin_fds(g: &Guest) -> Option<(c_int, c_int, c_int, c_int, u64)> {
    (g.memfd() >= 0 && g.lockfd() >= 0 && g.ctl() >= 0 && g.doorbell() >= 0).then_some((
        g.ctl(),
        g.memfd(),
        g.doorbell(),
        g.lockfd(),
        g.region_size,
    ))
}

pub(crate) static GUEST: OnceLock<Guest> = OnceLock::new();

/// Set once attaching failed or was disabled: this process uses kernel sockets.
pub(crate) static FALLBACK: AtomicBool = AtomicBool::new(false);

/// Set once canald is known to be gone.
static DEAD: AtomicBool = AtomicBool::new(false);

/// Process-local lock around attaching (taken by the fork prepare handler).
pub(crate) static ATTACH_LOCK: AtomicU32 = AtomicU32::new(0);

pub(crate) fn guest() -> Option<&'static Guest> {
    GUEST.get()
}

pub(crate) fn is_dead(g: &Guest) -> bool {
    DEAD.load(Ordering::Relaxed) || g.region.header().host_state.load(Ordering::Relaxed) == 2
}

/// Whether canald's end of the control connection is gone (a killed canald cannot
/// mark its regions abandoned): a zero-timeout ppoll for POLLHUP, for waits that
/// never sleep (poll-only mode), which would otherwise spin forever.
pub(crate) fn control_hung_up(g: &Guest) -> bool {
    if g.ctl() < 0 {
        return false;
    }
    let mut pf = [libc::pollfd {
        fd: g.ctl(),
        events: 0,
        revents: 0,
    }];
    matches!(sys::ppoll(&mut pf, Some(0), sys::SigMask::NONE), Ok(n) if n > 0)
        && ctl_hung_up_in(g, &pf[0])
}

/// Whether a ppoll entry for the control socket says canald hung up. The entry must
/// still be the control socket: had it moved while we slept (ownfd.rs), the program's
/// file now has that number and its events are not ours.
#[inline]
pub(crate) fn ctl_hung_up_in(g: &Guest, p: &libc::pollfd) -> bool {
    p.revents & (libc::POLLHUP | libc::POLLERR) != 0 && p.fd == g.ctl()
}

/// canald's process descriptor: -1 not made yet, -2 none to be had (its pid not
/// visible here, no pidfd_open, or confined), else the descriptor (a library one).
static DAEMON_PIDFD: AtomicI32 = AtomicI32::new(-1);

/// The entry a sleeping thread adds to its ppoll to learn at once that canald went
/// away (`died_in` reads it): canald's pidfd, which the kernel wakes only when canald
/// exits. Not the control socket: every thread polling it sat on that socket's wait
/// queue, which each control message walked under its lock, on both ends — with 1,000
/// sleeping threads, connect/echo/close in each took 15–75 s where natively 3–5 s, and
/// some timed out. Without a pidfd (the pid is another namespace's; confined), the
/// control socket as before. A canald that drops a guest without exiting, or a pid
/// that is not canald's (a listening socket systemd made), is noticed when the sleep
/// times out (`died`).
pub(crate) fn death_pollfd(g: &Guest) -> libc::pollfd {
    if DEAD.load(Ordering::Relaxed) {
        // Known already: a sleep after it waits for its own descriptors and its time
        // (a wait on quiet sockets, sock/dead.rs), not for a death that stays readable.
        return libc::pollfd {
            fd: -1,
            events: 0,
            revents: 0,
        };
    }
    match daemon_pidfd(g) {
        Some(fd) => libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        },
        None => libc::pollfd {
            fd: g.ctl(),
            events: 0,
            revents: 0,
        },
    }
}

fn daemon_pidfd(g: &Guest) -> Option<c_int> {
    let fd = DAEMON_PIDFD.load(Ordering::Acquire);
    if fd >= 0 {
        return Some(fd);
    }
    if fd == -2 || g.ctl() < 0 || sys::confined() {
        return None;
    }
    let made = sys::peer_cred(g.ctl())
        .ok()
        .filter(|c| c.pid > 0)
        .and_then(|c| sys::pidfd_open(c.pid).ok());
    let Some(made) = made else {
        DAEMON_PIDFD.store(-2, Ordering::Release);
        return None;
    };
    let fd = crate::ownfd::adopt_once(&DAEMON_PIDFD, made);
    (fd >= 0).then_some(fd) // -2: another thread found none
}

/// The pidfd moved (`hooks::fd::make_room`); true if it was `old`.
pub(crate) fn retarget_daemon_pidfd(old: c_int, new: c_int) -> bool {
    crate::ownfd::retarget([&DAEMON_PIDFD], old, new)
}

/// Whether a sleep's `death_pollfd` entry `p` says canald went away; `timed_out`: the
/// sleep ended with nothing ready (`died_after_timeout`).
pub(crate) fn died(g: &Guest, p: &libc::pollfd, timed_out: bool) -> bool {
    died_in(g, p) || (timed_out && died_after_timeout(g, p))
}

fn died_in(g: &Guest, p: &libc::pollfd) -> bool {
    let pidfd = DAEMON_PIDFD.load(Ordering::Relaxed);
    if pidfd >= 0 && p.fd == pidfd {
        return p.revents != 0;
    }
    ctl_hung_up_in(g, p)
}

/// After a sleep that timed out with its death entry on the pidfd: the control socket
/// is asked (canald may have dropped the guest without exiting), at most once a second
/// per thread (a backing-off thread times out every millisecond).
fn died_after_timeout(g: &Guest, p: &libc::pollfd) -> bool {
    thread_local! {
        static ASKED: core::cell::Cell<i64> = const { core::cell::Cell::new(0) };
    }
    if p.fd == g.ctl() {
        return false; // the sleep polled the control socket itself
    }
    let now = sys::now_ns();
    let due = ASKED
        .try_with(|a| {
            let due = now - a.get() >= 1_000_000_000;
            if due {
                a.set(now);
            }
            due
        })
        .unwrap_or(true);
    due && control_hung_up(g)
}

/// What runs once when canald is found gone (`at_death`).
static AT_DEATH: std::sync::OnceLock<fn()> = std::sync::OnceLock::new();

/// Registers `f` to run when canald is found gone (one function, the first given:
/// the copies of canald's listeners this process holds, which must close with them;
/// sock::native).
pub(crate) fn at_death(f: fn()) {
    let _ = AT_DEATH.set(f);
}

pub(crate) fn mark_dead() {
    if !DEAD.swap(true, Ordering::Relaxed) {
        if let Some(f) = AT_DEATH.get() {
            f();
        }
        sys::log_fmt(format_args!(
            "canal: canald went away; connections are reset (ECONNRESET on data calls, EIO otherwise), listeners and datagram sockets report it once and then stay quiet, and new sockets fail with ENETDOWN (kernel sockets would escape canald's policy): restart the program under canal run\n"
        ));
    }
}

/// The control-socket lock holds the holder's tid, so a lock left by a dead process
/// can be taken over.
pub(crate) fn ctl_lock(g: &Guest) {
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

pub(crate) fn ctl_unlock(g: &Guest) {
    g.ctl_lock.store(0, Ordering::Release);
    // Control exchanges are rare (ports, segments): one wake per unlock is cheap.
    sys::futex_wake_one(g.ctl_lock);
}
