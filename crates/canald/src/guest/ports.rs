//! Local ports for short-circuited connectors (protocol §8.1). A connector's name must
//! be a real host address that no kernel socket can take while the connection lives,
//! but the connection itself never uses a kernel socket. So canald keeps bound,
//! unconnected sockets as port reservations: a short-circuited connect takes one, and
//! the reservation comes back when the socket is freed. Making, binding and closing a
//! socket per connection cost canald about 10 µs of a 2-core VM's CPU (B12: a third of
//! its work per guest↔guest connection).
//!
//! A reservation never carries a guest's options: if the program sets or reads one on
//! its connector, the reservation becomes that socket's host socket for good
//! ([`PortHold::into_fd`]) and is closed with it, as before this pool existed.
#![forbid(unsafe_code)]

use crate::sys;
use canal_abi::CanalAddr;
use std::collections::{HashMap, VecDeque};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// Free reservations an address keeps before one is reused, oldest first: one
/// connection after another, a port comes back after this many others (natively
/// TIME_WAIT keeps a closed connection's port from the next few, and port selection
/// moves on).
const ROTATION: usize = 16;
/// Free reservations kept over all addresses at most; the rest are closed. canald's
/// own descriptors, outside every guest's quota: `keep_within` gives them a quarter of
/// `fdbudget::headroom` at most, which control connections and eventfds share.
const KEEP: usize = 64;
static KEPT_AT_MOST: AtomicUsize = AtomicUsize::new(KEEP);

/// Limits the free reservations to a quarter of canald's descriptor headroom.
pub(crate) fn keep_within(headroom: u64) {
    KEPT_AT_MOST.store(kept_for(headroom), Ordering::Relaxed);
}

fn kept_for(headroom: u64) -> usize {
    (headroom / 4).min(KEEP as u64) as usize
}

/// An address's reservations: family, address bytes and scope (the port is the pool's).
type Key = (u16, [u8; 16], u32);

#[derive(Default)]
struct Pool {
    free: HashMap<Key, VecDeque<(OwnedFd, u16)>>,
    total: usize,
}

static POOL: Mutex<Option<Pool>> = Mutex::new(None);

fn with_pool<R>(f: impl FnOnce(&mut Pool) -> R) -> R {
    let mut g = POOL.lock().unwrap_or_else(|e| e.into_inner());
    f(g.get_or_insert_with(Pool::default))
}

/// A reserved local port: back to the pool when dropped.
pub(crate) struct PortHold {
    fd: Option<OwnedFd>,
    key: Key,
    port: u16,
}

impl PortHold {
    /// A reservation on `addr`'s address (its port ignored; `local` names it): a pooled one when the
    /// address has enough free, else a fresh socket bound to port 0. None: the kernel
    /// refused (no such local address, out of ports or descriptors).
    pub(crate) fn take(addr: &CanalAddr) -> Option<PortHold> {
        let key = (addr.family, addr.addr, addr.scope_id);
        let pooled = with_pool(|p| {
            let q = p.free.get_mut(&key)?;
            if q.len() < ROTATION {
                return None;
            }
            let got = q.pop_front();
            p.total -= got.is_some() as usize;
            got
        });
        let (fd, port) = match pooled {
            Some(x) => x,
            None => {
                let fd = sys::socket(addr.family as i32, libc::SOCK_STREAM, 0).ok()?;
                let mut a = *addr;
                a.port = 0;
                sys::bind(&fd, &a).ok()?;
                let port = sys::sockname(&fd).ok()?.port;
                (port != 0).then_some(())?;
                (fd, port)
            }
        };
        Some(PortHold {
            fd: Some(fd),
            key,
            port,
        })
    }

    /// The reserved address.
    pub(crate) fn local(&self) -> CanalAddr {
        CanalAddr {
            family: self.key.0,
            addr: self.key.1,
            scope_id: self.key.2,
            port: self.port,
            ..Default::default()
        }
    }

    /// The reservation's socket, kept by the connection from now on (not pooled again):
    /// the program set or read an option, or connects through the kernel after all.
    pub(crate) fn into_fd(mut self) -> OwnedFd {
        self.fd.take().expect("a hold has its socket until dropped")
    }
}

impl Drop for PortHold {
    fn drop(&mut self) {
        let Some(fd) = self.fd.take() else { return };
        with_pool(|p| {
            if p.total < KEPT_AT_MOST.load(Ordering::Relaxed) {
                p.free
                    .entry(self.key)
                    .or_default()
                    .push_back((fd, self.port));
                p.total += 1;
            }
            // else: `fd` closes here, and its port with it.
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_reservations_take_a_quarter_of_the_headroom_at_most() {
        // canald under `ulimit -n 1024`: a headroom of 128, 32 kept free at most.
        assert_eq!(kept_for(crate::fdbudget::headroom(1024)), 32);
        assert_eq!(kept_for(crate::fdbudget::headroom(1 << 20)), KEEP);
    }

    fn loopback() -> CanalAddr {
        CanalAddr::v4([127, 0, 0, 1], 0)
    }

    /// A reserved port is really taken (a bind to it fails), and a released one is
    /// not handed out again before ROTATION others.
    #[test]
    fn ports_are_reserved_and_reused_only_after_a_rotation() {
        let h = PortHold::take(&loopback()).expect("a reservation");
        let local = h.local();
        assert_eq!(local.addr[..4], [127, 0, 0, 1]);
        assert_ne!(local.port, 0);
        let other = sys::socket(libc::AF_INET, libc::SOCK_STREAM, 0).unwrap();
        let e = sys::bind(&other, &local).unwrap_err();
        assert_eq!(sys::errno_of(&e), libc::EADDRINUSE);
        drop(h);
        // Still reserved while pooled.
        assert_eq!(
            sys::errno_of(&sys::bind(&other, &local).unwrap_err()),
            libc::EADDRINUSE
        );
        let mut held = Vec::new();
        for _ in 0..ROTATION {
            let h = PortHold::take(&loopback()).expect("a reservation");
            let port = h.local().port;
            held.push((h, port));
        }
        assert!(
            held.iter().all(|(_, p)| *p != local.port),
            "a released port came back within {ROTATION} connections"
        );
        // A hold turned into a socket's own keeps its port and leaves the pool.
        let (h, l) = held.pop().unwrap();
        let fd = h.into_fd();
        assert_eq!(sys::sockname(&fd).unwrap().port, l);
    }
}
