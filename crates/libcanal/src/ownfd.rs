//! The library's own descriptors (control socket, eventfds, memfds, pins): kept out of the
//! program's way.
//!
//! Programs count on descriptor numbers: `socket()` and `open()` return the lowest free
//! one, bash's `exec 5>file`, socket activation (fd 3) and sshd's re-exec `dup2` onto
//! fixed ones. So every descriptor the library holds is *lifted* at birth to the top of
//! the RLIMIT_NOFILE soft limit (F_DUPFD_CLOEXEC from a high floor; lower floors only
//! when the top is full), where a program meets it only once it has nearly every number
//! in use; and a `dup2`/`dup3` onto one of them moves ours elsewhere first
//! (`hooks::fd::make_room`): never EBUSY.
//!
//! Moving one is safe against other threads: every place that keeps one of our numbers
//! keeps it in an atomic that can be retargeted, and every system call that *acts* on
//! such a number (write, read, send, close) runs inside [`using`], whose readers
//! [`wait_unused`] waits out after retargeting and before the program's `dup2` takes
//! the old number. Polls are not wrapped: a poll that met a number just taken over
//! wakes spuriously (callers compare the number with the current one) or up to a
//! second late (every sleep re-checks), never acts on the program's file.
use crate::sys;
use core::sync::atomic::{AtomicI32, AtomicUsize, Ordering};
use libc::c_int;

/// The top of the window: the soft limit, but no higher than this. A descriptor number
/// sizes the kernel's per-process table (and what fork copies), so a program that
/// raised its limit to a million must not pay for a table that large.
const TOP_CAP: u64 = 4096;

/// The lowest number the library takes, tried top window first: the `WINDOWS[i]`
/// numbers below the top, then half the limit.
const WINDOWS: [u64; 3] = [64, 256, 1024];

/// The top of the range our descriptors live in (exclusive).
fn top() -> u64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return 1024;
    }
    r.rlim_cur
        .min(TOP_CAP)
        .min(crate::fdtable::TABLE_LEN as u64)
}

/// A close-on-exec copy of `fd` at a high number, or an error if none is free up there
/// (the caller then keeps `fd` where it is: working, merely visible).
pub(crate) fn dup_high(fd: c_int) -> Result<c_int, i32> {
    if sys::confined() {
        return Err(libc::EPERM); // no new descriptors (sys.rs, "confinement")
    }
    let top = top();
    let mut last = libc::EMFILE;
    let floors = WINDOWS
        .iter()
        .filter(|&&w| w < top)
        .map(|&w| top - w)
        .chain(core::iter::once(top / 2));
    for floor in floors {
        if floor < 3 {
            continue;
        }
        match sys::fcntl_int(fd, libc::F_DUPFD_CLOEXEC, floor as libc::c_long) {
            Ok(n) if (n as u64) < top => return Ok(n as c_int),
            Ok(n) => {
                let _ = sys::close(n as c_int);
            }
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// Moves a descriptor the library just made (not yet shared with another thread) to a
/// high number; returns where it now is (`fd` itself if no high number is free).
pub(crate) fn lift(fd: c_int) -> c_int {
    if fd < 0 {
        return fd;
    }
    match dup_high(fd) {
        Ok(n) => {
            let _ = sys::close(fd);
            n
        }
        Err(_) => fd,
    }
}

/// Points whichever of `holders` holds `old` at `new` (the descriptor moved:
/// `hooks::fd::make_room`); true if one did. Every place that keeps one of the library's
/// numbers offers its atomics here.
pub(crate) fn retarget<'a>(
    holders: impl IntoIterator<Item = &'a AtomicI32>,
    old: c_int,
    new: c_int,
) -> bool {
    holders.into_iter().any(|a| {
        a.compare_exchange(old, new, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    })
}

/// [`lift`], then hidden from the program (close() keeps it, dup2 onto it moves it).
pub(crate) fn adopt(fd: c_int) -> c_int {
    let fd = lift(fd);
    if fd >= 0 {
        let _ = crate::fdtable::TABLE.set_internal(fd);
    }
    fd
}

/// Closes one of the library's descriptors ([`adopt`]'s inverse): out of the table,
/// then closed.
pub(crate) fn close_own(fd: c_int) {
    crate::fdtable::TABLE.take(fd);
    let _ = sys::close(fd);
}

/// Closes the descriptor `holder` names, if any, and empties it; inside [`using`], so
/// a concurrent move (which retargets the holder) cannot have it close the program's.
pub(crate) fn close_held(holder: &AtomicI32) {
    using(|| {
        let fd = holder.swap(-1, Ordering::SeqCst);
        if fd >= 0 {
            close_own(fd);
        }
    });
}

/// [`adopt`]s `fd` into `slot` if it is still empty (-1): a descriptor made once per
/// process by whichever thread needs it first. Returns what the slot holds: `fd`, or
/// what another thread put there first (then `fd` is closed).
pub(crate) fn adopt_once(slot: &AtomicI32, fd: c_int) -> c_int {
    let fd = adopt(fd);
    match slot.compare_exchange(-1, fd, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => fd,
        Err(other) => {
            close_own(fd);
            other
        }
    }
}

// ---- readers and the mover -----------------------------------------------------------------

/// Which of READERS new readers count in; a mover flips it, so a steady stream of
/// readers cannot keep it waiting (the old half only drains).
static EPOCH: AtomicUsize = AtomicUsize::new(0);
static READERS: [AtomicUsize; 2] = [AtomicUsize::new(0), AtomicUsize::new(0)];

/// Runs `f`, which loads one of the library's descriptor numbers and acts on it, so
/// that a concurrent move of that descriptor waits for it (see the module doc).
#[inline]
pub(crate) fn using<R>(f: impl FnOnce() -> R) -> R {
    // SeqCst: the increment is ordered before `f`'s load of the number, and against the
    // mover's retarget, flip and check (the argument in the module doc).
    let e = EPOCH.load(Ordering::SeqCst) & 1;
    READERS[e].fetch_add(1, Ordering::SeqCst);
    let r = f();
    READERS[e].fetch_sub(1, Ordering::Release);
    r
}

/// Wakes the readers that sleep inside `using` (threads blocked in accept() waiting
/// on an epoll instance of the library's: conn/accept_sleep.rs), so a mover need not
/// wait out their sleep. Set once such a reader exists.
static WAKE_SLEEPERS: std::sync::OnceLock<fn()> = std::sync::OnceLock::new();

/// Registers `wake` as what wakes the readers that sleep inside `using`.
pub(crate) fn readers_may_sleep(wake: fn()) {
    let _ = WAKE_SLEEPERS.set(wake);
}

/// After a retarget: waits until every reader that may have loaded the old number is
/// done (at most ~100 ms: a reader that sleeps inside `using` is woken, the others
/// never block for long there).
pub(crate) fn wait_unused() {
    let start = sys::now_ns();
    for _ in 0..2 {
        let old = EPOCH.fetch_add(1, Ordering::SeqCst) & 1;
        if READERS[old].load(Ordering::SeqCst) != 0 {
            if let Some(wake) = WAKE_SLEEPERS.get() {
                wake();
            }
        }
        while READERS[old].load(Ordering::SeqCst) != 0 {
            if sys::now_ns() - start > 100_000_000 {
                return;
            }
            sys::sched_yield();
        }
    }
}

/// In a fork child only the forking thread exists: no reader is inside `using`.
pub(crate) fn fork_child() {
    READERS[0].store(0, Ordering::Relaxed);
    READERS[1].store(0, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lifted_descriptors_sit_high_and_keep_their_file() {
        let (a, b) = {
            let mut p = [0; 2];
            // SAFETY: pipe writes two descriptors into the array.
            assert_eq!(unsafe { libc::pipe(p.as_mut_ptr()) }, 0);
            (p[0], p[1])
        };
        let hi = lift(b);
        assert!(hi as u64 >= top() / 2, "{hi} is not high (top {})", top());
        // The old number is free again: the lowest free number is reused.
        // SAFETY: F_GETFD on a closed descriptor only fails.
        assert_eq!(unsafe { libc::fcntl(b, libc::F_GETFD) }, -1);
        // SAFETY: as above, on the lifted copy.
        assert_eq!(unsafe { libc::fcntl(hi, libc::F_GETFD) }, libc::FD_CLOEXEC);
        assert_eq!(sys::write(hi, b"x"), Ok(1));
        let mut buf = [0u8; 1];
        assert_eq!(sys::read(a, &mut buf), Ok(1));
        let _ = sys::close(a);
        let _ = sys::close(hi);
    }

    #[test]
    fn mover_waits_for_readers_only_once() {
        // No reader: returns at once. A reader that finishes: counted down.
        wait_unused();
        assert_eq!(using(|| 7), 7);
        wait_unused();
        assert_eq!(READERS[0].load(Ordering::SeqCst), 0);
        assert_eq!(READERS[1].load(Ordering::SeqCst), 0);
    }
}
