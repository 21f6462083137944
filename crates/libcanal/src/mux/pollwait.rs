//! Blocking semantics for poll-only waits (`CANAL_NOTIFY=poll`).
//!
//! A poll-only wait never sleeps in the kernel. A signal that arrives while it spins runs
//! its handler on the spot and returns into the spin, so the call would never learn that
//! it was interrupted: a blocked `recv` would not return EINTR, a `ppoll` whose mask
//! unblocks a pending signal would not either. Hybrid and sleep waits have this window
//! only for their short spin, like the native race of a signal arriving just before a
//! call blocks; a poll-only wait has it forever.
//!
//! So once it has spun as long as a hybrid wait may (`BLOCK_AFTER` yield points, about
//! the hybrid budget's 100 µs maximum), a poll-only wait runs with signals blocked and
//! opens a zero-length window at every further yield point: `ppoll(no fds, timeout 0, mask)` with the
//! thread's own mask (or the one the program gave to ppoll/pselect/epoll_pwait). A
//! pending signal is delivered inside that call, which then fails with EINTR, and the
//! wait reports it exactly as an interrupted sleep would. The mask is restored when the
//! wait ends. Before that point a yield point costs one `sched_yield` (as before); after
//! it two calls (`sched_yield`, the window) plus one each to block and restore the mask
//! per wait — only waits that already spun that long pay them.
//!
//! A confined process (sys.rs, "confinement": sshd's sandbox) may not call ppoll, and
//! its filter kills it for trying: it opens no window, and a signal handler runs during
//! the spin without ending the wait, as before windows existed.
use crate::sys;

/// Yield points a poll-only wait passes before it counts as a blocked call.
pub(crate) const BLOCK_AFTER: u32 = 16;

pub(crate) struct SignalWindow {
    saved: Option<libc::sigset_t>,
    yields: u32,
}

impl SignalWindow {
    pub(crate) const fn new() -> SignalWindow {
        SignalWindow {
            saved: None,
            yields: 0,
        }
    }

    /// Whether this wait counts as a blocked call yet (signals are blocked).
    pub(crate) fn active(&self) -> bool {
        self.saved.is_some()
    }

    /// At a poll-only yield point: yields the core, and returns Err(EINTR) if a signal
    /// handler ran. `mask` is the program's ppoll/pselect mask, if it gave one.
    pub(crate) fn yield_point(&mut self, mask: sys::SigMask) -> Result<(), i32> {
        sys::sched_yield();
        if self.yields < BLOCK_AFTER || sys::confined() {
            self.yields += 1;
            return Ok(());
        }
        let saved = *self.saved.get_or_insert_with(sys::block_signals);
        let window = if mask.0.is_null() {
            sys::SigMask(&saved as *const libc::sigset_t)
        } else {
            mask
        };
        match sys::ppoll(&mut [], Some(0), window) {
            Err(libc::EINTR) => Err(libc::EINTR),
            _ => Ok(()),
        }
    }
}

impl Default for SignalWindow {
    fn default() -> SignalWindow {
        SignalWindow::new()
    }
}

impl Drop for SignalWindow {
    fn drop(&mut self) {
        if let Some(saved) = self.saved.take() {
            sys::restore_signals(&saved);
        }
    }
}
