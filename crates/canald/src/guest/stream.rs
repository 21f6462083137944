//! The stream pump: guest tx ring to the host socket, host socket to the rx ring.
use crate::guest::addr_view::translate_host_addr;
use crate::guest::config::DRAIN_STALL;
use crate::guest::config::MIN_RING;
use crate::guest::socket::accept_one;
use crate::guest::socket::AcceptQueue;
use crate::guest::socket::Accepted;
use crate::guest::socket::Corrupt;
use crate::guest::socket::Kind;
use crate::guest::socket::Phase;
use crate::guest::state::Guest;
use crate::guest::wake::RoundStats;
use crate::sys;
use crate::sys::Epoll;
use canal_abi::sock_flag;
use canal_abi::sync::fence;
use canal_abi::sync::Ordering;
use std::os::fd::AsRawFd;
use std::time::Instant;

impl Guest {
    /// Bytes the guest has queued on tx, checked: head - tail ≤ size and the guest's
    /// head never moves backwards.
    pub(crate) fn tx_avail(&mut self, index: u32) -> Result<u64, Corrupt> {
        let head = self.entry(index).tx_head.load(Ordering::Acquire); // R3
        let s = self.sockets[index as usize].as_mut().ok_or(Corrupt)?;
        let used = head.wrapping_sub(s.tx.idx);
        let before = s.tx.seen.wrapping_sub(s.tx.idx);
        if used > s.tx.size || used < before {
            return Err(Corrupt);
        }
        s.tx.seen = head;
        Ok(used)
    }

    /// Free rx space, checked: the guest's tail lies between its last value and our head.
    pub(crate) fn rx_free(&mut self, index: u32) -> Result<u64, Corrupt> {
        let tail = self.entry(index).rx_tail.load(Ordering::Acquire); // R1
        let s = self.sockets[index as usize].as_mut().ok_or(Corrupt)?;
        let adv = tail.wrapping_sub(s.rx.seen);
        let unread = s.rx.idx.wrapping_sub(s.rx.seen);
        if adv > unread {
            return Err(Corrupt);
        }
        s.rx.seen = tail;
        Ok(s.rx.size - s.rx.idx.wrapping_sub(tail))
    }

    pub(crate) fn publish_tx_tail(&mut self, index: u32, n: u64) {
        let s = self.sockets[index as usize].as_mut().expect("live socket");
        let old = s.tx.idx;
        let size = s.tx.size;
        s.tx.idx = s.tx.idx.wrapping_add(n);
        s.tx_bytes = s.tx_bytes.wrapping_add(n);
        if s.closing.is_some() && n > 0 {
            // A closed socket whose peer still takes bytes keeps draining.
            s.closing = Some(Instant::now() + DRAIN_STALL);
        }
        let t = s.tx.idx;
        // R4: our reads of the bytes are done before the guest may reuse the space.
        self.entry(index).tx_tail.store(t, Ordering::Release);
        // A drain changes a stream's readiness only if the guest may have found the
        // ring full (POLLOUT is "tx_free > 0"; a blocked send waits for exactly that):
        // the kernel's write-space wake-up likewise needs SOCK_NOSPACE. Otherwise it is
        // no event, so a thread sleeping for the reply is not woken by its own request
        // leaving (protocol §6). Same fence pairing as the sleep words: we store the
        // tail, fence, read the head; a guest that stores its head, fences and re-reads
        // the tail either sees our tail or we see its head at `old + size`.
        fence(Ordering::SeqCst);
        let head = self.entry(index).tx_head.load(Ordering::Relaxed);
        if head.wrapping_sub(old) >= size {
            self.mark_changed(index);
        }
    }

    pub(crate) fn publish_rx_head(&mut self, index: u32, new_head: u64, payload: u64) {
        let s = self.sockets[index as usize].as_mut().expect("live socket");
        s.rx.idx = new_head;
        s.rx_bytes = s.rx_bytes.wrapping_add(payload);
        // R2: the bytes are written before the guest sees the new head.
        self.entry(index).rx_head.store(new_head, Ordering::Release);
        self.mark_changed(index);
    }

    /// Discards whatever the guest queued on tx (after a reset or EPIPE).
    pub(crate) fn discard_tx(&mut self, index: u32) -> Result<(), Corrupt> {
        let n = self.tx_avail(index)?;
        if n > 0 {
            let s = self.sockets[index as usize].as_mut().ok_or(Corrupt)?;
            s.tx.idx = s.tx.idx.wrapping_add(n);
            let t = s.tx.idx;
            self.entry(index).tx_tail.store(t, Ordering::Release);
            self.mark_changed(index);
        }
        Ok(())
    }

    pub(crate) fn reset(&mut self, index: u32, err: i32) -> Result<(), Corrupt> {
        if let Some(s) = self.sockets[index as usize].as_mut() {
            s.phase = Phase::Failed;
            s.readable = false;
            s.writable = false;
        }
        self.set_error(
            index,
            err,
            sock_flag::RX_EOF | sock_flag::TX_CLOSED | sock_flag::HUP,
            sock_flag::RX_WANT_SPACE | sock_flag::CONNECTING,
        );
        self.discard_tx(index)
    }

    /// Applies to socket `index`'s host socket what changed in its guest's kept
    /// options (entry `options`, protocol §3.4) since canald last looked.
    pub(crate) fn sync_kept_options(&mut self, index: u32) {
        let word = self.entry(index).options.load(Ordering::Relaxed);
        let Some(s) = self
            .sockets
            .get_mut(index as usize)
            .and_then(|s| s.as_mut())
        else {
            return;
        };
        if word != s.applied_opts {
            if let Some(fd) = &s.fd {
                crate::sockopt::apply_kept(fd, s.applied_opts, word);
            }
            s.applied_opts = word;
        }
    }

    /// A host connect in progress after an event on its socket: CONNECTED, or the
    /// error, once the handshake ended. Whether the socket is past connecting.
    pub(crate) fn finish_connect(&mut self, index: u32) -> bool {
        let Some(s) = self
            .sockets
            .get_mut(index as usize)
            .and_then(|s| s.as_mut())
        else {
            return false;
        };
        if !s.writable && !s.readable {
            return false;
        }
        let Some(fd) = &s.fd else { return false };
        match sys::so_error(fd) {
            // No error yet: connected only if the peer name is known (a stale event
            // may arrive while the handshake is still under way).
            0 if sys::peername(fd).is_err() => {
                s.readable = false;
                s.writable = false;
                false
            }
            0 => {
                self.connect_done(index);
                true
            }
            e if e == libc::EINPROGRESS || e == libc::EALREADY => false,
            e => {
                self.connect_failed(index, e);
                true
            }
        }
    }

    /// A host connect in progress has failed with `e` (read from SO_ERROR, which
    /// reading cleared).
    pub(crate) fn connect_failed(&mut self, index: u32, e: i32) {
        if let Some(Some(s)) = self.sockets.get_mut(index as usize) {
            s.phase = Phase::Failed;
        }
        self.set_error(index, e, sock_flag::HUP, sock_flag::CONNECTING);
    }

    /// A host connect in progress has completed without error.
    pub(crate) fn connect_done(&mut self, index: u32) {
        if let Some(Some(s)) = self.sockets.get_mut(index as usize) {
            // The writable edge that completed the connect is consumed here; what
            // arrived before it is read on the next pass.
            s.phase = Phase::Connected;
            s.writable = true;
            s.readable = true;
        }
        self.set_flags(index, sock_flag::CONNECTED, sock_flag::CONNECTING);
    }

    pub(crate) fn service_stream(
        &mut self,
        index: u32,
        st: &mut RoundStats,
    ) -> Result<(), Corrupt> {
        // Options the guest's library set without a request reach the host socket
        // before this service moves the socket's bytes.
        self.sync_kept_options(index);
        let s = self.sockets[index as usize].as_mut().ok_or(Corrupt)?;
        if s.phase == Phase::Connecting && !self.finish_connect(index) {
            return Ok(());
        }
        let s = self.sockets[index as usize].as_mut().ok_or(Corrupt)?;
        if s.phase == Phase::Failed {
            return self.discard_tx(index);
        }
        if s.phase != Phase::Connected {
            return Ok(());
        }
        // Receive work first, then transmit work (the channel scheduler's classes).
        self.fill_stream_rx(index, st)?;
        self.flush_stream_tx(index, st)?;
        Ok(())
    }

    pub(crate) fn flush_stream_tx(
        &mut self,
        index: u32,
        st: &mut RoundStats,
    ) -> Result<(), Corrupt> {
        loop {
            let s = self.sockets[index as usize].as_ref().ok_or(Corrupt)?;
            if s.flags & sock_flag::TX_CLOSED != 0 {
                return self.discard_tx(index);
            }
            if !s.writable {
                return Ok(());
            }
            let queued = self.tx_avail(index)?;
            if queued > 0 && self.gone.is_none() && self.tx_deficit <= 0 {
                self.out_of_budget = true;
                return Ok(());
            }
            let avail = queued.min(self.call_limit(self.tx_deficit));
            let s = self.sockets[index as usize].as_mut().ok_or(Corrupt)?;
            if avail == 0 {
                if s.shut_wr_pending {
                    s.shut_wr_pending = false;
                    if let Some(fd) = &s.fd {
                        let _ = sys::shutdown(fd, libc::SHUT_WR);
                    }
                    self.set_flags(index, sock_flag::TX_CLOSED, 0);
                }
                return Ok(());
            }
            let ring = self.region.ring(s.tx.off, s.tx.size).ok_or(Corrupt)?;
            let Some(fd) = &s.fd else { return Ok(()) };
            match sys::writev_ring(fd, &ring, s.tx.idx, avail) {
                Ok(n) => {
                    st.bytes += n as u64;
                    self.tx_deficit -= n as i64;
                    self.publish_tx_tail(index, n as u64);
                    if (n as u64) < avail {
                        continue; // the next call tells EAGAIN or takes more
                    }
                    // Everything queued went out: look once more for new bytes.
                }
                Err(e) => match e.raw_os_error() {
                    Some(libc::EAGAIN) => s.writable = false,
                    Some(libc::EINTR) => {}
                    Some(libc::EPIPE) => {
                        self.set_flags(index, sock_flag::TX_CLOSED, 0);
                    }
                    Some(libc::ECONNRESET) => return self.reset(index, libc::ECONNRESET),
                    _ => return self.reset(index, sys::errno_of(&e)),
                },
            }
        }
    }

    pub(crate) fn fill_stream_rx(
        &mut self,
        index: u32,
        st: &mut RoundStats,
    ) -> Result<(), Corrupt> {
        loop {
            let s = self.sockets[index as usize].as_ref().ok_or(Corrupt)?;
            if !s.readable || s.flags & sock_flag::RX_EOF != 0 {
                return Ok(());
            }
            let free = self.want_rx_space(index, 1)?;
            if free == 0 {
                return Ok(());
            }
            if self.gone.is_none() && self.rx_deficit <= 0 {
                self.out_of_budget = true;
                return Ok(());
            }
            let limit = self.call_limit(self.rx_deficit);
            let free = free.min(limit);
            let s = self.sockets[index as usize].as_mut().ok_or(Corrupt)?;
            let ring = self.region.ring(s.rx.off, s.rx.size).ok_or(Corrupt)?;
            let Some(fd) = &s.fd else { return Ok(()) };
            match sys::readv_ring(fd, &ring, s.rx.idx, free) {
                Ok(0) => {
                    s.readable = false;
                    self.set_flags(index, sock_flag::RX_EOF, 0);
                    return Ok(());
                }
                Ok(n) => {
                    // A read cut short by our own limit says nothing about the queue.
                    let drained = (n as u64) < free && free < limit && !s.rdhup && !s.urgent;
                    if drained {
                        // epoll(7): a short read on a stream means the queue is empty;
                        // a new edge comes with new data (or the FIN, with RDHUP).
                        s.readable = false;
                    }
                    let head = s.rx.idx.wrapping_add(n as u64);
                    st.bytes += n as u64;
                    self.rx_deficit -= n as i64;
                    self.publish_rx_head(index, head, n as u64);
                }
                Err(e) => match e.raw_os_error() {
                    Some(libc::EAGAIN) => {
                        s.readable = false;
                        return Ok(());
                    }
                    Some(libc::EINTR) => {}
                    Some(libc::ECONNRESET) => return self.reset(index, libc::ECONNRESET),
                    _ => return self.reset(index, sys::errno_of(&e)),
                },
            }
        }
    }

    /// Largest byte count for one host call: the `--no-batch` chunk, and no more than
    /// the guest's remaining deficit (at least one byte: the caller checked > 0).
    pub(crate) fn call_limit(&self, deficit: i64) -> u64 {
        let d = if self.gone.is_some() {
            u64::MAX
        } else {
            deficit.max(1) as u64
        };
        self.cfg.chunk.min(d).max(1)
    }

    /// Free rx space, at least `need` bytes, or 0 after setting RX_WANT_SPACE (with the
    /// §6-style re-check, so a guest that freed space meanwhile is not missed).
    pub(crate) fn want_rx_space(&mut self, index: u32, need: u64) -> Result<u64, Corrupt> {
        let free = self.rx_free(index)?;
        let s = self.sockets[index as usize].as_ref().ok_or(Corrupt)?;
        if free >= need {
            if s.flags & sock_flag::RX_WANT_SPACE != 0 {
                self.set_flags(index, 0, sock_flag::RX_WANT_SPACE);
            }
            return Ok(free);
        }
        if s.flags & sock_flag::RX_WANT_SPACE == 0 {
            self.set_flags(index, sock_flag::RX_WANT_SPACE, 0);
        }
        // Dekker with the guest: we store the flag, fence, re-read its tail; the guest
        // stores its tail, fences, reads the flag (then raises attention).
        fence(Ordering::SeqCst);
        let free = self.rx_free(index)?;
        if free >= need {
            self.set_flags(index, 0, sock_flag::RX_WANT_SPACE);
            return Ok(free);
        }
        Ok(0)
    }

    pub(crate) fn service_listener(&mut self, ep: &Epoll, index: u32) -> Result<(), Corrupt> {
        // Set before listen, they are the listener's own (its accepted sockets inherit
        // them): on the host listener before it accepts.
        self.sync_kept_options(index);
        let Some(s) = self.sockets[index as usize].as_ref() else {
            return Ok(());
        };
        if s.flags & sock_flag::NATIVE_ACCEPT != 0 {
            if s.native_quiet && self.native_looks(index) {
                // The guest relies on NATIVE_QUEUED from now on: every arrival.
                let _ = self.watch_native(ep, index, false);
            }
            self.look_at_queue(index, sock_flag::NATIVE_QUEUED);
            return self.watch_claims(index);
        }
        if s.accepts().is_some_and(|q| !q.started) {
            // Before the program's first accept: the kernel's queue is the only one.
            self.look_at_queue(index, sock_flag::HOST_QUEUED);
            return self.watch_claims(index);
        }
        let r = if self.is_shadow() {
            self.accept_away(index) // the home allocates the entries
        } else {
            self.accept_here(ep, index)
        };
        self.look_after_accepts(index);
        let w = self.watch_claims(index);
        self.sync_host_backlog(index, 0);
        r.and(w)
    }

    /// How canald watches NATIVE_ACCEPT listener `index`'s host socket. `quiet`
    /// (feature NATIVE_QUIET, at LISTEN): for the next arrival only (EPOLLONESHOT),
    /// and not again — the guest's threads take native clients on their copies of the
    /// host listener, sleeping on them in accept() and poll(), so the kernel wakes
    /// them and a native client costs canald nothing. Unless the guest already relies
    /// on NATIVE_QUEUED (`guest_flag::NATIVE_LOOKS`: an epoll set holds the listener,
    /// whose edges come from canald's marks, or a process has no copy): then, as
    /// without the feature, every arrival. A re-arm finding clients queued reports
    /// them once at once, as adding a ready socket to an epoll set does.
    pub(crate) fn watch_native(&mut self, ep: &Epoll, index: u32, quiet: bool) -> Result<(), i32> {
        let quiet = quiet && !self.native_looks(index);
        let conn = self.conn;
        let s = self.live(index)?;
        let events = if quiet {
            sys::EP_HOST_SOCKET | sys::EP_ONESHOT
        } else {
            sys::EP_HOST_SOCKET
        };
        let tok = crate::guest::socket::token::make(
            crate::guest::socket::token::SOCKET,
            conn,
            s.generation(),
            index as u16,
        );
        let fd = s.fd.as_ref().ok_or(canal_abi::errno::EBADF)?;
        ep.modify(fd.as_raw_fd(), events, tok)
            .map_err(|e| crate::sys::errno_of(&e))?;
        s.native_quiet = quiet;
        Ok(())
    }

    /// Whether the guest relies on listener `index`'s NATIVE_QUEUED (its entry's
    /// `guest_flag::NATIVE_LOOKS`; the guest's word, so only a hint about its own
    /// listener).
    fn native_looks(&self, index: u32) -> bool {
        self.entry(index).guest_flags.load(Ordering::Relaxed) & canal_abi::guest_flag::NATIVE_LOOKS
            != 0
    }

    /// The guest raised listener `index`'s attention while HOST_QUEUED was set: an
    /// accept that found no record asks for a client the kernel holds. A listener not
    /// started starts: from now on canald accepts ahead for it.
    pub(crate) fn accept_asked(&mut self, index: u32) {
        let Some(Some(s)) = self.sockets.get_mut(index as usize) else {
            return;
        };
        if s.flags & sock_flag::HOST_QUEUED == 0 {
            return;
        }
        if let Some(q) = s.accepts_mut() {
            q.started = true;
            s.readable = true; // the flag says the kernel holds clients
        }
    }

    /// After canald's accepts (feature HOST_QUEUED): whether the kernel still holds
    /// clients canald did not take (it holds as many as it may, or its ring is
    /// full), so that an accept finding no record asks rather than says EAGAIN — a
    /// program that drains its listener gets every client the kernel has, as
    /// natively. Left alone while a shadow's connections wait for their records.
    fn look_after_accepts(&mut self, index: u32) {
        if self.region.header().features & canal_abi::feature::HOST_QUEUED == 0 {
            return;
        }
        let Some(Some(s)) = self.sockets.get(index as usize) else {
            return;
        };
        if s.accepts().is_none_or(|q| q.accepting > 0) {
            return;
        }
        // Not readable: canald's last accept found the queue empty (a client since
        // then is an event, and a pass).
        let queued = s.readable && s.kernel_queued();
        let had = s.flags & sock_flag::HOST_QUEUED != 0;
        // set_flags counts the change as the event (and wakes the sleepers): an
        // accept waiting for canald's answer wakes to EAGAIN when the flag goes.
        if queued && !had {
            self.set_flags(index, sock_flag::HOST_QUEUED, 0);
        } else if !queued && had {
            self.set_flags(index, 0, sock_flag::HOST_QUEUED);
        }
    }

    /// Serves at once this instance's listeners on host port `port`, which a connect
    /// of this guest has just reached. Natively the connection is in the listener's
    /// queue once connect returns, and a program that connects to its own listener
    /// may poll or accept without blocking straight away (HAProxy's pause check, an
    /// ersatz socketpair): waiting for the listener's event in the next pass, 5–20%
    /// of such polls found nothing. Another guest's listener still waits for its
    /// event (docs/compat.md).
    pub(crate) fn serve_listeners_on(&mut self, ep: &Epoll, port: u16) {
        let Some(list) = self.listener_ports.get_mut(&port) else {
            return;
        };
        let sockets = &self.sockets;
        list.retain(|&i| {
            sockets
                .get(i as usize)
                .and_then(|s| s.as_ref())
                .and_then(|s| s.accepts())
                .is_some_and(|q| q.host_port == port)
        });
        if list.is_empty() {
            self.listener_ports.remove(&port);
            return;
        }
        for i in list.clone() {
            match self.sockets[i as usize].as_mut() {
                Some(l) if l.phase == Phase::Listening => l.readable = true,
                _ => continue,
            }
            // A ring found corrupt is found so again, and acted on, by the round's
            // own service of the listener.
            let _ = self.service_listener(ep, i);
            self.mark_dirty(i);
        }
    }

    /// Listener `index` on host port `port` is freed.
    pub(crate) fn forget_listener(&mut self, index: u32, port: u16) {
        if let Some(list) = self.listener_ports.get_mut(&port) {
            list.retain(|&i| i != index);
            if list.is_empty() {
                self.listener_ports.remove(&port);
            }
        }
    }

    /// A listener whose host queue canald leaves to the kernel says whether the
    /// kernel holds clients (`flag`), on each event of the host listener and each
    /// attention the guest raises after an accept that found none:
    /// - NATIVE_QUEUED: its guest accepts native clients itself (`NATIVE_ACCEPT`);
    /// - HOST_QUEUED: the program has not asked for a connection yet (feature
    ///   HOST_QUEUED, `AcceptQueue::started`).
    ///
    /// The kernel's queue is then the program's own, with its backlog.
    fn look_at_queue(&mut self, index: u32, flag: u32) {
        let Some(Some(s)) = self.sockets.get_mut(index as usize) else {
            return;
        };
        // An event (not the guest's attention): a client arrived, news for an
        // edge-triggered epoll item even if the flag stays set.
        let arrived = std::mem::take(&mut s.readable);
        let had = s.flags & flag != 0;
        let queued = s.kernel_queued();
        if queued {
            // Setting the flag is the arrival's event; one already set needs its own.
            self.set_flags(index, flag, 0);
            if arrived && had {
                self.mark_changed(index);
            }
        } else {
            self.set_flags(index, 0, flag);
        }
    }

    /// The program's accepts since canald last looked give the host listener its
    /// backlog back — also when the host listener has nothing new, which is when
    /// this matters: a program that caught up after a burst left canald holding many
    /// records it had not taken, the host queue was lowered to match, and if it stayed
    /// so until the next client, a few clients arriving before canald woke would find
    /// it full (the kernel drops the SYN: the client retries after a second; 3,000
    /// native connects to a Python server had 1–25 such stalls, natively none). So
    /// while the records the program has not taken fill more than half the backlog,
    /// RX_WANT_SPACE asks its next accept to raise attention, as it does when canald
    /// holds all it may (`holds_enough`) or the ring is short of room, until it has
    /// taken every record (a program that keeps up, one client at a time, never gets
    /// there: its accepts raise no attention and wake no canald); otherwise the flag
    /// goes.
    fn watch_claims(&mut self, index: u32) -> Result<(), Corrupt> {
        let free = self.rx_free(index)?;
        self.drop_claimed(index);
        let Some(Some(l)) = self.sockets.get_mut(index as usize) else {
            return Ok(());
        };
        let flags = l.flags;
        let Some(q) = l.accepts_mut() else {
            return Ok(());
        };
        let held = q.held();
        q.behind = (q.behind || 2 * held > q.backlog) && held > 0;
        let wanted = free < 2 * crate::guest::names::ACCEPT_RECORD || q.holds_enough() || q.behind;
        let set = flags & sock_flag::RX_WANT_SPACE != 0;
        if wanted && !set {
            self.set_flags(index, sock_flag::RX_WANT_SPACE, 0);
            // Dekker with the guest, as in `want_rx_space`: a record it took before
            // it could see the flag is counted here.
            fence(Ordering::SeqCst);
            self.rx_free(index)?;
            self.drop_claimed(index);
        } else if !wanted && set {
            self.set_flags(index, 0, sock_flag::RX_WANT_SPACE);
        }
        Ok(())
    }

    /// Whether listener `index` holds as many accepted connections as it may ahead of
    /// the program (`AcceptQueue::ahead`); then the program's accept (RX_WANT_SPACE)
    /// resumes it. The flag goes with the receive-room handshake (§3.5): records the
    /// program took before it could see the flag are counted here, else canald would
    /// stop with clients queued on the host listener and nothing left to wake it (the
    /// program's last accept raised no attention; the host listener no new event).
    pub(crate) fn holds_enough(&mut self, index: u32) -> Result<bool, Corrupt> {
        let full = |g: &Self| {
            g.sockets[index as usize]
                .as_ref()
                .and_then(|l| l.accepts())
                .is_some_and(AcceptQueue::holds_enough)
        };
        if !full(self) {
            return Ok(false);
        }
        self.set_flags(index, sock_flag::RX_WANT_SPACE, 0);
        fence(Ordering::SeqCst);
        self.rx_free(index)?;
        self.drop_claimed(index);
        Ok(full(self))
    }

    /// Gives the host listener the backlog the program's leaves after the connections
    /// canald holds for it, plus `more` accepted or about to be (listen(2) again only
    /// changes the backlog). `accept_ahead` chooses whether before or after its accept.
    pub(crate) fn sync_host_backlog(&mut self, index: u32, more: u32) {
        let Some(Some(l)) = self.sockets.get_mut(index as usize) else {
            return;
        };
        // listen(2) would start a stopped (shut down) or handed-over listener again.
        if l.phase != Phase::Listening {
            return;
        }
        let Some(fd) = l.fd.as_ref() else { return };
        let crate::guest::socket::KindState::Listener(q) = &mut l.state else {
            return;
        };
        let want = q.host_backlog_for(more);
        if want != q.host_backlog && sys::listen(fd, want).is_ok() {
            q.host_backlog = want;
        }
        q.sync_refusal(fd, more);
    }

    /// Accepts one connection from listener `index` ahead of the program, with the
    /// host listener's backlog lowered for it (`sync_host_backlog`). The kernel checks
    /// its queue against the backlog twice, at a client's SYN and at its ACK, and the
    /// client counts as connected once it has the SYN-ACK: lowered while a handshake
    /// let in at the last free place was between the two, that client is dropped at
    /// its ACK yet connected (a ghost), and the accept then lets one more in, one past
    /// the kernel's backlog + 1 (4 of 6 against listen(2): 12 of 6,000 bursts in a C
    /// model of this loop, none with this order). So the backlog is lowered first only
    /// on a full queue, where the old backlog refuses that ACK too; otherwise the
    /// accept makes the room first, and only two handshakes inside the accept (one
    /// between the queue's length and the accept, one before the listen) still let one
    /// more in.
    pub(crate) fn accept_ahead(&mut self, index: u32) -> Result<Accepted, Corrupt> {
        let s = self.sockets[index as usize].as_ref().ok_or(Corrupt)?;
        let full = match (s.fd.as_ref(), s.accepts()) {
            (Some(fd), Some(q)) => q.lower_before_accept(sys::accept_queue_len(fd).ok()),
            _ => true,
        };
        if full {
            self.sync_host_backlog(index, 1);
        }
        let s = self.sockets[index as usize].as_mut().ok_or(Corrupt)?;
        let accepted = accept_one(s);
        if let (Accepted::Conn(c, _), Some(q)) = (&accepted, s.accepts()) {
            if q.backlog == 0 {
                // Made while the listener refused (a handshake's last packet passed
                // just before): it would drop every packet of its own.
                let _ = sys::refuse_all(c, false);
            }
        }
        if !full && matches!(accepted, Accepted::Conn(..)) {
            self.sync_host_backlog(index, 1);
        }
        Ok(accepted)
    }

    fn accept_here(&mut self, ep: &Epoll, index: u32) -> Result<(), Corrupt> {
        let need = crate::guest::names::ACCEPT_RECORD;
        loop {
            let s = self.sockets[index as usize].as_ref().ok_or(Corrupt)?;
            if !s.readable || s.closing.is_some() {
                return Ok(());
            }
            // Room for the record even if padding is needed first.
            let free = self.want_rx_space(index, 2 * need)?;
            self.drop_claimed(index);
            if free == 0 || self.holds_enough(index)? {
                return Ok(());
            }
            if self.table_full() || self.ring_room() < 2 * MIN_RING {
                // Retried when an entry is freed; meanwhile accept says EMFILE.
                self.listeners_stalled = true;
                self.set_flags(index, sock_flag::NO_ENTRY, 0);
                return Ok(());
            }
            self.set_flags(index, 0, sock_flag::NO_ENTRY); // no-op unless it was set
            let (conn, peer) = match self.accept_ahead(index)? {
                Accepted::Conn(c, p) => (c, p),
                Accepted::Again => continue,
                Accepted::Later => return Ok(()),
            };
            let s = self.sockets[index as usize].as_ref().ok_or(Corrupt)?;
            let (family, from_listener) = (s.family, s.inherited());
            let view = self.view();
            let names =
                peer.and_then(|p| crate::guest::names::host_names(&view, &conn, Some(p), false));
            let peer = translate_host_addr(&view, &peer.unwrap_or_default(), false);
            let handle = match self.install(ep, Some(conn), Kind::Stream, family, Phase::Connected)
            {
                Ok(h) => h,
                Err(_) => continue, // the connection is dropped (closed)
            };
            let new_index = canal_abi::handle_index(handle);
            // The kernel's accepted socket inherited the listener's options: its
            // entry starts with the listener's word (the guest's library copies it
            // again when it takes the connection), so no service of the socket before
            // then mistakes the fresh entry's 0 for options turned off.
            let inherited = self.entry(index).options.load(Ordering::Relaxed);
            self.entry(new_index)
                .options
                .store(inherited, Ordering::Relaxed);
            if let Some(Some(ns)) = self.sockets.get_mut(new_index as usize) {
                ns.writable = true;
                ns.readable = true;
                ns.applied_opts = inherited;
                ns.inherit(from_listener); // as the kernel's accepted socket does
            }
            self.mark_dirty(new_index);
            // Owner chosen (and written to the entry) before the handle is published.
            let host_peer = self.sockets[new_index as usize]
                .as_ref()
                .and_then(|s| s.peer());
            if let Some(hp) = host_peer {
                self.place(ep, new_index, Some(&hp));
            }
            if !self.push_accept(index, handle, &peer, names)? {
                // We checked the space; only a guest moving its tail backwards (caught
                // on the next check) gets here. Drop the connection.
                self.release(ep, new_index, handle);
                return Err(Corrupt);
            }
        }
    }
}
