//! Bells (protocol §8.8): a sleeping thread woken by its short-circuit peer directly.
//!
//! Without bells, a thread sleeping in poll/select/epoll on a short-circuited
//! connection is woken through canald: the peer raises attention, canald wakes up and
//! writes the thread's slot eventfd — two wake-ups where the kernel has one, and a
//! daemon busy relaying them (PostgreSQL under canal: a quarter of the CPU).
//!
//! With feature BELLS, a thread keeps one eventfd per peer guest it sleeps on (at most
//! `PER_THREAD`), registered with canald for that peer (BELL_SET), and names it by its
//! tag in each connection's bell word while it sleeps. A peer that finds exactly one
//! tag there asks canald once for that eventfd (BELL_GET), caches it, and writes it
//! itself. One eventfd per peer, never one shared by all: a peer can read (steal) or
//! flood only the bell meant for it, so it can delay only its own connections' wake-ups.
//!
//! Every descriptor here is the library's own (ownfd.rs): lifted, hidden, retargeted
//! when the program takes its number, acted on inside `ownfd::using`.

use crate::conn::guest::Guest;
use crate::sys;
use canal_abi::segment::bell;
use canal_abi::sync::Ordering;
use canal_abi::sync::{AtomicU32, AtomicU64};
use core::sync::atomic::{AtomicI32, AtomicUsize};
use libc::c_int;

/// Peer guests a thread keeps a bell for; its sleeps on connections with further
/// peers are relayed by canald as before.
pub(crate) const PER_THREAD: usize = 2;

/// A slot's bells in this process (only the thread holding the slot changes them).
struct Own {
    /// The holder's tag (0: none taken yet).
    tag: AtomicU32,
    /// Peer key (its event-log owner key) per bell; 0 free.
    key: [AtomicU32; PER_THREAD],
    /// The bell's eventfd; -1 none (or canald refused it: that peer is relayed).
    fd: [AtomicI32; PER_THREAD],
}

static OWN: [Own; canal_abi::MAX_SLOTS as usize] = [const {
    Own {
        tag: AtomicU32::new(0),
        key: [const { AtomicU32::new(0) }; PER_THREAD],
        fd: [const { AtomicI32::new(-1) }; PER_THREAD],
    }
}; canal_abi::MAX_SLOTS as usize];

fn own(slot: u32) -> Option<&'static Own> {
    OWN.get(slot as usize)
}

/// Whether this guest uses bells.
#[inline]
pub(crate) fn enabled(g: &Guest) -> bool {
    g.region.header().features & canal_abi::feature::BELLS != 0
}

/// Before sleeping on a connection of arena `arena` with the guest whose key is
/// `peer_key`: the calling thread's (holding `slot`) tag and the index of its bell for
/// that peer, registering one first if it has none and a place is free. None: the
/// sleep is relayed by canald for this connection. (Callers check `enabled`.)
pub(crate) fn for_sleep(g: &Guest, slot: u32, peer_key: u32, arena: u32) -> Option<(u32, usize)> {
    if peer_key == 0 || arena == 0 {
        return None;
    }
    let o = own(slot)?;
    let mut tag = o.tag.load(Ordering::Relaxed);
    if tag == 0 {
        let gen = g
            .region
            .slot(slot)?
            .bell_gen
            .fetch_add(1, Ordering::Relaxed);
        tag = bell::tag(slot, gen);
        o.tag.store(tag, Ordering::Relaxed);
    }
    if let Some(j) = (0..PER_THREAD).find(|&j| o.key[j].load(Ordering::Relaxed) == peer_key) {
        return (o.fd[j].load(Ordering::Relaxed) >= 0).then_some((tag, j));
    }
    let j = (0..PER_THREAD).find(|&j| o.key[j].load(Ordering::Relaxed) == 0)?;
    o.key[j].store(peer_key, Ordering::Relaxed);
    let efd = crate::ownfd::adopt(sys::eventfd().ok()?);
    match crate::conn::ctl::ctl_bell_set(g, arena, tag, efd) {
        Ok(()) => {
            o.fd[j].store(efd, Ordering::SeqCst);
            Some((tag, j))
        }
        Err(e) => {
            crate::rt::debug!(g, "canal: bell for peer {peer_key} refused ({e})\n");
            close_own(efd);
            None
        }
    }
}

/// For a sleep on an event log (§8.6), which any peer may append to: the calling
/// thread's tag if it has a bell at all (the appender's ring works only if it has one
/// for that appender; otherwise canald refuses the appender, which then relays), and
/// the mask of every bell it has, to poll. (Callers check `enabled`.)
pub(crate) fn for_log_sleep(slot: u32) -> (Option<u32>, u32) {
    let Some(o) = own(slot) else {
        return (None, 0);
    };
    let mask = (0..PER_THREAD)
        .filter(|&j| o.fd[j].load(Ordering::Relaxed) >= 0)
        .fold(0u32, |m, j| m | 1 << j);
    let tag = o.tag.load(Ordering::Relaxed);
    ((mask != 0 && tag != 0).then_some(tag), mask)
}

/// The eventfd of the calling thread's bell `j` (slot `slot`), -1 if none.
pub(crate) fn fd(slot: u32, j: usize) -> c_int {
    own(slot).map_or(-1, |o| o.fd[j].load(Ordering::SeqCst))
}

/// Drains bell `j` of `slot` after a ppoll entry `p` for it had events, if it is
/// still that bell (it may have moved meanwhile: ownfd.rs).
pub(crate) fn drain(slot: u32, j: usize, p: &libc::pollfd) {
    crate::ownfd::using(|| {
        if p.fd >= 0 && p.fd == fd(slot, j) {
            sys::eventfd_drain(p.fd);
        }
    });
}

fn close_own(fd: c_int) {
    if fd >= 0 {
        crate::ownfd::using(|| crate::ownfd::close_own(fd));
    }
}

/// Slot `slot` is no longer this process's thread's: its bells go (the next holder
/// takes a new tag; canald drops the old tag's bells when it registers its port).
pub(crate) fn release(slot: u32) {
    let Some(o) = own(slot) else { return };
    o.tag.store(0, Ordering::Relaxed);
    for j in 0..PER_THREAD {
        o.key[j].store(0, Ordering::Relaxed);
        close_own(o.fd[j].swap(-1, Ordering::SeqCst));
    }
}

// ---- the peers' bells, as this process rings them ------------------------------------

/// Bells of peers' threads this process has (each a canald-given eventfd).
const CACHED: usize = 64;

struct Peer {
    /// `arena << 32 | tag`; 0 free. Cleared before the descriptor changes.
    key: AtomicU64,
    /// -1: canald had no such bell (that tag is relayed until ASK_AGAIN_NS later: the
    /// owner may register one for us after it named the tag in a log's bell word).
    fd: AtomicI32,
    /// When canald was asked (ns).
    asked: AtomicU64,
}

static PEER: [Peer; CACHED] = [const {
    Peer {
        key: AtomicU64::new(0),
        fd: AtomicI32::new(-1),
        asked: AtomicU64::new(0),
    }
}; CACHED];

/// How long a refused bell is not asked for again.
const ASK_AGAIN_NS: u64 = 1_000_000_000;
static PEER_LOCK: AtomicU32 = AtomicU32::new(0);
static VICTIM: AtomicUsize = AtomicUsize::new(0);

fn peer_key(arena: u32, tag: u32) -> u64 {
    (arena as u64) << 32 | tag as u64
}

/// Wakes the peer thread whose bell tag `tag` the bell word of a connection in arena
/// `arena` names. False if it could not (no such bell, a slot being replaced): the
/// caller then has canald relay the wake-up, as without bells.
pub(crate) fn ring(g: &Guest, arena: u32, tag: u32) -> bool {
    if arena == 0 {
        return false; // a segment of its own: bells are for arena connections
    }
    let want = peer_key(arena, tag);
    if let Some(r) = ring_cached(want) {
        return r;
    }
    // First wake-up of this thread by us: ask canald (once), then ring it.
    let got = crate::conn::ctl::ctl_bell_get(g, arena, tag).map(crate::ownfd::adopt);
    let fd = *got.as_ref().unwrap_or(&-1);
    let now = sys::now_ns() as u64;
    crate::rt::lock(&PEER_LOCK);
    let cached = PEER.iter().find(|p| p.key.load(Ordering::Relaxed) == want);
    // Another thread cached it meanwhile (keep that), or it is a refusal to renew.
    let old = match cached {
        Some(p) if p.fd.load(Ordering::Relaxed) >= 0 || !stale(p, now) => fd,
        Some(p) => fill(p, want, fd, now),
        None => fill(
            &PEER[VICTIM.fetch_add(1, Ordering::Relaxed) % CACHED],
            want,
            fd,
            now,
        ),
    };
    crate::rt::unlock(&PEER_LOCK);
    retire(&[old]);
    ring_cached(want).unwrap_or(false)
}

/// Under PEER_LOCK: entry `p` now holds bell `want` (`fd`, -1 for a refusal); returns
/// the descriptor it held.
fn fill(p: &Peer, want: u64, fd: c_int, now: u64) -> c_int {
    p.key.store(0, Ordering::SeqCst);
    let old = p.fd.swap(fd, Ordering::SeqCst);
    p.asked.store(now, Ordering::Relaxed);
    p.key.store(want, Ordering::SeqCst);
    old
}

/// A refusal old enough to ask canald again.
fn stale(p: &Peer, now: u64) -> bool {
    now.saturating_sub(p.asked.load(Ordering::Relaxed)) > ASK_AGAIN_NS
}

/// Rings the cached bell `want`: None if not cached (or refused long ago), Some(false)
/// if canald had none.
fn ring_cached(want: u64) -> Option<bool> {
    let p = PEER.iter().find(|p| p.key.load(Ordering::SeqCst) == want)?;
    if p.fd.load(Ordering::Relaxed) < 0 && stale(p, sys::now_ns() as u64) {
        return None;
    }
    Some(crate::ownfd::using(|| {
        let fd = p.fd.load(Ordering::SeqCst);
        // The entry may have been replaced between the two loads: its key is cleared
        // before its descriptor changes, so a match after the load vouches for it.
        fd >= 0 && p.key.load(Ordering::SeqCst) == want && sys::eventfd_signal(fd).is_ok()
    }))
}

/// Closes peer bells no entry names any more (-1s are skipped), once no ring can
/// still be using them.
fn retire(fds: &[c_int]) {
    if fds.iter().all(|&f| f < 0) {
        return;
    }
    crate::ownfd::wait_unused();
    for &f in fds.iter().filter(|&&f| f >= 0) {
        crate::ownfd::close_own(f);
    }
}

/// Arena `arena` is unmapped: its peers' bells go (canald may give its id to another
/// pair later).
pub(crate) fn forget_arena(arena: u32) {
    let mut gone = [-1; CACHED];
    crate::rt::lock(&PEER_LOCK);
    for (p, g) in PEER.iter().zip(gone.iter_mut()) {
        if p.key.load(Ordering::Relaxed) >> 32 == arena as u64 {
            p.key.store(0, Ordering::SeqCst);
            *g = p.fd.swap(-1, Ordering::SeqCst);
        }
    }
    crate::rt::unlock(&PEER_LOCK);
    retire(&gone);
}

/// Points whichever bell holds `old` at `new` (it moved: ownfd.rs).
pub(crate) fn retarget(old: c_int, new: c_int) -> bool {
    crate::ownfd::retarget(
        OWN.iter()
            .flat_map(|o| o.fd.iter())
            .chain(PEER.iter().map(|p| &p.fd)),
        old,
        new,
    )
}

/// In a fork child: the parent's threads' bells are theirs (the child's threads take
/// slots and tags of their own); the peers' bells stay usable.
pub(crate) fn fork_child() {
    PEER_LOCK.store(0, Ordering::Relaxed);
    for (i, o) in OWN.iter().enumerate() {
        if o.tag.load(Ordering::Relaxed) != 0 {
            release(i as u32);
        }
    }
}
