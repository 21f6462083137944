//! A guest's view of addresses: loopback rules for every guest, and the translation of
//! a guest network's own view (`NetView`: VM guests, isolated guests) when it has one.
use crate::guest::netview::{is_private_lo, Dest, NetView};
use canal_abi::errno;
use canal_abi::CanalAddr;
use std::sync::Arc;

/// Guest view → host address for connect/sendto (`proto` PROTO_TCP or PROTO_UDP):
/// identity for a guest in canald's own namespace, except canald's private loopbacks,
/// which belong to other networks; a network guest's through its `NetView`. Errors
/// are errno values.
pub(crate) fn translate_guest_addr(
    guest: &GuestView,
    a: &CanalAddr,
    proto: u8,
    v6only: bool,
) -> Result<Dest, i32> {
    let d = match &guest.net {
        Some(n) => match n.dest(a, proto, v6only) {
            // An own port the table does not know may be a seccomp-served program's.
            Err(e) if e == errno::ECONNREFUSED => Dest {
                addr: n.held_by_program(a, proto).ok_or(e)?,
                own: true,
            },
            r => r?,
        },
        None if is_private_lo(a) => return Err(errno::ECONNREFUSED),
        None => Dest {
            addr: *a,
            own: false,
        },
    };
    if guest.loopback_only && !is_loopback(&d.addr) {
        return Err(errno::EACCES);
    }
    // The quota policy judges host destinations; a network's own addresses are its own.
    if !d.own && !guest.policy.admits(&d.addr) {
        return Err(errno::EPERM);
    }
    Ok(d)
}

/// Guest view → host address for bind: a network guest's listeners live on its
/// private loopback, or on their published host address.
pub(crate) fn translate_guest_bind(
    guest: &GuestView,
    a: &CanalAddr,
    proto: u8,
    v6only: bool,
) -> Result<CanalAddr, i32> {
    let a = match &guest.net {
        Some(n) => n.bind(a, proto, v6only)?,
        None if is_private_lo(a) => return Err(errno::EADDRNOTAVAIL),
        None => *a,
    };
    if guest.loopback_only && !is_loopback(&a) {
        return Err(errno::EACCES);
    }
    Ok(a)
}

/// Host address → guest view of a peer (getpeername, accept, recvfrom);
/// `via_resolver`: the socket named 10.0.2.3 as a destination (`NetView::peer`).
pub(crate) fn translate_host_addr(
    guest: &GuestView,
    a: &CanalAddr,
    via_resolver: bool,
) -> CanalAddr {
    match &guest.net {
        Some(n) => n.peer(a, via_resolver),
        None => *a,
    }
}

/// Host address → guest view of a connected socket's peer (getpeername), knowing its
/// own host address `local` (`NetView::peer_from`).
pub(crate) fn translate_host_peer(
    guest: &GuestView,
    a: &CanalAddr,
    local: Option<&CanalAddr>,
    via_resolver: bool,
) -> CanalAddr {
    match &guest.net {
        Some(n) => n.peer_from(a, local, via_resolver),
        None => *a,
    }
}

/// Host address → guest view of a local address (getsockname); `peer`: the host
/// address of a connected socket's peer (`NetView::local_toward`).
pub(crate) fn translate_host_local(
    guest: &GuestView,
    a: &CanalAddr,
    peer: Option<&CanalAddr>,
) -> CanalAddr {
    match &guest.net {
        Some(n) => n.local_toward(a, peer),
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
    pub(crate) net: Option<Arc<NetView>>,
    /// Allowed destinations (quota) and the counters of refusals.
    pub(crate) policy: Arc<crate::quota::GuestPolicy>,
}
