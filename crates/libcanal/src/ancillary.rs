//! Control messages (ancillary data) of datagram sockets (protocol §5, minor 12):
//! which of a program's `sendmsg` control messages canal carries, checked as the
//! kernel's `ip_cmsg_send`/`ip6_datagram_send_ctl`/`__sock_cmsg_send` check them, and
//! a received record's messages written into `recvmsg`'s buffer as `put_cmsg` writes.
use canal_abi::cmsg;
use canal_abi::cmsg::Cmsg;
use canal_abi::cmsg::MAX_CONTROL;

/// The control messages one datagram carries to canald.
pub(crate) struct Outgoing {
    pub(crate) buf: [u8; MAX_CONTROL],
    pub(crate) len: usize,
}

impl Outgoing {
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

fn int_of(data: &[u8]) -> Option<i32> {
    Some(i32::from_ne_bytes(data.try_into().ok()?))
}

/// What the kernel does with one message on a socket of `family`: Ok(true) carry it,
/// Ok(false) ignore it, Err(errno) refuse the call.
fn judge(m: &Cmsg<'_>, family: i32) -> Result<bool, i32> {
    let v6 = family == libc::AF_INET6;
    let int_in = |lo: i32, hi: i32| match int_of(m.data) {
        Some(v) if (lo..=hi).contains(&v) => Ok(true),
        _ => Err(libc::EINVAL),
    };
    let verdict = match (m.level, m.kind) {
        // Descriptors and credentials mean nothing to an inet socket: the kernel
        // ignores them.
        (libc::SOL_SOCKET, libc::SCM_RIGHTS | libc::SCM_CREDENTIALS) => Ok(false),
        // A mark needs CAP_NET_RAW/CAP_NET_ADMIN; a guest never borrows canald's.
        (libc::SOL_SOCKET, libc::SO_MARK) => Err(libc::EPERM),
        // Transmit timestamps and launch times answer on the error queue, which canal
        // does not carry (docs/compat.md "ancillary data").
        (libc::SOL_SOCKET, _) => Err(libc::EINVAL),
        (libc::IPPROTO_IP, libc::IP_PKTINFO) if m.data.len() == 12 => Ok(true),
        (libc::IPPROTO_IP, libc::IP_TTL) => int_in(1, 255),
        (libc::IPPROTO_IP, libc::IP_TOS) if m.data.len() == 1 => Ok(true),
        (libc::IPPROTO_IP, libc::IP_TOS) => int_in(0, 255),
        (libc::IPPROTO_IP, _) => Err(libc::EINVAL),
        (libc::IPPROTO_IPV6, _) if !v6 => Ok(false),
        (libc::IPPROTO_IPV6, libc::IPV6_PKTINFO) if m.data.len() >= 20 => Ok(true),
        (libc::IPPROTO_IPV6, libc::IPV6_HOPLIMIT | libc::IPV6_TCLASS) => int_in(-1, 255),
        (libc::IPPROTO_IPV6, libc::IPV6_DONTFRAG) => int_in(i32::MIN, i32::MAX),
        (libc::IPPROTO_IPV6, _) => Err(libc::EINVAL),
        (libc::SOL_UDP, libc::UDP_SEGMENT) if m.data.len() == 2 => Ok(true),
        (libc::SOL_UDP, libc::UDP_SEGMENT) => Err(libc::EINVAL),
        // Other levels are not the socket's: ignored, as the kernel ignores them.
        _ => Ok(false),
    };
    // An IPv6 socket's IPv4 messages count only toward IPv4-mapped peers; elsewhere
    // the kernel skips them, so a bad one is dropped rather than refused.
    if v6 && m.level == libc::IPPROTO_IP {
        return Ok(verdict.unwrap_or(false));
    }
    verdict
}

/// The messages of `control` (a program's `msg_control`) canal carries for a
/// datagram socket of `family`, or the errno the kernel's sendmsg would give.
pub(crate) fn outgoing(control: &[u8], family: i32) -> Result<Outgoing, i32> {
    let mut out = Outgoing {
        buf: [0; MAX_CONTROL],
        len: 0,
    };
    for m in cmsg::parse(control) {
        let m = m.map_err(|_| libc::EINVAL)?;
        if !judge(&m, family)? {
            continue;
        }
        // IPV6_PKTINFO may be longer than its struct; the kernel reads the struct.
        let data = if (m.level, m.kind) == (libc::IPPROTO_IPV6, libc::IPV6_PKTINFO) {
            &m.data[..20]
        } else {
            m.data
        };
        let m = Cmsg { data, ..m };
        if !cmsg::push(&mut out.buf, &mut out.len, &m) {
            return Err(libc::ENOBUFS);
        }
    }
    Ok(out)
}

/// Writes a record's control messages into a program's control buffer `out` (None:
/// recvmsg without one, or recv/recvfrom); returns (bytes written, whether anything
/// was cut or left out — the answer's MSG_CTRUNC).
pub(crate) fn deliver(from_record: &[u8], out: Option<&mut [u8]>) -> (usize, bool) {
    let Some(out) = out else {
        return (0, cmsg::parse(from_record).next().is_some());
    };
    let mut at = 0;
    for m in cmsg::parse(from_record) {
        // canald wrote these; a malformed tail is left out.
        let Ok(m) = m else { break };
        if !cmsg::put(out, &mut at, &m) {
            return (at, true);
        }
    }
    (at, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(level: i32, kind: i32, data: &[u8]) -> Vec<u8> {
        let mut v = vec![0u8; cmsg::space(data.len())];
        let mut at = 0;
        assert!(cmsg::push(&mut v, &mut at, &Cmsg { level, kind, data }));
        v
    }

    #[test]
    fn kernel_checks() {
        let v4 = libc::AF_INET;
        let ttl = |v: i32| one(libc::IPPROTO_IP, libc::IP_TTL, &v.to_ne_bytes());
        assert_eq!(outgoing(&ttl(64), v4).unwrap().len, cmsg::space(4));
        assert_eq!(outgoing(&ttl(0), v4).err(), Some(libc::EINVAL));
        assert_eq!(outgoing(&ttl(256), v4).err(), Some(libc::EINVAL));
        let pk = one(libc::IPPROTO_IP, libc::IP_PKTINFO, &[0; 12]);
        assert_eq!(outgoing(&pk, v4).unwrap().len, 32);
        let pk_short = one(libc::IPPROTO_IP, libc::IP_PKTINFO, &[0; 8]);
        assert_eq!(outgoing(&pk_short, v4).err(), Some(libc::EINVAL));
        let mark = one(libc::SOL_SOCKET, libc::SO_MARK, &1u32.to_ne_bytes());
        assert_eq!(outgoing(&mark, v4).err(), Some(libc::EPERM));
        let rights = one(libc::SOL_SOCKET, libc::SCM_RIGHTS, &0i32.to_ne_bytes());
        assert_eq!(outgoing(&rights, v4).unwrap().len, 0, "ignored");
        let hop = one(libc::IPPROTO_IPV6, libc::IPV6_HOPLIMIT, &5i32.to_ne_bytes());
        assert_eq!(outgoing(&hop, v4).unwrap().len, 0, "not an IPv4 socket's");
        assert_eq!(outgoing(&hop, libc::AF_INET6).unwrap().len, 24);
        let gso = one(libc::SOL_UDP, libc::UDP_SEGMENT, &1200u16.to_ne_bytes());
        assert_eq!(outgoing(&gso, v4).unwrap().len, 24);
        // A bad IPv4 message on an IPv6 socket is skipped, not refused.
        assert_eq!(outgoing(&ttl(0), libc::AF_INET6).unwrap().len, 0);
        // A header the kernel refuses.
        let mut bad = ttl(64);
        bad[0..8].copy_from_slice(&100u64.to_ne_bytes());
        assert_eq!(outgoing(&bad, v4).err(), Some(libc::EINVAL));
        // Several, in order.
        let mut both = pk.clone();
        both.extend(ttl(9));
        let o = outgoing(&both, v4).unwrap();
        assert_eq!(o.bytes(), &both[..]);
    }

    #[test]
    fn deliver_sets_ctrunc() {
        let rec = one(libc::IPPROTO_IP, libc::IP_PKTINFO, &[1; 12]);
        let mut big = [0u8; 64];
        assert_eq!(deliver(&rec, Some(&mut big)), (32, false));
        let mut small = [0u8; 24];
        assert_eq!(deliver(&rec, Some(&mut small)), (24, true));
        assert_eq!(deliver(&rec, None), (0, true));
        assert_eq!(deliver(&[], None), (0, false));
    }
}
