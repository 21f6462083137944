//! The socket reference a sleeping call holds, as the kernel's in-flight call holds
//! the file: a close() by another thread does not close the socket (or unmap its pair
//! segment) under it. Taken at a call's first sleep, dropped when the call returns
//! (`sock::close::unpin`, called by the hook), with a private copy of the call's
//! descriptor so that canald's liveness check (WATCH) sees the call too.
use crate::conn::guest::Guest;
use crate::fdtable::TABLE;
use crate::sys;
use canal_abi::sync::Ordering;
use core::cell::Cell;
use core::sync::atomic::AtomicI32;
use libc::c_int;

/// What a sleeping call holds until it returns (`sock::close::unpin`).
#[derive(Clone, Copy)]
pub(crate) struct Pinned {
    /// The socket's handle (one reference taken).
    pub(crate) handle: u32,
    /// The private descriptor copy, an index for `close_pin`, or -1.
    pub(crate) copy: c_int,
    /// The program's descriptor the call was made on, or -1.
    pub(crate) fd: c_int,
}

impl Pinned {
    /// Whether the program still has the call's descriptor for this socket: then the
    /// pin was not this process's last hold, and dropping it closes nothing.
    pub(crate) fn program_holds(&self) -> bool {
        self.fd >= 0 && TABLE.handle(self.fd) == Some(self.handle)
    }
}

thread_local! {
    /// What this thread's current call pinned while sleeping.
    static PINNED: Cell<Option<Pinned>> = const { Cell::new(None) };
    /// The descriptor the current canal call was made on (set by the hooks).
    static CURRENT_FD: Cell<c_int> = const { Cell::new(-1) };
}

/// Records the descriptor of the canal call this thread is making.
#[inline]
pub(crate) fn set_current_fd(fd: c_int) {
    let _ = CURRENT_FD.try_with(|c| c.set(fd));
}

/// The descriptor copies held by sleeping calls (`pin_fd`), where ownfd.rs can move them.
static PIN_FDS: [AtomicI32; 1024] = [const { AtomicI32::new(-1) }; 1024];

/// A private copy of the current call's dummy descriptor, so that the kernel-counted
/// liveness (WATCH) also sees the in-flight call: an index into PIN_FDS, or -1 if there
/// is none (no descriptor, or every entry in use: the call then goes without).
fn pin_fd(h: u32, fd: c_int) -> c_int {
    if fd < 0 || TABLE.handle(fd) != Some(h) {
        return -1;
    }
    // High, like the library's other descriptors: a sleeping call must not change the
    // numbers the program's next socket() or open() gets.
    let d = match crate::ownfd::dup_high(fd) {
        Ok(d) => d,
        Err(_) => return -1,
    };
    let Some(i) = PIN_FDS.iter().position(|a| {
        a.compare_exchange(-1, d, Ordering::SeqCst, Ordering::Relaxed)
            .is_ok()
    }) else {
        let _ = sys::close(d);
        return -1;
    };
    // Hidden from the application like the library's other descriptors.
    if TABLE.set_internal(d).is_err() {
        PIN_FDS[i].store(-1, Ordering::SeqCst);
        let _ = sys::close(d);
        return -1;
    }
    i as c_int
}

/// Closes the pinned descriptor copy `pin` (an index from `pin_fd`).
pub(crate) fn close_pin(pin: c_int) {
    let Some(a) = PIN_FDS.get(pin as usize) else {
        return;
    };
    crate::ownfd::close_held(a);
}

/// Points the pinned copy held at `old` to `new` (it moved: ownfd.rs).
pub(crate) fn retarget_pin(old: c_int, new: c_int) -> bool {
    crate::ownfd::retarget(&PIN_FDS, old, new)
}

/// In a fork child: the other threads' pins are the parent's; close the copies.
pub(crate) fn forget_pins_in_child() {
    let mine = PINNED.try_with(|p| p.get()).ok().flatten().map(|p| p.copy);
    for (i, a) in PIN_FDS.iter().enumerate() {
        if Some(i as c_int) != mine {
            let fd = a.swap(-1, Ordering::Relaxed);
            if fd >= 0 {
                crate::ownfd::close_own(fd);
            }
        }
    }
}

/// The socket reference and pinned descriptor copy (`close_pin`) the current call
/// took while sleeping, if any (`sock::close::unpin` drops them).
pub(crate) fn take_pinned() -> Option<Pinned> {
    PINNED.try_with(|p| p.take()).ok().flatten()
}

/// The current call holds a reference on socket `index` until it returns (`unpin`,
/// called by the hook), as the kernel's in-flight call holds the file, unless it holds
/// one already.
pub(crate) fn pin_for_call(g: &'static Guest, index: u32) {
    if PINNED.with(|p| p.get().is_none()) {
        let fd = CURRENT_FD.try_with(|c| c.get()).unwrap_or(-1);
        let pinned = pin(g, index).map(|handle| Pinned {
            handle,
            copy: pin_fd(handle, fd),
            fd,
        });
        PINNED.with(|p| p.set(pinned));
    }
}

/// Takes one reference on socket `index` for a sleeping call; None if the socket is
/// already being closed (or `index` is WAIT_ANY).
fn pin(g: &'static Guest, index: u32) -> Option<u32> {
    let e = g.region.socket(index)?;
    let h = canal_abi::make_handle(index, e.generation.load(Ordering::Acquire));
    e.refs
        .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |r| {
            (r > 0).then(|| r + 1)
        })
        .ok()
        .map(|_| h)
}
