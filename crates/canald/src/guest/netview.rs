//! A guest network's own address view — vCanal's translation table — shared by VM
//! guests (`canal vm`) and isolated process guests (`canal run --isolate`, or any
//! guest in a network namespace other than canald's). One `NetView` per network: all
//! processes of a namespace, or all programs of a VM, share it.
//!
//! Inside, the guest sees QEMU user networking's plan: it is 10.0.2.15 and has its own
//! loopback, the host is 10.0.2.2, the resolver is 10.0.2.3. canald performs its
//! sockets on the host's stack, so each address is translated:
//!
//! - the guest's own addresses (127/8, ::1, the wildcard, 10.0.2.15) are a private
//!   host address `lo` from 127.100.0.0/16, one per network. A bind there holds port G
//!   on `lo` only, so networks each have their whole port space. An IPv6-only socket
//!   (IPV6_V6ONLY, which the host socket cannot keep on an IPv4-mapped address) has
//!   its own port space on a second private address, `lo6()` in 127.101.0.0/16: the
//!   guest's IPv4 and IPv6-only sockets share a port as natively;
//! - a port published `--publish H:G` is bound on the host's `HOST_IP:H` instead, the
//!   only way in from outside;
//! - a connect or sendto to an own address goes only where the table says one of the
//!   network's own sockets is bound (a listener, for TCP): never to a host socket that
//!   happens to cover `lo` with a wildcard bind. Otherwise ECONNREFUSED (datagrams are
//!   dropped, as an unreachable port drops them);
//! - an unpublished listener admits only connections from its own network's sockets
//!   (`clients`): a host process that finds `lo` is turned away.
//!
//! The residual gap (docs/threat-model.md): between the table check and the kernel's
//! connect an own listener may close, and a host listener bound to the wildcard on the
//! same port would then take the connection.

use crate::guest::contacts::Contacts;
use canal_abi::addr::{FAMILY_INET, FAMILY_INET6};
use canal_abi::errno;
use canal_abi::CanalAddr;
use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard};

pub(crate) const PROTO_TCP: u8 = 6;
pub(crate) const PROTO_UDP: u8 = 17;

/// The host as the guest sees it (QEMU user networking's gateway).
pub(crate) const GUEST_HOST_ADDR: [u8; 4] = [10, 0, 2, 2];
/// The resolver as the guest sees it (forwarded to `NetView::dns`).
pub(crate) const GUEST_DNS_ADDR: [u8; 4] = [10, 0, 2, 3];
/// The guest's own address.
pub(crate) const GUEST_SELF_ADDR: [u8; 4] = [10, 0, 2, 15];
pub(crate) const LOOPBACK4: [u8; 4] = [127, 0, 0, 1];
/// The host range private loopbacks come from (127.100.0.0/16; each network's
/// IPv6-only twin is the same address in 127.101.0.0/16).
pub(crate) const PRIVATE_LO: [u8; 2] = [127, 100];

/// An address of the private ranges (127.100.0.0/15): no guest names one directly.
pub(crate) fn is_private_ip(ip: [u8; 4]) -> bool {
    ip[0] == PRIVATE_LO[0] && ip[1] & !1 == PRIVATE_LO[1]
}

/// A published port: the host's `host_ip:host_port` reaches the guest's port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Publish {
    /// 6 TCP, 17 UDP.
    pub proto: u8,
    pub host_ip: [u8; 4],
    pub host_port: u16,
    pub guest_port: u16,
}

impl Publish {
    /// `H:G` on the host's 127.0.0.1, TCP (the VM's `--publish`).
    pub(crate) fn tcp_loopback(host_port: u16, guest_port: u16) -> Publish {
        Publish {
            proto: PROTO_TCP,
            host_ip: LOOPBACK4,
            host_port,
            guest_port,
        }
    }
}

/// One guest network's view.
#[derive(Debug)]
pub(crate) struct NetView {
    /// "vm:NAME", "isolated:NAME", or "netns:[INODE]" for an unregistered namespace.
    pub(crate) name: String,
    /// The host address standing for the guest's own addresses.
    pub(crate) lo: [u8; 4],
    pub(crate) publish: Vec<Publish>,
    /// Where the guest's 10.0.2.3:53 goes (the host's resolver), if anywhere.
    pub(crate) dns: Option<CanalAddr>,
    table: Mutex<Table>,
    /// What seccomp service did for the network's programs LD_PRELOAD cannot reach.
    pub(crate) served: Served,
    /// Keeps the namespace (and so its identity) alive while guests use this view.
    _ns: Option<OwnedFd>,
}

/// Counters of the network's seccomp service (`crate::seccomp`), for `canal stat`.
#[derive(Default, Debug)]
pub(crate) struct Served {
    /// Host sockets installed in the programs.
    pub(crate) sockets: AtomicU64,
    /// Notifications answered, and those let through unchanged.
    pub(crate) calls: AtomicU64,
    pub(crate) passed: AtomicU64,
    /// Sockets replaced by one bound or connected where the view says.
    pub(crate) replaced: AtomicU64,
    /// Calls answered with an error.
    pub(crate) errors: AtomicU64,
    /// The sockets installed, their bound names, which are open (`canal stat`).
    pub(crate) installed: crate::seccomp::installed::Installed,
}

impl Served {
    /// [sockets, calls, passed, replaced, errors].
    pub(crate) fn snapshot(&self) -> [u64; 5] {
        [
            &self.sockets,
            &self.calls,
            &self.passed,
            &self.replaced,
            &self.errors,
        ]
        .map(|c| c.load(std::sync::atomic::Ordering::Relaxed))
    }
}

/// A bound port's key: (proto, guest port, IPv6-only).
type PortKey = (u8, u16, bool);

#[derive(Default, Debug)]
struct Table {
    /// Where each guest port is bound on the host (IPv6-only sockets apart: `lo6`).
    bound: HashMap<PortKey, Bound>,
    /// Local ports on `lo` (false) or `lo6` (true) of the network's TCP connections
    /// made through the kernel: the peers an unpublished listener admits.
    clients: HashMap<(u16, bool), u32>,
}

#[derive(Debug)]
struct Bound {
    host: CanalAddr,
    sockets: u32,
    listening: u32,
    /// Bound by an AF_INET6 socket (an IPv6 destination reaches it; natively an
    /// AF_INET socket takes IPv4 only).
    family6: bool,
    /// A dual-stack datagram socket autobound on `lo6` (it first spoke to an IPv6
    /// destination of its own network): IPv4 destinations reach it too, as natively
    /// its wildcard port takes both.
    dual: bool,
}

/// A socket's entry in its network's table; dropping it (the socket closing) removes
/// the entry.
#[derive(Default)]
pub(crate) struct NetTie {
    /// Boxed: only a socket of a guest network has one, and every socket carries a tie.
    tie: Option<Box<(Arc<NetView>, Tie)>>,
}

enum Tie {
    Bound {
        key: PortKey,
        /// The guest's own name for the socket (getsockname while unconnected).
        guest: CanalAddr,
        published: bool,
        listening: bool,
        /// Outside addresses it sent to, whose datagrams it takes (unpublished UDP).
        contacts: Contacts,
    },
    Client((u16, bool)),
}

/// Where a guest's destination goes on the host; `own` when it is one of the
/// network's own sockets (the source must then be `lo` too).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Dest {
    pub(crate) addr: CanalAddr,
    pub(crate) own: bool,
}

fn v4_of(a: &CanalAddr) -> Option<[u8; 4]> {
    match a.family {
        FAMILY_INET => Some(a.ip4()),
        FAMILY_INET6 => std::net::Ipv6Addr::from(a.addr)
            .to_ipv4_mapped()
            .map(|v| v.octets()),
        _ => None,
    }
}

/// `ip:port` in `family`'s form (IPv4-mapped for AF_INET6), keeping a v6 address's
/// flow and scope fields.
pub(crate) fn in_family(like: &CanalAddr, ip: [u8; 4], port: u16) -> CanalAddr {
    let mut b = *like;
    b.port = port;
    b.addr = [0; 16];
    if like.family == FAMILY_INET {
        b.addr[..4].copy_from_slice(&ip);
    } else {
        b.addr[10] = 0xff;
        b.addr[11] = 0xff;
        b.addr[12..].copy_from_slice(&ip);
    }
    b
}

pub(crate) fn is_v4(a: &CanalAddr, ip: [u8; 4]) -> bool {
    v4_of(a) == Some(ip)
}

/// A destination naming the resolver (10.0.2.3): the socket's replies from the
/// resolver's host address come from 10.0.2.3:53 (`NetView::peer`).
pub(crate) fn is_resolver(a: &CanalAddr) -> bool {
    is_v4(a, GUEST_DNS_ADDR)
}

/// The guest's own addresses: loopback, the wildcard, 10.0.2.15.
pub(crate) fn is_own(a: &CanalAddr) -> bool {
    if a.family == FAMILY_INET6 {
        let v6 = std::net::Ipv6Addr::from(a.addr);
        if v6.is_loopback() || v6.is_unspecified() {
            return true;
        }
    }
    v4_of(a).is_some_and(|ip| ip[0] == 127 || ip == [0; 4] || ip == GUEST_SELF_ADDR)
}

/// An address in canald's private-loopback range: no guest names one directly.
pub(crate) fn is_private_lo(a: &CanalAddr) -> bool {
    v4_of(a).is_some_and(is_private_ip)
}

/// An IPv6 address that is not IPv4-mapped (what an IPv6-only socket may name).
pub(crate) fn is_plain_v6(a: &CanalAddr) -> bool {
    a.family == FAMILY_INET6 && v4_of(a).is_none()
}

/// `[::1]:port`, keeping `like`'s flow and scope fields: the guest's own address as
/// its IPv6-only sockets name it.
fn loopback_v6(like: &CanalAddr, port: u16) -> CanalAddr {
    let mut b = *like;
    b.family = FAMILY_INET6;
    b.addr = std::net::Ipv6Addr::LOCALHOST.octets();
    b.port = port;
    b
}

impl NetView {
    pub(crate) fn new(
        name: String,
        lo: [u8; 4],
        publish: Vec<Publish>,
        dns: Option<CanalAddr>,
        ns: Option<OwnedFd>,
    ) -> NetView {
        NetView {
            name,
            lo,
            publish,
            dns,
            table: Mutex::new(Table::default()),
            served: Served::default(),
            _ns: ns,
        }
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// connect/sendto destination. `proto`: PROTO_TCP or PROTO_UDP; `v6only`: the
    /// sending socket is IPv6-only (an IPv4-mapped destination is unreachable to it,
    /// as the kernel says).
    pub(crate) fn dest(&self, a: &CanalAddr, proto: u8, v6only: bool) -> Result<Dest, i32> {
        if v6only && a.family == FAMILY_INET6 && !is_plain_v6(a) {
            return Err(errno::ENETUNREACH);
        }
        let host = |addr| Ok(Dest { addr, own: false });
        if is_v4(a, GUEST_HOST_ADDR) {
            return host(in_family(a, LOOPBACK4, a.port));
        }
        if is_resolver(a) {
            return match self.dns {
                Some(d) if a.port == 53 => {
                    host(in_family(a, v4_of(&d).ok_or(errno::EINVAL)?, d.port))
                }
                Some(_) => Err(errno::ECONNREFUSED),
                None => Err(errno::ENETUNREACH),
            };
        }
        if !is_own(a) {
            return host(*a);
        }
        let t = self.table();
        // An IPv6 destination reaches an IPv6-only socket first, then one of the
        // others; an IPv4 one never reaches an IPv6-only socket.
        let takes = |b: &&Bound| proto == PROTO_UDP || b.listening > 0;
        let found = if is_plain_v6(a) {
            let v6only = t.bound.get(&(proto, a.port, true)).filter(takes);
            v6only.or_else(|| {
                let other = t.bound.get(&(proto, a.port, false));
                other.filter(|b| b.family6).filter(takes)
            })
        } else {
            let four = t.bound.get(&(proto, a.port, false)).filter(takes);
            four.or_else(|| t.bound.get(&(proto, a.port, true)).filter(|b| b.dual))
        };
        match found {
            Some(b) => Ok(Dest {
                addr: in_family(a, b.host.ip4(), b.host.port),
                own: true,
            }),
            None => Err(errno::ECONNREFUSED),
        }
    }

    /// The private address of the network's IPv6-only sockets (`lo` in 127.101/16).
    pub(crate) fn lo6(&self) -> [u8; 4] {
        [self.lo[0], self.lo[1] | 1, self.lo[2], self.lo[3]]
    }

    /// A guest bind: own addresses go to `lo` (or the published host address);
    /// others do not exist in the guest (EADDRNOTAVAIL). An IPv6-only socket's go to
    /// `lo6()` (a published port is the IPv4 socket's: the host reaches it as
    /// 127.0.0.1), an IPv4-mapped one is the kernel's EINVAL for it.
    pub(crate) fn bind(&self, a: &CanalAddr, proto: u8, v6only: bool) -> Result<CanalAddr, i32> {
        if v6only && a.family == FAMILY_INET6 && !is_plain_v6(a) {
            return Err(errno::EINVAL);
        }
        if !is_own(a) {
            return Err(errno::EADDRNOTAVAIL);
        }
        if a.family == FAMILY_INET6 && a.port != 0 && self.v6_port_taken(proto, a.port, v6only) {
            return Err(errno::EADDRINUSE);
        }
        if v6only && a.family == FAMILY_INET6 {
            return Ok(in_family(a, self.lo6(), a.port));
        }
        if a.port != 0 {
            if let Some(p) = self.published(proto, a.port) {
                return Ok(in_family(a, p.host_ip, p.host_port));
            }
        }
        Ok(in_family(a, self.lo, a.port))
    }

    /// Whether an AF_INET6 bind of `port` collides with the other kind of IPv6 socket
    /// (an IPv6-only one with a dual-stack one, either way), as natively: they live on
    /// `lo6` and `lo`, where the host sees no collision.
    fn v6_port_taken(&self, proto: u8, port: u16, v6only: bool) -> bool {
        let t = self.table();
        match t.bound.get(&(proto, port, !v6only)) {
            Some(b) => !v6only || b.family6,
            None => false,
        }
    }

    fn published(&self, proto: u8, guest_port: u16) -> Option<&Publish> {
        self.publish
            .iter()
            .find(|p| p.proto == proto && p.guest_port == guest_port)
    }

    /// The published port whose host address is `a`.
    fn publish_at(&self, a: &CanalAddr) -> Option<&Publish> {
        let ip = v4_of(a)?;
        self.publish
            .iter()
            .find(|p| p.host_ip == ip && p.host_port == a.port)
    }

    /// The source a socket reaching own host destination `dst` binds first, any port:
    /// `lo`, or `lo6()` when the guest named an IPv6 destination (`v6`: the peer then
    /// sees `::1`, as natively).
    pub(crate) fn own_source(&self, dst: &CanalAddr, v6: bool) -> CanalAddr {
        in_family(dst, if v6 { self.lo6() } else { self.lo }, 0)
    }

    /// Records a socket bound at `host` for the guest's `guest` name (its port is the
    /// one the kernel gave when the guest asked for 0).
    pub(crate) fn record_bind(
        self: &Arc<Self>,
        proto: u8,
        guest: CanalAddr,
        host: &CanalAddr,
    ) -> NetTie {
        let host4 = CanalAddr::v4(v4_of(host).unwrap_or(self.lo), host.port);
        let v6only = host4.ip4() == self.lo6();
        let published = host4.ip4() != self.lo && !v6only;
        let key = (proto, guest.port, v6only);
        let mut t = self.table();
        let b = t.bound.entry(key).or_insert(Bound {
            host: host4,
            sockets: 0,
            listening: 0,
            family6: guest.family == FAMILY_INET6,
            dual: false,
        });
        b.sockets += 1;
        NetTie {
            tie: Some(Box::new((
                self.clone(),
                Tie::Bound {
                    key,
                    guest,
                    published,
                    listening: false,
                    contacts: Contacts::default(),
                },
            ))),
        }
    }

    /// The datagram socket just recorded on `lo6` at `port` is dual stack (not
    /// IPv6-only): IPv4 destinations of that port reach it too (`Bound::dual`).
    pub(crate) fn mark_dual(&self, port: u16) {
        if let Some(b) = self.table().bound.get_mut(&(PROTO_UDP, port, true)) {
            b.dual = true;
        }
    }

    /// Records the local address (`own_source`'s) of a connection to an own listener.
    pub(crate) fn record_client(self: &Arc<Self>, local: &CanalAddr) -> NetTie {
        let key = (local.port, self.own_space(local) == Some(true));
        *self.table().clients.entry(key).or_insert(0) += 1;
        NetTie {
            tie: Some(Box::new((self.clone(), Tie::Client(key)))),
        }
    }

    /// Whether a socket of this network bound on `lo` (an unpublished listener, a
    /// datagram socket) may take a connection or datagram from `peer` (a host
    /// address): only from the network's own sockets — TCP ones autobound on `lo` or
    /// bound there by the guest, UDP ones bound there.
    pub(crate) fn admits(&self, proto: u8, peer: &CanalAddr) -> bool {
        let Some(v6only) = self.own_space(peer) else {
            return false;
        };
        let t = self.table();
        (proto == PROTO_TCP && t.clients.contains_key(&(peer.port, v6only)))
            || t.bound
                .get(&(proto, peer.port, v6only))
                .is_some_and(|b| v4_of(peer) == Some(b.host.ip4()))
    }

    /// Whether host address `a` is on `lo` (Some(false)) or `lo6` (Some(true)).
    fn own_space(&self, a: &CanalAddr) -> Option<bool> {
        let ip = v4_of(a)?;
        (ip == self.lo || ip == self.lo6()).then_some(ip != self.lo)
    }

    /// `admits`, or a socket the kernel has at `peer` owned by canald's uid — one a
    /// seccomp-served program holds, which canald keeps no entry for. `local`: the
    /// admitting socket's host address (the peer's remote end).
    pub(crate) fn admits_any(
        &self,
        proto: u8,
        peer: &CanalAddr,
        local: impl FnOnce() -> Option<CanalAddr>,
    ) -> bool {
        if self.admits(proto, peer) {
            return true;
        }
        let Some(ip) = v4_of(peer).filter(|_| self.own_space(peer).is_some()) else {
            return false;
        };
        let remote = local().map(|l| CanalAddr::v4(v4_of(&l).unwrap_or(self.lo), l.port));
        self.kernel_holds(proto, (ip, peer.port), remote.as_ref(), false)
    }

    /// Whether the kernel has a socket of canald's uid at `ip:port` (a listener for
    /// TCP when `remote` is None); `family6`: an AF_INET6 one only (what an IPv6
    /// destination may reach).
    fn kernel_holds(
        &self,
        proto: u8,
        (ip, port): ([u8; 4], u16),
        remote: Option<&CanalAddr>,
        family6: bool,
    ) -> bool {
        let at = CanalAddr::v4(ip, port);
        matches!(crate::sys::diag_lookup(proto, &at, remote),
            Ok(Some((found, uid))) if is_v4(&found, ip) && found.port == port
                && uid == crate::sys::getuid()
                && (!family6 || found.family == FAMILY_INET6))
    }

    /// For an own destination no table entry names: the host address of a socket a
    /// seccomp-served program of this network bound there (on the private loopback, or
    /// its published address; listening, for TCP), if the kernel has one.
    pub(crate) fn held_by_program(&self, a: &CanalAddr, proto: u8) -> Option<CanalAddr> {
        if !is_own(a) {
            return None;
        }
        // An IPv6 destination: a program's IPv6-only socket first (seccomp programs
        // have them too).
        let v6 = is_plain_v6(a);
        if v6 && self.kernel_holds(proto, (self.lo6(), a.port), None, true) {
            return Some(in_family(a, self.lo6(), a.port));
        }
        let (ip, port) = match self.published(proto, a.port) {
            Some(p) => (p.host_ip, p.host_port),
            None => (self.lo, a.port),
        };
        self.kernel_holds(proto, (ip, port), None, v6)
            .then(|| in_family(a, ip, port))
    }

    /// Host → guest, a peer (getpeername, accept, recvfrom): `lo` is the guest's own
    /// 127.0.0.1, the host's 127.0.0.1 is 10.0.2.2, the resolver is 10.0.2.3:53 to a
    /// socket that reached it there (`via_resolver`). The resolver's host address is
    /// also 10.0.2.2 and its port; only the socket knows which one it named (a TCP
    /// server and a UDP resolver may even share the port number).
    pub(crate) fn peer(&self, a: &CanalAddr, via_resolver: bool) -> CanalAddr {
        if is_v4(a, self.lo) {
            return in_family(a, LOOPBACK4, a.port);
        }
        if is_v4(a, self.lo6()) {
            return loopback_v6(a, a.port);
        }
        // One of the network's own listeners, reached on its published address.
        if let Some(p) = self.publish_at(a) {
            return in_family(a, LOOPBACK4, p.guest_port);
        }
        if via_resolver && self.is_resolver_host(a) {
            return in_family(a, GUEST_DNS_ADDR, 53);
        }
        if is_v4(a, LOOPBACK4) {
            return in_family(a, GUEST_HOST_ADDR, a.port);
        }
        *a
    }

    /// Host → guest, a local address (getsockname): `lo` is 127.0.0.1, a published
    /// host address is 10.0.2.15 on the guest port, the host's 127.0.0.1 (the source
    /// of a connection to 10.0.2.2) is 10.0.2.15.
    pub(crate) fn local(&self, a: &CanalAddr) -> CanalAddr {
        if is_v4(a, self.lo) {
            return in_family(a, LOOPBACK4, a.port);
        }
        if is_v4(a, self.lo6()) {
            return loopback_v6(a, a.port);
        }
        if let Some(p) = self.publish_at(a) {
            return in_family(a, GUEST_SELF_ADDR, p.guest_port);
        }
        if v4_of(a) == Some(LOOPBACK4) {
            return in_family(a, GUEST_SELF_ADDR, a.port);
        }
        *a
    }

    /// `local` for a connected socket whose peer is at host address `peer`: a
    /// connection that came from `lo6` (the guest named an IPv6 destination) reached
    /// `::1`, as natively, even on a dual-stack listener bound on `lo`; a socket bound
    /// on `lo` whose peer is outside the network speaks from 10.0.2.15 (the route's
    /// source toward 10.0.2.2, as from an unbound one).
    pub(crate) fn local_toward(&self, a: &CanalAddr, peer: Option<&CanalAddr>) -> CanalAddr {
        match peer {
            Some(p) if self.v6_connection(a, p) => loopback_v6(a, a.port),
            Some(p) if is_v4(a, self.lo) && self.own_space(p).is_none() => {
                in_family(a, GUEST_SELF_ADDR, a.port)
            }
            _ => self.local(a),
        }
    }

    /// Whether host address `a` is the resolver's (where 10.0.2.3:53 goes): only then
    /// does a socket's `via_resolver` change how `a` reads.
    pub(crate) fn is_resolver_host(&self, a: &CanalAddr) -> bool {
        self.dns
            .as_ref()
            .is_some_and(|d| v4_of(a) == v4_of(d) && a.port == d.port)
    }

    /// `peer` (getpeername) for a socket whose own host address is `local`: from
    /// `lo6`, the peer on `lo` was reached as `::1`.
    pub(crate) fn peer_from(
        &self,
        a: &CanalAddr,
        local: Option<&CanalAddr>,
        via_resolver: bool,
    ) -> CanalAddr {
        match local {
            Some(l) if self.v6_connection(a, l) => loopback_v6(a, a.port),
            _ => self.peer(a, via_resolver),
        }
    }

    /// A connection between `lo` (end `a`) and `lo6` (end `other`): one the guest
    /// made to an IPv6 address of its own network.
    fn v6_connection(&self, a: &CanalAddr, other: &CanalAddr) -> bool {
        is_v4(a, self.lo) && is_v4(other, self.lo6())
    }

    /// (bound entries, own connections) for `canal stat`.
    pub(crate) fn counts(&self) -> (usize, usize) {
        let t = self.table();
        (t.bound.len(), t.clients.len())
    }
}

impl NetTie {
    /// listen() succeeded: TCP connects to the guest port now go here.
    pub(crate) fn listened(&mut self) {
        if let Some((n, Tie::Bound { key, listening, .. })) = self.tie.as_deref_mut() {
            if !*listening {
                *listening = true;
                if let Some(b) = n.table().bound.get_mut(key) {
                    b.listening += 1;
                }
            }
        }
    }

    /// The guest's own name of a bound socket.
    pub(crate) fn guest_name(&self) -> Option<CanalAddr> {
        match self.tie.as_deref() {
            Some((_, Tie::Bound { guest, .. })) => Some(*guest),
            _ => None,
        }
    }

    /// A datagram socket sent to host address `dst`, not one of its network's own:
    /// if it is bound on `lo` (not published), that address's replies may now reach it.
    pub(crate) fn note_contact(&mut self, dst: &CanalAddr) {
        if let Some((
            _,
            Tie::Bound {
                published: false,
                contacts,
                ..
            },
        )) = self.tie.as_deref_mut()
        {
            contacts.note(dst);
        }
    }

    /// Whether a datagram from host address `src` may reach this socket: any may,
    /// unless it is bound on `lo` (not published); then only its own network's
    /// sockets and the outside addresses it sent to (`contacts.rs`). `local`: its host
    /// address.
    pub(crate) fn takes_datagram(
        &self,
        src: Option<&CanalAddr>,
        local: impl FnOnce() -> Option<CanalAddr>,
    ) -> bool {
        match self.tie.as_deref() {
            Some((
                n,
                Tie::Bound {
                    published: false,
                    contacts,
                    ..
                },
            )) => src.is_some_and(|a| contacts.has(a) || n.admits_any(PROTO_UDP, a, local)),
            _ => true,
        }
    }

    /// A socket bound on `lo` (not published): it admits only its own network.
    pub(crate) fn private_bound(&self) -> Option<&Arc<NetView>> {
        match self.tie.as_deref() {
            Some((
                n,
                Tie::Bound {
                    published: false, ..
                },
            )) => Some(n),
            _ => None,
        }
    }

    pub(crate) fn is_tied(&self) -> bool {
        self.tie.is_some()
    }
}

impl Drop for NetTie {
    fn drop(&mut self) {
        let Some((n, tie)) = self.tie.take().map(|t| *t) else {
            return;
        };
        let mut t = n.table();
        match tie {
            Tie::Bound { key, listening, .. } => {
                if let Some(b) = t.bound.get_mut(&key) {
                    b.sockets -= 1;
                    b.listening -= u32::from(listening);
                    if b.sockets == 0 {
                        t.bound.remove(&key);
                    }
                }
            }
            Tie::Client(key) => {
                if let Some(c) = t.clients.get_mut(&key) {
                    *c -= 1;
                    if *c == 0 {
                        t.clients.remove(&key);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(ip: [u8; 4], port: u16) -> CanalAddr {
        CanalAddr::v4(ip, port)
    }

    fn net() -> Arc<NetView> {
        Arc::new(NetView::new(
            "isolated:t".into(),
            [127, 100, 0, 7],
            vec![Publish::tcp_loopback(18080, 80)],
            Some(v4(LOOPBACK4, 5353)),
            None,
        ))
    }

    #[test]
    fn host_and_resolver() {
        let n = net();
        let d = n.dest(&v4([10, 0, 2, 2], 5201), PROTO_TCP, false).unwrap();
        assert_eq!(
            d,
            Dest {
                addr: v4(LOOPBACK4, 5201),
                own: false
            }
        );
        let d = n.dest(&v4(GUEST_DNS_ADDR, 53), PROTO_UDP, false).unwrap();
        assert_eq!(d.addr, v4(LOOPBACK4, 5353));
        // The resolver on the host's loopback still answers as 10.0.2.3:53 to a socket
        // that asked it there; to one that named 10.0.2.2 and its port, it is that.
        assert_eq!(n.peer(&v4(LOOPBACK4, 5353), true), v4(GUEST_DNS_ADDR, 53));
        assert_eq!(
            n.peer(&v4(LOOPBACK4, 5353), false),
            v4(GUEST_HOST_ADDR, 5353)
        );
        assert_eq!(
            n.dest(&v4(GUEST_DNS_ADDR, 80), PROTO_TCP, false),
            Err(errno::ECONNREFUSED)
        );
        assert_eq!(
            n.dest(&v4([192, 0, 2, 1], 80), PROTO_TCP, false)
                .unwrap()
                .addr,
            v4([192, 0, 2, 1], 80)
        );
        assert_eq!(
            n.peer(&v4(LOOPBACK4, 40000), true),
            v4(GUEST_HOST_ADDR, 40000)
        );
    }

    #[test]
    fn own_ports_only_through_the_table() {
        let n = net();
        // Nothing bound: refused, not the host's 127.0.0.1:81 or a wildcard on lo.
        assert_eq!(
            n.dest(&v4(LOOPBACK4, 81), PROTO_TCP, false),
            Err(errno::ECONNREFUSED)
        );
        let host = n.bind(&v4([0; 4], 81), PROTO_TCP, false).unwrap();
        assert_eq!(host, v4([127, 100, 0, 7], 81));
        let mut tie = n.record_bind(PROTO_TCP, v4([0; 4], 81), &host);
        // Bound but not listening: still refused (a host wildcard listener must not
        // take it).
        assert_eq!(
            n.dest(&v4(LOOPBACK4, 81), PROTO_TCP, false),
            Err(errno::ECONNREFUSED)
        );
        tie.listened();
        let d = n.dest(&v4([127, 0, 0, 2], 81), PROTO_TCP, false).unwrap();
        assert_eq!(
            d,
            Dest {
                addr: host,
                own: true
            }
        );
        assert_eq!(
            n.dest(&v4(GUEST_SELF_ADDR, 81), PROTO_TCP, false)
                .unwrap()
                .addr,
            host
        );
        assert_eq!(tie.guest_name(), Some(v4([0; 4], 81)));
        assert!(tie.private_bound().is_some());
        drop(tie);
        assert_eq!(
            n.dest(&v4(LOOPBACK4, 81), PROTO_TCP, false),
            Err(errno::ECONNREFUSED)
        );
        assert_eq!(n.counts(), (0, 0));
    }

    #[test]
    fn published_ports() {
        let n = net();
        let host = n.bind(&v4([0; 4], 80), PROTO_TCP, false).unwrap();
        assert_eq!(host, v4(LOOPBACK4, 18080));
        assert_eq!(
            n.bind(&v4([0; 4], 80), PROTO_UDP, false).unwrap(),
            v4([127, 100, 0, 7], 80)
        );
        let mut tie = n.record_bind(PROTO_TCP, v4([0; 4], 80), &host);
        tie.listened();
        assert!(tie.private_bound().is_none());
        assert_eq!(
            n.dest(&v4(LOOPBACK4, 80), PROTO_TCP, false).unwrap().addr,
            host
        );
        assert_eq!(n.local(&v4(LOOPBACK4, 18080)), v4(GUEST_SELF_ADDR, 80));
        assert_eq!(n.local(&v4([127, 100, 0, 7], 80)), v4(LOOPBACK4, 80));
        assert_eq!(n.local(&v4(LOOPBACK4, 40000)), v4(GUEST_SELF_ADDR, 40000));
    }

    #[test]
    fn other_addresses_do_not_exist_inside() {
        let n = net();
        assert_eq!(
            n.bind(&v4([192, 0, 2, 1], 80), PROTO_TCP, false),
            Err(errno::EADDRNOTAVAIL)
        );
        assert_eq!(
            n.bind(&v4(GUEST_HOST_ADDR, 80), PROTO_TCP, false),
            Err(errno::EADDRNOTAVAIL)
        );
    }

    #[test]
    fn only_own_sockets_are_admitted() {
        let n = net();
        let c = n.record_client(&v4([127, 100, 0, 7], 40001));
        let lo = [127, 100, 0, 7];
        assert!(n.admits(PROTO_TCP, &v4(lo, 40001)));
        assert!(!n.admits(PROTO_TCP, &v4(lo, 40002)), "a host process on lo");
        assert!(!n.admits(PROTO_TCP, &v4(LOOPBACK4, 40001)));
        assert!(
            !n.admits(PROTO_UDP, &v4(lo, 40001)),
            "a TCP client is no UDP peer"
        );
        drop(c);
        assert!(!n.admits(PROTO_TCP, &v4(lo, 40001)));
        let host = n.bind(&v4([0; 4], 5353), PROTO_UDP, false).unwrap();
        let u = n.record_bind(PROTO_UDP, v4([0; 4], 5353), &host);
        assert!(n.admits(PROTO_UDP, &v4(lo, 5353)));
        assert!(u.private_bound().is_some());
    }

    #[test]
    fn ipv6_forms() {
        let n = net();
        let any6 = CanalAddr::v6([0; 16], 81, 0, 0);
        let host = n.bind(&any6, PROTO_TCP, false).unwrap();
        assert_eq!(host.family, FAMILY_INET6);
        assert_eq!(v4_of(&host), Some([127, 100, 0, 7]));
        let mut tie = n.record_bind(PROTO_TCP, any6, &host);
        tie.listened();
        let lo6 = CanalAddr::v6(std::net::Ipv6Addr::LOCALHOST.octets(), 81, 0, 0);
        let d = n.dest(&lo6, PROTO_TCP, false).unwrap();
        assert_eq!(
            (d.addr.family, v4_of(&d.addr)),
            (FAMILY_INET6, Some([127, 100, 0, 7]))
        );
        // A v4 client reaches the v6 listener through its mapped address.
        assert_eq!(
            n.dest(&v4(LOOPBACK4, 81), PROTO_TCP, false).unwrap().addr,
            v4([127, 100, 0, 7], 81)
        );
        assert!(is_private_lo(&d.addr));
    }

    #[test]
    fn ipv6_only_sockets_have_their_own_port_space() {
        let n = net();
        let v6 = |ip: std::net::Ipv6Addr, port| CanalAddr::v6(ip.octets(), port, 0, 0);
        let (any6, one6) = (
            std::net::Ipv6Addr::UNSPECIFIED,
            std::net::Ipv6Addr::LOCALHOST,
        );
        let lo6 = [127, 101, 0, 7];
        assert_eq!(n.lo6(), lo6);
        assert!(
            is_private_lo(&v4(lo6, 1)),
            "no guest names the twin directly"
        );
        // asyncio's pair: 0.0.0.0:90 and an IPv6-only [::]:90.
        let h4 = n.bind(&v4([0; 4], 90), PROTO_TCP, false).unwrap();
        let mut t4 = n.record_bind(PROTO_TCP, v4([0; 4], 90), &h4);
        t4.listened();
        let h6 = n.bind(&v6(any6, 90), PROTO_TCP, true).unwrap();
        assert_eq!(v4_of(&h6), Some(lo6));
        let mut t6 = n.record_bind(PROTO_TCP, v6(any6, 90), &h6);
        t6.listened();
        // Each family reaches its own; the mapped form is IPv4.
        let to = |a: &CanalAddr| n.dest(a, PROTO_TCP, false).map(|d| v4_of(&d.addr));
        assert_eq!(to(&v6(one6, 90)), Ok(Some(lo6)));
        assert_eq!(to(&v4(LOOPBACK4, 90)), Ok(Some([127, 100, 0, 7])));
        assert_eq!(
            to(&in_family(&v6(one6, 0), LOOPBACK4, 90)),
            Ok(Some([127, 100, 0, 7]))
        );
        // An IPv4 listener alone is not reached from IPv6.
        drop(t6);
        assert_eq!(to(&v6(one6, 90)), Err(errno::ECONNREFUSED));
        // The kernel's rules: mapped addresses are not an IPv6-only socket's.
        let mapped = in_family(&v6(one6, 0), LOOPBACK4, 91);
        assert_eq!(n.bind(&mapped, PROTO_TCP, true), Err(errno::EINVAL));
        assert_eq!(n.dest(&mapped, PROTO_TCP, true), Err(errno::ENETUNREACH));
        // A dual-stack [::]:92 and an IPv6-only one collide, either way round.
        let hd = n.bind(&v6(any6, 92), PROTO_TCP, false).unwrap();
        let td = n.record_bind(PROTO_TCP, v6(any6, 92), &hd);
        assert_eq!(
            n.bind(&v6(any6, 92), PROTO_TCP, true),
            Err(errno::EADDRINUSE)
        );
        drop(td);
        let h = n.bind(&v6(any6, 92), PROTO_TCP, true).unwrap();
        let _t = n.record_bind(PROTO_TCP, v6(any6, 92), &h);
        assert_eq!(
            n.bind(&v6(any6, 92), PROTO_TCP, false),
            Err(errno::EADDRINUSE)
        );
        // An IPv4 socket on the port is no collision for an IPv6-only one.
        assert!(n.bind(&v4([0; 4], 92), PROTO_TCP, false).is_ok());
        // Names: the twin is ::1; a connection from it reached ::1 even on `lo`.
        let from6 = in_family(&v6(one6, 0), lo6, 5555);
        assert_eq!(n.peer(&from6, false), v6(one6, 5555));
        let at_lo = in_family(&v6(one6, 0), n.lo, 92);
        assert_eq!(n.local_toward(&at_lo, Some(&from6)), v6(one6, 92));
        assert_eq!(
            n.local_toward(&at_lo, None),
            in_family(&at_lo, LOOPBACK4, 92)
        );
        assert_eq!(v4_of(&n.own_source(&at_lo, true)), Some(lo6));
        // Clients from the twin are admitted as the network's own.
        let _c = n.record_client(&from6);
        assert!(n.admits(PROTO_TCP, &from6));
        assert!(!n.admits(PROTO_TCP, &in_family(&from6, n.lo, 5555)));
    }
}
