//! canald's descriptor budget. A guest socket costs canald at most one descriptor of
//! its own (its host socket; the accepted end of a short-circuited connection has
//! none), plus a WATCH end where the guest's process shares its descriptors (after a
//! fork, exec or descriptor passing: `crate::watch`). All guests share canald's
//! RLIMIT_NOFILE, and the control socket must keep accepting (new guests, `canal
//! stat`) whatever one guest does. So canald raises its soft limit to the hard one at
//! start, keeps a share of it for control connections and wake-up eventfds, gives
//! each guest a quota of three quarters of the rest — counting its entries in use and
//! the WATCH ends held for it (`guest::entries::EntryPool`) — and keeps a reserve
//! descriptor with which the control listener can still accept and answer when the
//! process is out of descriptors anyway (libev's and nginx's EMFILE trick), instead
//! of spinning on a listener that stays readable.
#![forbid(unsafe_code)]

use std::os::fd::OwnedFd;

/// Descriptors kept out of the sockets' budget: control connections, doorbells, wake-up
/// ports, regions, logs.
pub(crate) fn headroom(nofile: u64) -> u64 {
    (nofile / 8).max(64)
}

/// One guest's quota of canald's descriptors with `nofile` for canald: three quarters
/// of what the headroom leaves, at least one. Entries in use and WATCH ends held count
/// against it, one each, so it is also the most sockets a guest may have.
pub(crate) fn per_guest_cap(nofile: u64) -> u64 {
    let sockets = nofile.saturating_sub(headroom(nofile));
    (sockets * 3 / 4).max(1)
}

/// A descriptor held in reserve (on /dev/null) for the moment accept(2) fails with
/// EMFILE/ENFILE.
pub(crate) struct Reserve(Option<OwnedFd>);

impl Reserve {
    pub(crate) fn new() -> Reserve {
        Reserve(crate::sys::open_dev_null().ok())
    }

    /// Frees the reserve, runs `f` (which can now get one descriptor), then takes the
    /// reserve back (if `f`'s descriptor is closed by then, it gets that one).
    pub(crate) fn with_spare<T>(&mut self, f: impl FnOnce() -> T) -> T {
        self.0 = None;
        let r = f();
        self.0 = crate::sys::open_dev_null().ok();
        r
    }
}

impl Default for Reserve {
    fn default() -> Self {
        Reserve::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_leave_room_for_others() {
        // ulimit -n 1024: 64..128 descriptors kept, each guest at most 3/4 of the rest.
        assert_eq!(headroom(1024), 128);
        assert_eq!(per_guest_cap(1024), 672);
        // One greedy guest leaves others a quarter; this sandbox's hard limit.
        assert!(per_guest_cap(1024) + headroom(1024) < 1024);
        assert_eq!(per_guest_cap(20_000), 13_125);
        assert_eq!(per_guest_cap(1 << 20), ((1u64 << 20) - (1 << 17)) * 3 / 4);
        assert_eq!(per_guest_cap(10), 1);
    }
}
