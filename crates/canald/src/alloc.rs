//! Host-side allocator for a guest's data area: a buddy allocator over 64 KiB chunks.
//! Rings are powers of two of at least one chunk; a block of `2^k` chunks starts at a
//! chunk index that is a multiple of `2^k`, and a freed block merges with its free
//! buddy. Free blocks are kept per order in address order, so allocation and free cost
//! O(log n) whatever the area's size (a sparse area holds every socket of a 65,535-
//! entry table) and the lowest addresses are reused first (fewer pages committed).
//! The allocator lives in host memory only: the guest never sees or influences it
//! except by asking for sockets, so its state cannot be corrupted.
#![forbid(unsafe_code)]

use canal_abi::DATA_CHUNK;
use std::collections::{BTreeSet, HashMap};

pub(crate) struct DataAlloc {
    /// free[k]: start chunks of free blocks of 2^k chunks.
    free: Vec<BTreeSet<u64>>,
    free_chunks: u64,
    /// Allocated blocks: start chunk → order (frees must name exactly one).
    blocks: HashMap<u64, u32>,
}

impl DataAlloc {
    pub(crate) fn new(data_size: u64) -> DataAlloc {
        let chunks = data_size / DATA_CHUNK;
        let orders = (64 - chunks.leading_zeros()).max(1) as usize;
        let mut a = DataAlloc {
            free: vec![BTreeSet::new(); orders],
            free_chunks: chunks,
            blocks: HashMap::new(),
        };
        // The area as the largest aligned blocks that fit.
        let mut start = 0;
        while start < chunks {
            let mut k = if start == 0 {
                orders as u32 - 1
            } else {
                start.trailing_zeros()
            };
            while start + (1 << k) > chunks {
                k -= 1;
            }
            a.free[k as usize].insert(start);
            start += 1 << k;
        }
        a
    }

    /// Allocates `size` bytes (a power of two ≥ DATA_CHUNK); returns the offset into
    /// the data area.
    pub(crate) fn alloc(&mut self, size: u64) -> Option<u64> {
        if size < DATA_CHUNK || !size.is_power_of_two() {
            return None;
        }
        let want = (size / DATA_CHUNK).trailing_zeros() as usize;
        let k = (want..self.free.len()).find(|&k| !self.free[k].is_empty())?;
        let start = self.free[k].pop_first()?;
        // Split down to the wanted order; the upper halves stay free.
        for j in (want..k).rev() {
            self.free[j].insert(start + (1 << j));
        }
        self.blocks.insert(start, want as u32);
        self.free_chunks -= 1 << want;
        Some(start * DATA_CHUNK)
    }

    /// Frees a block returned by `alloc`. Returns false (and changes nothing) if the
    /// block is not exactly an allocated one (a bug, never guest input).
    pub(crate) fn free(&mut self, offset: u64, size: u64) -> bool {
        let start = offset / DATA_CHUNK;
        let k = match self.blocks.get(&start) {
            Some(&k) if offset.is_multiple_of(DATA_CHUNK) && size == DATA_CHUNK << k => k as usize,
            _ => return false,
        };
        self.blocks.remove(&start);
        self.free_chunks += 1 << k;
        let (mut start, mut k) = (start, k);
        // Merge with the free buddy while there is one.
        while k + 1 < self.free.len() && self.free[k].remove(&(start ^ (1 << k))) {
            start &= !(1 << k);
            k += 1;
        }
        self.free[k].insert(start);
        true
    }

    pub(crate) fn free_bytes(&self) -> u64 {
        self.free_chunks * DATA_CHUNK
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    const C: u64 = DATA_CHUNK;

    #[test]
    fn alloc_aligned_and_exhausts() {
        let mut a = DataAlloc::new(16 * C);
        let x = a.alloc(4 * C).unwrap();
        let y = a.alloc(4 * C).unwrap();
        assert_eq!(x, 0);
        assert_eq!(y, 4 * C);
        let z = a.alloc(C).unwrap();
        assert_eq!(z, 8 * C);
        // A 4-chunk block must start at a multiple of 4 chunks: 12.
        assert_eq!(a.alloc(4 * C), Some(12 * C));
        assert_eq!(a.alloc(4 * C), None);
        assert_eq!(a.free_bytes(), 3 * C);
        assert!(a.alloc(2 * C).is_some()); // chunks 10..12
        assert!(a.alloc(C).is_some()); // chunk 9
        assert_eq!(a.alloc(C), None);
        assert_eq!(a.free_bytes(), 0);
    }

    #[test]
    fn free_and_reuse() {
        let mut a = DataAlloc::new(8 * C);
        let x = a.alloc(4 * C).unwrap();
        let y = a.alloc(4 * C).unwrap();
        assert!(a.alloc(C).is_none());
        assert!(a.free(x, 4 * C));
        assert!(!a.free(x, 4 * C), "double free refused");
        assert!(!a.free(y + C, C * 2), "misaligned/partial free refused");
        assert_eq!(a.alloc(4 * C), Some(x));
        assert!(a.free(y, 4 * C));
        assert_eq!(a.free_bytes(), 4 * C);
    }

    #[test]
    fn rejects_bad_sizes() {
        let mut a = DataAlloc::new(8 * C);
        assert_eq!(a.alloc(0), None);
        assert_eq!(a.alloc(3 * C), None);
        assert_eq!(a.alloc(C / 2), None);
        assert_eq!(a.alloc(16 * C), None);
        assert!(!a.free(8 * C, C));
        assert!(!a.free(u64::MAX - C + 1, C));
    }

    #[test]
    fn merges_back_and_never_overlaps() {
        // A non-power-of-two area, random churn of mixed sizes: blocks never overlap,
        // the count of free bytes stays exact, and freeing everything merges the area
        // back into blocks as large as at the start.
        let chunks = 1000;
        let mut a = DataAlloc::new(chunks * C);
        let mut live: Vec<(u64, u64)> = Vec::new();
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..20_000 {
            if next() % 3 != 0 {
                let size = C << (next() % 5);
                if let Some(off) = a.alloc(size) {
                    assert_eq!(off % size, 0, "aligned to its size");
                    assert!(off + size <= chunks * C);
                    assert!(live.iter().all(|&(o, s)| off + size <= o || o + s <= off));
                    live.push((off, size));
                }
            } else if !live.is_empty() {
                let (o, s) = live.swap_remove((next() % live.len() as u64) as usize);
                assert!(a.free(o, s));
            }
            let used: u64 = live.iter().map(|&(_, s)| s).sum();
            assert_eq!(a.free_bytes() + used, chunks * C);
        }
        for (o, s) in live.drain(..) {
            assert!(a.free(o, s));
        }
        assert_eq!(a.alloc(512 * C), Some(0));
        assert_eq!(a.alloc(256 * C), Some(512 * C));
    }
}
