//! Pins every field offset of the shared-memory ABI (docs/protocol.md §3) and a golden
//! byte fixture of a small header, so any change to the encoding fails here first.
#![cfg(not(loom))]

use canal_abi::queue::QueueCell;
use canal_abi::*;
use core::mem::{offset_of, size_of};

#[test]
fn header_offsets() {
    assert_eq!(offset_of!(RegionHeader, magic), 0);
    assert_eq!(offset_of!(RegionHeader, version_major), 8);
    assert_eq!(offset_of!(RegionHeader, version_minor), 10);
    assert_eq!(offset_of!(RegionHeader, header_size), 12);
    assert_eq!(offset_of!(RegionHeader, features), 16);
    assert_eq!(offset_of!(RegionHeader, region_size), 24);
    assert_eq!(offset_of!(RegionHeader, slot_count), 32);
    assert_eq!(offset_of!(RegionHeader, socket_count), 36);
    assert_eq!(offset_of!(RegionHeader, slots_offset), 40);
    assert_eq!(offset_of!(RegionHeader, queue_offset), 48);
    assert_eq!(offset_of!(RegionHeader, sockets_offset), 56);
    assert_eq!(offset_of!(RegionHeader, attention_offset), 64);
    assert_eq!(offset_of!(RegionHeader, data_offset), 72);
    assert_eq!(offset_of!(RegionHeader, data_size), 80);
    assert_eq!(offset_of!(RegionHeader, guest_id), 88);
    assert_eq!(offset_of!(RegionHeader, reserved0), 92);
    assert_eq!(offset_of!(RegionHeader, reserved1), 96);
    assert_eq!(offset_of!(RegionHeader, host_sleeping), 128);
    assert_eq!(offset_of!(RegionHeader, event_seq), 132);
    assert_eq!(offset_of!(RegionHeader, host_state), 136);
    assert_eq!(offset_of!(RegionHeader, queue_tail), 192);
    assert_eq!(offset_of!(RegionHeader, event_waiters), 256);
    assert_eq!(offset_of!(RegionHeader, kicks), 260);
    assert_eq!(offset_of!(RegionHeader, doorbell_peer), 140);
    assert_eq!(offset_of!(RegionHeader, doorbell_vectors), 144);
    assert_eq!(offset_of!(RegionHeader, entries_used), 148);
    assert_eq!(offset_of!(RegionHeader, spare_tail), 384);
    assert_eq!(offset_of!(RegionHeader, spare_head), 448);
    assert_eq!(offset_of!(RegionHeader, spares), 512);
    assert_eq!(offset_of!(RegionHeader, backoff_kickers), 264);
    assert_eq!(offset_of!(RegionHeader, slots_used), 268);
    assert_eq!(offset_of!(RegionHeader, worker_sleeping), 320);
    assert_eq!(MAX_WORKERS, 16);
    assert_eq!(size_of::<RegionHeader>(), HEADER_USED);
}

#[test]
fn slot_offsets() {
    assert_eq!(offset_of!(Slot, state), 0);
    assert_eq!(offset_of!(Slot, sleep), 4);
    assert_eq!(offset_of!(Slot, wait_socket), 8);
    assert_eq!(offset_of!(Slot, owner), 12);
    assert_eq!(offset_of!(Slot, op), 16);
    assert_eq!(offset_of!(Slot, socket), 20);
    assert_eq!(offset_of!(Slot, in_len), 24);
    assert_eq!(offset_of!(Slot, out_len), 28);
    assert_eq!(offset_of!(Slot, args), 32);
    assert_eq!(offset_of!(Slot, result), 64);
    assert_eq!(offset_of!(Slot, seq), 72);
    assert_eq!(offset_of!(Slot, done_seq), 76);
    assert_eq!(offset_of!(Slot, bell_gen), 80);
    assert_eq!(offset_of!(Slot, reserved), 84);
    assert_eq!(size_of::<Slot>() as u64, SLOT_SIZE);
    assert_eq!(
        SLOT_PAYLOAD_OFFSET as usize + SLOT_PAYLOAD,
        SLOT_SIZE as usize
    );
}

#[test]
fn socket_entry_offsets() {
    assert_eq!(offset_of!(SocketEntry, kind), 0);
    assert_eq!(offset_of!(SocketEntry, generation), 4);
    assert_eq!(offset_of!(SocketEntry, family), 8);
    assert_eq!(offset_of!(SocketEntry, tx_offset), 16);
    assert_eq!(offset_of!(SocketEntry, tx_size), 24);
    assert_eq!(offset_of!(SocketEntry, rx_size), 28);
    assert_eq!(offset_of!(SocketEntry, rx_offset), 32);
    assert_eq!(offset_of!(SocketEntry, segment), 12);
    assert_eq!(offset_of!(SocketEntry, segment_side), 40);
    assert_eq!(offset_of!(SocketEntry, arena), 44);
    assert_eq!(offset_of!(SocketEntry, arena_offset), 48);
    assert_eq!(offset_of!(SocketEntry, flags), 64);
    assert_eq!(offset_of!(SocketEntry, pending_error), 68);
    assert_eq!(offset_of!(SocketEntry, tx_tail), 72);
    assert_eq!(offset_of!(SocketEntry, rx_head), 80);
    assert_eq!(offset_of!(SocketEntry, event_seq), 88);
    assert_eq!(offset_of!(SocketEntry, owner), 92);
    assert_eq!(offset_of!(SocketEntry, reserved2), 96);
    assert_eq!(offset_of!(SocketEntry, tx_head), 128);
    assert_eq!(offset_of!(SocketEntry, rx_tail), 136);
    assert_eq!(offset_of!(SocketEntry, refs), 144);
    assert_eq!(offset_of!(SocketEntry, guest_flags), 148);
    assert_eq!(offset_of!(SocketEntry, tx_lock), 152);
    assert_eq!(offset_of!(SocketEntry, rx_lock), 156);
    assert_eq!(offset_of!(SocketEntry, rcvtimeo_ns), 160);
    assert_eq!(offset_of!(SocketEntry, sndtimeo_ns), 168);
    assert_eq!(offset_of!(SocketEntry, tx_tail_seen), 176);
    assert_eq!(offset_of!(SocketEntry, rx_head_seen), 184);
    assert_eq!(offset_of!(SocketEntry, tx_bias), 192);
    assert_eq!(offset_of!(SocketEntry, rx_bias), 200);
    assert_eq!(offset_of!(SocketEntry, tx_busy), 208);
    assert_eq!(offset_of!(SocketEntry, rx_busy), 212);
    assert_eq!(offset_of!(SocketEntry, linger), 216);
    assert_eq!(offset_of!(SocketEntry, close_mark), 220);
    assert_eq!(offset_of!(SocketEntry, options), 224);
    assert_eq!(offset_of!(SocketEntry, rcvlowat), 232);
    assert_eq!(offset_of!(SocketEntry, fast_ticket), 236);
    assert_eq!(offset_of!(SocketEntry, fast_segment), 240);
    assert_eq!(offset_of!(SocketEntry, reserved4), 244);
    assert_eq!(size_of::<SocketEntry>() as u64, SOCKET_ENTRY_SIZE);
    assert_eq!(size_of::<QueueCell>(), 8);
}

#[test]
fn layout_of_default_region() {
    let l = Layout::new(256, 1024, 256 << 20).unwrap();
    assert_eq!(l.slots_offset, 4096);
    assert_eq!(l.queue_offset, 4096 + 256 * 512);
    assert_eq!(l.sockets_offset, 139264);
    assert_eq!(l.attention_offset, 139264 + 1024 * 256);
    assert_eq!(l.data_offset, 458752);
    assert_eq!(l.region_size, 458752 + (256 << 20));
    assert!(
        Layout::new(3, 1, 65536).is_none(),
        "slot count must be a power of two"
    );
    assert!(
        Layout::new(1, 1, 65536).is_none(),
        "queue needs capacity >= 2"
    );
    assert!(Layout::new(4, 0, 65536).is_none());
    assert!(Layout::new(4, 70000, 65536).is_none());
    assert!(Layout::new(4, 1, 1000).is_none());
}

/// A page-aligned zeroed buffer standing in for a mapped region.
struct Buf(Vec<u64>);
impl Buf {
    fn new(bytes: u64) -> Buf {
        Buf(vec![0u64; (bytes / 8) as usize])
    }
    fn ptr(&mut self) -> *mut u8 {
        self.0.as_mut_ptr() as *mut u8
    }
    fn bytes(&self, n: usize) -> &[u8] {
        // SAFETY: the Vec holds at least n bytes (callers ask for the header only).
        unsafe { core::slice::from_raw_parts(self.0.as_ptr() as *const u8, n) }
    }
}

const GOLDEN_HEADER: &str = "\
43414e414c52474e 0100 1700 00100000 0700000000000000 0000020000000000 \
04000000 03000000 0010000000000000 0018000000000000 0020000000000000 \
0023000000000000 0000010000000000 0000010000000000 2a000000 00000000";

#[test]
fn golden_header_bytes() {
    let l = Layout::new(4, 3, 65536).unwrap();
    let mut b = Buf::new(l.region_size);
    // SAFETY: b is zeroed, 8-byte aligned, region_size bytes, and outlives r.
    let r = unsafe { Region::init(b.ptr(), l, 42, feature::ALL_V1) };
    assert_eq!(r.layout(), &l);
    let hex: String = GOLDEN_HEADER.split_whitespace().collect();
    let want: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect();
    assert_eq!(b.bytes(want.len()), &want[..]);
    assert_eq!(r.header().host_state.load(sync::Ordering::Relaxed), 1);
    // The queue is initialised: cell i starts at sequence i.
    for (i, c) in r.queue_cells().iter().enumerate() {
        assert_eq!(c.seq.load(sync::Ordering::Relaxed), i as u32);
    }
}

#[test]
fn attach_validates_header() {
    let l = Layout::new(4, 3, 65536).unwrap();
    let mut b = Buf::new(l.region_size);
    let p = b.ptr();
    // SAFETY: as in golden_header_bytes.
    unsafe { Region::init(p, l, 1, feature::ALL_V1) };
    // SAFETY: p has region_size bytes.
    let ok = unsafe { Region::attach(p, l.region_size) }.unwrap();
    assert_eq!(ok.layout(), &l);
    // SAFETY: same buffer; a shorter mapping must be refused.
    let short = unsafe { Region::attach(p, l.region_size - 1) };
    assert_eq!(short.unwrap_err(), HeaderError::BadLayout);
    let corrupt = |f: &dyn Fn(&mut RegionHeader), want: HeaderError| {
        let mut c = Buf::new(l.region_size);
        let cp = c.ptr();
        // SAFETY: fresh zeroed buffer of the right size.
        unsafe { Region::init(cp, l, 1, feature::ALL_V1) };
        // SAFETY: the header page is ours alone in this test.
        f(unsafe { &mut *(cp as *mut RegionHeader) });
        // SAFETY: cp has region_size bytes.
        let r = unsafe { Region::attach(cp, l.region_size) };
        assert_eq!(r.unwrap_err(), want);
    };
    corrupt(&|h| h.magic = 1, HeaderError::BadMagic);
    corrupt(&|h| h.version_major = 2, HeaderError::BadMajor(2));
    corrupt(&|h| h.header_size = 8192, HeaderError::BadHeaderSize);
    corrupt(&|h| h.reserved1[2] = 5, HeaderError::ReservedNotZero);
    corrupt(
        &|h| h.features |= 1 << 40,
        HeaderError::UnknownFeatures(1 << 40),
    );
    corrupt(
        &|h| h.features |= 1 << 22,
        HeaderError::UnknownFeatures(1 << 22),
    );
    // A header with WATCH attaches (the bit is known, optional for the guest).
    {
        let mut b2 = Buf::new(l.region_size);
        let p2 = b2.ptr();
        // SAFETY: fresh buffer of region_size bytes.
        unsafe { Region::init(p2, l, 1, feature::ALL_V1 | feature::WATCH) };
        // SAFETY: as above.
        assert!(unsafe { Region::attach(p2, l.region_size) }.is_ok());
    }
    corrupt(&|h| h.queue_offset += 8, HeaderError::BadLayout);
    corrupt(&|h| h.slot_count = 3, HeaderError::BadLayout);
    corrupt(&|h| h.data_size = 1 << 50, HeaderError::BadLayout);
}

#[test]
fn region_accessors_are_bounds_checked() {
    let l = Layout::new(4, 3, 4 * 65536).unwrap();
    let mut b = Buf::new(l.region_size);
    // SAFETY: as above.
    let r = unsafe { Region::init(b.ptr(), l, 1, feature::ALL_V1) };
    assert!(r.slot(3).is_some() && r.slot(4).is_none());
    assert!(r.socket(2).is_some() && r.socket(3).is_none());
    assert!(r.ring(0, 65536).is_some());
    assert!(r.ring(3 * 65536, 65536).is_some());
    assert!(r.ring(3 * 65536 + 1, 65536).is_none());
    assert!(r.ring(u64::MAX - 10, 65536).is_none());
    assert!(
        r.ring(0, 3000).is_none(),
        "ring size must be a power of two"
    );
    assert!(r.raise_attention(2) && !r.raise_attention(3));
    assert_eq!(r.attention()[0].load(sync::Ordering::Relaxed), 0b100);
    let s = r.slot(0).unwrap();
    assert_eq!(s.write_payload(380, &[1, 2, 3, 4, 5, 6]), 4);
    let mut out = [0u8; 8];
    assert_eq!(s.read_payload(380, &mut out), 4);
    assert_eq!(&out[..4], &[1, 2, 3, 4]);
    assert_eq!(s.write_payload(384, &[1]), 0);
}

#[test]
fn reset_guest_line_empties_only_the_guest_line() {
    let l = Layout::new(4, 3, 65536).unwrap();
    let mut b = Buf::new(l.region_size);
    // SAFETY: zeroed buffer of region_size bytes that outlives r.
    let r = unsafe { Region::init(b.ptr(), l, 1, feature::ALL_V1) };
    let e = r.socket(1).unwrap();
    let guest_u64 = [
        &e.tx_head,
        &e.rx_tail,
        &e.rcvtimeo_ns,
        &e.sndtimeo_ns,
        &e.tx_tail_seen,
        &e.rx_head_seen,
        &e.tx_bias,
        &e.rx_bias,
    ];
    for a in guest_u64.iter().chain([&&e.tx_tail]) {
        a.store(7, sync::Ordering::Relaxed);
    }
    let guest_u32 = [
        &e.refs,
        &e.guest_flags,
        &e.tx_lock,
        &e.rx_lock,
        &e.tx_busy,
        &e.rx_busy,
    ];
    for a in guest_u32.iter().chain([&&e.flags]) {
        a.store(7, sync::Ordering::Relaxed);
    }
    e.reset_guest_line();
    for a in guest_u64 {
        assert_eq!(a.load(sync::Ordering::Relaxed), 0);
    }
    for a in guest_u32 {
        assert_eq!(a.load(sync::Ordering::Relaxed), 0);
    }
    assert_eq!(
        e.tx_tail.load(sync::Ordering::Relaxed),
        7,
        "host line untouched"
    );
    assert_eq!(
        e.flags.load(sync::Ordering::Relaxed),
        7,
        "host line untouched"
    );
}

#[test]
fn addr_roundtrip_and_validation() {
    let a = CanalAddr::v4([127, 0, 0, 1], 8080);
    let e = a.encode();
    assert_eq!(&e[..8], &[2, 0, 0x90, 0x1f, 0, 0, 0, 0]);
    assert_eq!(CanalAddr::decode(&e), Some(a));
    let b = CanalAddr::v6(
        [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
        443,
        7,
        2,
    );
    assert_eq!(CanalAddr::decode(&b.encode()), Some(b));
    let mut bad = e;
    bad[0] = 1;
    assert_eq!(CanalAddr::decode(&bad), None, "unknown family");
    let mut bad = e;
    bad[30] = 1;
    assert_eq!(CanalAddr::decode(&bad), None, "reserved bytes");
    let mut bad = e;
    bad[12] = 1;
    assert_eq!(
        CanalAddr::decode(&bad),
        None,
        "IPv4 with bytes past the first four"
    );
    assert_eq!(CanalAddr::decode(&e[..31]), None);
}

#[test]
fn arena_places() {
    use canal_abi::segment::{self, ArenaLayout, ARENA_SLOTS};
    for rs in [4096u64, 1 << 16, 1 << 20] {
        for layout in [ArenaLayout::Paged, ArenaLayout::Packed] {
            let size = layout.size(rs);
            assert_eq!(
                ArenaLayout::of_len(size),
                Some((layout, rs)),
                "{layout:?} {rs}"
            );
            let last = ARENA_SLOTS - 1;
            for slot in [0, 1, last] {
                let h = layout.header_offset(slot, rs);
                assert_eq!(layout.slot_at(h, rs), Some(slot));
                let rings = layout.rings_offset(slot, rs);
                assert!(rings % 4096 == 0 && rings >= h + layout.header_size());
                assert!(rings + 2 * rs <= size, "slot {slot}'s rings inside");
            }
            assert_eq!(
                layout.rings_offset(last, rs) + 2 * rs,
                size,
                "slots fill the arena"
            );
            assert_eq!(layout.slot_at(layout.header_offset(1, rs) + 8, rs), None);
            assert_eq!(layout.slot_at(size, rs), None, "past the end");
            assert_eq!(layout.slot_at(u64::MAX - 4095, rs), None, "overflow");
        }
        // Packed: every header in the first pages, none overlapping a ring.
        let p = ArenaLayout::Packed;
        assert_eq!(
            p.header_offset(ARENA_SLOTS - 1, rs) + 512,
            p.rings_offset(0, rs)
        );
        assert_eq!(segment::PACKED_HEADERS, 16384);
    }
    for bad in [
        0,
        4096,
        16384,
        16384 + 64 * 4096 + 1,
        32 * (4096 + 2 * 6144),
    ] {
        assert_eq!(ArenaLayout::of_len(bad), None, "{bad}");
    }
    assert_eq!(canal_abi::control::kind::ARENA, 23);
    assert_eq!(feature::ARENAS, 1 << 9);
    assert_eq!(feature::PACKED_ARENAS, 1 << 15);
    assert_eq!(canal_abi::control::hello_flag::PACKED_ARENAS, 1 << 15);
}

#[test]
fn arena_headers_say_their_layout() {
    use canal_abi::segment::{check_arena_header, ArenaLayout, SegHeader, SEG_HEADER_SIZE};
    let rs = 1 << 16;
    for layout in [ArenaLayout::Paged, ArenaLayout::Packed] {
        let mut page = vec![0u64; SEG_HEADER_SIZE as usize / 8];
        let line = layout.encode_header(9, rs);
        // SAFETY: the page is 4096 bytes, 8-aligned; line 0 fits.
        let bytes = unsafe {
            std::slice::from_raw_parts_mut(page.as_mut_ptr() as *mut u8, SEG_HEADER_SIZE as usize)
        };
        bytes[..64].copy_from_slice(&line);
        // SAFETY: SegHeader accepts any bit pattern; 512 bytes of the page.
        let h = unsafe { &*(page.as_ptr() as *const SegHeader) };
        assert!(check_arena_header(h, 9, layout, rs).is_ok());
        assert!(check_arena_header(h, 8, layout, rs).is_err(), "another id");
        assert!(
            check_arena_header(h, 9, layout, rs * 2).is_err(),
            "another ring size"
        );
        let other = match layout {
            ArenaLayout::Paged => ArenaLayout::Packed,
            ArenaLayout::Packed => ArenaLayout::Paged,
        };
        assert!(
            check_arena_header(h, 9, other, rs).is_err(),
            "the other layout"
        );
    }
}

#[test]
fn host_socket_wire_values() {
    // protocol.md §2 (kinds 28, 29).
    use canal_abi::control::kind;
    assert_eq!((kind::HOST_SOCKET, kind::HOST_SOCKET_OK), (28, 29));
}

#[test]
fn bell_wire_values() {
    // protocol.md §2 (kinds 25..27), §3 (feature bit 10), §8.8.
    use canal_abi::control::{hello_flag, kind, BELL_BODY};
    use canal_abi::segment::bell;
    assert_eq!(
        (kind::BELL_SET, kind::BELL_GET, kind::BELL_OK),
        (25, 26, 27)
    );
    assert_eq!(BELL_BODY, 8);
    assert_eq!(feature::BELLS, 1 << 10);
    assert_eq!(hello_flag::BELLS, 1 << 10);
    assert_eq!(bell::tag(5, 0), (1 << 12) | 5);
    assert_eq!(bell::slot_of(bell::tag(4095, 77)), 4095);
    // Every generation gives a tag that is neither 0 nor SEVERAL.
    for gen in [0, 1, bell::GEN_MAX - 1, bell::GEN_MAX, u32::MAX] {
        let t = bell::tag(4095, gen);
        assert!(t != 0 && t != bell::SEVERAL, "gen {gen}: {t:#x}");
    }
}

#[test]
fn bell_word_names_the_only_sleeper() {
    use canal_abi::segment::bell;
    use std::sync::atomic::{AtomicU64, Ordering};
    let w = AtomicU64::new(0);
    let (a, b) = (bell::tag(1, 1), bell::tag(2, 1));
    let target = |w: &AtomicU64| bell::target(w.load(Ordering::Relaxed));
    assert_eq!(
        target(&w),
        None,
        "nobody: an older library's sleepers are relayed"
    );
    bell::enter(&w, Some(a));
    assert_eq!(target(&w), Some(a));
    bell::enter(&w, Some(b));
    assert_eq!(target(&w), None, "two sleepers");
    bell::leave(&w);
    // Still one counted, but which one is no longer known: relay.
    assert_eq!(target(&w), None);
    bell::leave(&w);
    assert_eq!(w.load(Ordering::Relaxed), 0, "none left: cleared");
    bell::enter(&w, None);
    assert_eq!(target(&w), None, "no bell");
    bell::enter(&w, Some(a));
    assert_eq!(target(&w), None, "one of two has no bell");
    bell::leave(&w);
    bell::leave(&w);
    bell::enter(&w, Some(b));
    bell::enter(&w, Some(b));
    assert_eq!(
        target(&w),
        Some(b),
        "one thread on two connections of a side"
    );
}

#[test]
fn watch_wire_values() {
    // protocol.md §2 (kind 8) and §3 (features bit 3).
    assert_eq!(canal_abi::control::kind::WATCH, 8);
    assert_eq!(feature::WATCH, 1 << 3);
    assert_eq!(feature::KNOWN, 0b11_1111_1111_1111_1111_1111);
    assert_eq!(
        feature::ALL_V1 & feature::WATCH,
        0,
        "optional, not part of v1's set"
    );
}

#[test]
fn native_accept_wire_values() {
    // protocol.md §2 (kinds 32, 33; HELLO flags bit 17), §3 (features bit 17; socket
    // flags bits 13, 14).
    use canal_abi::control::{hello_flag, kind};
    assert_eq!((kind::LISTENER_SOCKET, kind::LISTENER_SOCKET_OK), (32, 33));
    assert_eq!(hello_flag::NATIVE_ACCEPT, 1 << 17);
    assert_eq!(feature::NATIVE_ACCEPT, 1 << 17);
    assert_eq!(canal_abi::sock_flag::NATIVE_ACCEPT, 1 << 13);
    assert_eq!(canal_abi::sock_flag::NATIVE_QUEUED, 1 << 14);
    const { assert!(canal_abi::VERSION_MINOR >= 18) };
}

#[test]
fn close_check_wire_values() {
    // protocol.md §2 (kinds 34, 35), §3 (features bit 18).
    use canal_abi::control::kind;
    assert_eq!(feature::CLOSE_CHECK, 1 << 18);
    assert_eq!((kind::CLOSE_CHECK, kind::CLOSE_CHECK_OK), (34, 35));
    assert_ne!(feature::KNOWN & feature::CLOSE_CHECK, 0);
    const { assert!(canal_abi::VERSION_MINOR >= 19) };
}

#[test]
fn host_queued_wire_values() {
    // protocol.md §2 (HELLO flags bit 18), §3 (features bit 19; socket flags bit 15).
    use canal_abi::control::hello_flag;
    assert_eq!(hello_flag::HOST_QUEUED, 1 << 18);
    assert_eq!(feature::HOST_QUEUED, 1 << 19);
    assert_eq!(canal_abi::sock_flag::HOST_QUEUED, 1 << 15);
    assert_ne!(feature::KNOWN & feature::HOST_QUEUED, 0);
    const { assert!(canal_abi::VERSION_MINOR >= 20) };
}

#[test]
fn native_quiet_wire_values() {
    // protocol.md §2 (HELLO flags bit 19), §3 (features bit 20; guest_flags bit 16).
    use canal_abi::control::hello_flag;
    assert_eq!(hello_flag::NATIVE_QUIET, 1 << 19);
    assert_eq!(feature::NATIVE_QUIET, 1 << 20);
    assert_eq!(canal_abi::guest_flag::NATIVE_LOOKS, 1 << 16);
    assert_ne!(feature::KNOWN & feature::NATIVE_QUIET, 0);
    const { assert!(canal_abi::VERSION_MINOR >= 21) };
}

#[test]
fn fast_connect_wire_values() {
    // protocol.md §2 (HELLO flags bits 20, 21), §3 (features bit 21; the table at
    // 1024, its sources at 3072), §8.10.
    use canal_abi::control::hello_flag;
    use canal_abi::fast;
    assert_eq!(hello_flag::FAST_CONNECT, 1 << 20);
    assert_eq!(hello_flag::FAST_SOURCE, 1 << 21);
    assert_eq!(feature::FAST_CONNECT, 1 << 21);
    assert_eq!(fast::TABLE_OFFSET, 1024);
    assert_eq!(fast::SOURCES_OFFSET, 3072);
    assert_eq!(size_of::<fast::Source>(), 16);
    assert_eq!(offset_of!(fast::Table, sources), 2048);
    const { assert!(canal_abi::VERSION_MINOR >= 23) };
}

#[test]
fn vrss_wire_values() {
    // protocol.md §2 (kinds 15-16, hello flag 1), §3 (features bit 5), §6.3.
    assert_eq!(feature::VRSS, 1 << 5);
    assert_eq!(control::kind::DOORBELLS, 15);
    assert_eq!(control::kind::DOORBELLS_OK, 16);
    assert_eq!(control::hello_flag::VRSS, 2);
    assert_eq!(feature::ALL_V1 & feature::VRSS, 0, "optional");
}

#[test]
fn control_header_roundtrip() {
    use canal_abi::control::*;
    let mut m = encode_header(kind::PORT, 4).to_vec();
    m.extend_from_slice(&7u32.to_le_bytes());
    assert_eq!(decode(&m), Some((kind::PORT, &7u32.to_le_bytes()[..])));
    assert_eq!(decode(&m[..19]), None, "length mismatch");
    let mut bad = m.clone();
    bad[0] ^= 1;
    assert_eq!(decode(&bad), None);
    let mut bad = m.clone();
    bad[13] = 1;
    assert_eq!(decode(&bad), None, "reserved must be zero");
}

#[test]
fn segment_offsets() {
    use canal_abi::segment::*;
    assert_eq!(offset_of!(SegHeader, magic), 0);
    assert_eq!(offset_of!(SegHeader, version_major), 8);
    assert_eq!(offset_of!(SegHeader, version_minor), 10);
    assert_eq!(offset_of!(SegHeader, header_size), 12);
    assert_eq!(offset_of!(SegHeader, ring_size), 16);
    assert_eq!(offset_of!(SegHeader, segment_size), 24);
    assert_eq!(offset_of!(SegHeader, id), 32);
    assert_eq!(offset_of!(SegHeader, dirs), 128);
    assert_eq!(size_of::<SegDir>(), 128);
    assert_eq!(offset_of!(SegDir, head), 0);
    // §8.3 (1.9): the FIN word, on the head's line.
    assert_eq!(offset_of!(SegDir, fin), 8);
    assert_eq!(offset_of!(SegDir, tail), 64);
    assert_eq!(offset_of!(SegHeader, sides), 384);
    assert_eq!(size_of::<SegSide>(), 64);
    assert_eq!(offset_of!(SegSide, sleepers), 0);
    assert_eq!(offset_of!(SegSide, futex_sleepers), 4);
    assert_eq!(offset_of!(SegSide, wake_seq), 8);
    assert_eq!(offset_of!(SegSide, deferred_barrier), 12);
    // §8.6 (1.6): the event-log words and the sides' log owners.
    assert_eq!(offset_of!(SegSide, watched), 16);
    assert_eq!(offset_of!(SegSide, watch_index), 20);
    assert_eq!(offset_of!(SegSide, logged), 24);
    // §8.8 (1.8): the bell word.
    assert_eq!(offset_of!(SegSide, bell), 32);
    assert_eq!(offset_of!(SegSide, room_wanted), 28);
    assert_eq!(offset_of!(SegSide, room_rule), 40);
    assert_eq!(offset_of!(SegHeader, owners), 48);
    assert_eq!(owners_offset(1), 52);
    // protocol.md §8.4: the deferred-barrier announcement is new in 1.3.
    const { assert!(canal_abi::VERSION_MINOR >= 3) };
    assert_eq!(wake_seq_offset(0), 384 + 8);
    assert_eq!(wake_seq_offset(1), 448 + 8);
    assert_eq!(size_of::<SegHeader>(), SEG_HEADER_USED);
    for d in 0..2u32 {
        assert_eq!(
            head_offset(d) as usize,
            128 + d as usize * size_of::<SegDir>()
        );
        assert_eq!(tail_offset(d), head_offset(d) + 64);
    }
    assert_eq!(ring_offset(0, 65536), 4096);
    assert_eq!(ring_offset(1, 65536), 4096 + 65536);
    assert_eq!(segment_size(65536), 4096 + 2 * 65536);
    assert_eq!(feature::SHORTCUT, 1 << 4);
    assert_eq!(control::kind::SEGMENT, 9);
    assert_eq!(control::kind::SEGMENT_OK, 10);
    assert_eq!(control::hello_flag::SHORTCUT, 1);
}

const GOLDEN_SEGMENT: &str = "\
43414e414c534547 0100 0000 00100000 0000010000000000 0010020000000000 07000000 00000000";

#[test]
fn golden_segment_header() {
    use canal_abi::segment::*;
    let h = encode_header(7, 65536);
    let hex: String = GOLDEN_SEGMENT.split_whitespace().collect();
    let want: Vec<u8> = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
        .collect();
    assert_eq!(&h[..want.len()], &want[..]);
    assert!(h[want.len()..].iter().all(|&b| b == 0));
    // A mapped copy validates; anything else is refused.
    let mut page = vec![0u64; SEG_HEADER_SIZE as usize / 8];
    let bytes = page.as_mut_ptr() as *mut u8;
    // SAFETY: page holds 4096 bytes; we write the 64-byte line 0.
    unsafe { core::ptr::copy_nonoverlapping(h.as_ptr(), bytes, 64) };
    // SAFETY: page is 8-byte aligned, 4096 bytes, and SegHeader (512 bytes) accepts
    // any bit pattern.
    let sh = unsafe { &*(bytes as *const SegHeader) };
    let len = segment_size(65536);
    assert_eq!(check_header(sh, 7, len), Ok(65536));
    assert_eq!(check_header(sh, 8, len), Err(BadSegment), "wrong id");
    assert_eq!(
        check_header(sh, 7, len - 1),
        Err(BadSegment),
        "short mapping"
    );
    assert_eq!(check_header_zones(sh, 7, len), Ok((65536, 0)));
    // A segment with zones: accepted by a guest that knows zones, refused otherwise.
    let hz = encode_header_zones(7, 65536, 8192);
    // SAFETY: as above.
    unsafe { core::ptr::copy_nonoverlapping(hz.as_ptr(), bytes, 64) };
    // SAFETY: as above.
    let sh = unsafe { &*(bytes as *const SegHeader) };
    let lz = segment_size_zones(65536, 8192);
    assert_eq!(check_header_zones(sh, 7, lz), Ok((65536, 8192)));
    assert_eq!(
        check_header(sh, 7, lz),
        Err(BadSegment),
        "old guest refuses zones"
    );
    assert_eq!(check_header_zones(sh, 7, lz - 1), Err(BadSegment));
    let mut bad = hz;
    bad[40..48].copy_from_slice(&8193u64.to_le_bytes());
    // SAFETY: as above.
    unsafe { core::ptr::copy_nonoverlapping(bad.as_ptr(), bytes, 64) };
    // SAFETY: as above.
    let sh = unsafe { &*(bytes as *const SegHeader) };
    assert_eq!(
        check_header_zones(sh, 7, 1 << 30),
        Err(BadSegment),
        "zone not pages"
    );
}

#[test]
fn vm_control_constants() {
    // protocol.md §2 / §9.2; the body's byte layout is pinned by canald's
    // vm::tests::vm_region_body_layout (the encoder lives in canald).
    use canal_abi::control::*;
    assert_eq!(kind::VM_REGION, 11);
    assert_eq!(kind::VM_REGION_OK, 12);
    assert_eq!(kind::VM_PID, 13);
    assert_eq!(kind::VM_PID_OK, 14);
    assert_eq!(VM_REGION_BODY, 48);
    assert_eq!(VM_REGION_OK_BODY, 24);
    assert_eq!(VM_MAX_PUBLISH, 64);
    assert!(valid_vm_name("vm-123") && valid_vm_name("a.b_c"));
    assert!(!valid_vm_name(".x") && !valid_vm_name("a/b") && !valid_vm_name(""));
    assert!(!valid_vm_name(&"a".repeat(33)));
}

#[test]
fn zone_offsets() {
    use canal_abi::zone::*;
    assert_eq!(offset_of!(ZoneHeader, magic), 0);
    assert_eq!(offset_of!(ZoneHeader, version_major), 8);
    assert_eq!(offset_of!(ZoneHeader, version_minor), 10);
    assert_eq!(offset_of!(ZoneHeader, header_size), 12);
    assert_eq!(offset_of!(ZoneHeader, zone_size), 16);
    assert_eq!(offset_of!(ZoneHeader, id), 24);
    assert_eq!(offset_of!(ZoneHeader, class_count), 28);
    assert_eq!(offset_of!(ZoneHeader, classes), 64);
    assert_eq!(size_of::<ZoneClass>(), 32);
    assert_eq!(offset_of!(ZoneClass, buf_size), 0);
    assert_eq!(offset_of!(ZoneClass, count), 4);
    assert_eq!(offset_of!(ZoneClass, meta_offset), 8);
    assert_eq!(offset_of!(ZoneClass, slab_offset), 16);
    assert_eq!(offset_of!(ZoneHeader, free), 256);
    assert_eq!(size_of::<FreeHead>(), 64);
    assert_eq!(size_of::<ZoneHeader>(), ZONE_HEADER_USED);
    assert_eq!(size_of::<BufMeta>() as u64, META_SIZE);
    assert_eq!(offset_of!(BufMeta, refs), 0);
    assert_eq!(offset_of!(BufMeta, next), 4);
    assert_eq!(offset_of!(BufMeta, gen), 8);
    assert_eq!(REF_SIZE, 24);
    let r = ZoneRef {
        zone: 0x0102_0304,
        len: 0x0506_0708,
        offset: 0x1122_3344_5566_7788,
        gen: 0x99aa_bbcc,
    };
    assert_eq!(
        hex(&r.encode()),
        "04030201 08070605 8877665544332211 ccbbaa99 00000000".replace(' ', "")
    );
    // Golden header of a zone with classes (4 KiB × 2, 64 KiB × 1), id 5.
    let l = plan(5, &[(4096, 2), (65536, 1)]).unwrap();
    let h = encode_header(&l);
    assert_eq!(
        hex(&h[..32]),
        "43414e414c5a4f4e 0100 0000 00100000 0050010000000000 05000000 02000000".replace(' ', "")
    );
    assert_eq!(
        hex(&h[64..128]),
        "00100000 02000000 0010000000000000 0030000000000000 0000000000000000 \
         00000100 01000000 0020000000000000 0050000000000000 0000000000000000"
            .replace(' ', "")
    );
    // Feature bit and hello flag of zones.
    assert_eq!(feature::ZONES, 1 << 6);
    assert_eq!(control::hello_flag::ZONES, 1 << 6);
}

#[test]
fn segment_zone_offsets() {
    use canal_abi::segment::*;
    assert_eq!(offset_of!(SegHeader, flags), 36);
    assert_eq!(offset_of!(SegHeader, zone_size), 40);
    assert_eq!(SEG_FLAG_ZONES, 1);
    assert_eq!(zone_queue_offset(0), 1024);
    assert_eq!(zone_queue_offset(1), 2048);
    assert_eq!(offset_of!(ZoneQueue, head), 0);
    assert_eq!(offset_of!(ZoneQueue, tail), 64);
    assert_eq!(offset_of!(ZoneQueue, front_off), 72);
    assert_eq!(offset_of!(ZoneQueue, entries), 128);
    assert_eq!(size_of::<ZoneDesc>(), 32);
    assert_eq!(offset_of!(ZoneDesc, pos), 0);
    assert_eq!(offset_of!(ZoneDesc, zone), 8);
    assert_eq!(offset_of!(ZoneDesc, len), 12);
    assert_eq!(offset_of!(ZoneDesc, offset), 16);
    assert_eq!(offset_of!(ZoneDesc, gen), 24);
    assert_eq!(ZONE_QUEUE_ENTRIES, 16);
    assert_eq!(size_of::<ZoneQueue>(), 128 + 16 * 32);
    assert!(zone_queue_offset(1) as usize + size_of::<ZoneQueue>() <= SEG_HEADER_SIZE as usize);
    assert_eq!(zone_head_offset(1), 2048);
    assert_eq!(zone_tail_offset(1), 2048 + 64);
    assert_eq!(segment_size_zones(65536, 8192), 4096 + 2 * 65536 + 2 * 8192);
    assert_eq!(zone_offset(1, 65536, 8192), 4096 + 2 * 65536 + 8192);
    // Golden line 0 of a segment with zones: id 7, 64 KiB rings, 8 KiB zones.
    assert_eq!(
        hex(&encode_header_zones(7, 65536, 8192)[..48]),
        "43414e414c534547 0100 0000 00100000 0000010000000000 0050020000000000 07000000 \
         01000000 0020000000000000"
            .replace([' ', '\\'], "")
            .replace('\n', "")
    );
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[test]
fn doorbell_wire_values() {
    // protocol.md §2 (VM_REGION flags, VM_REGION_OK) and §3/§9.5 (feature bit 7).
    assert_eq!(feature::DOORBELL, 1 << 7);
    assert_eq!(canal_abi::control::vm_flag::DOORBELL, 1);
}

#[test]
fn exclusive_accept_wakeups() {
    // protocol.md §3 (feature bit 11), §6 (WAIT_ACCEPT), minor 10.
    use canal_abi::control::hello_flag;
    assert_eq!(feature::ACCEPT_ONE, 1 << 11);
    assert_eq!(hello_flag::ACCEPT_ONE, 1 << 11);
    assert_eq!(canal_abi::WAIT_ACCEPT, 1 << 31);
    const { assert!(canal_abi::VERSION_MINOR >= 10) };
    assert_ne!(feature::KNOWN & feature::ACCEPT_ONE, 0);
    // A marked index never reads as WAIT_ANY.
    assert_ne!(65_534 | canal_abi::WAIT_ACCEPT, canal_abi::WAIT_ANY);
}

#[test]
fn close_marks() {
    // protocol.md §3 (feature bit 12), §3.4 (the mark at entry offset 220), §4 Close, minor 11.
    use canal_abi::control::hello_flag;
    assert_eq!(feature::CLOSE_MARK, 1 << 12);
    assert_eq!(hello_flag::CLOSE_MARK, 1 << 12);
    const { assert!(canal_abi::VERSION_MINOR >= 11) };
    assert_ne!(feature::KNOWN & feature::CLOSE_MARK, 0);
}

#[test]
fn datagram_control_messages() {
    // protocol.md §3 (feature bit 13), §5 (control messages after a record's address),
    // minor 12: the kernel's 64-bit layout, at most 512 bytes a record.
    assert_eq!(feature::DGRAM_CONTROL, 1 << 13);
    assert_eq!(feature::DGRAM_MORE, 1 << 14);
    assert_eq!(canal_abi::ring::record_kind::DATAGRAM_MORE, 3);
    const { assert!(canal_abi::VERSION_MINOR >= 12) };
    assert_ne!(feature::KNOWN & feature::DGRAM_CONTROL, 0);
    assert_eq!(canal_abi::cmsg::HEADER, 16);
    assert_eq!(canal_abi::cmsg::MAX_CONTROL, 512);
    let mut b = [0u8; 24];
    let mut at = 0;
    let m = canal_abi::cmsg::Cmsg {
        level: 0,
        kind: 2,
        data: &[9, 0, 0, 0],
    };
    assert!(canal_abi::cmsg::push(&mut b, &mut at, &m));
    assert_eq!(
        b,
        [20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0]
    );
}

#[test]
fn names_pair_layout() {
    // protocol.md §4 Names, §5 (ACCEPT records), minor 13: the local name's 32-byte
    // address, then the peer's; an ACCEPT record's address section is the peer, then
    // the pair.
    use canal_abi::addr::CanalAddr;
    const { assert!(canal_abi::VERSION_MINOR >= 13) };
    assert_eq!(canal_abi::names::NAMES_SIZE, 64);
    assert_eq!(canal_abi::names::ACCEPT_ADDR_NAMED, 96);
    let (l, p) = (
        CanalAddr::v4([127, 0, 0, 1], 80),
        CanalAddr::v4([10, 0, 2, 2], 5000),
    );
    let b = canal_abi::names::encode(&l, &p);
    assert_eq!(&b[..32], &l.encode());
    assert_eq!(&b[32..], &p.encode());
    assert_eq!(canal_abi::names::decode(&b), Some((l, p)));
}
