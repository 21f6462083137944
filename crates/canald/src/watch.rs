//! Kernel-counted liveness of guest sockets (control message WATCH, protocol §2).
//!
//! A guest's dummy descriptor for a canal socket is one end of a Unix socketpair; the
//! other end is sent here once, with the socket's handle. The kernel counts the guest
//! end's references across dup, fork, exec, `_exit` and kill; when the last one is
//! gone this end reports EPOLLHUP and the socket is closed as by a CLOSE request. This
//! backs the guest's own reference count (which a process ended by `_exit` or a
//! signal cannot update).
//!
//! Bounded: at most one watch per (guest connection, socket index) — a new WATCH for
//! the same index replaces the old one — and only for a socket index the guest has.
//! Each watch end counts against the guest's descriptor quota (`EntryPool::hold_apart`);
//! a WATCH beyond it is refused (its end closed at once): that socket then closes by
//! the guest's CLOSE request, as before the first fork, and only the kernel's count for
//! a process killed without its hooks (the socket then lives until the guest leaves)
//! and the check for writes outside the hooks are lost for it.

use crate::guest::state::Guest;
use crate::sys::{Epoll, EP_IN};
use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};

/// Epoll token type of a watch (the others are in `guest::socket::token`).
pub(crate) const TOKEN: u64 = crate::guest::socket::token::WATCH;

fn token(conn: u32, gen: u16, index: u16) -> u64 {
    crate::guest::socket::token::make(TOKEN, conn, gen, index)
}

#[derive(Default)]
pub(crate) struct Watches {
    fds: HashMap<(u32, u32), (u16, OwnedFd)>,
}

impl Watches {
    /// WATCH from connection `conn` (guest `g`): watch `fd` for socket `handle`. True
    /// if it is held (the socket exists and epoll took it); invalid requests are
    /// ignored (WATCH has no reply).
    pub(crate) fn add(
        &mut self,
        ep: &Epoll,
        conn: u32,
        g: &mut Guest,
        handle: u32,
        fd: OwnedFd,
    ) -> bool {
        let index = canal_abi::handle_index(handle);
        let gen = canal_abi::handle_generation(handle) as u16;
        if !g.has_live_socket(index, gen) {
            return false;
        }
        let replaces = self.fds.contains_key(&(conn, index));
        if !replaces && !g.entries.hold_apart() {
            // Counted and logged (rate-limited); the end is closed here, and without
            // WATCHED the guest's last close sends CLOSE.
            g.cfg.policy.hit(crate::quota::Hit::Watch);
            return false;
        }
        // HUP/ERR (always reported): the last close. IN: the guest end is shut for
        // reading, so bytes arrive here only if the guest wrote to its dummy through a
        // path no hook sees (`unseen_send`).
        if ep
            .add(fd.as_raw_fd(), EP_IN, token(conn, gen, index as u16))
            .is_err()
        {
            if !replaces {
                g.entries.release_apart();
            }
            return false;
        }
        if let Some((_, old)) = self.fds.insert((conn, index), (gen, fd)) {
            ep.delete(old.as_raw_fd());
        }
        true
    }

    /// The (conn, index, generation) a watch's epoll token names, if that watch is
    /// still the one held for it (a newer WATCH for the index replaces it).
    fn current(&self, tok: u64) -> Option<(u32, u32, u16)> {
        let conn = crate::guest::socket::token::conn(tok);
        let index = crate::guest::socket::token::index(tok) as u32;
        let gen = crate::guest::socket::token::gen(tok);
        match self.fds.get(&(conn, index)) {
            Some((g, _)) if *g == gen => Some((conn, index, gen)),
            _ => None,
        }
    }

    /// A watch fired: the guest's last descriptor of that socket is gone. Returns the
    /// (index, generation) to close.
    pub(crate) fn fired(&mut self, ep: &Epoll, tok: u64) -> Option<(u32, u32, u16)> {
        let (conn, index, gen) = self.current(tok)?;
        let (_, fd) = self.fds.remove(&(conn, index))?;
        ep.delete(fd.as_raw_fd());
        Some((conn, index, gen))
    }

    /// CLOSE_CHECK from connection `conn`: if the watch of socket (index, gen) has hung
    /// up, takes it as `fired` would and returns true. It is looked at now, not when
    /// epoll next reports it: the guest's program may use the socket's address the
    /// moment its close returns.
    pub(crate) fn take_if_hung_up(&mut self, ep: &Epoll, conn: u32, index: u32, gen: u16) -> bool {
        match self.fds.get(&(conn, index)) {
            Some((g, fd)) if *g == gen && crate::sys::hung_up(fd) => {}
            _ => return false,
        }
        if let Some((_, fd)) = self.fds.remove(&(conn, index)) {
            ep.delete(fd.as_raw_fd());
        }
        true
    }

    /// A watch is readable without a hang-up: if the guest wrote bytes to its end (an
    /// io_uring send, a raw system call, a program exec'd without the library), returns
    /// the socket (conn, index, generation) they were meant for. Either way the watch
    /// then reports only the last close: once is enough to know.
    pub(crate) fn unseen_send(&mut self, ep: &Epoll, tok: u64) -> Option<(u32, u32, u16)> {
        let key = self.current(tok)?;
        let (_, fd) = self.fds.get(&(key.0, key.1))?;
        let _ = ep.modify(fd.as_raw_fd(), 0, tok);
        crate::sys::has_unread(fd).then_some(key)
    }

    /// A guest connection ended: its watches go (its sockets are closed with it).
    pub(crate) fn forget_conn(&mut self, ep: &Epoll, conn: u32) {
        self.fds.retain(|&(c, _), (_, fd)| {
            if c == conn {
                ep.delete(fd.as_raw_fd());
                false
            } else {
                true
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use crate::guest::socket::token;

    #[test]
    fn watch_token_type_is_distinct() {
        // A shared type with a worker-consumed one (POKE) would make watches never fire.
        let types = [
            token::LISTENER,
            token::CONTROL,
            token::DOORBELL,
            token::SOCKET,
            token::SIGNAL,
            token::POKE,
            token::VM_PROCESS,
            token::VRSS_DOORBELL,
            token::IVSHMEM,
            super::TOKEN,
        ];
        for (i, a) in types.iter().enumerate() {
            for b in &types[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }
}
