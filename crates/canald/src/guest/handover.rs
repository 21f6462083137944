//! Handing a host socket over to its guest (control message HOST_SOCKET, protocol §2):
//! the program passes a listener, a datagram socket, or a stream it has not connected,
//! to another process with SCM_RIGHTS. The receiver needs the socket itself, so canald
//! gives the guest its host socket and stops serving it; the library puts the kernel
//! socket in place of every descriptor of it (libcanal `handoff.rs`), in each process
//! of the guest that holds one, before its next call on it. Connections canald queued
//! for the listener and the program had not taken are reset, as with a close; the
//! kernel's own queue goes with the socket. A datagram socket's queued sends are sent
//! first; the datagrams canald had received for it and the program had not read are
//! dropped, as a full receive queue drops them (what the host socket holds goes with
//! it), and other canal guests' datagrams reach it through the kernel from then on.
#![forbid(unsafe_code)]

use crate::guest::socket::{Kind, Phase};
use crate::guest::state::Guest;
use crate::sys::Epoll;
use canal_abi::errno;
use canal_abi::sock_flag;
use std::os::fd::{AsRawFd, OwnedFd};

/// Why a socket cannot be handed over: the errno and a line for the guest.
pub(crate) type Refusal = (i32, &'static str);

impl Guest {
    /// Returns socket `handle`'s host socket, with the program's own options on it
    /// (kept options, SO_LINGER), and stops serving it: out of canald's epoll and the
    /// short-circuit's listeners, its queued connections reset, the entry marked
    /// HANDED_OVER. Only for a guest in canald's own network (it could make such a
    /// socket itself: the handover gives it nothing more), and an unconnected stream
    /// only where no destination policy applies (it could connect anywhere).
    pub(crate) fn hand_over(&mut self, ep: &Epoll, handle: u32) -> Result<OwnedFd, Refusal> {
        if self.cfg.net.is_some() || self.cfg.vm {
            return Err((
                errno::EOPNOTSUPP,
                "a guest with a network view of its own keeps its sockets in canald",
            ));
        }
        let policy = self.cfg.loopback_only || self.cfg.policy.dest.is_some();
        let index = self.asked_socket(handle)?;
        let Some(Some(s)) = self.sockets.get_mut(index as usize) else {
            return Err((errno::EBADF, "no such socket"));
        };
        if s.flags & sock_flag::HANDED_OVER != 0 {
            // Another process of the guest follows the first.
            return match s.fd.as_ref().map(|fd| fd.try_clone()) {
                Some(Ok(fd)) => Ok(fd),
                Some(Err(_)) => Err((errno::EMFILE, "canald is out of descriptors")),
                None => Err((errno::EBADF, "no host socket")),
            };
        }
        match (s.kind(), s.phase) {
            (Kind::Listener, Phase::Listening) => {}
            (Kind::Stream, Phase::Open) if s.seg.is_none() && !policy => {}
            (Kind::Stream, Phase::Open) if s.seg.is_none() => {
                return Err((
                    errno::EOPNOTSUPP,
                    "an unconnected stream stays in canald under a destination policy",
                ))
            }
            (Kind::Dgram, Phase::Open | Phase::Connected) if !policy => {}
            (Kind::Dgram, Phase::Open | Phase::Connected) => {
                return Err((
                    errno::EOPNOTSUPP,
                    "a datagram socket stays in canald under a destination policy",
                ))
            }
            _ => {
                return Err((
                    errno::EOPNOTSUPP,
                    "only a listener, a datagram socket or a stream not yet connected \
                     can be handed over",
                ))
            }
        }
        let dgram = s.kind() == Kind::Dgram;
        if dgram {
            // What the guest queued leaves first, in order, as it would have.
            self.drain_dgram_tx(index);
        }
        let Some(Some(s)) = self.sockets.get_mut(index as usize) else {
            return Err((errno::EBADF, "no such socket"));
        };
        match s.made_fd() {
            Err(libc::ENFILE) => return Err((libc::ENFILE, "canald is out of descriptors")),
            Err(_) => return Err((errno::EOPNOTSUPP, "no host socket")),
            Ok(_) => {}
        }
        let Some(fd) = s.fd.as_ref() else {
            return Err((errno::EOPNOTSUPP, "no host socket"));
        };
        let out = fd
            .try_clone()
            .map_err(|_| (errno::EMFILE, "canald is out of descriptors"))?;
        if s.polled {
            ep.delete(fd.as_raw_fd());
            s.polled = false;
        }
        // The program's SO_LINGER (canald's own abortive close must not reach the
        // program, nor the connections a listener's accepts inherit it in).
        crate::guest::socket::put_program_linger(fd, s.linger);
        // canald serves it no more; the entry stays (its other descriptors, in other
        // processes, follow with HOST_SOCKET) until the guest's last one closes.
        // A datagram socket is not serviced at all once Broken (canald must never read
        // the program's datagrams off it again), nor takes ring-to-ring deliveries.
        s.phase = if dgram { Phase::Broken } else { Phase::Failed };
        s.readable = false;
        self.sync_kept_options(index);
        self.unserve_listener(ep, index);
        if dgram {
            self.dl_unserve(index);
        }
        self.set_flags(index, sock_flag::HANDED_OVER, sock_flag::LISTENING);
        self.mark_changed(index);
        Ok(out)
    }

    /// A copy of listener `handle`'s host socket for its guest, which accepts native
    /// clients on it (feature NATIVE_ACCEPT, control LISTENER_SOCKET): only a listener
    /// listening with `NATIVE_ACCEPT`, which canald itself never accepts on. The guest
    /// gains nothing it could not do itself (DIRECT: canald's own network, no policy).
    pub(crate) fn share_listener(&mut self, handle: u32) -> Result<OwnedFd, Refusal> {
        let index = self.asked_socket(handle)?;
        let Some(Some(s)) = self.sockets.get(index as usize) else {
            return Err((errno::EBADF, "no such socket"));
        };
        if s.kind() != Kind::Listener
            || s.phase != Phase::Listening
            || s.flags & sock_flag::NATIVE_ACCEPT == 0
        {
            return Err((
                errno::EOPNOTSUPP,
                "not a listener whose guest accepts its native clients",
            ));
        }
        let fd = s.fd.as_ref().ok_or((errno::EOPNOTSUPP, "no host socket"))?;
        fd.try_clone()
            .map_err(|_| (errno::EMFILE, "canald is out of descriptors"))
    }

    /// The index of live socket `handle` (this generation, not closing), which a
    /// control message names; EBADF otherwise.
    fn asked_socket(&self, handle: u32) -> Result<u32, Refusal> {
        let index = canal_abi::handle_index(handle);
        match self.sockets.get(index as usize) {
            Some(Some(s)) if s.handle == handle && !s.is_closing() => Ok(index),
            _ => Err((errno::EBADF, "no such socket")),
        }
    }
}
