//! The ivshmem transport: inside a VM, the region is the shared BAR of the canal PCI
//! device (ivshmem, 1af4:1110), mapped through sysfs (`$CANAL_IVSHMEM_DEVICE/resource2`,
//! root only). There is no control socket: canald created the region for the whole VM
//! before it booted (docs/vm.md), so there is no HELLO and no PORT; the region has no
//! PORT_EVENTFD feature.
//!
//! Without `feature::DOORBELL` every wait is bounded backoff (protocol §9.4). With it
//! (ivshmem-doorbell, canald as the ivshmem server; protocol §9.5):
//! - **kicks**: every process maps BAR 0 (the device registers) through sysfs
//!   (`resource0`) and writes `doorbell_peer << 16` to the Doorbell register; a
//!   process that cannot map it counts itself in the header's `backoff_kickers`.
//! - **wake-ups**: the device is bound to vfio-pci (the guest's init does it). The
//!   first process that opens its VFIO group routes MSI-X vector *i* to an eventfd
//!   (VFIO_DEVICE_SET_IRQS) that serves as the wake-up port of slot *i*; its forked
//!   children share them. Other processes (a VFIO group has one owner at a time) wait
//!   by backoff, as without doorbells. vfio-pci rather than uio: uio_pci_generic has no
//!   MSI-X at all, and a uio driver for ivshmem is not in stock kernels; vfio-pci is.
//!   BARs are mapped through sysfs, never through VFIO, so that VFIO does not claim
//!   them and every process of the VM can still map them.

use crate::sys;
use canal_abi::sync::{AtomicU32, Ordering};
use canal_abi::Region;
use core::sync::atomic::AtomicI32;
use core::sync::atomic::AtomicPtr;
use libc::{c_int, c_long};

/// Builds "`dev`/resource2" NUL-terminated in `out`; None if it does not fit.
pub(crate) fn resource_path(dev: &[u8], out: &mut [u8; 256]) -> Option<usize> {
    let suffix = b"/resource2";
    let n = dev.len() + suffix.len();
    if dev.is_empty() || n >= out.len() || dev.contains(&0) {
        return None;
    }
    out[..dev.len()].copy_from_slice(dev);
    out[dev.len()..n].copy_from_slice(suffix);
    out[n] = 0;
    Some(n)
}

/// Maps BAR 2 of the device at sysfs directory `dev` (the whole BAR, read/write,
/// shared) and validates the region header in it. The mapping is never unmapped.
pub(crate) fn map_region(dev: &[u8]) -> Result<Region, (i32, &'static str)> {
    let mut path = [0u8; 256];
    resource_path(dev, &mut path).ok_or((libc::ENAMETOOLONG, "bad CANAL_IVSHMEM_DEVICE"))?;
    // SAFETY: path is NUL-terminated; a non-negative result is a descriptor we own.
    let fd = sys::check(unsafe {
        crate::sys::raw_syscall!(
            libc::SYS_openat,
            libc::AT_FDCWD as c_long,
            path.as_ptr(),
            (libc::O_RDWR | libc::O_CLOEXEC) as c_long,
        )
    })
    .map_err(|e| (e, "cannot open the ivshmem BAR (resource2)"))? as c_int;
    let r = (|| {
        let size = sys::file_size(fd).map_err(|e| (e, "cannot stat the ivshmem BAR"))?;
        if !(canal_abi::HEADER_SIZE..=(1 << 40)).contains(&size) {
            return Err((libc::EPROTO, "ivshmem BAR size out of range"));
        }
        let base =
            sys::mmap_shared(fd, size as usize).map_err(|e| (e, "cannot map the ivshmem BAR"))?;
        // SAFETY: base maps `size` bytes of the BAR read/write, page aligned, and is
        // never unmapped; the BAR cannot shrink while the VM runs.
        unsafe { Region::attach(base, size) }
            .map_err(|_| (libc::EPROTO, "no valid canal region in the ivshmem BAR"))
    })();
    let _ = sys::close(fd);
    r
}

// ---- doorbell (protocol §9.5) ------------------------------------------------------------

/// BAR 0 register offset of the ivshmem Doorbell.
pub(crate) const REG_DOORBELL: usize = 12;

/// The Doorbell register (in this process's mapping of BAR 0) and what a kick writes.
static BELL: AtomicPtr<u32> = AtomicPtr::new(core::ptr::null_mut());
static BELL_VALUE: AtomicU32 = AtomicU32::new(0);

/// Most wake-up vectors this process routes (slots beyond wait by backoff).
pub(crate) const MAX_IRQS: usize = 256;
/// Eventfd of MSI-X vector i (= wake-up port of slot i), -1 if none.
static IRQ_EFD: [AtomicI32; MAX_IRQS] = [const { AtomicI32::new(-1) }; MAX_IRQS];

/// Rings canald's doorbell if this process can; false if it cannot.
pub(crate) fn ring() -> bool {
    let p = BELL.load(Ordering::Relaxed);
    if p.is_null() {
        return false;
    }
    // SAFETY: p points at the Doorbell register inside this process's BAR 0 mapping,
    // which is never unmapped; a volatile 32-bit store is one MMIO write.
    unsafe { core::ptr::write_volatile(p, BELL_VALUE.load(Ordering::Relaxed)) };
    true
}

/// The interrupt eventfd that wakes slot `idx`, or -1.
pub(crate) fn irq_efd(idx: u32) -> c_int {
    IRQ_EFD
        .get(idx as usize)
        .map_or(-1, |a| a.load(Ordering::Relaxed))
}

/// Points the interrupt eventfd holder of `old` at `new` (it moved: ownfd.rs).
pub(crate) fn retarget(old: c_int, new: c_int) -> bool {
    crate::ownfd::retarget(&IRQ_EFD, old, new)
}

/// Whether `fd` is one of the interrupt eventfds (process-wide, never closed).
pub(crate) fn is_irq_efd(fd: c_int) -> bool {
    fd >= 0 && IRQ_EFD.iter().any(|a| a.load(Ordering::Relaxed) == fd)
}

fn open(path: &[u8], flags: c_int) -> Result<c_int, i32> {
    // SAFETY: path is NUL-terminated (callers build it so); a non-negative result is
    // a descriptor we own.
    sys::check(unsafe {
        crate::sys::raw_syscall!(
            libc::SYS_openat,
            libc::AT_FDCWD as c_long,
            path.as_ptr(),
            (flags | libc::O_CLOEXEC) as c_long,
        )
    })
    .map(|v| v as c_int)
}

/// `dev` + `suffix`, NUL-terminated, in `out`.
fn join<'a>(dev: &[u8], suffix: &[u8], out: &'a mut [u8; 256]) -> Option<&'a [u8]> {
    let n = dev.len() + suffix.len();
    if dev.is_empty() || n >= out.len() || dev.contains(&0) || suffix.contains(&0) {
        return None;
    }
    out[..dev.len()].copy_from_slice(dev);
    out[dev.len()..n].copy_from_slice(suffix);
    out[n] = 0;
    Some(&out[..=n])
}

/// The start address of BAR `bar` from the text of a sysfs `resource` file (one line
/// per resource: `0xSTART 0xEND 0xFLAGS`).
pub(crate) fn bar_start(text: &[u8], bar: usize) -> Option<u64> {
    let line = text.split(|&c| c == b'\n').nth(bar)?;
    let first = line.split(|&c| c == b' ').next()?;
    let hex = first.strip_prefix(b"0x")?;
    if hex.is_empty() || hex.len() > 16 {
        return None;
    }
    let mut v = 0u64;
    for &c in hex {
        let d = (c as char).to_digit(16)? as u64;
        v = (v << 4) | d;
    }
    Some(v)
}

/// Maps BAR 0 of the device at `dev` (sysfs) and sets up `ring()` for peer `peer`.
fn map_bell(dev: &[u8], peer: u32) -> Result<(), i32> {
    let mut p = [0u8; 256];
    let mut text = [0u8; 512];
    let rfd = open(
        join(dev, b"/resource", &mut p).ok_or(libc::ENAMETOOLONG)?,
        libc::O_RDONLY,
    )?;
    let n = sys::read(rfd, &mut text);
    let _ = sys::close(rfd);
    let start = bar_start(&text[..n?], 0).ok_or(libc::EPROTO)?;
    let page = 4096u64;
    let off = (start % page) as usize;
    if off + REG_DOORBELL + 4 > page as usize {
        return Err(libc::EPROTO);
    }
    let fd = open(
        join(dev, b"/resource0", &mut p).ok_or(libc::ENAMETOOLONG)?,
        libc::O_RDWR | libc::O_SYNC,
    )?;
    let r = sys::mmap_shared(fd, page as usize);
    let _ = sys::close(fd);
    let base = r?;
    // SAFETY: off + 16 <= 4096: the registers lie inside the page just mapped.
    let reg = unsafe { base.add(off + REG_DOORBELL) } as *mut u32;
    BELL_VALUE.store(peer << 16, Ordering::Relaxed);
    BELL.store(reg, Ordering::Release);
    Ok(())
}

/// VFIO ioctls and layouts (linux/vfio.h).
mod vfio {
    pub(crate) const GROUP_SET_CONTAINER: u64 = 0x3b68;
    pub(crate) const SET_IOMMU: u64 = 0x3b66;
    pub(crate) const GROUP_GET_DEVICE_FD: u64 = 0x3b6a;
    pub(crate) const DEVICE_GET_REGION_INFO: u64 = 0x3b6c;
    pub(crate) const DEVICE_GET_IRQ_INFO: u64 = 0x3b6d;
    pub(crate) const DEVICE_SET_IRQS: u64 = 0x3b6e;
    pub(crate) const TYPE1_IOMMU: u64 = 1;
    pub(crate) const PCI_CONFIG_REGION_INDEX: u32 = 7;
    pub(crate) const PCI_MSIX_IRQ_INDEX: u32 = 2;
    pub(crate) const IRQ_SET_DATA_EVENTFD: u32 = 1 << 2;
    pub(crate) const IRQ_SET_ACTION_TRIGGER: u32 = 1 << 5;

    #[repr(C)]
    #[derive(Default)]
    pub(crate) struct RegionInfo {
        pub(crate) argsz: u32,
        pub(crate) flags: u32,
        pub(crate) index: u32,
        pub(crate) cap_offset: u32,
        pub(crate) size: u64,
        pub(crate) offset: u64,
    }

    #[repr(C)]
    #[derive(Default)]
    pub(crate) struct IrqInfo {
        pub(crate) argsz: u32,
        pub(crate) flags: u32,
        pub(crate) index: u32,
        pub(crate) count: u32,
    }

    /// `struct vfio_irq_set` with room for MAX_IRQS eventfds.
    #[repr(C)]
    pub(crate) struct IrqSet {
        pub(crate) argsz: u32,
        pub(crate) flags: u32,
        pub(crate) index: u32,
        pub(crate) start: u32,
        pub(crate) count: u32,
        pub(crate) data: [i32; super::MAX_IRQS],
    }
}

fn ioctl(fd: c_int, req: u64, arg: c_long) -> Result<usize, i32> {
    // SAFETY: every caller passes a request whose argument is `arg` as the kernel
    // expects it (an integer, or a pointer to a live, correctly laid out struct).
    sys::check(unsafe {
        crate::sys::raw_syscall!(libc::SYS_ioctl, fd as c_long, req as c_long, arg)
    })
}

/// Opens the device's VFIO group (`group`, e.g. /dev/vfio/3), enables bus mastering
/// (MSI-X messages are DMA writes) and routes up to `want` MSI-X vectors to fresh
/// eventfds. Returns the number routed. EBUSY: another process owns the group.
fn setup_irqs(dev: &[u8], group: &[u8], want: u32) -> Result<u32, (i32, &'static str)> {
    let mut p = [0u8; 256];
    let bdf = dev.rsplit(|&c| c == b'/').next().unwrap_or(dev);
    let mut name = [0u8; 64];
    if bdf.is_empty() || bdf.len() >= name.len() {
        return Err((libc::ENAMETOOLONG, "bad device name"));
    }
    name[..bdf.len()].copy_from_slice(bdf);
    let gpath = join(group, b"", &mut p).ok_or((libc::ENAMETOOLONG, "bad VFIO group"))?;
    let container = open(b"/dev/vfio/vfio\0", libc::O_RDWR).map_err(|e| (e, "/dev/vfio/vfio"))?;
    let mut fds = [container, -1, -1];
    let r = (|| {
        let g = open(gpath, libc::O_RDWR).map_err(|e| (e, "VFIO group"))?;
        fds[1] = g;
        let c: c_int = container;
        ioctl(g, vfio::GROUP_SET_CONTAINER, &c as *const c_int as c_long)
            .map_err(|e| (e, "VFIO_GROUP_SET_CONTAINER"))?;
        ioctl(container, vfio::SET_IOMMU, vfio::TYPE1_IOMMU as c_long)
            .map_err(|e| (e, "VFIO_SET_IOMMU"))?;
        let d = ioctl(g, vfio::GROUP_GET_DEVICE_FD, name.as_ptr() as c_long)
            .map_err(|e| (e, "VFIO_GROUP_GET_DEVICE_FD"))? as c_int;
        fds[2] = d;
        let mut cfg = vfio::RegionInfo {
            argsz: core::mem::size_of::<vfio::RegionInfo>() as u32,
            index: vfio::PCI_CONFIG_REGION_INDEX,
            ..Default::default()
        };
        ioctl(
            d,
            vfio::DEVICE_GET_REGION_INFO,
            &mut cfg as *mut _ as c_long,
        )
        .map_err(|e| (e, "VFIO config region"))?;
        let mut cmd = [0u8; 2];
        // SAFETY: cmd is a 2-byte buffer; pread64 writes at most 2 bytes into it.
        sys::check(unsafe {
            crate::sys::raw_syscall!(
                libc::SYS_pread64,
                d as c_long,
                cmd.as_mut_ptr(),
                2usize,
                (cfg.offset + 4) as c_long,
            )
        })
        .map_err(|e| (e, "read PCI command"))?;
        let v = u16::from_le_bytes(cmd) | 0x4; // PCI_COMMAND_MASTER
        let cmd = v.to_le_bytes();
        // SAFETY: cmd is a 2-byte buffer the kernel only reads.
        sys::check(unsafe {
            crate::sys::raw_syscall!(
                libc::SYS_pwrite64,
                d as c_long,
                cmd.as_ptr(),
                2usize,
                (cfg.offset + 4) as c_long,
            )
        })
        .map_err(|e| (e, "write PCI command"))?;
        let mut info = vfio::IrqInfo {
            argsz: core::mem::size_of::<vfio::IrqInfo>() as u32,
            index: vfio::PCI_MSIX_IRQ_INDEX,
            ..Default::default()
        };
        ioctl(d, vfio::DEVICE_GET_IRQ_INFO, &mut info as *mut _ as c_long)
            .map_err(|e| (e, "VFIO MSI-X info"))?;
        let n = want.min(info.count).min(MAX_IRQS as u32);
        if n == 0 {
            return Err((libc::ENODEV, "the device has no MSI-X vectors"));
        }
        let mut set = vfio::IrqSet {
            argsz: (20 + 4 * n) as u32,
            flags: vfio::IRQ_SET_DATA_EVENTFD | vfio::IRQ_SET_ACTION_TRIGGER,
            index: vfio::PCI_MSIX_IRQ_INDEX,
            start: 0,
            count: n,
            data: [-1; MAX_IRQS],
        };
        for i in 0..n as usize {
            match sys::eventfd() {
                Ok(e) => set.data[i] = e,
                Err(e) => {
                    close_all(&set.data[..i]);
                    return Err((e, "eventfd"));
                }
            }
        }
        if let Err(e) = ioctl(d, vfio::DEVICE_SET_IRQS, &set as *const _ as c_long) {
            close_all(&set.data[..n as usize]);
            return Err((e, "VFIO_DEVICE_SET_IRQS (MSI-X)"));
        }
        for (slot, &efd) in IRQ_EFD.iter().zip(&set.data[..n as usize]) {
            // VFIO holds the eventfd itself, not its number: it may move (ownfd.rs).
            slot.store(crate::ownfd::adopt(efd), Ordering::Release);
        }
        Ok(n)
    })();
    match r {
        Ok(n) => {
            // Container, group and device stay open for the life of the process (and its
            // forked children): closing them would tear the interrupts down.
            for f in fds {
                crate::ownfd::adopt(f);
            }
            Ok(n)
        }
        Err(e) => {
            close_all(&fds);
            Err(e)
        }
    }
}

fn close_all(fds: &[c_int]) {
    for &f in fds {
        if f >= 0 {
            let _ = sys::close(f);
        }
    }
}

/// How a doorbell region is served to this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Doorbell {
    /// Kicks ring the doorbell (else this process counts in `backoff_kickers`).
    pub(crate) ring: bool,
    /// Interrupt vectors routed to slots 0..irqs (0: waits back off).
    pub(crate) irqs: u32,
}

/// Sets up the doorbell for a region with `feature::DOORBELL` (see the module doc).
/// Never fails: what cannot be set up falls back to backoff (reported in the result and
/// by `why`).
pub(crate) fn setup_doorbell(
    region: &Region,
    dev: &[u8],
    group: Option<&[u8]>,
    why: &mut (i32, &'static str),
) -> Doorbell {
    let h = region.header();
    let ring = match map_bell(dev, h.doorbell_peer) {
        Ok(()) => true,
        Err(e) => {
            *why = (e, "cannot map the ivshmem registers (resource0)");
            // Before any kick of ours: canald bounds its sleep while this is non-zero.
            h.backoff_kickers.fetch_add(1, Ordering::SeqCst);
            false
        }
    };
    let want = h.doorbell_vectors.min(region.layout().slot_count);
    let irqs = match group {
        None => {
            *why = (libc::ENODEV, "the device is not bound to vfio-pci");
            0
        }
        Some(g) => match setup_irqs(dev, g, want) {
            Ok(n) => n,
            Err(e) => {
                *why = e;
                0
            }
        },
    };
    Doorbell { ring, irqs }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_paths() {
        let mut out = [0u8; 256];
        let n = resource_path(b"/sys/bus/pci/devices/0000:00:05.0", &mut out).unwrap();
        assert_eq!(&out[..n], b"/sys/bus/pci/devices/0000:00:05.0/resource2");
        assert_eq!(out[n], 0);
        assert!(resource_path(b"", &mut out).is_none());
        assert!(resource_path(&[b'a'; 250], &mut out).is_none());
    }

    #[test]
    fn bar_starts_from_sysfs_resource() {
        let t = b"0x00000000febd1000 0x00000000febd10ff 0x0000000000040200\n\
                  0x00000000febd2000 0x00000000febd2fff 0x0000000000040200\n";
        assert_eq!(bar_start(t, 0), Some(0xfebd1000));
        assert_eq!(bar_start(t, 1), Some(0xfebd2000));
        assert_eq!(bar_start(t, 5), None);
        assert_eq!(bar_start(b"garbage", 0), None);
        assert_eq!(bar_start(b"0x\n", 0), None);
        assert_eq!(bar_start(b"0x12345678901234567 0x0", 0), None, "too long");
    }

    #[test]
    fn vfio_layouts_match_the_kernel() {
        // linux/vfio.h: struct vfio_region_info 32 bytes, vfio_irq_info 16, the
        // vfio_irq_set header 20 (data follows).
        assert_eq!(core::mem::size_of::<vfio::RegionInfo>(), 32);
        assert_eq!(core::mem::size_of::<vfio::IrqInfo>(), 16);
        assert_eq!(core::mem::offset_of!(vfio::IrqSet, data), 20);
        assert_eq!(core::mem::offset_of!(vfio::RegionInfo, offset), 24);
    }

    #[test]
    fn irq_table_starts_empty() {
        assert_eq!(irq_efd(0), -1);
        assert_eq!(irq_efd(100_000), -1);
        assert!(!is_irq_efd(-1));
        assert!(BELL.load(Ordering::Relaxed).is_null(), "no doorbell mapped");
    }
}
