//! The file that backs a guest's canal region: QEMU maps it with
//! `memory-backend-file,share=on` and exposes it as the ivshmem-plain BAR 2.
//!
//! `canal vm run --canal` asks canald for it ([`canald_region`]: canald creates, owns and
//! removes the file, and serves the guest in it); [`create_region`] makes a plain file
//! for tests of the device alone (`--no-preload`).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// Default region size: 64 MiB.
pub(crate) const DEFAULT_REGION_MIB: u64 = 64;

/// A region backing file. Removed on drop if this process created it.
#[derive(Debug)]
pub(crate) struct RegionFile {
    pub(crate) path: PathBuf,
    pub(crate) size: u64,
    owned: bool,
    /// Set when canald made the region: the connection that keeps its guest alive.
    pub(crate) canald: Option<canald::vm::VmRegionHandle>,
}

impl RegionFile {
    /// Uses an existing file (e.g. one canald created). Its size must be a power of two of
    /// at least 1 MiB, as ivshmem requires for a BAR.
    pub(crate) fn existing(path: &Path) -> io::Result<RegionFile> {
        let size = fs::metadata(path)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?
            .len();
        check_size(size)?;
        Ok(RegionFile {
            path: path.to_path_buf(),
            size,
            owned: false,
            canald: None,
        })
    }

    /// Tells canald (if it made the region) which process is the VM: when it exits,
    /// canald closes the guest's sockets at once and removes the file.
    pub(crate) fn set_vm_pid(&self, pid: u32) -> io::Result<()> {
        match &self.canald {
            Some(h) => h.set_pid(pid),
            None => Ok(()),
        }
    }
}

/// Asks the canald at `socket` to create the region for a VM called `name` (file
/// `/dev/shm/canal-NAME`, which canald removes when the VM ends), with guest ports
/// published on host ports (`(host, guest)`); with `doorbell`, canald also serves the
/// region through an ivshmem server (`RegionFile::canald`'s `doorbell`).
pub(crate) fn canald_region(
    socket: &Path,
    name: &str,
    size: u64,
    publish: &[(u16, u16)],
    doorbell: bool,
) -> io::Result<RegionFile> {
    check_size(size)?;
    let h = canald::vm::request_region(socket, name, size, publish, doorbell)?;
    Ok(RegionFile {
        path: h.path.clone(),
        size: h.file_size,
        owned: false,
        canald: Some(h),
    })
}

impl RegionFile {
    /// The ivshmem server socket and vector count, if canald serves this region with
    /// doorbells.
    pub(crate) fn doorbell(&self) -> Option<&(PathBuf, u32)> {
        self.canald.as_ref().and_then(|h| h.doorbell.as_ref())
    }
}

impl Drop for RegionFile {
    fn drop(&mut self) {
        if self.owned {
            let _ = fs::remove_file(&self.path);
        }
    }
}

fn check_size(size: u64) -> io::Result<()> {
    if size < (1 << 20) || !size.is_power_of_two() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("region size {size} must be a power of two of at least 1 MiB (ivshmem BAR)"),
        ));
    }
    Ok(())
}

/// The path a region named `name` gets: /dev/shm/canal-NAME. This is also where libvirt's
/// `<shmem name='canal-NAME'>` looks, so the same file serves both.
pub(crate) fn region_path(name: &str) -> PathBuf {
    PathBuf::from(format!("/dev/shm/canal-{name}"))
}

/// Creates a new zero-filled (sparse) region file of `size` bytes for a guest called
/// `name`, owned (and removed on drop) by this process; no canald involved.
pub(crate) fn create_region(name: &str, size: u64) -> io::Result<RegionFile> {
    check_size(size)?;
    let path = region_path(name);
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    let region = RegionFile {
        path,
        size,
        owned: true,
        canald: None,
    };
    f.set_len(size)?;
    Ok(region)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert!(check_size(64 << 20).is_ok());
        assert!(check_size(1 << 20).is_ok());
        assert!(check_size(3 << 20).is_err());
        assert!(check_size(4096).is_err());
    }

    #[test]
    fn create_and_remove() {
        let name = format!("unit-{}", std::process::id());
        let r = create_region(&name, 1 << 20).unwrap();
        let p = r.path.clone();
        assert_eq!(fs::metadata(&p).unwrap().len(), 1 << 20);
        assert!(
            create_region(&name, 1 << 20).is_err(),
            "create_new must refuse reuse"
        );
        drop(r);
        assert!(!p.exists());
    }
}
