//! Hooks of namespace changes: `unshare(CLONE_NEWNET)` and `setns` into a network
//! namespace. canald gave this process the address view of the namespace it attached
//! from (docs/isolation.md); after the process moves, its new sockets belong to the new
//! namespace, so they are the kernel's from then on — as natively, where a socket lives
//! in the namespace it was created in and those made before the move stay where they
//! were (canal's, here). A process that moves by a raw system call is not seen; canald
//! never relies on this hook for a boundary (it judges the attaching process itself).
use crate::sys::real;
use libc::c_int;
use std::sync::atomic::{AtomicBool, Ordering};

static LEFT: AtomicBool = AtomicBool::new(false);

/// Whether this process left the network namespace it attached from.
pub(crate) fn left_netns() -> bool {
    LEFT.load(Ordering::Relaxed)
}

type FnUnshare = unsafe extern "C" fn(c_int) -> c_int;
type FnSetns = unsafe extern "C" fn(c_int, c_int) -> c_int;

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn unshare(flags: c_int) -> c_int {
    // SAFETY: forwarding the caller's argument to libc's unshare.
    let r = unsafe { real!(c"unshare", FnUnshare)(flags) };
    if r == 0 && flags & libc::CLONE_NEWNET != 0 {
        LEFT.store(true, Ordering::Relaxed);
    }
    r
}

/// NS_GET_NSTYPE (linux/nsfs.h).
const NS_GET_NSTYPE: libc::c_ulong = 0xb703;

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn setns(fd: c_int, nstype: c_int) -> c_int {
    // nstype 0 accepts any kind: ask the descriptor (before the call may close it).
    let net = nstype == libc::CLONE_NEWNET
        || (nstype == 0
            // SAFETY: an ioctl without arguments on the caller's descriptor.
            && unsafe { libc::ioctl(fd, NS_GET_NSTYPE as _) } == libc::CLONE_NEWNET);
    // SAFETY: forwarding the caller's arguments to libc's setns.
    let r = unsafe { real!(c"setns", FnSetns)(fd, nstype) };
    if r == 0 && net {
        LEFT.store(true, Ordering::Relaxed);
    }
    r
}
