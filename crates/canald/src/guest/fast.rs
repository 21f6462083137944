//! Fast connects, canald's side (protocol §8.10): the tickets a guest with feature
//! FAST_CONNECT connects with, without a CONNECT and without waiting for canald.
//!
//! When a guest's CONNECT was paired ring to ring with a listener, canald lists that
//! listener in the guest's fast table (the region header's `canal_abi::fast::Table`)
//! and keeps a few tickets ready in its record: each a packed-arena slot of the two
//! guests, its header written and registered as a segment, and a reserved local port.
//! The guest's connect claims a ticket, completes its own entry and leaves a mark;
//! the worker serving the guest reads the mark (`Guest::take_fast_mark`), checks it
//! against the ticket it granted, and pairs the connection as for a CONNECT, off the
//! connector's path.
//!
//! Room: a ticket counts against its listener's backlog from the moment it is
//! granted (`ListenerReg::fast_out`), so the accept queue, the tickets outstanding
//! and the CONNECTs waiting never exceed Linux's backlog + 1 together: a listener
//! whose program stops accepting gets no new tickets, and connects beyond its queue
//! wait in CONNECT as they would natively.
//!
//! Everything of a guest's here goes when the guest leaves (`forget`), and a
//! listener's records in every guest when the listener goes (`withdraw_listener`):
//! before its close is answered, so a connect after close() fails as natively.
use crate::guest::addr_view::{translate_host_local, translate_host_peer, GuestView};
use crate::guest::fast_book::{Rec, Seen, Ticket, READY_IN_ALL, READY_PER_GUEST};
use crate::guest::netview::{is_resolver, Dest};
use crate::guest::ports::PortHold;
use crate::guest::segmem::{acceptor_link, arena_segment, connector_link, Accepted};
use crate::guest::shared::{is_unspecified, ListenerReg, SegMem, SegmentRec, Shared};
use crate::guest::shared::{lock, Event, Job, Pending, ScAccept, SharedRef};
use crate::guest::socket::{Kind, Phase};
use crate::guest::state::Guest;
use canal_abi::fast::{self, RECORDS, TICKETS};
use canal_abi::segment::{side, ArenaLayout};
use canal_abi::sock_flag;
use canal_abi::sync::Ordering;
use canal_abi::CanalAddr;
use std::collections::BTreeMap;

/// The destination and source a connect by ticket from host address `local` to
/// `dest` (what the guest's `named` destination translated to) would report, where
/// they are the names this CONNECT's pairing reports. None: not listed — an own
/// address of a network (its listener admits by the client's tie, which a ticket's
/// port has not), the resolver, or a name the view does not give back unchanged (a
/// guest reaching its own published port).
pub(crate) fn seen(
    view: &GuestView,
    named: &CanalAddr,
    dest: &Dest,
    local: &CanalAddr,
) -> Option<Seen> {
    if view.net.is_none() {
        return Some(Seen {
            dst: *named,
            src: None,
        });
    }
    if dest.own || is_resolver(named) {
        return None;
    }
    let dst = &dest.addr;
    let peer = translate_host_peer(view, dst, Some(local), false);
    let mut src = translate_host_local(view, local, Some(dst));
    src.port = 0;
    (peer == *named && src.family == named.family).then_some(Seen {
        dst: *named,
        src: Some(src),
    })
}

impl Shared {
    /// A CONNECT of guest `conn` to `dst` was paired with listener `l`: list it in the
    /// guest's table (if the guest has one) so the next connects go fast.
    pub(crate) fn fast_learn(&mut self, conn: u32, l: &ListenerReg, dst: &CanalAddr, seen: Seen) {
        if !self.fast_listable(l, dst) || seen.dst.family != dst.family {
            return;
        }
        self.fast.clock += 1;
        let stamp = self.fast.clock;
        let Some(book) = self.fast.books.get_mut(&conn) else {
            return;
        };
        let same =
            |r: &Rec| r.lconn == l.conn && r.lhandle == l.handle && r.dst == *dst && r.seen == seen;
        if let Some(r) = book.records.iter_mut().flatten().find(|r| same(r)) {
            r.stamp = stamp;
            self.fast.dirty = true;
            return;
        }
        // A free record, or the one used longest ago.
        let at = match book.records.iter().position(|r| r.is_none()) {
            Some(i) => i,
            None => (0..RECORDS)
                .min_by_key(|&i| book.records[i].map_or(0, |r| r.stamp))
                .unwrap_or(0),
        };
        self.fast_withdraw_record(conn, at);
        let Some(book) = self.fast.books.get_mut(&conn) else {
            return;
        };
        let table = book.region.fast_table();
        let rec = &table.records[at];
        let (odd, _) = rec.withdraw();
        rec.set_destination(&seen.dst);
        table.sources[at].set(seen.src.as_ref());
        rec.publish(odd, 0);
        book.records[at] = Some(Rec {
            lconn: l.conn,
            lhandle: l.handle,
            dst: *dst,
            seen,
            granted: [0; TICKETS],
            stamp,
        });
        self.fast.dirty = true;
    }

    /// Whether connects to `dst` reaching `l` can be prepared ahead: a loopback or
    /// specific destination of the listener's own family, whose guest has FAST
    /// tables too (the same library: packed arenas, marks).
    fn fast_listable(&self, l: &ListenerReg, dst: &CanalAddr) -> bool {
        self.enabled
            && self.use_arenas
            && !self.zones
            && l.addr.family == dst.family
            && !is_unspecified(dst)
            && self.fast.books.contains_key(&l.conn)
    }

    /// Gives every listed record tickets up to its share of its listener's room.
    pub(crate) fn fast_refill(&mut self) {
        if !std::mem::take(&mut self.fast.dirty) {
            return;
        }
        let conns: Vec<u32> = self.fast.books.keys().copied().collect();
        for conn in conns {
            for at in 0..RECORDS {
                while self.fast_grant(conn, at) {}
            }
        }
    }

    /// Grants one more ticket to record `at` of guest `conn`, if it lacks one and its
    /// listener has room. false: nothing granted.
    fn fast_grant(&mut self, conn: u32, at: usize) -> bool {
        let Some(rec) = self.fast.books.get(&conn).and_then(|b| b.records[at]) else {
            return false;
        };
        let held = self
            .fast
            .tickets
            .values()
            .filter(|t| t.conn == conn)
            .count();
        let free = rec.granted.iter().position(|&g| g == 0);
        let room = held < READY_PER_GUEST && self.fast.tickets.len() < READY_IN_ALL;
        let (Some(idx), true) = (free, room) else {
            return false;
        };
        let Some(l) = self.listener(rec.lconn, rec.lhandle).copied() else {
            return false;
        };
        if l.queued + l.fast_out >= l.backlog {
            return false;
        }
        let mut at_addr = rec.dst;
        at_addr.port = 0;
        let Some(hold) = PortHold::take(&at_addr) else {
            return false;
        };
        // The listener this connection would reach (an SO_REUSEPORT group picks by
        // the connection's addresses, the port included).
        let reached = self.find_listener(&rec.dst, &hold.local());
        if reached.is_none_or(|r| r.conn != l.conn || r.handle != l.handle) {
            return false;
        }
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1).max(1);
        let Some(mem) = arena_segment(
            self,
            id,
            (ArenaLayout::Packed, self.ring_size),
            [conn, l.conn],
        ) else {
            return false;
        };
        let SegMem::Arena {
            mem: ref arena,
            slot,
            base,
        } = mem
        else {
            return false;
        };
        let (arena_id, rings) = (
            arena.id,
            arena.layout.rings_offset(slot, self.ring_size) - base,
        );
        let fits = (
            u32::try_from(base),
            u32::try_from(rings),
            u32::try_from(self.ring_size),
        );
        self.segments
            .insert(id, segment_rec(mem, [conn, l.conn], self.ring_size));
        let (Ok(base32), Ok(rings32), Ok(rs32)) = fits else {
            self.drop_segment(id);
            return false;
        };
        let port = hold.local().port;
        self.fast.tickets.insert(
            id,
            Ticket {
                conn,
                place: Some((at, idx)),
                lconn: l.conn,
                lhandle: l.handle,
                dst: rec.dst,
                seen: rec.seen,
                hold,
            },
        );
        if let Some(lr) = self.listener_mut(l.conn, l.handle) {
            lr.fast_out += 1;
        }
        let Some(book) = self.fast.books.get_mut(&conn) else {
            return false;
        };
        if let Some(r) = book.records[at].as_mut() {
            r.granted[idx] = id;
        }
        let table_rec = &book.region.fast_table().records[at];
        let t = &table_rec.tickets[idx];
        t.arena.store(arena_id, Ordering::Relaxed);
        t.arena_offset.store(base32, Ordering::Relaxed);
        t.segment.store(id, Ordering::Relaxed);
        t.rings.store(rings32, Ordering::Relaxed);
        t.ring_size.store(rs32, Ordering::Relaxed);
        t.port.store(port as u32, Ordering::Relaxed);
        // A new sequence: a claimer that read the record before fails its CAS and
        // looks again (it never takes this ticket with an older reading).
        let (odd, ready) = table_rec.withdraw();
        table_rec.publish(odd, ready | 1 << idx);
        true
    }

    /// Guest `conn`'s mark names ticket `mark` of segment `segment`: the ticket, if
    /// canald granted exactly that and the guest claimed it (its ready bit is clear).
    /// None: a mark canald never granted (the caller resets the socket).
    pub(crate) fn fast_take(&mut self, conn: u32, segment: u32, mark: u32) -> Option<Ticket> {
        let t = self.fast.tickets.get(&segment)?;
        if t.conn != conn {
            return None;
        }
        if let Some((at, idx)) = t.place {
            if fast::unmark(mark) != Some((at, idx)) {
                return None;
            }
            let book = self.fast.books.get_mut(&conn)?;
            let s = book.region.fast_table().records[at]
                .state
                .load(Ordering::Acquire);
            if fast::valid(s) && fast::ready_of(s) & (1 << idx) != 0 {
                return None; // not claimed: the mark lies
            }
            if let Some(r) = book.records[at].as_mut() {
                r.granted[idx] = 0;
                self.fast.clock += 1;
                r.stamp = self.fast.clock;
            }
        }
        self.fast.dirty = true;
        self.fast.tickets.remove(&segment)
    }

    /// A marked ticket's connection was paired, or failed: it no longer holds a place
    /// in its listener's queue.
    pub(crate) fn fast_settled(&mut self, lconn: u32, lhandle: u32) {
        if let Some(l) = self.listener_mut(lconn, lhandle) {
            l.fast_out = l.fast_out.saturating_sub(1);
        }
        self.fast.dirty = true;
    }

    /// Tickets outstanding against listener (`lconn`, `lhandle`)'s backlog.
    pub(crate) fn fast_out(&self, lconn: u32, lhandle: u32) -> u32 {
        self.listener(lconn, lhandle).map_or(0, |l| l.fast_out)
    }

    /// Listener (`lconn`, `lhandle`)'s guest holds `queued` unaccepted connections.
    pub(crate) fn fast_queued(&mut self, lconn: u32, lhandle: u32, queued: u32) {
        if let Some(l) = self.listener_mut(lconn, lhandle) {
            let fewer = queued < l.queued;
            l.queued = queued;
            self.fast.dirty |= fewer;
        }
    }

    /// The listener goes: every record naming it, in every guest, is withdrawn.
    pub(crate) fn fast_withdraw_listener(&mut self, lconn: u32, lhandle: u32) {
        let mut found = Vec::new();
        for (&conn, book) in &self.fast.books {
            for (at, r) in book.records.iter().enumerate() {
                if r.is_some_and(|r| r.lconn == lconn && r.lhandle == lhandle) {
                    found.push((conn, at));
                }
            }
        }
        for (conn, at) in found {
            self.fast_withdraw_record(conn, at);
        }
    }

    /// Withdraws record `at` of guest `conn`: its ready tickets are taken back (slot
    /// and port freed), the claimed ones stay until their marks come (and reset).
    fn fast_withdraw_record(&mut self, conn: u32, at: usize) {
        let Some(book) = self.fast.books.get_mut(&conn) else {
            return;
        };
        let Some(rec) = book.records[at].take() else {
            return;
        };
        let (_, ready) = book.region.fast_table().records[at].withdraw();
        for (idx, &id) in rec.granted.iter().enumerate() {
            if id == 0 {
                continue;
            }
            if ready & (1 << idx) != 0 {
                self.fast_drop_ticket(id);
            } else if let Some(t) = self.fast.tickets.get_mut(&id) {
                t.place = None;
            }
        }
    }

    /// Takes ticket `id` back: its slot, port and place in the listener's queue.
    fn fast_drop_ticket(&mut self, id: u32) {
        if let Some(t) = self.fast.tickets.remove(&id) {
            self.fast_settled(t.lconn, t.lhandle);
            self.drop_segment(id);
        }
    }

    /// Guest `conn` left: its table and every ticket it held go.
    pub(crate) fn fast_forget(&mut self, conn: u32) {
        if self.fast.books.remove(&conn).is_none() {
            return;
        }
        let ids: Vec<u32> = self
            .fast
            .tickets
            .iter()
            .filter(|(_, t)| t.conn == conn)
            .map(|(&id, _)| id)
            .collect();
        for id in ids {
            self.fast_drop_ticket(id);
        }
    }
}

/// A segment record for an arena slot granted to connector `conns[0]`.
fn segment_rec(mem: SegMem, conns: [u32; 2], ring_size: u64) -> SegmentRec {
    SegmentRec {
        mem,
        conns,
        open: [true, true],
        ring_size,
        zone_size: 0,
    }
}

// ---- the connector's home and the listener's ----------------------------------------

impl Guest {
    /// A fast connect's mark on socket `index` (read before the socket's close mark,
    /// in the same service): the ticket it claimed becomes a pairing, as a CONNECT's
    /// would. A mark canald did not grant breaks the socket (its entry names a
    /// segment canald does not know for it).
    pub(crate) fn take_fast_mark(&mut self, ep: &crate::sys::Epoll, index: u32) {
        let e = self.entry(index);
        let mark = e.fast_ticket.load(Ordering::Acquire);
        if mark == 0 {
            return;
        }
        let segment = e.fast_segment.load(Ordering::Relaxed);
        e.fast_ticket.store(0, Ordering::Relaxed);
        e.fast_segment.store(0, Ordering::Relaxed);
        let Some(sc) = self.sc.clone() else {
            return;
        };
        let ticket = lock(&sc).fast_take(self.conn, segment, mark);
        let fresh = self
            .sockets
            .get(index as usize)
            .and_then(|s| s.as_ref())
            .is_some_and(|s| {
                s.kind() == Kind::Stream
                && s.phase == Phase::Open
                && s.seg.is_none()
                && s.port.is_none()
                // A host socket only holds the program's options; a bound one has
                // its name, which a ticket's port would contradict.
                && s.fd
                    .as_ref()
                    .is_none_or(|fd| crate::sys::sockname(fd).is_ok_and(|a| a.port == 0))
            });
        let Some(t) = ticket else {
            log::warn!(
                "guest {}: a fast connect mark canald never granted",
                self.id
            );
            self.break_socket(ep, index);
            return;
        };
        if !fresh {
            {
                let mut sh = lock(&sc);
                sh.fast_settled(t.lconn, t.lhandle);
                sh.drop_segment(segment);
            }
            self.break_socket(ep, index);
            return;
        }
        let local = t.hold.local();
        let conn = self.conn;
        self.fast_connects += 1;
        let Some(Some(s)) = self.sockets.get_mut(index as usize) else {
            return;
        };
        s.port = Some(Box::new(t.hold));
        s.phase = Phase::Connecting;
        s.readable = false;
        s.writable = false;
        // The guest's entry says CONNECTED already; canald's copy follows without a
        // store (`sc_connected` then finds nothing to change).
        s.flags = (s.flags | sock_flag::CONNECTED) & !sock_flag::CONNECTING;
        let handle = s.handle;
        lock(&sc).post_from(
            conn,
            Job::Pair(Pending {
                conn,
                handle,
                dst: t.dst,
                local,
                zones: false,
                arenas: Some(ArenaLayout::Packed),
                lconn: t.lconn,
                lhandle: t.lhandle,
                fast: segment,
                settled: false,
                seen: Some(t.seen),
            }),
        );
    }

    /// Whether socket `index` made a fast connect that is being paired: its entry
    /// says CONNECTED, canald's pairing is under way (a CONNECT's socket in that
    /// phase has no CONNECTED).
    fn fast_pending(&self, index: u32) -> bool {
        self.sockets
            .get(index as usize)
            .and_then(|s| s.as_ref())
            .is_some_and(|s| s.phase == Phase::Connecting && s.flags & sock_flag::CONNECTED != 0)
    }

    /// A request naming a socket reads its fast connect's mark first; one on a socket
    /// whose fast connect is still being paired waits for the pairing (true: kept in
    /// `fast_waiting`), so a shutdown or an option reaches the connection, as it
    /// would after a connect that returned.
    pub(crate) fn fast_defer(
        &mut self,
        ep: &crate::sys::Epoll,
        slot: u32,
        req: &crate::request::Request,
    ) -> bool {
        let fast = self.region.header().features & canal_abi::feature::FAST_CONNECT != 0;
        if !fast || self.sc.is_none() || !crate::request::needs_handle(req.op) {
            return false;
        }
        let Ok(index) = self.lookup(req.socket) else {
            return false;
        };
        self.take_fast_mark(ep, index);
        if !self.fast_pending(index) {
            return false;
        }
        self.fast_waiting.push((slot, req.clone()));
        true
    }

    /// Runs the requests that waited for their sockets' pairings, where those are
    /// done (a pairing retried for a full accept queue keeps its requests waiting).
    pub(crate) fn run_fast_waiting(&mut self, ep: &crate::sys::Epoll) {
        let waiting = std::mem::take(&mut self.fast_waiting);
        for (slot, req) in waiting {
            let still = self
                .lookup(req.socket)
                .is_ok_and(|index| self.fast_pending(index));
            if still {
                self.fast_waiting.push((slot, req));
            } else {
                self.run_request(ep, slot, &req);
            }
        }
        if !self.held_answers.is_empty() {
            self.answer_held();
        }
    }

    /// Listener `index`'s queue as canald now counts it, for the fast connect room.
    pub(crate) fn note_queued(&self, index: u32) {
        let (Some(sc), Some(Some(l))) = (self.sc.as_ref(), self.sockets.get(index as usize)) else {
            return;
        };
        let n = l.accepts().map_or(0, |q| q.unclaimed.len() as u32);
        lock(sc).fast_queued(self.conn, l.handle, n);
    }
}

/// The listener's half of a fast connect (`Guest::take_fast_mark` posted it): the
/// segment came with the ticket; the accepted end is installed as for a CONNECT, and
/// the connector's entry, complete already, is confirmed. A listener gone since the
/// ticket was claimed resets the connection (natively, a connect racing the close).
/// Some(p): retry later (the accept queue is full).
pub(crate) fn pair_fast(
    shared: &SharedRef,
    me: u32,
    guests: &mut BTreeMap<u32, Guest>,
    mut p: Pending,
) -> Option<Pending> {
    let id = p.fast;
    let listener = {
        let mut sh = lock(shared);
        if !p.settled {
            sh.fast_settled(p.lconn, p.lhandle);
            p.settled = true;
        }
        sh.listener(p.lconn, p.lhandle).copied()
    };
    let dst = p.dst;
    let accepted = match (listener, guests.get_mut(&p.lconn)) {
        (Some(l), Some(g)) => {
            let link = acceptor_link(id, &p, &dst, Some(l.addr.family));
            let away = || ScAccept {
                shared: shared.clone(),
                p,
                id,
                dst,
                link,
            };
            match g.sc_accept(p.lhandle, l.backlog, link, away) {
                Ok(Accepted::Now(h)) => Some(h),
                Ok(Accepted::Full) => return Some(p),
                Ok(Accepted::Forwarded) | Err(()) => None,
            }
        }
        _ => None,
    };
    let mut sh = lock(shared);
    sh.post(
        me,
        Job::Connected {
            conn: p.conn,
            handle: p.handle,
            link: connector_link(id, &p, &dst, accepted.unwrap_or(0)),
        },
    );
    if accepted.is_none() {
        sh.post(
            me,
            Job::Event(Event::Closed {
                id,
                side: side::ACCEPTOR,
                conn: p.conn,
                handle: p.handle,
                reset: true,
            }),
        );
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::guest::config::GuestConfig;
    use canal_abi::region::Layout;

    const X: u32 = 7;
    const Y: u32 = 8;

    fn guest(conn: u32) -> Guest {
        let layout = Layout::new(4, 8, 1 << 20).unwrap();
        let cfg = GuestConfig::with_layout(layout, 1 << 16);
        Guest::new(conn, conn, 0, "fast".into(), cfg).unwrap().0
    }

    fn listener(backlog: u32) -> (ListenerReg, CanalAddr) {
        let dst = CanalAddr::v4([127, 0, 0, 1], 40123);
        let reg = ListenerReg {
            conn: Y,
            handle: 0x10001,
            addr: dst,
            backlog,
            dual_stack: false,
            queued: 0,
            fast_out: 0,
        };
        (reg, dst)
    }

    /// X's table with one record for Y's listener of `backlog` (Linux's + 1).
    fn setup(x: &Guest, y: &Guest, backlog: u32) -> (SharedRef, CanalAddr) {
        let sc = Shared::new(true, 1 << 16);
        let (reg, dst) = listener(backlog);
        {
            let mut sh = lock(&sc);
            sh.fast.register(X, x.region);
            sh.fast.register(Y, y.region);
            sh.listen(reg);
            let seen = Seen { dst, src: None };
            sh.fast_learn(X, &reg, &dst, seen);
            sh.fast_refill();
        }
        (sc, dst)
    }

    fn ready(x: &Guest) -> u32 {
        fast::ready_of(
            x.region.fast_table().records[0]
                .state
                .load(Ordering::Acquire),
        )
    }

    fn claim(x: &Guest, dst: &CanalAddr) -> (usize, u32) {
        let rec = &x.region.fast_table().records[0];
        rec.claim(
            |r| r.destination() == *dst,
            |t| t.segment.load(Ordering::Relaxed),
        )
        .expect("a ticket")
    }

    #[test]
    fn tickets_hold_places_in_the_listeners_queue() {
        let (x, y) = (guest(X), guest(Y));
        // listen(1): two places; both go to tickets, none more.
        let (sc, dst) = setup(&x, &y, 2);
        assert_eq!(ready(&x).count_ones(), 2);
        assert_eq!(lock(&sc).fast_out(Y, 0x10001), 2);
        // A connection queued meanwhile leaves no room for a new ticket.
        let (i, seg) = claim(&x, &dst);
        let t = lock(&sc)
            .fast_take(X, seg, fast::mark(0, i))
            .expect("granted");
        assert_eq!((t.lconn, t.lhandle), (Y, 0x10001));
        {
            let mut sh = lock(&sc);
            sh.fast_settled(Y, 0x10001);
            sh.fast_queued(Y, 0x10001, 1);
            sh.fast_refill();
        }
        assert_eq!(ready(&x).count_ones(), 1, "one place queued, one ticket");
        // The program accepted: the place comes back as a ticket.
        {
            let mut sh = lock(&sc);
            sh.fast_queued(Y, 0x10001, 0);
            sh.fast_refill();
        }
        assert_eq!(ready(&x).count_ones(), 2);
    }

    #[test]
    fn marks_canald_did_not_grant_are_refused() {
        let (x, y) = (guest(X), guest(Y));
        let (sc, dst) = setup(&x, &y, 10);
        assert_eq!(ready(&x), 0b1111, "four tickets");
        let rec = &x.region.fast_table().records[0];
        let seg0 = rec.tickets[0].segment.load(Ordering::Relaxed);
        let mut sh = lock(&sc);
        // Not claimed (its ready bit is set): a guest naming it lies.
        assert!(sh.fast_take(X, seg0, fast::mark(0, 0)).is_none());
        drop(sh);
        let (i, seg) = claim(&x, &dst);
        let mut sh = lock(&sc);
        assert!(
            sh.fast_take(Y, seg, fast::mark(0, i)).is_none(),
            "another guest's"
        );
        assert!(
            sh.fast_take(X, seg, fast::mark(0, i + 1)).is_none(),
            "another place"
        );
        assert!(sh.fast_take(X, seg, 0).is_none(), "no mark");
        assert!(
            sh.fast_take(X, 999_999, fast::mark(0, i)).is_none(),
            "no such segment"
        );
        assert!(sh.fast_take(X, seg, fast::mark(0, i)).is_some());
        assert!(
            sh.fast_take(X, seg, fast::mark(0, i)).is_none(),
            "a mark counts once"
        );
    }

    #[test]
    fn a_closed_listener_is_withdrawn_and_its_claimed_tickets_still_answer() {
        let (x, y) = (guest(X), guest(Y));
        let (sc, dst) = setup(&x, &y, 10);
        let (i, seg) = claim(&x, &dst);
        lock(&sc).unlisten(Y, 0x10001);
        let s = x.region.fast_table().records[0]
            .state
            .load(Ordering::Acquire);
        assert!(!fast::valid(s), "withdrawn");
        assert!(x.region.fast_table().records[0]
            .claim(|_| true, |_| ())
            .is_none());
        let mut sh = lock(&sc);
        assert_eq!(sh.fast.tickets.len(), 1, "the three unclaimed went back");
        // The claimed one's mark is still canald's to read (the pairing then finds no
        // listener and resets the connection).
        let t = sh
            .fast_take(X, seg, fast::mark(0, i))
            .expect("claimed before the close");
        assert_eq!(t.lconn, Y);
        assert!(
            sh.segments.contains_key(&seg),
            "its segment stays for the reset"
        );
    }

    #[test]
    fn a_view_lists_only_names_it_gives_back() {
        use crate::guest::netview::{NetView, Publish};
        let v4 = CanalAddr::v4;
        let host = v4([127, 0, 0, 1], 18080);
        let from = v4([127, 0, 0, 1], 40001);
        let plain = GuestView {
            loopback_only: false,
            net: None,
            policy: Default::default(),
        };
        let to = |addr, own| Dest { addr, own };
        let plain_seen = seen(&plain, &host, &to(host, false), &from);
        assert_eq!(
            plain_seen,
            Some(Seen {
                dst: host,
                src: None
            })
        );
        let view = GuestView {
            net: Some(std::sync::Arc::new(NetView::new(
                "isolated:t".into(),
                [127, 100, 0, 7],
                vec![Publish::tcp_loopback(18081, 80)],
                Some(v4([127, 0, 0, 1], 5353)),
                None,
            ))),
            ..plain
        };
        let named = v4([10, 0, 2, 2], 18080);
        let want = Seen {
            dst: named,
            src: Some(v4([10, 0, 2, 15], 0)),
        };
        assert_eq!(seen(&view, &named, &to(host, false), &from), Some(want));
        // Its own address, the resolver, its own published port (which reads back as
        // 127.0.0.1:80, not the 10.0.2.2:18081 it named): never listed.
        let own = v4([127, 0, 0, 1], 80);
        assert_eq!(
            seen(&view, &own, &to(v4([127, 100, 0, 7], 80), true), &from),
            None
        );
        let dns = v4([10, 0, 2, 3], 53);
        assert_eq!(
            seen(&view, &dns, &to(v4([127, 0, 0, 1], 5353), false), &from),
            None
        );
        let mine = v4([10, 0, 2, 2], 18081);
        assert_eq!(
            seen(&view, &mine, &to(v4([127, 0, 0, 1], 18081), false), &from),
            None
        );
    }

    #[test]
    fn tickets_over_all_guests_stay_within_the_cap() {
        let (x, y) = (guest(X), guest(Y));
        let (sc, dst) = setup(&x, &y, 10);
        let (i, seg) = claim(&x, &dst);
        let mut sh = lock(&sc);
        assert!(sh.fast_take(X, seg, fast::mark(0, i)).is_some());
        // Other guests hold the rest of the cap (as if granted to them).
        for id in 0..(READY_IN_ALL - sh.fast.tickets.len()) as u32 {
            let hold = PortHold::take(&CanalAddr::v4([127, 0, 0, 1], 0)).unwrap();
            let t = Ticket {
                conn: 99,
                place: None,
                lconn: Y,
                lhandle: 1,
                dst,
                seen: Seen { dst, src: None },
                hold,
            };
            sh.fast.tickets.insert(1_000_000 + id, t);
        }
        sh.fast.dirty = true;
        sh.fast_refill();
        drop(sh);
        assert_eq!(ready(&x).count_ones(), 3, "no ticket past the cap");
    }

    #[test]
    fn a_guest_that_leaves_gives_every_ticket_back() {
        let (x, y) = (guest(X), guest(Y));
        let (sc, dst) = setup(&x, &y, 10);
        let _claimed = claim(&x, &dst);
        let mut sh = lock(&sc);
        assert_eq!(sh.fast.tickets.len(), 4);
        let segments = sh.segments.len();
        sh.fast_forget(X);
        assert!(sh.fast.tickets.is_empty());
        assert_eq!(sh.segments.len(), segments - 4);
        assert_eq!(sh.fast_out(Y, 0x10001), 0);
    }
}
