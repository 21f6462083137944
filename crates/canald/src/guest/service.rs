//! One service round: requests from the queue, their dispatch (`execute`), socket
//! events, and the sockets marked dirty.
use crate::guest::netops::is_v6only;
use crate::guest::socket::decode_linger;
use crate::guest::socket::encode_linger;
use crate::guest::socket::is_linger;
use crate::guest::socket::is_rcvlowat;
use crate::guest::socket::token;
use crate::guest::socket::Kind;
use crate::guest::socket::KindState;
use crate::guest::socket::Phase;
use crate::guest::state::Guest;
use crate::guest::wake::RoundStats;
use crate::quota::Hit;
use crate::request;
use crate::request::Cmd;
use crate::request::Request;
use crate::sys;
use crate::sys::Epoll;
use canal_abi::canal_opt;
use canal_abi::errno;
use canal_abi::op;
use canal_abi::sleep_kind;
use canal_abi::slot_state;
use canal_abi::sock_flag;
use canal_abi::sync::fence;
use canal_abi::sync::Ordering;
use canal_abi::SLOT_PAYLOAD;
use std::time::Instant;

impl Guest {
    /// An epoll event for one of this guest's host sockets.
    pub(crate) fn socket_event(&mut self, tok: u64, events: u32) {
        let index = token::index(tok) as u32;
        let Some(Some(s)) = self.sockets.get_mut(index as usize) else {
            return;
        };
        if s.generation() != token::gen(tok) {
            return; // a stale event for a previous socket on this index
        }
        if events & (sys::EP_IN | sys::EP_HUP | sys::EP_ERR | sys::EP_RDHUP) != 0 {
            s.readable = true;
        }
        if events & (sys::EP_OUT | sys::EP_HUP | sys::EP_ERR) != 0 {
            s.writable = true;
        }
        if events & (sys::EP_RDHUP | sys::EP_HUP) != 0 {
            s.rdhup = true;
        }
        if events & sys::EP_PRI != 0 {
            s.urgent = true;
            s.readable = true;
        }
        self.mark_dirty(index);
    }

    /// Whether this guest has published work the host has not picked up yet (the
    /// re-check before sleeping, protocol §6).
    pub(crate) fn has_pending(&self) -> bool {
        let r = &self.region;
        // A shadow (virtual RSS) never pops the queue: requests are its home's; a
        // throttled guest's queue waits for its deadline (`next_deadline`).
        let throttled = self.rates.until.is_some() && self.rates.throttled();
        (!self.is_shadow()
            && !throttled
            && (self.queue.has_next(r.queue_cells()) || !self.rates.held.is_empty()))
            || r.attention()[..self.owned_words]
                .iter()
                .zip(&self.owned)
                .any(|(w, m)| w.load(Ordering::Relaxed) & m != 0)
            || !self.dirty.is_empty()
            || !self.wake.deferred.is_empty()
    }

    /// One service round: requests (bounded), attention bits, dirty sockets, then the
    /// wake-ups of sleepers whose sockets changed.
    pub(crate) fn service_round(&mut self, ep: &Epoll, now: Instant) -> RoundStats {
        let mut st = self.service_requests(ep, now);
        let d = self.service_data(ep, now);
        st.sockets += d.sockets;
        st.bytes += d.bytes;
        st
    }

    /// The command class of a round: up to `budget` requests (a short slice).
    pub(crate) fn service_requests(&mut self, ep: &Epoll, now: Instant) -> RoundStats {
        let mut st = RoundStats::default();
        self.wake.begin_round(now);
        if self.gone.is_none() {
            self.serve_requests(ep, &mut st, now);
            self.refill_spares(ep);
        }
        if st.did_work() {
            self.last_active = Some(now);
        }
        st
    }

    /// The data classes of a round: attention bits, then each dirty socket's receive
    /// work, then its transmit work, within this guest's byte deficits; then the
    /// wake-ups of sleepers whose sockets changed (coalesced per `wake_window`).
    pub(crate) fn service_data(&mut self, ep: &Epoll, now: Instant) -> RoundStats {
        let mut st = RoundStats::default();
        self.wake.begin_round(now);
        if self.gone.is_none() {
            self.serve_attention();
        }
        // DRR: a backlogged guest earns one quantum per round (at most two banked); an
        // idle one starts from one quantum.
        let (rq, tq) = (self.cfg.rx_quantum as i64, self.cfg.tx_quantum as i64);
        if self.dirty.is_empty() {
            self.rx_deficit = rq;
            self.tx_deficit = tq;
        } else {
            self.rx_deficit = (self.rx_deficit.max(0) + rq).min(2 * rq);
            self.tx_deficit = (self.tx_deficit.max(0) + tq).min(2 * tq);
        }
        self.service_dirty(ep, now, &mut st);
        self.expire_closing(ep, now);
        self.wake_event_sleepers();
        self.flush_deferred_wakes(now);
        if st.did_work() {
            self.last_active = Some(now);
        }
        st
    }

    pub(crate) fn serve_requests(&mut self, ep: &Epoll, st: &mut RoundStats, now: Instant) {
        let region = self.region;
        let cells = region.queue_cells();
        self.rates.until = None;
        self.run_held_connects(ep, now, st);
        for _ in 0..self.cfg.budget {
            // The request rate: what is queued waits for a token (protocol unchanged:
            // the guest's thread waits for its slot as for a slow host).
            if let Some(b) = &mut self.rates.requests {
                if let Err(wait) = b.ready(now) {
                    if self.queue.has_next(cells) {
                        self.cfg.policy.hit(Hit::RequestRate);
                        self.rates.wait_until(now + wait);
                    }
                    break;
                }
            }
            let Some(idx) = self.queue.pop(cells) else {
                break;
            };
            st.requests += 1;
            if let Some(b) = &mut self.rates.requests {
                let _ = b.take(now);
            }
            let Some(slot) = region.slot(idx) else {
                continue; // garbage index: ignore
            };
            if slot
                .state
                .compare_exchange(
                    slot_state::REQUESTED,
                    slot_state::BUSY,
                    Ordering::Acquire,
                    Ordering::Relaxed,
                )
                .is_err()
            {
                continue; // not a request: ignore the entry
            }
            let req = Request::copy_from(slot);
            // The connection rate: a connect waits for a token, held in arrival order.
            if req.op == op::CONNECT {
                if let Some(b) = &mut self.rates.connect {
                    if let Err(wait) = b.take(now) {
                        self.cfg.policy.hit(Hit::ConnectRate);
                        self.rates.wait_until(now + wait);
                        self.rates.held.push_back((idx, req));
                        continue;
                    }
                }
            }
            if self.fast_defer(ep, idx, &req) {
                continue; // run once its socket's fast connect is paired
            }
            if self.forward(idx, &req) {
                continue; // the owning worker completes the slot
            }
            self.run_request(ep, idx, &req);
        }
    }

    /// Connects held for the connection rate, as far as tokens allow.
    fn run_held_connects(&mut self, ep: &Epoll, now: Instant, st: &mut RoundStats) {
        while !self.rates.held.is_empty() {
            if let Some(b) = &mut self.rates.connect {
                if let Err(wait) = b.take(now) {
                    self.rates.wait_until(now + wait);
                    return;
                }
            }
            let Some((idx, req)) = self.rates.held.pop_front() else {
                return;
            };
            st.requests += 1;
            if !self.forward(idx, &req) {
                self.run_request(ep, idx, &req);
            }
        }
    }

    /// Executes a request taken from slot `idx` and completes the slot (DONE, then
    /// the §6 wake-up of its thread if it sleeps).
    pub(crate) fn run_request(&mut self, ep: &Epoll, idx: u32, req: &Request) {
        if self.region.slot(idx).is_none() {
            return;
        }
        let mut out = [0u8; SLOT_PAYLOAD];
        let (result, out_len) = match self.execute(ep, req, &mut out) {
            Ok(v) => v,
            Err(e) => (-(e as i64), 0),
        };
        self.served += 1;
        if result < 0 && ![errno::EAGAIN, errno::EINPROGRESS].contains(&(-result as i32)) {
            self.failed += 1;
        }
        if std::mem::take(&mut self.hold_answer) {
            self.held_answers.push((idx, req.seq, result, req.socket));
            return;
        }
        self.answer(idx, req.seq, result, &out[..out_len.min(SLOT_PAYLOAD)]);
    }

    /// Answers the requests held for this round's pairings (`held_answers`); called
    /// by the worker after the short-circuit jobs ran, before it can sleep.
    pub(crate) fn answer_held(&mut self) {
        let view = self.view();
        for (idx, seq, result, handle) in std::mem::take(&mut self.held_answers) {
            // Paired by now, usually: the connector's names go with the answer.
            let names = self
                .lookup(handle)
                .ok()
                .and_then(|i| self.final_names(&view, i))
                .map(|(l, p)| canal_abi::names::encode(&l, &p));
            self.answer(idx, seq, result, names.as_ref().map_or(&[][..], |n| &n[..]));
        }
    }

    /// Completes slot `idx` (DONE, then the §6 wake-up of its thread if it sleeps).
    fn answer(&mut self, idx: u32, seq: u32, result: i64, payload: &[u8]) {
        let region = self.region;
        let Some(slot) = region.slot(idx) else {
            return;
        };
        if !payload.is_empty() {
            slot.write_payload(0, payload);
        }
        slot.out_len.store(payload.len() as u32, Ordering::Relaxed);
        slot.result.store(result, Ordering::Relaxed);
        slot.done_seq.store(seq, Ordering::Relaxed);
        // Publishes result/payload; pairs with the guest's Acquire load of DONE.
        slot.state.store(slot_state::DONE, Ordering::Release);
        // §6 wake: the guest stores `sleep`, fences, re-checks `state`; we store
        // `state`, fence, read `sleep` — one of us sees the other.
        fence(Ordering::SeqCst);
        if slot.sleep.load(Ordering::Relaxed) != sleep_kind::AWAKE {
            self.wake_slot(idx);
        }
    }

    /// Executes a request copy. Ok((result, out_len)); Err(errno).
    pub(crate) fn execute(
        &mut self,
        ep: &Epoll,
        req: &Request,
        out: &mut [u8; SLOT_PAYLOAD],
    ) -> Result<(i64, usize), i32> {
        if req.op == 0 || req.op > op::MAX {
            return Err(errno::ENOSYS);
        }
        let index = if request::needs_handle(req.op) {
            Some(self.lookup(req.socket)?)
        } else {
            None
        };
        let cmd = request::decode(req)?;
        // A socket handed over to the guest (HOST_SOCKET) is the kernel's: only its
        // close is canald's. Any other call fails, and the library follows the socket
        // to the kernel and makes the call there (libcanal `handoff.rs`).
        if let Some(i) = index.filter(|_| !matches!(cmd, Cmd::Close)) {
            let handed = matches!(self.sockets.get(i as usize),
                Some(Some(s)) if s.flags & sock_flag::HANDED_OVER != 0);
            if handed {
                return Err(errno::EBADF);
            }
        }
        let Some(index) = index else {
            return match cmd {
                Cmd::Socket {
                    domain,
                    ty,
                    protocol,
                } => self
                    .op_socket(ep, domain, ty, protocol)
                    .map(|h| (h as i64, 0)),
                _ => Ok((0, 0)),
            };
        };
        // What a datagram socket's program sent before this call leaves first, under
        // the settings, peer and name it was sent with (an option, a connect, UDP_CORK's
        // push, getsockname after an autobinding sendto), as in the kernel, where the
        // send was done before the call began.
        self.drain_dgram_tx(index);
        // A spare is made without a host socket (`HostSocket::made_fd`): every call
        // needs it but a close and a connect, which may be short-circuited.
        if !matches!(cmd, Cmd::Close | Cmd::Connect(_)) {
            if let Some(s) = self
                .sockets
                .get_mut(index as usize)
                .and_then(|s| s.as_mut())
            {
                if s.unmade() {
                    s.made_fd()?;
                }
            }
        }
        let view = self.view();
        match cmd {
            Cmd::Bind(a) => {
                self.op_bind(&view, index, &a)?;
                self.dl_register(index, None);
                // A datagram socket's local address is known: its owner serves it.
                self.place(ep, index, None);
                Ok((0, 0))
            }
            Cmd::Listen(backlog) => {
                let r = self.op_listen(ep, index, backlog);
                if r.is_ok() {
                    // Listeners spread by their local address (virtual RSS).
                    self.place(ep, index, None);
                }
                r
            }
            Cmd::Connect(named) => {
                let dest = self.connect_dest(&view, index, &named)?;
                let a = dest.addr;
                if let Some(r) = self.sc_try_connect(&view, index, &named, &dest) {
                    // Held: `answer_held` adds the names once the pair exists (asking
                    // the host socket now costs two system calls for nothing).
                    return r;
                }
                let (r, peer) = match self.op_connect(ep, index, &a) {
                    Ok((v, peer)) => (Ok((v, 0)), peer),
                    Err(e) => (Err(e), None),
                };
                if r.is_ok() {
                    self.dl_register(index, Some(Some(a)));
                    // The flow is known: its owner serves it from now on.
                    self.place(ep, index, Some(&a));
                }
                self.answer_names(&view, index, r, peer, out)
            }
            Cmd::Disconnect => {
                let r = self.op_disconnect(index);
                self.dl_register(index, Some(None));
                r
            }
            Cmd::Close => {
                self.op_close(index);
                // Nothing left to send (a listener, an idle connection): free it now,
                // so the port is released before the reply, as a native close does (a
                // bind to it may be the guest's very next request, in this round).
                self.finish_if_closed(ep, index, Instant::now());
                Ok((0, 0))
            }
            Cmd::Shutdown(how) => self.op_shutdown(ep, index, how),
            Cmd::SetOpt { level, name, value } if is_v6only(&view, level, name) => {
                self.set_view_v6only(index, &value).map(|()| (0, 0))
            }
            Cmd::GetOpt { level, name, len } if is_v6only(&view, level, name) => {
                let v = self.view_v6only(index)?.to_ne_bytes();
                let n = len.min(v.len());
                out[..n].copy_from_slice(&v[..n]);
                Ok((0, n))
            }
            Cmd::SetOpt { level, name, value } if is_linger(level, name) => {
                let l = decode_linger(&value)?;
                let s = self.live(index)?;
                s.linger = l;
                if s.flags & sock_flag::NATIVE_ACCEPT != 0 {
                    // The program's own connections inherit it (`put_program_linger`).
                    if let Some(fd) = s.fd.as_ref() {
                        crate::guest::socket::put_program_linger(fd, l);
                    }
                }
                Ok((0, 0))
            }
            Cmd::GetOpt { level, name, len } if is_linger(level, name) => {
                let l = self.live(index)?.linger;
                let v = encode_linger(l);
                let n = len.min(v.len());
                out[..n].copy_from_slice(&v[..n]);
                Ok((0, n))
            }
            Cmd::SetOpt { level, name, value }
                if is_rcvlowat(level, name)
                    && !matches!(self.live(index)?.state, KindState::Dgram(_)) =>
            {
                self.set_stream_rcvlowat(index, &value, out)
            }
            Cmd::SetOpt { level, name, value } => {
                let s = self.live(index)?;
                let dgram = matches!(s.state, KindState::Dgram(_));
                crate::sockopt::check_set(s.family, dgram, level, name, &value)?;
                sys::setsockopt_bytes(self.option_fd(index)?, level, name, &value)
                    .map_err(|e| sys::errno_of(&e))?;
                if dgram {
                    self.dl_option_set(index, level, name);
                }
                Ok((0, 0))
            }
            Cmd::GetOpt { level, name, len } if level == canal_opt::LEVEL => {
                let v = self.send_queue(index, name)?.to_ne_bytes();
                let n = len.min(v.len());
                out[..n].copy_from_slice(&v[..n]);
                Ok((0, n))
            }
            Cmd::GetOpt { level, name, len } => {
                if let Some(r) = self.sc_tcp_info(index, level, name, &mut out[..len]) {
                    return r;
                }
                let s = self.live(index)?;
                let dgram = matches!(s.state, KindState::Dgram(_));
                crate::sockopt::check_get(s.family, dgram, level, name)?;
                let n = sys::getsockopt_bytes(self.option_fd(index)?, level, name, &mut out[..len])
                    .map_err(|e| sys::errno_of(&e))?;
                Ok((0, n))
            }
            Cmd::SockName | Cmd::PeerName => self.op_name(&view, index, cmd == Cmd::PeerName, out),
            Cmd::Socket { .. } | Cmd::Nop => Ok((0, 0)),
        }
    }

    /// Listeners that stopped accepting for lack of entries or rings look again (an
    /// entry was freed). Their NO_ENTRY goes at once, before the answer to the CLOSE
    /// that freed it: a program that closes a connection and accepts gets the next
    /// client, as natively, not EMFILE; a listener that finds the table full again
    /// sets it again.
    pub(crate) fn rearm_listeners(&mut self) {
        if !std::mem::take(&mut self.listeners_stalled) {
            return;
        }
        for i in 0..self.sockets.len() as u32 {
            let Some(Some(l)) = self.sockets.get(i as usize) else {
                continue;
            };
            if l.kind() == Kind::Listener && l.readable {
                self.set_flags(i, 0, sock_flag::NO_ENTRY);
                self.mark_dirty(i);
            }
        }
    }

    pub(crate) fn expire_closing(&mut self, ep: &Epoll, now: Instant) {
        if self.earliest_close.is_none_or(|d| d > now) {
            return;
        }
        let mut next: Option<Instant> = None;
        for i in 0..self.sockets.len() {
            let Some(d) = self.sockets[i].as_ref().and_then(|s| s.closing) else {
                continue;
            };
            if d <= now {
                self.free_socket(ep, i as u32);
            } else {
                next = Some(next.map_or(d, |n| n.min(d)));
            }
        }
        self.earliest_close = next;
    }

    // ---- data path ------------------------------------------------------------

    pub(crate) fn service_dirty(&mut self, ep: &Epoll, now: Instant, st: &mut RoundStats) {
        let list = std::mem::take(&mut self.dirty);
        for (k, &index) in list.iter().enumerate() {
            if self.gone.is_none() && (self.rx_deficit <= 0 || self.tx_deficit <= 0) {
                // Out of budget: the rest stays dirty for the next round, in order.
                self.dirty.extend_from_slice(&list[k..]);
                break;
            }
            let Some(Some(s)) = self.sockets.get_mut(index as usize) else {
                continue;
            };
            s.dirty = false;
            self.out_of_budget = false;
            st.sockets += 1;
            self.take_fast_mark(ep, index);
            self.take_close_mark(index);
            let Some(Some(s)) = self.sockets.get(index as usize) else {
                continue;
            };
            if s.seg.is_some() {
                self.sc_service(index);
                self.finish_if_closed(ep, index, now);
                continue;
            }
            let r = match s.kind() {
                Kind::Stream => self.service_stream(index, st),
                Kind::Dgram => self.service_dgram(index, st),
                Kind::Listener => self.service_listener(ep, index),
            };
            if r.is_err() {
                self.break_socket(ep, index);
            } else if self.out_of_budget {
                self.mark_dirty(index);
            }
            self.finish_if_closed(ep, index, now);
            self.place_if_autobound(ep, index);
        }
        // Keep the allocation for the next round.
        let mut list = list;
        list.clear();
        if self.dirty.is_empty() {
            self.dirty = list;
        }
    }

    /// A socket whose entry carries its own handle as the close mark (feature
    /// CLOSE_MARK, protocol §4 Close): the guest's last descriptor of it is gone and
    /// no WATCH backs it, so it closes as by CLOSE. The mark names one generation, so
    /// a stale one (the entry's previous socket) closes nothing; a guest without the
    /// feature never writes the word (it was reserved, and zeroed with the entry).
    fn take_close_mark(&mut self, index: u32) {
        let Some(Some(s)) = self.sockets.get(index as usize) else {
            return;
        };
        let handle = canal_abi::make_handle(index, s.generation() as u32);
        let e = self.entry(index);
        if e.close_mark.load(Ordering::Acquire) == handle && !s.is_closing() {
            e.close_mark.store(0, Ordering::Relaxed);
            self.op_close(index);
        }
    }

    /// A closing socket whose tx ring drained (or that can send no more) is freed.
    pub(crate) fn finish_if_closed(&mut self, ep: &Epoll, index: u32, now: Instant) {
        let Some(Some(s)) = self.sockets.get(index as usize) else {
            return;
        };
        let Some(deadline) = s.closing else {
            return;
        };
        let can_send = s.kind() != Kind::Listener
            && s.fd.is_some()
            && s.phase == Phase::Connected
            && s.flags & sock_flag::TX_CLOSED == 0;
        // A corrupt index counts as "nothing more to send".
        let queued = if can_send {
            self.tx_avail(index).unwrap_or(0)
        } else {
            0
        };
        if queued == 0 || deadline <= now {
            self.free_socket(ep, index);
        }
    }
}
