//! libcanal: the guest library. Preloaded into a program (`LD_PRELOAD=libcanal.so`), it
//! intercepts the socket calls of AF_INET/AF_INET6 TCP and UDP sockets and ships them
//! over shared memory to canald, which performs them on the host's network stack
//! (`docs/protocol.md`). Everything else goes to libc unchanged.
//!
//! A preload library lives inside someone else's program, so the crate stays
//! dependency-light (libc and canal-abi only): hooks do not allocate or take blocking
//! locks on the data path, preserve errno on success, and never re-enter themselves.
//! Nothing here is public: the only exported symbols are the hooks' `extern "C"` functions.
//!
//! Code map (each module uses only modules listed above it; `scripts/check-layout`):
//! - `sys`: raw system calls and the real libc functions; `rt`: spin locks, pid,
//!   debug logging, environment; `fdtable`, `ready`, `sockaddr`, `iov`, `cmd`: pure
//!   bookkeeping and conversions; `ancillary`: datagram control messages, checked as
//!   the kernel checks them; `ownfd`: the library's own descriptors, kept high and
//!   moved out of a program's way.
//! - `notify`: wait policy (poll/sleep/hybrid, adaptive spin budgets).
//! - `conn/`: the connection to canald: `guest` state, `attach`, `inherit`
//!   (CANAL_REJOIN), `ctl` messages, per-thread `slots`, `request`s, `sleep` and `wait`.
//! - `shortcut/`: short-circuited connections: pair segments, zones, barrier, side locks.
//! - `sock/`: socket operations (`core` is the socket; create, control, opts, data
//!   over `stream`/`dgram` rings, accept, close).
//! - `policy`: which sockets canal takes (CANAL_EXCLUDE); `handoff`: giving one to the kernel.
//! - `mux/`: poll/select and epoll over mixed descriptors.
//! - `rejoin`: canal sockets inherited over exec keep working; `launch`: what an exec'd
//!   image gets (an environment that keeps it under canal, a warning if it cannot be).
//! - `hooks/`: the `extern "C"` entry points, one file per family of calls.
//! - `bridge`: a connected canal socket carried on a kernel socket by a helper process,
//!   for code the hooks cannot see (stdio, exec'd images, SCM_RIGHTS receivers).
//! - `relay`: the bridge helper's relay loop (top: it uses the hooks).
//! - `fork`: the one `pthread_atfork` registration.

// In unit-test builds the hooks are not exported (`cfg_attr(not(test), no_mangle)`), so
// everything reached only from them looks unused.
#![cfg_attr(test, allow(dead_code))]

mod ancillary;
mod bridge;
mod cmd;
mod conn;
mod direct;
mod evlog;
mod fdtable;
mod fork;
mod handoff;
mod hooks;
mod iov;
mod launch;
mod mux;
mod notify;
mod ownfd;
mod policy;
mod ready;
mod rejoin;
mod relay;
mod rt;
mod shortcut;
mod sock;
mod sockaddr;
mod sys;

/// Library constructor: registers the fork handlers before the program can fork, and
/// rejoins the guest of an exec'ing parent (CANAL_REJOIN).
extern "C" fn init() {
    fork::register_handlers();
    launch::at_start();
    hooks::vfork::at_start();
    rejoin::at_start();
    // A bridge helper (bridge.rs) relays and exits here, never running the program.
    relay::at_start();
}

#[cfg(not(test))]
#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;

/// Library destructor (runs at exit()).
extern "C" fn fini() {
    hooks::exec::at_exit();
}

#[cfg(not(test))]
#[used]
#[link_section = ".fini_array"]
static FINI: extern "C" fn() = fini;

#[cfg(test)]
#[test]
fn constructor_and_destructor_are_callable() {
    init();
    fini();
}
