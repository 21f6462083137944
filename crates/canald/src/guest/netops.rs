//! Socket operations that name addresses, through the guest's address view: bind,
//! the destination of connect, and the source a socket reaching its own network
//! speaks from (`netview.rs`).
use crate::guest::addr_view::{translate_guest_addr, translate_guest_bind, GuestView};
use crate::guest::netview::{in_family, Dest, NetView, PROTO_UDP};
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
        let host = translate_guest_bind(view, a, proto)?;
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
        let d = translate_guest_addr(view, a, s.proto())?;
        if let (true, Some(net)) = (d.own, &view.net) {
            bind_own_source(s, net, &d.addr)?;
        }
        Ok(d)
    }
}

/// A socket reaching one of its network's own sockets speaks from the network's
/// loopback (so the peer sees 127.0.0.1, and an unpublished listener admits it):
/// bound there first, any port, unless it already has an address; then recorded so
/// the peer can answer (UDP) or be admitted (TCP).
pub(crate) fn bind_own_source(
    s: &mut HostSocket,
    net: &Arc<NetView>,
    dst: &CanalAddr,
) -> Result<(), i32> {
    if s.net.is_tied() {
        return Ok(());
    }
    let fd = fd_of(s)?;
    if sys::sockname(fd).map_or(true, |a| a.port != 0) {
        return Ok(()); // it has an address already: the kernel's choice stands
    }
    sys::bind(fd, &net.own_source(dst)).map_err(|e| sys::errno_of(&e))?;
    let port = sys::sockname(fd).map_err(|e| sys::errno_of(&e))?.port;
    s.net = if s.proto() == PROTO_UDP {
        // Named as an autobound socket is natively: the wildcard and its port.
        let mut wild = in_family(dst, [0; 4], port);
        wild.addr = [0; 16];
        net.record_bind(PROTO_UDP, wild, &in_family(dst, net.lo, port))
    } else {
        net.record_client(port)
    };
    Ok(())
}
