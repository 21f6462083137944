//! Guest networks: which address view a guest gets (docs/isolation.md).
//!
//! canald tells a guest's network namespace by the process that connected (its
//! SO_PEERPIDFD and /proc), never by what the guest says. A guest in canald's own
//! namespace sees the host's addresses; a guest in any other namespace gets the
//! namespace's own view (`NetView`) — registered beforehand with NETWORK by `canal run
//! --isolate` (a name and published ports), or made on its first guest with no ports
//! published. VM regions get a view each (`vm.rs`). Views are shared by every guest of
//! a namespace and live while a guest or the registering connection uses them.
#![forbid(unsafe_code)]

use crate::guest::netview::{is_private_ip, NetView, Publish, PRIVATE_LO, PROTO_TCP, PROTO_UDP};
use crate::sys::{self, NsId};
use canal_abi::control::{NETWORK_BODY, NETWORK_OK_BODY, NETWORK_PUBLISH, VM_MAX_PUBLISH};
use canal_abi::{errno, CanalAddr};
use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Weak};

/// The daemon's registry of guest networks.
#[derive(Default)]
pub(crate) struct Networks {
    dns: Option<CanalAddr>,
    /// Every view alive (VMs', namespaces'), for private addresses and host ports.
    all: Vec<Weak<NetView>>,
    by_ns: HashMap<NsId, Weak<NetView>>,
    /// Registrations, by the control connection that holds them.
    registered: HashMap<u32, (NsId, Arc<NetView>)>,
    next_lo: u16,
}

/// The first IPv4 nameserver of /etc/resolv.conf (canald's default `--dns`).
pub(crate) fn host_resolver() -> Option<std::net::SocketAddrV4> {
    let text = std::fs::read_to_string("/etc/resolv.conf").ok()?;
    text.lines().find_map(|l| {
        let mut w = l.split_whitespace();
        (w.next() == Some("nameserver"))
            .then(|| w.next()?.parse().ok())
            .flatten()
            .map(|ip| std::net::SocketAddrV4::new(ip, 53))
    })
}

impl Networks {
    pub(crate) fn new(dns: Option<std::net::SocketAddrV4>) -> Networks {
        Networks {
            dns: dns.map(|d| CanalAddr::v4(d.ip().octets(), d.port())),
            ..Default::default()
        }
    }

    fn live(&mut self) -> Vec<Arc<NetView>> {
        self.all.retain(|w| w.strong_count() > 0);
        self.by_ns.retain(|_, w| w.strong_count() > 0);
        self.all.iter().filter_map(Weak::upgrade).collect()
    }

    /// A private loopback no live network uses (127.100.0.1 …).
    fn alloc_lo(&mut self, live: &[Arc<NetView>]) -> Result<[u8; 4], (i32, String)> {
        for _ in 0..u16::MAX {
            self.next_lo = self.next_lo.wrapping_add(1).max(1);
            let n = self.next_lo.to_be_bytes();
            let lo = [PRIVATE_LO[0], PRIVATE_LO[1], n[0], n[1]];
            if n[1] != 0 && n[1] != 255 && !live.iter().any(|v| v.lo == lo) {
                return Ok(lo);
            }
        }
        Err((errno::ENOSPC, "no private loopback address is free".into()))
    }

    fn make(
        &mut self,
        name: String,
        publish: Vec<Publish>,
        ns: Option<OwnedFd>,
    ) -> Result<Arc<NetView>, (i32, String)> {
        let live = self.live();
        check_publish(&publish, &live)?;
        let lo = self.alloc_lo(&live)?;
        let v = Arc::new(NetView::new(name, lo, publish, self.dns, ns));
        self.all.push(Arc::downgrade(&v));
        Ok(v)
    }

    /// A VM region's view (its `--publish` ports are TCP on the host's 127.0.0.1).
    pub(crate) fn vm(
        &mut self,
        name: &str,
        publish: &[(u16, u16)],
    ) -> Result<Arc<NetView>, (i32, String)> {
        let p = publish
            .iter()
            .map(|&(h, g)| Publish::tcp_loopback(h, g))
            .collect();
        self.make(format!("vm:{name}"), p, None)
    }

    /// The view of a guest attaching from namespace `ns` (`nsfd` pins it): the
    /// registered one, the one its namespace's earlier guests use, or a new one.
    pub(crate) fn for_guest(
        &mut self,
        ns: NsId,
        nsfd: OwnedFd,
    ) -> Result<Arc<NetView>, (i32, String)> {
        if let Some(v) = self.by_ns.get(&ns).and_then(Weak::upgrade) {
            return Ok(v);
        }
        let v = self.make(format!("netns:[{}]", ns.ino), Vec::new(), Some(nsfd))?;
        self.by_ns.insert(ns, Arc::downgrade(&v));
        Ok(v)
    }

    /// NETWORK from connection `key` (a peer in canald's own namespace, `own` its id).
    pub(crate) fn register(
        &mut self,
        key: u32,
        own: NsId,
        body: &[u8],
        nsfd: Option<OwnedFd>,
    ) -> Result<Arc<NetView>, (i32, String)> {
        let req = NetworkReq::decode(body).ok_or((errno::EINVAL, "malformed NETWORK".into()))?;
        let nsfd = nsfd.ok_or((errno::EINVAL, "NETWORK without a namespace".into()))?;
        let ns = sys::netns_of_fd(&nsfd)
            .map_err(|_| (errno::EINVAL, "not a network namespace descriptor".into()))?;
        if ns == own {
            return Err((
                errno::EINVAL,
                "that is canald's own network namespace".into(),
            ));
        }
        if self.registered.contains_key(&key) {
            return Err((
                errno::EINVAL,
                "this connection already registered a network".into(),
            ));
        }
        if self.by_ns.get(&ns).is_some_and(|w| w.strong_count() > 0) {
            return Err((
                errno::EEXIST,
                format!("{ns} already has guests or a registration"),
            ));
        }
        let v = self.make(format!("isolated:{}", req.name), req.publish, Some(nsfd))?;
        self.by_ns.insert(ns, Arc::downgrade(&v));
        self.registered.insert(key, (ns, v.clone()));
        Ok(v)
    }

    /// The view connection `key` registered.
    pub(crate) fn registered_view(&self, key: u32) -> Option<Arc<NetView>> {
        self.registered.get(&key).map(|(_, v)| v.clone())
    }

    /// Every live view (for `canal stat`).
    pub(crate) fn views(&self) -> Vec<Arc<NetView>> {
        self.all.iter().filter_map(Weak::upgrade).collect()
    }

    /// Connection `key` closed: its registration goes (guests keep their view).
    pub(crate) fn forget_conn(&mut self, key: u32) {
        self.registered.remove(&key);
    }
}

/// Published host ports are unique among live networks, not in canald's private
/// range, and name real ports.
fn check_publish(publish: &[Publish], live: &[Arc<NetView>]) -> Result<(), (i32, String)> {
    for (i, p) in publish.iter().enumerate() {
        if p.host_port == 0 || p.guest_port == 0 || is_private_ip(p.host_ip) {
            return Err((errno::EINVAL, format!("cannot publish {}", show(p))));
        }
        let clash = |q: &Publish| {
            q.proto == p.proto
                && q.host_port == p.host_port
                && (q.host_ip == p.host_ip || q.host_ip == [0; 4] || p.host_ip == [0; 4])
        };
        if publish[..i]
            .iter()
            .any(|q| clash(q) || (q.proto == p.proto && q.guest_port == p.guest_port))
        {
            return Err((errno::EINVAL, format!("{} is published twice", show(p))));
        }
        if let Some(v) = live.iter().find(|v| v.publish.iter().any(clash)) {
            return Err((
                errno::EADDRINUSE,
                format!(
                    "host port {} is already published by {}",
                    p.host_port, v.name
                ),
            ));
        }
    }
    Ok(())
}

pub(crate) fn show(p: &Publish) -> String {
    let ip = std::net::Ipv4Addr::from(p.host_ip);
    let udp = if p.proto == PROTO_UDP { "/udp" } else { "" };
    format!("{ip}:{}:{}{udp}", p.host_port, p.guest_port)
}

/// `[HOST_IP:]HOST_PORT:GUEST_PORT[/udp|/tcp]` (HOST_IP defaults to 127.0.0.1).
pub fn parse_publish(s: &str) -> Result<Publish, String> {
    let (spec, proto) = match s.rsplit_once('/') {
        Some((a, "udp")) => (a, PROTO_UDP),
        Some((a, "tcp")) => (a, PROTO_TCP),
        Some(_) => return Err(format!("'{s}': the protocol is tcp or udp")),
        None => (s, PROTO_TCP),
    };
    let parts: Vec<&str> = spec.split(':').collect();
    let (ip, h, g) = match parts[..] {
        [h, g] => ("127.0.0.1", h, g),
        [ip, h, g] => (ip, h, g),
        _ => return Err(format!("'{s}' is not [HOST_IP:]HOST_PORT:GUEST_PORT[/udp]")),
    };
    let ip: std::net::Ipv4Addr = ip
        .parse()
        .map_err(|_| format!("'{ip}' is not an IPv4 address"))?;
    let port = |p: &str| match p.parse::<u16>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("'{p}' is not a port (1-65535)")),
    };
    let p = Publish {
        proto,
        host_ip: ip.octets(),
        host_port: port(h)?,
        guest_port: port(g)?,
    };
    if is_private_ip(p.host_ip) {
        return Err(format!("{ip} is in canald's private range 127.100.0.0/16"));
    }
    Ok(p)
}

/// A decoded NETWORK request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct NetworkReq {
    pub(crate) name: String,
    pub(crate) publish: Vec<Publish>,
}

impl NetworkReq {
    pub(crate) fn encode(&self) -> Option<Vec<u8>> {
        if !canal_abi::control::valid_vm_name(&self.name) || self.publish.len() > VM_MAX_PUBLISH {
            return None;
        }
        let mut b = vec![0u8; NETWORK_BODY];
        b[4..8].copy_from_slice(&(self.publish.len() as u32).to_le_bytes());
        b[8..8 + self.name.len()].copy_from_slice(self.name.as_bytes());
        for p in &self.publish {
            b.extend_from_slice(&p.host_ip);
            b.extend_from_slice(&p.host_port.to_le_bytes());
            b.extend_from_slice(&p.guest_port.to_le_bytes());
            b.extend_from_slice(&[p.proto, 0, 0, 0]);
        }
        Some(b)
    }

    /// Decodes and validates a body (untrusted input).
    pub(crate) fn decode(b: &[u8]) -> Option<NetworkReq> {
        let u32_at = |o: usize| Some(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?));
        let n = u32_at(4)? as usize;
        if u32_at(0)? != 0 || n > VM_MAX_PUBLISH || b.len() != NETWORK_BODY + NETWORK_PUBLISH * n {
            return None;
        }
        let name = canal_abi::control::name_from_field(&b[8..40])?.to_string();
        let publish = b[NETWORK_BODY..]
            .chunks_exact(NETWORK_PUBLISH)
            .map(|e| {
                let proto = e[8];
                ((proto == PROTO_TCP || proto == PROTO_UDP) && e[9..] == [0; 3]).then(|| Publish {
                    proto,
                    host_ip: e[0..4].try_into().expect("4 bytes"),
                    host_port: u16::from_le_bytes([e[4], e[5]]),
                    guest_port: u16::from_le_bytes([e[6], e[7]]),
                })
            })
            .collect::<Option<Vec<_>>>()?;
        Some(NetworkReq { name, publish })
    }
}

/// NETWORK_OK's body.
pub(crate) fn network_ok(v: &NetView) -> [u8; NETWORK_OK_BODY] {
    let mut b = [0u8; NETWORK_OK_BODY];
    b[..4].copy_from_slice(&v.lo);
    if let Some(d) = &v.dns {
        b[4..8].copy_from_slice(&d.ip4());
        b[8..10].copy_from_slice(&d.port.to_le_bytes());
    }
    b
}

// ---- client side (canal run --isolate) --------------------------------------------------

/// A registered network: the connection that keeps the registration, and the host
/// address standing for the network's own addresses.
#[derive(Debug)]
pub struct NetworkHandle {
    pub conn: OwnedFd,
    pub lo: std::net::Ipv4Addr,
    /// Where canald sends the guest's 10.0.2.3:53 (its `--dns`), if anywhere.
    pub dns: Option<std::net::SocketAddrV4>,
}

/// Registers the network namespace `nsfd` with the canald at `socket` under `name`,
/// with `publish`ed ports.
pub fn register_network(
    socket: &std::path::Path,
    name: &str,
    publish: &[Publish],
    nsfd: &OwnedFd,
) -> io::Result<NetworkHandle> {
    use canal_abi::control::kind;
    let body = NetworkReq {
        name: name.into(),
        publish: publish.to_vec(),
    }
    .encode()
    .ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "bad network name or too many ports",
        )
    })?;
    let conn = crate::client::connect(socket)?;
    let rb = crate::client::roundtrip(
        &conn,
        kind::NETWORK,
        &body,
        &[nsfd.as_raw_fd()],
        kind::NETWORK_OK,
    )?;
    if rb.len() < NETWORK_OK_BODY {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "short NETWORK_OK",
        ));
    }
    let ip = |o: usize| std::net::Ipv4Addr::new(rb[o], rb[o + 1], rb[o + 2], rb[o + 3]);
    let dns_port = u16::from_le_bytes([rb[8], rb[9]]);
    Ok(NetworkHandle {
        conn,
        lo: ip(0),
        dns: (dns_port != 0).then(|| std::net::SocketAddrV4::new(ip(4), dns_port)),
    })
}

impl NetworkHandle {
    /// SECCOMP: canald serves the programs under `listener` (the filter of
    /// `crate::seccomp::filter`) through this network's view.
    pub fn serve_seccomp(&self, listener: &OwnedFd) -> io::Result<()> {
        use canal_abi::control::kind;
        let fds = [listener.as_raw_fd()];
        crate::client::roundtrip(&self.conn, kind::SECCOMP, &[], &fds, kind::SECCOMP_OK).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn publish_specs() {
        assert_eq!(
            parse_publish("8080:80").unwrap(),
            Publish::tcp_loopback(8080, 80)
        );
        let p = parse_publish("0.0.0.0:5353:53/udp").unwrap();
        assert_eq!(
            (p.proto, p.host_ip, p.host_port, p.guest_port),
            (PROTO_UDP, [0; 4], 5353, 53)
        );
        for bad in [
            "80",
            "0:80",
            "80:0",
            "x:80",
            "1.2.3:80:80",
            "80:80/sctp",
            "127.100.0.1:80:80",
            "1:2:3:4",
        ] {
            assert!(parse_publish(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn network_body_round_trip_and_hostile_bodies() {
        let r = NetworkReq {
            name: "web-1".into(),
            publish: vec![
                Publish::tcp_loopback(8080, 80),
                parse_publish("9053:53/udp").unwrap(),
            ],
        };
        let b = r.encode().unwrap();
        assert_eq!(b.len(), NETWORK_BODY + 2 * NETWORK_PUBLISH);
        assert_eq!(NetworkReq::decode(&b), Some(r));
        for cut in 0..b.len() {
            assert_eq!(NetworkReq::decode(&b[..cut]), None, "short at {cut}");
        }
        let mut bad = b.clone();
        bad[NETWORK_BODY + 8] = 1; // protocol 1
        assert_eq!(NetworkReq::decode(&bad), None);
        let mut bad = b.clone();
        bad[0] = 1; // flags
        assert_eq!(NetworkReq::decode(&bad), None);
        let mut bad = b;
        bad[8] = b'.'; // name
        assert_eq!(NetworkReq::decode(&bad), None);
    }

    #[test]
    fn host_ports_are_published_once() {
        let mut n = Networks::new(None);
        let a = n.vm("a", &[(18080, 80)]).unwrap();
        let e = n.vm("b", &[(18080, 8080)]).unwrap_err();
        assert_eq!(e.0, errno::EADDRINUSE);
        assert!(e.1.contains("vm:a"), "{}", e.1);
        let e = n.vm("c", &[(18081, 80), (18082, 80)]).unwrap_err();
        assert_eq!(e.0, errno::EINVAL);
        let b = n.vm("d", &[(18081, 80)]).unwrap();
        assert_ne!(a.lo, b.lo, "each network has its own loopback");
        drop(a);
        let c = n.vm("e", &[(18080, 80)]).unwrap();
        assert_eq!(c.lo[..2], PRIVATE_LO);
    }
}
