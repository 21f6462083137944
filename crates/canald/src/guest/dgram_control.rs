//! Control messages of datagram records (protocol §5, minor 12): what of a guest's
//! record reaches the host socket's `sendmsg` (a fixed list, addresses checked and,
//! in a network's view, translated), and the guest's view of what the host socket's
//! `recvmsg` produced. A guest's bytes are untrusted: anything off the list, or of the
//! wrong size, drops the datagram with EINVAL (libcanal checked them as the kernel
//! does, so only a hostile guest gets here).
use crate::guest::addr_view::translate_host_local;
use crate::guest::addr_view::GuestView;
use crate::guest::netview::is_own;
use crate::guest::netview::is_private_lo;
use canal_abi::cmsg;
use canal_abi::cmsg::Cmsg;
use canal_abi::cmsg::MAX_CONTROL;
use canal_abi::CanalAddr;

/// The guest's loopback inside a network's view (its `lo`).
const LO_IFINDEX: i32 = 1;

fn v4_at(data: &[u8], at: usize) -> [u8; 4] {
    let mut b = [0; 4];
    b.copy_from_slice(&data[at..at + 4]);
    b
}

fn v6_at(data: &[u8], at: usize) -> [u8; 16] {
    let mut b = [0; 16];
    b.copy_from_slice(&data[at..at + 16]);
    b
}

/// The source a packet-info message names (in_pktinfo: ifindex, spec_dst, addr;
/// in6_pktinfo: addr, ifindex), if `m` is one of the size the kernel reads.
fn pktinfo_source(m: &Cmsg<'_>) -> Option<CanalAddr> {
    match (m.level, m.kind, m.data.len()) {
        (libc::IPPROTO_IP, libc::IP_PKTINFO, 12) => Some(CanalAddr::v4(v4_at(m.data, 4), 0)),
        (libc::IPPROTO_IPV6, libc::IPV6_PKTINFO, 20) => {
            Some(CanalAddr::v6(v6_at(m.data, 0), 0, 0, 0))
        }
        _ => None,
    }
}

/// Checks a guest's tx control messages and appends what the host's `sendmsg` gets
/// to `out`; Err(errno) drops the datagram.
pub(crate) fn tx_control(view: &GuestView, ctl: &[u8], out: &mut Vec<u8>) -> Result<(), i32> {
    let in_view = view.net.is_some();
    for m in cmsg::parse(ctl) {
        let m = m.map_err(|_| libc::EINVAL)?;
        let keep = match pktinfo_source(&m) {
            // In a view the guest's own source (its loopback, 10.0.2.15, none) is the
            // host socket's binding; another is not the guest's to use.
            Some(src) if in_view && is_own(&src) => false,
            // Another network's private loopback is never a host guest's source (it
            // would pass that network's own-datagram check).
            Some(src) if in_view || is_private_lo(&src) => return Err(libc::EINVAL),
            Some(_) => true,
            None => match (m.level, m.kind, m.data.len()) {
                (libc::IPPROTO_IP, libc::IP_TTL, 4)
                | (libc::IPPROTO_IP, libc::IP_TOS, 1 | 4)
                | (libc::IPPROTO_IPV6, libc::IPV6_HOPLIMIT | libc::IPV6_TCLASS, 4)
                | (libc::IPPROTO_IPV6, libc::IPV6_DONTFRAG, 4)
                | (libc::SOL_UDP, libc::UDP_SEGMENT, 2) => true,
                _ => return Err(libc::EINVAL),
            },
        };
        if keep {
            let mut at = out.len();
            out.resize(at + cmsg::space(m.data.len()), 0);
            cmsg::push(out, &mut at, &m);
        }
    }
    Ok(())
}

/// The guest's view of the host socket's received control messages `ctl` (a datagram
/// from `src`), appended to `out` (at most MAX_CONTROL bytes). In a network's view the
/// local addresses packet info and the original destination name are the guest's
/// (127.0.0.1, 10.0.2.15, ...), on the guest's loopback interface.
pub(crate) fn rx_control(view: &GuestView, ctl: &[u8], src: Option<&CanalAddr>, out: &mut Vec<u8>) {
    let mut buf = [0u8; MAX_CONTROL];
    for m in cmsg::parse(ctl) {
        let Ok(m) = m else { break };
        let data = &mut buf[..m.data.len().min(MAX_CONTROL)];
        data.copy_from_slice(&m.data[..data.len()]);
        if view.net.is_some() {
            guest_local_view(view, m.level, m.kind, data, src);
        }
        let mut at = out.len();
        if at + cmsg::space(data.len()) > MAX_CONTROL {
            break;
        }
        out.resize(at + cmsg::space(data.len()), 0);
        cmsg::push(out, &mut at, &Cmsg { data, ..m });
    }
}

/// Rewrites the local addresses of one received message into a network's view.
fn guest_local_view(
    view: &GuestView,
    level: i32,
    kind: i32,
    data: &mut [u8],
    src: Option<&CanalAddr>,
) {
    let local4 = |ip: [u8; 4], port: u16| {
        let a = translate_host_local(view, &CanalAddr::v4(ip, port), src);
        (a.ip4(), a.port)
    };
    let local6 = |ip: [u8; 16], port: u16| {
        let a = translate_host_local(view, &CanalAddr::v6(ip, port, 0, 0), src);
        let ip = match a.family {
            canal_abi::addr::FAMILY_INET => {
                std::net::Ipv4Addr::from(a.ip4()).to_ipv6_mapped().octets()
            }
            _ => a.addr,
        };
        (ip, a.port)
    };
    match (level, kind, data.len()) {
        (libc::IPPROTO_IP, libc::IP_PKTINFO, 12) => {
            data[0..4].copy_from_slice(&LO_IFINDEX.to_ne_bytes());
            for at in [4, 8] {
                let (ip, _) = local4(v4_at(data, at), 0);
                data[at..at + 4].copy_from_slice(&ip);
            }
        }
        // sockaddr_in: family, port (network order), address.
        (libc::IPPROTO_IP, libc::IP_ORIGDSTADDR, 16) => {
            let port = u16::from_be_bytes([data[2], data[3]]);
            let (ip, port) = local4(v4_at(data, 4), port);
            data[2..4].copy_from_slice(&port.to_be_bytes());
            data[4..8].copy_from_slice(&ip);
        }
        (libc::IPPROTO_IPV6, libc::IPV6_PKTINFO, 20) => {
            let (ip, _) = local6(v6_at(data, 0), 0);
            data[0..16].copy_from_slice(&ip);
            data[16..20].copy_from_slice(&LO_IFINDEX.to_ne_bytes());
        }
        // sockaddr_in6: family, port, flowinfo, address, scope.
        (libc::IPPROTO_IPV6, libc::IPV6_ORIGDSTADDR, 28) => {
            let port = u16::from_be_bytes([data[2], data[3]]);
            let (ip, port) = local6(v6_at(data, 8), port);
            data[2..4].copy_from_slice(&port.to_be_bytes());
            data[8..24].copy_from_slice(&ip);
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(level: i32, kind: i32, data: &[u8]) -> Vec<u8> {
        let mut v = vec![0u8; cmsg::space(data.len())];
        let mut at = 0;
        cmsg::push(&mut v, &mut at, &Cmsg { level, kind, data });
        v
    }

    fn host_view() -> GuestView {
        GuestView {
            loopback_only: false,
            net: None,
            policy: Default::default(),
        }
    }

    #[test]
    fn tx_keeps_the_list_and_refuses_the_rest() {
        let v = host_view();
        let mut out = Vec::new();
        let ttl = one(libc::IPPROTO_IP, libc::IP_TTL, &7i32.to_ne_bytes());
        tx_control(&v, &ttl, &mut out).unwrap();
        assert_eq!(out, ttl);
        let mark = one(libc::SOL_SOCKET, libc::SO_MARK, &1u32.to_ne_bytes());
        assert_eq!(tx_control(&v, &mark, &mut out), Err(libc::EINVAL));
        let rights = one(libc::SOL_SOCKET, libc::SCM_RIGHTS, &3i32.to_ne_bytes());
        assert_eq!(tx_control(&v, &rights, &mut out), Err(libc::EINVAL));
        let mut pk = [0u8; 12];
        pk[4..8].copy_from_slice(&[127, 100, 0, 9]);
        let spoof = one(libc::IPPROTO_IP, libc::IP_PKTINFO, &pk);
        assert_eq!(
            tx_control(&v, &spoof, &mut out),
            Err(libc::EINVAL),
            "another network's private loopback"
        );
        pk[4..8].copy_from_slice(&[127, 0, 0, 2]);
        let own = one(libc::IPPROTO_IP, libc::IP_PKTINFO, &pk);
        let mut out = Vec::new();
        tx_control(&v, &own, &mut out).unwrap();
        assert_eq!(out, own);
        let mut bad = ttl.clone();
        bad[0..8].copy_from_slice(&99u64.to_ne_bytes());
        assert_eq!(tx_control(&v, &bad, &mut out), Err(libc::EINVAL));
    }

    #[test]
    fn hostile_bytes_never_panic() {
        // Random lengths, levels and types, with and without valid headers.
        let v = host_view();
        let mut x = 0x9e3779b97f4a7c15u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..20_000 {
            let n = (next() % 200) as usize;
            let mut b: Vec<u8> = (0..n).map(|_| next() as u8).collect();
            if n >= 16 && next() % 2 == 0 {
                let len = 16 + next() % (n as u64 - 15);
                b[0..8].copy_from_slice(&len.to_ne_bytes());
                let lvl = [0i32, 41, 17, 1][(next() % 4) as usize];
                b[8..12].copy_from_slice(&lvl.to_ne_bytes());
            }
            let mut out = Vec::new();
            let _ = tx_control(&v, &b, &mut out);
            assert!(cmsg::parse(&out).all(|m| m.is_ok()));
            let mut out = Vec::new();
            rx_control(&v, &b, None, &mut out);
            assert!(out.len() <= MAX_CONTROL);
        }
    }

    #[test]
    fn rx_copies_in_the_host_view() {
        let v = host_view();
        let mut ctl = one(libc::IPPROTO_IP, libc::IP_PKTINFO, &[1; 12]);
        ctl.extend(one(libc::IPPROTO_IP, libc::IP_TTL, &64i32.to_ne_bytes()));
        let mut out = Vec::new();
        rx_control(&v, &ctl, None, &mut out);
        assert_eq!(out, ctl);
    }
}
