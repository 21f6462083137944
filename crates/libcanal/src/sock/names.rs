//! getsockname and getpeername of connected streams without a round trip: canald
//! hands a connected stream's names over once, as final (protocol §4 Names: in the
//! ACCEPT record, or as a 64-byte answer to either request), and this process keeps
//! them per socket index (`canal_abi::names::NameSlot`, keyed by the full handle, so
//! a later socket under the same index never sees them).
//!
//! When the kept pair is used: on a host stream while its flags say it is connected
//! and not over — a reset, or both directions shut, may have taken the kernel socket to
//! CLOSE, where getpeername fails with ENOTCONN; then canald is asked, as before. On a
//! short-circuited stream (canald reports the names it paired in every state) the
//! library applies the kernel's rule itself: over, getpeername is ENOTCONN and
//! getsockname still the local name.
use crate::ready::local;
use crate::sock::core::Sock;
use canal_abi::addr::CanalAddr;
use canal_abi::handle_index;
use canal_abi::names::NameSlot;
use canal_abi::names::NAMES_SIZE;
use canal_abi::sock_flag as f;
use canal_abi::sock_kind;
use canal_abi::sync::Ordering;

/// One slot per socket index (16 bits of a handle). Untouched slots cost no memory.
static SLOTS: [NameSlot; 1 << 16] = [const { NameSlot::new() }; 1 << 16];

fn slot(handle: u32) -> &'static NameSlot {
    &SLOTS[handle_index(handle) as usize & 0xFFFF]
}

/// Keeps `bytes` (local, then peer) as socket `handle`'s final names.
pub(crate) fn remember(handle: u32, bytes: &[u8]) {
    let Ok(pair) = <&[u8; NAMES_SIZE]>::try_from(bytes) else {
        return;
    };
    if canal_abi::names::decode(pair).is_some() {
        slot(handle).store(handle, pair);
    }
}

/// The process takes a new socket under `handle`: no pair kept under the same
/// handle (an old socket's, from before the generation wrapped) may answer for it.
pub(crate) fn forget(handle: u32) {
    slot(handle).forget(handle);
}

/// The kept name (`peer`: getpeername's) if the socket's state lets it answer, or
/// ENOTCONN for a short-circuited stream that is over; None: canald is asked.
pub(crate) fn kept(s: &Sock, peer: bool) -> Option<Result<CanalAddr, i32>> {
    if s.kind() != sock_kind::STREAM {
        return None;
    }
    let seg = s.e.segment.load(Ordering::Acquire) != 0;
    let mut fl = s.flags();
    if seg {
        // Our FIN is our own SHUT_WR (TX_CLOSED and HUP also come when the peer
        // closed, which natively leaves this end in CLOSE_WAIT, still connected); the
        // peer's is its FIN word or RX_EOF.
        fl &= !(f::TX_CLOSED | f::HUP);
        fl |= s.rings().map_or(0, |r| r.peer_fin());
        if s.local() & local::SHUT_WR != 0 {
            fl |= f::TX_CLOSED;
        }
    }
    // The kernel's socket goes to CLOSE at a reset, or once both FINs went
    // (TIME_WAIT's or LAST_ACK's end): getpeername then says ENOTCONN.
    let over = fl & (f::ERROR | f::HUP | f::BROKEN) != 0
        || fl & (f::RX_EOF | f::TX_CLOSED) == f::RX_EOF | f::TX_CLOSED;
    if !seg && (fl & f::CONNECTED == 0 || over) {
        return None;
    }
    if seg && over && peer {
        return Some(Err(libc::ENOTCONN));
    }
    let (local, remote) = canal_abi::names::decode(&slot(s.handle).load(s.handle)?)?;
    Some(Ok(if peer { remote } else { local }))
}
