//! Canal sockets after canald went away (docs/threat-model.md, "canald dies").
//!
//! A connection is reset: every call on it fails and it polls as closed with an error,
//! as a kernel socket after a reset, until the program closes it. A listener or a
//! datagram socket has no such end: natively neither fails when traffic stops coming.
//! Reporting the death on every call and every poll made event loops that log an error
//! and go on (unbound, a DNS server; PHP's, MariaDB's and stunnel's loops too) spin a
//! core each, all of them at once when one canald served them. So such a socket
//! reports it once, as a kernel socket reports a pending error once: its first call
//! fails (EIO, ECONNRESET for a receive) and from then on it is quiet — never ready, a
//! blocking accept or receive waits for its timeout or a signal, a non-blocking one
//! says EAGAIN. A program that takes the error as fatal exits (and its supervisor can
//! start it again under a new canald); one that goes on idles.
use crate::conn::guest::Guest;
use crate::sock::core::Sock;
use crate::sys;
use canal_abi::sock_kind;
use libc::c_short;

/// The handles of listeners and datagram sockets that have reported the death.
static REPORTED: crate::rt::Locked<Vec<u32>> = crate::rt::Locked::new(Vec::new());

/// Whether handle `h` has reported the death; with `report`, records that it does now.
fn reported(h: u32, report: bool) -> bool {
    REPORTED.with(|v| {
        let seen = v.contains(&h);
        if report && !seen {
            v.push(h);
        }
        seen
    })
}

/// Whether `s` is of a kind that goes quiet (above).
fn quiets(s: &Sock) -> bool {
    matches!(s.kind(), sock_kind::LISTENER | sock_kind::DGRAM)
}

/// The death, for a call on `s` (Ok while canald lives). A connection's calls, and any
/// socket's first, fail with ECONNRESET (`data`) or EIO; a quiet socket's later calls
/// wait until `deadline` (monotonic ns; None: forever) or a signal, or say EAGAIN at
/// once (`nonblock`).
pub(crate) fn check(
    s: &Sock,
    data: bool,
    nonblock: bool,
    deadline: Option<i64>,
) -> Result<(), i32> {
    if !crate::conn::guest::is_dead(s.g) {
        return Ok(());
    }
    crate::conn::guest::mark_dead();
    if !quiets(s) || !reported(s.handle, true) {
        return Err(if data { libc::ECONNRESET } else { libc::EIO });
    }
    if nonblock {
        return Err(libc::EAGAIN);
    }
    loop {
        let left = deadline.map(|d| d - sys::now_ns());
        if left.is_some_and(|l| l <= 0) {
            return Err(libc::EAGAIN);
        }
        // Nothing to wait for but the time and signals.
        sys::ppoll(&mut [], left, sys::SigMask::NONE)?;
    }
}

/// What poll and epoll report for canal socket `h` after the death: a quiet socket
/// nothing; any other (or a quiet one before its first report) every bit, so the
/// program calls and learns of it.
pub(crate) fn readiness(g: &'static Guest, h: u32) -> c_short {
    match Sock::new(g, h) {
        Ok(s) if quiets(&s) && reported(h, false) => 0,
        _ => crate::ready::DEAD,
    }
}

/// Fork child: no other thread survives to hold the lock.
pub(crate) fn fork_child() {
    REPORTED.reset_after_fork();
}
