//! canald as the ivshmem server of one doorbell VM (protocol §9.5, docs/vm.md).
//!
//! QEMU's `ivshmem-doorbell` device connects (as a client, `-chardev socket,path=…`) to
//! a server that hands it the shared memory and the interrupt eventfds. The protocol
//! (QEMU's docs/specs/ivshmem-spec) is a stream of 8-byte little-endian signed integers,
//! each optionally carrying one descriptor (SCM_RIGHTS); the client never sends:
//!
//! 1. the protocol version, 0 (no descriptor);
//! 2. the client's own peer id (no descriptor);
//! 3. -1 with the shared-memory descriptor;
//! 4. for every other peer, its id once per vector, each with that vector's eventfd;
//!    then the client's own id once per vector, each with one of its vector eventfds.
//!
//! A write to the device's Doorbell register `peer << 16 | vector` makes QEMU write
//! that peer's vector eventfd; a write to one of the client's own vector eventfds makes
//! QEMU raise that MSI-X vector in the guest.
//!
//! Here there are exactly two peers: canald ([`HOST_PEER`], one vector whose eventfd
//! canald polls: a guest kick) and the VM ([`GUEST_PEER`], one vector per request slot:
//! writing vector *i* wakes slot *i*, so canald's per-slot wake-ups stay as in §6).
//! The server is one-shot: it serves the first client of the right uid, then closes
//! and removes its listening socket, so the region is never handed to a second VM.
#![forbid(unsafe_code)]

use crate::sys;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

/// The ivshmem server protocol version QEMU expects.
pub(crate) const PROTOCOL_VERSION: i64 = 0;
/// canald's peer id (the region header's `doorbell_peer`).
pub(crate) const HOST_PEER: u16 = canal_abi::DOORBELL_HOST_PEER as u16;
/// The VM's peer id (its IVPosition register).
pub(crate) const GUEST_PEER: u16 = 2;
/// Most guest vectors (one per request slot of a VM region).
pub(crate) const MAX_VECTORS: u32 = 1024;

/// Which descriptor, if any, travels with a setup message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MsgFd {
    None,
    Shm,
    /// canald's own (only) vector: the guest's kicks.
    HostVector,
    /// The guest peer's vector *i*: wakes slot *i*.
    GuestVector(u32),
}

/// The setup messages for a client with `vectors` vectors, in order.
pub(crate) fn setup_messages(vectors: u32) -> Vec<(i64, MsgFd)> {
    let mut m = vec![
        (PROTOCOL_VERSION, MsgFd::None),
        (GUEST_PEER as i64, MsgFd::None),
        (-1, MsgFd::Shm),
        (HOST_PEER as i64, MsgFd::HostVector),
    ];
    m.extend((0..vectors).map(|v| (GUEST_PEER as i64, MsgFd::GuestVector(v))));
    m
}

/// The wire form of one message.
pub(crate) fn encode(v: i64) -> [u8; 8] {
    v.to_le_bytes()
}

/// The server of one VM.
pub(crate) struct Server {
    listener: Option<UnixListener>,
    pub(crate) path: PathBuf,
    client: Option<OwnedFd>,
    /// The guest peer's vector eventfds (canald writes vector *i* to wake slot *i*).
    guest_vectors: Vec<OwnedFd>,
    /// canald's vector eventfd (a copy: the poller owns the one it reads).
    host_vector: OwnedFd,
    /// Set once a client got the setup (the server never serves another).
    pub(crate) served: bool,
}

/// What `Server::create` hands back besides the server.
pub(crate) struct Created {
    pub(crate) server: Server,
    /// canald's vector eventfd, for the poller's epoll: readable = a guest kick.
    pub(crate) host_vector: OwnedFd,
    /// One eventfd per guest vector (= request slot), for the guest's wake-up ports.
    pub(crate) ports: Vec<OwnedFd>,
}

impl Server {
    /// Listens on `path` (which must not exist) for a VM with `vectors` vectors.
    pub(crate) fn create(path: &Path, vectors: u32) -> io::Result<Created> {
        if vectors == 0 || vectors > MAX_VECTORS {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        let mut guest_vectors = Vec::with_capacity(vectors as usize);
        let mut ports = Vec::with_capacity(vectors as usize);
        for _ in 0..vectors {
            let e = sys::eventfd()?;
            ports.push(e.try_clone()?);
            guest_vectors.push(e);
        }
        let host = sys::eventfd()?;
        let listener = UnixListener::bind(path)?;
        listener.set_nonblocking(true)?;
        Ok(Created {
            server: Server {
                listener: Some(listener),
                path: path.to_path_buf(),
                client: None,
                guest_vectors,
                host_vector: host.try_clone()?,
                served: false,
            },
            host_vector: host,
            ports,
        })
    }

    pub(crate) fn listener_fd(&self) -> Option<i32> {
        self.listener.as_ref().map(|l| l.as_raw_fd())
    }

    pub(crate) fn client_fd(&self) -> Option<i32> {
        self.client.as_ref().map(|c| c.as_raw_fd())
    }

    pub(crate) fn vectors(&self) -> u32 {
        self.guest_vectors.len() as u32
    }

    /// The listener is readable: accepts one client of uid `uid` (or root) and sends it
    /// the setup with `shm`. On success the listener is closed and its path removed
    /// (one VM per server). Returns the client's descriptor to poll (for EOF), or
    /// None if nobody acceptable was waiting. Unacceptable peers are closed.
    pub(crate) fn accept(&mut self, shm: BorrowedFd<'_>, uid: u32) -> io::Result<Option<i32>> {
        let Some(l) = &self.listener else {
            return Ok(None);
        };
        loop {
            let (s, _) = match l.accept() {
                Ok(x) => x,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.raw_os_error() == Some(libc::ECONNABORTED) => continue,
                Err(e) => return Err(e),
            };
            s.set_nonblocking(true)?;
            let fd: OwnedFd = s.into();
            match sys::peer_cred(&fd) {
                Ok((_, u)) if u == uid || u == 0 => {}
                _ => continue, // another user's process: dropped unanswered
            }
            self.send_setup(&fd, shm)?;
            self.served = true;
            self.listener = None;
            let _ = std::fs::remove_file(&self.path);
            let raw = fd.as_raw_fd();
            self.client = Some(fd);
            return Ok(Some(raw));
        }
    }

    fn send_setup(&self, fd: &OwnedFd, shm: BorrowedFd<'_>) -> io::Result<()> {
        for (v, which) in setup_messages(self.vectors()) {
            let f = match which {
                MsgFd::None => None,
                MsgFd::Shm => Some(shm.as_raw_fd()),
                MsgFd::HostVector => Some(self.host_vector.as_raw_fd()),
                MsgFd::GuestVector(i) => self.guest_vectors.get(i as usize).map(|e| e.as_raw_fd()),
            };
            let fds: &[i32] = match &f {
                Some(x) => std::slice::from_ref(x),
                None => &[],
            };
            // Non-blocking: a client that does not read its setup (a few KiB) is not
            // waited for; the send fails and the client is dropped.
            sys::send_with_fds(fd, &encode(v), fds, true)?;
        }
        Ok(())
    }

    /// The client's descriptor is readable or hung up. A QEMU client never sends, so
    /// anything it sends (or EOF) ends the connection; the VM keeps its interrupts
    /// set up but gets no new peers (there are none). Returns true if it was closed.
    pub(crate) fn client_event(&mut self) -> bool {
        let Some(c) = &self.client else {
            return false;
        };
        let mut buf = [0u8; 64];
        match sys::recv_with_fds(c, &mut buf) {
            // Descriptors it sent are closed with the Received.
            Ok(None) => false,
            Ok(Some(_)) | Err(_) => {
                self.client = None;
                true
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.listener.take().is_some() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    #[test]
    fn setup_order() {
        let m = setup_messages(3);
        assert_eq!(
            m,
            vec![
                (0, MsgFd::None),
                (2, MsgFd::None),
                (-1, MsgFd::Shm),
                (1, MsgFd::HostVector),
                (2, MsgFd::GuestVector(0)),
                (2, MsgFd::GuestVector(1)),
                (2, MsgFd::GuestVector(2)),
            ]
        );
        assert_eq!(encode(-1), [0xff; 8]);
        assert_eq!(encode(2), [2, 0, 0, 0, 0, 0, 0, 0]);
    }

    fn dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "canald-ivs-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir(&d).unwrap();
        d
    }

    /// Reads one setup message the way QEMU does: 8 bytes, at most one descriptor.
    fn read_msg(c: &OwnedFd) -> (i64, Option<OwnedFd>) {
        let mut b = [0u8; 8];
        assert!(sys::poll_in(c, 5000), "no setup message");
        let r = sys::recv_with_fds(c, &mut b).unwrap().unwrap();
        assert_eq!(r.len, 8);
        let mut fds = r.fds;
        assert!(fds.len() <= 1);
        (i64::from_le_bytes(b), fds.pop())
    }

    #[test]
    fn serves_one_client_the_qemu_setup() {
        let d = dir();
        let path = d.join("vm.sock");
        let shm = std::fs::File::create(d.join("shm")).unwrap();
        shm.set_len(1 << 20).unwrap();
        let shm: OwnedFd = shm.into();
        let mut c = Server::create(&path, 3).unwrap();
        assert_eq!(c.ports.len(), 3);
        let client: OwnedFd = UnixStream::connect(&path).unwrap().into();
        let got = c
            .server
            .accept(std::os::fd::AsFd::as_fd(&shm), sys::getuid())
            .unwrap();
        assert_eq!(got, c.server.client_fd());
        assert!(c.server.served && c.server.listener_fd().is_none());
        assert!(!path.exists(), "one-shot: the socket path is gone");
        assert!(UnixStream::connect(&path).is_err());

        let (v, f) = read_msg(&client);
        assert_eq!((v, f.is_none()), (PROTOCOL_VERSION, true));
        let (id, f) = read_msg(&client);
        assert_eq!((id, f.is_none()), (GUEST_PEER as i64, true));
        let (m, f) = read_msg(&client);
        assert_eq!(m, -1);
        let f = f.expect("shm descriptor");
        assert_eq!(std::fs::File::from(f).metadata().unwrap().len(), 1 << 20);
        let (id, host) = read_msg(&client);
        assert_eq!(id, HOST_PEER as i64);
        let host = host.expect("host vector");
        assert!(sys::is_eventfd(&host));
        // The guest's doorbell write to HOST_PEER lands on canald's eventfd.
        sys::eventfd_write(host.as_raw_fd()).unwrap();
        assert_eq!(sys::eventfd_read(&c.host_vector).unwrap(), 1);
        for i in 0..3 {
            let (id, v) = read_msg(&client);
            assert_eq!(id, GUEST_PEER as i64);
            let v = v.expect("guest vector");
            // canald waking slot i is a write to the guest's vector i.
            sys::eventfd_write(c.ports[i].as_raw_fd()).unwrap();
            assert_eq!(sys::eventfd_read(&v).unwrap(), 1, "vector {i}");
        }
        assert!(!sys::poll_in(&client, 0), "nothing after the setup");
        assert!(!c.server.client_event(), "no event yet");
        drop(client);
        assert!(c.server.client_event(), "EOF closes the client");
        assert!(c.server.client_fd().is_none());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_client_that_sends_is_dropped() {
        let d = dir();
        let path = d.join("vm.sock");
        let shm: OwnedFd = std::fs::File::create(d.join("shm")).unwrap().into();
        let mut c = Server::create(&path, 1).unwrap();
        let client = UnixStream::connect(&path).unwrap();
        c.server
            .accept(std::os::fd::AsFd::as_fd(&shm), sys::getuid())
            .unwrap()
            .unwrap();
        use std::io::Write;
        (&client)
            .write_all(b"garbage from a confused client")
            .unwrap();
        assert!(c.server.client_event(), "a client that sends is closed");
        assert!(!c.server.client_event(), "and stays closed");
        drop(c);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn bad_vector_counts_and_paths() {
        let d = dir();
        assert!(Server::create(&d.join("a.sock"), 0).is_err());
        assert!(Server::create(&d.join("b.sock"), MAX_VECTORS + 1).is_err());
        let c = Server::create(&d.join("c.sock"), 1).unwrap();
        assert!(
            Server::create(&d.join("c.sock"), 1).is_err(),
            "an existing path is never reused"
        );
        drop(c);
        assert!(
            !d.join("c.sock").exists(),
            "dropping an unserved server removes its socket"
        );
        let _ = std::fs::remove_dir_all(&d);
    }
}
