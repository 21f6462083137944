//! The file that backs a guest's canal region: QEMU maps it with
//! `memory-backend-file,share=on` and exposes it as the ivshmem-plain BAR 2.
//!
//! For now the harness creates the file itself (a sparse file in /dev/shm). When canald
//! gains an API for creating and owning a VM's region, [`create_region`] is the one place
//! to switch over.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// Default region size: 64 MiB.
pub const DEFAULT_REGION_MIB: u64 = 64;

/// A region backing file. Removed on drop if this process created it.
#[derive(Debug)]
pub struct RegionFile {
    pub path: PathBuf,
    pub size: u64,
    owned: bool,
}

impl RegionFile {
    /// Uses an existing file (e.g. one canald created). Its size must be a power of two of
    /// at least 1 MiB, as ivshmem requires for a BAR.
    pub fn existing(path: &Path) -> io::Result<RegionFile> {
        let size = fs::metadata(path)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?
            .len();
        check_size(size)?;
        Ok(RegionFile {
            path: path.to_path_buf(),
            size,
            owned: false,
        })
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
pub fn region_path(name: &str) -> PathBuf {
    PathBuf::from(format!("/dev/shm/canal-{name}"))
}

/// Creates a new zero-filled (sparse) region file of `size` bytes for a guest called
/// `name`. The swap point for canald-owned regions.
pub fn create_region(name: &str, size: u64) -> io::Result<RegionFile> {
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
