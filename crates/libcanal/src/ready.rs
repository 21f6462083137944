//! Readiness of a canal socket, computed from what the host published in the socket
//! entry (flags, pending_error, ring indices) and the guest's own shutdown bits, with
//! the poll bits Linux reports for the same state (`tcp_poll`, `datagram_poll`).

use canal_abi::ring::RECORD_HEADER;
use canal_abi::{sock_flag as f, sock_kind};
use libc::c_short;

/// libcanal-private bits of `SocketEntry::guest_flags` (bit 0 is the ABI's O_NONBLOCK,
/// bit 16 its NATIVE_LOOKS, which canald reads; these it never does). Set by this
/// process family's calls (shutdown(), connect(), ...).
pub(crate) mod local {
    pub(crate) const SHUT_RD: u32 = 1 << 1;
    pub(crate) const SHUT_WR: u32 = 1 << 2;
    /// A connect returned EINPROGRESS (or timed out / was interrupted) and has not been
    /// collected by a later connect (the kernel's socket-layer SS_CONNECTING).
    pub(crate) const CONNECT_PENDING: u32 = 1 << 3;
    /// The socket's first bind/connect/listen/sendto went to canal: the selection
    /// policy (`policy.rs`) no longer hands it to the kernel.
    pub(crate) const COMMITTED: u32 = 1 << 4;
    /// A send on a short-circuited socket found its ring full (the kernel's
    /// SOCK_NOSPACE): until an edge-triggered epoll reports EPOLLOUT, the peer freeing
    /// space is an edge (`Sock::edge_seq`).
    pub(crate) const NOSPACE: u32 = 1 << 5;
    /// A socket created with a lone dummy has had a WATCH armed for it (`sock::watch`).
    pub(crate) const ARMED: u32 = 1 << 6;
    /// A short-circuited stream sent once after its peer's orderly close: the bytes
    /// were dropped as the kernel's peer would drop them, answering with a reset
    /// (`sock::stream`); from now on the connection is reset (HUP, sends fail).
    pub(crate) const RESET_SENT: u32 = 1 << 7;
    /// The program bound the socket (BIND answered 0): its connects keep that name,
    /// so they are CONNECTs, never fast connects (`shortcut::fast`).
    pub(crate) const BOUND: u32 = 1 << 8;
}

pub(crate) const POLLIN: c_short = libc::POLLIN;
pub(crate) const POLLOUT: c_short = libc::POLLOUT;
pub(crate) const POLLERR: c_short = libc::POLLERR;
pub(crate) const POLLHUP: c_short = libc::POLLHUP;
pub(crate) const POLLRDHUP: c_short = libc::POLLRDHUP;
pub(crate) const POLLRDNORM: c_short = libc::POLLRDNORM;
pub(crate) const POLLWRNORM: c_short = libc::POLLWRNORM;
pub(crate) const POLLNVAL: c_short = libc::POLLNVAL;
pub(crate) const POLLPRI: c_short = libc::POLLPRI;

const IN: c_short = POLLIN | POLLRDNORM;
const OUT: c_short = POLLOUT | POLLWRNORM;

/// A snapshot of one socket entry.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct SockState {
    pub(crate) kind: u32,
    pub(crate) flags: u32,
    pub(crate) pending_error: u32,
    /// Bytes queued in the tx ring, and its size.
    pub(crate) tx_used: u64,
    pub(crate) tx_size: u64,
    /// Bytes queued in the rx ring.
    pub(crate) rx_used: u64,
    /// guest_flags (for the `local` shutdown bits).
    pub(crate) guest_flags: u32,
    /// A stream's SO_RCVLOWAT, at most its rx ring's size (0: never set, i.e. 1).
    pub(crate) rcvlowat: u32,
}

impl SockState {
    pub(crate) fn tx_free(&self) -> u64 {
        self.tx_size.saturating_sub(self.tx_used)
    }
}

/// Room a datagram socket needs to report POLLOUT: any record the ring accepts fits
/// (half the ring plus a header; see `ring::max_record_payload`).
pub(crate) fn dgram_writable(tx_free: u64, tx_size: u64) -> bool {
    tx_size > 0 && tx_free >= tx_size / 2 + RECORD_HEADER
}

/// All poll bits that are true now (before masking with the requested events).
pub(crate) fn readiness(s: &SockState) -> c_short {
    let shut_rd = s.guest_flags & local::SHUT_RD != 0;
    let shut_wr = s.guest_flags & local::SHUT_WR != 0;
    let mut m: c_short = 0;
    // canald stores a failed connect's pending_error just before it publishes
    // ERROR|HUP (Release; the snapshot loads flags first, Acquire): an error seen
    // while the flags still say CONNECTING is that publication half done, so it is
    // reported together with its flags, as the kernel reports both at once.
    let mid_publication = s.kind == sock_kind::STREAM
        && s.flags & f::CONNECTING != 0
        && s.flags & (f::CONNECTED | f::ERROR | f::HUP | f::BROKEN) == 0;
    if s.pending_error != 0 && !mid_publication {
        m |= POLLERR;
    }
    match s.kind {
        sock_kind::LISTENER => {
            // HANDED_OVER: another process passed it on; the next call here makes this
            // process's descriptors the kernel socket too (handoff.rs), whose own
            // readiness then counts.
            if s.flags & (f::LISTENING | f::HANDED_OVER) == 0 {
                // Shut down for reading (disconnected, no longer listening): the
                // kernel's tcp_poll of a closed socket, as for a fresh one.
                m |= POLLHUP | OUT;
            } else if s.rx_used > 0
                || s.flags & (f::NO_ENTRY | f::HANDED_OVER | f::NATIVE_QUEUED | f::HOST_QUEUED) != 0
            {
                m |= IN;
            }
        }
        sock_kind::STREAM => {
            // A reset (the peer's RST, or a short-circuited peer's abortive close) is the
            // kernel's tcp_reset: the error and the closed state appear together. canald
            // or the peer stores the error just before the flags; seen in between, the
            // error alone already means closed.
            let reset = s.pending_error == libc::ECONNRESET as u32;
            let closed = s.flags & (f::ERROR | f::HUP | f::BROKEN) != 0 || reset;
            let connected = s.flags & f::CONNECTED != 0;
            let connecting = s.flags & f::CONNECTING != 0 && !connected && !closed;
            let fresh = !connected && !connecting && !closed && s.flags & f::LISTENING == 0;
            let reset_sent = s.guest_flags & local::RESET_SENT != 0;
            if s.flags & f::HUP != 0 || closed || fresh || (shut_rd && shut_wr) || reset_sent {
                m |= POLLHUP;
            }
            if s.flags & f::RX_EOF != 0 || shut_rd || closed {
                m |= IN | POLLRDHUP;
            }
            if !connecting {
                // tcp_poll: readable at SO_RCVLOWAT bytes (EOF and errors above
                // regardless).
                if s.rx_used >= u64::from(s.rcvlowat.max(1)) {
                    m |= IN;
                }
                // Linux reports POLLOUT after SEND_SHUTDOWN too: a write would not
                // block (it fails with EPIPE).
                if s.tx_free() > 0 || s.flags & f::TX_CLOSED != 0 || shut_wr || closed || fresh {
                    m |= OUT;
                }
            }
        }
        sock_kind::DGRAM => {
            // HANDED_OVER: passed on by another process; the next call here follows it
            // to the kernel (handoff.rs), whose own readiness then counts.
            if s.flags & f::HANDED_OVER != 0 {
                return m | IN | OUT;
            }
            if s.rx_used > 0 || shut_rd {
                m |= IN;
            }
            if shut_rd {
                m |= POLLRDHUP;
            }
            if shut_rd && shut_wr {
                m |= POLLHUP;
            }
            if dgram_writable(s.tx_free(), s.tx_size) {
                m |= OUT;
            }
        }
        // A freed or garbage entry: let the application try a call and get the error.
        _ => m |= IN | OUT | POLLERR | POLLHUP,
    }
    m
}

/// What poll() reports for requested `events`: the requested bits plus the ones
/// always reported (POLLERR, POLLHUP, POLLNVAL).
pub(crate) fn mask(ready: c_short, events: c_short) -> c_short {
    ready & (events | POLLERR | POLLHUP | POLLNVAL)
}

/// What a dead canald leaves: every call fails, so report everything.
pub(crate) const DEAD: c_short = IN | OUT | POLLERR | POLLHUP;

// ---- select() <-> poll() ---------------------------------------------------------------

/// The poll events select() asks for, given set membership.
pub(crate) fn select_events(r: bool, w: bool, e: bool) -> c_short {
    let mut ev = 0;
    if r {
        ev |= IN;
    }
    if w {
        ev |= OUT;
    }
    if e {
        ev |= POLLPRI;
    }
    ev
}

/// Which sets an fd ends up in for poll `revents` (the kernel's POLLIN_SET,
/// POLLOUT_SET and POLLEX_SET).
pub(crate) fn select_result(revents: c_short) -> (bool, bool, bool) {
    let r = revents & (IN | libc::POLLRDBAND | POLLHUP | POLLERR) != 0;
    let w = revents & (OUT | libc::POLLWRBAND | POLLERR) != 0;
    let e = revents & POLLPRI != 0;
    (r, w, e)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(flags: u32) -> SockState {
        SockState {
            kind: sock_kind::STREAM,
            flags,
            tx_size: 1024,
            ..Default::default()
        }
    }

    #[test]
    fn reset_error_reads_as_closed_before_its_flags() {
        let mut s = stream(f::CONNECTED);
        s.pending_error = libc::ECONNRESET as u32;
        let r = readiness(&s);
        assert_eq!(
            r & (POLLERR | POLLHUP | POLLIN | POLLRDHUP),
            POLLERR | POLLHUP | POLLIN | POLLRDHUP
        );
    }

    #[test]
    fn fresh_stream_is_out_hup() {
        let r = readiness(&stream(0));
        assert_eq!(r & (POLLOUT | POLLHUP), POLLOUT | POLLHUP);
        assert_eq!(r & POLLIN, 0);
    }

    #[test]
    fn connecting_reports_nothing() {
        assert_eq!(readiness(&stream(f::CONNECTING)), 0);
        let mut s = stream(f::CONNECTING);
        s.tx_used = 0;
        s.rx_used = 5;
        assert_eq!(readiness(&s), 0);
    }

    #[test]
    fn connected_in_out() {
        let mut s = stream(f::CONNECTED);
        assert_eq!(readiness(&s), POLLOUT | POLLWRNORM);
        s.rx_used = 3;
        assert_eq!(readiness(&s), IN | OUT);
        s.tx_used = 1024;
        assert_eq!(readiness(&s), IN);
        s.flags |= f::TX_CLOSED;
        assert_eq!(
            readiness(&s) & POLLOUT,
            POLLOUT,
            "after SHUT_WR poll says writable"
        );
    }

    #[test]
    fn eof_and_reset() {
        let s = stream(f::CONNECTED | f::RX_EOF);
        let r = readiness(&s);
        assert_eq!(r & (POLLIN | POLLRDHUP), POLLIN | POLLRDHUP);
        assert_eq!(r & POLLHUP, 0);
        let mut s = stream(f::CONNECTED | f::RX_EOF | f::TX_CLOSED | f::ERROR | f::HUP);
        s.pending_error = libc::ECONNRESET as u32;
        let r = readiness(&s);
        assert_eq!(
            r & (POLLIN | POLLOUT | POLLERR | POLLHUP),
            POLLIN | POLLOUT | POLLERR | POLLHUP
        );
        // After SO_ERROR was read, POLLERR is gone (as on Linux), HUP stays.
        s.pending_error = 0;
        assert_eq!(readiness(&s) & (POLLERR | POLLHUP), POLLHUP);
    }

    #[test]
    fn connect_error_is_reported_with_its_flags() {
        // The error stored, the flags not yet: nothing until both are visible.
        let mut s = stream(f::CONNECTING);
        s.pending_error = libc::ECONNREFUSED as u32;
        assert_eq!(readiness(&s) & (POLLERR | POLLHUP | POLLOUT), 0);
        s.flags = f::ERROR | f::HUP;
        assert_eq!(readiness(&s) & (POLLERR | POLLHUP), POLLERR | POLLHUP);
    }

    #[test]
    fn failed_connect() {
        let mut s = stream(f::ERROR | f::HUP);
        s.pending_error = libc::ECONNREFUSED as u32;
        let r = readiness(&s);
        assert_ne!(r & POLLOUT, 0);
        assert_ne!(r & POLLERR, 0);
        assert_ne!(r & POLLHUP, 0);
    }

    #[test]
    fn local_shutdown() {
        let mut s = stream(f::CONNECTED);
        s.tx_used = 1024;
        s.guest_flags = local::SHUT_RD;
        assert_eq!(readiness(&s), IN | POLLRDHUP);
        s.guest_flags = local::SHUT_RD | local::SHUT_WR;
        assert_eq!(readiness(&s) & (POLLHUP | POLLOUT), POLLHUP | POLLOUT);
    }

    #[test]
    fn rcvlowat_decides_when_a_stream_is_readable() {
        let mut s = stream(f::CONNECTED);
        s.rcvlowat = 10;
        s.rx_used = 3;
        assert_eq!(readiness(&s), OUT, "3 of 10 bytes: not readable");
        s.rx_used = 10;
        assert_eq!(readiness(&s), IN | OUT);
        s.rx_used = 3;
        s.flags |= f::RX_EOF;
        assert_eq!(
            readiness(&s) & IN,
            IN,
            "the end is readable whatever the mark"
        );
    }

    #[test]
    fn listener_and_dgram() {
        let mut l = SockState {
            kind: sock_kind::LISTENER,
            flags: f::LISTENING,
            ..Default::default()
        };
        assert_eq!(readiness(&l), 0);
        l.rx_used = 24;
        assert_eq!(readiness(&l), IN);
        l.rx_used = 0;
        l.flags |= f::NATIVE_ACCEPT;
        assert_eq!(
            readiness(&l),
            0,
            "native clients: only when canald saw some"
        );
        l.flags |= f::NATIVE_QUEUED;
        assert_eq!(readiness(&l), IN);
        l.flags = f::LISTENING | f::HOST_QUEUED;
        assert_eq!(
            readiness(&l),
            IN,
            "the kernel holds clients canald took none of"
        );
        let mut d = SockState {
            kind: sock_kind::DGRAM,
            tx_size: 4096,
            ..Default::default()
        };
        assert_eq!(readiness(&d), OUT);
        d.tx_used = 4096 / 2;
        assert_eq!(readiness(&d), 0, "not enough room for a maximal record");
        d.rx_used = 48;
        d.pending_error = libc::ECONNREFUSED as u32;
        assert_eq!(readiness(&d), IN | POLLERR);
    }

    #[test]
    fn masking() {
        assert_eq!(mask(IN | OUT | POLLHUP, POLLIN), POLLIN | POLLHUP);
        assert_eq!(mask(IN | POLLRDHUP, POLLIN), POLLIN);
        assert_eq!(mask(IN | POLLRDHUP, POLLIN | POLLRDHUP), POLLIN | POLLRDHUP);
    }

    #[test]
    fn select_mapping() {
        assert_eq!(select_events(true, false, false) & POLLIN, POLLIN);
        assert_eq!(select_result(POLLHUP), (true, false, false));
        assert_eq!(select_result(POLLERR), (true, true, false));
        assert_eq!(select_result(POLLOUT), (false, true, false));
        assert_eq!(select_result(POLLPRI), (false, false, true));
        assert_eq!(select_result(0), (false, false, false));
    }
}
