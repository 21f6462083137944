//! Wake-up bookkeeping: registered ports, deferred wake-ups and their statistics.
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;
use std::time::Instant;

/// Per-slot wake-up eventfds (PORT), shared by a guest's home and shadow instances
/// (virtual RSS): each slot's own mutex is only ever taken to register or to wake.
pub(crate) type Ports = Arc<Vec<Mutex<Option<OwnedFd>>>>;

/// Kick-side bookkeeping of one service round.
#[derive(Default, Debug, Clone, Copy)]
pub(crate) struct RoundStats {
    pub(crate) requests: usize,
    pub(crate) sockets: usize,
    pub(crate) bytes: u64,
}

impl RoundStats {
    pub(crate) fn did_work(&self) -> bool {
        self.requests + self.sockets > 0 || self.bytes > 0
    }
}

/// Counters of a doorbell VM (`canal stat`): its kicks (doorbell writes that reached
/// canald's eventfd); the interrupts sent are the guest's `wakes`.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct DoorbellStats {
    pub(crate) kicks: u64,
    /// The VM's QEMU got the setup from the ivshmem server: until then a guest in that
    /// region (say, a VM given the file as ivshmem-plain by mistake) cannot ring us.
    pub(crate) attached: bool,
}

/// Host → guest wake-up coalescing state of one guest.
pub(crate) struct WakeState {
    /// The current round's time.
    pub(crate) now: Instant,
    /// When the last wake-up round began.
    pub(crate) last: Option<Instant>,
    /// Slots whose wake-up waits for the window's end (each once: `mark`).
    pub(crate) deferred: Vec<u32>,
    pub(crate) mark: Vec<bool>,
}

impl WakeState {
    pub(crate) fn new(slots: usize) -> WakeState {
        WakeState {
            now: Instant::now(),
            last: None,
            deferred: Vec::new(),
            mark: vec![false; slots],
        }
    }
    pub(crate) fn begin_round(&mut self, now: Instant) {
        self.now = now;
    }
    /// A wake-up may go out now: no window, or this round already woke (one round
    /// counts once), or the window since the last wake-up round is over.
    pub(crate) fn may_wake(&self, window: Duration) -> bool {
        window.is_zero()
            || self
                .last
                .is_none_or(|l| l == self.now || self.now.saturating_duration_since(l) >= window)
    }
    pub(crate) fn woke_now(&mut self) {
        self.last = Some(self.now);
    }
    /// Remembers a deferred slot; true if it was not already deferred.
    pub(crate) fn defer(&mut self, slot: u32) -> bool {
        match self.mark.get_mut(slot as usize) {
            Some(m) if !*m => {
                *m = true;
                self.deferred.push(slot);
                true
            }
            _ => false,
        }
    }
}
