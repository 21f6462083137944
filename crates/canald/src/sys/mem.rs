//! Shared memory: guest regions and pair segments (memfd, mmap), and returning freed heap.

use canal_abi::ring::RawRing;
use canal_abi::{Layout, Region};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

/// A shared mapping of a memfd (host side: created, sized and sealed here).
pub struct Mapping {
    base: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain shared memory; all accesses go through `Region`, whose
// accessors are atomics or byte copies.
unsafe impl Send for Mapping {}

// SAFETY: `Mapping` itself is only the base and length (never mutated after creation);
// a guest's home and virtual-RSS shadow instances on different workers share it
// through an Arc and access the memory only through `Region` (atomics, byte copies).
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Creates a sealed memfd of `layout.region_size` bytes, maps it and writes the
    /// region header with `Region::init`. Returns the memfd (to send to the guest),
    /// the mapping and the region view.
    pub(crate) fn create_region(
        layout: Layout,
        guest_id: u32,
        features: u64,
    ) -> io::Result<(OwnedFd, Mapping, Region)> {
        let len = usize::try_from(layout.region_size)
            .map_err(|_| io::Error::from_raw_os_error(libc::ENOMEM))?;
        let fd = sealed_memfd("canal-region", layout.region_size, &[])?;
        let map = Mapping::map(&fd, len)?;
        // SAFETY: `map` covers region_size fresh (zeroed: a new memfd) writable bytes,
        // page aligned by mmap, and lives as long as the caller keeps `map`, which it
        // does for as long as it uses the returned Region (the Guest owns both).
        let region = unsafe { Region::init(map.base, layout, guest_id, features) };
        Ok((fd, map, region))
    }

    /// Maps the first `layout.region_size` bytes of a fresh (zero-filled) region file
    /// a hypervisor maps too (a VM guest's region) and writes the header.
    pub(crate) fn init_file_region(
        fd: &OwnedFd,
        layout: Layout,
        guest_id: u32,
        features: u64,
    ) -> io::Result<(Mapping, Region)> {
        let len = usize::try_from(layout.region_size)
            .map_err(|_| io::Error::from_raw_os_error(libc::ENOMEM))?;
        let map = Mapping::map(fd, len)?;
        // SAFETY: `map` covers region_size writable bytes of a file the caller has just
        // created and sized (so zeroed), page aligned by mmap; the caller keeps `map` as
        // long as it uses the returned Region (the Guest owns both).
        let region = unsafe { Region::init(map.base, layout, guest_id, features) };
        Ok((map, region))
    }

    /// Maps `len` bytes of `fd` shared, read/write.
    pub fn map(fd: &OwnedFd, len: usize) -> io::Result<Mapping> {
        // SAFETY: a fresh mapping chosen by the kernel; no existing memory is affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping {
            base: p as *mut u8,
            len,
        })
    }

    /// Guest side (tests): maps a region memfd and validates its header.
    pub fn attach_region(fd: &OwnedFd, len: usize) -> io::Result<(Mapping, Region)> {
        let map = Mapping::map(fd, len)?;
        // SAFETY: `len` bytes are mapped read/write at `map.base` and stay mapped as
        // long as the caller keeps `map` alongside the view.
        let region = unsafe { Region::attach(map.base, len as u64) }
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
        Ok((map, region))
    }

    /// Fills the whole mapping with bytes from `f` (the hostile-guest test).
    pub fn scribble(&self, mut f: impl FnMut() -> u64) {
        let words = self.len / 8;
        let p = self.base as *mut u64;
        for i in 0..words {
            // SAFETY: i < len/8 keeps the write inside the mapping, which is 8-byte
            // aligned (page aligned). Volatile: the memory is shared with another
            // process that reads it concurrently; it holds plain integers.
            unsafe { std::ptr::write_volatile(p.add(i), f()) };
        }
    }

    /// Gives the pages of a freed ring (`size` bytes at data-area offset `off`) back to
    /// the system: MADV_REMOVE punches a hole in the shared file, so the guest's
    /// mapping reads zeros there and neither side keeps the memory. The region is
    /// sparse: pages are committed as rings are written and returned here, never
    /// reserved up front.
    pub(crate) fn release_data(&self, layout: &Layout, off: u64, size: u64) {
        if let Some(start) = layout.data_offset.checked_add(off) {
            self.punch(start, size);
        }
    }

    /// Punches `size` bytes at `start` (page-aligned, inside the mapping; otherwise
    /// nothing happens) out of the shared file: every mapping of it reads zeros there
    /// and the pages go back to the system.
    pub(crate) fn punch(&self, start: u64, size: u64) {
        if size == 0 || start.saturating_add(size) > self.len as u64 || !start.is_multiple_of(4096)
        {
            return;
        }
        // SAFETY: [start, start + size) lies inside this mapping (checked above); the
        // callers punch only memory nobody uses any more (a freed ring or segment),
        // and MADV_REMOVE only replaces its contents with zeros, which both sides
        // may read at any time.
        unsafe {
            libc::madvise(
                self.base.add(start as usize) as *mut libc::c_void,
                size as usize,
                libc::MADV_REMOVE,
            )
        };
    }

    /// The u64 at `off` (8-aligned, inside the mapping; otherwise None), read
    /// atomically: a word of shared memory a guest may be writing (untrusted).
    pub(crate) fn load_u64(&self, off: usize) -> Option<u64> {
        if !off.is_multiple_of(8) || off.checked_add(8)? > self.len {
            return None;
        }
        // SAFETY: off is 8-aligned and inside the mapping (checked); an AtomicU64 over
        // shared memory accepts any bit pattern.
        let w = unsafe { &*(self.base.add(off) as *const std::sync::atomic::AtomicU64) };
        Some(w.load(std::sync::atomic::Ordering::Acquire))
    }

    /// Bytes mapped.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is mapped (never: a mapping has at least a page).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A copy of `n` bytes at `off` (clamped to the mapping; tests read shared memory
    /// with it).
    pub fn read_bytes(&self, off: usize, n: usize) -> Vec<u8> {
        let n = n.min(self.len.saturating_sub(off));
        let mut v = vec![0u8; n];
        // SAFETY: off + n <= len: inside the mapping; plain bytes.
        unsafe { std::ptr::copy_nonoverlapping(self.base.add(off), v.as_mut_ptr(), n) };
        v
    }

    /// Overwrites bytes at `off` (clamped to the mapping).
    pub(crate) fn write_at(&self, off: usize, src: &[u8]) {
        if off >= self.len {
            return;
        }
        let n = src.len().min(self.len - off);
        // SAFETY: off + n <= len: inside the mapping; plain bytes.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.base.add(off), n) };
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: base/len describe a mapping we created and nobody uses any more
        // (the Region views that point into it are dropped with their owner first).
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.len) };
    }
}

// ---- ring I/O ------------------------------------------------------------------

/// Returns free heap memory to the system (glibc's malloc_trim).
pub(crate) fn malloc_trim() {
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe { libc::malloc_trim(0) };
}

/// As `create_segment`, with one buffer zone of `zone_size` bytes per direction after
/// the rings (protocol §10.4; 0: none). The zones' headers and free lists are written
/// by `Mapping::init_zones` before either guest maps the segment.
pub(crate) fn create_segment_zones(id: u32, ring_size: u64, zone_size: u64) -> io::Result<OwnedFd> {
    use canal_abi::segment;
    let len = segment::segment_size_zones(ring_size, zone_size);
    let h = if zone_size == 0 {
        segment::encode_header(id, ring_size)
    } else {
        segment::encode_header_zones(id, ring_size, zone_size)
    };
    let fd = sealed_memfd("canal-segment", len, &h)?;
    Ok(fd)
}

/// A pair arena's file (protocol §8.7): `size` zero bytes, sealed against resizing;
/// canald writes each slot's header as the slot is taken.
pub(crate) fn create_arena(size: u64) -> io::Result<OwnedFd> {
    sealed_memfd("canal-arena", size, &[])
}

/// The port directory's file (protocol §2 DIRECTORY), mapped here read/write, then
/// sealed against writable mappings: a guest that receives it can only read it, so no
/// guest can change what the others see.
pub(crate) fn create_directory(size: usize) -> io::Result<(OwnedFd, Mapping)> {
    use rustix::fs::SealFlags;
    let fd = rustix::fs::memfd_create(
        "canal-directory",
        rustix::fs::MemfdFlags::CLOEXEC | rustix::fs::MemfdFlags::ALLOW_SEALING,
    )?;
    rustix::fs::ftruncate(&fd, size as u64)?;
    let map = Mapping::map(&fd, size)?;
    rustix::fs::fcntl_add_seals(
        &fd,
        SealFlags::SHRINK | SealFlags::GROW | SealFlags::FUTURE_WRITE | SealFlags::SEAL,
    )?;
    Ok((fd, map))
}

impl Mapping {
    /// Sets (`on`) or clears `bit` of the u64 at `off` (8-aligned, inside the
    /// mapping; otherwise nothing happens), atomically: readers in other processes
    /// load the word at any time.
    pub(crate) fn update_bit(&self, off: usize, bit: u64, on: bool) {
        if !off.is_multiple_of(8) || off.saturating_add(8) > self.len {
            return;
        }
        // SAFETY: `off` is 8-aligned and the word lies inside the mapping (checked
        // above), which stays mapped as long as `self`; the memory is shared plain
        // integers, accessed only atomically.
        let w = unsafe { &*(self.base.add(off) as *const std::sync::atomic::AtomicU64) };
        if on {
            w.fetch_or(bit, std::sync::atomic::Ordering::Release);
        } else {
            w.fetch_and(!bit, std::sync::atomic::Ordering::Release);
        }
    }
}

/// A memfd of `len` bytes starting with `head`, sealed against shrinking and growing:
/// a guest must not resize it under another mapping (SIGBUS on access).
fn sealed_memfd(name: &str, len: u64, head: &[u8]) -> io::Result<OwnedFd> {
    use rustix::fs::{MemfdFlags, SealFlags};
    let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
    rustix::fs::ftruncate(&fd, len)?;
    if !head.is_empty() && rustix::io::pwrite(&fd, head, 0)? != head.len() {
        return Err(io::Error::from_raw_os_error(libc::EIO));
    }
    rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
    Ok(fd)
}

impl Mapping {
    /// Increments the u32 at `off` (4-aligned, inside the mapping) and FUTEX_WAKEs
    /// every waiter on it (shared futex: the word lives in a memfd that guests map).
    /// Used on a pair segment's `wake_seq` words; a guest may scribble on the word,
    /// which only costs it spurious or missed wake-ups of its own threads.
    pub(crate) fn futex_bump_wake(&self, off: usize) {
        if !off.is_multiple_of(4) || off + 4 > self.len {
            return;
        }
        // SAFETY: off is 4-aligned and inside the mapping (checked); an AtomicU32 over
        // shared memory accepts any bit pattern.
        let w = unsafe { &*(self.base.add(off) as *const std::sync::atomic::AtomicU32) };
        w.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        // SAFETY: a plain futex call on a valid, mapped, aligned word.
        unsafe {
            libc::syscall(
                libc::SYS_futex,
                w.as_ptr(),
                libc::FUTEX_WAKE,
                i32::MAX,
                std::ptr::null::<libc::timespec>(),
                std::ptr::null::<u32>(),
                0u32,
            )
        };
    }
}

impl Mapping {
    /// Writes both zones of a fresh segment with zones (`layout` from `zone::plan`,
    /// `layout.zone_size` bytes each): headers and full free lists. canald's own
    /// segment, before any guest has it; false if the mapping is too small.
    pub(crate) fn init_zones(&self, ring_size: u64, layout: &canal_abi::zone::ZoneLayout) -> bool {
        use canal_abi::segment;
        let zs = layout.zone_size;
        if segment::segment_size_zones(ring_size, zs) > self.len as u64 {
            return false;
        }
        for d in 0..2 {
            let off = segment::zone_offset(d, ring_size, zs) as usize;
            // SAFETY: the zone lies inside the mapping (checked), page-aligned.
            let z = unsafe { canal_abi::zone::MappedZone::new(self.base.add(off), *layout) };
            z.init();
        }
        true
    }

    /// A mapped pair segment (tests play a guest with it): its header and its two
    /// rings, if the mapping is large enough for the ring size its header claims.
    pub fn segment_view(&self) -> Option<(&canal_abi::segment::SegHeader, [RawRing; 2])> {
        self.segment_view_at(0)
    }

    /// As `segment_view`, for the segment whose header is `off` bytes into the
    /// mapping: a slot of a pair arena (protocol §8.7; the layout and ring size from
    /// the mapping's length, as a guest tells them) or, at 0, a segment of its own.
    pub fn segment_view_at(
        &self,
        off: usize,
    ) -> Option<(&canal_abi::segment::SegHeader, [RawRing; 2])> {
        use canal_abi::segment::{self, ArenaLayout};
        let (rings, rs) = match ArenaLayout::of_len(self.len as u64) {
            Some((layout, rs)) => {
                let slot = layout.slot_at(off as u64, rs)?;
                (layout.rings_offset(slot, rs) as usize, rs)
            }
            None if off == 0 && self.len >= segment::SEG_HEADER_SIZE as usize => {
                // SAFETY: the mapping holds the header page (checked), page-aligned;
                // SegHeader (512 bytes) accepts any bit pattern.
                let rs = unsafe { &*(self.base as *const segment::SegHeader) }.ring_size;
                if !rs.is_power_of_two() || segment::segment_size(rs) > self.len as u64 {
                    return None;
                }
                (segment::ring_offset(0, rs) as usize, rs)
            }
            None => return None,
        };
        // SAFETY: the header (512 bytes at `off`) and both rings lie inside the
        // mapping (its length is the arena's for `rs`, or checked above); SegHeader
        // accepts any bit pattern and is used through shared references.
        let h = unsafe { &*(self.base.add(off) as *const segment::SegHeader) };
        // SAFETY: as above; rs is a power of two.
        let r = |d: u64| unsafe { RawRing::new(self.base.add(rings + (d * rs) as usize), rs) };
        Some((h, [r(0), r(1)]))
    }
}

/// A guest's event log (protocol §8.6): its sealed memfd (handed to the guest and to
/// its short-circuit peers) and canald's mapping, to append the sockets it changed.
pub(crate) struct EvLogFile {
    pub(crate) fd: OwnedFd,
    map: Mapping,
}

impl EvLogFile {
    /// A fresh log owned by the guest of control connection `owner`.
    pub(crate) fn create(owner: u32) -> io::Result<EvLogFile> {
        use canal_abi::evlog::{encode_header, EVLOG_SIZE};
        let fd = sealed_memfd("canal-evlog", EVLOG_SIZE, &encode_header(owner))?;
        let map = Mapping::map(&fd, EVLOG_SIZE as usize)?;
        Ok(EvLogFile { fd, map })
    }

    /// The log (its header was written at creation; guests may scribble on the rest,
    /// which `EvLog` tolerates).
    pub(crate) fn log(&self) -> Option<canal_abi::evlog::EvLog<'_>> {
        // SAFETY: the mapping is EVLOG_SIZE bytes, page-aligned, and lives as long as
        // `self`.
        unsafe { canal_abi::evlog::EvLog::from_base(self.map.base) }
    }
}
