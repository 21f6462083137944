//! sock_diag (NETLINK_SOCK_DIAG, inet_diag): which socket the kernel would pick for an
//! address, and whose it is. Used for sockets canald does not hold itself (those a
//! seccomp-served program owns) when deciding what a guest network may reach.

use super::util::{cvt, cvt_size, owned};
use canal_abi::CanalAddr;
use std::io;
use std::os::fd::AsRawFd;

const NETLINK_SOCK_DIAG: i32 = 4;
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const NLMSG_ERROR: u16 = 2;

/// The socket the kernel finds for (`local`, `remote`) — a listener or bound datagram
/// socket when `remote` is None — as (its local address, its owner's uid).
pub fn diag_lookup(
    proto: u8,
    local: &CanalAddr,
    remote: Option<&CanalAddr>,
) -> io::Result<Option<(CanalAddr, u32)>> {
    let family = local.family;
    // SAFETY: plain socket call; owned below.
    let s = owned(cvt(unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            NETLINK_SOCK_DIAG,
        )
    })?);
    let ip = |a: &CanalAddr| -> [u8; 16] {
        let mut b = [0u8; 16];
        if a.family == canal_abi::addr::FAMILY_INET {
            b[..4].copy_from_slice(&a.ip4());
        } else {
            b = a.addr;
        }
        b
    };
    let zero = CanalAddr {
        family,
        ..Default::default()
    };
    let remote = remote.unwrap_or(&zero);
    // TCP looks a socket up by (src = its local end, dst = its remote end); UDP's
    // lookup takes the id as a packet's (src = the remote end, dst = the socket).
    let (local, remote) = if proto == libc::IPPROTO_UDP as u8 {
        (remote, local)
    } else {
        (local, remote)
    };
    // nlmsghdr (16) + inet_diag_req_v2 (56).
    let mut m = Vec::with_capacity(72);
    m.extend_from_slice(&72u32.to_ne_bytes());
    m.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    m.extend_from_slice(&(libc::NLM_F_REQUEST as u16).to_ne_bytes());
    m.extend_from_slice(&1u32.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    m.extend_from_slice(&[family as u8, proto, 0, 0]);
    m.extend_from_slice(&u32::MAX.to_ne_bytes()); // every state
    m.extend_from_slice(&local.port.to_be_bytes());
    m.extend_from_slice(&remote.port.to_be_bytes());
    m.extend_from_slice(&ip(local));
    m.extend_from_slice(&ip(remote));
    m.extend_from_slice(&0u32.to_ne_bytes()); // interface
    m.extend_from_slice(&[0xff; 8]); // INET_DIAG_NOCOOKIE
                                     // SAFETY: sending our buffer.
    cvt_size(unsafe { libc::send(s.as_raw_fd(), m.as_ptr().cast(), m.len(), 0) })?;
    let mut buf = [0u8; 8192];
    // SAFETY: receiving into our buffer.
    let n = cvt_size(unsafe { libc::recv(s.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) })?;
    let b = &buf[..n];
    if n < 16 {
        return Err(io::Error::from_raw_os_error(libc::EIO));
    }
    let kind = u16::from_ne_bytes([b[4], b[5]]);
    if kind == NLMSG_ERROR {
        let e = i32::from_ne_bytes([b[16], b[17], b[18], b[19]]);
        return if e == -libc::ENOENT {
            Ok(None)
        } else {
            Err(io::Error::from_raw_os_error(-e))
        };
    }
    // inet_diag_msg: family, state, timer, retrans, then the sockid (sport, dport,
    // src[16], dst[16], if, cookie[8]) at 4, expires, rqueue, wqueue, uid at 64.
    let d = b
        .get(16..16 + 72)
        .ok_or_else(|| io::Error::from_raw_os_error(libc::EIO))?;
    let sport = u16::from_be_bytes([d[4], d[5]]);
    let src: [u8; 16] = d[8..24].try_into().expect("16 bytes");
    let uid = u32::from_ne_bytes([d[64], d[65], d[66], d[67]]);
    let found = if d[0] as u16 == canal_abi::addr::FAMILY_INET {
        CanalAddr::v4([src[0], src[1], src[2], src[3]], sport)
    } else {
        CanalAddr::v6(src, sport, 0, 0)
    };
    Ok(Some((found, uid)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_listeners_and_connections_with_their_owner() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        // SAFETY: plain query.
        let me = unsafe { libc::geteuid() };
        let found = diag_lookup(6, &CanalAddr::v4([127, 0, 0, 1], port), None).unwrap();
        assert_eq!(found, Some((CanalAddr::v4([127, 0, 0, 1], port), me)));
        let c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let cp = c.local_addr().unwrap().port();
        let found = diag_lookup(
            6,
            &CanalAddr::v4([127, 0, 0, 1], cp),
            Some(&CanalAddr::v4([127, 0, 0, 1], port)),
        )
        .unwrap();
        assert_eq!(found.map(|f| f.0.port), Some(cp));
        drop(l);
        let free = diag_lookup(6, &CanalAddr::v4([127, 0, 0, 1], port), None).unwrap();
        assert!(free.is_none_or(|f| f.0.port != port || f.0.ip4() != [127, 0, 0, 1]));
    }

    #[test]
    fn finds_bound_datagram_sockets() {
        let u = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let port = u.local_addr().unwrap().port();
        let at = CanalAddr::v4([127, 0, 0, 1], port);
        let found = diag_lookup(17, &at, None).unwrap();
        assert_eq!(found.map(|f| f.0), Some(at));
        let peer = CanalAddr::v4([127, 0, 0, 1], 9);
        assert_eq!(
            diag_lookup(17, &at, Some(&peer)).unwrap().map(|f| f.0),
            Some(at)
        );
        drop(u);
        assert!(diag_lookup(17, &at, None)
            .unwrap()
            .is_none_or(|f| f.0 != at));
    }
}

#[cfg(test)]
mod v6_tests {
    use super::*;

    #[test]
    fn finds_a_dual_stack_listener_by_its_ipv4_address() {
        let l = std::net::TcpListener::bind("[::ffff:127.0.0.1]:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let found = diag_lookup(6, &CanalAddr::v4([127, 0, 0, 1], port), None).unwrap();
        assert!(found.is_some_and(|f| f.0.port == port), "{found:?}");
    }
}
