//! The ivshmem transport: inside a VM, the region is the shared BAR of the canal PCI
//! device (ivshmem, 1af4:1110), mapped through sysfs (`$CANAL_IVSHMEM_DEVICE/resource2`,
//! root only). There is no control socket: canald created the region for the whole VM
//! before it booted (docs/vm.md), so there is no HELLO and no PORT; the region has no
//! PORT_EVENTFD feature and every wait is bounded backoff (protocol §6).

use crate::sys;
use canal_abi::Region;
use libc::{c_int, c_long};

/// PCI ids of the ivshmem device.
pub const VENDOR: u16 = 0x1af4;
pub const DEVICE: u16 = 0x1110;

/// Builds "`dev`/resource2" NUL-terminated in `out`; None if it does not fit.
pub fn resource_path(dev: &[u8], out: &mut [u8; 256]) -> Option<usize> {
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
pub fn map_region(dev: &[u8]) -> Result<Region, (i32, &'static str)> {
    let mut path = [0u8; 256];
    resource_path(dev, &mut path).ok_or((libc::ENAMETOOLONG, "bad CANAL_IVSHMEM_DEVICE"))?;
    // SAFETY: path is NUL-terminated; a non-negative result is a descriptor we own.
    let fd = sys::check(unsafe {
        libc::syscall(
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
}
