//! Fork handling: the one `pthread_atfork` registration. Prepare takes every process-local
//! lock (epoll sets, attach, segments) so that no other thread holds one across fork;
//! the parent releases them; the child resets them and drops what belongs to the
//! parent's threads (their request slots and wake-up ports).

use crate::conn::guest::{guest, ATTACH_LOCK};
use crate::fdtable::TABLE;
use crate::rt::{lock, unlock, PID};
use crate::sys;
use canal_abi::sync::Ordering;

extern "C" fn prepare() {
    // Parent and child must hold one socket each: undecided ones stay the kernel's.
    crate::direct::settle_all_kernel();
    crate::mux::epoll::fork_prepare();
    lock(&ATTACH_LOCK);
    crate::shortcut::seg::fork_prepare();
    // Sockets with lone dummies get their WATCH before the child can hold a copy; the
    // descriptor lock stays taken until the fork is over (sock/watch.rs).
    crate::sock::watch::fork_prepare(guest());
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

extern "C" fn parent() {
    crate::sock::watch::fork_parent();
    crate::shortcut::seg::fork_done();
    unlock(&ATTACH_LOCK);
    crate::mux::epoll::fork_parent();
}

extern "C" fn child() {
    sys::forget_tid();
    crate::sock::watch::fork_child();
    crate::shortcut::seg::fork_child();
    ATTACH_LOCK.store(0, Ordering::Relaxed);
    PID.store(sys::getpid(), Ordering::Relaxed);
    crate::ownfd::fork_child();
    crate::conn::slots::forget_in_child();
    crate::shortcut::bells::fork_child();
    crate::conn::pin::forget_pins_in_child();
    crate::mux::epoll::fork_child();
    crate::sock::dead::fork_child();
    crate::sock::native::fork_child();
}

/// Registered once from the library constructor, before the program can fork.
pub(crate) fn register_handlers() {
    // SAFETY: the handlers are plain extern "C" functions that live as long as the
    // process (the library is never unloaded).
    unsafe {
        libc::pthread_atfork(Some(prepare), Some(parent), Some(child));
    }
    PID.store(sys::getpid(), Ordering::Relaxed);
}
