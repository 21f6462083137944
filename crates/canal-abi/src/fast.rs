//! Fast connects (protocol §8.10, minor 22, feature FAST_CONNECT): a guest connects
//! to a canal listener it reached before without a request and without waiting for
//! canald.
//!
//! canald keeps, in the guest's own region header, a small table of the listeners
//! the guest connected to ring to ring. Each record holds a few *tickets*, each a
//! connection prepared ahead: a slot of the two guests' pair arena with its header
//! written, and a reserved local port. A connect to a listed address claims a ticket
//! with one compare-and-swap, writes its own entry as canald would have (the segment
//! fields, CONNECTED), leaves a *mark* in the entry and raises the entry's attention
//! bit: connect() returns at once. canald then does what it does for a CONNECT (the
//! accepted entry, the ACCEPT record, the acceptor's wake-up), off the connector's
//! path, and gives the record a fresh ticket.
//!
//! A record's `state` word is `seq << 32 | ready`: `ready` has bit *i* set while
//! ticket *i* may be claimed; `seq` is even while the record is valid, and canald adds
//! to it on every change it makes (a refill, a withdrawal), so a claim — a CAS of the
//! whole word — fails if the record changed after the claimer read it. A ticket's
//! fields are written before its bit is set and never again until canald has seen
//! its mark (or the guest left), so a claimer reads them after its claim.
//!
//! Everything here is in the guest's region: canald writes it, the guest reads it and
//! clears `ready` bits; canald trusts nothing of it (a mark names a ticket canald
//! granted, or canald resets that socket).
use crate::addr::CanalAddr;
use crate::sync::{AtomicU32, AtomicU64, Ordering};

/// Byte offset of the table in the region header page.
pub const TABLE_OFFSET: u64 = 1024;
/// Records in the table.
pub const RECORDS: usize = 16;
/// Tickets per record.
pub const TICKETS: usize = 4;
/// Bytes per record.
pub const RECORD_SIZE: u64 = 128;

/// One connection prepared ahead (24 bytes): a packed arena's slot (§8.7) and a
/// reserved local port. The connector copies the first five into its entry as
/// canald would have written them for a connector (segment side 0).
#[repr(C)]
#[derive(Debug)]
pub struct Ticket {
    /// The pair arena holding the segment.
    pub arena: AtomicU32,
    /// The segment's header offset in the arena.
    pub arena_offset: AtomicU32,
    /// The segment's id (never 0): the entry's `segment`, and the mark.
    pub segment: AtomicU32,
    /// Ring 0's offset counted from the segment's header (ring 1 follows it).
    pub rings: AtomicU32,
    /// Each ring's size.
    pub ring_size: AtomicU32,
    /// The reserved local port (host byte order).
    pub port: AtomicU32,
}

/// One listener the guest may connect to fast (128 bytes).
#[repr(C)]
#[derive(Debug)]
pub struct Record {
    /// `seq << 32 | ready` (module comment).
    pub state: AtomicU64,
    /// The destination as the guest connects to it: family, port (host order) and
    /// address bytes (4 for AF_INET, 16 for AF_INET6).
    pub family: AtomicU32,
    pub port: AtomicU32,
    pub addr: [AtomicU32; 4],
    pub tickets: [Ticket; TICKETS],
}

/// The local address a ticket's connection of record *i* has, as the guest sees it
/// (16 bytes, at `SOURCES_OFFSET` + 16·*i*): all zero, the destination's address
/// (a guest in canald's network); else the guest network's own address the
/// connection speaks from (a guest with a network view: 10.0.2.15 toward the host).
/// Written with the record's destination, while it is withdrawn.
#[repr(C)]
#[derive(Debug)]
pub struct Source {
    pub addr: [AtomicU32; 4],
}

/// Byte offset of the sources (right after the records).
pub const SOURCES_OFFSET: u64 = TABLE_OFFSET + RECORDS as u64 * RECORD_SIZE;

/// The table at `TABLE_OFFSET` of the region header: the records, then their
/// sources.
#[repr(C)]
#[derive(Debug)]
pub struct Table {
    pub records: [Record; RECORDS],
    pub sources: [Source; RECORDS],
}

impl Source {
    /// The local name of a connection to `dst` from `port`: this source's address,
    /// or the destination's when it is all zero.
    pub fn local_name(&self, dst: &CanalAddr, port: u16) -> CanalAddr {
        let mut a = *dst;
        a.port = port;
        let bytes = load_addr(&self.addr);
        if bytes != [0; 16] {
            a.addr = bytes;
            a.flowinfo = 0;
            a.scope_id = 0;
        }
        a
    }

    /// canald (between `withdraw` and `publish` of its record): the local address
    /// (None: the destination's).
    pub fn set(&self, local: Option<&CanalAddr>) {
        store_addr(&self.addr, &local.map_or([0; 16], |a| a.addr));
    }
}

/// 16 address bytes kept as four little-endian words (a record's destination, a
/// source), read Relaxed: a claim's CAS or the record's withdrawal orders them.
fn load_addr(words: &[AtomicU32; 4]) -> [u8; 16] {
    let mut bytes = [0u8; 16];
    for (i, w) in words.iter().enumerate() {
        bytes[i * 4..i * 4 + 4].copy_from_slice(&w.load(Ordering::Relaxed).to_le_bytes());
    }
    bytes
}

fn store_addr(words: &[AtomicU32; 4], bytes: &[u8; 16]) {
    for (i, w) in words.iter().enumerate() {
        let mut b = [0u8; 4];
        b.copy_from_slice(&bytes[i * 4..i * 4 + 4]);
        w.store(u32::from_le_bytes(b), Ordering::Relaxed);
    }
}

/// The `state` word of sequence `seq` with `ready` bits.
pub const fn state(seq: u32, ready: u32) -> u64 {
    ((seq as u64) << 32) | ready as u64
}

/// The sequence of a `state` word.
pub const fn seq_of(state: u64) -> u32 {
    (state >> 32) as u32
}

/// The ready bits of a `state` word.
pub const fn ready_of(state: u64) -> u32 {
    state as u32 & ((1 << TICKETS) - 1)
}

/// Whether a record with this state is valid (written and not withdrawn).
pub const fn valid(state: u64) -> bool {
    let s = seq_of(state);
    s != 0 && s & 1 == 0
}

impl Record {
    /// Guest: claims a ready ticket of this record if `matches` (reading the record's
    /// destination) says it is the one wanted, and returns its index with what `read`
    /// took from the ticket. Both read between the state's load and the claim's CAS,
    /// which fails if the record changed meanwhile (canald moves `seq` with every
    /// change it makes, and writes a ticket only while its bit is clear): a successful
    /// claim vouches for what was read. A failed CAS looks again.
    pub fn claim<T>(
        &self,
        mut matches: impl FnMut(&Record) -> bool,
        read: impl Fn(&Ticket) -> T,
    ) -> Option<(usize, T)> {
        loop {
            let s = self.state.load(Ordering::Acquire);
            let ready = ready_of(s);
            if !valid(s) || ready == 0 || !matches(self) {
                return None;
            }
            let i = ready.trailing_zeros() as usize;
            let got = read(&self.tickets[i]);
            let next = s & !(1u64 << i);
            if self
                .state
                .compare_exchange(s, next, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return Some((i, got));
            }
        }
    }

    /// canald: makes the record invalid (odd sequence, nothing ready) and returns the
    /// bits that were still ready — tickets nobody claimed. The sequence it leaves is
    /// `returned seq + 1`.
    pub fn withdraw(&self) -> (u32, u32) {
        let mut s = self.state.load(Ordering::Acquire);
        loop {
            let seq = seq_of(s);
            let odd = if seq & 1 == 0 {
                seq.wrapping_add(1)
            } else {
                seq
            };
            match self
                .state
                .compare_exchange(s, state(odd, 0), Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return (odd, ready_of(s)),
                Err(now) => s = now,
            }
        }
    }

    /// canald: after `withdraw` and its writes, makes the record valid again with
    /// `ready` bits (the fields written before this Release store).
    pub fn publish(&self, odd_seq: u32, ready: u32) {
        let even = odd_seq.wrapping_add(1).max(2);
        self.state.store(state(even, ready), Ordering::Release);
    }

    /// The destination the record names.
    pub fn destination(&self) -> CanalAddr {
        CanalAddr {
            family: self.family.load(Ordering::Relaxed) as u16,
            port: self.port.load(Ordering::Relaxed) as u16,
            addr: load_addr(&self.addr),
            ..Default::default()
        }
    }

    /// canald (between `withdraw` and `publish`): writes the destination.
    pub fn set_destination(&self, a: &CanalAddr) {
        self.family.store(a.family as u32, Ordering::Relaxed);
        self.port.store(a.port as u32, Ordering::Relaxed);
        store_addr(&self.addr, &a.addr);
    }
}

/// The mark a fast connect leaves in its entry (`SocketEntry::fast_ticket`): the
/// record and ticket it claimed, plus one (0: none).
pub const fn mark(record: usize, ticket: usize) -> u32 {
    ((record * TICKETS + ticket) as u32) + 1
}

/// The (record, ticket) a mark names, if it names one.
pub const fn unmark(mark: u32) -> Option<(usize, usize)> {
    if mark == 0 || mark as usize > RECORDS * TICKETS {
        return None;
    }
    let n = (mark - 1) as usize;
    Some((n / TICKETS, n % TICKETS))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> Box<Record> {
        // SAFETY: a Record is integers and atomics; all zeros is valid.
        Box::new(unsafe { core::mem::zeroed() })
    }

    #[test]
    fn layout() {
        assert_eq!(core::mem::size_of::<Ticket>(), 24);
        assert_eq!(core::mem::size_of::<Record>() as u64, RECORD_SIZE);
        assert_eq!(core::mem::offset_of!(Record, tickets), 32);
        assert_eq!(
            core::mem::offset_of!(Table, sources) as u64,
            SOURCES_OFFSET - TABLE_OFFSET
        );
        // Inside the region header's 4096-byte page.
        assert!(TABLE_OFFSET + core::mem::size_of::<Table>() as u64 <= 4096);
    }

    #[test]
    fn claims_follow_the_state() {
        let r = record();
        assert_eq!(
            r.claim(|_| true, |_| ()).map(|(i, _)| i),
            None,
            "never published"
        );
        let (odd, ready) = r.withdraw();
        assert_eq!((odd, ready), (1, 0));
        r.publish(odd, 0b0101);
        assert_eq!(
            r.claim(|_| false, |_| ()).map(|(i, _)| i),
            None,
            "not the wanted destination"
        );
        assert_eq!(r.claim(|_| true, |_| ()).map(|(i, _)| i), Some(0));
        assert_eq!(r.claim(|_| true, |_| ()).map(|(i, _)| i), Some(2));
        assert_eq!(
            r.claim(|_| true, |_| ()).map(|(i, _)| i),
            None,
            "all claimed"
        );
        let (odd, ready) = r.withdraw();
        assert_eq!((odd, ready), (3, 0));
        r.publish(odd, 0b1000);
        let (odd, ready) = r.withdraw();
        assert_eq!(ready, 0b1000, "an unclaimed ticket comes back to canald");
        assert_eq!(r.claim(|_| true, |_| ()).map(|(i, _)| i), None, "withdrawn");
        r.publish(odd, 0b0010);
        assert_eq!(seq_of(r.state.load(Ordering::Relaxed)), 6);
        assert_eq!(r.claim(|_| true, |_| ()).map(|(i, _)| i), Some(1));
    }

    #[test]
    fn a_claim_fails_when_the_record_changed_under_it() {
        let r = record();
        let (odd, _) = r.withdraw();
        r.publish(odd, 0b1);
        // The matcher runs between the load and the CAS: canald rewrites the record
        // there, so the claim must not succeed on the old reading.
        let mut rewrote = false;
        let got = r.claim(
            |rec| {
                if !rewrote {
                    rewrote = true;
                    let (odd, _) = rec.withdraw();
                    rec.publish(odd, 0b1);
                    return true;
                }
                false // the second look sees another destination
            },
            |_| (),
        );
        assert_eq!(got, None);
    }

    #[test]
    fn marks_round_trip() {
        for r in 0..RECORDS {
            for t in 0..TICKETS {
                assert_eq!(unmark(mark(r, t)), Some((r, t)));
            }
        }
        assert_eq!(unmark(0), None);
        assert_eq!(unmark((RECORDS * TICKETS) as u32 + 1), None);
    }

    #[test]
    fn destinations_round_trip() {
        let r = record();
        let mut a = CanalAddr {
            family: 10, // AF_INET6
            port: 8080,
            ..Default::default()
        };
        a.addr[15] = 1;
        r.set_destination(&a);
        assert_eq!(r.destination(), a);
    }

    #[test]
    fn sources_name_the_local_end() {
        // SAFETY: a Source is atomics; all zeros is valid.
        let s: Source = unsafe { core::mem::zeroed() };
        let dst = CanalAddr::v4([10, 0, 2, 2], 8080);
        assert_eq!(
            s.local_name(&dst, 40000),
            CanalAddr::v4([10, 0, 2, 2], 40000)
        );
        s.set(Some(&CanalAddr::v4([10, 0, 2, 15], 0)));
        assert_eq!(
            s.local_name(&dst, 40000),
            CanalAddr::v4([10, 0, 2, 15], 40000)
        );
        s.set(None);
        assert_eq!(s.local_name(&dst, 1), CanalAddr::v4([10, 0, 2, 2], 1));
    }
}
