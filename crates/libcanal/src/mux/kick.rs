//! Waking the threads that wait on an epoll set when another thread changes the set.
//!
//! The kernel wakes an `epoll_wait` when `epoll_ctl` adds, or re-arms, a descriptor that
//! is ready, and a later event on it wakes the waiter too. A thread waiting on canal
//! sockets sleeps on what it knew when it went to sleep (the real epoll fd, the wake-up
//! words of the sockets then in the set); a thread still in the kernel's `epoll_wait`,
//! begun before the set watched any canal socket, knows nothing of them. So a canal
//! socket another thread added meanwhile waited for the sleep's timeout, or forever.
//! Apache's event MPM hands every kept-alive connection to its listener thread this way
//! (147 ms a request under canal, its poll timeout); tokio's and mio's runtimes
//! register sockets from any thread while one thread waits.
//!
//! So `epoll_ctl` ADD or MOD of a canal item wakes, through their request slots'
//! eventfds, the threads asleep in the library's wait on the set (`Set::sleepers`,
//! counted before a sleeper reads its sleep's scope): each scans the set again, the new
//! item included, and sleeps with it in scope.
//!
//! A thread in the *kernel's* wait — on a set that had no canal socket when the wait
//! began — is reached through the set itself: its first canal item makes the set's
//! *kick*, an eventfd in its real epoll instance, edge-triggered, under a token no
//! program uses ([`token`]), and writes it if a thread is in the kernel's wait on that
//! epoll fd ([`KernelWait`]; a kick makes the epoll fd readable once, which `poll()`
//! on it would see). The kernel's wait returns; the library
//! drops the token's events from every wait ([`take_own`]) and goes on waiting, now
//! in the library. Edge-triggered, one write is one event, which the first wait to
//! collect it takes, so nothing needs draining.
//!
//! Limit: if two or more threads were in the kernel's wait on a set when it got its
//! first canal socket, one wakes, and the others at their timeout or next ordinary
//! event (waiting in the library from then on).
use crate::sys;
use core::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering};
use libc::{c_int, epoll_event};

static TOKEN: AtomicU64 = AtomicU64::new(0);
/// Whether this process made a kick (until then, waits need not look for one).
static MADE: AtomicBool = AtomicBool::new(false);

/// The epoll fds threads are in the kernel's wait on (-1: a free entry), so that a
/// set's first canal socket kicks only a set someone waits on: a kick also makes the
/// epoll fd itself readable once, which `poll()` on it, or a set it is nested in, sees.
static IN_KERNEL: [AtomicI32; 16] = [const { AtomicI32::new(-1) }; 16];
/// Kernel waits that found no free entry: while any, every first canal socket kicks.
static IN_KERNEL_UNLISTED: AtomicU32 = AtomicU32::new(0);

/// A thread's kernel wait on an epoll fd, listed while it lasts.
pub(crate) struct KernelWait(Option<usize>);

impl KernelWait {
    /// Lists a kernel wait on `epfd`. SeqCst, against [`kernel_waits_on`] after the
    /// set is tagged: the caller looks at the tag after this, so either the tagging
    /// thread sees this wait, or this wait sees the tag (and waits in the library).
    pub(crate) fn begin(epfd: c_int) -> KernelWait {
        for (i, e) in IN_KERNEL.iter().enumerate() {
            if e.compare_exchange(-1, epfd, Ordering::SeqCst, Ordering::Relaxed)
                .is_ok()
            {
                return KernelWait(Some(i));
            }
        }
        IN_KERNEL_UNLISTED.fetch_add(1, Ordering::SeqCst);
        KernelWait(None)
    }
}

impl Drop for KernelWait {
    fn drop(&mut self) {
        match self.0 {
            Some(i) => IN_KERNEL[i].store(-1, Ordering::Release),
            None => {
                IN_KERNEL_UNLISTED.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }
}

/// Whether a thread may be in the kernel's wait on `epfd`.
pub(crate) fn kernel_waits_on(epfd: c_int) -> bool {
    IN_KERNEL_UNLISTED.load(Ordering::SeqCst) != 0
        || IN_KERNEL.iter().any(|e| e.load(Ordering::SeqCst) == epfd)
}
/// The user data of kick events: 64 random bits, fixed for the process's life (and
/// its forked children, which share its epoll instances).
pub(crate) fn token() -> u64 {
    let t = TOKEN.load(Ordering::Relaxed);
    if t != 0 {
        return t;
    }
    let mut b = [0u8; 8];
    // SAFETY: b is writable for its 8 bytes.
    let r = unsafe { sys::raw_syscall!(libc::SYS_getrandom, b.as_mut_ptr(), 8usize, 0) };
    let mut t = u64::from_ne_bytes(b);
    if r != 8 {
        // No entropy to be had: the clock and the pid, mixed (splitmix64's finalizer).
        t = (sys::now_ns() as u64) ^ ((sys::getpid() as u64) << 32);
        t = (t ^ (t >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        t = (t ^ (t >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        t ^= t >> 31;
    }
    let t = t | 1; // never 0, the "not yet" value
    match TOKEN.compare_exchange(0, t, Ordering::Relaxed, Ordering::Relaxed) {
        Ok(_) => t,
        Err(other) => other,
    }
}

/// A kick for the set of `epfd`: an eventfd of the library's (ownfd.rs) in the real
/// epoll instance. None if one cannot be made (no descriptor to spare, confined): the
/// set then behaves as before kicks, waking at its timeout.
pub(crate) fn make(epfd: c_int) -> Option<c_int> {
    let fd = crate::ownfd::adopt(sys::eventfd().ok()?);
    let mut ev = epoll_event {
        events: (libc::EPOLLIN | libc::EPOLLET) as u32,
        u64: token(),
    };
    // SAFETY: ev is a live local the kernel reads.
    let r = unsafe {
        sys::raw_syscall!(
            libc::SYS_epoll_ctl,
            epfd,
            libc::EPOLL_CTL_ADD,
            fd,
            &mut ev as *mut epoll_event
        )
    };
    if r != 0 {
        forget(fd);
        return None;
    }
    MADE.store(true, Ordering::Release);
    Some(fd)
}

/// Closes a kick (its set went); the kernel drops it from the epoll instance.
pub(crate) fn forget(fd: c_int) {
    crate::ownfd::close_own(fd);
}

/// The user data under which a set's real epoll instance holds the twin of native
/// listener `handle` (`sock::native::watch_twin`): the kick token with
/// `(handle + 1) << 1` flipped in, so never the kick's own (odd) value.
pub(crate) fn twin_token(handle: u32) -> u64 {
    MADE.store(true, Ordering::Release);
    token() ^ ((handle as u64 + 1) << 1)
}

/// The listener a twin event's user data names, if it is one (`twin_token`).
fn twin_of(data: u64) -> Option<u32> {
    let v = data ^ token();
    (v != 0 && v & 1 == 0 && v >> 1 <= (u32::MAX as u64) + 1).then(|| ((v >> 1) - 1) as u32)
}

/// Removes the library's own events from the first `n` of `out`, keeping the others
/// in order: kicks, and twin events, whose listeners go into `twins`. Returns how
/// many are left.
pub(crate) fn take_own(out: &mut [epoll_event], n: usize, twins: &mut Vec<u32>) -> usize {
    if !MADE.load(Ordering::Acquire) {
        return n;
    }
    let t = token();
    let mut kept = 0;
    for i in 0..n {
        let data = out[i].u64;
        if data == t {
            continue;
        }
        if let Some(h) = twin_of(data) {
            twins.push(h);
            continue;
        }
        out[kept] = out[i];
        kept += 1;
    }
    kept
}

/// Writes the kick `fd`; the caller holds the descriptor's number steady (ownfd.rs
/// `using`, and the sets' lock, under which a move retargets it).
pub(crate) fn kick(fd: c_int) {
    let _ = sys::eventfd_signal(fd);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(u: u64) -> epoll_event {
        epoll_event { events: 1, u64: u }
    }

    #[test]
    fn the_token_is_fixed_and_never_zero() {
        assert_ne!(token(), 0);
        assert_eq!(token(), token());
    }

    #[test]
    fn kicks_are_dropped_and_the_rest_keeps_its_order() {
        MADE.store(true, Ordering::Release);
        let t = token();
        let mut out = [ev(1), ev(t), ev(2), ev(t), ev(3), ev(9)];
        let mut twins = Vec::new();
        assert_eq!(take_own(&mut out, 5, &mut twins), 3);
        assert_eq!([out[0].u64, out[1].u64, out[2].u64], [1, 2, 3]);
        assert_eq!({ out[5].u64 }, 9, "beyond n is left alone");
        assert!(twins.is_empty());
    }

    #[test]
    fn twin_events_name_their_listeners_and_leave_the_rest() {
        let mut out = [
            ev(twin_token(7)),
            ev(5),
            ev(twin_token(0)),
            ev(token()),
            ev(twin_token(u32::MAX)),
        ];
        let mut twins = Vec::new();
        assert_eq!(take_own(&mut out, 5, &mut twins), 1);
        assert_eq!({ out[0].u64 }, 5);
        assert_eq!(twins, [7, 0, u32::MAX]);
        assert_ne!(twin_token(3), token(), "never the kick's token");
        assert_eq!(twin_of(token()), None);
        assert_eq!(twin_of(token() ^ 2), Some(0));
    }

    #[test]
    fn a_kick_wakes_a_thread_in_the_kernels_wait() {
        // SAFETY: creating an epoll instance.
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        assert!(ep >= 0);
        let k = make(ep).expect("a kick");
        kick(k);
        let mut out = [ev(0); 4];
        // SAFETY: out has room for 4 events.
        let n = unsafe { libc::epoll_wait(ep, out.as_mut_ptr(), 4, 1000) };
        assert_eq!(n, 1);
        assert_eq!(take_own(&mut out, 1, &mut Vec::new()), 0);
        // Edge-triggered: taken once, not again.
        // SAFETY: as above.
        assert_eq!(unsafe { libc::epoll_wait(ep, out.as_mut_ptr(), 4, 0) }, 0);
        forget(k);
        let _ = sys::close(ep);
    }
}
