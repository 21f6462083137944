//! The host sockets canald drives for guests: addresses, socket calls, options.

use super::util::{cvt, cvt_size, errno_of, owned};
use canal_abi::CanalAddr;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

pub(crate) fn zeroed_storage() -> libc::sockaddr_storage {
    // SAFETY: sockaddr_storage is plain data; all-zero is valid.
    unsafe { std::mem::zeroed() }
}

/// Encodes `a` into `ss`; returns the sockaddr length.
pub(crate) fn to_sockaddr(a: &CanalAddr, ss: &mut libc::sockaddr_storage) -> libc::socklen_t {
    if a.family == canal_abi::addr::FAMILY_INET {
        let sin = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: a.port.to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from_ne_bytes(a.ip4()),
            },
            sin_zero: [0; 8],
        };
        // SAFETY: sockaddr_storage is larger than and suitably aligned for sockaddr_in.
        unsafe { std::ptr::write(ss as *mut _ as *mut libc::sockaddr_in, sin) };
        std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t
    } else {
        let sin6 = libc::sockaddr_in6 {
            sin6_family: libc::AF_INET6 as libc::sa_family_t,
            sin6_port: a.port.to_be(),
            sin6_flowinfo: a.flowinfo.to_be(),
            sin6_addr: libc::in6_addr { s6_addr: a.addr },
            sin6_scope_id: a.scope_id,
        };
        // SAFETY: sockaddr_storage is larger than and suitably aligned for sockaddr_in6.
        unsafe { std::ptr::write(ss as *mut _ as *mut libc::sockaddr_in6, sin6) };
        std::mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t
    }
}

pub(crate) fn from_sockaddr(ss: &libc::sockaddr_storage) -> Option<CanalAddr> {
    match ss.ss_family as i32 {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let sin = unsafe { &*(ss as *const _ as *const libc::sockaddr_in) };
            Some(CanalAddr::v4(
                sin.sin_addr.s_addr.to_ne_bytes(),
                u16::from_be(sin.sin_port),
            ))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let s6 = unsafe { &*(ss as *const _ as *const libc::sockaddr_in6) };
            Some(CanalAddr::v6(
                s6.sin6_addr.s6_addr,
                u16::from_be(s6.sin6_port),
                u32::from_be(s6.sin6_flowinfo),
                s6.sin6_scope_id,
            ))
        }
        _ => None,
    }
}

/// A non-blocking, close-on-exec inet socket.
pub(crate) fn socket(domain: i32, ty: i32, protocol: i32) -> io::Result<OwnedFd> {
    // SAFETY: plain call.
    Ok(owned(cvt(unsafe {
        libc::socket(
            domain,
            ty | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            protocol,
        )
    })?))
}

pub(crate) fn bind(fd: &OwnedFd, a: &CanalAddr) -> io::Result<()> {
    let mut ss = zeroed_storage();
    let len = to_sockaddr(a, &mut ss);
    // SAFETY: ss holds a valid sockaddr of `len` bytes.
    cvt(unsafe {
        libc::bind(
            fd.as_raw_fd(),
            &ss as *const _ as *const libc::sockaddr,
            len,
        )
    })
    .map(|_| ())
}

/// connect(AF_UNSPEC): dissolves a datagram socket's association.
pub(crate) fn disconnect(fd: &OwnedFd) -> io::Result<()> {
    // SAFETY: sockaddr is plain data; zeroed is AF_UNSPEC.
    let sa: libc::sockaddr = unsafe { core::mem::zeroed() };
    // SAFETY: sa is a valid sockaddr of the given size.
    cvt(unsafe {
        libc::connect(
            fd.as_raw_fd(),
            &sa,
            core::mem::size_of::<libc::sockaddr>() as libc::socklen_t,
        )
    })
    .map(|_| ())
}

pub(crate) fn connect(fd: &OwnedFd, a: &CanalAddr) -> io::Result<()> {
    let mut ss = zeroed_storage();
    let len = to_sockaddr(a, &mut ss);
    // SAFETY: ss holds a valid sockaddr of `len` bytes.
    cvt(unsafe {
        libc::connect(
            fd.as_raw_fd(),
            &ss as *const _ as *const libc::sockaddr,
            len,
        )
    })
    .map(|_| ())
}

pub(crate) fn listen(fd: &OwnedFd, backlog: i32) -> io::Result<()> {
    // SAFETY: plain call.
    cvt(unsafe { libc::listen(fd.as_raw_fd(), backlog) }).map(|_| ())
}

/// Makes host listener `fd` drop every packet that reaches it (`on`: a classic BPF
/// program that keeps 0 bytes, as a full accept queue drops SYNs and handshake ACKs),
/// or take them again. A socket accepted while the filter was on inherits it
/// (`sk_clone_lock`), so such a socket is cleared with `on` false too (ENOENT, no
/// filter, is fine).
pub(crate) fn refuse_all(fd: &OwnedFd, on: bool) -> io::Result<()> {
    let code = [libc::sock_filter {
        code: (libc::BPF_RET | libc::BPF_K) as u16,
        jt: 0,
        jf: 0,
        k: 0,
    }];
    let prog = libc::sock_fprog {
        len: 1,
        filter: code.as_ptr() as *mut libc::sock_filter,
    };
    let zero: libc::c_int = 0;
    let (name, value, len) = if on {
        (
            libc::SO_ATTACH_FILTER,
            &prog as *const libc::sock_fprog as *const libc::c_void,
            std::mem::size_of::<libc::sock_fprog>(),
        )
    } else {
        (
            libc::SO_DETACH_FILTER,
            &zero as *const libc::c_int as *const libc::c_void,
            std::mem::size_of::<libc::c_int>(),
        )
    };
    // SAFETY: `value` points at a live struct of `len` bytes (`prog` points at `code`,
    // which outlives the call; the kernel copies the program).
    let r = cvt(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            name,
            value,
            len as libc::socklen_t,
        )
    });
    match r {
        Err(e) if !on && e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
        r => r.map(|_| ()),
    }
}

/// Connections a TCP listener's accept queue holds now: TCP_INFO's `tcpi_unacked`,
/// which for a listener is the kernel's `sk_ack_backlog` (the u32 at byte 24, after
/// eight u8 fields and rto, ato, snd_mss, rcv_mss; stable ABI since Linux 2.4).
pub(crate) fn accept_queue_len(fd: &OwnedFd) -> io::Result<u32> {
    let mut info = [0u8; 28];
    let n = getsockopt_bytes(fd, libc::IPPROTO_TCP, libc::TCP_INFO, &mut info)?;
    if n < info.len() {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    Ok(u32::from_ne_bytes([info[24], info[25], info[26], info[27]]))
}

/// `net.core.somaxconn` of canald's network namespace (read once; the kernel's
/// default when unreadable).
pub(crate) fn somaxconn() -> u32 {
    static V: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *V.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/net/core/somaxconn")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(4096)
    })
}

pub(crate) fn shutdown(fd: &OwnedFd, how: i32) -> io::Result<()> {
    // SAFETY: plain call.
    cvt(unsafe { libc::shutdown(fd.as_raw_fd(), how) }).map(|_| ())
}

/// accept4 on a descriptor that may block (a served program's listener).
pub fn accept_flags(fd: &OwnedFd, flags: i32) -> io::Result<(OwnedFd, Option<CanalAddr>)> {
    let mut ss = zeroed_storage();
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: the kernel writes at most `len` bytes of address into `ss`.
    let r = unsafe {
        libc::accept4(
            fd.as_raw_fd(),
            &mut ss as *mut _ as *mut libc::sockaddr,
            &mut len,
            flags,
        )
    };
    Ok((owned(cvt(r)?), from_sockaddr(&ss)))
}

/// Accepts one connection (non-blocking, close-on-exec) and its peer address.
/// Ok(None): none pending.
pub(crate) fn accept_inet(fd: &OwnedFd) -> io::Result<Option<(OwnedFd, Option<CanalAddr>)>> {
    match accept_flags(fd, libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC) {
        Ok(c) => Ok(Some(c)),
        Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => Ok(None),
        Err(e) => Err(e),
    }
}

fn name_of(
    fd: &OwnedFd,
    f: unsafe extern "C" fn(libc::c_int, *mut libc::sockaddr, *mut libc::socklen_t) -> libc::c_int,
) -> io::Result<CanalAddr> {
    let mut ss = zeroed_storage();
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    // SAFETY: `f` is getsockname or getpeername; the kernel writes at most `len` bytes.
    cvt(unsafe {
        f(
            fd.as_raw_fd(),
            &mut ss as *mut _ as *mut libc::sockaddr,
            &mut len,
        )
    })?;
    from_sockaddr(&ss).ok_or_else(|| io::Error::from_raw_os_error(libc::EAFNOSUPPORT))
}

pub(crate) fn sockname(fd: &OwnedFd) -> io::Result<CanalAddr> {
    name_of(fd, libc::getsockname)
}

pub(crate) fn peername(fd: &OwnedFd) -> io::Result<CanalAddr> {
    name_of(fd, libc::getpeername)
}

pub(crate) fn setsockopt_bytes(fd: &OwnedFd, level: i32, name: i32, val: &[u8]) -> io::Result<()> {
    // SAFETY: the kernel reads val.len() bytes from a live slice.
    cvt(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            val.as_ptr() as *const libc::c_void,
            val.len() as libc::socklen_t,
        )
    })
    .map(|_| ())
}

/// Returns the option's length as the kernel reports it.
pub(crate) fn getsockopt_bytes(
    fd: &OwnedFd,
    level: i32,
    name: i32,
    out: &mut [u8],
) -> io::Result<usize> {
    let mut len = out.len() as libc::socklen_t;
    // SAFETY: the kernel writes at most `len` bytes into `out`.
    cvt(unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            level,
            name,
            out.as_mut_ptr() as *mut libc::c_void,
            &mut len,
        )
    })?;
    Ok((len as usize).min(out.len()))
}

/// Sets SO_LINGER on a host socket canald drives: `abort` = {1, 0}, so the socket's
/// close (canald's own, or the kernel's when canald dies) resets the connection
/// instead of ending it with a FIN; else {0, 0}, a close that never blocks and lets the
/// kernel deliver what is queued. canald never sets a lingering timeout (it would block
/// the poller in close); a guest's SO_LINGER is emulated (`guest::socket::HostSocket::linger`).
pub(crate) fn set_abortive_close(fd: &OwnedFd, abort: bool) -> io::Result<()> {
    let l = libc::linger {
        l_onoff: abort as libc::c_int,
        l_linger: 0,
    };
    // SAFETY: `l` is a live linger struct of the size passed.
    cvt(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            &l as *const libc::linger as *const libc::c_void,
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    })
    .map(|_| ())
}

pub(crate) fn so_error(fd: &OwnedFd) -> i32 {
    let mut b = [0u8; 4];
    match getsockopt_bytes(fd, libc::SOL_SOCKET, libc::SO_ERROR, &mut b) {
        Ok(_) => i32::from_ne_bytes(b),
        Err(e) => errno_of(&e),
    }
}

/// One received datagram: payload bytes, source, and control bytes (in the buffer
/// given to `recvmsg_dgram`).
pub(crate) struct Received {
    pub(crate) len: usize,
    pub(crate) from: Option<CanalAddr>,
    pub(crate) control_len: usize,
}

/// Receives one datagram into `buf`, its control messages into `control` (what the
/// socket's options ask for: packet info, TTL, timestamps, ...). Ok(None) when none
/// is pending.
pub(crate) fn recvmsg_dgram(
    fd: &OwnedFd,
    buf: &mut [u8],
    control: &mut [u8],
) -> io::Result<Option<Received>> {
    let mut ss = zeroed_storage();
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is plain data; all-zero is valid.
    let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
    m.msg_name = &mut ss as *mut _ as *mut libc::c_void;
    m.msg_namelen = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    m.msg_iov = &mut iov;
    m.msg_iovlen = 1;
    m.msg_control = control.as_mut_ptr() as *mut libc::c_void;
    m.msg_controllen = control.len() as _;
    // SAFETY: every pointer in `m` is a live local or borrowed buffer of the length
    // given; the kernel writes within them.
    let r = unsafe { libc::recvmsg(fd.as_raw_fd(), &mut m, 0) };
    match cvt_size(r) {
        Ok(len) => Ok(Some(Received {
            len,
            from: from_sockaddr(&ss),
            control_len: (m.msg_controllen as usize).min(control.len()),
        })),
        Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The host's own interface addresses (getifaddrs), for deciding whether a connect
/// target is this host.
pub(crate) fn local_addrs() -> Vec<CanalAddr> {
    let mut out = Vec::new();
    let mut ifa: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills ifa with a list we free below.
    if unsafe { libc::getifaddrs(&mut ifa) } != 0 {
        return out;
    }
    let mut p = ifa;
    while !p.is_null() {
        // SAFETY: p is a node of the list getifaddrs returned, not yet freed.
        let n = unsafe { &*p };
        if !n.ifa_addr.is_null() {
            let mut ss = zeroed_storage();
            // SAFETY: ifa_addr points to a sockaddr of its family's size; we copy at
            // most that many bytes into the (larger) storage.
            let fam = unsafe { (*n.ifa_addr).sa_family } as i32;
            let len = match fam {
                libc::AF_INET => std::mem::size_of::<libc::sockaddr_in>(),
                libc::AF_INET6 => std::mem::size_of::<libc::sockaddr_in6>(),
                _ => 0,
            };
            if len > 0 {
                // SAFETY: as above.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        n.ifa_addr as *const u8,
                        &mut ss as *mut _ as *mut u8,
                        len,
                    )
                };
                if let Some(a) = from_sockaddr(&ss) {
                    out.push(a);
                }
            }
        }
        p = n.ifa_next;
    }
    // SAFETY: ifa came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(ifa) };
    out
}

#[cfg(test)]
mod tests {
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::OwnedFd;
    use std::time::{Duration, Instant};

    #[test]
    fn accept_queue_len_counts_completed_handshakes() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let fd = OwnedFd::from(l);
        assert_eq!(super::accept_queue_len(&fd).unwrap(), 0);
        let clients: Vec<_> = (0..3).map(|_| TcpStream::connect(addr).unwrap()).collect();
        // The server's side of a loopback handshake may finish just after connect.
        let deadline = Instant::now() + Duration::from_secs(5);
        while super::accept_queue_len(&fd).unwrap() < 3 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(super::accept_queue_len(&fd).unwrap(), 3);
        drop(clients);
        let (c, _) = TcpListener::from(fd.try_clone().unwrap()).accept().unwrap();
        drop(c);
        assert_eq!(super::accept_queue_len(&fd).unwrap(), 2);
    }

    #[test]
    fn a_refusing_listener_lets_no_handshake_finish_until_it_stops() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let fd = OwnedFd::from(l);
        super::refuse_all(&fd, false).expect("no filter yet: fine");
        super::refuse_all(&fd, true).unwrap();
        let c = std::thread::spawn(move || TcpStream::connect(addr).map(|_| Instant::now()));
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(super::accept_queue_len(&fd).unwrap(), 0, "the SYN got in");
        let stopped = Instant::now();
        super::refuse_all(&fd, false).unwrap();
        // The client's SYN is retried (after 1 s) and now gets in.
        let connected = c.join().unwrap().expect("connected after the retry");
        assert!(connected > stopped);
        assert_eq!(super::accept_queue_len(&fd).unwrap(), 1);
    }
}
