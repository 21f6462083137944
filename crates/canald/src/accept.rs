//! New control connections: accepted on the control socket — or, in a user's own
//! canald, received from the host-wide one over its channel (`users.rs`) — then
//! admitted: the peer's uid and network namespace are read from the kernel, never
//! taken from the peer's word.
#![forbid(unsafe_code)]

use crate::daemon::{send_error, Conn, Daemon, MAX_REFUSED};
use crate::guest::socket::token;
use crate::sys;
use canal_abi::errno;
use std::os::fd::{AsRawFd, OwnedFd};

impl Daemon {
    /// The control socket (or the channel) is readable: admits every waiting peer.
    pub(crate) fn accept_conns(&mut self) {
        loop {
            let next = if self.cfg.user_channel.is_some() {
                self.receive_conn()
            } else {
                self.accept_conn()
            };
            match next {
                Some(fd) => self.admit(fd),
                None => return,
            }
        }
    }

    fn accept_conn(&mut self) -> Option<OwnedFd> {
        loop {
            match sys::accept_unix(&self.listener) {
                Ok(fd) => return fd,
                Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE) | Some(libc::ENFILE)) => {
                    // Out of descriptors: the connection stays queued and the
                    // listener readable (a busy loop). Take it with the reserve
                    // descriptor and tell the peer why.
                    let listener = &self.listener;
                    self.reserve.with_spare(|| {
                        if let Ok(Some(c)) = sys::accept_unix(listener) {
                            let _ = send_error(&c, errno::EMFILE, "canald is out of descriptors");
                        }
                    });
                    log::info!("accept: {e}; a connection was refused");
                }
                Err(e) => {
                    log::info!("accept: {e}");
                    return None;
                }
            }
        }
    }

    /// A user's canald: the next connection the host-wide canald handed over. When the
    /// channel closes (the host-wide canald stopped) no more come: the listener leaves
    /// the epoll set and the daemon ends when its guests have gone (its idle exit).
    fn receive_conn(&mut self) -> Option<OwnedFd> {
        let mut buf = [0u8; 16];
        match sys::recv_with_fds(&self.listener, &mut buf) {
            Ok(Some(r)) if r.len == 0 && r.fds.is_empty() => {
                log::info!("the host-wide canald closed the channel; serving the guests left");
                self.ep().delete(self.listener.as_raw_fd());
                None
            }
            Ok(Some(r)) => r.fds.into_iter().next(),
            Ok(None) => None,
            Err(e) => {
                log::info!("channel: {e}");
                None
            }
        }
    }

    /// Admits a connected peer: its uid (another user's peers go to that user's own
    /// canald when this one serves users, else they are refused at their first
    /// message) and its network namespace.
    fn admit(&mut self, fd: OwnedFd) {
        let me = sys::getuid();
        let Ok((pid, uid)) = sys::peer_cred(&fd) else {
            return;
        };
        let refused = uid != me && uid != 0;
        if refused {
            if let Some(users) = &mut self.users {
                if let Err(e) = users.hand_over(uid, &fd) {
                    let why = format!("cannot start a canald for uid {uid}: {e}");
                    log::warn!("{why}");
                    let _ = send_error(&fd, sys::errno_of(&e), &why);
                }
                return;
            }
        }
        // The peer's namespace decides its address view: read from the process that
        // connected, never taken from the guest's word.
        let netns = match sys::peer_netns(&fd, pid) {
            Ok((ns, _)) if ns == self.own_ns => None,
            Ok(x) => Some(x),
            Err(e) => {
                let why = format!("cannot tell the network namespace of pid {pid}: {e}");
                log::info!("control connection refused: {why}");
                let _ = send_error(&fd, sys::errno_of(&e), &why);
                return;
            }
        };
        if refused && self.conns.values().filter(|c| c.refused).count() >= MAX_REFUSED {
            let _ = send_error(&fd, errno::EACCES, "peer uid not allowed");
            return;
        }
        let key = self.alloc_conn_key();
        if self
            .ep()
            .add(
                fd.as_raw_fd(),
                sys::EP_IN,
                token::make(token::CONTROL, key, 0, 0),
            )
            .is_err()
        {
            return;
        }
        self.conns.insert(
            key,
            Conn {
                fd,
                pid,
                uid,
                worker: None,
                refused,
                out: Default::default(),
                out_bytes: 0,
                netns,
            },
        );
    }
}
