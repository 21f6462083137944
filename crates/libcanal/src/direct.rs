//! Native peers on kernel sockets (feature DIRECT, protocol §2 DIRECTORY).
//!
//! A process in canald's own network without a destination policy could make any
//! kernel socket itself, and a connection to a native peer gains nothing from passing
//! through canald: on few cores the relay is a third process that every message
//! wakes. So, with DIRECT, a new TCP or UDP socket starts as a kernel socket of its
//! own, *undecided* in the descriptor table, and is decided at its first use:
//! - bind or listen: canal's (a server's address must be a canal port, for other
//!   guests to short-circuit to it); so is a connect or a datagram sent to a canal
//!   port, one the port directory shows a canal listener or receiver on;
//! - a connect or a datagram to any other port: the kernel's for good (the table
//!   forgets it), at the kernel's speed and cost, with nothing in between;
//! - a copy of it made before (dup, fork, SCM_RIGHTS, an epoll set): the kernel's, so
//!   that every copy stays one socket.
//!
//! Becoming canal's makes a canal socket as socket() would, replays the options set so
//! far, and puts its dummy at the same number. Until then every call on it is the
//! kernel's own. A directory that cannot be had makes every port a canal port (the
//! behaviour without DIRECT). `CANAL_DIRECT=off` in the program's environment keeps
//! every socket canal's.
//!
//! A stream that becomes canal's at its connect has cost a kernel socket made and
//! thrown away, and the move (about 20% of a short guest↔guest connection: B12 with
//! one client, 9.8–12.7 K against 14.1–16.0 K connections/s with the client's
//! `CANAL_DIRECT=off`). So a process whose last stream connects all went to canal
//! ports *guesses*: its new stream sockets start as canal's (`guess_canal`). A guess
//! proved wrong by a connect to a native peer costs that socket's hand-over
//! (`at_native_connect`: HOST_SOCKET, one control round trip) and makes the next guess
//! wait for a streak twice as long, so a process that mixes peers soon stops guessing.
use crate::conn::guest::Guest;
use crate::fdtable::{Entry, TABLE};
use crate::sys;
use canal_abi::control::directory;
use canal_abi::sync::Ordering;
use canal_abi::CanalAddr;
use core::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, AtomicU8};
use libc::c_int;

/// What an undecided socket is, as its table word: bit 0 IPv6, bit 1 datagram,
/// bits 8.. the protocol number the program gave.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Kind(u32);

impl Kind {
    fn new(domain: c_int, base: c_int, proto: c_int) -> Kind {
        Kind(
            (domain == libc::AF_INET6) as u32
                | ((base == libc::SOCK_DGRAM) as u32) << 1
                | ((proto as u32) & 0xff) << 8,
        )
    }
    fn domain(self) -> c_int {
        if self.0 & 1 != 0 {
            libc::AF_INET6
        } else {
            libc::AF_INET
        }
    }
    fn dgram(self) -> bool {
        self.0 & 2 != 0
    }
    fn base(self) -> c_int {
        if self.dgram() {
            libc::SOCK_DGRAM
        } else {
            libc::SOCK_STREAM
        }
    }
    fn proto(self) -> c_int {
        (self.0 >> 8) as c_int
    }
}

/// `CANAL_DIRECT=off` (or `0`) turns the direct path off.
static ENV: crate::rt::EnvSwitch = crate::rt::EnvSwitch::new(c"CANAL_DIRECT");

/// Whether new sockets of this process start undecided.
pub(crate) fn on(g: &Guest) -> bool {
    g.region.header().features & canal_abi::feature::DIRECT != 0 && allowed()
}

/// Whether the program's environment leaves the direct path on.
fn allowed() -> bool {
    ENV.on()
}

/// HELLO's flags for the direct path: none where the program's environment turned it
/// off (then canald also accepts its listeners' native clients, as for any guest).
pub(crate) fn hello_flags() -> u32 {
    if allowed() {
        canal_abi::control::hello_flag::DIRECT
            | canal_abi::control::hello_flag::NATIVE_ACCEPT
            | canal_abi::control::hello_flag::NATIVE_QUIET
    } else {
        0
    }
}

// ---- guessing a stream's side ------------------------------------------------------

/// Stream connects of this process in a row that went to canal ports.
static CANAL_STREAK: AtomicU32 = AtomicU32::new(0);
/// The streak from which new streams start as canal's; doubled by each wrong guess.
static GUESS_AT: AtomicU32 = AtomicU32::new(GUESS_FIRST);
/// A short-connection client makes this many in a few hundred microseconds; a process
/// that connects to canal ports only now and then never guesses.
const GUESS_FIRST: u32 = 8;
/// After enough wrong guesses a process no longer guesses at all.
const GUESS_NEVER: u32 = 1 << 20;

/// Whether a new stream socket of this process should start as canal's: its last
/// `GUESS_AT` stream connects went to canal ports.
pub(crate) fn guess_canal() -> bool {
    CANAL_STREAK.load(Ordering::Relaxed) >= GUESS_AT.load(Ordering::Relaxed)
}

/// A stream of this process connects to a canal port (`canal`) or to a native peer;
/// `guessed`: it started as canal's by `guess_canal`.
fn stream_connects(canal: bool, guessed: bool) {
    if canal {
        let _ =
            CANAL_STREAK.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_add(1));
        return;
    }
    CANAL_STREAK.store(0, Ordering::Relaxed);
    if guessed {
        let at = GUESS_AT.load(Ordering::Relaxed);
        GUESS_AT.store(at.saturating_mul(2).min(GUESS_NEVER), Ordering::Relaxed);
    }
}

/// socket(2) for a supported (domain, type, protocol): a kernel socket, undecided.
pub(crate) fn socket(
    domain: c_int,
    base: c_int,
    proto: c_int,
    nonblock: bool,
    cloexec: bool,
) -> Result<c_int, i32> {
    let flags = base
        | if nonblock { libc::SOCK_NONBLOCK } else { 0 }
        | if cloexec { libc::SOCK_CLOEXEC } else { 0 };
    let fd = sys::socket(domain, flags, proto)?;
    // Beyond the table's reach it simply stays the kernel's.
    let _ = TABLE.set_undecided(fd, Kind::new(domain, base, proto).0);
    Ok(fd)
}

// ---- the port directory --------------------------------------------------------------

/// The directory's words, once mapped (read-only); null before.
static DIR: AtomicPtr<AtomicU64> = AtomicPtr::new(core::ptr::null_mut());
/// 0: not asked yet, 1: mapped, 2: not to be had.
static DIR_STATE: AtomicU8 = AtomicU8::new(0);

fn words(g: &Guest) -> Option<&'static [AtomicU64]> {
    if DIR_STATE.load(Ordering::Acquire) == 0 {
        let got = crate::conn::ctl::ctl_directory(g).and_then(|(fd, size)| {
            let ok =
                size as usize == directory::SIZE && sys::file_size(fd).is_ok_and(|s| s >= size);
            let p = if ok {
                sys::mmap_read(fd, directory::SIZE)
            } else {
                Err(libc::EIO)
            };
            let _ = sys::close(fd);
            p
        });
        match got {
            Ok(p) => {
                if DIR
                    .compare_exchange(
                        core::ptr::null_mut(),
                        p as *mut AtomicU64,
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    )
                    .is_err()
                {
                    sys::munmap(p, directory::SIZE); // another thread mapped it first
                }
                DIR_STATE.store(1, Ordering::Release);
            }
            Err(_) => DIR_STATE.store(2, Ordering::Release),
        }
    }
    let p = DIR.load(Ordering::Acquire);
    // SAFETY: a read-only shared mapping of directory::SIZE bytes (page aligned),
    // never unmapped once published; its words are only read, atomically, while
    // canald updates them atomically.
    (!p.is_null()).then(|| unsafe { core::slice::from_raw_parts(p, directory::SIZE / 8) })
}

/// Whether a canal socket may be at `port`: the directory's bit, or true without one.
fn canal_port(g: &Guest, dgram: bool, port: u16) -> bool {
    let Some(w) = words(g) else { return true };
    let (i, bit) = directory::slot(port);
    let base = (if dgram {
        directory::UDP
    } else {
        directory::TCP
    }) / 8;
    w[base + i].load(Ordering::Acquire) & bit != 0
}

// ---- options set while undecided ----------------------------------------------------

/// Options set on undecided sockets, by descriptor, for the canal socket one may
/// become.
static SAVED: crate::sock::opts::SavedOpts<c_int> = crate::sock::opts::SavedOpts::new();

/// The program set an option on `fd` (the kernel took it): kept if `fd` is
/// undecided.
pub(crate) fn record_option(fd: c_int, level: c_int, name: c_int, v: &[u8]) {
    if let Some(Entry::Undecided(_)) = TABLE.get(fd) {
        SAVED.record(fd, level, name, v);
    }
}

// ---- deciding -------------------------------------------------------------------------

/// What the first use of an undecided socket says about it.
pub(crate) enum Use<'a> {
    /// bind (its address, for CANAL_EXCLUDE) or listen (None).
    Serve(Option<&'a CanalAddr>),
    /// A connect, or a datagram sent, to this address.
    Reach(&'a CanalAddr),
}

/// `fd`, if undecided, is the kernel's for good (a copy of it was made, it was
/// closed, or its first use left it there): the table forgets it.
#[inline]
pub(crate) fn settle_kernel(fd: c_int) {
    if let Some(Entry::Undecided(_)) = TABLE.get(fd) {
        TABLE.take(fd);
        SAVED.forget(fd);
    }
}

/// Every undecided socket becomes the kernel's (before a fork: parent and child must
/// hold one socket).
pub(crate) fn settle_all_kernel() {
    for fd in 0..TABLE.high_water() as c_int {
        settle_kernel(fd);
    }
}

/// bind (`addr` non-null) or listen on `fd`: an undecided socket becomes canal's
/// unless CANAL_EXCLUDE names the address.
#[inline]
pub(crate) fn at_serve(fd: c_int, addr: *const libc::sockaddr, len: libc::socklen_t) {
    if let Some(Entry::Undecided(_)) = TABLE.get(fd) {
        decide_guarded(fd, |g| {
            let a = (!addr.is_null())
                .then(|| crate::hooks::common::addr_in(addr, len).ok())
                .flatten();
            settle(g, fd, Use::Serve(a.as_ref()));
        });
    }
}

/// connect on `fd`, or a send with a destination (`flags`: the send's; MSG_FASTOPEN
/// makes a stream's send a connect): an undecided socket is decided by where it goes.
/// An address the library cannot read (or AF_UNSPEC) leaves it to the kernel, whose
/// error the program then gets.
#[inline]
pub(crate) fn at_reach(fd: c_int, addr: *const libc::sockaddr, len: libc::socklen_t, flags: c_int) {
    let Some(Entry::Undecided(k)) = TABLE.get(fd) else {
        return;
    };
    if addr.is_null() || (!Kind(k).dgram() && flags & libc::MSG_FASTOPEN == 0) {
        return; // the kernel's error (or, on a stream, an address it ignores)
    }
    decide_guarded(fd, |g| match crate::hooks::common::addr_in(addr, len) {
        Ok(a) => settle(g, fd, Use::Reach(&a)),
        Err(_) => settle_kernel(fd),
    });
}

/// connect of a canal socket to `a`, where its bind made it canal's: to a native peer
/// (no canal port, per the directory) a connected stream or datagram socket talks to
/// that peer alone and needs nothing of canald. So canald hands its host socket over,
/// bound where the program bound it (HOST_SOCKET, `handoff::pass_to_kernel`), and the
/// connect is the kernel's (true; the caller makes it). Only a stream not yet
/// connecting, or a datagram socket with nothing received unread (a hand-over would
/// drop it) and not short-circuited; anything else stays canal's (false).
pub(crate) fn at_native_connect(s: &crate::sock::core::Sock, a: &CanalAddr) -> bool {
    use canal_abi::sock_flag as f;
    let g = s.g;
    if !on(g) || s.e.segment.load(Ordering::Acquire) != 0 {
        return false;
    }
    let dgram = match s.kind() {
        canal_abi::sock_kind::DGRAM => true,
        canal_abi::sock_kind::STREAM => false,
        _ => return false,
    };
    let busy = if dgram {
        s.e.rx_head.load(Ordering::Acquire) != s.e.rx_tail.load(Ordering::Acquire)
    } else {
        s.flags() & (f::CONNECTING | f::CONNECTED | f::LISTENING) != 0
    };
    if busy {
        return false;
    }
    let canal = canal_port(g, dgram, a.port);
    if !dgram {
        // While guessing, a stream connecting to a native peer is taken for a wrong
        // guess (it may have been bound instead: a guess then only waits longer).
        stream_connects(canal, guess_canal());
    }
    if canal {
        return false;
    }
    match crate::handoff::pass_to_kernel(g, *s) {
        Ok(()) => true,
        Err(why) => {
            crate::rt::debug!(g, "canal: handle {:#x} stays canal's ({why})\n", s.handle);
            false
        }
    }
}

/// Held while a socket is decided: two threads making a first call on one socket at
/// once (two connects) must not both make it a canal socket. Only first uses wait.
static DECIDING: crate::rt::Locked<()> = crate::rt::Locked::new(());

/// Runs a decision under the re-entry guard, with the guest, one at a time (`settle`
/// looks at the table again inside); a panic leaves the socket the kernel's.
fn decide_guarded(fd: c_int, f: impl FnOnce(&'static Guest)) {
    let Some(_r) = crate::hooks::common::Reentry::enter() else {
        return;
    };
    let Some(g) = crate::conn::guest::guest() else {
        settle_kernel(fd);
        return;
    };
    let ok = DECIDING.with(|_| std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(g))));
    if ok.is_err() {
        settle_kernel(fd);
    }
}

/// Decides undecided socket `fd` at its first use: after this it is a canal socket
/// or not the library's at all, and the hook dispatches on that. The caller holds the
/// re-entry guard. A canal socket that cannot be made leaves it the kernel's (the
/// program's call then goes on natively, as it would without canal).
fn settle(g: &'static Guest, fd: c_int, what: Use) {
    let Some(Entry::Undecided(k)) = TABLE.get(fd) else {
        return;
    };
    let kind = Kind(k);
    let canal = match what {
        Use::Serve(a) => !a.is_some_and(crate::policy::excluded),
        Use::Reach(a) => {
            let canal = !crate::policy::excluded(a) && canal_port(g, kind.dgram(), a.port);
            if !kind.dgram() {
                stream_connects(canal, false);
            }
            canal
        }
    };
    if canal {
        if let Err(e) = to_canal(g, fd, kind) {
            crate::rt::debug!(g, "canal: fd {fd} stays a kernel socket (errno {e})\n");
        }
    }
    // Still undecided only if it stayed the kernel's.
    settle_kernel(fd);
}

/// Puts a canal socket of `kind` in place of kernel socket `fd`, with its blocking
/// mode, close-on-exec flag and the options set so far.
fn to_canal(g: &'static Guest, fd: c_int, kind: Kind) -> Result<(), i32> {
    let nonblock = sys::fcntl_int(fd, libc::F_GETFL, 0)? as c_int & libc::O_NONBLOCK != 0;
    let cloexec = sys::fcntl_int(fd, libc::F_GETFD, 0)? as c_int & libc::FD_CLOEXEC != 0;
    let nfd = crate::sock::create::socket(
        g,
        kind.domain(),
        kind.base(),
        kind.proto(),
        nonblock,
        cloexec,
    )?;
    let Some(h) = TABLE.handle(nfd) else {
        return Err(libc::EIO);
    };
    let s = crate::sock::core::Sock::new(g, h)?;
    for (level, name, v) in &SAVED.take(fd) {
        // The kernel took each of them already: canal takes what it keeps.
        let _ = crate::sock::opts::setsockopt(s, *level, *name, v);
        crate::policy::record_option(&s, *level, *name, v);
    }
    // No WATCH is put on these numbers while the dummy moves (sock/watch.rs).
    let held = crate::sock::watch::hold();
    TABLE.take(fd);
    TABLE.take(nfd);
    let r = sys::replace_fd(nfd, fd);
    let _ = sys::close(nfd);
    match r {
        Ok(()) => {
            let _ = TABLE.set_canal(fd, h);
            drop(held);
            crate::rt::debug!(g, "canal: fd {fd} -> handle {h:#x} (a canal port)\n");
            Ok(())
        }
        Err(e) => {
            drop(held);
            crate::sock::close::release(g, h);
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kind_keeps_family_type_and_protocol() {
        let k = Kind::new(libc::AF_INET6, libc::SOCK_DGRAM, libc::IPPROTO_UDP);
        assert_eq!(
            (k.domain(), k.base(), k.proto()),
            (libc::AF_INET6, libc::SOCK_DGRAM, 17)
        );
        let k = Kind::new(libc::AF_INET, libc::SOCK_STREAM, 0);
        assert_eq!(
            (k.domain(), k.base(), k.proto()),
            (libc::AF_INET, libc::SOCK_STREAM, 0)
        );
    }
}
