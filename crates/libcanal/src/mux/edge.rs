//! An epoll item's view of a canal socket for its edge: the sequence that moves with
//! each change, read with the readiness so that one change is one edge.
use crate::sock::core::Sock;
use canal_abi::sync::Ordering;

/// The edge sequence of a twin-watched listener (`Item::twin`) while canald does not
/// look at it: its ACCEPT records' (canald does not count native arrivals; the
/// kernel's events on the twin are their edges).
pub(super) fn twin_seq(s: &Sock) -> (u32, Option<u32>) {
    (s.e.rx_head.load(Ordering::Acquire) as u32, None)
}

/// Item `s`'s sequence (edge_seq) and readiness. The sequence first: a change after
/// it is seen next time. For an edge-triggered item the sequence is read again after
/// the readiness, and the look redone if it moved (a few times at most): canald
/// counts an event before it changes the flags (`count_event`), so readiness that
/// shows the change comes with the sequence that counts it — one edge, not new bits
/// now and the sequence alone at the next look.
pub(super) fn look(s: &Sock, edge: bool) -> (u32, Option<u32>, u32) {
    let readiness = || crate::sock::native::epoll_readiness(s, edge) as u16 as u32;
    let mut at = s.edge_seq();
    let mut bits = readiness();
    for _ in 0..(if edge { 4 } else { 0 }) {
        let again = s.edge_seq();
        if again == at {
            break;
        }
        at = again;
        bits = readiness();
    }
    (at.0, at.1, bits)
}
