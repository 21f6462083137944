//! A connected stream's two names as canald reports them final (protocol §4 Names),
//! and the slot a guest process keeps them in.
//!
//! A connected TCP socket's local and peer names cannot change while the connection
//! lasts (a canal stream cannot be disconnected and connected again), so canald hands
//! them over once — in the ACCEPT record, or as a 64-byte answer to GETSOCKNAME or
//! GETPEERNAME — and getsockname/getpeername then need no round trip. The slot is a
//! sequence lock over plain words: a reader (possibly a signal handler that
//! interrupted the writer) gets one writer's complete pair or nothing, and then asks
//! canald; a writer that finds another one busy gives up (the pair is only a cache).
use crate::addr::{CanalAddr, ADDR_SIZE};
use crate::sync::{fence, AtomicU32, AtomicU64, Ordering};

/// Bytes of a names pair on the wire: the local name, then the peer's.
pub const NAMES_SIZE: usize = 2 * ADDR_SIZE;

/// An ACCEPT record's address section with names (minor 13): the peer as accept(2)
/// returns it (what every reader takes), then the accepted socket's names pair.
pub const ACCEPT_ADDR_NAMED: usize = ADDR_SIZE + NAMES_SIZE;

pub fn encode(local: &CanalAddr, peer: &CanalAddr) -> [u8; NAMES_SIZE] {
    let mut b = [0u8; NAMES_SIZE];
    b[..ADDR_SIZE].copy_from_slice(&local.encode());
    b[ADDR_SIZE..].copy_from_slice(&peer.encode());
    b
}

/// (local, peer), if both decode.
pub fn decode(b: &[u8]) -> Option<(CanalAddr, CanalAddr)> {
    if b.len() < NAMES_SIZE {
        return None;
    }
    Some((
        CanalAddr::decode(&b[..ADDR_SIZE])?,
        CanalAddr::decode(&b[ADDR_SIZE..NAMES_SIZE])?,
    ))
}

const WORDS: usize = NAMES_SIZE / 8;

/// One socket's names in a process: `key` (the socket's handle, never 0) says whose.
pub struct NameSlot {
    /// Even: stable; odd: a writer is inside.
    seq: AtomicU32,
    key: AtomicU32,
    words: [AtomicU64; WORDS],
}

impl NameSlot {
    #[cfg(not(loom))]
    pub const fn new() -> NameSlot {
        NameSlot {
            seq: AtomicU32::new(0),
            key: AtomicU32::new(0),
            words: [const { AtomicU64::new(0) }; WORDS],
        }
    }

    #[cfg(loom)]
    pub fn new() -> NameSlot {
        NameSlot {
            seq: AtomicU32::new(0),
            key: AtomicU32::new(0),
            words: core::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    /// Keeps `bytes` for `key`; false if another writer was inside (nothing changed).
    pub fn store(&self, key: u32, bytes: &[u8; NAMES_SIZE]) -> bool {
        let Some(s) = self.enter() else {
            return false;
        };
        self.key.store(key, Ordering::Relaxed);
        for (w, c) in self.words.iter().zip(bytes.chunks_exact(8)) {
            let mut v = [0u8; 8];
            v.copy_from_slice(c);
            w.store(u64::from_le_bytes(v), Ordering::Relaxed);
        }
        self.seq.store(s.wrapping_add(2), Ordering::Release);
        true
    }

    /// Forgets the pair if it is `key`'s: the process takes a new socket under a
    /// handle an old one had (the generation wrapped). Waits for a writer inside, so
    /// that the old pair does not survive — but not for ever: a writer interrupted by
    /// a signal handler that forgets would never leave, and a writer's pair is a
    /// current answer for its handle anyway.
    pub fn forget(&self, key: u32) {
        for _ in 0..1 << 16 {
            if self.key.load(Ordering::Relaxed) != key {
                return;
            }
            if let Some(s) = self.enter() {
                if self.key.load(Ordering::Relaxed) == key {
                    self.key.store(0, Ordering::Relaxed);
                }
                self.seq.store(s.wrapping_add(2), Ordering::Release);
                return;
            }
            crate::sync::spin_hint();
        }
    }

    /// `key`'s pair, if the slot holds it and no writer was inside meanwhile.
    pub fn load(&self, key: u32) -> Option<[u8; NAMES_SIZE]> {
        let s1 = self.seq.load(Ordering::Acquire);
        if s1 & 1 != 0 || key == 0 {
            return None;
        }
        let k = self.key.load(Ordering::Relaxed);
        let mut out = [0u8; NAMES_SIZE];
        for (w, c) in self.words.iter().zip(out.chunks_exact_mut(8)) {
            c.copy_from_slice(&w.load(Ordering::Relaxed).to_le_bytes());
        }
        // The words' loads before the second look at the sequence.
        fence(Ordering::Acquire);
        if self.seq.load(Ordering::Relaxed) != s1 || k != key {
            return None;
        }
        Some(out)
    }

    /// Makes the sequence odd (this writer is inside) and returns the even value it
    /// had; None if another writer was inside. The writer leaves by storing it + 2.
    fn enter(&self) -> Option<u32> {
        let s = self.seq.load(Ordering::Relaxed);
        if s & 1 != 0 {
            return None;
        }
        self.seq
            .compare_exchange(s, s.wrapping_add(1), Ordering::Acquire, Ordering::Relaxed)
            .ok()?;
        // Acquire above: the previous writer's words come before ours (else a later
        // reader could see some of each). The odd sequence before the words: a reader
        // that sees a word of this writer sees the sequence move.
        fence(Ordering::Release);
        Some(s)
    }
}

#[cfg(not(loom))]
impl Default for NameSlot {
    fn default() -> Self {
        NameSlot::new()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn pair(port: u16) -> [u8; NAMES_SIZE] {
        encode(
            &CanalAddr::v4([127, 0, 0, 1], port),
            &CanalAddr::v4([127, 0, 0, 2], port + 1),
        )
    }

    #[test]
    fn a_pair_is_found_only_under_its_key() {
        let s = NameSlot::new();
        assert_eq!(s.load(7), None);
        assert!(s.store(7, &pair(80)));
        assert_eq!(s.load(7), Some(pair(80)));
        assert_eq!(s.load(8), None);
        assert_eq!(s.load(0), None);
        let (l, p) = decode(&s.load(7).unwrap()).unwrap();
        assert_eq!((l.port, p.port), (80, 81));
    }

    #[test]
    fn forget_drops_only_its_own_key() {
        let s = NameSlot::new();
        assert!(s.store(7, &pair(80)));
        s.forget(9);
        assert_eq!(s.load(7), Some(pair(80)));
        s.forget(7);
        assert_eq!(s.load(7), None);
        assert!(s.store(9, &pair(90)));
        assert_eq!(s.load(9), Some(pair(90)));
    }

    #[test]
    fn a_writer_inside_makes_readers_and_other_writers_miss() {
        let s = NameSlot::new();
        assert!(s.store(7, &pair(80)));
        let inside = s.enter().unwrap();
        assert_eq!(s.load(7), None);
        assert!(!s.store(7, &pair(90)));
        s.seq.store(inside.wrapping_add(2), Ordering::Release);
        assert_eq!(s.load(7), Some(pair(80)));
    }

    #[test]
    fn garbage_does_not_decode() {
        assert_eq!(decode(&[0xff; NAMES_SIZE]), None);
        assert_eq!(decode(&[0; 10]), None);
    }
}
