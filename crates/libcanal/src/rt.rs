//! The library's small runtime: spin locks for guest memory, the owning pid, debug
//! logging, environment reads and errno names. Uses nothing of the library but `sys`.
use crate::sys;
use canal_abi::sync::AtomicU32;
use canal_abi::sync::Ordering;
use core::sync::atomic::AtomicI32;

/// The pid this process's state belongs to (detects a vfork child sharing our memory).
pub(crate) static PID: AtomicI32 = AtomicI32::new(0);

macro_rules! debug {
    ($g:expr, $($t:tt)*) => {
        if $g.debug {
            $crate::sys::log_fmt(format_args!($($t)*));
        }
    };
}

pub(crate) use debug;

/// A lock word of this process's memory: 0 free, 1 held, 2 held with sleepers
/// (Drepper's futex mutex). A contended lock spins briefly, then sleeps: with
/// spin-then-`sched_yield`, a thousand threads of one program queued behind a holder
/// the scheduler had preempted, and the holder waited its turn behind all of them
/// (connections stalled for seconds; the seg table's lock, taken at each close and
/// first use of a short-circuited connection, was the hot one).
pub(crate) fn lock(word: &AtomicU32) {
    // L1: Acquire pairs with the Release in `unlock` (L2): the previous holder's
    // writes are visible to us.
    if word
        .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
        .is_err()
    {
        lock_contended(word);
    }
}

/// Spins a bounded number of rounds before a lock sleeps (holders keep it for
/// microseconds; a preempted one for a timeslice, which spinning cannot shorten).
const LOCK_SPINS: u32 = 100;

/// A sleep on a contended lock re-checks the word this often (cheap insurance: in
/// this algorithm an unlock always wakes a sleeper).
const LOCK_SLEEP_NS: i64 = 10_000_000;

#[cold]
fn lock_contended(word: &AtomicU32) {
    for _ in 0..LOCK_SPINS {
        canal_abi::sync::spin_hint();
        // L1 as above.
        if word.load(Ordering::Relaxed) == 0
            && word
                .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
        {
            return;
        }
    }
    // Mark it contended so that the holder's unlock wakes a sleeper; whoever takes it
    // this way leaves it marked (one spare wake-up at most). L1 as above.
    while word.swap(2, Ordering::Acquire) != 0 {
        let _ = sys::futex_wait(word, 2, LOCK_SLEEP_NS);
    }
}

/// The `n`th round of a wait for a lock of shared memory (a socket entry's side lock):
/// spin briefly, then give the CPU away (the holder may be waiting for it on 2 cores).
pub(crate) fn backoff(n: u32) {
    if n < 100 {
        canal_abi::sync::spin_hint();
    } else {
        sys::sched_yield();
    }
}

pub(crate) fn unlock(word: &AtomicU32) {
    // L2: Release pairs with L1.
    if word.swap(0, Ordering::Release) == 2 {
        sys::futex_wake_one(word);
    }
}

/// A value of process memory behind one of these locks: the library's statics that
/// several threads change (epoll sets, saved options, ...).
pub(crate) struct Locked<T> {
    word: AtomicU32,
    value: core::cell::UnsafeCell<T>,
}

// SAFETY: `value` is only reached through `with`, which holds the lock.
unsafe impl<T: Send> Sync for Locked<T> {}

impl<T> Locked<T> {
    pub(crate) const fn new(value: T) -> Locked<T> {
        Locked {
            word: AtomicU32::new(0),
            value: core::cell::UnsafeCell::new(value),
        }
    }

    /// Runs `f` on the value with the lock held (released on unwind too); `f` must not
    /// take the same lock.
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        struct Unlock<'a>(&'a AtomicU32);
        impl Drop for Unlock<'_> {
            fn drop(&mut self) {
                unlock(self.0);
            }
        }
        lock(&self.word);
        let _u = Unlock(&self.word);
        // SAFETY: the lock is held, so this is the only reference.
        f(unsafe { &mut *self.value.get() })
    }

    /// Fork prepare: no other thread may hold the lock across fork.
    pub(crate) fn hold(&self) {
        lock(&self.word);
    }

    /// Fork parent: what `hold` took.
    pub(crate) fn release(&self) {
        unlock(&self.word);
    }

    /// Fork child: its only thread is the one that held the lock.
    pub(crate) fn reset_after_fork(&self) {
        self.word.store(0, Ordering::Relaxed);
    }
}

pub(crate) fn env(name: &core::ffi::CStr) -> Option<&'static [u8]> {
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

/// A path the program's environment may turn off (`NAME=off` or `NAME=0`), read once
/// per process at its first use.
pub(crate) struct EnvSwitch {
    name: &'static core::ffi::CStr,
    /// 0 not read yet, 1 on, 2 off.
    state: core::sync::atomic::AtomicU8,
}

impl EnvSwitch {
    pub(crate) const fn new(name: &'static core::ffi::CStr) -> Self {
        EnvSwitch {
            name,
            state: core::sync::atomic::AtomicU8::new(0),
        }
    }

    /// Whether the path is on (the variable is unset or says anything else).
    pub(crate) fn on(&self) -> bool {
        match self.state.load(Ordering::Relaxed) {
            1 => true,
            2 => false,
            _ => {
                let off = env(self.name).is_some_and(|v| v == b"off" || v == b"0");
                self.state.store(if off { 2 } else { 1 }, Ordering::Relaxed);
                !off
            }
        }
    }
}

pub(crate) fn disabled_by_env() -> bool {
    env(c"CANAL_DISABLE").is_some_and(|v| !v.is_empty() && v != b"0")
}

pub(crate) fn errno_name(e: i32) -> &'static str {
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

#[cfg(test)]
mod tests {
    use super::*;

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
