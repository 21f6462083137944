//! The descriptor table: which process descriptors are canal sockets.
//!
//! A fixed array indexed by descriptor number, so a call on an ordinary descriptor costs
//! one bounds check and one relaxed load before the real libc function. Each canal
//! socket is backed by a real *dummy descriptor* (an AF_UNIX datagram socket), so numbers
//! never collide with the application's; the table maps the dummy's number to the
//! socket handle. Per-socket state shared by dup/fork lives in the region's socket
//! entry (guest line), not here.

use core::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Entry tags (bits 32..40 of a table word); 0 means "not ours".
const TAG_CANAL: u64 = 1 << 32;
const TAG_INTERNAL: u64 = 2 << 32;
const TAG_EPOLL: u64 = 3 << 32;
const TAG_BRIDGED: u64 = 4 << 32;
const TAG_UNDECIDED: u64 = 5 << 32;
const TAG_MASK: u64 = 0xff << 32;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Entry {
    /// A canal socket with this handle.
    Canal(u32),
    /// One of the library's own descriptors (control socket, eventfds).
    Internal,
    /// An epoll instance that watches canal sockets (`epoll.rs`).
    Epoll,
    /// A kernel socket that carries canal socket `handle`'s data through a bridge
    /// (bridge.rs): data calls go to the kernel, control calls to canal.
    Bridged(u32),
    /// A kernel socket the program made that may still become canal's at its first
    /// bind, listen, connect or send (`direct.rs`); the word is its `direct::Kind`.
    Undecided(u32),
}

pub(crate) struct FdTable<const N: usize> {
    words: [AtomicU64; N],
    /// One past the highest descriptor ever installed (bounds scans, e.g. at fork).
    high: AtomicUsize,
}

impl<const N: usize> FdTable<N> {
    pub(crate) const fn new() -> Self {
        FdTable {
            words: [const { AtomicU64::new(0) }; N],
            high: AtomicUsize::new(0),
        }
    }

    pub(crate) const fn capacity(&self) -> usize {
        N
    }

    /// The fast path: one bounds check and one load.
    #[inline(always)]
    pub(crate) fn raw(&self, fd: i32) -> u64 {
        match self.words.get(fd as u32 as usize) {
            Some(w) => w.load(Ordering::Relaxed),
            None => 0,
        }
    }

    #[inline]
    pub(crate) fn decode(word: u64) -> Option<Entry> {
        match word & TAG_MASK {
            TAG_CANAL => Some(Entry::Canal(word as u32)),
            TAG_INTERNAL => Some(Entry::Internal),
            TAG_EPOLL => Some(Entry::Epoll),
            TAG_BRIDGED => Some(Entry::Bridged(word as u32)),
            TAG_UNDECIDED => Some(Entry::Undecided(word as u32)),
            _ => None,
        }
    }

    #[inline]
    pub(crate) fn get(&self, fd: i32) -> Option<Entry> {
        Self::decode(self.raw(fd))
    }

    /// The handle if `fd` is a canal socket.
    #[inline]
    pub(crate) fn handle(&self, fd: i32) -> Option<u32> {
        match self.get(fd) {
            Some(Entry::Canal(h)) => Some(h),
            _ => None,
        }
    }

    fn store(&self, fd: i32, word: u64) -> Result<Option<Entry>, i32> {
        let i = fd as u32 as usize;
        let w = self.words.get(i).ok_or(libc::EMFILE)?;
        self.high.fetch_max(i + 1, Ordering::Relaxed);
        Ok(Self::decode(w.swap(word, Ordering::AcqRel)))
    }

    /// Marks `fd` as a canal socket; returns what was there (normally nothing).
    pub(crate) fn set_canal(&self, fd: i32, handle: u32) -> Result<Option<Entry>, i32> {
        self.store(fd, TAG_CANAL | handle as u64)
    }

    pub(crate) fn set_internal(&self, fd: i32) -> Result<Option<Entry>, i32> {
        self.store(fd, TAG_INTERNAL)
    }

    /// Marks `fd` as the kernel end of a bridge for canal socket `handle`.
    pub(crate) fn set_bridged(&self, fd: i32, handle: u32) -> Result<Option<Entry>, i32> {
        self.store(fd, TAG_BRIDGED | handle as u64)
    }

    /// Marks `fd` as an undecided kernel socket of kind `kind` (`direct.rs`).
    pub(crate) fn set_undecided(&self, fd: i32, kind: u32) -> Result<Option<Entry>, i32> {
        self.store(fd, TAG_UNDECIDED | kind as u64)
    }

    /// Marks `fd` as an epoll instance watching canal sockets.
    pub(crate) fn set_epoll(&self, fd: i32) -> Result<Option<Entry>, i32> {
        self.store(fd, TAG_EPOLL)
    }

    /// Forgets `fd`; returns what was there.
    pub(crate) fn take(&self, fd: i32) -> Option<Entry> {
        let w = self.words.get(fd as u32 as usize)?;
        Self::decode(w.swap(0, Ordering::AcqRel))
    }

    /// One past the highest descriptor ever installed.
    pub(crate) fn high_water(&self) -> usize {
        self.high.load(Ordering::Relaxed).min(N)
    }

    /// Whether any descriptor is a canal socket or a bridged one.
    pub(crate) fn any_socket(&self) -> bool {
        let high = self.high.load(Ordering::Relaxed).min(N);
        self.words[..high].iter().any(|w| {
            matches!(
                Self::decode(w.load(Ordering::Relaxed)),
                Some(Entry::Canal(_) | Entry::Bridged(_))
            )
        })
    }

    /// Calls `f(fd, handle)` for every canal descriptor.
    pub(crate) fn for_each_canal(&self, mut f: impl FnMut(i32, u32)) {
        let high = self.high.load(Ordering::Relaxed).min(N);
        for (fd, w) in self.words[..high].iter().enumerate() {
            if let Some(Entry::Canal(h)) = Self::decode(w.load(Ordering::Relaxed)) {
                f(fd as i32, h);
            }
        }
    }
}

impl<const N: usize> Default for FdTable<N> {
    fn default() -> Self {
        Self::new()
    }
}

/// Descriptor numbers the process table covers: the kernel's ceiling (`nr_open`
/// default). The array is 8 MiB of zero pages in .bss; only touched pages cost memory.
pub(crate) const TABLE_LEN: usize = 1 << 20;

pub(crate) static TABLE: FdTable<TABLE_LEN> = FdTable::new();

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_get_take() {
        let t: FdTable<16> = FdTable::new();
        assert_eq!(t.get(3), None);
        assert_eq!(t.set_canal(3, 0x1_0005).unwrap(), None);
        assert_eq!(t.get(3), Some(Entry::Canal(0x1_0005)));
        assert_eq!(t.handle(3), Some(0x1_0005));
        // Handle 0 is still a canal entry (tag, not value, marks it).
        t.set_canal(4, 0).unwrap();
        assert_eq!(t.handle(4), Some(0));
        t.set_epoll(6).unwrap();
        assert_eq!(t.get(6), Some(Entry::Epoll));
        assert_eq!(t.handle(6), None);
        t.set_internal(5).unwrap();
        assert_eq!(t.get(5), Some(Entry::Internal));
        t.set_bridged(7, 0x2_0003).unwrap();
        assert_eq!(t.get(7), Some(Entry::Bridged(0x2_0003)));
        assert_eq!(t.handle(7), None);
        assert_eq!(t.handle(5), None);
        assert_eq!(t.take(3), Some(Entry::Canal(0x1_0005)));
        assert_eq!(t.get(3), None);
        assert_eq!(t.take(3), None);
    }

    #[test]
    fn out_of_range() {
        let t: FdTable<4> = FdTable::new();
        assert_eq!(t.get(-1), None);
        assert_eq!(t.get(4), None);
        assert_eq!(t.get(i32::MAX), None);
        assert_eq!(t.set_canal(4, 1), Err(libc::EMFILE));
        assert_eq!(t.set_canal(-1, 1), Err(libc::EMFILE));
        assert_eq!(t.take(9), None);
    }

    #[test]
    fn scan_bounded_by_high_water() {
        let t: FdTable<64> = FdTable::new();
        t.set_canal(7, 70).unwrap();
        t.set_internal(8).unwrap();
        t.set_canal(9, 90).unwrap();
        let mut seen = vec![];
        t.for_each_canal(|fd, h| seen.push((fd, h)));
        assert_eq!(seen, vec![(7, 70), (9, 90)]);
        assert_eq!(t.high.load(Ordering::Relaxed), 10);
    }
}
