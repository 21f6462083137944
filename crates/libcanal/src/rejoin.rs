//! Canal sockets across exec: the new image rejoins its process's guest.
//!
//! When a process execs while it holds canal sockets without close-on-exec, the exec
//! hook keeps the guest's own descriptors open across exec (control socket, region
//! memfd, doorbell, control-lock memfd) and tells the new image about them and about
//! the inherited sockets in one environment variable, `CANAL_REJOIN`:
//!
//! `ctl,memfd,doorbell,lockfd,region_size,old_slot;fd:handle,fd:handle,...`
//!
//! The new image's library constructor finds it, maps the same region (same guest, same
//! socket entries, same reference counts), re-marks the descriptors, takes the variable
//! out of its environment and frees the slot the exec'ing thread held. The inherited
//! descriptors then keep working exactly as before exec. Without sockets to carry, exec
//! is left alone and the new image attaches as a new guest when it first needs to.

use crate::conn::guest::Guest;
use crate::conn::inherit::VAR;
use crate::conn::inherit::{encode, parse};
use crate::fdtable::TABLE;
use crate::sock::core::Sock;
use crate::sys;
use libc::c_int;

fn set_cloexec(fd: c_int, on: bool) {
    let _ = sys::fcntl_int(
        fd,
        libc::F_SETFD,
        if on {
            libc::FD_CLOEXEC as libc::c_long
        } else {
            0
        },
    );
}

/// Before exec: if `keep` (inherited canal sockets) is not empty, makes the guest's
/// descriptors survive exec and returns the `CANAL_REJOIN=...` entry for the new
/// environment. `undo` reverses it if exec fails.
pub(crate) fn prepare(
    g: &Guest,
    keep: &[(c_int, u32)],
    bridged: &[(c_int, u32)],
    tokens: &[(c_int, u32)],
) -> Option<String> {
    if keep.is_empty() && bridged.is_empty() {
        return None;
    }
    let ids = crate::conn::guest::rejoin_fds(g)?;
    for fd in [ids.0, ids.1, ids.2, ids.3] {
        set_cloexec(fd, false);
    }
    let slot = crate::conn::slots::my_slot_index().unwrap_or(u32::MAX);
    Some(format!(
        "{VAR}={}",
        encode(ids, slot, keep, bridged, tokens)
    ))
}

pub(crate) fn undo(g: &Guest) {
    if let Some(ids) = crate::conn::guest::rejoin_fds(g) {
        for fd in [ids.0, ids.1, ids.2, ids.3] {
            set_cloexec(fd, true);
        }
    }
}

/// Library constructor: rejoin the guest if the exec'ing image asked for it.
pub(crate) fn at_start() {
    let Ok(v) = std::env::var(VAR) else { return };
    // The variable is for this image only.
    // SAFETY: called from the constructor, before the program's threads exist.
    unsafe { libc::unsetenv(c"CANAL_REJOIN".as_ptr()) };
    let Some(p) = parse(&v) else {
        sys::log_fmt(format_args!(
            "canal: malformed {VAR}; inherited sockets are not usable\n"
        ));
        return;
    };
    let Some(g) = crate::conn::inherit::rejoin(&p) else {
        return;
    };
    for (fd, h) in &p.fds {
        // Only a descriptor that still is the socket's dummy (a socket).
        let is_sock = sys::fcntl_int(*fd, libc::F_GETFD, 0).is_ok();
        if let Some(s) = Sock::new(g, *h).ok().filter(|_| is_sock) {
            let _ = TABLE.set_canal(*fd, *h);
            crate::rt::debug!(g, "canal: inherited fd {fd} -> handle {h:#x}\n");
            // An inherited listener's copy for native clients (sock::native), as
            // after listen(): its readiness is then exact from the start.
            if crate::sock::native::applies(s.flags()) {
                crate::sock::native::prefetch(&s);
            }
        } else {
            crate::rt::debug!(
                g,
                "canal: inherited fd {fd} (handle {h:#x}) is not usable\n"
            );
        }
    }
    crate::bridge::adopt_tokens(&p.tokens);
    for (fd, h) in &p.bridged {
        if sys::fcntl_int(*fd, libc::F_GETFD, 0).is_ok() {
            let _ = TABLE.set_bridged(*fd, *h);
            crate::rt::debug!(g, "canal: inherited fd {fd} bridges handle {h:#x}\n");
        }
    }
}
