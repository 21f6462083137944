//! `canal run --isolate`: the program gets a network namespace of its own (and a user
//! namespace when not root, as rootless podman does) whose only interface is loopback,
//! and canald — outside — serves its sockets through the namespace's own address view
//! (docs/isolation.md). canal run stays outside as the parent: it registers the
//! namespace with canald (name, published ports) between the child's unshare and its
//! exec, forwards termination signals, and exits as the program did.
//!
//! The child: unshare(NEWNET | NEWNS [| NEWUSER]), map its own uid/gid, bring `lo` up,
//! bind a resolv.conf naming 10.0.2.3 over /etc/resolv.conf, tell the parent, wait for
//! the go-ahead, exec.

use std::ffi::CString;
use std::io::{self, Read, Write};
use std::net::{TcpListener, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicI32, Ordering};

/// What the parent needs to register the network.
pub(crate) struct Isolation<'a> {
    pub(crate) socket: &'a Path,
    pub(crate) name: String,
    pub(crate) publish: Vec<canald::guest::netview::Publish>,
    /// Serve programs LD_PRELOAD cannot reach (static, Go) by seccomp notification.
    pub(crate) seccomp: bool,
}

fn last_err(what: &str) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

fn pipe() -> io::Result<(std::fs::File, std::fs::File)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` is an array of two ints for the kernel to fill.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
        return Err(last_err("pipe"));
    }
    // SAFETY: two fresh descriptors owned by nobody else.
    Ok(unsafe {
        (
            std::fs::File::from_raw_fd(fds[0]),
            std::fs::File::from_raw_fd(fds[1]),
        )
    })
}

/// The resolver configuration inside: 10.0.2.3 (canald forwards it to the host's
/// resolver), keeping the host's search domains and options.
fn resolv_conf() -> String {
    let host = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
    let mut s = String::from("# canal run --isolate: canald forwards 10.0.2.3 to the host's resolver\nnameserver 10.0.2.3\n");
    for l in host.lines() {
        let w = l.split_whitespace().next().unwrap_or("");
        if matches!(w, "search" | "domain" | "options") {
            s.push_str(l);
            s.push('\n');
        }
    }
    s
}

/// Runs `cmd` isolated; returns canal run's exit status (the program's, or 128+N).
pub(crate) fn run(mut cmd: Command, iso: Isolation) -> i32 {
    let resolv = resolv_conf();
    let (ready_r, ready_w) = match UnixStream::pair() {
        Ok((r, w)) => (OwnedFd::from(r), OwnedFd::from(w)),
        Err(e) => return fail(e),
    };
    let (go_r, mut go_w) = match pipe() {
        Ok(p) => p,
        Err(e) => return fail(e),
    };
    // SAFETY: canal run is single-threaded here; the child only makes system calls and
    // then execs (or _exits).
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return fail(last_err("fork"));
    }
    if pid == 0 {
        drop(ready_r);
        drop(go_w);
        child(&mut cmd, &resolv, iso.seccomp, ready_w, go_r);
    }
    drop(ready_w);
    drop(go_r);
    // The child's report: its resolver sockets on success, else its error text.
    let mut text = vec![0u8; 4096];
    let resolver = match canald::sys::recv_with_fds(&ready_r, &mut text) {
        Ok(Some(r)) if r.fds.len() >= 2 => {
            let mut fds = r.fds.into_iter();
            let udp = UdpSocket::from(fds.next().expect("two"));
            let tcp = TcpListener::from(fds.next().expect("two"));
            (udp, tcp)
        }
        Ok(r) => {
            let text = String::from_utf8_lossy(&text[..r.map_or(0, |r| r.len)]);
            eprintln!(
                "canal run --isolate: {}",
                if text.is_empty() {
                    "the child ended before its set-up"
                } else {
                    &text
                }
            );
            reap(pid);
            return 1;
        }
        Err(e) => {
            eprintln!("canal run --isolate: {e}");
            reap(pid);
            return 1;
        }
    };
    let listener = if iso.seccomp {
        match take_listener(&ready_r, pid) {
            Ok(l) => Some(l),
            Err(e) => {
                eprintln!("canal run --isolate: {e}");
                reap(pid);
                return 1;
            }
        }
    } else {
        None
    };
    let handle = std::fs::File::open(format!("/proc/{pid}/ns/net"))
        .map(OwnedFd::from)
        .and_then(|ns| canald::network::register_network(iso.socket, &iso.name, &iso.publish, &ns));
    let handle = handle.and_then(|h| match &listener {
        Some(l) => h.serve_seccomp(l).map(|()| h),
        None => Ok(h),
    });
    let handle = match handle {
        Ok(h) => h,
        Err(e) => {
            eprintln!("canal run --isolate: cannot register the network with canald: {e}");
            // SAFETY: our child, not yet reaped.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            reap(pid);
            return 1;
        }
    };
    if let Some(up) = handle.dns {
        let (udp, tcp) = resolver;
        std::thread::spawn(move || crate::dnsfwd::relay_udp(udp, up));
        std::thread::spawn(move || crate::dnsfwd::relay_tcp(tcp, up));
    }
    forward_signals(pid);
    let _ = go_w.write_all(b"g");
    drop(go_w);
    let status = reap(pid);
    drop(handle);
    exit_like(status)
}

fn fail(e: io::Error) -> i32 {
    eprintln!("canal run --isolate: {e}");
    1
}

/// The child's side; never returns. A setup failure is written to `ready` for the
/// parent to print; success closes it empty.
fn child(
    cmd: &mut Command,
    resolv: &str,
    seccomp: bool,
    ready: OwnedFd,
    mut go: std::fs::File,
) -> ! {
    use canald::sys::send_with_fds;
    let sent = match setup(resolv) {
        Ok((udp, tcp)) => send_with_fds(&ready, b"ok", &[udp.as_raw_fd(), tcp.as_raw_fd()], false),
        Err(e) => send_with_fds(&ready, e.to_string().as_bytes(), &[], false).and(Err(e)),
    };
    // The filter goes in last. From then on sendmsg is notified and nobody serves the
    // listener yet: its number goes to the parent by write(2), which takes it with
    // pidfd_getfd.
    let sent = sent.and_then(|()| {
        if !seccomp {
            return Ok(());
        }
        let report = match install_filter() {
            Ok(l) => format!("seccomp {}", l.into_raw_fd()),
            Err(e) => e.to_string(),
        };
        // SAFETY: writes our own buffer to our own socket.
        let n = unsafe { libc::write(ready.as_raw_fd(), report.as_ptr().cast(), report.len()) };
        if n == report.len() as isize {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    });
    if sent.is_err() {
        // SAFETY: ends this process without running the parent's atexit handlers.
        unsafe { libc::_exit(1) }
    }
    drop(ready);
    let mut b = [0u8; 1];
    if !matches!(go.read(&mut b), Ok(1)) {
        // canal run failed to register the network: never run the program unserved.
        // SAFETY: as above.
        unsafe { libc::_exit(1) }
    }
    drop(go);
    crate::stdfds::close_what_was_closed();
    let e = cmd.exec();
    eprintln!(
        "canal run: cannot run '{}': {e}",
        cmd.get_program().to_string_lossy()
    );
    let code = if e.kind() == io::ErrorKind::NotFound {
        127
    } else {
        126
    };
    // SAFETY: as above.
    unsafe { libc::_exit(code) }
}

/// The child's seccomp listener: its number from the child's second report, the
/// descriptor itself by pidfd_getfd (the child may no longer sendmsg it).
fn take_listener(ready: &OwnedFd, pid: libc::pid_t) -> io::Result<OwnedFd> {
    let mut text = vec![0u8; 4096];
    let r = canald::sys::recv_with_fds(ready, &mut text)?
        .ok_or_else(|| io::Error::other("the child did not report its seccomp filter"))?;
    let text = String::from_utf8_lossy(&text[..r.len]);
    let Some(fd) = text
        .strip_prefix("seccomp ")
        .and_then(|n| n.parse::<i32>().ok())
    else {
        return Err(io::Error::other(if text.is_empty() {
            "the child ended before its seccomp filter".to_string()
        } else {
            text.into_owned()
        }));
    };
    let pidfd = canald::sys::pidfd_open(pid as u32)?;
    canald::sys::take_fd(&pidfd, fd)
        .map_err(|e| io::Error::new(e.kind(), format!("taking the seccomp listener: {e}")))
}

fn write_file(path: &str, text: &str) -> io::Result<()> {
    std::fs::write(path, text).map_err(|e| io::Error::new(e.kind(), format!("{path}: {e}")))
}

/// In the child: the namespaces, the uid/gid maps, `lo` up with the resolver's
/// address, the resolver's sockets (for canal run to serve) and the resolver file.
fn setup(resolv: &str) -> io::Result<(UdpSocket, TcpListener)> {
    // SAFETY: plain system calls without pointers.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let user = uid != 0;
    let flags = libc::CLONE_NEWNET | libc::CLONE_NEWNS | if user { libc::CLONE_NEWUSER } else { 0 };
    // SAFETY: unshare takes flags only.
    if unsafe { libc::unshare(flags) } < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!(
                "cannot create the namespaces: {e}{}",
                if user {
                    " (are unprivileged user namespaces allowed? kernel.unprivileged_userns_clone, user.max_user_namespaces)"
                } else {
                    ""
                }
            ),
        ));
    }
    if user {
        // The program keeps its own uid and gid inside (no root inside).
        write_file("/proc/self/setgroups", "deny")?;
        write_file("/proc/self/uid_map", &format!("{uid} {uid} 1\n"))?;
        write_file("/proc/self/gid_map", &format!("{gid} {gid} 1\n"))?;
    }
    loopback_up()?;
    add_lo_addr(crate::dnsfwd::GUEST_DNS)?;
    let at = std::net::SocketAddrV4::new(crate::dnsfwd::GUEST_DNS.into(), 53);
    let bound = |e: io::Error| io::Error::new(e.kind(), format!("{at}: {e}"));
    let udp = UdpSocket::bind(at).map_err(bound)?;
    let tcp = TcpListener::bind(at).map_err(bound)?;
    bind_resolv(resolv)?;
    Ok((udp, tcp))
}

/// The filter of `canald::seccomp::filter` (x86-64 only: elsewhere, nothing).
fn install_filter() -> io::Result<OwnedFd> {
    if cfg!(target_arch = "x86_64") {
        canald::sys::install_filter(&canald::seccomp::filter::filter_program())
            .map_err(|e| io::Error::new(e.kind(), format!("installing the seccomp filter: {e}")))
    } else {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "seccomp service is x86-64 only here: use --no-seccomp",
        ))
    }
}

/// Puts `ip`/32 on `lo` (RTM_NEWADDR over rtnetlink).
fn add_lo_addr(ip: [u8; 4]) -> io::Result<()> {
    // SAFETY: a plain socket call; the descriptor is owned below.
    let s = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_ROUTE,
        )
    };
    if s < 0 {
        return Err(last_err("netlink socket"));
    }
    // SAFETY: fresh descriptor.
    let s = unsafe { OwnedFd::from_raw_fd(s) };
    // SAFETY: a NUL-terminated interface name.
    let index = unsafe { libc::if_nametoindex(c"lo".as_ptr()) };
    // nlmsghdr (16) + ifaddrmsg (8) + IFA_LOCAL and IFA_ADDRESS attributes (8 each).
    let mut m = Vec::with_capacity(40);
    m.extend_from_slice(&40u32.to_ne_bytes());
    m.extend_from_slice(&libc::RTM_NEWADDR.to_ne_bytes());
    let flags = libc::NLM_F_REQUEST | libc::NLM_F_ACK | libc::NLM_F_CREATE | libc::NLM_F_EXCL;
    m.extend_from_slice(&(flags as u16).to_ne_bytes());
    m.extend_from_slice(&1u32.to_ne_bytes()); // sequence
    m.extend_from_slice(&0u32.to_ne_bytes()); // port id: the kernel's
    m.extend_from_slice(&[libc::AF_INET as u8, 32, 0, libc::RT_SCOPE_HOST]);
    m.extend_from_slice(&index.to_ne_bytes());
    for kind in [libc::IFA_LOCAL, libc::IFA_ADDRESS] {
        m.extend_from_slice(&8u16.to_ne_bytes());
        m.extend_from_slice(&kind.to_ne_bytes());
        m.extend_from_slice(&ip);
    }
    // SAFETY: sending our buffer; receiving into our buffer of its length.
    let ack = unsafe {
        if libc::send(s.as_raw_fd(), m.as_ptr().cast(), m.len(), 0) < 0 {
            return Err(last_err("netlink send"));
        }
        let mut buf = [0u8; 256];
        let n = libc::recv(s.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0);
        if n < 20 {
            return Err(last_err("netlink answer"));
        }
        // NLMSG_ERROR: the errno (negative) right after the header; 0 is the ack.
        i32::from_ne_bytes([buf[16], buf[17], buf[18], buf[19]])
    };
    if ack != 0 {
        let e = io::Error::from_raw_os_error(-ack);
        return Err(io::Error::new(
            e.kind(),
            format!("adding {} to lo: {e}", std::net::Ipv4Addr::from(ip)),
        ));
    }
    Ok(())
}

fn loopback_up() -> io::Result<()> {
    // SAFETY: a plain socket call; the descriptor is owned below.
    let s = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if s < 0 {
        return Err(last_err("socket"));
    }
    // SAFETY: fresh descriptor.
    let s = unsafe { OwnedFd::from_raw_fd(s) };
    // SAFETY: an all-zero ifreq is valid; the name is NUL-terminated within IFNAMSIZ.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, c) in ifr.ifr_name.iter_mut().zip(b"lo\0") {
        *d = *c as libc::c_char;
    }
    // SAFETY: `ifr` is a valid ifreq for SIOCGIFFLAGS/SIOCSIFFLAGS.
    if unsafe { libc::ioctl(s.as_raw_fd(), libc::SIOCGIFFLAGS, &mut ifr) } < 0 {
        return Err(last_err("lo: SIOCGIFFLAGS"));
    }
    // SAFETY: the flags member of the union is the one SIOCGIFFLAGS filled.
    unsafe { ifr.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short };
    // SAFETY: as above.
    if unsafe { libc::ioctl(s.as_raw_fd(), libc::SIOCSIFFLAGS, &mut ifr) } < 0 {
        return Err(last_err("lo: SIOCSIFFLAGS"));
    }
    Ok(())
}

/// Mounts stay in the new mount namespace; a file with `resolv` goes over
/// /etc/resolv.conf (if the host has one to cover).
fn bind_resolv(resolv: &str) -> io::Result<()> {
    let none = std::ptr::null::<libc::c_char>();
    // SAFETY: NUL-terminated strings and null pointers, as mount(2) allows.
    if unsafe {
        libc::mount(
            none,
            c"/".as_ptr(),
            none,
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        )
    } < 0
    {
        return Err(last_err("making mounts private"));
    }
    if std::fs::metadata("/etc/resolv.conf").is_err() {
        return Ok(());
    }
    // A bind mount needs a file on a real file system (a memfd's is internal): a
    // fresh file, removed once mounted (the mount keeps it).
    let path = std::env::temp_dir().join(format!("canal-resolv-{}.conf", std::process::id()));
    {
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&path)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        f.write_all(resolv.as_bytes())?;
    }
    let src = CString::new(path.as_os_str().as_encoded_bytes()).map_err(io::Error::other)?;
    // SAFETY: NUL-terminated paths, null type and data for a bind mount.
    let r = unsafe {
        libc::mount(
            src.as_ptr(),
            c"/etc/resolv.conf".as_ptr(),
            none,
            libc::MS_BIND,
            std::ptr::null(),
        )
    };
    let e = last_err("mounting /etc/resolv.conf");
    let _ = std::fs::remove_file(&path);
    if r < 0 {
        return Err(e);
    }
    Ok(())
}

static CHILD: AtomicI32 = AtomicI32::new(0);

extern "C" fn forward(sig: libc::c_int) {
    let pid = CHILD.load(Ordering::Relaxed);
    if pid > 0 {
        // SAFETY: kill is async-signal-safe.
        unsafe { libc::kill(pid, sig) };
    }
}

/// SIGTERM and SIGHUP go on to the program; SIGINT and SIGQUIT reach it from the
/// terminal itself, so canal run ignores them and waits for the program's answer.
fn forward_signals(pid: i32) {
    CHILD.store(pid, Ordering::Relaxed);
    // SAFETY: installing handlers: `forward` only calls async-signal-safe kill.
    unsafe {
        libc::signal(libc::SIGTERM, forward as *const () as libc::sighandler_t);
        libc::signal(libc::SIGHUP, forward as *const () as libc::sighandler_t);
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        libc::signal(libc::SIGQUIT, libc::SIG_IGN);
    }
}

fn reap(pid: i32) -> libc::c_int {
    let mut st = 0;
    loop {
        // SAFETY: waiting for our own child into a valid int.
        let r = unsafe { libc::waitpid(pid, &mut st, 0) };
        if r == pid || (r < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINTR)) {
            return st;
        }
    }
}

/// Exits as the program did: its code, or its signal (a shell then shows 128+N).
fn exit_like(st: libc::c_int) -> i32 {
    if libc::WIFSIGNALED(st) {
        let sig = libc::WTERMSIG(st);
        // SAFETY: restoring the default action and raising the same signal on us.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            libc::raise(sig);
        }
        128 + sig
    } else {
        libc::WEXITSTATUS(st)
    }
}
