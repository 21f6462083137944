//! Network namespaces: which one a control-socket peer is in, and checks on a
//! namespace descriptor another process hands over.

use super::util::cvt;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;

/// A namespace's identity: the nsfs device and inode (stable while the namespace
/// lives; a descriptor of it keeps it alive, so the pair is never reused meanwhile).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NsId {
    pub dev: u64,
    pub ino: u64,
}

impl std::fmt::Display for NsId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "net:[{}]", self.ino)
    }
}

fn ns_id(fd: &OwnedFd) -> io::Result<NsId> {
    let st = rustix::fs::fstat(fd)?;
    Ok(NsId {
        dev: st.st_dev,
        ino: st.st_ino,
    })
}

/// The network namespace this process is in.
pub fn own_netns() -> io::Result<NsId> {
    let m = std::fs::metadata("/proc/self/ns/net")?;
    Ok(NsId {
        dev: m.dev(),
        ino: m.ino(),
    })
}

/// SO_PEERPIDFD (Linux 6.5): a pidfd of the process that connected, taken by the
/// kernel at connect time, so a recycled pid cannot stand in for it.
const SO_PEERPIDFD: libc::c_int = 77;

fn peer_pidfd(sock: &OwnedFd) -> io::Result<OwnedFd> {
    let mut fd: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `fd`/`len` are a valid int buffer and its length; on success the kernel
    // stores a new descriptor we then own.
    cvt(unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_PEERPIDFD,
            &mut fd as *mut libc::c_int as *mut libc::c_void,
            &mut len,
        )
    })?;
    // SAFETY: a fresh descriptor from the kernel, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn exited(pidfd: &OwnedFd) -> bool {
    use rustix::event::{poll, PollFd, PollFlags};
    let mut fds = [PollFd::new(pidfd, PollFlags::IN)];
    // A pidfd polls readable once its process has exited.
    matches!(poll(&mut fds, Some(&rustix::time::Timespec::default())), Ok(n) if n > 0)
}

/// The network namespace of the process that connected on `sock` (pid `pid` from
/// SO_PEERCRED), with a descriptor that pins it. Read through /proc, then checked
/// against the peer's pidfd: if that process has exited meanwhile the pid may name
/// another process, and the answer is ESRCH rather than a guess.
pub fn peer_netns(sock: &OwnedFd, pid: u32) -> io::Result<(NsId, OwnedFd)> {
    let pidfd = match peer_pidfd(sock) {
        Ok(p) => p,
        Err(e) if e.raw_os_error() == Some(libc::ENOPROTOOPT) => super::io::pidfd_open(pid)?,
        Err(e) => return Err(e),
    };
    let f = std::fs::File::open(format!("/proc/{pid}/ns/net"))?;
    let fd = OwnedFd::from(f);
    if exited(&pidfd) {
        return Err(io::Error::from_raw_os_error(libc::ESRCH));
    }
    Ok((ns_id(&fd)?, fd))
}

/// NS_GET_NSTYPE (linux/nsfs.h): the CLONE_NEW* type of a namespace descriptor.
const NS_GET_NSTYPE: libc::c_ulong = 0xb703;

/// The identity of a network-namespace descriptor handed over by a client; EINVAL if
/// it is not one.
pub fn netns_of_fd(fd: &OwnedFd) -> io::Result<NsId> {
    // SAFETY: an ioctl without arguments on a descriptor we own.
    let t = unsafe { libc::ioctl(fd.as_raw_fd(), NS_GET_NSTYPE as _) };
    if t < 0 || t != libc::CLONE_NEWNET {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    ns_id(fd)
}
