//! Native clients of a canal listener, accepted by the program's own process (feature
//! NATIVE_ACCEPT, protocol §2 LISTENER_SOCKET).
//!
//! A listener of a guest with the feature carries `NATIVE_ACCEPT`: canald keeps
//! listening on its host socket but accepts nothing there; it only says, with
//! `NATIVE_QUEUED`, whether the kernel holds clients. accept() takes them itself, on a
//! copy of that host socket canald gives each process once (its *twin*, kept here,
//! one of the library's own descriptors), so a native client's connection is the
//! program's own kernel socket and nothing relays it. Clients that are canal guests
//! still come as ACCEPT records in the listener's ring.
//!
//! A twin is a descriptor of the listening socket itself: while one is open the port
//! keeps listening. So each process drops its twin when its own last descriptor of
//! the listener goes (`forget_unused`); a child after fork holds the parent's twin as
//! it holds the parent's descriptors, and exec closes it (close-on-exec).
use crate::conn::guest::Guest;
use crate::fdtable::TABLE;
use crate::sock::core::Sock;
use crate::sys;
use canal_abi::addr::CanalAddr;
use core::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, Ordering};
use libc::c_int;

/// Listeners a process keeps a twin for; beyond that a twin is asked for, used and
/// closed on each accept (correct, one round trip dearer).
const CACHED: usize = 128;

struct Twin {
    /// The listener's handle (0: free).
    handle: AtomicU32,
    /// The twin descriptor (-1: none).
    fd: AtomicI32,
    /// The last client this process accepted on the listener came through the twin
    /// (a native client), not through the ring (`clients_come_natively`).
    native_last: AtomicBool,
}

#[allow(clippy::declare_interior_mutable_const)]
const FREE: Twin = Twin {
    handle: AtomicU32::new(0),
    fd: AtomicI32::new(-1),
    native_last: AtomicBool::new(false),
};

static TWINS: [Twin; CACHED] = [FREE; CACHED];
/// Serialises filling and emptying entries (never held across a system call).
static LOCK: AtomicU32 = AtomicU32::new(0);

/// Whether a socket with `flags` is a listener whose native clients this process
/// accepts itself (canald sets NATIVE_ACCEPT on listeners only).
pub(crate) fn applies(flags: u32) -> bool {
    flags & canal_abi::sock_flag::NATIVE_ACCEPT != 0
}

/// The twin of listener `handle` this process holds, if any.
pub(crate) fn cached(handle: u32) -> Option<c_int> {
    entry(handle)
        .map(|t| t.fd.load(Ordering::Acquire))
        .filter(|&fd| fd >= 0)
}

/// The cache entry of listener `handle` in this process, if it has one.
fn entry(handle: u32) -> Option<&'static Twin> {
    TWINS
        .iter()
        .find(|t| t.handle.load(Ordering::Acquire) == handle)
}

/// Records where the client just accepted on listener `handle` came from: its twin
/// (`native`) or its ring (a canal client).
pub(crate) fn note_client(handle: u32, native: bool) {
    if let Some(t) = entry(handle) {
        if t.native_last.load(Ordering::Relaxed) != native {
            t.native_last.store(native, Ordering::Relaxed);
        }
    }
}

/// Whether the last client this process accepted on listener `handle` was native.
/// A blocked accept then sleeps at once: the kernel wakes one sleeper per native
/// client itself, and a spinning thread only races that sleeper and takes the core
/// the client needs (docs/bench/accept-herd). A canal client, which arrives through
/// shared memory, brings the spin back.
pub(crate) fn clients_come_natively(handle: u32) -> bool {
    entry(handle).is_some_and(|t| t.native_last.load(Ordering::Relaxed))
}

/// A twin for `s`: (descriptor, whether the caller must close it after use).
fn twin(g: &Guest, s: &Sock) -> Result<(c_int, bool), i32> {
    if let Some(fd) = cached(s.handle) {
        return Ok((fd, false));
    }
    let fd = crate::conn::ctl::ctl_listener_socket(g, s.handle)?;
    let fd = crate::ownfd::adopt(fd);
    crate::conn::guest::at_death(drop_all);
    crate::rt::lock(&LOCK);
    let out = if let Some(other) = cached(s.handle) {
        // Another thread asked too and kept its copy.
        Err(other)
    } else if let Some(t) = TWINS.iter().find(|t| t.handle.load(Ordering::Relaxed) == 0) {
        t.fd.store(fd, Ordering::Release);
        t.native_last.store(false, Ordering::Relaxed);
        t.handle.store(s.handle, Ordering::Release);
        Ok((fd, false))
    } else {
        Ok((fd, true))
    };
    crate::rt::unlock(&LOCK);
    match out {
        Ok(x) => Ok(x),
        Err(other) => {
            crate::ownfd::close_own(fd);
            Ok((other, false))
        }
    }
}

/// One accept of a native client on `s`'s twin: Ok(None) when the kernel holds none.
/// `flags` are accept4's (SOCK_NONBLOCK, SOCK_CLOEXEC) for the new descriptor; the
/// twin's file is canald's non-blocking one, so this never blocks.
pub(crate) fn accept(s: &Sock, flags: c_int) -> Result<Option<(c_int, Option<CanalAddr>)>, i32> {
    let (fd, temporary) = twin(s.g, s)?;
    let r = loop {
        let mut ss = [0u8; 128];
        let mut len = ss.len() as libc::socklen_t;
        let r = crate::ownfd::using(|| {
            // SAFETY: accept4 on our own descriptor into a local buffer.
            unsafe {
                sys::raw_syscall!(
                    libc::SYS_accept4,
                    fd,
                    ss.as_mut_ptr(),
                    &mut len as *mut libc::socklen_t,
                    flags
                )
            }
        });
        forget_look();
        if r >= 0 {
            note_client(s.handle, true);
            let peer = crate::sockaddr::decode(&ss[..(len as usize).min(ss.len())]).ok();
            break Ok(Some((r as c_int, peer)));
        }
        match sys::errno() {
            libc::EAGAIN => break Ok(None),
            // A client gone before it was taken, or a signal: the next one.
            libc::ECONNABORTED | libc::EINTR | libc::EPROTO => continue,
            e => break Err(e),
        }
    };
    if temporary {
        crate::ownfd::close_own(fd);
    }
    r
}

/// Whether the kernel holds native clients on twin `fd` (a poll, no wait): a blocked
/// accept that spins looks here too, so a native client does not wait for canald to
/// notice it first.
pub(crate) fn has_clients(fd: c_int) -> bool {
    let mut p = [libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }];
    crate::ownfd::using(|| sys::ppoll(&mut p, Some(0), sys::SigMask::NONE)).is_ok_and(|n| n > 0)
}

/// How long a look at a twin stands for the calling thread: a poll/epoll wait
/// spinning over its sets looks at each socket many times a microsecond, and a
/// system call each time would be most of its work.
const LOOK_NS: i64 = 4_000;

thread_local! {
    /// The calling thread's last look: (handle, when, clients queued).
    static LAST_LOOK: core::cell::Cell<(u32, i64, bool)> = const { core::cell::Cell::new((0, 0, false)) };
}

/// `has_clients` of listener `handle`'s twin `fd`, or the calling thread's look at it
/// of the last LOOK_NS.
fn looked_at(handle: u32, fd: c_int) -> bool {
    let now = sys::now_ns();
    if let Ok((h, at, q)) = LAST_LOOK.try_with(|l| l.get()) {
        if h == handle && now - at < LOOK_NS {
            return q;
        }
    }
    let q = has_clients(fd);
    let _ = LAST_LOOK.try_with(|l| l.set((handle, now, q)));
    q
}

/// The calling thread's accept changed the queue: its next look is a real one.
fn forget_look() {
    let _ = LAST_LOOK.try_with(|l| l.set((0, 0, false)));
}

/// Right after listen(): this process's twin, so that readiness can look at it
/// (without one it follows canald's NATIVE_QUEUED). A failure waits for accept.
pub(crate) fn prefetch(s: &Sock) {
    if let Ok((fd, true)) = twin(s.g, s) {
        crate::ownfd::close_own(fd); // no room to keep it
    }
}

/// `flags` with NATIVE_QUEUED as the kernel's queue has it now, where this process
/// holds the twin: poll(2) of a listener is exact natively (a client whose connect
/// returned is there; one just accepted is gone), and canald's flag lags both ways.
/// A flag canald left set over an empty queue is news for canald, if it looks.
/// Without a twin the flag is all there is: this process relies on it.
fn queued_now(s: &Sock, flags: u32) -> u32 {
    let q = canal_abi::sock_flag::NATIVE_QUEUED;
    let Some(fd) = own_twin(s) else {
        return flags;
    };
    if looked_at(s.handle, fd) {
        flags | q
    } else {
        if flags & q != 0 && canald_looks(s) {
            crate::conn::request::attention(s.g, s.idx);
        }
        flags & !q
    }
}

/// This process's twin of listener `s`, to look at or sleep on (one is asked for
/// after listen(), and by an exec'd program for each listener it inherits). None where canald's NATIVE_QUEUED
/// must do instead — no room was left to keep one, or canald refused it — after
/// relying on it (`rely_on_canald`).
pub(crate) fn own_twin(s: &Sock) -> Option<c_int> {
    let fd = cached(s.handle);
    if fd.is_none() {
        rely_on_canald(s);
    }
    fd
}

/// Whether canald looks at listener `s`'s host queue on every arrival, so that its
/// NATIVE_QUEUED is worth correcting: always without feature NATIVE_QUIET; with it,
/// once some thread relies on the flag (`rely_on_canald`). Otherwise canald looked
/// once, after LISTEN, and the flag may say so forever: every thread of the guest
/// looks at its twin instead.
pub(crate) fn canald_looks(s: &Sock) -> bool {
    s.g.region.header().features & canal_abi::feature::NATIVE_QUIET == 0
        || s.e.guest_flags.load(Ordering::Relaxed) & canal_abi::guest_flag::NATIVE_LOOKS != 0
}

/// (feature NATIVE_QUIET) The calling thread relies on canald's NATIVE_QUEUED for
/// listener `s` from now on: an epoll set holds it (its edges and its sleepers'
/// wake-ups come from canald's marks), or this process has no twin to look at or
/// sleep on. Sets NATIVE_LOOKS once for the listener's life and raises its
/// attention: canald then watches every arrival, as without the feature. Threads
/// that block in accept() or poll() on a twin need none of it.
pub(crate) fn rely_on_canald(s: &Sock) {
    if canald_looks(s) {
        return;
    }
    let looks = canal_abi::guest_flag::NATIVE_LOOKS;
    // Release by the attention's own fetch_or: canald, seeing the bit, sees the flag.
    if s.e.guest_flags.fetch_or(looks, Ordering::Relaxed) & looks == 0 {
        crate::conn::request::attention(s.g, s.idx);
    }
}

/// An epoll set holds `s` (epoll_ctl added it; a wait's look: `epoll_readiness`): a
/// NATIVE_ACCEPT listener's edges and its sleepers' wake-ups are then canald's marks.
pub(crate) fn held_by_epoll(s: &Sock) {
    if s.kind() == canal_abi::sock_kind::LISTENER && applies(s.flags()) {
        rely_on_canald(s);
    }
}

/// Whether an epoll item of `s` can be twin-watched (`watch_twin`): a NATIVE_ACCEPT
/// listener canald does not look at anyway (an older canald, or NATIVE_LOOKS already
/// set: canald's counts are then the item's edges).
pub(crate) fn twin_watchable(s: &Sock) -> bool {
    s.kind() == canal_abi::sock_kind::LISTENER && applies(s.flags()) && !canald_looks(s)
}

/// (epoll) Puts listener `s`'s twin into the real epoll instance `epfd`, edge-triggered,
/// under the user data that names the listener (`kick::twin_token`): the kernel then
/// counts its native arrivals for that set — one event per arrival, a sleeper on the
/// set woken by it — and canald need not look (NATIVE_QUIET). One registration serves
/// every descriptor of the listener in the set. For a `twin_watchable` listener; false
/// where canald's flag must do as before: this process has no twin, or the kernel
/// refused.
pub(crate) fn watch_twin(epfd: c_int, s: &Sock) -> bool {
    twin_ctl(epfd, libc::EPOLL_CTL_ADD, s)
}

/// The program re-armed a twin-watched item (EPOLL_CTL_MOD): so does the twin, and
/// the kernel reports it again if clients wait, as it would the listener.
pub(crate) fn rewatch_twin(epfd: c_int, s: &Sock) {
    twin_ctl(epfd, libc::EPOLL_CTL_MOD, s);
}

fn twin_ctl(epfd: c_int, op: c_int, s: &Sock) -> bool {
    let mut ev = libc::epoll_event {
        events: (libc::EPOLLIN | libc::EPOLLET) as u32,
        u64: crate::mux::kick::twin_token(s.handle),
    };
    crate::ownfd::using(|| {
        let Some(twin) = cached(s.handle) else {
            return false;
        };
        // SAFETY: ev is a live local the kernel reads.
        let r = unsafe {
            sys::raw_syscall!(
                libc::SYS_epoll_ctl,
                epfd as libc::c_long,
                op as libc::c_long,
                twin as libc::c_long,
                &mut ev as *mut libc::epoll_event,
            )
        };
        r == 0
    })
}

/// Takes listener `handle`'s twin out of `epfd` (its item left the set). A twin
/// that moved to another number since (`retarget`) is not found there: its old
/// registration stays until the twin closes, and its events name an item that is
/// gone, which the wait drops.
pub(crate) fn unwatch_twin(epfd: c_int, handle: u32) {
    crate::ownfd::using(|| {
        if let Some(twin) = cached(handle) {
            // SAFETY: DEL reads no event.
            unsafe {
                sys::raw_syscall!(
                    libc::SYS_epoll_ctl,
                    epfd as libc::c_long,
                    libc::EPOLL_CTL_DEL as libc::c_long,
                    twin as libc::c_long,
                    core::ptr::null_mut::<libc::epoll_event>(),
                )
            };
        }
    });
}

/// Readiness of a listener whose epoll item the kernel counts arrivals for
/// (`watch_twin`): the twin's queue as it is now, without the cached look of the
/// last microseconds when the kernel has just said a client arrived (`edge`).
pub(crate) fn twin_readiness(s: &Sock, edge: bool) -> libc::c_short {
    if edge {
        forget_look();
    }
    look(s, false, true)
}

/// Where a poll sleeps (mux/poll.rs): for each entry of `fds` that is a NATIVE_ACCEPT
/// listener polled for input, its twin in `work`'s place for it (the kernel then
/// wakes the sleep for a native client, without canald); a listener this process
/// has no twin for relies on canald instead. Returns whether any twin was put.
pub(crate) fn poll_twins(
    g: &'static Guest,
    fds: &[libc::pollfd],
    work: &mut [libc::pollfd],
) -> bool {
    let mut any = false;
    for (p, w) in fds.iter().zip(work.iter_mut()) {
        if p.fd < 0 || p.events & (libc::POLLIN | libc::POLLRDNORM) == 0 {
            continue;
        }
        let Some(s) = TABLE.handle(p.fd).and_then(|h| Sock::new(g, h).ok()) else {
            continue;
        };
        if s.kind() != canal_abi::sock_kind::LISTENER || !applies(s.flags()) {
            continue;
        }
        if let Some(fd) = own_twin(&s) {
            *w = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            any = true;
        }
    }
    any
}

/// After the sleep: the places `poll_twins` filled are canal entries again (-1).
/// They are the only ones whose descriptor is not the program's own (an ordinary
/// entry, or an epoll set, is copied as it is).
pub(crate) fn unpoll_twins(fds: &[libc::pollfd], work: &mut [libc::pollfd]) {
    for (p, w) in fds.iter().zip(work.iter_mut()) {
        if w.fd >= 0 && w.fd != p.fd {
            *w = libc::pollfd {
                fd: -1,
                events: p.events,
                revents: 0,
            };
        }
    }
}

/// `s.readiness()` for poll and select, with a NATIVE_ACCEPT listener's
/// NATIVE_QUEUED as the kernel's queue has it now (`queued_now`).
pub(crate) fn readiness(s: &Sock) -> libc::c_short {
    look(s, false, true)
}

/// `readiness` for an epoll set's look at `s`: such a listener's set relies on
/// canald from now on (`held_by_epoll`). An edge-triggered item (`edge`) takes
/// NATIVE_QUEUED as canald set it, not the twin's queue: canald's mark of an
/// arrival is the item's edge, and the twin shows the client earlier, so a look
/// between the two would report that client twice (new bits, then the mark).
/// A flag left set after the program emptied the queue reports nothing new until
/// canald's next mark, and the accept that finds the twin empty has canald clear it.
pub(crate) fn epoll_readiness(s: &Sock, edge: bool) -> libc::c_short {
    look(s, true, !edge)
}

/// `s`'s readiness; for a NATIVE_ACCEPT listener, first relying on canald (`rely`),
/// and with NATIVE_QUEUED as the twin's queue has it (`twin`) or as canald set it.
fn look(s: &Sock, rely: bool, twin: bool) -> libc::c_short {
    let mut st = s.snapshot();
    if st.kind == canal_abi::sock_kind::LISTENER && applies(st.flags) {
        if rely {
            rely_on_canald(s);
        }
        if twin {
            st.flags = queued_now(s, st.flags);
        }
    }
    crate::ready::readiness(&st)
}

/// A descriptor of listener `handle` went in this process: if it was the last, the
/// twin goes too (else the port would keep listening for nobody).
pub(crate) fn forget_unused(handle: u32) {
    if cached(handle).is_none() {
        return;
    }
    let mut used = false;
    TABLE.for_each_canal(|_, h| used |= h == handle);
    if used {
        return;
    }
    if let Some(t) = entry(handle) {
        empty(t);
    }
}

/// Frees entry `t` and closes its twin, if any.
fn empty(t: &Twin) {
    crate::rt::lock(&LOCK);
    t.handle.store(0, Ordering::Release);
    let fd = t.fd.swap(-1, Ordering::AcqRel);
    crate::rt::unlock(&LOCK);
    if fd >= 0 {
        crate::ownfd::close_own(fd);
    }
}

/// canald went away, and its host listeners with it: this process's twins go too,
/// so a dead listener's port stops listening (natively its clients would be
/// accepted; here nothing can take them).
pub(crate) fn drop_all() {
    TWINS.iter().for_each(empty);
}

/// Points the twin at `old` to `new` (the program took its number: ownfd.rs).
pub(crate) fn retarget(old: c_int, new: c_int) -> bool {
    crate::ownfd::retarget(TWINS.iter().map(|t| &t.fd), old, new)
}

/// Fork child: its only thread is the one that forked.
pub(crate) fn fork_child() {
    LOCK.store(0, Ordering::Relaxed);
}
