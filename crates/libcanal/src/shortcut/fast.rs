//! Fast connects (protocol §8.10): a connect to a canal listener this guest reached
//! ring to ring before, completed in the guest's own memory with a ticket canald
//! prepared — no request, no wait for canald.
//!
//! The ticket is a slot of the pair arena with the listener's guest, its header
//! written, and a reserved local port. The connect writes its entry as canald would
//! for a paired connector (the segment fields, then CONNECTED), keeps the names, and
//! leaves a mark in the entry with its attention bit: canald installs the accepted
//! end in the listener's guest in its next round, as it does for a CONNECT. Bytes the
//! program sends meanwhile wait in the segment's ring, and its close's FIN word too,
//! so the acceptor reads them all whenever canald gets there.
//!
//! Only sockets canald would pair the same way take this path: a stream never bound,
//! not connecting, of the destination's family, in a guest canald gave
//! FAST_CONNECT (one worker, no rate quota). In a network's view (an isolated
//! guest) the record's source names the local end as the guest sees it (10.0.2.15).
//! `CANAL_FAST_CONNECT=off` in the program's environment keeps every connect a CONNECT.
use crate::ready::local;
use crate::sock::core::Sock;
use canal_abi::addr::CanalAddr;
use canal_abi::fast;
use canal_abi::segment::side;
use canal_abi::sock_flag as f;
use canal_abi::sync::Ordering;

/// `CANAL_FAST_CONNECT=off` (or `0`) turns fast connects off.
static ENV: crate::rt::EnvSwitch = crate::rt::EnvSwitch::new(c"CANAL_FAST_CONNECT");

/// Whether the program's environment leaves fast connects on.
fn allowed() -> bool {
    ENV.on()
}

/// HELLO's flag for fast connects (none where the environment turned them off).
pub(crate) fn hello_flags() -> u32 {
    use canal_abi::control::hello_flag;
    if allowed() {
        hello_flag::FAST_CONNECT | hello_flag::FAST_SOURCE
    } else {
        0
    }
}

/// A claimed ticket's fields (`canal_abi::fast::Ticket`).
struct Ticket {
    arena: u32,
    arena_offset: u32,
    segment: u32,
    rings: u64,
    ring_size: u32,
    /// The socket's local name: the ticket's port on the record's source.
    local: CanalAddr,
}

/// Same destination: family, port and address (what canald's record says it was
/// connected to; flow label and scope are not part of a TCP destination here).
fn same(a: &CanalAddr, b: &CanalAddr) -> bool {
    a.family == b.family && a.port == b.port && a.addr == b.addr
}

/// Connects stream `s` to `a` with a ticket, if the guest's table has one for `a`
/// (the caller has answered a connect already pending, connecting or connected).
/// None: no ticket (the caller sends a CONNECT). Some(Ok): connected, as a loopback
/// connect that completed; a non-blocking socket reports EINPROGRESS first, as the
/// kernel's does, and its next connect 0.
pub(crate) fn connect(s: &Sock, a: &CanalAddr) -> Option<Result<(), i32>> {
    let h = s.g.region.header();
    if h.features & canal_abi::feature::FAST_CONNECT == 0 || !allowed() {
        return None;
    }
    let e = s.e;
    if e.family.load(Ordering::Relaxed) != a.family as u32
        || e.segment.load(Ordering::Relaxed) != 0
        || s.flags() & !f::WATCHED != 0
        || s.local() & local::BOUND != 0
    {
        return None;
    }
    let table = s.g.region.fast_table();
    // The ticket's fields and the record's source are read inside the claim, which
    // vouches for them (canald writes neither while the record is valid).
    let read = |t: &fast::Ticket, source: &fast::Source| {
        let port = t.port.load(Ordering::Relaxed) as u16;
        Ticket {
            arena: t.arena.load(Ordering::Relaxed),
            arena_offset: t.arena_offset.load(Ordering::Relaxed),
            segment: t.segment.load(Ordering::Relaxed),
            rings: t.rings.load(Ordering::Relaxed) as u64,
            ring_size: t.ring_size.load(Ordering::Relaxed),
            local: source.local_name(a, port),
        }
    };
    let (at, (idx, t)) = table.records.iter().enumerate().find_map(|(at, r)| {
        let source = &table.sources[at];
        r.claim(|r| same(&r.destination(), a), |t| read(t, source))
            .map(|c| (at, c))
    })?;
    let (rings, ring_size, segment) = (t.rings, t.ring_size, t.segment);
    let localname = t.local;
    // The entry as canald writes a connector's (protocol §8.1 step 3, §8.7): place
    // first, `segment` last (Release), then the flags.
    e.arena.store(t.arena, Ordering::Relaxed);
    e.arena_offset
        .store(t.arena_offset as u64, Ordering::Relaxed);
    e.tx_offset.store(rings, Ordering::Relaxed);
    e.tx_size.store(ring_size, Ordering::Relaxed);
    e.rx_offset
        .store(rings + ring_size as u64, Ordering::Relaxed);
    e.rx_size.store(ring_size, Ordering::Relaxed);
    e.segment_side.store(side::CONNECTOR, Ordering::Relaxed);
    e.segment.store(segment, Ordering::Release);
    let names = canal_abi::names::encode(&localname, a);
    crate::sock::names::remember(s.handle, &names);
    e.flags.fetch_or(f::CONNECTED, Ordering::Release);
    e.event_seq.fetch_add(1, Ordering::Release);
    // The mark, then the attention bit (its Release): canald reads the mark when it
    // serves the bit, before any close mark of the same socket.
    e.fast_segment.store(segment, Ordering::Relaxed);
    e.fast_ticket.store(fast::mark(at, idx), Ordering::Release);
    crate::conn::request::attention(s.g, s.idx);
    crate::conn::sleep::wake_local(s.g, s.idx);
    crate::rt::debug!(
        s.g,
        "canal: fast connect handle {:#x} segment {segment}\n",
        s.handle
    );
    if s.nonblocking() {
        e.guest_flags
            .fetch_or(local::CONNECT_PENDING, Ordering::Relaxed);
        return Some(Err(libc::EINPROGRESS));
    }
    Some(Ok(()))
}
