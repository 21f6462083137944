//! Event logs (protocol §8.6): this guest's, read by its large epoll sets
//! (`mux::evset`), and its short-circuit peers', appended to after moving a ring of a
//! connection the peer watches.
//!
//! Logs are mapped once per process and kept for its life (a few pages each): ours on
//! the first epoll set that relies on it, a peer's on the first publish to a connection
//! of that peer that it watches. `LOGS` maps an owner key (canald's, as a segment names
//! both sides' owners in its header) to the mapping.
use crate::conn::guest::Guest;
use crate::shortcut::seg::Seg;
use crate::sys;
use canal_abi::control::{self, kind as ck};
use canal_abi::evlog::{EvLog, EVLOG_SIZE};
use canal_abi::sync::Ordering;
use core::sync::atomic::{AtomicU32, AtomicUsize};

/// Logs this process may map (its own and its peers').
const MAX_LOGS: usize = 64;
/// A `LOGS` slot whose owner refused us (no log): appenders fall back to attention.
const REFUSED: usize = 1;

struct Slot {
    owner: AtomicU32,
    base: AtomicUsize,
}

static LOGS: [Slot; MAX_LOGS] = [const {
    Slot {
        owner: AtomicU32::new(0),
        base: AtomicUsize::new(0),
    }
}; MAX_LOGS];
/// Serialises filling `LOGS` (lookups are lock-free).
static LOCK: AtomicU32 = AtomicU32::new(0);
/// Our own log's base (0: not mapped yet, REFUSED: canald has none for us).
static OWN: AtomicUsize = AtomicUsize::new(0);

fn view(base: usize) -> Option<EvLog<'static>> {
    if base <= REFUSED {
        return None;
    }
    // SAFETY: base maps EVLOG_SIZE bytes for the life of the process (never unmapped).
    unsafe { EvLog::from_base(base as *const u8) }
}

/// Maps the log canald sends for EVLOG `seg` (0: ours); its base.
fn fetch(g: &Guest, seg: u32) -> Option<usize> {
    let fd =
        crate::conn::ctl::ctl_exchange(g, ck::EVLOG, &seg.to_le_bytes(), -1, |k, body, fds| {
            let ok = k == ck::EVLOG_OK
                && body.len() >= control::EVLOG_OK_BODY
                && fds.len() == 1
                && body[8..16] == EVLOG_SIZE.to_le_bytes();
            ok.then_some(fds[0])
        })
        .ok()?;
    let base = sys::map_memfd(fd, EVLOG_SIZE, EVLOG_SIZE).ok()?.0 as usize;
    if view(base).is_none() {
        sys::munmap(base as *mut u8, EVLOG_SIZE as usize);
        return None;
    }
    Some(base)
}

/// Our own log, mapped on first use; None if canald has none for us (an older
/// canald, a VM guest).
pub(crate) fn own(g: &Guest) -> Option<EvLog<'static>> {
    let b = OWN.load(Ordering::Acquire);
    if b != 0 {
        return view(b);
    }
    crate::rt::lock(&LOCK);
    if OWN.load(Ordering::Acquire) == 0 {
        let b = fetch(g, 0).unwrap_or(REFUSED);
        OWN.store(b, Ordering::Release);
    }
    crate::rt::unlock(&LOCK);
    view(OWN.load(Ordering::Acquire))
}

fn lookup(owner: u32) -> Option<usize> {
    LOGS.iter()
        .find(|s| owner != 0 && s.owner.load(Ordering::Acquire) == owner)
        .map(|s| s.base.load(Ordering::Acquire))
}

/// The log of the guest at `side` of `seg` (mapped on first use; None: none to use).
/// A segment naming no owner (an older canald) or a peer beyond `MAX_LOGS` gets no
/// log and no request either: a lookup that cannot be kept would be a round trip to
/// canald on every publish (the caller falls back to canald's wake-up relay).
fn peer(g: &Guest, seg: Seg, side: u32) -> Option<EvLog<'static>> {
    let owner = seg.owner(side);
    if owner == 0 {
        return None;
    }
    if let Some(b) = lookup(owner) {
        return view(b);
    }
    crate::rt::lock(&LOCK);
    let b = lookup(owner).or_else(|| {
        let slot = LOGS.iter().find(|s| s.owner.load(Ordering::Relaxed) == 0)?;
        let b = fetch(g, seg.id()).unwrap_or(REFUSED);
        // Kept under the key the segment names, so this lookup is not repeated. (A
        // peer that wrote another guest's key there only misdirects its own hints: the
        // other guest looks at a socket that did not change.)
        slot.base.store(b, Ordering::Relaxed);
        slot.owner.store(owner, Ordering::Release);
        Some(b)
    });
    crate::rt::unlock(&LOCK);
    view(b?)
}

/// What an append asks of the appender.
pub(crate) enum Tell {
    /// Nothing: nobody sleeps on the log (or an entry is already pending).
    Quiet,
    /// The peer must be woken by canald (it sleeps on its log, or we could not append).
    Relay,
    /// One thread sleeps on the log with this bell tag (protocol §8.8): ring it.
    Ring(u32),
}

/// After we moved a ring of a connection whose `side` (the peer's) relies on its event
/// log: append the peer's socket, once until the peer looked at it.
#[inline]
pub(crate) fn tell(g: &Guest, seg: Seg, side: u32) -> Tell {
    if seg.logged(side).swap(1, Ordering::SeqCst) != 0 {
        return Tell::Quiet;
    }
    let Some(log) = peer(g, seg, side) else {
        return Tell::Relay;
    };
    if !log.append(seg.watch_index(side).load(Ordering::Relaxed)) {
        return Tell::Quiet;
    }
    match canal_abi::segment::bell::target(log.bell()) {
        Some(tag) if crate::shortcut::bells::enabled(g) => Tell::Ring(tag),
        _ => Tell::Relay,
    }
}

/// A change to our socket `index` canald does not see (wake_local: a shutdown, a
/// close by another thread): our epoll sets that rely on the log must look at it.
pub(crate) fn note_local(index: u32) {
    if let Some(log) = view(OWN.load(Ordering::Acquire)) {
        log.append(index);
    }
}
