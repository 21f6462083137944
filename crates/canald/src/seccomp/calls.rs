//! One handler per notified system call (x86-64 arguments). Each reads what it needs
//! from the program (its descriptor by pidfd_getfd, its memory by process_vm_readv),
//! performs the call on the host's side through the network's view, and answers.
use super::ctx::{Ctx, MAX_BLOCKED};
use super::filter::nr;
use crate::guest::addr_view::{is_loopback, translate_guest_addr, translate_guest_bind};
use crate::guest::addr_view::{translate_host_addr, translate_host_local, translate_host_peer};
use crate::guest::netview::{in_family, is_plain_v6, is_resolver, is_v4, PROTO_TCP, PROTO_UDP};
use crate::sys::{self, Notif};
use canal_abi::{errno, CanalAddr};
use std::cell::RefCell;
use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// How a call is answered.
enum Reply {
    Value(i64),
    Errno(i32),
    /// Run it as the program made it (a descriptor that is not a host socket).
    Continue,
    /// Answered already (ADDFD with SECCOMP_ADDFD_FLAG_SEND).
    Done,
}

/// The calling thread, pinned: a pidfd taken while the notification was pending.
struct Caller {
    pid: u32,
    pidfd: OwnedFd,
    /// The descriptor `blocks` already took (number, host socket or not), for the
    /// handler to use instead of taking it again.
    taken: RefCell<Option<(i32, Option<OwnedFd>)>>,
}

type Res<T> = Result<T, i32>;

fn errno_of(e: std::io::Error) -> i32 {
    sys::errno_of(&e)
}

pub(super) fn handle(ctx: &Arc<Ctx>, n: Notif) {
    let pidfd = match sys::pidfd_of_thread(n.pid) {
        Ok(p) => p,
        Err(e) => {
            // Gone, or canald out of descriptors: a caller still waiting gets an error.
            answer(ctx, n.id, Reply::Errno(sys::errno_of(&e)));
            return;
        }
    };
    if !sys::notif_valid(&ctx.listener, n.id) {
        return; // the pid may name another task now
    }
    let c = Caller {
        pid: n.pid,
        pidfd,
        taken: RefCell::new(None),
    };
    if blocks(ctx, &c, &n) {
        if ctx.blocked.fetch_add(1, Ordering::AcqRel) >= MAX_BLOCKED {
            ctx.blocked.fetch_sub(1, Ordering::AcqRel);
            answer(ctx, n.id, Reply::Errno(errno::EAGAIN));
            return;
        }
        let t = ctx.clone();
        let spawned = std::thread::Builder::new()
            .name("canald-seccomp-call".into())
            .spawn(move || {
                let r = dispatch(&t, &c, &n);
                answer(&t, n.id, r);
                t.blocked.fetch_sub(1, Ordering::AcqRel);
            });
        if spawned.is_err() {
            // Nothing ran: the caller gets EAGAIN.
            ctx.blocked.fetch_sub(1, Ordering::AcqRel);
            answer(ctx, n.id, Reply::Errno(errno::EAGAIN));
        }
        return;
    }
    let r = dispatch(ctx, &c, &n);
    answer(ctx, n.id, r);
}

fn answer(ctx: &Ctx, id: u64, r: Reply) {
    let s = &ctx.net.served;
    s.calls.fetch_add(1, Ordering::Relaxed);
    let _ = match r {
        Reply::Value(v) => sys::notif_send(&ctx.listener, id, Ok(v)),
        Reply::Errno(e) => {
            s.errors.fetch_add(1, Ordering::Relaxed);
            sys::notif_send(&ctx.listener, id, Err(e))
        }
        Reply::Continue => {
            s.passed.fetch_add(1, Ordering::Relaxed);
            sys::notif_continue(&ctx.listener, id)
        }
        Reply::Done => Ok(()),
    };
}

fn dispatch(ctx: &Ctx, c: &Caller, n: &Notif) -> Reply {
    let a = n.args;
    let r = match n.nr {
        nr::SOCKET => socket(ctx, n, a[0] as i32, a[1] as i32, a[2] as i32),
        nr::CONNECT => connect(ctx, c, n, a[0] as i32, a[1], a[2]),
        nr::BIND => bind(ctx, c, n, a[0] as i32, a[1], a[2]),
        nr::ACCEPT => accept(ctx, c, n, a[0] as i32, a[1], a[2], 0),
        nr::ACCEPT4 => accept(ctx, c, n, a[0] as i32, a[1], a[2], a[3] as i32),
        nr::GETSOCKNAME | nr::GETPEERNAME => name(ctx, c, n, a[0] as i32, a[1], a[2]),
        nr::SENDTO => sendto(ctx, c, n, a),
        nr::RECVFROM => recvfrom(ctx, c, n, a),
        nr::SENDMSG => sendmsg(ctx, c, n, a),
        nr::RECVMSG => recvmsg(ctx, c, n, a),
        nr::SENDMMSG => sendmmsg(ctx, c, n, a),
        nr::RECVMMSG => recvmmsg(ctx, c, n, a),
        nr::SETSOCKOPT => set_v6only(ctx, c, a[0] as i32, a[3], a[4]),
        nr::GETSOCKOPT => get_v6only(ctx, c, a[0] as i32, a[3], a[4]),
        _ => Ok(Reply::Continue),
    };
    r.unwrap_or_else(Reply::Errno)
}

/// Whether the call may block (a blocking socket waiting for a peer): it is served on
/// a thread of its own.
fn blocks(ctx: &Ctx, c: &Caller, n: &Notif) -> bool {
    let fd = n.args[0] as i32;
    let waits = match n.nr {
        nr::CONNECT | nr::ACCEPT | nr::ACCEPT4 => true,
        nr::RECVFROM => n.args[3] as i32 & libc::MSG_DONTWAIT == 0,
        nr::RECVMSG => n.args[2] as i32 & libc::MSG_DONTWAIT == 0,
        nr::RECVMMSG => n.args[3] as i32 & libc::MSG_DONTWAIT == 0,
        _ => false,
    };
    if !waits {
        return false;
    }
    let Ok(s) = host_socket(ctx, c, fd) else {
        return false; // the handler takes it again and reports the error
    };
    let blocking = s
        .as_ref()
        .is_some_and(|s| sys::status_flags(s).is_ok_and(|f| f & libc::O_NONBLOCK == 0));
    *c.taken.borrow_mut() = Some((fd, s));
    blocking
}

/// The program's descriptor `fd` if it is a host socket (ours); None for anything
/// else (its own namespace's sockets, files, Unix sockets).
fn host_socket(ctx: &Ctx, c: &Caller, fd: i32) -> Res<Option<OwnedFd>> {
    if let Some((f, s)) = c.taken.borrow_mut().take() {
        if f == fd {
            return Ok(s);
        }
    }
    let s = sys::take_fd(&c.pidfd, fd).map_err(errno_of)?;
    match sys::netns_cookie(&s) {
        Ok(k) if k == ctx.own_cookie => Ok(Some(s)),
        _ => Ok(None),
    }
}

/// The program's descriptor `fd` if it is a host datagram socket — where an address in
/// a send or a source on a receive is the network's to translate; None for a stream
/// (which ignores the address: the kernel's own call runs) and for anything not ours.
fn host_datagram(ctx: &Ctx, c: &Caller, fd: i32) -> Res<Option<OwnedFd>> {
    Ok(host_socket(ctx, c, fd)?.filter(|s| proto_of(s) != PROTO_TCP))
}

fn proto_of(s: &OwnedFd) -> u8 {
    match sys::sockopt_int(s, libc::SOL_SOCKET, libc::SO_TYPE) {
        Ok(libc::SOCK_DGRAM) => PROTO_UDP,
        _ => PROTO_TCP,
    }
}

/// The network's private loopback as a socket of `family` names it, any port.
fn own_source(ctx: &Ctx, family: u16) -> CanalAddr {
    let like = CanalAddr {
        family,
        ..Default::default()
    };
    in_family(&like, ctx.net.lo, 0)
}

fn read_addr(c: &Caller, p: u64, len: u64) -> Res<CanalAddr> {
    if len > 128 {
        return Err(errno::EINVAL);
    }
    let b = sys::vm_read(c.pid, p, len as usize).map_err(|_| errno::EFAULT)?;
    sys::addr_from_bytes(&b).ok_or(
        if b.len() >= 2 && b[0] as i32 != libc::AF_INET && b[0] as i32 != libc::AF_INET6 {
            libc::EAFNOSUPPORT
        } else {
            errno::EINVAL
        },
    )
}

/// Writes `a` into the program's (`p`, `lenp`) pair as the kernel would: at most the
/// room it gave, and the full length back.
fn write_addr(c: &Caller, p: u64, lenp: u64, a: &CanalAddr) -> Res<()> {
    if p == 0 || lenp == 0 {
        return Ok(());
    }
    let room = sys::vm_read(c.pid, lenp, 4).map_err(|_| errno::EFAULT)?;
    let room = u32::from_ne_bytes(room.try_into().map_err(|_| errno::EFAULT)?) as usize;
    let b = sys::addr_to_bytes(a);
    sys::vm_write(c.pid, p, &b[..b.len().min(room)]).map_err(|_| errno::EFAULT)?;
    sys::vm_write(c.pid, lenp, &(b.len() as u32).to_ne_bytes()).map_err(|_| errno::EFAULT)
}

/// socket(AF_INET/AF_INET6, STREAM/DGRAM): a host socket, bound to the network's
/// private loopback from birth (the invariant, mod.rs), installed in the program.
fn socket(ctx: &Ctx, n: &Notif, domain: i32, ty: i32, proto: i32) -> Res<Reply> {
    let base = ty & !(libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC);
    if base != libc::SOCK_STREAM && base != libc::SOCK_DGRAM {
        return Ok(Reply::Continue); // raw, packet…: the namespace's own, empty, network
    }
    let s =
        sys::socket_like(domain, base, proto, ty & libc::SOCK_NONBLOCK != 0).map_err(errno_of)?;
    sys::bind(&s, &own_source(ctx, domain as u16)).map_err(errno_of)?;
    sys::notif_addfd(
        &ctx.listener,
        n.id,
        &s,
        None,
        ty & libc::SOCK_CLOEXEC != 0,
        true,
    )
    .map_err(errno_of)?;
    ctx.net.served.sockets.fetch_add(1, Ordering::Relaxed);
    let proto = if base == libc::SOCK_DGRAM {
        PROTO_UDP
    } else {
        PROTO_TCP
    };
    ctx.net.served.installed.add(&s, proto, None, false);
    Ok(Reply::Done)
}

/// Options a program may have set before bind or connect, carried to the socket that
/// replaces its first one.
const CARRIED: [(i32, i32); 10] = [
    (libc::SOL_SOCKET, libc::SO_REUSEADDR),
    (libc::SOL_SOCKET, libc::SO_REUSEPORT),
    (libc::SOL_SOCKET, libc::SO_KEEPALIVE),
    (libc::SOL_SOCKET, libc::SO_BROADCAST),
    (libc::SOL_SOCKET, libc::SO_PRIORITY),
    (libc::IPPROTO_TCP, libc::TCP_NODELAY),
    (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE),
    (libc::IPPROTO_TCP, libc::TCP_KEEPINTVL),
    (libc::IPPROTO_TCP, libc::TCP_KEEPCNT),
    (libc::IPPROTO_IP, libc::IP_TOS),
];

/// A fresh, unbound socket like `s` (domain, type, protocol, O_NONBLOCK, the options
/// above and SO_LINGER).
fn fresh_like(s: &OwnedFd) -> Res<OwnedFd> {
    let opt = |l, n| sys::sockopt_int(s, l, n).map_err(errno_of);
    let (d, t, p) = (
        opt(libc::SOL_SOCKET, libc::SO_DOMAIN)?,
        opt(libc::SOL_SOCKET, libc::SO_TYPE)?,
        opt(libc::SOL_SOCKET, libc::SO_PROTOCOL)?,
    );
    let nonblock = sys::status_flags(s).map_err(errno_of)? & libc::O_NONBLOCK != 0;
    let f = sys::socket_like(d, t, p, nonblock).map_err(errno_of)?;
    for (l, n) in CARRIED {
        if let Ok(v) = sys::sockopt_int(s, l, n) {
            let _ = sys::setsockopt_bytes(&f, l, n, &v.to_ne_bytes());
        }
    }
    let mut linger = [0u8; 8];
    if let Ok(k) = sys::getsockopt_bytes(s, libc::SOL_SOCKET, libc::SO_LINGER, &mut linger) {
        let _ = sys::setsockopt_bytes(&f, libc::SOL_SOCKET, libc::SO_LINGER, &linger[..k]);
    }
    Ok(f)
}

/// Puts `s` at the program's descriptor number `fd` (keeping its close-on-exec flag),
/// recording the name the program bound it to, if it did, and its IPV6_V6ONLY.
fn install_at(
    ctx: &Ctx,
    c: &Caller,
    n: &Notif,
    fd: i32,
    s: &OwnedFd,
    (name, v6only): (Option<CanalAddr>, bool),
) -> Res<()> {
    let cloexec = std::fs::read_to_string(format!("/proc/{}/fdinfo/{fd}", c.pid))
        .ok()
        .and_then(|t| {
            let f = t.lines().find_map(|l| l.strip_prefix("flags:"))?;
            i64::from_str_radix(f.trim(), 8).ok()
        })
        .is_some_and(|f| f & libc::O_CLOEXEC as i64 != 0);
    sys::notif_addfd(&ctx.listener, n.id, s, Some(fd as u32), cloexec, false).map_err(errno_of)?;
    ctx.net.served.replaced.fetch_add(1, Ordering::Relaxed);
    ctx.net.served.installed.add(s, proto_of(s), name, v6only);
    Ok(())
}

/// Whether `s` is as `socket()` made it: on `lo`, not bound by the program.
fn born_here(ctx: &Ctx, s: &OwnedFd) -> bool {
    sys::sockname(s).is_ok_and(|a| is_v4(&a, ctx.net.lo))
        && ctx.net.served.installed.name_of(s).is_none()
}

/// Whether `s`, on the private loopback, keeps its address for host destination
/// `dst` outside the network: when the program bound it (its port is the program's)
/// and `dst` is on the host's loopback, which a private source reaches. The host then
/// sees the private address and that port, and a datagram socket takes the replies
/// (`guest::contacts`). Elsewhere a loopback source cannot go.
fn keeps_port(ctx: &Ctx, s: &OwnedFd, dst: &CanalAddr) -> bool {
    is_loopback(dst) && ctx.net.served.installed.name_of(s).is_some()
}

/// Whether `s` is still bound to the network's private loopback (or its IPv6-only
/// twin).
fn at_private(ctx: &Ctx, s: &OwnedFd) -> bool {
    sys::sockname(s).is_ok_and(|a| is_v4(&a, ctx.net.lo) || is_v4(&a, ctx.net.lo6()))
}

fn connect(ctx: &Ctx, c: &Caller, n: &Notif, fd: i32, p: u64, len: u64) -> Res<Reply> {
    let Some(mut s) = host_socket(ctx, c, fd)? else {
        return Ok(Reply::Continue);
    };
    let head = sys::vm_read(c.pid, p, 2.min(len as usize)).map_err(|_| errno::EFAULT)?;
    if head.len() == 2 && u16::from_ne_bytes([head[0], head[1]]) == libc::AF_UNSPEC as u16 {
        return sys::disconnect(&s)
            .map(|_| Reply::Value(0))
            .map_err(errno_of);
    }
    let a = read_addr(c, p, len)?;
    let v6only = ctx.net.served.installed.v6only_of(&s);
    let d = translate_guest_addr(&ctx.view(), &a, proto_of(&s), v6only)?;
    if !d.own && at_private(ctx, &s) && !keeps_port(ctx, &s, &d.addr) {
        // Not the network's own: from an unbound socket, as the kernel picks (the host
        // then sees 127.0.0.1 or its own address, as from any canal guest).
        let f = fresh_like(&s)?;
        install_at(ctx, c, n, fd, &f, (None, v6only))?;
        s = f;
    } else if d.own && is_plain_v6(&a) && born_here(ctx, &s) {
        // An IPv6 destination of its own network: from the IPv6 twin, so the peer
        // sees ::1 as natively (`NetView::own_source`).
        let f = fresh_like(&s)?;
        sys::bind(&f, &ctx.net.own_source(&d.addr, true)).map_err(errno_of)?;
        install_at(ctx, c, n, fd, &f, (None, v6only))?;
        s = f;
    }
    // Before the connect: a non-blocking one (Go's) asks for its peer once it is done.
    ctx.net
        .served
        .installed
        .set_via_resolver(&s, is_resolver(&a));
    match sys::connect(&s, &d.addr) {
        Ok(()) => {
            if !d.own && proto_of(&s) == PROTO_UDP {
                ctx.net.served.installed.note_contact(&s, &d.addr);
            }
            Ok(Reply::Value(0))
        }
        Err(e) => Err(errno_of(e)),
    }
}

fn bind(ctx: &Ctx, c: &Caller, n: &Notif, fd: i32, p: u64, len: u64) -> Res<Reply> {
    let Some(s) = host_socket(ctx, c, fd)? else {
        return Ok(Reply::Continue);
    };
    let a = read_addr(c, p, len)?;
    let v6only = ctx.net.served.installed.v6only_of(&s);
    let host = translate_guest_bind(&ctx.view(), &a, proto_of(&s), v6only)?;
    let f = fresh_like(&s)?;
    sys::bind(&f, &host).map_err(errno_of)?;
    let mut name = a;
    if name.port == 0 {
        name.port = sys::sockname(&f).map_or(0, |b| b.port);
    }
    install_at(ctx, c, n, fd, &f, (Some(name), v6only))?;
    Ok(Reply::Value(0))
}

fn name(ctx: &Ctx, c: &Caller, n: &Notif, fd: i32, p: u64, lenp: u64) -> Res<Reply> {
    let Some(s) = host_socket(ctx, c, fd)? else {
        return Ok(Reply::Continue);
    };
    let view = ctx.view();
    let a = if n.nr == nr::GETSOCKNAME {
        let peer = sys::peername(&s).ok();
        match ctx
            .net
            .served
            .installed
            .name_of(&s)
            .filter(|_| peer.is_none())
        {
            Some(b) => b,
            None => {
                let local = sys::sockname(&s).map_err(errno_of)?;
                translate_host_local(&view, &local, peer.as_ref())
            }
        }
    } else {
        let local = sys::sockname(&s).ok();
        let peer = sys::peername(&s).map_err(errno_of)?;
        let via_resolver =
            ctx.net.is_resolver_host(&peer) && ctx.net.served.installed.via_resolver(&s);
        translate_host_peer(&view, &peer, local.as_ref(), via_resolver)
    };
    write_addr(c, p, lenp, &a)?;
    Ok(Reply::Value(0))
}

/// Whether a connection or datagram from `peer` may reach a socket bound at `local`
/// on the private loopback: only from the network's own sockets, or (a datagram)
/// when `replied()`: the socket sent to `peer` (`guest::contacts`). That is asked
/// before the network's sockets, whose last resort is a sock_diag lookup.
fn admitted(
    ctx: &Ctx,
    proto: u8,
    local: &CanalAddr,
    peer: &CanalAddr,
    replied: impl FnOnce() -> bool,
) -> bool {
    !is_v4(local, ctx.net.lo) || replied() || ctx.net.admits_any(proto, peer, || Some(*local))
}

#[allow(clippy::too_many_arguments)]
fn accept(ctx: &Ctx, c: &Caller, n: &Notif, fd: i32, p: u64, lenp: u64, flags: i32) -> Res<Reply> {
    let Some(s) = host_socket(ctx, c, fd)? else {
        return Ok(Reply::Continue);
    };
    let local = sys::sockname(&s).map_err(errno_of)?;
    let blocking = sys::status_flags(&s).map_err(errno_of)? & libc::O_NONBLOCK == 0;
    loop {
        if blocking {
            // Wait here, checking the caller still waits: a thread blocked in accept
            // would hold the listener (and its port) after the program closed it.
            if !sys::wait_readable(&s, 1000).unwrap_or(true) {
                if !sys::notif_valid(&ctx.listener, n.id) {
                    return Ok(Reply::Done);
                }
                continue;
            }
        }
        let (conn, peer) =
            sys::accept_flags(&s, (flags & libc::SOCK_NONBLOCK) | libc::SOCK_CLOEXEC)
                .map_err(errno_of)?;
        let peer = peer.unwrap_or_default();
        if !admitted(ctx, PROTO_TCP, &local, &peer, || false) {
            let _ = sys::set_abortive_close(&conn, true);
            continue;
        }
        if !sys::notif_valid(&ctx.listener, n.id) {
            return Ok(Reply::Done); // the caller went away: the connection closes
        }
        write_addr(c, p, lenp, &translate_host_addr(&ctx.view(), &peer, false))?;
        let cloexec = flags & libc::SOCK_CLOEXEC != 0;
        sys::notif_addfd(&ctx.listener, n.id, &conn, None, cloexec, true).map_err(errno_of)?;
        ctx.net.served.sockets.fetch_add(1, Ordering::Relaxed);
        // An accepted socket inherits its listener's IPV6_V6ONLY, as natively.
        let v6only = ctx.net.served.installed.v6only_of(&s);
        ctx.net.served.installed.add(&conn, PROTO_TCP, None, v6only);
        return Ok(Reply::Done);
    }
}

/// Largest datagram or chunk read from or written to the program in one call.
const MAX_IO: usize = 1 << 20;

/// Where a datagram to `to` goes on host socket `s` (descriptor `fd` of the program):
/// None if it is lost (an own port nobody holds, as natively). A socket still on the
/// private loopback that sends outside the network is replaced by a fresh one first,
/// unless it keeps its port (`keeps_port`).
fn datagram_dest(
    ctx: &Ctx,
    c: &Caller,
    n: &Notif,
    fd: i32,
    s: &mut OwnedFd,
    to: &CanalAddr,
) -> Res<Option<CanalAddr>> {
    let v6only = ctx.net.served.installed.v6only_of(s);
    let d = match translate_guest_addr(&ctx.view(), to, PROTO_UDP, v6only) {
        Ok(d) => d,
        Err(e) if e == errno::ECONNREFUSED => return Ok(None),
        Err(e) => return Err(e),
    };
    if !d.own && at_private(ctx, s) {
        if keeps_port(ctx, s, &d.addr) {
            ctx.net.served.installed.note_contact(s, &d.addr);
        } else {
            let f = fresh_like(s)?;
            install_at(ctx, c, n, fd, &f, (None, v6only))?;
            *s = f;
        }
    }
    if is_resolver(to) {
        ctx.net.served.installed.set_via_resolver(s, true);
    }
    Ok(Some(d.addr))
}

fn sendto(ctx: &Ctx, c: &Caller, n: &Notif, a: [u64; 6]) -> Res<Reply> {
    let fd = a[0] as i32;
    let Some(mut s) = host_datagram(ctx, c, fd)? else {
        return Ok(Reply::Continue);
    };
    let to = read_addr(c, a[4], a[5])?;
    let Some(dest) = datagram_dest(ctx, c, n, fd, &mut s, &to)? else {
        return Ok(Reply::Value(a[2] as i64));
    };
    let data = sys::vm_read(c.pid, a[1], (a[2] as usize).min(MAX_IO)).map_err(|_| errno::EFAULT)?;
    sys::send_to(&s, &data, a[3] as i32 | libc::MSG_NOSIGNAL, Some(&dest))
        .map(|k| Reply::Value(k as i64))
        .map_err(errno_of)
}

/// Waits (when `blocking`) and receives with `recv` until a datagram the network
/// admits arrives: Ok(None) when the caller stopped waiting (a signal, its exit).
fn recv_admitted<T>(
    ctx: &Ctx,
    n: &Notif,
    s: &OwnedFd,
    blocking: bool,
    mut recv: impl FnMut() -> std::io::Result<(T, Option<CanalAddr>)>,
) -> Res<Option<(T, CanalAddr)>> {
    let proto = proto_of(s);
    let local = sys::sockname(s).map_err(errno_of)?;
    loop {
        if blocking {
            // Wait here, then take the data only while the caller still waits for it.
            let _ = sys::wait_readable(s, 1000);
            if !sys::notif_valid(&ctx.listener, n.id) {
                return Ok(None);
            }
        }
        let (v, src) = match recv() {
            Ok(r) => r,
            Err(e) if blocking && e.raw_os_error() == Some(libc::EAGAIN) => continue,
            Err(e) => return Err(errno_of(e)),
        };
        let src = src.unwrap_or_default();
        let replied = || ctx.net.served.installed.contacted(s, &src);
        if proto == PROTO_UDP && !admitted(ctx, PROTO_UDP, &local, &src, replied) {
            continue; // from outside the network to a private port, not a reply
        }
        // The table is asked (a lock and an fstat) only for the resolver's datagrams.
        let via_resolver =
            ctx.net.is_resolver_host(&src) && ctx.net.served.installed.via_resolver(s);
        return Ok(Some((
            v,
            translate_host_addr(&ctx.view(), &src, via_resolver),
        )));
    }
}

/// Whether a receive on `s` with `flags` waits.
fn waits(s: &OwnedFd, flags: i32) -> Res<bool> {
    Ok(
        sys::status_flags(s).map_err(errno_of)? & libc::O_NONBLOCK == 0
            && flags & libc::MSG_DONTWAIT == 0,
    )
}

fn recvfrom(ctx: &Ctx, c: &Caller, n: &Notif, a: [u64; 6]) -> Res<Reply> {
    let Some(s) = host_socket(ctx, c, a[0] as i32)? else {
        return Ok(Reply::Continue);
    };
    let flags = a[3] as i32;
    let mut buf = vec![0u8; (a[2] as usize).min(MAX_IO)];
    let got = recv_admitted(ctx, n, &s, waits(&s, flags)?, || {
        sys::recv_from(&s, &mut buf, flags | libc::MSG_DONTWAIT)
    })?;
    let Some((k, src)) = got else {
        return Ok(Reply::Done);
    };
    sys::vm_write(c.pid, a[1], &buf[..k.min(buf.len())]).map_err(|_| errno::EFAULT)?;
    write_addr(c, a[4], a[5], &src)?;
    Ok(Reply::Value(k as i64))
}

/// A program's `struct msghdr` (x86-64 layout: name, namelen, iov, iovlen, control,
/// controllen, flags at 0, 8, 16, 24, 32, 40, 48).
struct MsgHdr {
    name: u64,
    namelen: u64,
    iov: Vec<(u64, usize)>,
    control: u64,
    controllen: usize,
}

const MSGHDR_SIZE: usize = 56;
/// UIO_MAXIOV: more iovecs than this is EMSGSIZE, as the kernel says.
const MAX_IOV: u64 = 1024;
/// Ancillary data carried either way, at most (the kernel's optmem default).
const MAX_CONTROL: usize = 20480;

fn read_msghdr(c: &Caller, p: u64) -> Res<MsgHdr> {
    let b = sys::vm_read(c.pid, p, MSGHDR_SIZE).map_err(|_| errno::EFAULT)?;
    let at = |o: usize| {
        b.get(o..o + 8)
            .map_or(0, |w| u64::from_ne_bytes(w.try_into().unwrap_or_default()))
    };
    if b.len() < MSGHDR_SIZE {
        return Err(errno::EFAULT);
    }
    let (iov, iovlen) = (at(16), at(24));
    if iovlen > MAX_IOV {
        return Err(libc::EMSGSIZE);
    }
    let raw = sys::vm_read(c.pid, iov, 16 * iovlen as usize).map_err(|_| errno::EFAULT)?;
    let iov = raw
        .chunks_exact(16)
        .map(|e| {
            let base = u64::from_ne_bytes(e[..8].try_into().unwrap_or_default());
            let len = u64::from_ne_bytes(e[8..].try_into().unwrap_or_default());
            (base, len.min(MAX_IO as u64) as usize)
        })
        .collect();
    Ok(MsgHdr {
        name: at(0),
        namelen: at(8) & 0xffff_ffff,
        iov,
        control: at(32),
        controllen: (at(40) as usize).min(MAX_CONTROL),
    })
}

/// sendmsg on a datagram host socket with an address: translated as sendto's, the
/// data gathered from the program's iovecs, its ancillary data passed on.
fn sendmsg(ctx: &Ctx, c: &Caller, n: &Notif, a: [u64; 6]) -> Res<Reply> {
    let fd = a[0] as i32;
    let Some(mut s) = host_datagram(ctx, c, fd)? else {
        return Ok(Reply::Continue);
    };
    let m = read_msghdr(c, a[1])?;
    if m.name == 0 {
        return Ok(Reply::Continue); // connected: the kernel sends to its (translated) peer
    }
    send_one(ctx, c, n, fd, &mut s, &m, a[2] as i32).map(|k| Reply::Value(k as i64))
}

/// Sends one message of the program's (`m`) on datagram host socket `s`: its address
/// translated as sendto's (none: the connected peer), its iovecs gathered, its
/// ancillary data passed on. The bytes sent (all of them for a datagram the network
/// drops, as natively for an own port nobody holds).
fn send_one(
    ctx: &Ctx,
    c: &Caller,
    n: &Notif,
    fd: i32,
    s: &mut OwnedFd,
    m: &MsgHdr,
    flags: i32,
) -> Res<usize> {
    let mut data = Vec::new();
    for &(base, len) in &m.iov {
        if data.len() + len > MAX_IO {
            return Err(libc::EMSGSIZE);
        }
        data.extend(sys::vm_read(c.pid, base, len).map_err(|_| errno::EFAULT)?);
    }
    let dest = match m.name {
        0 => None,
        p => match datagram_dest(ctx, c, n, fd, s, &read_addr(c, p, m.namelen)?)? {
            Some(d) => Some(d),
            None => return Ok(data.len()),
        },
    };
    let control = match m.controllen {
        0 => Vec::new(),
        k => sys::vm_read(c.pid, m.control, k).map_err(|_| errno::EFAULT)?,
    };
    sys::send_msg(
        s,
        &data,
        &control,
        flags | libc::MSG_NOSIGNAL,
        dest.as_ref(),
    )
    .map_err(errno_of)
}

/// A `struct mmsghdr` (x86-64): a msghdr, then msg_len (u32) at 56; 64 bytes.
const MMSGHDR_SIZE: u64 = 64;
const MSG_LEN_AT: u64 = 56;

/// sendmmsg on a datagram host socket with an address in any of its messages: each
/// sent as sendmsg's, its msg_len written back; the number sent, or the first
/// message's error (the kernel's rule: an error after the first ends the batch).
/// Without any address the kernel sends to the (translated) peer itself.
fn sendmmsg(ctx: &Ctx, c: &Caller, n: &Notif, a: [u64; 6]) -> Res<Reply> {
    let fd = a[0] as i32;
    let Some(mut s) = host_datagram(ctx, c, fd)? else {
        return Ok(Reply::Continue);
    };
    let vlen = a[2].min(MAX_IOV); // UIO_MAXIOV, as the kernel caps it
    let mut msgs = Vec::new();
    for i in 0..vlen {
        match read_msghdr(c, a[1] + i * MMSGHDR_SIZE) {
            Ok(m) => msgs.push(m),
            Err(e) if i == 0 => return Err(e),
            Err(_) => break,
        }
    }
    if msgs.iter().all(|m| m.name == 0) {
        return Ok(Reply::Continue);
    }
    let mut sent = 0u64;
    for (i, m) in msgs.iter().enumerate() {
        let r = send_one(ctx, c, n, fd, &mut s, m, a[3] as i32).and_then(|k| {
            let at = a[1] + i as u64 * MMSGHDR_SIZE + MSG_LEN_AT;
            sys::vm_write(c.pid, at, &(k as u32).to_ne_bytes()).map_err(|_| errno::EFAULT)
        });
        match r {
            Ok(()) => sent += 1,
            Err(e) if sent == 0 => return Err(e),
            Err(_) => break,
        }
    }
    Ok(Reply::Value(sent as i64))
}

/// recvmsg on a datagram host socket: admitted as recvfrom's, scattered into the
/// program's iovecs, its source in the network's view, ancillary data and flags back.
fn recvmsg(ctx: &Ctx, c: &Caller, n: &Notif, a: [u64; 6]) -> Res<Reply> {
    let Some(s) = host_datagram(ctx, c, a[0] as i32)? else {
        return Ok(Reply::Continue);
    };
    let m = read_msghdr(c, a[1])?;
    let flags = a[2] as i32;
    let room: usize = m.iov.iter().map(|v| v.1).sum::<usize>().min(MAX_IO);
    let mut buf = vec![0u8; room];
    let got = recv_admitted(ctx, n, &s, waits(&s, flags)?, || {
        sys::recv_msg(&s, &mut buf, m.controllen, flags | libc::MSG_DONTWAIT).map(|r| {
            let src = r.src;
            (r, src)
        })
    })?;
    let Some((r, src)) = got else {
        return Ok(Reply::Done);
    };
    deliver(c, a[1], &m, &buf, &r, &src)?;
    Ok(Reply::Value(r.len as i64))
}

/// Writes one received datagram into the program's msghdr at `hdr` (`m`, as read):
/// the bytes scattered over its iovecs, the source in the network's view, the
/// ancillary data, msg_controllen and msg_flags.
fn deliver(
    c: &Caller,
    hdr: u64,
    m: &MsgHdr,
    buf: &[u8],
    r: &sys::MsgIn,
    src: &CanalAddr,
) -> Res<()> {
    let mut left = &buf[..r.len.min(buf.len())];
    for &(base, len) in &m.iov {
        let k = len.min(left.len());
        if k == 0 {
            break;
        }
        sys::vm_write(c.pid, base, &left[..k]).map_err(|_| errno::EFAULT)?;
        left = &left[k..];
    }
    let fault = |_| errno::EFAULT;
    if m.name != 0 {
        write_addr(c, m.name, hdr + 8, src)?;
    }
    if m.controllen > 0 {
        sys::vm_write(c.pid, m.control, &r.control).map_err(fault)?;
    }
    sys::vm_write(c.pid, hdr + 40, &(r.control.len() as u64).to_ne_bytes()).map_err(fault)?;
    sys::vm_write(c.pid, hdr + 48, &r.flags.to_ne_bytes()).map_err(fault)
}

/// recvmmsg on a datagram host socket: each message as recvmsg's (admitted, its
/// source in the network's view), its msg_len written back. As the kernel: the first
/// waits unless the socket or MSG_DONTWAIT says not; later ones wait too unless
/// MSG_WAITFORONE, and the timeout is looked at after each datagram; an error after
/// the first ends the batch with the count received.
fn recvmmsg(ctx: &Ctx, c: &Caller, n: &Notif, a: [u64; 6]) -> Res<Reply> {
    let Some(s) = host_datagram(ctx, c, a[0] as i32)?.filter(|_| a[2] > 0) else {
        return Ok(Reply::Continue);
    };
    let flags = a[3] as i32;
    let deadline = match a[4] {
        0 => None,
        p => {
            // vm_read gives all 16 bytes or EFAULT (a timespec only partly readable,
            // as the kernel's copy says), so both words are there.
            let t = sys::vm_read(c.pid, p, 16).map_err(|_| errno::EFAULT)?;
            let word = |o: usize| i64::from_ne_bytes(t[o..o + 8].try_into().unwrap_or_default());
            let (sec, nsec) = (word(0), word(8));
            if sec < 0 || !(0..1_000_000_000).contains(&nsec) {
                return Err(errno::EINVAL);
            }
            let d = std::time::Duration::new(sec as u64, nsec as u32);
            Some(std::time::Instant::now() + d)
        }
    };
    let mut blocking = waits(&s, flags)?;
    let mut got = 0u64;
    for i in 0..a[2].min(MAX_IOV) {
        if got > 0
            && (flags & libc::MSG_WAITFORONE != 0
                || deadline.is_some_and(|d| std::time::Instant::now() >= d))
        {
            blocking = false;
        }
        let hdr = a[1] + i * MMSGHDR_SIZE;
        let r = read_msghdr(c, hdr).and_then(|m| {
            let room: usize = m.iov.iter().map(|v| v.1).sum::<usize>().min(MAX_IO);
            let mut buf = vec![0u8; room];
            let rflags = (flags & !libc::MSG_WAITFORONE) | libc::MSG_DONTWAIT;
            let got = recv_admitted(ctx, n, &s, blocking, || {
                sys::recv_msg(&s, &mut buf, m.controllen, rflags).map(|r| {
                    let src = r.src;
                    (r, src)
                })
            })?;
            let Some((r, src)) = got else { return Ok(None) };
            deliver(c, hdr, &m, &buf, &r, &src)?;
            sys::vm_write(c.pid, hdr + MSG_LEN_AT, &(r.len as u32).to_ne_bytes())
                .map_err(|_| errno::EFAULT)?;
            Ok(Some(()))
        });
        match r {
            Ok(Some(())) => got += 1,
            Ok(None) if got == 0 => return Ok(Reply::Done), // the caller stopped waiting
            Err(e) if got == 0 => return Err(e),
            _ => break,
        }
    }
    Ok(Reply::Value(got as i64))
}

/// setsockopt(IPPROTO_IPV6, IPV6_V6ONLY) on a host AF_INET6 socket: kept for the
/// view (the host socket stays dual stack: the network's own addresses are
/// IPv4-mapped private ones, `NetView::lo6`), with the kernel's checks — at least an
/// int, and not once the program has bound or connected it (EINVAL).
fn set_v6only(ctx: &Ctx, c: &Caller, fd: i32, p: u64, len: u64) -> Res<Reply> {
    let Some(s) = host_inet6(ctx, c, fd)? else {
        return Ok(Reply::Continue);
    };
    if len < 4 {
        return Err(errno::EINVAL);
    }
    let v = sys::vm_read(c.pid, p, 4).map_err(|_| errno::EFAULT)?;
    let on = i32::from_ne_bytes(v.try_into().map_err(|_| errno::EFAULT)?) != 0;
    let installed = &ctx.net.served.installed;
    if installed.name_of(&s).is_some() || sys::peername(&s).is_ok() || !at_private(ctx, &s) {
        return Err(errno::EINVAL);
    }
    if !installed.set_v6only(&s, on) {
        return Ok(Reply::Continue); // not one canald installed: the kernel's own
    }
    Ok(Reply::Value(0))
}

/// getsockopt(IPPROTO_IPV6, IPV6_V6ONLY) on a host AF_INET6 socket: the program's.
fn get_v6only(ctx: &Ctx, c: &Caller, fd: i32, p: u64, lenp: u64) -> Res<Reply> {
    let Some(s) = host_inet6(ctx, c, fd)? else {
        return Ok(Reply::Continue);
    };
    let len = sys::vm_read(c.pid, lenp, 4).map_err(|_| errno::EFAULT)?;
    let len = i32::from_ne_bytes(len.try_into().map_err(|_| errno::EFAULT)?);
    if len < 0 {
        return Err(errno::EINVAL);
    }
    let v = i32::from(ctx.net.served.installed.v6only_of(&s)).to_ne_bytes();
    let n = (len as usize).min(4);
    sys::vm_write(c.pid, p, &v[..n]).map_err(|_| errno::EFAULT)?;
    sys::vm_write(c.pid, lenp, &(n as i32).to_ne_bytes()).map_err(|_| errno::EFAULT)?;
    Ok(Reply::Value(0))
}

/// The program's descriptor `fd` if it is a host AF_INET6 socket (for any other the
/// kernel answers IPv6 options itself).
fn host_inet6(ctx: &Ctx, c: &Caller, fd: i32) -> Res<Option<OwnedFd>> {
    Ok(host_socket(ctx, c, fd)?.filter(|s| {
        sys::sockopt_int(s, libc::SOL_SOCKET, libc::SO_DOMAIN).is_ok_and(|d| d == libc::AF_INET6)
    }))
}
