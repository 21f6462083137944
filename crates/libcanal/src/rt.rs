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

/// A spin-then-yield lock word (guest memory; holders never block while holding it).
pub(crate) fn lock(word: &AtomicU32) {
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
pub(crate) fn backoff(n: u32) {
    if n < 100 {
        canal_abi::sync::spin_hint();
    } else {
        sys::sched_yield();
    }
}

pub(crate) fn unlock(word: &AtomicU32) {
    // L2: Release pairs with L1.
    word.store(0, Ordering::Release);
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
