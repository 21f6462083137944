//! getsockname and getpeername in the guest's view, and a connected stream's final
//! names (protocol §4 Names): they cannot change while the connection lasts, so
//! canald hands them over once — in the ACCEPT record, or as the 64-byte answer to
//! either request — and the library answers the program's later calls itself.
use crate::guest::addr_view::translate_host_local;
use crate::guest::addr_view::translate_host_peer;
use crate::guest::addr_view::GuestView;
use crate::guest::socket::fd_of;
use crate::guest::socket::Kind;
use crate::guest::state::Guest;
use crate::sys;
use canal_abi::addr::CanalAddr;
use canal_abi::addr::ADDR_SIZE;
use canal_abi::names::NAMES_SIZE;
use canal_abi::SLOT_PAYLOAD;
use std::os::fd::OwnedFd;

/// Ring room an ACCEPT record takes at most: the peer, the names and the handle.
pub(crate) const ACCEPT_RECORD: u64 = canal_abi::ring::record_size(
    canal_abi::names::ACCEPT_ADDR_NAMED as u64,
    canal_abi::ACCEPT_PAYLOAD as u64,
);

/// A connected stream's host (local, peer) in the guest's view: each translated
/// knowing the other, as getsockname and getpeername translate them; `via_resolver`:
/// the guest connected to 10.0.2.3 (`HostSocket::via_resolver`).
fn in_view(
    view: &GuestView,
    local: &CanalAddr,
    peer: &CanalAddr,
    via_resolver: bool,
) -> (CanalAddr, CanalAddr) {
    (
        translate_host_local(view, local, Some(peer)),
        translate_host_peer(view, peer, Some(local), via_resolver),
    )
}

/// A host stream's (local, peer) in the guest's view, if it is connected; `peer`:
/// its host peer when the caller knows it already (accept returned it).
pub(crate) fn host_names(
    view: &GuestView,
    fd: &OwnedFd,
    peer: Option<CanalAddr>,
    via_resolver: bool,
) -> Option<(CanalAddr, CanalAddr)> {
    let local = sys::sockname(fd).ok()?;
    let peer = match peer {
        Some(p) => p,
        None => sys::peername(fd).ok()?,
    };
    Some(in_view(view, &local, &peer, via_resolver))
}

/// The 64-byte answer of a name request whose names are final: the name asked for
/// (`peer`: getpeername's), then the other.
fn put_final(
    out: &mut [u8; SLOT_PAYLOAD],
    (local, remote): (CanalAddr, CanalAddr),
    peer: bool,
) -> (i64, usize) {
    let (asked, other) = if peer {
        (remote, local)
    } else {
        (local, remote)
    };
    out[..ADDR_SIZE].copy_from_slice(&asked.encode());
    out[ADDR_SIZE..NAMES_SIZE].copy_from_slice(&other.encode());
    (0, NAMES_SIZE)
}

impl Guest {
    /// Socket `index`'s (local, peer) in the guest's view when they are final: a
    /// short-circuited stream's (fixed when it was paired, reported in every state),
    /// or a host stream's while it is connected. None for anything else.
    pub(crate) fn final_names(
        &self,
        view: &GuestView,
        index: u32,
    ) -> Option<(CanalAddr, CanalAddr)> {
        self.final_names_knowing(view, index, None)
    }

    /// `final_names`, with the host peer when the caller has just read it.
    fn final_names_knowing(
        &self,
        view: &GuestView,
        index: u32,
        host_peer: Option<CanalAddr>,
    ) -> Option<(CanalAddr, CanalAddr)> {
        let s = self.sockets.get(index as usize)?.as_ref()?;
        if s.kind() != Kind::Stream {
            return None;
        }
        if let Some(l) = &s.seg {
            return Some(in_view(view, &l.local, &l.peer, s.via_resolver));
        }
        host_names(view, s.fd.as_ref()?, host_peer, s.via_resolver)
    }

    /// CONNECT's answer `r`, with the connector's names (local, peer) when they are
    /// final by then: a loopback connect has settled, a short-circuit was paired.
    /// They go with EINPROGRESS too (the guest's blocking connect waits on).
    /// `host_peer`: the peer the connect's settle check read, if it did (one
    /// getpeername less).
    pub(crate) fn answer_names(
        &self,
        view: &GuestView,
        index: u32,
        r: Result<(i64, usize), i32>,
        host_peer: Option<CanalAddr>,
        out: &mut [u8; SLOT_PAYLOAD],
    ) -> Result<(i64, usize), i32> {
        let result = match r {
            Ok((v, 0)) => v,
            Err(e) if e == canal_abi::errno::EINPROGRESS => -(e as i64),
            other => return other,
        };
        match self.final_names_knowing(view, index, host_peer) {
            Some((l, p)) => {
                out[..NAMES_SIZE].copy_from_slice(&canal_abi::names::encode(&l, &p));
                Ok((result, NAMES_SIZE))
            }
            None => r,
        }
    }

    /// GETSOCKNAME (`peer` false) and GETPEERNAME: the name asked for; when the
    /// names are final, the other one follows it (64 bytes), which tells the guest
    /// it may keep both (an older guest reads the first 32).
    pub(crate) fn op_name(
        &mut self,
        view: &GuestView,
        index: u32,
        peer: bool,
        out: &mut [u8; SLOT_PAYLOAD],
    ) -> Result<(i64, usize), i32> {
        let s = self.live(index)?;
        if let Some(l) = &s.seg {
            return Ok(put_final(
                out,
                in_view(view, &l.local, &l.peer, s.via_resolver),
                peer,
            ));
        }
        let fd = fd_of(s)?;
        // Each name read once: both decide whether they are final, and translate.
        let (local, remote) = (sys::sockname(fd), sys::peername(fd));
        if let (Kind::Stream, Ok(l), Ok(p)) = (s.kind(), &local, &remote) {
            return Ok(put_final(out, in_view(view, l, p, s.via_resolver), peer));
        }
        // Unconnected, a network guest's socket has the name it bound (the wildcard
        // stays the wildcard).
        let named = s.net.guest_name().filter(|_| remote.is_err());
        if let (false, Some(a)) = (peer, named) {
            out[..ADDR_SIZE].copy_from_slice(&a.encode());
            return Ok((0, ADDR_SIZE));
        }
        let a = if peer {
            remote.map(|a| translate_host_peer(view, &a, local.as_ref().ok(), s.via_resolver))
        } else {
            local.map(|a| translate_host_local(view, &a, remote.as_ref().ok()))
        }
        .map_err(|e| sys::errno_of(&e))?;
        out[..ADDR_SIZE].copy_from_slice(&a.encode());
        Ok((0, ADDR_SIZE))
    }
}
