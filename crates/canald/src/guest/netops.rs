//! Socket operations that name addresses, through the guest's address view: bind,
//! the destination of connect, and the source a socket reaching its own network
//! speaks from (`netview.rs`).
use crate::guest::addr_view::{translate_guest_addr, translate_guest_bind, GuestView};
use crate::guest::netview::{in_family, is_plain_v6, is_resolver, Dest, NetView, PROTO_UDP};
use crate::guest::socket::{fd_of, HostSocket};
use crate::guest::state::Guest;
use crate::sys;
use canal_abi::CanalAddr;
use std::sync::Arc;

impl Guest {
    /// BIND: the host address for the guest's, bound; a network guest's socket is
    /// recorded in its network's table under the guest's own name.
    pub(crate) fn op_bind(
        &mut self,
        view: &GuestView,
        index: u32,
        a: &CanalAddr,
    ) -> Result<(), i32> {
        let s = self.live(index)?;
        if s.seg.is_some() {
            // A short-circuited stream is connected, so bound: the kernel's EINVAL
            // (its host socket, if any, is a port reservation or an options holder).
            return Err(canal_abi::errno::EINVAL);
        }
        let proto = s.proto();
        let host = translate_guest_bind(view, a, proto, s.v6only)?;
        let fd = fd_of(s)?;
        sys::bind(fd, &host).map_err(|e| sys::errno_of(&e))?;
        if let Some(net) = &view.net {
            let bound = sys::sockname(fd).unwrap_or(host);
            let mut guest = *a;
            if guest.port == 0 {
                guest.port = bound.port;
            }
            s.net = net.record_bind(proto, guest, &bound);
        }
        Ok(())
    }

    /// The host destination of CONNECT; a socket reaching its own network is bound
    /// on the network's loopback first.
    pub(crate) fn connect_dest(
        &mut self,
        view: &GuestView,
        index: u32,
        a: &CanalAddr,
    ) -> Result<Dest, i32> {
        let s = self.live(index)?;
        let d = translate_guest_addr(view, a, s.proto(), s.v6only)?;
        s.via_resolver = is_resolver(a);
        if let (true, Some(net)) = (d.own, &view.net) {
            bind_own_source(s, net, &d.addr, is_plain_v6(a))?;
        } else if !d.own && s.proto() == PROTO_UDP {
            s.net.note_contact(&d.addr); // its replies reach a socket on `lo`
        }
        Ok(d)
    }
}

/// IPV6_V6ONLY in a network's view: kept by canald (`HostSocket::v6only`), not
/// given to the host socket, whose own addresses are IPv4-mapped private ones.
pub(crate) fn is_v6only(view: &GuestView, level: i32, name: i32) -> bool {
    view.net.is_some() && level == libc::IPPROTO_IPV6 && name == libc::IPV6_V6ONLY
}

impl Guest {
    /// setsockopt(IPV6_V6ONLY) in a network's view, with the kernel's checks: an
    /// AF_INET6 socket (else ENOPROTOOPT), at least an int, not once bound or
    /// connected (EINVAL).
    pub(crate) fn set_view_v6only(&mut self, index: u32, value: &[u8]) -> Result<(), i32> {
        let s = self.live(index)?;
        if s.family != canal_abi::addr::FAMILY_INET6 {
            return Err(libc::ENOPROTOOPT);
        }
        let v: [u8; 4] = value
            .get(..4)
            .and_then(|v| v.try_into().ok())
            .ok_or(libc::EINVAL)?;
        let bound = s.seg.is_some()
            || s.net.is_tied()
            || s.fd
                .as_ref()
                .is_some_and(|fd| sys::sockname(fd).is_ok_and(|a| a.port != 0));
        if bound {
            return Err(libc::EINVAL);
        }
        s.v6only = i32::from_ne_bytes(v) != 0;
        Ok(())
    }

    /// getsockopt(IPV6_V6ONLY) in a network's view.
    pub(crate) fn view_v6only(&mut self, index: u32) -> Result<i32, i32> {
        let s = self.live(index)?;
        if s.family != canal_abi::addr::FAMILY_INET6 {
            return Err(libc::ENOPROTOOPT);
        }
        Ok(i32::from(s.v6only))
    }
}

/// A socket reaching one of its network's own sockets (at host address `dst`) speaks
/// from the network's loopback (so the peer sees 127.0.0.1, or ::1 when the guest
/// named an IPv6 destination, `v6`; and an unpublished listener admits it): bound
/// there first, any port, unless it already has an address; then recorded so the peer
/// can answer (UDP) or be admitted (TCP).
pub(crate) fn bind_own_source(
    s: &mut HostSocket,
    net: &Arc<NetView>,
    dst: &CanalAddr,
    v6: bool,
) -> Result<(), i32> {
    if s.net.is_tied() {
        return Ok(());
    }
    let fd = s.made_fd()?;
    if sys::sockname(fd).map_or(true, |a| a.port != 0) {
        return Ok(()); // it has an address already: the kernel's choice stands
    }
    sys::bind(fd, &net.own_source(dst, v6)).map_err(|e| sys::errno_of(&e))?;
    let local = sys::sockname(fd).map_err(|e| sys::errno_of(&e))?;
    s.net = if s.proto() == PROTO_UDP {
        // Named as an autobound socket is natively: the wildcard and its port.
        let mut wild = in_family(dst, [0; 4], local.port);
        wild.addr = [0; 16];
        let tie = net.record_bind(PROTO_UDP, wild, &local);
        if v6 && !s.v6only {
            net.mark_dual(local.port); // on `lo6`, but IPv4 reaches it too
        }
        tie
    } else {
        net.record_client(&local)
    };
    Ok(())
}
