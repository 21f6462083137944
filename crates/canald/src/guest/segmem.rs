//! Making the pair segment of a short-circuited connection (protocol §8, §8.7): a
//! memfd of its own or a slot of the two guests' arena, its header and owners
//! written before either guest maps it; the accepted end's link; what the listener's
//! side of a pairing did. Shared by CONNECT's pairing (`shortcut`) and fast connects'
//! (`fast`).
use crate::guest::shared::{v4_mapped, Pending, SegMem, Shared};
use crate::guest::socket::SegLink;
use crate::sys;
use canal_abi::segment::{self, side, ArenaLayout};
use canal_abi::CanalAddr;

/// What the listener's side of a pairing did.
pub(crate) enum Accepted {
    /// The accepted end's handle, its ACCEPT record written.
    Now(u32),
    /// Sent to the guest's home for the entry (an away listener).
    Forwarded,
    /// The accept queue is full: retry later.
    Full,
}

/// The accepted end's link to the connector `p` (which connected to `dst`). An IPv4
/// connection to a dual-stack listener (`lfamily` AF_INET6): its accepted end names
/// both addresses IPv4-mapped, as the kernel's AF_INET6 socket does.
pub(crate) fn acceptor_link(
    id: u32,
    p: &Pending,
    dst: &CanalAddr,
    lfamily: Option<u16>,
) -> SegLink {
    let as_listener = |a: &CanalAddr| match lfamily {
        Some(f) if f == libc::AF_INET6 as u16 => v4_mapped(a),
        _ => *a,
    };
    SegLink {
        id,
        side: side::ACCEPTOR,
        peer_conn: p.conn,
        peer_handle: p.handle,
        local: as_listener(dst),
        peer: as_listener(&p.local),
        shut_wr: false,
    }
}

/// The connector's link to the accepted end `peer_handle` (0: none, the listener
/// went) of `p`, which connected to `dst`.
pub(crate) fn connector_link(id: u32, p: &Pending, dst: &CanalAddr, peer_handle: u32) -> SegLink {
    SegLink {
        id,
        side: side::CONNECTOR,
        peer_conn: p.lconn,
        peer_handle,
        local: p.local,
        peer: *dst,
        shut_wr: false,
    }
}

/// A pair segment's memfd and canald's mapping, its header, owners (the connector's
/// and the acceptor's event-log keys, §8.6) and zones written before either guest
/// maps it.
pub(crate) fn new_segment(
    id: u32,
    ring_size: u64,
    zones: Option<&canal_abi::zone::ZoneLayout>,
    owners: [u32; 2],
) -> Option<SegMem> {
    let zone_size = zones.map_or(0, |l| l.zone_size);
    let fd = sys::create_segment_zones(id, ring_size, zone_size).ok()?;
    let len = segment::segment_size_zones(ring_size, zone_size) as usize;
    let map = sys::Mapping::map(&fd, len).ok()?;
    write_owners(&map, 0, owners);
    if let Some(l) = zones {
        if !map.init_zones(ring_size, l) {
            return None;
        }
    }
    Some(SegMem::File { fd, map })
}

/// Writes `owners` (the connector's and the acceptor's event-log keys, §8.6) into the
/// header of the segment `base` bytes into `map`.
fn write_owners(map: &sys::Mapping, base: usize, owners: [u32; 2]) {
    for (sd, owner) in [(side::CONNECTOR, owners[0]), (side::ACCEPTOR, owners[1])] {
        map.write_at(
            base + segment::owners_offset(sd) as usize,
            &owner.to_le_bytes(),
        );
    }
}

/// A segment in a free slot of the two guests' arena (protocol §8.7): its header and
/// owners written into the slot (zeros since its last use) before either guest is
/// told of it. None: no arena could be made (the caller falls back to the kernel's
/// connect).
pub(crate) fn arena_segment(
    sh: &mut Shared,
    id: u32,
    (layout, ring_size): (ArenaLayout, u64),
    owners: [u32; 2],
) -> Option<SegMem> {
    let place = sh
        .arenas
        .take(owners[0], owners[1], (layout, ring_size))
        .ok()?;
    let base = place.base as usize;
    place
        .mem
        .map
        .write_at(base, &layout.encode_header(id, ring_size));
    write_owners(&place.mem.map, base, owners);
    Some(SegMem::Arena {
        mem: place.mem,
        slot: place.slot,
        base: place.base,
    })
}
