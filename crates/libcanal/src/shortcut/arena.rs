//! Pair arenas as a guest process maps them (protocol §8.7): each arena is mapped
//! once, on the first connection that names it (control ARENA), and every later
//! connection between the same two guests finds its segment there without a request,
//! an mmap or an munmap.
//!
//! The table counts the live segments this process has in each arena. An arena none
//! of them uses stays mapped while at most `IDLE_KEEP` such arenas exist (the next
//! short connection to the same peer then costs nothing); beyond that the idle arena
//! mapped longest ago is unmapped, so a server that meets many short-lived client
//! processes keeps a bounded number of mappings. Every function here runs under
//! `seg`'s table lock.

use crate::conn::guest::Guest;
use canal_abi::segment;
use canal_abi::sync::{AtomicU32, Ordering};
use core::sync::atomic::{AtomicU64, AtomicUsize};

/// Arenas one process can have mapped at once (32 segments each: far more
/// connections than RLIMIT_NOFILE allows a process).
const ARENAS: usize = 1024;
/// Arenas with no live segment of ours kept mapped.
const IDLE_KEEP: u32 = 8;

struct Mapped {
    /// Arena id (0: free).
    id: AtomicU32,
    base: AtomicUsize,
    len: AtomicUsize,
    /// Segments of this process in the arena (their `seg` table entries).
    users: AtomicU32,
    /// When it was mapped or last became idle (a counter): the arena idle longest
    /// goes first.
    stamp: AtomicU64,
}

static TABLE: [Mapped; ARENAS] = [const {
    Mapped {
        id: AtomicU32::new(0),
        base: AtomicUsize::new(0),
        len: AtomicUsize::new(0),
        users: AtomicU32::new(0),
        stamp: AtomicU64::new(0),
    }
}; ARENAS];

static CLOCK: AtomicU64 = AtomicU64::new(0);
/// Table entries ever filled (lookups scan no further).
static HIGH: AtomicUsize = AtomicUsize::new(0);
/// Mapped arenas with no segment of ours.
static IDLE: AtomicU32 = AtomicU32::new(0);

fn used() -> &'static [Mapped] {
    &TABLE[..HIGH.load(Ordering::Relaxed).min(ARENAS)]
}

fn slot_of(id: u32) -> Option<&'static Mapped> {
    used().iter().find(|m| m.id.load(Ordering::Relaxed) == id)
}

/// A slot of an arena as this process maps it.
pub(super) struct Slot {
    pub(super) header: *mut u8,
    /// Ring 0; ring 1 follows it.
    pub(super) rings: *mut u8,
    pub(super) layout: segment::ArenaLayout,
    pub(super) ring_size: u64,
}

/// Under the table lock: the slot whose header is at `offset` of arena `id`, mapping
/// the arena first if this process has not (EIO: canald gave no such arena, or a
/// malformed place). The layout and ring size come from the arena's length, never
/// from its content (which the peer guest can write). Counts one more user.
pub(super) fn take(g: &Guest, id: u32, offset: u64) -> Result<Slot, i32> {
    let m = match slot_of(id) {
        Some(m) => m,
        None => map(g, id)?,
    };
    let len = m.len.load(Ordering::Relaxed) as u64;
    let (layout, ring_size) = segment::ArenaLayout::of_len(len).ok_or(libc::EIO)?;
    let slot = layout.slot_at(offset, ring_size).ok_or(libc::EIO)?;
    if m.users.fetch_add(1, Ordering::Relaxed) == 0 {
        IDLE.fetch_sub(1, Ordering::Relaxed);
    }
    let base = m.base.load(Ordering::Relaxed) as *mut u8;
    let rings = layout.rings_offset(slot, ring_size);
    // SAFETY: the arena is `len` = layout.size(ring_size) bytes (of_len): every slot's
    // header and rings lie inside the mapping.
    Ok(unsafe {
        Slot {
            header: base.add(offset as usize),
            rings: base.add(rings as usize),
            layout,
            ring_size,
        }
    })
}

fn map(g: &Guest, id: u32) -> Result<&'static Mapped, i32> {
    let (i, free) = TABLE
        .iter()
        .enumerate()
        .find(|(_, m)| m.id.load(Ordering::Relaxed) == 0)
        .ok_or(libc::ENOBUFS)?;
    let (fd, size) = crate::conn::ctl::ctl_arena(g, id)?;
    let (base, size) = crate::sys::map_memfd(fd, size, 1 << 40)?;
    free.base.store(base as usize, Ordering::Relaxed);
    free.len.store(size as usize, Ordering::Relaxed);
    free.users.store(0, Ordering::Relaxed);
    free.stamp
        .store(CLOCK.fetch_add(1, Ordering::Relaxed), Ordering::Relaxed);
    free.id.store(id, Ordering::Relaxed);
    HIGH.fetch_max(i + 1, Ordering::Relaxed);
    IDLE.fetch_add(1, Ordering::Relaxed);
    crate::rt::debug!(g, "canal: mapped pair arena {id} ({size} bytes)\n");
    Ok(free)
}

/// Under the table lock: a segment of ours in arena `id` is gone. When more than
/// IDLE_KEEP arenas have none left, the oldest of them is unmapped (`unmap` defers
/// it while a thread sleeps with pointers into shared memory).
pub(super) fn put(id: u32, unmap: impl Fn(usize, usize)) {
    let Some(m) = slot_of(id) else { return };
    let n = m.users.load(Ordering::Relaxed);
    if n == 0 {
        return;
    }
    m.users.store(n - 1, Ordering::Relaxed);
    if n > 1 {
        return;
    }
    m.stamp
        .store(CLOCK.fetch_add(1, Ordering::Relaxed), Ordering::Relaxed);
    if IDLE.fetch_add(1, Ordering::Relaxed) < IDLE_KEEP {
        return;
    }
    let idle = used()
        .iter()
        .filter(|m| m.id.load(Ordering::Relaxed) != 0 && m.users.load(Ordering::Relaxed) == 0)
        .min_by_key(|m| m.stamp.load(Ordering::Relaxed));
    if let Some(old) = idle {
        crate::shortcut::bells::forget_arena(old.id.load(Ordering::Relaxed));
        old.id.store(0, Ordering::Relaxed);
        IDLE.fetch_sub(1, Ordering::Relaxed);
        unmap(
            old.base.swap(0, Ordering::Relaxed),
            old.len.swap(0, Ordering::Relaxed),
        );
    }
}
