//! The one place atomics come from, so `--cfg loom` can swap in loom's model-checked
//! versions (crossbeam's `primitive` module does the same). Layout checks and the
//! mapping of real shared memory only exist without loom: loom's atomics are not
//! the size of the hardware ones.

#[cfg(loom)]
pub use loom::sync::atomic::{fence, AtomicI64, AtomicU32, AtomicU64, Ordering};

#[cfg(not(loom))]
pub use core::sync::atomic::{fence, AtomicI64, AtomicU32, AtomicU64, Ordering};

#[cfg(loom)]
pub fn spin_hint() {
    loom::thread::yield_now();
}

#[cfg(not(loom))]
#[inline]
pub fn spin_hint() {
    core::hint::spin_loop();
}
