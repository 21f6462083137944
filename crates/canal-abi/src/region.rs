//! Region layout: the header, request slots, request queue, socket table, attention
//! bitmap and data area, and a bounds-checked view over a mapped region.

use crate::queue::QueueCell;
use crate::ring::RawRing;
use crate::sync::{AtomicI64, AtomicU32, AtomicU64, Ordering};
use core::cell::UnsafeCell;

/// Types that live in shared memory. Contract: every byte pattern is a valid value
/// (the other side may write garbage), and the type has no padding that matters.
///
/// # Safety
/// Implement only for `#[repr(C)]` types made of integers, atomics of integers and
/// byte arrays.
pub unsafe trait AnyBitPattern {}

/// Bytes of the header page.
pub const HEADER_SIZE: u64 = 4096;
/// Bytes of a request slot.
pub const SLOT_SIZE: u64 = 512;
/// Bytes of a slot's payload area.
pub const SLOT_PAYLOAD: usize = 384;
/// Offset of the payload inside a slot.
pub const SLOT_PAYLOAD_OFFSET: u64 = 128;
/// Bytes of a socket-table entry.
pub const SOCKET_ENTRY_SIZE: u64 = 256;
/// Data-area allocation granule; ring sizes are powers of two of at least this.
pub const DATA_CHUNK: u64 = 64 * 1024;
/// Largest slot count (a power of two).
pub const MAX_SLOTS: u32 = 4096;
/// Largest socket count (handles carry a 16-bit index).
pub const MAX_SOCKETS: u32 = 65535;

/// The region header (first 4 KiB of a region; bytes past `HEADER_USED` are reserved
/// and zero). Line 0 is written once by the host before the region is shared; the
/// host never reads it back. Lines 2–4 hold the live notification words.
#[repr(C)]
pub struct RegionHeader {
    pub magic: u64,
    pub version_major: u16,
    pub version_minor: u16,
    pub header_size: u32,
    pub features: u64,
    pub region_size: u64,
    pub slot_count: u32,
    pub socket_count: u32,
    pub slots_offset: u64,
    pub queue_offset: u64,
    pub sockets_offset: u64,
    pub attention_offset: u64,
    pub data_offset: u64,
    pub data_size: u64,
    pub guest_id: u32,
    pub reserved0: u32,
    pub reserved1: [u64; 4],
    // --- 128: host-written
    /// 1 while the host poller sleeps: a guest that publishes work swaps it to 0 and,
    /// if it read 1, kicks the host's doorbell. Pairs with the guest's SeqCst fence.
    pub host_sleeping: AtomicU32,
    /// Incremented by the host after any socket's readiness changed.
    pub event_seq: AtomicU32,
    /// 1 while canald serves this region; 2 once canald has abandoned it.
    pub host_state: AtomicU32,
    /// With `feature::DOORBELL` (written once, before the region is shared): canald's
    /// peer id on the VM's ivshmem doorbell device. A guest kicks by writing
    /// `doorbell_peer << 16 | 0` to the device's Doorbell register (BAR 0 offset 12).
    pub doorbell_peer: u32,
    /// With `feature::DOORBELL` (written once): the guest peer's interrupt vectors;
    /// canald wakes slot *i* by interrupting vector *i* (so it equals `slot_count`).
    pub doorbell_vectors: u32,
    /// (minor 5) 1 + the highest socket-table index the host has ever handed out,
    /// stored before the handle is published. Entries at and above it were never used,
    /// so a guest scanning the table stops there and never touches (commits) the
    /// pages of a sparse table; 0 (an older host) means `socket_count`.
    pub entries_used: AtomicU32,
    pub reserved2: [u32; 10],
    // --- 192: guest-written, contended by producers
    /// Request-queue enqueue position.
    pub queue_tail: AtomicU32,
    pub reserved3: [u32; 15],
    // --- 256: guest-written
    /// Number of guest threads sleeping on readiness (sleep_kind::EVENTS); the host
    /// scans slots for sleepers only when it is non-zero.
    pub event_waiters: AtomicU32,
    /// Doorbell kicks the guest sent (statistics).
    pub kicks: AtomicU32,
    /// With `feature::DOORBELL`: guest processes attached that cannot ring the
    /// doorbell (no access to BAR 0). While it is non-zero canald bounds its sleep for
    /// this guest as for a VM without doorbells (protocol §9.5).
    pub backoff_kickers: AtomicU32,
    /// (minor 14) 1 + the highest slot index a thread of the guest has claimed
    /// (fetch_max); the host's scan for sleeping threads stops there (0, from an
    /// older guest: `slot_count`). Only slots below it can hold a sleeper.
    pub slots_used: AtomicU32,
    pub reserved4: [u32; 12],
    // --- 320: host-written, only with feature::VRSS (protocol §6.3)
    /// `worker_sleeping[w]` is 1 while canald's worker `w` sleeps. A guest that raised
    /// the attention bit of a socket owned by worker `w` (`SocketEntry::owner`) swaps
    /// it to 0 and, if it read 1, kicks worker `w`'s doorbell (DOORBELLS_OK).
    pub worker_sleeping: [AtomicU32; MAX_WORKERS],
    // --- 384: spare sockets (minor 5, feature::SPARES)
    /// Spares the host has published (host-written; it writes `spares[tail % SPARES]`
    /// first, then increments this with Release).
    pub spare_tail: AtomicU32,
    pub reserved5: [u32; 15],
    // --- 448: guest-written
    /// Spares taken (guest processes compare-and-swap it forward after reading
    /// `spares[head % SPARES]`); the host never writes a slot a guest may still take.
    pub spare_head: AtomicU32,
    pub reserved6: [u32; 15],
    // --- 512
    /// Handles of fresh AF_INET stream sockets, unbound and unconnected.
    pub spares: [AtomicU32; SPARES],
}

/// Slots of the spare-socket ring (`RegionHeader::spares`).
pub const SPARES: usize = 16;

/// Most canald workers a region describes (feature::VRSS).
pub const MAX_WORKERS: usize = 16;

/// Bytes of the header actually defined; the rest of the page is reserved.
pub const HEADER_USED: usize = 576;

/// A request slot: the *intermediate network request* (INR) of the vCanal design.
/// Each guest thread owns one slot while it lives; it is also that thread's wake-up
/// port. Fields are atomics because both sides touch them and a side may be hostile.
#[repr(C)]
pub struct Slot {
    /// slot_state::*
    pub state: AtomicU32,
    /// sleep_kind::*
    pub sleep: AtomicU32,
    /// With sleep == EVENTS: the socket index waited on, or WAIT_ANY.
    pub wait_socket: AtomicU32,
    /// The owning guest thread id (informational).
    pub owner: AtomicU32,
    pub op: AtomicU32,
    pub socket: AtomicU32,
    /// Payload bytes the guest supplied.
    pub in_len: AtomicU32,
    /// Payload bytes the host returned.
    pub out_len: AtomicU32,
    pub args: [AtomicU64; 4],
    /// >= 0: the call's value; < 0: -errno.
    pub result: AtomicI64,
    /// Guest's request counter; the host copies it into `done_seq` when done.
    pub seq: AtomicU32,
    pub done_seq: AtomicU32,
    /// (§8.8, minor 8) Bindings of this slot so far, guest-wide: a thread that keeps
    /// the slot takes the next value as the generation of its bell tags, so a peer's
    /// cached bell of an earlier holder never matches a later one.
    pub bell_gen: AtomicU32,
    pub reserved: [u32; 11],
    payload: UnsafeCell<[u8; SLOT_PAYLOAD]>,
}

/// Per-socket entry of the socket table. Line 0 is set by the host when it allocates
/// the entry; line 1 is the host's live state; line 2 belongs to the guest (the host
/// reads only `tx_head` and `rx_tail`, and checks them); line 3 is guest-only too.
#[repr(C)]
pub struct SocketEntry {
    /// sock_kind::*; FREE when unused.
    pub kind: AtomicU32,
    pub generation: AtomicU32,
    /// Address family (2 or 10).
    pub family: AtomicU32,
    /// Pair-segment id (protocol §8): 0 for a socket whose rings are in this region;
    /// else the rings and their indices live in that segment and `tx_offset`/
    /// `rx_offset` are offsets into it.
    pub segment: AtomicU32,
    /// Transmit ring: offset into the data area and size (0 if none).
    pub tx_offset: AtomicU64,
    pub tx_size: AtomicU32,
    pub rx_size: AtomicU32,
    pub rx_offset: AtomicU64,
    /// With `segment` ≠ 0: which side of the connection this entry is
    /// (`segment::side::CONNECTOR` sends on ring 0, `ACCEPTOR` on ring 1).
    pub segment_side: AtomicU32,
    /// With `segment` ≠ 0 and feature::ARENAS (minor 7): the pair arena holding the
    /// segment (0: the segment is a file of its own, control SEGMENT), and the
    /// segment's byte offset in it (protocol §8.7). Written before `segment`.
    pub arena: AtomicU32,
    pub arena_offset: AtomicU64,
    pub reserved1: u64,
    // --- 64: host live state
    /// sock_flag::*
    pub flags: AtomicU32,
    /// An errno to report once (connect result, reset); the guest swaps it to 0.
    pub pending_error: AtomicU32,
    /// Transmit ring consumer index (host).
    pub tx_tail: AtomicU64,
    /// Receive ring producer index (host).
    pub rx_head: AtomicU64,
    /// Incremented on every readiness change of this socket.
    pub event_seq: AtomicU32,
    /// feature::VRSS: the canald worker that owns this socket (serves its rings and
    /// takes its attention bit); the guest kicks that worker's doorbell. Written
    /// before the handle is published and changed at most once (protocol §6.3).
    pub owner: AtomicU32,
    pub reserved2: [u32; 8],
    // --- 128: guest
    /// Transmit ring producer index (guest).
    pub tx_head: AtomicU64,
    /// Receive ring consumer index (guest).
    pub rx_tail: AtomicU64,
    /// Guest-only: descriptors referring to this socket across the guest's processes.
    pub refs: AtomicU32,
    /// Guest-written: file status flags shared by all descriptors (O_NONBLOCK), and
    /// (minor 21) `guest_flag::NATIVE_LOOKS`, the one bit canald reads.
    pub guest_flags: AtomicU32,
    /// Guest-only: locks serialising senders and receivers.
    pub tx_lock: AtomicU32,
    pub rx_lock: AtomicU32,
    /// Guest-only: SO_RCVTIMEO / SO_SNDTIMEO in nanoseconds (0 = none).
    pub rcvtimeo_ns: AtomicU64,
    pub sndtimeo_ns: AtomicU64,
    /// Guest-only (minor 3): the transmit ring's consumer index as a sender last read
    /// it, under `tx_lock`. Indices only grow, so it is a lower bound and the space it
    /// implies is free: a sender reads the consumer's (other core's) line only when
    /// that space is not enough for its call.
    pub tx_tail_seen: AtomicU64,
    /// Guest-only (minor 3): the receive ring's producer index as a receiver last read
    /// it, under `rx_lock`; a lower bound, so the bytes it implies are there: a receiver
    /// reads the producer's line only when they do not fill its buffer.
    pub rx_head_seen: AtomicU64,
    // --- 192: guest-only (minor 4), the biased side locks (bias.rs)
    /// The owner key of the thread that holds `tx_lock` biased (0: none yet;
    /// bias::REVOKED: none ever).
    pub tx_bias: AtomicU64,
    /// As `tx_bias`, for `rx_lock`.
    pub rx_bias: AtomicU64,
    /// Set by the owner of `tx_bias` while it sends.
    pub tx_busy: AtomicU32,
    /// Set by the owner of `rx_bias` while it receives.
    pub rx_busy: AtomicU32,
    /// Guest-only: the socket's SO_LINGER as the program set it (0: off, else 1 +
    /// seconds). canald emulates SO_LINGER; the guest's close of a lingering stream
    /// waits here, up to that long, for its transmit ring to drain.
    pub linger: AtomicU32,
    /// Guest-written (feature::CLOSE_MARK, minor 11): the socket's handle once the
    /// guest's last descriptor of it is gone and no WATCH backs it. The guest then
    /// raises the socket's attention bit, and canald closes it in its next round as
    /// a CLOSE request would (no round trip). Any other value means nothing; canald
    /// clears it when it hands the entry out again.
    pub close_mark: AtomicU32,
    /// Guest-only: options libcanal keeps itself for a short-circuited stream
    /// (TCP_NODELAY, SO_KEEPALIVE, the keepalive timers: protocol §3.4), recorded for
    /// every socket so an accepted connection inherits its listener's, as natively.
    pub options: AtomicU64,
    /// Guest-only (minor 13): the stream's SO_RCVLOWAT as the kernel applied it (0:
    /// never set, i.e. 1). Readable means at least this many bytes queued, and a
    /// blocking receive waits for that many (or its buffer's size), as in the kernel;
    /// an accepted connection inherits its listener's.
    pub rcvlowat: AtomicU32,
    /// Guest-written (feature::FAST_CONNECT, minor 22): the ticket a fast connect
    /// claimed (`fast::mark`, 0: none), then its segment id in `fast_segment`; the
    /// guest raises the socket's attention bit after both. canald reads and zeroes
    /// them when it serves the bit (protocol §8.10).
    pub fast_ticket: AtomicU32,
    pub fast_segment: AtomicU32,
    pub reserved4: [u32; 3],
}

// SAFETY: all three are repr(C) structs of integers, integer atomics and byte arrays;
// every bit pattern is a valid value.
unsafe impl AnyBitPattern for RegionHeader {}
// SAFETY: as above.
unsafe impl AnyBitPattern for Slot {}
// SAFETY: as above.
unsafe impl AnyBitPattern for SocketEntry {}
// SAFETY: as above.
unsafe impl AnyBitPattern for QueueCell {}
// SAFETY: as above (records of integer atomics).
unsafe impl AnyBitPattern for crate::fast::Table {}

// SAFETY: a Slot is only ever used through shared references; its payload is plain
// bytes whose concurrent access is ordered by `state` (the guest writes it before
// REQUESTED, the host after BUSY); a hostile peer can only garble bytes.
unsafe impl Sync for Slot {}

/// The encoding of `SocketEntry::options` (protocol §3.4, minor 9): TCP_NODELAY and
/// SO_KEEPALIVE as bits, the three keepalive timers as "set" bits and fields.
pub mod kept_opt {
    pub const NODELAY: u64 = 1 << 0;
    pub const KEEPALIVE: u64 = 1 << 1;

    /// One timer's place in the word.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub struct Timer {
        /// Set once the program set this timer.
        pub has: u64,
        pub shift: u32,
        pub width: u32,
    }

    pub const KEEPIDLE: Timer = Timer {
        has: 1 << 2,
        shift: 8,
        width: 16,
    };
    pub const KEEPINTVL: Timer = Timer {
        has: 1 << 3,
        shift: 24,
        width: 16,
    };
    pub const KEEPCNT: Timer = Timer {
        has: 1 << 4,
        shift: 40,
        width: 8,
    };

    impl Timer {
        fn mask(self) -> u64 {
            ((1u64 << self.width) - 1) << self.shift
        }
        /// The timer's value; None if never set.
        pub fn get(self, word: u64) -> Option<u32> {
            (word & self.has != 0).then(|| ((word & self.mask()) >> self.shift) as u32)
        }
        /// `word` with the timer set to `v` (cut to its width: callers check ranges).
        pub fn set(self, word: u64, v: u32) -> u64 {
            (word & !self.mask()) | self.has | ((u64::from(v) << self.shift) & self.mask())
        }
    }
}

/// Guest-only flag bits in `SocketEntry::guest_flags`.
pub mod guest_flag {
    pub const NONBLOCK: u32 = 1 << 0;
    /// (minor 21, `feature::NATIVE_QUIET`) A NATIVE_ACCEPT listener: some thread of
    /// the guest relies on canald's `sock_flag::NATIVE_QUEUED` (an epoll set holds
    /// the listener, or a process has no copy of the host listener to look at), so
    /// canald looks at the host queue on every arrival. Set once, never cleared
    /// while the entry lives; the guest raises the listener's attention after setting
    /// it. The one bit of this word canald reads: a guest that lies about it only
    /// makes canald watch, or not watch, its own listener.
    pub const NATIVE_LOOKS: u32 = 1 << 16;
}

/// Payload of an ACCEPT record: the new socket's handle.
pub const ACCEPT_PAYLOAD: usize = 8;

impl SocketEntry {
    /// Empties the guest line (protocol §3.4): the host does this when it hands out
    /// an entry, before the handle is published, so every ring starts at index 0 and
    /// no guest state of the entry's previous life survives.
    pub fn reset_guest_line(&self) {
        self.tx_head.store(0, Ordering::Relaxed);
        self.rx_tail.store(0, Ordering::Relaxed);
        self.refs.store(0, Ordering::Relaxed);
        self.guest_flags.store(0, Ordering::Relaxed);
        self.tx_lock.store(0, Ordering::Relaxed);
        self.rx_lock.store(0, Ordering::Relaxed);
        self.rcvtimeo_ns.store(0, Ordering::Relaxed);
        self.sndtimeo_ns.store(0, Ordering::Relaxed);
        self.linger.store(0, Ordering::Relaxed);
        self.close_mark.store(0, Ordering::Relaxed);
        self.options.store(0, Ordering::Relaxed);
        self.rcvlowat.store(0, Ordering::Relaxed);
        self.fast_ticket.store(0, Ordering::Relaxed);
        self.fast_segment.store(0, Ordering::Relaxed);
        self.tx_tail_seen.store(0, Ordering::Relaxed);
        self.rx_head_seen.store(0, Ordering::Relaxed);
        self.clear_side_locks();
    }

    /// Empties the four biased-lock words (also done by libcanal when it takes an
    /// entry: a canald before minor 4 does not).
    pub fn clear_side_locks(&self) {
        self.tx_bias.store(0, Ordering::Relaxed);
        self.rx_bias.store(0, Ordering::Relaxed);
        self.tx_busy.store(0, Ordering::Relaxed);
        self.rx_busy.store(0, Ordering::Relaxed);
    }
}

impl Slot {
    /// Copies `src` into the payload at `off` (clamped to the payload area).
    pub fn write_payload(&self, off: usize, src: &[u8]) -> usize {
        if off >= SLOT_PAYLOAD {
            return 0;
        }
        let n = src.len().min(SLOT_PAYLOAD - off);
        // SAFETY: off + n <= SLOT_PAYLOAD; the payload belongs to whichever side the
        // state machine says (see the Sync impl), and the bytes are plain data.
        unsafe {
            let p = (self.payload.get() as *mut u8).add(off);
            core::ptr::copy_nonoverlapping(src.as_ptr(), p, n);
        }
        n
    }

    /// Copies payload bytes `off..off+dst.len()` (clamped) into `dst`.
    pub fn read_payload(&self, off: usize, dst: &mut [u8]) -> usize {
        if off >= SLOT_PAYLOAD {
            return 0;
        }
        let n = dst.len().min(SLOT_PAYLOAD - off);
        // SAFETY: as in write_payload.
        unsafe {
            let p = (self.payload.get() as *const u8).add(off);
            core::ptr::copy_nonoverlapping(p, dst.as_mut_ptr(), n);
        }
        n
    }
}

/// Where each part of a region lives. Computed from the three sizes alone, so the
/// host and a guest derive the same offsets; a guest checks the header against it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub slot_count: u32,
    pub socket_count: u32,
    pub slots_offset: u64,
    pub queue_offset: u64,
    pub sockets_offset: u64,
    pub attention_offset: u64,
    pub data_offset: u64,
    pub data_size: u64,
    pub region_size: u64,
}

const fn round_up(n: u64, to: u64) -> u64 {
    n.div_ceil(to) * to
}

/// Why a region header was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderError {
    TooSmall,
    BadMagic,
    BadMajor(u16),
    BadHeaderSize,
    ReservedNotZero,
    UnknownFeatures(u64),
    BadLayout,
}

impl core::fmt::Display for HeaderError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            HeaderError::TooSmall => write!(f, "region smaller than its header"),
            HeaderError::BadMagic => write!(f, "not a canal region (bad magic)"),
            HeaderError::BadMajor(v) => write!(
                f,
                "region has ABI major version {v}, this library speaks {}",
                crate::consts::VERSION_MAJOR
            ),
            HeaderError::BadHeaderSize => write!(f, "unexpected header size"),
            HeaderError::ReservedNotZero => write!(f, "reserved header fields are not zero"),
            HeaderError::UnknownFeatures(b) => write!(f, "unknown feature bits {b:#x}"),
            HeaderError::BadLayout => write!(f, "region layout is inconsistent"),
        }
    }
}

impl Layout {
    /// `slot_count` a power of two in 2..=MAX_SLOTS (the queue is ambiguous at
    /// capacity 1: a full cell and an empty one would carry the same sequence); `socket_count` in 1..=MAX_SOCKETS;
    /// `data_size` a non-zero multiple of DATA_CHUNK.
    pub fn new(slot_count: u32, socket_count: u32, data_size: u64) -> Option<Layout> {
        if !slot_count.is_power_of_two()
            || !(2..=MAX_SLOTS).contains(&slot_count)
            || !(1..=MAX_SOCKETS).contains(&socket_count)
            || data_size == 0
            || !data_size.is_multiple_of(DATA_CHUNK)
            || data_size > (1 << 40)
        {
            return None;
        }
        let slots_offset = HEADER_SIZE;
        let queue_offset = round_up(slots_offset + slot_count as u64 * SLOT_SIZE, 64);
        let sockets_offset = round_up(queue_offset + slot_count as u64 * 8, 4096);
        let attention_offset =
            round_up(sockets_offset + socket_count as u64 * SOCKET_ENTRY_SIZE, 64);
        let attention_words = (socket_count as u64).div_ceil(64);
        let data_offset = round_up(attention_offset + attention_words * 8, DATA_CHUNK);
        Some(Layout {
            slot_count,
            socket_count,
            slots_offset,
            queue_offset,
            sockets_offset,
            attention_offset,
            data_offset,
            data_size,
            region_size: data_offset + data_size,
        })
    }

    pub fn attention_words(&self) -> usize {
        (self.socket_count as usize).div_ceil(64)
    }

    /// Validates a header (the one check before anything else reads a region) and
    /// returns the layout it describes. `mapped_len` is how much is mapped.
    pub fn from_header(h: &RegionHeader, mapped_len: u64) -> Result<Layout, HeaderError> {
        if mapped_len < HEADER_SIZE {
            return Err(HeaderError::TooSmall);
        }
        if h.magic != crate::consts::MAGIC {
            return Err(HeaderError::BadMagic);
        }
        if h.version_major != crate::consts::VERSION_MAJOR {
            return Err(HeaderError::BadMajor(h.version_major));
        }
        if h.header_size as u64 != HEADER_SIZE {
            return Err(HeaderError::BadHeaderSize);
        }
        if h.reserved0 != 0 || h.reserved1 != [0; 4] {
            return Err(HeaderError::ReservedNotZero);
        }
        // Features from a newer minor version are ignored only if unknown bits are
        // absent: a feature changes what the guest must do.
        if h.features & !crate::consts::feature::KNOWN != 0 {
            return Err(HeaderError::UnknownFeatures(
                h.features & !crate::consts::feature::KNOWN,
            ));
        }
        let l =
            Layout::new(h.slot_count, h.socket_count, h.data_size).ok_or(HeaderError::BadLayout)?;
        if l.slots_offset != h.slots_offset
            || l.queue_offset != h.queue_offset
            || l.sockets_offset != h.sockets_offset
            || l.attention_offset != h.attention_offset
            || l.data_offset != h.data_offset
            || l.region_size != h.region_size
            || l.region_size > mapped_len
        {
            return Err(HeaderError::BadLayout);
        }
        Ok(l)
    }
}

/// A view of a mapped region. All accessors are bounds-checked against the layout,
/// which is either the host's own or one validated from the header.
#[derive(Clone, Copy, Debug)]
pub struct Region {
    base: *mut u8,
    layout: Layout,
}

// SAFETY: the view only hands out shared references to AnyBitPattern types made of
// atomics, and ring storage whose accesses are ordered by the ring indices.
unsafe impl Send for Region {}
// SAFETY: as above.
unsafe impl Sync for Region {}

impl Region {
    /// Host side: writes a fresh header and initialises the queue.
    ///
    /// # Safety
    /// `base` must point to `layout.region_size` bytes of zeroed, writable memory,
    /// page aligned, that stay mapped while any `Region` copy is used.
    pub unsafe fn init(base: *mut u8, layout: Layout, guest_id: u32, features: u64) -> Region {
        let r = Region { base, layout };
        // SAFETY: the caller gives us the zeroed header page to write before sharing.
        let h = unsafe { &mut *(base as *mut RegionHeader) };
        h.magic = crate::consts::MAGIC;
        h.version_major = crate::consts::VERSION_MAJOR;
        h.version_minor = crate::consts::VERSION_MINOR;
        h.header_size = HEADER_SIZE as u32;
        h.features = features;
        h.region_size = layout.region_size;
        h.slot_count = layout.slot_count;
        h.socket_count = layout.socket_count;
        h.slots_offset = layout.slots_offset;
        h.queue_offset = layout.queue_offset;
        h.sockets_offset = layout.sockets_offset;
        h.attention_offset = layout.attention_offset;
        h.data_offset = layout.data_offset;
        h.data_size = layout.data_size;
        h.guest_id = guest_id;
        if features & crate::consts::feature::DOORBELL != 0 {
            h.doorbell_peer = crate::consts::DOORBELL_HOST_PEER;
            h.doorbell_vectors = layout.slot_count;
        }
        h.host_state.store(1, Ordering::Release);
        crate::queue::init_cells(r.queue_cells());
        r
    }

    /// Guest side: validates the header, then returns the view.
    ///
    /// # Safety
    /// `base` must point to `mapped_len` readable and writable bytes, page aligned,
    /// that stay mapped while any `Region` copy is used.
    pub unsafe fn attach(base: *mut u8, mapped_len: u64) -> Result<Region, HeaderError> {
        if mapped_len < HEADER_SIZE {
            return Err(HeaderError::TooSmall);
        }
        // SAFETY: at least HEADER_SIZE bytes are mapped (checked above).
        let h = unsafe { &*(base as *const RegionHeader) };
        let layout = Layout::from_header(h, mapped_len)?;
        Ok(Region { base, layout })
    }

    /// A view with a layout the caller already trusts (the host's own copy).
    ///
    /// # Safety
    /// As for `attach`, with `layout.region_size` bytes mapped.
    pub unsafe fn from_raw(base: *mut u8, layout: Layout) -> Region {
        Region { base, layout }
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    pub fn base(&self) -> *mut u8 {
        self.base
    }

    fn at<T: AnyBitPattern>(&self, offset: u64) -> &T {
        debug_assert!(offset + core::mem::size_of::<T>() as u64 <= self.layout.region_size);
        // SAFETY: callers pass offsets inside the layout (checked by the accessors);
        // T accepts any bit pattern and is only used through shared references.
        unsafe { &*(self.base.add(offset as usize) as *const T) }
    }

    pub fn header(&self) -> &RegionHeader {
        self.at(0)
    }

    /// The fast-connect table of the header page (protocol §8.10).
    #[cfg(not(loom))]
    pub fn fast_table(&self) -> &crate::fast::Table {
        self.at(crate::fast::TABLE_OFFSET)
    }

    pub fn slot(&self, index: u32) -> Option<&Slot> {
        (index < self.layout.slot_count)
            .then(|| self.at(self.layout.slots_offset + index as u64 * SLOT_SIZE))
    }

    /// How many table entries a scan must visit: `entries_used` (minor 5) when set,
    /// else every entry.
    pub fn entries_in_use_bound(&self) -> u32 {
        match self.header().entries_used.load(Ordering::Acquire) {
            0 => self.layout.socket_count,
            n => n.min(self.layout.socket_count),
        }
    }

    pub fn socket(&self, index: u32) -> Option<&SocketEntry> {
        (index < self.layout.socket_count)
            .then(|| self.at(self.layout.sockets_offset + index as u64 * SOCKET_ENTRY_SIZE))
    }

    pub fn queue_cells(&self) -> &[QueueCell] {
        // SAFETY: slot_count cells of 8 bytes start at queue_offset (see Layout::new).
        unsafe {
            core::slice::from_raw_parts(
                self.base.add(self.layout.queue_offset as usize) as *const QueueCell,
                self.layout.slot_count as usize,
            )
        }
    }

    pub fn attention(&self) -> &[AtomicU64] {
        // SAFETY: attention_words() u64 words start at attention_offset.
        unsafe {
            core::slice::from_raw_parts(
                self.base.add(self.layout.attention_offset as usize) as *const AtomicU64,
                self.layout.attention_words(),
            )
        }
    }

    /// Marks a socket as needing the host's attention (new tx data, or rx space freed
    /// after RX_WANT_SPACE). Returns false for an index out of range.
    pub fn raise_attention(&self, index: u32) -> bool {
        let words = self.attention();
        let w = (index / 64) as usize;
        if w >= words.len() || index >= self.layout.socket_count {
            return false;
        }
        // A1: Release orders the ring index stores before the bit; pairs with the
        // host's Acquire swap (A2).
        words[w].fetch_or(1 << (index % 64), Ordering::Release);
        true
    }

    /// Ring storage at `offset` (relative to the data area) of `size` bytes, if it
    /// lies inside the data area and `size` is a power of two.
    pub fn ring(&self, offset: u64, size: u64) -> Option<RawRing> {
        if size == 0 || !size.is_power_of_two() {
            return None;
        }
        let end = offset.checked_add(size)?;
        if end > self.layout.data_size {
            return None;
        }
        // SAFETY: offset..offset+size lies inside the data area (checked), which is
        // mapped for the life of the view; size is a power of two.
        Some(unsafe {
            RawRing::new(
                self.base.add((self.layout.data_offset + offset) as usize),
                size,
            )
        })
    }
}

/// The receive-room handshake (protocol §3.5), the guest's half: after it released
/// receive room (its tail store), whether the host asked for room (RX_WANT_SPACE in
/// the entry's `flags`); then it raises the socket's attention. Dekker with the host,
/// which sets the flag, fences and re-reads the tail: the fence between the guest's
/// tail store and this load means one of the two sees the other's store. Without it
/// the load may pass the store (x86's store buffer does so), and a host that found no
/// room and a guest that saw no flag both wait — a listener whose queued clients are
/// never accepted, a stream whose received bytes never move.
#[inline]
pub fn room_asked_after_release(flags: &AtomicU32) -> bool {
    crate::sync::fence(Ordering::SeqCst);
    flags.load(Ordering::Relaxed) & crate::consts::sock_flag::RX_WANT_SPACE != 0
}

/// Keeps the atomics imported for cfg(loom) builds where some go unused.
#[allow(dead_code)]
fn _uses(_: &AtomicI64) {}
