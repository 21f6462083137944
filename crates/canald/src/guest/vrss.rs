//! Virtual RSS (protocol §6.3, docs/architecture.md "Threads"): with `--workers N`
//! a guest's connected stream and datagram sockets are spread over the workers by a
//! flow hash, its bound datagram sockets and listeners by a hash of their local
//! address.
//!
//! A guest keeps a *home* worker: it pops the request queue, owns the data-area
//! allocator and the entry indices, and serves short-circuited sockets (protocol
//! §8.5), unbound datagram sockets and unconnected streams. A stream socket whose flow
//! is known (connect issued, or accepted) or a connected datagram socket goes to
//! worker `flow_hash(local, peer) % N`, a bound unconnected datagram socket or a
//! listener to `local_owner(local)`; if that is not the home, the
//! home hands the socket's host state (fd, ring positions, phase) over once, through
//! the owner's mailbox, and the owner keeps it in a *shadow* `Guest` (the same region
//! mapping, the same slot ports, its own socket table, wake-up coalescing and
//! deficits). From then on only the owner touches that socket's host line, rings and
//! attention bit: the data path takes no locks. Requests naming the socket are
//! forwarded to the owner, which completes the guest's slot itself; when it frees the
//! socket it gives the entry and the rings back to the home (`Msg::Freed`). An away
//! listener's owner accepts and gets each connection's entry from the home
//! (`Msg::Accepted` / `Msg::AcceptDone`) before it writes the ACCEPT record.
#![forbid(unsafe_code)]
use crate::guest::shared::local_owner;
use crate::guest::shared::owner_of;
use crate::guest::shared::Accept;
use crate::guest::shared::Boxes;
use crate::guest::shared::Msg;
use crate::guest::shared::Seed;
use crate::guest::shared::State;
use crate::guest::shared::ACCEPT_INFLIGHT;

use crate::guest::shared::ScAccept;
use crate::guest::socket::Corrupt;
use crate::guest::socket::HostSocket;
use crate::guest::socket::Kind;
use crate::guest::state::Guest;
use crate::request::{self, Request};
use crate::sys::{self, Epoll};
use canal_abi::addr::ADDR_SIZE;
use canal_abi::ring::{record_kind, Producer};
use canal_abi::sync::Ordering;
use canal_abi::CanalAddr;
use std::collections::VecDeque;
use std::os::fd::AsRawFd;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

impl Guest {
    /// Turns virtual RSS on for a home guest on worker `me` (DOORBELLS answered).
    /// Idempotent: an exec'd image asks again.
    pub(crate) fn enable_vrss(&mut self, me: u32, boxes: Boxes) {
        if self.vr.is_some() || boxes.len() < 2 {
            return;
        }
        for i in 0..self.sockets.len() {
            if self.sockets[i].is_some() {
                self.entry(i as u32).owner.store(me, Ordering::Release);
            }
        }
        self.vr = Some(Box::new(State {
            me,
            home: me,
            boxes,
            away: Default::default(),
            departed: Arc::new(AtomicBool::new(false)),
            moved: 0,
            waiting: VecDeque::new(),
        }));
    }

    /// This instance serves sockets of a guest whose home is another worker.
    pub(crate) fn is_shadow(&self) -> bool {
        self.vr.as_ref().is_some_and(|v| v.is_shadow())
    }

    /// The worker a new socket's entry names as owner (before it is published).
    pub(super) fn self_owner(&self) -> u32 {
        self.vr.as_ref().map_or(0, |v| v.me)
    }

    pub(crate) fn seed(&self) -> Option<Box<Seed>> {
        let vr = self.vr.as_ref()?;
        Some(Box::new(Seed {
            id: self.id,
            conn: self.conn,
            pid: self.pid,
            comm: self.comm.clone(),
            cfg: self.cfg.clone(),
            map: self.map.clone(),
            region: self.region,
            ports: self.ports.clone(),
            home: vr.home,
            boxes: vr.boxes.clone(),
            departed: vr.departed.clone(),
            sc: self.sc.clone(),
            evlog: self.evlog.clone(),
        }))
    }

    /// A shadow instance on worker `me` from a home's seed.
    pub(crate) fn shadow(seed: &Seed, me: u32) -> Guest {
        let mut g = Guest::from_parts(
            seed.id,
            seed.conn,
            seed.pid,
            seed.comm.clone(),
            seed.cfg.clone(),
            seed.map.clone(),
            seed.region,
        );
        g.ports = seed.ports.clone();
        g.evlog = seed.evlog.clone();
        g.vr = Some(Box::new(State {
            me,
            home: seed.home,
            boxes: seed.boxes.clone(),
            away: Default::default(),
            departed: seed.departed.clone(),
            moved: 0,
            waiting: VecDeque::new(),
        }));
        // Listeners it owns register and deregister short-circuit listeners.
        g.sc = seed.sc.clone();
        g
    }

    pub(super) fn set_owned(&mut self, index: u32, on: bool) {
        let word = (index / 64) as usize;
        if on {
            self.owned_words = self.owned_words.max(word + 1);
        }
        if let Some(w) = self.owned.get_mut(word) {
            if on {
                *w |= 1 << (index % 64);
            } else {
                *w &= !(1 << (index % 64));
            }
        }
    }

    /// The owner of an away socket named by exactly `handle`.
    pub(crate) fn away_owner(&self, handle: u32) -> Option<u32> {
        let vr = self.vr.as_ref()?;
        match vr.away.get(&canal_abi::handle_index(handle)) {
            Some((w, h)) if *h == handle => Some(*w),
            _ => None,
        }
    }

    /// Home: a request naming a socket served by another worker goes there; the
    /// owner completes the slot. True if forwarded.
    pub(super) fn forward(&mut self, slot: u32, req: &Request) -> bool {
        if !request::needs_handle(req.op) {
            return false;
        }
        let Some(w) = self.away_owner(req.socket) else {
            return false;
        };
        let Some(vr) = self.vr.as_ref() else {
            return false;
        };
        let Some(mb) = vr.boxes.get(w as usize) else {
            return false;
        };
        mb.send(Msg::Request {
            conn: self.conn,
            slot,
            req: Box::new(req.clone()),
        });
        true
    }

    /// Home: a socket's address became known; hands it to its owner if that is
    /// another worker. Streams and connected datagram sockets (`peer`): by the flow
    /// hash, once connect is issued or the stream accepted. Unconnected datagram
    /// sockets and listeners: by their local address, once bound (explicitly or by
    /// a datagram socket's first send) or listening. Short-circuited sockets stay.
    pub(super) fn place(&mut self, ep: &Epoll, index: u32, peer: Option<&CanalAddr>) {
        let Some(vr) = self.vr.as_ref() else {
            return;
        };
        if vr.is_shadow() || self.gone.is_some() {
            return;
        }
        let (me, n) = (vr.me, vr.boxes.len() as u32);
        let Some(Some(s)) = self.sockets.get_mut(index as usize) else {
            return;
        };
        if s.seg.is_some() || s.closing.is_some() {
            return;
        }
        match (s.kind(), peer) {
            (Kind::Stream, Some(_)) | (Kind::Dgram, _) | (Kind::Listener, None) => {}
            _ => return,
        }
        let Some(fd) = &s.fd else {
            return;
        };
        let Ok(local) = sys::sockname(fd) else {
            return;
        };
        if local.port == 0 {
            return; // an unbound datagram socket: placed after its first send
        }
        s.named = true;
        let to = match peer {
            Some(p) => owner_of(&local, p, n),
            None => local_owner(&local, n),
        };
        if to != me {
            self.hand_off(ep, index, to);
        }
    }

    /// Home, after serving datagram socket `index`: if the first send bound it (the
    /// kernel's autobind), place it by its local address now.
    pub(super) fn place_if_autobound(&mut self, ep: &Epoll, index: u32) {
        if self.vr.as_ref().is_none_or(|v| v.is_shadow()) {
            return;
        }
        let unnamed = matches!(self.sockets.get(index as usize),
            Some(Some(s)) if s.kind() == Kind::Dgram && !s.named);
        if unnamed {
            self.place(ep, index, None);
        }
    }

    /// Moves socket `index` to worker `to`: off this epoll, out of this table, owner
    /// word updated (before the owner can see it), then into the owner's mailbox.
    pub(crate) fn hand_off(&mut self, ep: &Epoll, index: u32, to: u32) {
        let Some(seed) = self.seed() else {
            return;
        };
        let Some(mut s) = self.sockets.get_mut(index as usize).and_then(|s| s.take()) else {
            return;
        };
        if let Some(fd) = s.fd.as_ref().filter(|_| s.polled) {
            ep.delete(fd.as_raw_fd());
        }
        s.dirty = false;
        self.set_owned(index, false);
        self.entry(index).owner.store(to, Ordering::Release);
        let handle = s.handle;
        let Some(vr) = self.vr.as_mut() else {
            return;
        };
        vr.away.insert(index, (to, handle));
        vr.moved += 1;
        if let Some(mb) = vr.boxes.get(to as usize) {
            mb.send(Msg::Adopt {
                seed,
                sock: Box::new(s),
            });
        }
    }

    /// Owner: takes over a socket handed over by the home.
    pub(crate) fn adopt(&mut self, ep: &Epoll, mut s: HostSocket) {
        let index = s.index();
        let tok = crate::guest::socket::token::make(
            crate::guest::socket::token::SOCKET,
            self.conn,
            s.generation(),
            index as u16,
        );
        if let Some(fd) = s.fd.as_ref().filter(|_| s.polled) {
            if ep.add(fd.as_raw_fd(), sys::EP_HOST_SOCKET, tok).is_err() {
                // Out of epoll memory: the socket cannot be served; report it broken.
                s.fd = None;
                s.polled = false;
                s.net = Default::default();
                s.phase = crate::guest::socket::Phase::Broken;
            }
        }
        if self.gone.is_some() {
            let d = Instant::now() + crate::guest::config::DRAIN_STALL;
            s.closing = Some(s.closing.map_or(d, |c| c.min(d)));
            self.note_deadline(d);
        } else if self
            .vr
            .as_ref()
            .is_some_and(|v| v.departed.load(std::sync::atomic::Ordering::Acquire))
        {
            // The guest left while the socket was on its way.
            let now = Instant::now();
            self.put_socket(index, s);
            self.set_owned(index, true);
            self.depart(ep, now);
            return;
        }
        // The fresh registration reports the current readiness again (edge state is
        // per epoll); service the socket once in any case.
        s.readable = true;
        s.writable = true;
        self.put_socket(index, s);
        self.set_owned(index, true);
        self.mark_dirty(index);
    }

    /// Home: the guest left; shadows learn it from this flag (sockets in flight).
    pub(super) fn mark_departed(&self) {
        if let Some(vr) = &self.vr {
            vr.departed
                .store(true, std::sync::atomic::Ordering::Release);
        }
    }

    /// Frees or, if it lives elsewhere, closes the socket (index, handle).
    pub(super) fn release(&mut self, ep: &Epoll, index: u32, handle: u32) {
        if let Some(w) = self.away_owner(handle) {
            if let Some(mb) = self.vr.as_ref().and_then(|v| v.boxes.get(w as usize)) {
                mb.send(Msg::Close {
                    conn: self.conn,
                    index,
                    gen: canal_abi::handle_generation(handle) as u16,
                });
            }
            return;
        }
        if self
            .sockets
            .get(index as usize)
            .is_some_and(|x| x.as_ref().is_some_and(|x| x.handle == handle))
        {
            self.free_socket(ep, index);
        } else if let Some(vr) = self.vr.as_ref().filter(|v| v.is_shadow()) {
            // An away listener's unclaimed connection lives elsewhere: the home knows
            // where.
            if let Some(mb) = vr.boxes.get(vr.home as usize) {
                mb.send(Msg::Release {
                    conn: self.conn,
                    index,
                    handle,
                });
            }
        }
    }

    /// WATCH for a socket served by another worker: forwarded. True if it was away.
    pub(super) fn close_away(&mut self, index: u32, gen: u16) -> bool {
        let handle = canal_abi::make_handle(index, gen as u32);
        if self.away_owner(handle).is_none() {
            return false;
        }
        if let Some(w) = self.away_owner(handle) {
            if let Some(mb) = self.vr.as_ref().and_then(|v| v.boxes.get(w as usize)) {
                mb.send(Msg::Close {
                    conn: self.conn,
                    index,
                    gen,
                });
            }
        }
        true
    }

    /// Whether (index, gen) is a socket of this guest served by another worker.
    pub(super) fn has_away(&self, index: u32, gen: u16) -> bool {
        self.away_owner(canal_abi::make_handle(index, gen as u32))
            .is_some()
    }

    /// Owner: a freed socket's entry and rings go back to the home's allocator.
    /// Returns true if this instance is a shadow (the home reclaims them).
    pub(super) fn give_back(&mut self, index: u32, next_gen: u16, rings: [(u64, u64); 2]) -> bool {
        let Some(vr) = self.vr.as_ref() else {
            return false;
        };
        if !vr.is_shadow() {
            return false;
        }
        if let Some(mb) = vr.boxes.get(vr.home as usize) {
            mb.send(Msg::Freed {
                conn: self.conn,
                index,
                next_gen,
                rings,
            });
        }
        true
    }

    /// Home: an owner freed a socket.
    pub(crate) fn reclaim(
        &mut self,
        ep: &Epoll,
        index: u32,
        next_gen: u16,
        rings: [(u64, u64); 2],
    ) {
        let Some(vr) = self.vr.as_mut() else {
            return;
        };
        if vr.away.remove(&index).is_none() {
            return;
        }
        self.free_rings(&rings);
        if let Some(g) = self.generations.get_mut(index as usize) {
            *g = next_gen;
        }
        self.entries.give(index);
        self.quota_freed(ep);
    }

    /// Owner of an away listener: accepts connections and sends each to the home for
    /// its entry, keeping room in the listener's ring for every record in flight.
    pub(super) fn accept_away(&mut self, index: u32) -> Result<(), Corrupt> {
        let need = crate::guest::names::ACCEPT_RECORD;
        loop {
            let s = self.sockets[index as usize].as_ref().ok_or(Corrupt)?;
            let accepting = s.accepts().map_or(0, |q| q.accepting);
            if !s.readable || s.closing.is_some() || accepting >= ACCEPT_INFLIGHT {
                return Ok(()); // an answer marks it dirty again
            }
            // Room for the records in flight and this one, padding included.
            let free = self.want_rx_space(index, (accepting as u64 + 2) * need)?;
            self.drop_claimed(index);
            if free == 0 || self.holds_enough(index)? {
                return Ok(());
            }
            let (conn, host_peer) = match self.accept_ahead(index)? {
                crate::guest::socket::Accepted::Conn(c, p) => (c, p),
                crate::guest::socket::Accepted::Again => continue,
                crate::guest::socket::Accepted::Later => return Ok(()),
            };
            let s = self.sockets[index as usize].as_mut().ok_or(Corrupt)?;
            let (family, listener, inherited) = (s.family, s.handle, s.inherited());
            if let Some(q) = s.accepts_mut() {
                q.accepting += 1;
            }
            let host_peer = host_peer.unwrap_or_default();
            let peer =
                crate::guest::addr_view::translate_host_addr(&self.view(), &host_peer, false);
            self.send_home_accepted(
                listener,
                Accept {
                    family,
                    inherited,
                    peer,
                    fd: conn,
                    host_peer: Some(host_peer),
                    sc: None,
                },
            );
        }
    }

    /// Owner: posts a connection accepted for `listener` to the home.
    pub(super) fn send_home_accepted(&self, listener: u32, acc: Accept) {
        if let Some(vr) = &self.vr {
            if let Some(mb) = vr.boxes.get(vr.home as usize) {
                mb.send(Msg::Accepted {
                    conn: self.conn,
                    from: vr.me,
                    listener,
                    acc: Box::new(acc),
                });
            }
        }
    }

    /// Listener: forgets the ACCEPT records the guest has consumed.
    pub(super) fn drop_claimed(&mut self, index: u32) {
        let mut taken = 0;
        if let Some(Some(l)) = self.sockets.get_mut(index as usize) {
            let seen = l.rx.seen;
            if let Some(q) = l.accepts_mut() {
                while q
                    .unclaimed
                    .front()
                    .is_some_and(|&(end, _)| (end.wrapping_sub(seen) as i64) <= 0)
                {
                    q.unclaimed.pop_front();
                    taken += 1;
                }
                q.taken(taken);
            }
        }
        if taken > 0 {
            self.note_queued(index);
        }
    }

    /// Home: installs the entry of a connection an away listener accepted (or keeps
    /// it until an entry is free) and answers its owner `from`.
    pub(crate) fn install_accepted(
        &mut self,
        ep: &Epoll,
        from: u32,
        listener: u32,
        acc: Box<Accept>,
    ) {
        let full =
            self.table_full() || (acc.sc.is_none() && self.ring_room() < 2 * self.cfg.ring_size);
        if self.gone.is_none() && full {
            if let Some(vr) = self.vr.as_mut() {
                vr.waiting.push_back((from, listener, acc));
            }
            return;
        }
        let Accept {
            family,
            inherited,
            peer,
            fd,
            host_peer,
            sc,
        } = *acc;
        let handle = if self.gone.is_some() {
            0 // the guest left: the connection is dropped
        } else if let Some(sc) = &sc {
            let h = self.sc_install(Some(fd), family, sc.link()).unwrap_or(0);
            self.inherit_from_listener(h, inherited);
            h
        } else {
            match self.install(
                ep,
                Some(fd),
                Kind::Stream,
                family,
                crate::guest::socket::Phase::Connected,
            ) {
                Ok(h) => {
                    let i = canal_abi::handle_index(h);
                    if let Some(Some(s)) = self.sockets.get_mut(i as usize) {
                        s.readable = true;
                        s.writable = true;
                        s.inherit(inherited);
                    }
                    self.mark_dirty(i);
                    // Owner chosen (and written to the entry) before the owner of the
                    // listener publishes the handle.
                    if let Some(hp) = host_peer {
                        self.place(ep, i, Some(&hp));
                    }
                    h
                }
                Err(_) => 0, // the connection is dropped (closed)
            }
        };
        if let Some(mb) = self.vr.as_ref().and_then(|v| v.boxes.get(from as usize)) {
            mb.send(Msg::AcceptDone {
                conn: self.conn,
                listener,
                handle,
                peer,
                sc,
            });
        }
    }

    /// Home: connections waiting for an entry get one, in order, while entries last
    /// (all are answered, with no entry, once the guest left).
    pub(super) fn retry_accepts(&mut self, ep: &Epoll) {
        let n = self.vr.as_ref().map_or(0, |v| v.waiting.len());
        for _ in 0..n {
            if self.gone.is_none() && self.table_full() {
                return;
            }
            let Some((from, listener, acc)) = self.vr.as_mut().and_then(|v| v.waiting.pop_front())
            else {
                return;
            };
            self.install_accepted(ep, from, listener, acc);
        }
    }

    /// Owner of an away listener: the home installed (or dropped) a connection it
    /// accepted; writes the ACCEPT record. A listener gone meanwhile releases it.
    pub(crate) fn accept_done(
        &mut self,
        ep: &Epoll,
        listener: u32,
        handle: u32,
        peer: CanalAddr,
        sc: Option<Box<ScAccept>>,
    ) {
        let li = canal_abi::handle_index(listener);
        let live = match self.sockets.get_mut(li as usize) {
            Some(Some(l)) if l.handle == listener => {
                if let Some(q) = l.accepts_mut() {
                    q.accepting = q.accepting.saturating_sub(1);
                }
                l.closing.is_none() && self.gone.is_none()
            }
            _ => false,
        };
        if live {
            self.mark_dirty(li); // room for one more accept
        }
        if handle == 0 {
            if let Some(sc) = sc {
                sc.failed(self.self_owner());
            }
            return;
        }
        // The home installed the entry: its names are not known here, and the
        // program asks for them if it needs them.
        let pushed = live && self.push_accept(li, handle, &peer, None).is_ok_and(|p| p);
        if !pushed {
            if live {
                // We reserved the room: only a guest moving its tail backwards gets
                // here.
                self.break_socket(ep, li);
            }
            self.release(ep, canal_abi::handle_index(handle), handle);
            if let Some(sc) = sc {
                sc.failed(self.self_owner());
            }
            return;
        }
        if let Some(sc) = sc {
            sc.published(self.self_owner(), handle);
        }
    }

    /// Appends an ACCEPT record for `handle` to listener `index`'s ring. Ok(false): no
    /// room.
    pub(super) fn push_accept(
        &mut self,
        index: u32,
        handle: u32,
        peer: &CanalAddr,
        names: Option<(CanalAddr, CanalAddr)>,
    ) -> Result<bool, Corrupt> {
        // The peer as accept(2) returns it, then the accepted socket's final names
        // (§4 Names), which spare the program's getsockname/getpeername a round trip.
        let mut addr = [0u8; canal_abi::names::ACCEPT_ADDR_NAMED];
        addr[..ADDR_SIZE].copy_from_slice(&peer.encode());
        let addr_len = match names {
            Some((l, p)) => {
                addr[ADDR_SIZE..].copy_from_slice(&canal_abi::names::encode(&l, &p));
                addr.len()
            }
            None => ADDR_SIZE,
        };
        let mut payload = [0u8; canal_abi::ACCEPT_PAYLOAD];
        payload[..4].copy_from_slice(&handle.to_le_bytes());
        let s = self.sockets[index as usize].as_ref().ok_or(Corrupt)?;
        let ring = self.region.ring(s.rx.off, s.rx.size).ok_or(Corrupt)?;
        let e = self.entry(index);
        let mut p = Producer {
            storage: &ring,
            head_shared: &e.rx_head,
            tail_shared: &e.rx_tail,
            head: s.rx.idx,
        };
        if !p
            .push_record(record_kind::ACCEPT, &addr[..addr_len], &[&payload])
            .map_err(|_| Corrupt)?
        {
            return Ok(false);
        }
        let head = p.head;
        self.publish_rx_head(index, head, 0);
        if let Some(Some(l)) = self.sockets.get_mut(index as usize) {
            if let Some(q) = l.accepts_mut() {
                q.unclaimed.push_back((head, handle));
            }
        }
        Ok(true)
    }

    /// Home: sockets away (for `finished`).
    pub(super) fn any_away(&self) -> bool {
        self.vr.as_ref().is_some_and(|v| !v.away.is_empty())
    }
}

/// Delivers one message to worker `me`'s shard.
pub(crate) fn deliver(
    guests: &mut std::collections::BTreeMap<u32, Guest>,
    shadows: &mut std::collections::BTreeMap<u32, Guest>,
    ep: &Epoll,
    me: u32,
    m: Msg,
) -> bool {
    match m {
        Msg::Adopt { seed, sock } => {
            let g = shadows
                .entry(seed.conn)
                .or_insert_with(|| Guest::shadow(&seed, me));
            g.adopt(ep, *sock);
        }
        Msg::Request { conn, slot, req } => {
            if let Some(g) = shadows.get_mut(&conn) {
                g.wake.begin_round(Instant::now());
                g.run_request(ep, slot, &req);
            } else {
                // No shadow (it was reaped: the guest left): answer EBADF so no
                // thread waits forever.
                let any = guests.get(&conn).map(|g| g.region);
                if let Some(slot_ref) = any.as_ref().and_then(|r| r.slot(slot)) {
                    slot_ref
                        .result
                        .store(-(canal_abi::errno::EBADF as i64), Ordering::Relaxed);
                    slot_ref.done_seq.store(req.seq, Ordering::Relaxed);
                    slot_ref
                        .state
                        .store(canal_abi::slot_state::DONE, Ordering::Release);
                }
            }
        }
        Msg::Close { conn, index, gen } => {
            if let Some(g) = shadows.get_mut(&conn) {
                g.close_unreferenced(index, gen);
            }
        }
        Msg::Freed {
            conn,
            index,
            next_gen,
            rings,
        } => {
            if let Some(g) = guests.get_mut(&conn) {
                g.reclaim(ep, index, next_gen, rings);
            }
        }
        Msg::Accepted {
            conn,
            from,
            listener,
            acc,
        } => {
            // A guest already reaped: the descriptor closes with the message.
            if let Some(g) = guests.get_mut(&conn) {
                g.install_accepted(ep, from, listener, acc);
            }
        }
        Msg::AcceptDone {
            conn,
            listener,
            handle,
            peer,
            sc,
        } => match shadows.get_mut(&conn) {
            Some(g) => g.accept_done(ep, listener, handle, peer, sc),
            None => {
                // The shadow is gone: the guest left, and its home's departure closes
                // whatever it installed. A pairing falls back.
                if let Some(sc) = sc {
                    sc.failed(me);
                }
            }
        },
        Msg::Release {
            conn,
            index,
            handle,
        } => {
            if let Some(g) = guests.get_mut(&conn) {
                g.release(ep, index, handle);
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guest::shared::flow_hash;

    fn a(ip: [u8; 4], port: u16) -> CanalAddr {
        CanalAddr::v4(ip, port)
    }

    #[test]
    fn flow_hash_is_stable() {
        let (l, p) = (a([127, 0, 0, 1], 40000), a([127, 0, 0, 1], 7));
        // Fixed key: the same flow, the same value, in every run and every canald.
        assert_eq!(flow_hash(&l, &p), flow_hash(&l, &p));
        const GOLDEN: u32 = 1_845_638_679;
        assert_eq!(flow_hash(&l, &p), GOLDEN);
        // Direction matters (host view: local, then peer).
        assert_ne!(flow_hash(&l, &p), flow_hash(&p, &l));
    }

    #[test]
    fn owners_are_disjoint_and_spread() {
        for n in [1u32, 2, 3, 4, 16] {
            let mut count = vec![0u32; n as usize];
            for port in 32768..(32768 + 4000u16) {
                let o = owner_of(&a([127, 0, 0, 1], port), &a([127, 0, 0, 1], 8080), n);
                assert!(o < n, "owner in range");
                // One owner per flow (disjoint sets): asking again gives the same one.
                assert_eq!(
                    o,
                    owner_of(&a([127, 0, 0, 1], port), &a([127, 0, 0, 1], 8080), n)
                );
                count[o as usize] += 1;
            }
            // Consecutive ephemeral ports spread over every worker, none starved.
            let fair = 4000 / n;
            for c in &count {
                assert!(*c > fair / 2 && *c < fair * 3 / 2, "n={n}: {count:?}");
            }
        }
    }

    #[test]
    fn ipv6_and_ports_count() {
        let l6 = CanalAddr::v6([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1], 5000, 0, 0);
        let p6 = CanalAddr::v6([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1], 6000, 0, 0);
        let mut seen = std::collections::BTreeSet::new();
        for port in 5000..5064 {
            let mut l = l6;
            l.port = port;
            seen.insert(owner_of(&l, &p6, 2));
        }
        assert_eq!(seen.len(), 2, "IPv6 flows spread too");
    }
}
