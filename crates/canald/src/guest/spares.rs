//! Spare stream sockets (feature SPARES, protocol §5 "Spare sockets"): a few fresh
//! AF_INET stream sockets published in the region header's ring, so that a guest's
//! `socket()` takes one with a compare-and-swap instead of a SOCKET round trip. A
//! spare has no host socket until a call needs one (`HostSocket::made_fd`): a
//! short-circuited connect never does. canald
//! refills the ring in the command class of each round; the sockets are ordinary table
//! entries, counted against the guest's quota and freed with the guest.
#![forbid(unsafe_code)]

use crate::guest::state::Guest;
use crate::sys::Epoll;
use canal_abi::sync::Ordering;
use canal_abi::SPARES;

/// Spares kept ready: enough for a burst of connects between two rounds.
const READY: u32 = 4;
/// Entries left free for requests: spares never take a guest's last entries.
const KEEP_FREE: u32 = 64;

impl Guest {
    fn spares_on(&self) -> bool {
        self.region.header().features & canal_abi::feature::SPARES != 0
            && !self.spares.off
            && self.gone.is_none()
            && !self.is_shadow()
    }

    /// Spares published and not taken: (head, tail) of the ring, or None when the
    /// guest's head is where it cannot be (taken beyond what was published, or moved
    /// back).
    fn spare_window(&self) -> Option<(u32, u32)> {
        let head = self.region.header().spare_head.load(Ordering::Acquire);
        let tail = self.spares.tail;
        (tail.wrapping_sub(head) <= SPARES as u32).then_some((head, tail))
    }

    /// Tops the ring up to READY spares (a cheap check when nothing was taken).
    pub(crate) fn refill_spares(&mut self, ep: &Epoll) {
        if !self.spares_on() {
            return;
        }
        let Some((head, mut tail)) = self.spare_window() else {
            self.spares.off = true; // a broken guest: no more spares for it
            return;
        };
        while tail.wrapping_sub(head) < READY && self.entries.available() > KEEP_FREE {
            let Ok(h) = self.op_socket_unmade(ep, libc::AF_INET) else {
                break;
            };
            let slot = tail as usize % SPARES;
            self.spares.handles[slot] = h;
            self.region.header().spares[slot].store(h, Ordering::Relaxed);
            tail = tail.wrapping_add(1);
            self.spares.tail = tail;
            // Release: the slot (and the entry behind the handle) before the count.
            self.region
                .header()
                .spare_tail
                .store(tail, Ordering::Release);
        }
    }

    /// Whether `handle` is a spare no guest process has taken yet (`canal stat` does
    /// not list those: the program has not created them).
    pub(crate) fn is_untaken_spare(&self, handle: u32) -> bool {
        self.spare_window().is_some_and(|(head, tail)| {
            (0..tail.wrapping_sub(head))
                .any(|k| self.spares.handles[head.wrapping_add(k) as usize % SPARES] == handle)
        })
    }
}
