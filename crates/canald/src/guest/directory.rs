//! The port directory (protocol §2 DIRECTORY): which ports canal guests listen on
//! (TCP) or receive datagrams at (UDP). A guest with the DIRECT feature reads it to
//! tell a canal destination, which canald may short-circuit, from a native one, which
//! its kernel socket reaches at the kernel's speed without canald. canald keeps a
//! count per port (several listeners share a port: addresses, SO_REUSEPORT) and sets
//! the port's bit while the count is not zero. The file is one per daemon; guests map
//! it read-only (sealed). A port shows nothing /proc/net/tcp does not show already.
use crate::sys::{self, Mapping};
use canal_abi::control::directory;
use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::Arc;

/// The file and canald's writable mapping of it.
pub(crate) struct DirFile {
    fd: OwnedFd,
    map: Mapping,
}

impl DirFile {
    /// A fresh directory (all bits clear); None if the kernel refuses the memfd or its
    /// seals, and then no guest is offered the DIRECT feature.
    pub(crate) fn create() -> Option<Arc<DirFile>> {
        match sys::create_directory(directory::SIZE) {
            Ok((fd, map)) => Some(Arc::new(DirFile { fd, map })),
            Err(e) => {
                log::warn!(
                    "no port directory ({e}): guests' sockets to native peers stay in \
                     canald"
                );
                None
            }
        }
    }

    /// A descriptor of the file for a guest (DIRECTORY_OK).
    pub(crate) fn share(&self) -> std::io::Result<OwnedFd> {
        self.fd.try_clone()
    }
}

/// One protocol's ports: the counts behind one bitmap.
pub(crate) struct PortCounts {
    file: Option<Arc<DirFile>>,
    base: usize,
    counts: HashMap<u16, u32>,
}

impl PortCounts {
    pub(crate) fn tcp(file: Option<Arc<DirFile>>) -> PortCounts {
        PortCounts {
            file,
            base: directory::TCP,
            counts: HashMap::new(),
        }
    }

    pub(crate) fn udp(file: Option<Arc<DirFile>>) -> PortCounts {
        PortCounts {
            file,
            base: directory::UDP,
            counts: HashMap::new(),
        }
    }

    /// One more canal socket on `port`.
    pub(crate) fn add(&mut self, port: u16) {
        let n = self.counts.entry(port).or_insert(0);
        *n += 1;
        if *n == 1 {
            self.show(port, true);
        }
    }

    /// One fewer canal socket on `port` (a port never added is ignored).
    pub(crate) fn remove(&mut self, port: u16) {
        let Some(n) = self.counts.get_mut(&port) else {
            return;
        };
        *n -= 1;
        if *n == 0 {
            self.counts.remove(&port);
            self.show(port, false);
        }
    }

    fn show(&self, port: u16, on: bool) {
        if let Some(f) = &self.file {
            let (word, bit) = directory::slot(port);
            f.map.update_bit(self.base + 8 * word, bit, on);
        }
    }
}

impl Default for PortCounts {
    fn default() -> PortCounts {
        PortCounts::udp(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn word(f: &DirFile, off: usize) -> u64 {
        let mut b = [0u8; 8];
        rustix::io::pread(&f.fd, &mut b, off as u64).unwrap();
        u64::from_le_bytes(b)
    }

    #[test]
    fn a_port_shows_while_any_socket_holds_it() {
        let f = DirFile::create().expect("memfd");
        let mut tcp = PortCounts::tcp(Some(f.clone()));
        let mut udp = PortCounts::udp(Some(f.clone()));
        tcp.add(8080);
        tcp.add(8080);
        udp.add(53);
        let (w, bit) = directory::slot(8080);
        assert_eq!(word(&f, directory::TCP + 8 * w) & bit, bit);
        tcp.remove(8080);
        assert_eq!(word(&f, directory::TCP + 8 * w) & bit, bit, "one left");
        tcp.remove(8080);
        assert_eq!(word(&f, directory::TCP + 8 * w) & bit, 0);
        tcp.remove(8080); // never below zero
        tcp.add(8080);
        assert_eq!(
            word(&f, directory::TCP + 8 * w) & bit,
            bit,
            "counted from zero again"
        );
        let (w, bit) = directory::slot(53);
        assert_eq!(word(&f, directory::UDP + 8 * w) & bit, bit);
        assert_eq!(word(&f, directory::TCP + 8 * w) & bit, 0, "UDP is apart");
    }

    #[test]
    fn a_guest_cannot_map_the_directory_writable() {
        let f = DirFile::create().expect("memfd");
        let fd = f.share().unwrap();
        assert!(
            Mapping::map(&fd, directory::SIZE).is_err(),
            "a writable mapping"
        );
        assert!(
            rustix::io::pwrite(&fd, &[1], 0).is_err(),
            "writes refused too"
        );
    }
}
