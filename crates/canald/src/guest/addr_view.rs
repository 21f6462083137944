//! A guest's view of addresses: loopback rules for process guests, and the VM's
//! translation (`VmNet`: 10.0.2.2 is the host, published ports) for VM guests.
use canal_abi::addr::{FAMILY_INET, FAMILY_INET6};
use canal_abi::errno;
use canal_abi::CanalAddr;

/// Guest view → host address for connect/sendto: identity for a process guest; a VM
/// guest's 10.0.2.2 is the host's 127.0.0.1 (`vm.rs`). Errors are errno values.
pub(crate) fn translate_guest_addr(guest: &GuestView, a: &CanalAddr) -> Result<CanalAddr, i32> {
    let a = match &guest.vm {
        Some(v) => v.dest_to_host(a),
        None => *a,
    };
    if guest.loopback_only && !is_loopback(&a) {
        return Err(errno::EACCES);
    }
    Ok(a)
}

/// Guest view → host address for bind: a VM guest's listeners live on the host's
/// loopback, on their published host port (`vm.rs`).
pub(crate) fn translate_guest_bind(guest: &GuestView, a: &CanalAddr) -> Result<CanalAddr, i32> {
    let a = match &guest.vm {
        Some(v) => v.bind_to_host(a),
        None => *a,
    };
    if guest.loopback_only && !is_loopback(&a) {
        return Err(errno::EACCES);
    }
    Ok(a)
}

/// Host address → guest view of a peer (getpeername, accept, recvfrom).
pub(crate) fn translate_host_addr(guest: &GuestView, a: &CanalAddr) -> CanalAddr {
    match &guest.vm {
        Some(v) => v.peer_to_guest(a),
        None => *a,
    }
}

/// Host address → guest view of a local address (getsockname).
pub(crate) fn translate_host_local(guest: &GuestView, a: &CanalAddr) -> CanalAddr {
    match &guest.vm {
        Some(v) => v.local_to_guest(a),
        None => *a,
    }
}

pub(crate) fn is_loopback(a: &CanalAddr) -> bool {
    match a.family {
        canal_abi::addr::FAMILY_INET => a.addr[0] == 127 || a.ip4() == [0; 4],
        _ => {
            let v6 = std::net::Ipv6Addr::from(a.addr);
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
    }
}

/// What the address translation needs to know about a guest.
pub(crate) struct GuestView {
    pub(crate) loopback_only: bool,
    pub(crate) vm: Option<std::sync::Arc<crate::guest::addr_view::VmNet>>,
}

// ---- sockets ----------------------------------------------------------------------

/// The host as the guest sees it (QEMU user networking's gateway).
pub(crate) const GUEST_HOST_ADDR: [u8; 4] = [10, 0, 2, 2];

/// The guest's own address.
pub(crate) const GUEST_SELF_ADDR: [u8; 4] = [10, 0, 2, 15];

pub(crate) const LOOPBACK4: [u8; 4] = [127, 0, 0, 1];

/// A VM guest's address view.
#[derive(Debug, Clone, Default)]
pub(crate) struct VmNet {
    /// (host port, guest port).
    pub(crate) publish: Vec<(u16, u16)>,
}

pub(crate) fn is_v4(a: &CanalAddr, ip: [u8; 4]) -> bool {
    match a.family {
        FAMILY_INET => a.ip4() == ip,
        FAMILY_INET6 => {
            let mut m = [0u8; 16];
            m[10] = 0xff;
            m[11] = 0xff;
            m[12..].copy_from_slice(&ip);
            a.addr == m
        }
        _ => false,
    }
}

pub(crate) fn with_v4(a: &CanalAddr, ip: [u8; 4]) -> CanalAddr {
    let mut b = *a;
    match a.family {
        FAMILY_INET => b.addr[..4].copy_from_slice(&ip),
        _ => b.addr[12..].copy_from_slice(&ip),
    }
    b
}

pub(crate) fn is_wildcard_or_self(a: &CanalAddr) -> bool {
    match a.family {
        FAMILY_INET => {
            let ip = a.ip4();
            ip == [0; 4] || ip == GUEST_SELF_ADDR || ip[0] == 127
        }
        _ => {
            let v6 = std::net::Ipv6Addr::from(a.addr);
            v6.is_unspecified()
                || v6.is_loopback()
                || v6
                    .to_ipv4_mapped()
                    .is_some_and(|v4| v4.is_loopback() || v4.octets() == GUEST_SELF_ADDR)
        }
    }
}

impl VmNet {
    /// connect/sendto destination: 10.0.2.2 → 127.0.0.1 (also as ::ffff:10.0.2.2); the
    /// guest itself (10.0.2.15, loopback) → the host's loopback, where its listeners
    /// are, on the published host port if the port is published.
    pub(crate) fn dest_to_host(&self, a: &CanalAddr) -> CanalAddr {
        if is_v4(a, GUEST_HOST_ADDR) {
            return with_v4(a, LOOPBACK4);
        }
        let own = is_v4(a, GUEST_SELF_ADDR)
            || (a.family == FAMILY_INET && a.addr[0] == 127)
            || (a.family == FAMILY_INET6 && std::net::Ipv6Addr::from(a.addr).is_loopback());
        if !own {
            return *a;
        }
        let mut b = if is_v4(a, GUEST_SELF_ADDR) {
            with_v4(a, LOOPBACK4)
        } else {
            *a
        };
        if let Some(&(h, _)) = self.publish.iter().find(|&&(_, g)| g == a.port) {
            b.port = h;
        }
        b
    }

    /// bind: a guest listener lives on the host's loopback (the wildcard, 10.0.2.15
    /// and 127.x all become 127.0.0.1, :: becomes ::1), on the published host port if
    /// the guest port is published. Other addresses are left alone (the bind fails as
    /// it would on a host without them).
    pub(crate) fn bind_to_host(&self, a: &CanalAddr) -> CanalAddr {
        if !is_wildcard_or_self(a) {
            return *a;
        }
        let mut b = *a;
        if a.family == FAMILY_INET {
            b.addr = [0; 16];
            b.addr[..4].copy_from_slice(&LOOPBACK4);
        } else if std::net::Ipv6Addr::from(a.addr).to_ipv4_mapped().is_some() {
            b = with_v4(a, LOOPBACK4);
        } else {
            b.addr = std::net::Ipv6Addr::LOCALHOST.octets();
        }
        if a.port != 0 {
            if let Some(&(h, _)) = self.publish.iter().find(|&&(_, g)| g == a.port) {
                b.port = h;
            }
        }
        b
    }

    /// getpeername/accept/recvfrom source: the host's 127.0.0.1 is 10.0.2.2.
    pub(crate) fn peer_to_guest(&self, a: &CanalAddr) -> CanalAddr {
        if is_v4(a, LOOPBACK4) {
            with_v4(a, GUEST_HOST_ADDR)
        } else {
            *a
        }
    }

    /// getsockname: the host's 127.0.0.1 is the guest's own 10.0.2.15, and a published
    /// host port shows as the guest's port.
    pub(crate) fn local_to_guest(&self, a: &CanalAddr) -> CanalAddr {
        let mut b = if is_v4(a, LOOPBACK4) {
            with_v4(a, GUEST_SELF_ADDR)
        } else {
            *a
        };
        if let Some(&(_, g)) = self.publish.iter().find(|&&(h, _)| h == a.port) {
            b.port = g;
        }
        b
    }
}
