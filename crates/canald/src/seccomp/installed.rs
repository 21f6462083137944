//! The host sockets seccomp service installed in one network's programs, by inode:
//! the name a program bound (getsockname of an unconnected socket answers it, the
//! wildcard staying the wildcard), its IPV6_V6ONLY (kept here: the host socket stays
//! dual stack, `NetView::lo6`) and, for `canal stat`, which are still open, in which
//! process and descriptor, in what state.
//!
//! canald does not hold these sockets and the kernel does not tell it when a program
//! closes one. Which are open is found as `ss -p` finds owners: every process's
//! descriptors under /proc, matched by socket inode. The table is pruned that way when
//! it has doubled since the last time (and at every listing), so a server that opens
//! and closes a million connections keeps it as large as its open sockets.
#![forbid(unsafe_code)]

use crate::guest::contacts::Contacts;
use crate::sys;
use canal_abi::CanalAddr;
use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::Mutex;

/// Below this many entries the table is not pruned on the way in.
const PRUNE_FLOOR: usize = 4096;

#[derive(Debug, Default)]
pub(crate) struct Installed {
    table: Mutex<Table>,
}

#[derive(Debug, Clone)]
struct Sock {
    /// 6 TCP, 17 UDP.
    proto: u8,
    /// The name bound, if the program bound one.
    name: Option<CanalAddr>,
    v6only: bool,
    /// Outside addresses it sent to from the private loopback, whose datagrams it
    /// takes (`guest::contacts`).
    contacts: Contacts,
    /// It named the resolver (10.0.2.3) as a destination (`NetView::peer`).
    via_resolver: bool,
}

#[derive(Debug, Default)]
struct Table {
    socks: HashMap<u64, Sock>,
    /// The size at which the next insertion prunes.
    prune_at: usize,
}

/// One open socket as `canal stat` lists it (host addresses; `stat` shows the
/// guest's view of them).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct OpenSocket {
    pub(crate) pid: u32,
    pub(crate) fd: i32,
    /// "tcp", "tcp-listener" or "udp".
    pub(crate) kind: &'static str,
    /// As `ss` names it ("established", "listen", "syn-sent", …; "bound" for a socket
    /// neither listening nor connected, "connected" for a connected datagram socket).
    pub(crate) state: &'static str,
    /// The name the program bound, if it did and the socket is not connected.
    pub(crate) bound: Option<CanalAddr>,
    pub(crate) host_local: Option<CanalAddr>,
    pub(crate) host_peer: Option<CanalAddr>,
    /// It named the resolver as a destination (how its peer reads, `NetView::peer`).
    pub(crate) via_resolver: bool,
}

impl Installed {
    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records socket `s`, just installed in a program, with the name it was bound to
    /// and the program's IPV6_V6ONLY.
    pub(crate) fn add(&self, s: &OwnedFd, proto: u8, name: Option<CanalAddr>, v6only: bool) {
        let Ok(ino) = sys::inode_of(s) else { return };
        let mut t = self.lock();
        if t.socks.len() >= t.prune_at.max(PRUNE_FLOOR) {
            let open = holders(&t.socks);
            t.socks.retain(|i, _| open.contains_key(i));
            t.prune_at = 2 * t.socks.len();
        }
        t.socks.insert(
            ino,
            Sock {
                proto,
                name,
                v6only,
                contacts: Contacts::default(),
                via_resolver: false,
            },
        );
    }

    /// The name the program bound socket `s` to, if it did.
    pub(crate) fn name_of(&self, s: &OwnedFd) -> Option<CanalAddr> {
        self.with(s, |e| e.name).flatten()
    }

    /// The program's IPV6_V6ONLY for socket `s`.
    pub(crate) fn v6only_of(&self, s: &OwnedFd) -> bool {
        self.with(s, |e| e.v6only).unwrap_or(false)
    }

    /// Sets the program's IPV6_V6ONLY for socket `s`; false if it is not one of ours.
    pub(crate) fn set_v6only(&self, s: &OwnedFd, on: bool) -> bool {
        let Ok(ino) = sys::inode_of(s) else {
            return false;
        };
        self.lock()
            .socks
            .get_mut(&ino)
            .map(|e| e.v6only = on)
            .is_some()
    }

    /// Datagram socket `s` sent to host address `dst` from the private loopback.
    pub(crate) fn note_contact(&self, s: &OwnedFd, dst: &CanalAddr) {
        let Ok(ino) = sys::inode_of(s) else { return };
        if let Some(e) = self.lock().socks.get_mut(&ino) {
            e.contacts.note(dst);
        }
    }

    /// Socket `s` named the resolver as its destination (`on`), or connected elsewhere.
    pub(crate) fn set_via_resolver(&self, s: &OwnedFd, on: bool) {
        let Ok(ino) = sys::inode_of(s) else { return };
        if let Some(e) = self.lock().socks.get_mut(&ino) {
            e.via_resolver = on;
        }
    }

    /// Whether socket `s` named the resolver as a destination.
    pub(crate) fn via_resolver(&self, s: &OwnedFd) -> bool {
        self.with(s, |e| e.via_resolver).unwrap_or(false)
    }

    /// Whether socket `s` sent to host address `a`.
    pub(crate) fn contacted(&self, s: &OwnedFd, a: &CanalAddr) -> bool {
        self.with(s, |e| e.contacts.has(a)).unwrap_or(false)
    }

    fn with<T>(&self, s: &OwnedFd, f: impl FnOnce(&Sock) -> T) -> Option<T> {
        let ino = sys::inode_of(s).ok()?;
        self.lock().socks.get(&ino).map(f)
    }

    /// The sockets still open, each with its holder and state (the first holder found,
    /// for a socket several processes share), by pid and descriptor; the closed ones
    /// leave the table.
    pub(crate) fn open(&self) -> Vec<OpenSocket> {
        let (socks, open) = {
            let mut t = self.lock();
            if t.socks.is_empty() {
                return Vec::new();
            }
            let open = holders(&t.socks);
            t.socks.retain(|i, _| open.contains_key(i));
            t.prune_at = 2 * t.socks.len();
            (t.socks.clone(), open)
        };
        let mut out: Vec<OpenSocket> = open
            .into_iter()
            .filter_map(|(ino, (pid, fd))| describe(pid, fd, ino, socks.get(&ino)?))
            .collect();
        out.sort_by_key(|s| (s.pid, s.fd));
        out
    }
}

/// inode → (pid, descriptor) of the processes holding any of `socks` (the first
/// found). canald's own copies (a blocking accept's thread holds the listener) do not
/// count: a socket only canald holds any more is closed for the program. (The unit
/// tests hold the sockets themselves.)
fn holders<V>(socks: &HashMap<u64, V>) -> HashMap<u64, (u32, i32)> {
    let me = if cfg!(test) { 0 } else { std::process::id() };
    let mut found = HashMap::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return found;
    };
    for p in procs.flatten() {
        let pid = p.file_name().to_str().and_then(|s| s.parse::<u32>().ok());
        let Some(pid) = pid.filter(|&p| p != me) else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else {
            continue; // gone, or not ours to read
        };
        for f in fds.flatten() {
            let Some(fd) = f.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                continue;
            };
            let Ok(link) = std::fs::read_link(f.path()) else {
                continue;
            };
            let ino = link
                .to_str()
                .and_then(|l| l.strip_prefix("socket:["))
                .and_then(|l| l.strip_suffix(']'))
                .and_then(|l| l.parse::<u64>().ok());
            if let Some(ino) = ino.filter(|i| socks.contains_key(i)) {
                found.entry(ino).or_insert((pid, fd));
            }
        }
    }
    found
}

/// The socket at `pid`'s descriptor `fd` (still inode `ino`), as listed.
fn describe(pid: u32, fd: i32, ino: u64, e: &Sock) -> Option<OpenSocket> {
    let (proto, name) = (e.proto, e.name);
    let s = sys::take_fd(&sys::pidfd_of_thread(pid).ok()?, fd).ok()?;
    if sys::inode_of(&s).ok()? != ino {
        return None; // closed and the number reused meanwhile
    }
    let host = sys::sockname(&s).ok();
    let peer = sys::peername(&s).ok();
    let (kind, state) = if proto == libc::IPPROTO_UDP as u8 {
        ("udp", if peer.is_some() { "connected" } else { "bound" })
    } else {
        let mut info = [0u8; 8];
        let st = sys::getsockopt_bytes(&s, libc::IPPROTO_TCP, libc::TCP_INFO, &mut info)
            .ok()
            .map(|_| tcp_state(info[0]));
        match st {
            Some("listen") => ("tcp-listener", "listen"),
            st => ("tcp", st.unwrap_or("unknown")),
        }
    };
    Some(OpenSocket {
        pid,
        fd,
        kind,
        state,
        bound: name.filter(|_| peer.is_none()),
        host_local: host,
        host_peer: peer,
        via_resolver: e.via_resolver,
    })
}

/// The kernel's TCP states (include/net/tcp_states.h) as `ss` names them; CLOSE is a
/// socket bound and neither listening nor connected.
fn tcp_state(s: u8) -> &'static str {
    match s {
        1 => "established",
        2 => "syn-sent",
        3 => "syn-recv",
        4 => "fin-wait-1",
        5 => "fin-wait-2",
        6 => "time-wait",
        7 => "bound",
        8 => "close-wait",
        9 => "last-ack",
        10 => "listen",
        11 => "closing",
        _ => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_open_sockets_of_this_process_and_forgets_closed_ones() {
        let inst = Installed::default();
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let u = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let owned = |s: &dyn std::os::fd::AsFd| s.as_fd().try_clone_to_owned().unwrap();
        let (lo, co, uo) = (owned(&l), owned(&c), owned(&u));
        inst.add(&lo, 6, None, false);
        inst.add(&co, 6, None, false);
        inst.add(&uo, 17, Some(CanalAddr::v4([0, 0, 0, 0], 53)), false);
        drop((lo, co, uo));
        let open = inst.open();
        let kinds: Vec<_> = open.iter().map(|s| (s.kind, s.state)).collect();
        assert_eq!(open.len(), 3, "{open:?}");
        assert!(kinds.contains(&("tcp-listener", "listen")), "{kinds:?}");
        assert!(kinds.contains(&("tcp", "established")), "{kinds:?}");
        assert!(kinds.contains(&("udp", "bound")), "{kinds:?}");
        let udp = open.iter().find(|s| s.kind == "udp").unwrap();
        assert_eq!(udp.bound, Some(CanalAddr::v4([0, 0, 0, 0], 53)));
        let tcp = open.iter().find(|s| s.state == "established").unwrap();
        assert_eq!(tcp.host_peer.map(|p| p.port), Some(port));
        assert_eq!(udp.pid, std::process::id());
        drop(c);
        drop(u);
        let open = inst.open();
        assert_eq!(open.len(), 1, "closed sockets leave the listing: {open:?}");
        assert_eq!(inst.lock().socks.len(), 1);
    }

    #[test]
    fn a_server_that_churns_sockets_keeps_the_table_small() {
        let inst = Installed::default();
        for _ in 0..PRUNE_FLOOR + 10 {
            let u = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            inst.add(&std::os::fd::OwnedFd::from(u), 17, None, false);
        }
        assert!(inst.lock().socks.len() <= 10, "pruned on the way in");
    }
}
