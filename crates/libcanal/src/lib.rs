//! libcanal: the guest library. Preloaded into a program (`LD_PRELOAD=libcanal.so`), it
//! intercepts the socket calls of AF_INET/AF_INET6 TCP and UDP sockets and ships them
//! over shared memory to canald, which performs them on the host's network stack
//! (`docs/protocol.md`). Everything else goes to libc unchanged.
//!
//! Code map:
//! - `hooks`: the thin `extern "C"` trampolines (the only exported symbols), plus
//!   the descriptor bookkeeping of close/close_range/dup*/exec.
//! - `sock`: socket operations (data path over the rings, control ops as requests).
//! - `poll`: poll/select over any mix of canal and ordinary descriptors.
//! - `epoll`: epoll interest lists of canal sockets, waits over mixed descriptors.
//! - `policy`: which sockets canal takes (CANAL_EXCLUDE) and the hand-off to the kernel.
//! - `rejoin`: canal sockets inherited over exec keep working (CANAL_REJOIN).
//! - `seg`: pair segments of short-circuited connections (protocol §8).
//! - `ivshmem`: the VM transport (the region is the ivshmem PCI BAR).
//! - `client`: attaching to canald, per-thread slots, requests, kicks, waits, fork.
//! - `fdtable`: descriptor → socket handle; `ready`: readiness bits; `sockaddr`,
//!   `iov`, `cmd`: pure conversions; `sys`: raw system calls and real libc functions.

pub mod barrier;
pub mod client;
pub mod cmd;
pub mod epoll;
pub mod fdtable;
pub mod hooks;
pub mod iov;
pub mod ivshmem;
pub mod notify;
pub mod policy;
pub mod poll;
pub mod pollwait;
pub mod ready;
pub mod rejoin;
pub mod seg;
pub mod sidelock;
pub mod sock;
pub mod sockaddr;
pub mod sys;
pub mod zones;

/// Library constructor: registers the fork handlers before the program can fork.
extern "C" fn init() {
    client::register_fork_handlers();
    epoll::register_fork_handlers();
    rejoin::at_start();
}

#[cfg(not(test))]
#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;

/// Library destructor (runs at exit()).
extern "C" fn fini() {
    hooks::at_exit();
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
