//! Waking a guest's sleeping threads: ports, deferred wakes, attention bits.
use crate::guest::state::Guest;
use crate::sys;
use canal_abi::errno;
use canal_abi::sleep_kind;
use canal_abi::sync::fence;
use canal_abi::sync::Ordering;
use canal_abi::WAIT_ACCEPT;
use canal_abi::WAIT_ANY;
use std::os::fd::AsRawFd;
use std::os::fd::OwnedFd;
use std::time::Instant;

impl Guest {
    /// Stores the wake-up eventfd of `slot` (PORT). The fd must be an eventfd; it is
    /// made non-blocking so a wake-up can never block the poller.
    pub(crate) fn set_port(&mut self, slot: u32, fd: OwnedFd) -> Result<(), i32> {
        let p = self.ports.get(slot as usize).ok_or(errno::EINVAL)?;
        if !sys::is_eventfd(&fd) {
            return Err(errno::EINVAL);
        }
        sys::set_nonblocking(&fd).map_err(|e| sys::errno_of(&e))?;
        *p.lock().unwrap_or_else(|e| e.into_inner()) = Some(fd);
        Ok(())
    }

    pub(crate) fn mark_dirty(&mut self, index: u32) {
        if let Some(Some(s)) = self.sockets.get_mut(index as usize) {
            if !s.dirty {
                s.dirty = true;
                self.dirty.push(index);
            }
        }
    }

    /// One event on the socket: an edge-triggered epoll item reports it once.
    pub(crate) fn mark_changed(&mut self, index: u32) {
        self.count_event(index);
        self.mark_to_wake(index);
    }

    /// Bumps the socket's `event_seq`: before anything the event changes in its entry
    /// (`set_flags`), and before its event-log entry (`mark_to_wake`). A guest look
    /// reads the sequence, then the flags, then the sequence again, and looks afresh
    /// if it moved: one that sees the new flags sees the new sequence with them, so a
    /// change is one edge, never new bits under the old sequence and then the
    /// sequence alone (two).
    pub(crate) fn count_event(&mut self, index: u32) {
        if let Some(e) = self.region.socket(index) {
            e.event_seq.fetch_add(1, Ordering::Release);
        }
    }

    /// Wakes the socket's event sleepers at the round's end without counting an event
    /// (its `event_seq` stays: an edge-triggered epoll reports nothing new).
    pub(crate) fn mark_to_wake(&mut self, index: u32) {
        let (w, b) = ((index / 64) as usize, index % 64);
        if let Some(word) = self.changed_mark.get_mut(w) {
            if *word & (1 << b) == 0 {
                *word |= 1 << b;
                self.changed.push(index);
            }
            // §8.6: a set relying on the log sees the socket now, not at the round's
            // end (a spinning reader would wait for the rest of the round). Every
            // change, not only the round's first: a reader may have looked at the
            // socket since that first entry, and an edge-triggered item reports this
            // change only if an entry says so.
            match self.evlog.as_ref().and_then(|f| f.log()) {
                Some(log) if log.has_readers() => {
                    log.append(index);
                }
                _ => self.log_behind = true,
            }
        }
    }

    pub(crate) fn set_host_sleeping(&self, v: u32) {
        let h = self.region.header();
        if let Some(vr) = &self.vr {
            if let Some(word) = h.worker_sleeping.get(vr.me as usize) {
                word.store(v, Ordering::Relaxed);
            }
            if vr.is_shadow() {
                return; // the request doorbell's word belongs to the home worker
            }
        }
        h.host_sleeping.store(v, Ordering::Relaxed);
    }

    pub(crate) fn has_port(&self, slot: u32) -> bool {
        self.ports
            .get(slot as usize)
            .is_some_and(|p| p.lock().unwrap_or_else(|e| e.into_inner()).is_some())
    }

    /// Writes slot `slot`'s wake-up eventfd; false if it has none.
    pub(crate) fn signal_port(&self, slot: u32) -> bool {
        let Some(p) = self.ports.get(slot as usize) else {
            return false;
        };
        match &*p.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(fd) => {
                let _ = sys::eventfd_write(fd.as_raw_fd());
                true
            }
            None => false,
        }
    }

    /// Wakes a sleeping slot, at most one wake-up round per `wake_window` per guest
    /// (later ones are deferred to the window's end, see `flush_deferred_wakes`).
    pub(crate) fn wake_slot(&mut self, slot: u32) {
        if !self.has_port(slot) {
            return;
        }
        if !self.wake.may_wake(self.wake_window) {
            if self.wake.defer(slot) {
                self.deferred_wakes += 1;
            }
            return;
        }
        if self.wake.mark.get(slot as usize) == Some(&true) {
            return; // already deferred: this round's flush wakes it (once)
        }
        if self.signal_port(slot) {
            self.wakes += 1;
            self.wake.woke_now();
        }
    }

    /// Once the window is over, wakes the deferred slots that still sleep (§6: a slot
    /// that went to sleep after our change re-checked and saw it; one still asleep
    /// needs the wake-up; a spurious one costs it a look).
    pub(crate) fn flush_deferred_wakes(&mut self, _now: Instant) {
        if self.wake.deferred.is_empty() || !self.wake.may_wake(self.wake_window) {
            return;
        }
        fence(Ordering::SeqCst);
        let list = std::mem::take(&mut self.wake.deferred);
        for &i in &list {
            if let Some(m) = self.wake.mark.get_mut(i as usize) {
                *m = false;
            }
            let asleep = self
                .region
                .slot(i)
                .is_some_and(|s| s.sleep.load(Ordering::Relaxed) != sleep_kind::AWAKE);
            if asleep && self.signal_port(i) {
                self.wakes += 1;
            }
        }
        let mut list = list;
        list.clear();
        self.wake.deferred = list;
        self.wake.woke_now();
    }

    pub(crate) fn serve_attention(&mut self) {
        let region = self.region;
        for (w, word) in region.attention()[..self.owned_words].iter().enumerate() {
            // Only the bits of sockets this instance owns (virtual RSS: the others
            // belong to other workers and stay set for them).
            let mask = self.owned.get(w).copied().unwrap_or(0);
            if word.load(Ordering::Relaxed) & mask == 0 {
                continue;
            }
            // A2: Acquire pairs with the guest's Release fetch_or (A1).
            let mut bits = word.fetch_and(!mask, Ordering::Acquire) & mask;
            while bits != 0 {
                let b = bits.trailing_zeros();
                bits &= bits - 1;
                self.accept_asked(w as u32 * 64 + b);
                self.mark_dirty(w as u32 * 64 + b);
            }
        }
    }

    pub(crate) fn wake_event_sleepers(&mut self) {
        if self.changed.is_empty() {
            return;
        }
        self.last_active = Some(self.wake.now);
        let h = self.region.header();
        h.event_seq.fetch_add(1, Ordering::Release);
        // §6: we stored indices/flags/event_seq, fence, then read the sleep words; the
        // guest stores sleep, fences, re-checks readiness.
        fence(Ordering::SeqCst);
        // §8.6: sockets were appended as they changed while a set relied on the log.
        // One marked while none did (or whose check raced with a set counting itself:
        // that needs this fence) is appended now; the set looks at everything once
        // after counting itself, so a change before both is not lost either.
        if std::mem::take(&mut self.log_behind) {
            if let Some(log) = self.evlog.as_ref().and_then(|f| f.log()) {
                if log.has_readers() {
                    for &i in &self.changed {
                        log.append(i);
                    }
                }
            }
        }
        if h.event_waiters.load(Ordering::Relaxed) > 0 {
            // Threads blocked in accept() on one listener: as many as it has
            // connections waiting, not all (the kernel's exclusive wake-up; sixteen
            // accepting threads woke sixteen times per connection). Others waiting on
            // it (poll) all wake, as natively.
            let mut accept_budget: Vec<(u32, u32)> = Vec::new();
            // Only slots below the guest's `slots_used` can hold a sleeper (0: a guest
            // before minor 14, every slot). A guest that writes less only loses its
            // own wake-ups (its sleepers re-check within RECHECK_NS anyway).
            let count = self.cfg.layout.slot_count;
            let used = match h.slots_used.load(Ordering::Relaxed) {
                0 => count,
                n => n.min(count),
            };
            for i in 0..used {
                let Some(slot) = self.region.slot(i) else {
                    break;
                };
                if slot.sleep.load(Ordering::Relaxed) != sleep_kind::EVENTS {
                    continue;
                }
                let marked = slot.wait_socket.load(Ordering::Relaxed);
                // A thread blocked in accept() (feature ACCEPT_ONE) marks its wait.
                let accepting = marked != WAIT_ANY && marked & WAIT_ACCEPT != 0;
                let ws = if accepting {
                    marked & !WAIT_ACCEPT
                } else {
                    marked
                };
                let hit = ws == WAIT_ANY
                    || self
                        .changed_mark
                        .get((ws / 64) as usize)
                        .is_some_and(|w| w & (1 << (ws % 64)) != 0);
                if !hit {
                    continue;
                }
                if accepting {
                    let at = match accept_budget.iter().position(|b| b.0 == ws) {
                        Some(at) => at,
                        None => {
                            accept_budget.push((ws, self.accept_wakes(ws)));
                            accept_budget.len() - 1
                        }
                    };
                    let left = &mut accept_budget[at].1;
                    if *left == 0 {
                        continue;
                    }
                    *left -= 1;
                }
                self.wake_slot(i);
            }
        }
        for i in self.changed.drain(..) {
            if let Some(w) = self.changed_mark.get_mut((i / 64) as usize) {
                *w = 0;
            }
        }
    }

    /// How many threads sleeping on socket `index` to wake: for a listener in its
    /// ordinary state, one per connection waiting in its queue; for anything else
    /// (and a listener that failed, closed or ran out of entries: every waiter must
    /// see it) all of them.
    fn accept_wakes(&self, index: u32) -> u32 {
        let quiet = canal_abi::sock_flag::LISTENING;
        let news = canal_abi::sock_flag::ERROR
            | canal_abi::sock_flag::HUP
            | canal_abi::sock_flag::RX_EOF
            | canal_abi::sock_flag::BROKEN
            | canal_abi::sock_flag::CLOSING
            | canal_abi::sock_flag::NO_ENTRY;
        let s = self.sockets.get(index as usize).and_then(|s| s.as_ref());
        match s.and_then(|s| s.accepts().map(|q| (s.flags, q))) {
            // HOST_QUEUED: one of them asks canald for the kernel's clients.
            Some((flags, q)) if flags & quiet != 0 && flags & news == 0 => {
                q.unclaimed.len() as u32 + u32::from(flags & canal_abi::sock_flag::HOST_QUEUED != 0)
            }
            _ => u32::MAX,
        }
    }

    // ---- requests -------------------------------------------------------------
}

#[cfg(test)]
mod tests {
    use crate::guest::config::GuestConfig;
    use crate::guest::state::Guest;
    use canal_abi::sync::Ordering;
    use canal_abi::Layout;

    /// The log's entries from `cursor` on, as a reader's sweep sees them.
    fn swept(g: &Guest, cursor: &mut u64) -> Vec<u32> {
        let log = g.evlog.as_ref().and_then(|f| f.log()).expect("a log");
        let mut seen = Vec::new();
        log.sweep(cursor, |i| seen.push(i));
        seen
    }

    /// Protocol §8.6: a reader that looked at a socket after the round's first entry
    /// for it must get a second entry for a second change in the same round, or an
    /// edge-triggered item never reports that change (the lost first byte of
    /// 2026-11-30's `test_epoll_server_with_thousands_of_clients[edge-native]`).
    #[test]
    fn every_change_in_a_round_gets_its_own_entry() {
        let layout = Layout::new(4, 8, 1 << 20).unwrap();
        let (mut g, _memfd) = Guest::new(
            1,
            1,
            0,
            "log".into(),
            GuestConfig::with_layout(layout, 1 << 16),
        )
        .unwrap();
        let log = g.evlog.as_ref().and_then(|f| f.log()).expect("a log");
        log.header.readers.store(1, Ordering::Relaxed);
        let mut cursor = log.tail();
        g.mark_changed(3);
        assert_eq!(swept(&g, &mut cursor), [3], "the first change");
        g.mark_changed(3);
        assert_eq!(
            swept(&g, &mut cursor),
            [3],
            "the second, after the reader looked"
        );
        g.mark_to_wake(5);
        assert_eq!(swept(&g, &mut cursor), [5]);
        assert_eq!(
            g.changed,
            [3, 5],
            "each socket woken once at the round's end"
        );
    }
}
