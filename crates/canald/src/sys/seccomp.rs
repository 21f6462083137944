//! Seccomp user notification (the supervisor's side) and what serving a notified
//! system call needs: the target's descriptors (pidfd_getfd) and memory
//! (process_vm_readv/writev), socket-level helpers on descriptors taken from it.

use super::inet::{from_sockaddr, to_sockaddr, zeroed_storage};
use super::util::{cvt, cvt_size, owned};
use canal_abi::CanalAddr;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

/// One notified system call.
#[derive(Clone, Copy, Debug)]
pub struct Notif {
    pub id: u64,
    /// The calling thread (in canald's pid namespace).
    pub pid: u32,
    pub nr: i64,
    pub arch: u32,
    pub args: [u64; 6],
}

/// Waits for the next notification (blocking). ENOENT: the caller went away meanwhile
/// (try again); other errors: the listener is unusable.
pub fn notif_recv(listener: &OwnedFd) -> io::Result<Notif> {
    // SAFETY: the kernel requires a zeroed seccomp_notif; all-zero is valid plain data.
    let mut n: libc::seccomp_notif = unsafe { std::mem::zeroed() };
    // SAFETY: `n` is a seccomp_notif the ioctl fills.
    cvt(unsafe { libc::ioctl(listener.as_raw_fd(), libc::SECCOMP_IOCTL_NOTIF_RECV, &mut n) })?;
    Ok(Notif {
        id: n.id,
        pid: n.pid,
        nr: n.data.nr as i64,
        arch: n.data.arch,
        args: n.data.args,
    })
}

/// Answers notification `id`: `Ok(v)` returns v, `Err(e)` fails with errno e.
pub fn notif_send(listener: &OwnedFd, id: u64, r: Result<i64, i32>) -> io::Result<()> {
    let (val, error) = match r {
        Ok(v) => (v, 0),
        Err(e) => (0, -e),
    };
    respond(listener, id, val, error, 0)
}

/// Lets notification `id`'s system call run as the program made it.
pub fn notif_continue(listener: &OwnedFd, id: u64) -> io::Result<()> {
    respond(
        listener,
        id,
        0,
        0,
        libc::SECCOMP_USER_NOTIF_FLAG_CONTINUE as u32,
    )
}

fn respond(listener: &OwnedFd, id: u64, val: i64, error: i32, flags: u32) -> io::Result<()> {
    let mut resp = libc::seccomp_notif_resp {
        id,
        val,
        error,
        flags,
    };
    // SAFETY: `resp` is a valid seccomp_notif_resp.
    cvt(unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            libc::SECCOMP_IOCTL_NOTIF_SEND,
            &mut resp,
        )
    })
    .map(|_| ())
}

/// Whether notification `id` is still pending (its thread has not gone away), so a
/// pid or descriptor taken for it still names the right process.
pub fn notif_valid(listener: &OwnedFd, id: u64) -> bool {
    let mut id = id;
    // SAFETY: a u64 argument.
    unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            libc::SECCOMP_IOCTL_NOTIF_ID_VALID,
            &mut id,
        ) == 0
    }
}

/// Installs `fd` in the caller of notification `id`: at number `at` (replacing what is
/// there) or the lowest free one; `send` also answers the call with the new number.
/// Returns the number.
pub fn notif_addfd(
    listener: &OwnedFd,
    id: u64,
    fd: &OwnedFd,
    at: Option<u32>,
    cloexec: bool,
    send: bool,
) -> io::Result<i32> {
    let mut flags = 0;
    if at.is_some() {
        flags |= libc::SECCOMP_ADDFD_FLAG_SETFD as u32;
    }
    if send {
        flags |= libc::SECCOMP_ADDFD_FLAG_SEND as u32;
    }
    let mut a = libc::seccomp_notif_addfd {
        id,
        flags,
        srcfd: fd.as_raw_fd() as u32,
        newfd: at.unwrap_or(0),
        newfd_flags: if cloexec { libc::O_CLOEXEC as u32 } else { 0 },
    };
    // SAFETY: `a` is a valid seccomp_notif_addfd naming our own descriptor.
    cvt(unsafe {
        libc::ioctl(
            listener.as_raw_fd(),
            libc::SECCOMP_IOCTL_NOTIF_ADDFD,
            &mut a,
        )
    })
}

/// PIDFD_THREAD (Linux 6.9): a pidfd for a thread, not only a process.
const PIDFD_THREAD: libc::c_int = libc::O_EXCL;

/// A pidfd for thread `tid` (a notification names the calling thread).
pub fn pidfd_of_thread(tid: u32) -> io::Result<OwnedFd> {
    // SAFETY: plain system call.
    let r = unsafe { libc::syscall(libc::SYS_pidfd_open, tid as libc::pid_t, PIDFD_THREAD) };
    if r >= 0 {
        return Ok(owned(r as RawFd));
    }
    // Older kernels: only a process leader has a pidfd.
    // SAFETY: plain system call.
    let r = unsafe { libc::syscall(libc::SYS_pidfd_open, tid as libc::pid_t, 0) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(owned(r as RawFd))
}

/// A copy of the target's descriptor `fd` (pidfd_getfd), close-on-exec.
pub fn take_fd(pidfd: &OwnedFd, fd: i32) -> io::Result<OwnedFd> {
    // SAFETY: plain system call; a new descriptor we own on success.
    let r = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(owned(r as RawFd))
}

/// Reads `len` bytes at `addr` in process `pid`.
pub fn vm_read(pid: u32, addr: u64, len: usize) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; len];
    if len == 0 {
        return Ok(buf);
    }
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut libc::c_void,
        iov_len: len,
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: len,
    };
    // SAFETY: `local` is our buffer of `len` bytes; the kernel checks `remote`.
    let n =
        cvt_size(unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, &remote, 1, 0) })?;
    if n != len {
        return Err(io::Error::from_raw_os_error(libc::EFAULT));
    }
    Ok(buf)
}

/// Writes `data` at `addr` in process `pid`.
pub fn vm_write(pid: u32, addr: u64, data: &[u8]) -> io::Result<()> {
    if data.is_empty() {
        return Ok(());
    }
    let local = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: data.len(),
    };
    // SAFETY: `local` is our buffer; the kernel checks `remote`.
    let n =
        cvt_size(unsafe { libc::process_vm_writev(pid as libc::pid_t, &local, 1, &remote, 1, 0) })?;
    if n != data.len() {
        return Err(io::Error::from_raw_os_error(libc::EFAULT));
    }
    Ok(())
}

/// SO_NETNS_COOKIE (Linux 5.14): the network namespace a socket lives in.
const SO_NETNS_COOKIE: libc::c_int = 71;

/// The network-namespace cookie of socket `fd` (ENOTSOCK for another kind).
pub fn netns_cookie(fd: &OwnedFd) -> io::Result<u64> {
    let mut v: u64 = 0;
    let mut len = std::mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: `v`/`len` are a u64 buffer and its length.
    cvt(unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            SO_NETNS_COOKIE,
            &mut v as *mut u64 as *mut libc::c_void,
            &mut len,
        )
    })?;
    Ok(v)
}

/// An int socket option.
pub fn sockopt_int(fd: &OwnedFd, level: i32, name: i32) -> io::Result<i32> {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `v`/`len` are an int buffer and its length.
    cvt(unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            level,
            name,
            &mut v as *mut libc::c_int as *mut libc::c_void,
            &mut len,
        )
    })?;
    Ok(v)
}

/// A sockaddr in the program's bytes → an address (AF_INET, AF_INET6 only).
pub fn addr_from_bytes(b: &[u8]) -> Option<CanalAddr> {
    let mut ss = zeroed_storage();
    let n = b.len().min(std::mem::size_of::<libc::sockaddr_storage>());
    // SAFETY: copying at most sizeof(sockaddr_storage) bytes into it.
    unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), &mut ss as *mut _ as *mut u8, n) };
    let need = match ss.ss_family as i32 {
        libc::AF_INET => std::mem::size_of::<libc::sockaddr_in>(),
        libc::AF_INET6 => std::mem::size_of::<libc::sockaddr_in6>(),
        _ => return None,
    };
    (b.len() >= need).then(|| from_sockaddr(&ss)).flatten()
}

/// An address as sockaddr bytes.
pub fn addr_to_bytes(a: &CanalAddr) -> Vec<u8> {
    let mut ss = zeroed_storage();
    let len = to_sockaddr(a, &mut ss) as usize;
    // SAFETY: `ss` holds `len` initialised bytes of sockaddr.
    unsafe { std::slice::from_raw_parts(&ss as *const _ as *const u8, len) }.to_vec()
}

/// sendto with the program's bytes and flags.
pub fn send_to(fd: &OwnedFd, data: &[u8], flags: i32, to: Option<&CanalAddr>) -> io::Result<usize> {
    let mut ss = zeroed_storage();
    let len = to.map_or(0, |a| to_sockaddr(a, &mut ss));
    let p = if to.is_some() {
        &ss as *const _ as *const libc::sockaddr
    } else {
        std::ptr::null()
    };
    // SAFETY: `data` is our buffer; `ss` holds `len` bytes of sockaddr (or none).
    cvt_size(unsafe {
        libc::sendto(
            fd.as_raw_fd(),
            data.as_ptr() as *const libc::c_void,
            data.len(),
            flags,
            p,
            len,
        )
    })
}

/// sendmsg of one buffer with the program's ancillary data and flags, to `to` (None:
/// the connected peer).
pub fn send_msg(
    fd: &OwnedFd,
    data: &[u8],
    control: &[u8],
    flags: i32,
    to: Option<&CanalAddr>,
) -> io::Result<usize> {
    let mut ss = zeroed_storage();
    let len = to.map_or(0, |a| to_sockaddr(a, &mut ss));
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    let mut control = control.to_vec();
    // SAFETY: msghdr is plain data; all-zero is valid.
    let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
    if to.is_some() {
        m.msg_name = &mut ss as *mut _ as *mut libc::c_void;
        m.msg_namelen = len;
    }
    m.msg_iov = &mut iov;
    m.msg_iovlen = 1;
    if !control.is_empty() {
        m.msg_control = control.as_mut_ptr() as *mut libc::c_void;
        m.msg_controllen = control.len();
    }
    // SAFETY: every pointer in `m` names a live local buffer of the given length.
    cvt_size(unsafe { libc::sendmsg(fd.as_raw_fd(), &m, flags) })
}

/// What recvmsg returned: bytes, source, ancillary data, msg_flags.
pub struct MsgIn {
    pub len: usize,
    pub src: Option<CanalAddr>,
    pub control: Vec<u8>,
    pub flags: i32,
}

/// recvmsg into `buf` with room for `control_cap` bytes of ancillary data.
pub fn recv_msg(fd: &OwnedFd, buf: &mut [u8], control_cap: usize, flags: i32) -> io::Result<MsgIn> {
    let mut ss = zeroed_storage();
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    let mut control = vec![0u8; control_cap];
    // SAFETY: msghdr is plain data; all-zero is valid.
    let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
    m.msg_name = &mut ss as *mut _ as *mut libc::c_void;
    m.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    m.msg_iov = &mut iov;
    m.msg_iovlen = 1;
    if control_cap > 0 {
        m.msg_control = control.as_mut_ptr() as *mut libc::c_void;
        m.msg_controllen = control_cap;
    }
    // SAFETY: every pointer in `m` names a live local buffer of the given length.
    let len = cvt_size(unsafe { libc::recvmsg(fd.as_raw_fd(), &mut m, flags) })?;
    control.truncate(m.msg_controllen.min(control_cap));
    Ok(MsgIn {
        len,
        src: from_sockaddr(&ss),
        control,
        flags: m.msg_flags,
    })
}

/// recvfrom with the program's flags: (bytes, source).
pub fn recv_from(
    fd: &OwnedFd,
    buf: &mut [u8],
    flags: i32,
) -> io::Result<(usize, Option<CanalAddr>)> {
    let mut ss = zeroed_storage();
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: the kernel writes at most buf.len() bytes and `len` bytes of address.
    let n = cvt_size(unsafe {
        libc::recvfrom(
            fd.as_raw_fd(),
            buf.as_mut_ptr() as *mut libc::c_void,
            buf.len(),
            flags,
            &mut ss as *mut _ as *mut libc::sockaddr,
            &mut len,
        )
    })?;
    Ok((n, from_sockaddr(&ss)))
}

/// Waits until `fd` is readable (or has an error), at most `ms` (−1: forever).
pub fn wait_readable(fd: &OwnedFd, ms: i32) -> io::Result<bool> {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd.
    let n = cvt(unsafe { libc::poll(&mut p, 1, ms) })?;
    Ok(n > 0)
}

/// The file's status flags (O_NONBLOCK …) and setting them.
pub fn status_flags(fd: &OwnedFd) -> io::Result<i32> {
    // SAFETY: plain fcntl.
    cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) })
}

pub fn set_status_flags(fd: &OwnedFd, flags: i32) -> io::Result<()> {
    // SAFETY: plain fcntl.
    cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags) }).map(|_| ())
}

/// A socket of the program's type, created here (close-on-exec; its O_NONBLOCK as
/// asked).
pub fn socket_like(domain: i32, ty: i32, protocol: i32, nonblock: bool) -> io::Result<OwnedFd> {
    let flags = if nonblock { libc::SOCK_NONBLOCK } else { 0 };
    // SAFETY: plain call.
    Ok(owned(cvt(unsafe {
        libc::socket(domain, ty | flags | libc::SOCK_CLOEXEC, protocol)
    })?))
}

/// Installs a seccomp filter (classic BPF `prog`) on the calling thread and returns its
/// notification listener. The caller must hold CAP_SYS_ADMIN in its user namespace
/// or have set no_new_privs.
pub fn install_filter(prog: &[libc::sock_filter]) -> io::Result<OwnedFd> {
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: `fprog` points at `prog`, alive for the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            libc::SECCOMP_FILTER_FLAG_NEW_LISTENER,
            &fprog as *const libc::sock_fprog,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(owned(r as RawFd))
}

/// The inode of a descriptor (a socket's identity).
pub fn inode_of(fd: &OwnedFd) -> io::Result<u64> {
    Ok(rustix::fs::fstat(fd)?.st_ino)
}

/// Whether `fd` is a seccomp notification listener.
pub fn is_seccomp_listener(fd: &OwnedFd) -> bool {
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .is_ok_and(|l| l.as_os_str() == "anon_inode:seccomp notify")
}
