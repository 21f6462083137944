//! Host-side allocator for a guest's data area. Rings are powers of two of at least
//! one chunk (64 KiB); a block of `2^k` chunks is placed at a chunk index that is a
//! multiple of `2^k` (buddy-style alignment), which keeps fragmentation bounded
//! without free lists. The allocator lives in host memory only: the guest never sees
//! or influences it except by asking for sockets, so its state cannot be corrupted.
#![forbid(unsafe_code)]

use canal_abi::DATA_CHUNK;

pub(crate) struct DataAlloc {
    /// One bit per chunk, set = in use.
    used: Vec<u64>,
    chunks: u64,
    free_chunks: u64,
    /// Allocated blocks: offset → size (frees must name exactly one).
    blocks: std::collections::HashMap<u64, u64>,
}

impl DataAlloc {
    pub(crate) fn new(data_size: u64) -> DataAlloc {
        let chunks = data_size / DATA_CHUNK;
        DataAlloc {
            used: vec![0; chunks.div_ceil(64) as usize],
            chunks,
            free_chunks: chunks,
            blocks: Default::default(),
        }
    }

    fn bit(&self, i: u64) -> bool {
        self.used[(i / 64) as usize] & (1 << (i % 64)) != 0
    }

    fn set(&mut self, i: u64, v: bool) {
        let w = &mut self.used[(i / 64) as usize];
        if v {
            *w |= 1 << (i % 64);
        } else {
            *w &= !(1 << (i % 64));
        }
    }

    /// Allocates `size` bytes (a power of two ≥ DATA_CHUNK); returns the offset into
    /// the data area.
    pub(crate) fn alloc(&mut self, size: u64) -> Option<u64> {
        if size < DATA_CHUNK || !size.is_power_of_two() {
            return None;
        }
        let n = size / DATA_CHUNK;
        if n > self.free_chunks {
            return None;
        }
        let mut start = 0;
        while start + n <= self.chunks {
            match (start..start + n).find(|&i| self.bit(i)) {
                None => {
                    for i in start..start + n {
                        self.set(i, true);
                    }
                    self.free_chunks -= n;
                    self.blocks.insert(start * DATA_CHUNK, size);
                    return Some(start * DATA_CHUNK);
                }
                // Skip to the next aligned start past the used chunk.
                Some(used) => start = (used / n + 1) * n,
            }
        }
        None
    }

    /// Frees a block returned by `alloc`. Returns false (and changes nothing) if the
    /// block is not exactly an allocated one (a bug, never guest input).
    pub(crate) fn free(&mut self, offset: u64, size: u64) -> bool {
        if self.blocks.get(&offset) != Some(&size) {
            return false;
        }
        self.blocks.remove(&offset);
        let (s, n) = (offset / DATA_CHUNK, size / DATA_CHUNK);
        for i in s..s + n {
            self.set(i, false);
        }
        self.free_chunks += n;
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
}
