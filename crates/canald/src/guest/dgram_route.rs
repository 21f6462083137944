//! Datagrams between co-resident canal guests (protocol §8.9): canald moves each one
//! from the sender's ring into the receiver's, without the kernel's UDP in between
//! (the state it keeps for that: `dgram_local`).
//! Through the kernel a datagram took two passes of canald (a `sendmmsg`, then the
//! receiver's host socket read between rounds), and a fast sender's round overflowed
//! the receiver's host socket buffer before canald read it (50–90% lost in B15).
//!
//! Only the plain case goes this way; anything else keeps the kernel's path, which
//! then decides what a datagram reaches:
//! - both guests see canald's own namespace (no network view, not a VM), and neither
//!   spreads its sockets over workers (virtual RSS);
//! - the receiver is *registered*: bound (by bind, connect or an autobinding send) to
//!   an address of its own family, with no socket option set but SO_SNDBUF and
//!   SO_RCVBUF, and the only canal socket with that address. Without SO_REUSEADDR or
//!   SO_REUSEPORT no other socket can share its port, so the kernel would deliver to
//!   it too; with no receive option there are no control messages to fill in;
//! - the sender is plain the same way and never sent a MSG_MORE part (its host socket
//!   may hold a datagram being assembled), and the datagram has no control messages;
//! - the destination is the receiver's exact address, or a local address on the port
//!   of a wildcard-bound receiver (the kernel's order: an exact binding first);
//! - a connected receiver takes datagrams from its peer only, as the kernel's does.
//!
//! Like the pair segments of streams, this bypasses the host's packet filter for
//! traffic between canal guests (docs/threat-model.md).
use crate::guest::dgram_local::keeps_local;
use crate::guest::dgram_local::source_for;
use crate::guest::dgram_local::Delivery;
use crate::guest::dgram_local::Local;
use crate::guest::dgram_local::Reg;
use crate::guest::shared::lock;
use crate::guest::shared::SharedRef;
use crate::guest::socket::HostSocket;
use crate::guest::socket::KindState;
use crate::guest::socket::Phase;
use crate::guest::state::Guest;
use crate::guest::wake::RoundStats;
use crate::sys;
use canal_abi::CanalAddr;
use std::collections::BTreeMap;

/// What becomes of a datagram to a destination.
pub(crate) enum Route {
    /// Through the host socket.
    Kernel,
    /// To a registered receiver, from this source address.
    Deliver(Reg, CanalAddr),
    /// To a connected receiver from someone else: dropped, as the kernel does.
    Drop,
}

/// Sender side, for a datagram of socket `s` (of guest `conn`) to `to` (None: its
/// connected peer). An unbound sender is bound first, as the kernel's send would
/// autobind it, and registered, so that replies come back the same way.
pub(crate) fn route(
    sc: &SharedRef,
    conn: u32,
    s: &mut HostSocket,
    to: Option<&CanalAddr>,
) -> Route {
    let family = s.family;
    let Some((handle, fd, local)) = s.dgram_parts() else {
        return Route::Kernel;
    };
    let Some(dst) = to.copied().or(local.peer) else {
        return Route::Kernel;
    };
    if local.tainted || local.assembles || dst.family != family {
        return Route::Kernel;
    }
    let mut guard = lock(sc);
    let sh = &mut *guard;
    if !sh.enabled {
        return Route::Kernel;
    }
    let host = &mut sh.host_addrs;
    let Some(reg) = sh.locals.route(&dst, |a| host.is_local(a)) else {
        return Route::Kernel;
    };
    let key = match local.registered_at() {
        Some(k) => k,
        None => {
            let any = CanalAddr {
                family,
                ..CanalAddr::default()
            };
            let bound = sys::sockname(fd).ok().filter(|a| a.port != 0);
            let Some(k) = bound.or_else(|| {
                sys::bind(fd, &any).ok()?;
                sys::sockname(fd).ok()
            }) else {
                return Route::Kernel;
            };
            if !registrable(fd, local) {
                return Route::Kernel;
            }
            sh.locals.enroll(k, conn, handle, local);
            k
        }
    };
    let from = source_for(&key, &dst);
    match reg.peer {
        Some(p) if p != from => Route::Drop,
        _ => Route::Deliver(reg, from),
    }
}

/// Whether the host socket `fd` may take local datagrams: no SO_REUSEADDR or
/// SO_REUSEPORT (set before canald saw an option: a socket created with them by a
/// seccomp-served program) and an untainted state; records its SO_RCVBUF.
fn registrable(fd: &std::os::fd::OwnedFd, local: &mut Local) -> bool {
    if local.tainted {
        return false;
    }
    let on = |name| sys::sockopt_int(fd, libc::SOL_SOCKET, name).map_or(true, |v| v != 0);
    if on(libc::SO_REUSEADDR) || on(libc::SO_REUSEPORT) {
        local.tainted = true;
        return false;
    }
    local.rcvbuf = rcvbuf_of(fd).unwrap_or(212_992);
    true
}

/// The host socket's SO_RCVBUF.
fn rcvbuf_of(fd: &std::os::fd::OwnedFd) -> Option<usize> {
    let v = sys::sockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF).ok()?;
    Some(v.max(0) as usize)
}

impl Guest {
    /// The shared state, if this guest's datagram sockets may use the local path.
    fn dl_shared(&self) -> Option<&SharedRef> {
        if self.cfg.net.is_some() || self.cfg.vm || self.vr.is_some() {
            return None;
        }
        self.sc.as_ref()
    }

    /// The shared state for a sender's flush (None: every datagram goes to the kernel).
    pub(crate) fn dl_sender(&self, index: u32) -> Option<SharedRef> {
        let sc = self.dl_shared()?;
        let s = self.sockets.get(index as usize)?.as_ref()?;
        match &s.state {
            KindState::Dgram(d) if !d.local.tainted => Some(sc.clone()),
            _ => None,
        }
    }

    /// After BIND, CONNECT or its undoing on a datagram socket: (re-)registers it under
    /// its host address now (connect may have fixed a wildcard one), with its peer.
    pub(crate) fn dl_register(&mut self, index: u32, peer: Option<Option<CanalAddr>>) {
        let Some(sc) = self.dl_shared().cloned() else {
            return;
        };
        let conn = self.conn;
        let Some(Some(s)) = self.sockets.get_mut(index as usize) else {
            return;
        };
        let live = s.phase != Phase::Broken;
        let Some((handle, fd, local)) = s.dgram_parts() else {
            return;
        };
        let at = sys::sockname(fd).ok().filter(|a| a.port != 0 && live);
        if let Some(p) = peer {
            local.peer = p;
        }
        let mut sh = lock(&sc);
        sh.locals.withdraw(conn, handle, local);
        if let (Some(at), true) = (at, sh.enabled) {
            if registrable(fd, local) {
                sh.locals.enroll(at, conn, handle, local);
            }
        }
    }

    /// After SETSOCKOPT on a datagram socket: any option but the buffer sizes takes it
    /// off the local path; SO_RCVBUF is read again.
    pub(crate) fn dl_option_set(&mut self, index: u32, level: i32, name: i32) {
        let conn = self.conn;
        let sc = self.sc.clone();
        let Some(Some(s)) = self.sockets.get_mut(index as usize) else {
            return;
        };
        let Some((handle, fd, local)) = s.dgram_parts() else {
            return;
        };
        if keeps_local(level, name) {
            if let Some(v) = rcvbuf_of(fd) {
                local.rcvbuf = v;
            }
            return;
        }
        local.tainted = true;
        if let Some(sc) = sc {
            lock(&sc).locals.withdraw(conn, handle, local);
        }
    }

    /// Datagram socket `index` is canald's no more (handed over): out of the registry,
    /// so other canal guests' datagrams reach it through the kernel.
    pub(crate) fn dl_unserve(&mut self, index: u32) {
        if let Some(s) = self.sockets[index as usize].take() {
            self.dl_freed(&s);
            self.sockets[index as usize] = Some(s);
        }
    }

    /// A socket being freed leaves the registry.
    pub(crate) fn dl_freed(&self, s: &HostSocket) {
        let (KindState::Dgram(d), Some(sc)) = (&s.state, self.sc.as_ref()) else {
            return;
        };
        if let Some(k) = d.local.registered_at() {
            lock(sc).locals.unregister(&k, self.conn, s.handle);
        }
    }

    /// Queues a flush's local datagrams for their receivers' workers, poking each
    /// other worker once.
    pub(crate) fn dl_post(&self, sc: &SharedRef, out: Vec<Delivery>) {
        let mut sh = lock(sc);
        let me = sh.home(self.conn);
        let mut poked = Vec::new();
        for d in out {
            let w = sh.home(d.conn);
            if sh.locals.push(w, d) && w != me && !poked.contains(&w) {
                poked.push(w);
                sh.poke(w);
            }
        }
    }

    /// Receiver side: a delivered datagram joins the socket's inbox, or is dropped as
    /// the kernel drops it (socket gone, peer changed, receive buffer full). Some(its
    /// index) if taken.
    fn dl_accept(&mut self, d: Delivery) -> Option<u32> {
        let index = self.sc_index(d.handle)?;
        let s = self.sockets.get_mut(index as usize)?.as_mut()?;
        if s.phase == Phase::Broken || s.closing.is_some() {
            return None;
        }
        let KindState::Dgram(dg) = &mut s.state else {
            return None;
        };
        if !dg.local.accept(d) {
            return None;
        }
        self.mark_dirty(index);
        Some(index)
    }
}

/// Worker `me` hands the deliveries queued for it to their receivers (`guests`: the
/// guests it is home to): each goes into the receiver's ring at once where it fits
/// (its inbox holds the rest), and the receivers' sleepers wake now, not a round
/// later. True if there were any.
pub(crate) fn deliver(sc: &SharedRef, me: u32, guests: &mut BTreeMap<u32, Guest>) -> bool {
    let batch = lock(sc).locals.take(me);
    if batch.is_empty() {
        return false;
    }
    let mut touched: Vec<u32> = Vec::new();
    for d in batch {
        let conn = d.conn;
        let Some(g) = guests.get_mut(&conn) else {
            continue;
        };
        if let Some(index) = g.dl_accept(d) {
            // A ring the guest broke is found by the socket's next service (it stays
            // dirty), which breaks the socket.
            let _ = g.fill_dgram_rx(index, &mut RoundStats::default());
            if !touched.contains(&conn) {
                touched.push(conn);
            }
        }
    }
    for conn in touched {
        if let Some(g) = guests.get_mut(&conn) {
            g.wake_event_sleepers();
            g.flush_deferred_wakes(g.wake.now);
        }
    }
    true
}
