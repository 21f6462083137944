//! The control connection's messages (protocol §2): one handler per message kind,
//! bodies decoded by canal-abi's typed messages. A handler returns false to close the
//! connection.

use crate::daemon::{send_error, send_msg, Daemon, OUT_MAX};
use crate::guest::config::GuestConfig;
use crate::guest::socket::token;
use crate::guest::state::Guest;
use crate::stat;
use crate::sys;
use canal_abi::control::{self, kind, CTL_HEADER, CTL_MAX};
use canal_abi::errno;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::sync::Arc;

impl Daemon {
    /// Handles one message; false closes the connection.
    pub(crate) fn handle_message(&mut self, key: u32, msg: &[u8], fds: Vec<OwnedFd>) -> bool {
        let Some(conn) = self.conns.get(&key) else {
            return false;
        };
        let Some((k, body)) = control::decode(msg) else {
            return send_error(&conn.fd, errno::EINVAL, "malformed control message").is_ok();
        };
        // A peer in another network namespace is a guest of that namespace and
        // nothing more: it cannot list other guests, make VM regions or publish ports.
        let host_only = matches!(
            k,
            kind::STAT | kind::VM_REGION | kind::VM_PID | kind::NETWORK | kind::SECCOMP
        );
        if host_only && conn.netns.is_some() {
            return send_error(
                &conn.fd,
                errno::EACCES,
                "not from another network namespace",
            )
            .is_ok();
        }
        match k {
            kind::HELLO => self.on_hello(key, body),
            kind::NETWORK => self.on_network(key, body, fds),
            kind::SECCOMP => self.on_seccomp(key, fds),
            kind::PORT => self.on_port(key, body, fds),
            kind::DOORBELLS => self.doorbells(key),
            kind::STAT => self.on_stat(key, body),
            kind::WATCH => self.on_watch(key, body, fds),
            kind::SEGMENT | kind::ARENA => self.on_segment(key, k, body),
            kind::EVLOG => self.on_evlog(key, body),
            kind::BELL_SET | kind::BELL_GET => self.on_bell(key, k, body, fds),
            kind::HOST_SOCKET => self.on_host_socket(key, body),
            kind::DIRECTORY => self.on_directory(key),
            kind::LISTENER_SOCKET => self.on_listener_socket(key, body),
            kind::CLOSE_CHECK => self.on_close_check(key, body),
            kind::VM_REGION => self.on_vm_region(key, body),
            kind::VM_PID => self.on_vm_pid(key, body, fds),
            _ => send_error(&conn.fd, errno::ENOSYS, "unknown message").is_ok(),
        }
    }

    /// HELLO: a process attaches; it gets a region, a doorbell and a home worker.
    fn on_hello(&mut self, key: u32, body: &[u8]) -> bool {
        let Some(conn) = self.conns.get(&key) else {
            return false;
        };
        {
            let Some(hello) = control::Hello::decode(body) else {
                return send_error(&conn.fd, errno::EINVAL, "short HELLO").is_ok();
            };
            if conn.worker.is_some() {
                return send_error(&conn.fd, errno::EINVAL, "already attached").is_ok();
            }
            let pid = if hello.pid == 0 { conn.pid } else { hello.pid };
            let comm = String::from_utf8_lossy(hello.comm()).into_owned();
            let id = self.next_guest;
            let hello_flags = hello.flags;
            let sc = self.cfg.shortcut && hello_flags & control::hello_flag::SHORTCUT != 0;
            let zones = sc && self.cfg.zones && hello_flags & control::hello_flag::ZONES != 0;
            let arenas = sc && hello_flags & control::hello_flag::ARENAS != 0;
            let bells = arenas
                && self.cfg.arenas
                && self.cfg.bells
                && hello_flags & control::hello_flag::BELLS != 0;
            // Virtual RSS: offered with 2..=MAX_WORKERS workers to guests that know it.
            let vrss = (2..=canal_abi::MAX_WORKERS).contains(&self.workers.len())
                && hello_flags & control::hello_flag::VRSS != 0;
            let features = canal_abi::feature::ALL_V1
                | canal_abi::feature::WATCH
                | canal_abi::feature::CLOSE_CHECK
                | canal_abi::feature::DGRAM_CONTROL
                | canal_abi::feature::DGRAM_MORE
                | if sc { canal_abi::feature::SHORTCUT } else { 0 }
                | if zones { canal_abi::feature::ZONES } else { 0 }
                | if arenas {
                    canal_abi::feature::ARENAS
                } else {
                    0
                }
                | if arenas && hello_flags & control::hello_flag::PACKED_ARENAS != 0 {
                    canal_abi::feature::PACKED_ARENAS
                } else {
                    0
                }
                | if bells { canal_abi::feature::BELLS } else { 0 }
                | if vrss { canal_abi::feature::VRSS } else { 0 }
                | if hello_flags & control::hello_flag::SPARES != 0 {
                    canal_abi::feature::SPARES
                } else {
                    0
                }
                | if hello_flags & control::hello_flag::ACCEPT_ONE != 0 {
                    canal_abi::feature::ACCEPT_ONE
                } else {
                    0
                }
                | if hello_flags & control::hello_flag::CLOSE_MARK != 0 {
                    canal_abi::feature::CLOSE_MARK
                } else {
                    0
                }
                | if hello_flags & control::hello_flag::HOST_QUEUED != 0 {
                    canal_abi::feature::HOST_QUEUED
                } else {
                    0
                };
            let mut gcfg = self.gcfg.clone();
            if let Some((ns, nsfd)) = &conn.netns {
                let view = nsfd
                    .try_clone()
                    .map_err(|e| (sys::errno_of(&e), e.to_string()))
                    .and_then(|fd| self.networks.for_guest(*ns, fd));
                match view {
                    Ok(v) => gcfg.net = Some(v),
                    Err((e, why)) => return send_error(&conn.fd, e, &why).is_ok(),
                }
            }
            let limits = self.cfg.quota.for_guest(&crate::quota::Who {
                uid: conn.uid,
                cgroup: crate::quota::cgroup_of(pid),
                name: guest_name(gcfg.net.as_deref(), &comm),
            });
            if let Err(why) = self.size_for_quota(&mut gcfg, &limits) {
                return send_error(&conn.fd, errno::EINVAL, &why).is_ok();
            }
            let features = features | self.direct_feature(hello_flags, &gcfg, &limits);
            let features = features | fast_feature(hello_flags, features, &gcfg, &limits);
            gcfg.policy = Arc::new(crate::quota::GuestPolicy::new(
                format!("guest {id} (pid {pid} {comm})"),
                &limits,
            ));
            let made = Guest::with_features(id, key, pid, comm, gcfg, features);
            let (mut g, memfd) = match made {
                Ok(x) => x,
                Err(e) => {
                    return send_error(&conn.fd, sys::errno_of(&e), "cannot create region").is_ok()
                }
            };
            g.rates = crate::quota::Rates::new(&limits, std::time::Instant::now());
            let doorbell = match sys::eventfd() {
                Ok(d) => d,
                Err(e) => return send_error(&conn.fd, sys::errno_of(&e), "eventfd").is_ok(),
            };
            // The worker with the fewest guests takes it.
            let wi = (0..self.workers.len())
                .min_by_key(|&i| self.workers[i].lock().guests.len())
                .unwrap_or(0);
            let w = self.workers[wi].clone();
            if w.ep
                .add(
                    doorbell.as_raw_fd(),
                    sys::EP_IN,
                    token::make(token::DOORBELL, key, 0, 0),
                )
                .is_err()
            {
                return send_error(&conn.fd, errno::ENOMEM, "epoll").is_ok();
            }
            let reply = control::HelloOk {
                guest_id: id,
                region_size: g.region_size(),
            }
            .encode();
            let sent = send_msg(
                &conn.fd,
                kind::HELLO_OK,
                &reply,
                &[memfd.as_raw_fd(), doorbell.as_raw_fd()],
            );
            log::info!(
                "guest {id} attached: pid {pid} comm {} (worker {wi})",
                g.comm
            );
            self.next_guest = self.next_guest.wrapping_add(1).max(1);
            if let Some(c) = self.conns.get_mut(&key) {
                c.worker = Some(wi);
            }
            if sc {
                g.enable_shortcut(self.shortcut.clone(), wi as u32);
            }
            let mut sh = w.lock();
            sh.doorbells.insert(key, doorbell);
            sh.guests.insert(key, g);
            drop(sh);
            w.poke();
            sent.is_ok()
        }
    }

    /// NETWORK: `canal run --isolate` names a namespace's view before its guests come.
    fn on_network(&mut self, key: u32, body: &[u8], fds: Vec<OwnedFd>) -> bool {
        let Some(conn) = self.conns.get(&key) else {
            return false;
        };
        let nsfd = fds.into_iter().next();
        match self.networks.register(key, self.own_ns, body, nsfd) {
            Ok(v) => {
                log::info!(
                    "network {} registered: loopback {}, {} published port(s)",
                    v.name,
                    std::net::Ipv4Addr::from(v.lo),
                    v.publish.len()
                );
                let ok = crate::network::network_ok(&v);
                send_msg(&conn.fd, kind::NETWORK_OK, &ok, &[]).is_ok()
            }
            Err((e, why)) => send_error(&conn.fd, e, &why).is_ok(),
        }
    }

    /// SECCOMP: serve a registered network's seccomp-filtered programs.
    fn on_seccomp(&mut self, key: u32, fds: Vec<OwnedFd>) -> bool {
        let Some(conn) = self.conns.get(&key) else {
            return false;
        };
        let Some(view) = self.networks.registered_view(key) else {
            return send_error(&conn.fd, errno::EINVAL, "SECCOMP before NETWORK").is_ok();
        };
        let Some(l) = fds.into_iter().next().filter(sys::is_seccomp_listener) else {
            return send_error(
                &conn.fd,
                errno::EINVAL,
                "SECCOMP without a notification listener",
            )
            .is_ok();
        };
        let limits = self.cfg.quota.for_guest(&crate::quota::Who {
            uid: conn.uid,
            cgroup: crate::quota::cgroup_of(conn.pid),
            name: guest_name(Some(&view), ""),
        });
        let policy = Arc::new(crate::quota::GuestPolicy::new(
            format!("network {} (seccomp service)", view.name),
            &limits,
        ));
        match crate::seccomp::serve(l, view, self.cfg.loopback_only, policy) {
            Ok(()) => send_msg(&conn.fd, kind::SECCOMP_OK, &[], &[]).is_ok(),
            Err(e) => send_error(&conn.fd, sys::errno_of(&e), "cannot serve it").is_ok(),
        }
    }

    /// A guest's sizes under its quota (`sockets`, `data-mib`; the socket count never
    /// above canald's own): Err(why) if they describe no region.
    fn size_for_quota(
        &self,
        gcfg: &mut GuestConfig,
        limits: &crate::quota::Limits,
    ) -> Result<(), String> {
        if limits.sockets.is_none() && limits.data_mib.is_none() {
            return Ok(());
        }
        let mut c = self.cfg.clone();
        c.sockets = limits.sockets.map_or(c.sockets, |s| s.min(c.sockets));
        c.data_mib = limits.data_mib.unwrap_or(c.data_mib);
        let sized = c
            .guest_config()
            .map_err(|e| format!("the quota's sizes do not fit: {e}"))?;
        gcfg.layout = sized.layout;
        gcfg.ring_size = sized.ring_size;
        Ok(())
    }

    /// PORT: a slot's wake-up eventfd.
    fn on_port(&mut self, key: u32, body: &[u8], fds: Vec<OwnedFd>) -> bool {
        let Some(conn) = self.conns.get(&key) else {
            return false;
        };
        {
            let Some(w) = conn.worker.and_then(|i| self.workers.get(i)) else {
                return send_error(&conn.fd, errno::EINVAL, "PORT before HELLO").is_ok();
            };
            let mut sh = w.lock();
            let Some(g) = sh.guests.get_mut(&key) else {
                return send_error(&conn.fd, errno::EINVAL, "PORT before HELLO").is_ok();
            };
            let Some(slot) = control::leading_u32(body) else {
                return send_error(&conn.fd, errno::EINVAL, "short PORT").is_ok();
            };
            let Some(fd) = fds.into_iter().next() else {
                return send_error(&conn.fd, errno::EINVAL, "PORT without eventfd").is_ok();
            };
            let set = g.set_port(slot, fd);
            drop(sh);
            match set {
                Ok(()) => {
                    // A new holder of the slot: its predecessors' bells go (§8.8).
                    let mut shc = self.shortcut.lock().unwrap_or_else(|e| e.into_inner());
                    shc.bells.forget_slot(key, slot);
                    drop(shc);
                    send_msg(&conn.fd, kind::PORT_OK, &slot.to_le_bytes(), &[]).is_ok()
                }
                Err(e) => send_error(&conn.fd, e, "bad PORT").is_ok(),
            }
        }
    }

    /// BELL_SET: a guest thread's bell for the guest at the other side of an arena.
    /// BELL_GET: the bell the guest at the other side registered for the asker
    /// (protocol §8.8).
    fn on_bell(&mut self, key: u32, asked: u16, body: &[u8], fds: Vec<OwnedFd>) -> bool {
        let Some(conn) = self.conns.get(&key) else {
            return false;
        };
        let Some(control::Bell { arena, tag }) = control::Bell::decode(body) else {
            return send_error(&conn.fd, errno::EINVAL, "short BELL").is_ok();
        };
        if tag == 0 || tag == canal_abi::segment::bell::SEVERAL {
            return send_error(&conn.fd, errno::EINVAL, "bad bell tag").is_ok();
        }
        let mut sh = self.shortcut.lock().unwrap_or_else(|e| e.into_inner());
        let Some(peer) = sh.arenas.peer_of(arena, key) else {
            return send_error(&conn.fd, errno::ENOENT, "no such arena").is_ok();
        };
        let reply = control::Bell { arena, tag }.encode();
        if asked == kind::BELL_GET {
            let sent = match sh.bells.get(peer, tag, key) {
                Some(fd) => send_msg(&conn.fd, kind::BELL_OK, &reply, &[fd.as_raw_fd()]),
                None => return send_error(&conn.fd, errno::ENOENT, "no such bell").is_ok(),
            };
            sh.bells.gave(key);
            return sent.is_ok();
        }
        // Only an eventfd: a peer writes 8 bytes to it on its data path, which a pipe
        // or a socket of the owner's choosing could make block or send elsewhere.
        let Some(fd) = fds.into_iter().next().filter(sys::is_eventfd) else {
            return send_error(&conn.fd, errno::EINVAL, "BELL_SET without an eventfd").is_ok();
        };
        match sh.bells.set(key, tag, peer, fd) {
            Ok(()) => send_msg(&conn.fd, kind::BELL_OK, &reply, &[]).is_ok(),
            Err(e) => send_error(&conn.fd, e, "too many bells").is_ok(),
        }
    }

    /// STAT: the listing (format 1: text, else JSON), in chunks.
    fn on_stat(&mut self, key: u32, body: &[u8]) -> bool {
        {
            let format = control::leading_u32(body).unwrap_or(0);
            let snap = self.snapshot();
            let text = match format {
                1 => stat::render_text(&snap),
                2 => crate::metrics::prom::render(&snap),
                _ => stat::render_json(&snap),
            };
            let Some(conn) = self.conns.get_mut(&key) else {
                return false;
            };
            for chunk in text
                .as_bytes()
                .chunks(CTL_MAX - CTL_HEADER - 1024)
                .chain(std::iter::once(&[][..]))
            {
                let mut m = control::encode_header(kind::STAT_CHUNK, chunk.len() as u32).to_vec();
                m.extend_from_slice(chunk);
                conn.out_bytes += m.len();
                conn.out.push_back(m);
            }
            if conn.out_bytes > OUT_MAX {
                return false;
            }
            self.flush_out(key)
        }
    }

    /// WATCH: close a socket when the kernel says the guest's last descriptor is gone.
    fn on_watch(&mut self, key: u32, body: &[u8], fds: Vec<OwnedFd>) -> bool {
        let Some(conn) = self.conns.get(&key) else {
            return false;
        };
        {
            // No reply: the guest sends it without waiting.
            let worker = conn.worker.and_then(|i| self.workers.get(i));
            let handle = control::leading_u32(body);
            if let (Some(w), Some(fd), Some(handle)) = (worker, fds.into_iter().next(), handle) {
                let mut sh = w.lock();
                if let Some(g) = sh.guests.get_mut(&key) {
                    if self.watches.add(&self.workers[0].ep, key, g, handle, fd) {
                        // The guest may now close a connected stream without CLOSE.
                        g.set_flags(
                            canal_abi::handle_index(handle),
                            canal_abi::sock_flag::WATCHED,
                            0,
                        );
                    }
                }
            }
            true
        }
    }

    /// HOST_SOCKET: the guest's program passes a listener or an unconnected stream to
    /// another process; the guest gets the host socket and canald serves it no more
    /// (`guest::handover`; the entry stays, HANDED_OVER, until the guest closes it).
    /// The socket may be served by another worker (virtual RSS): that worker's share
    /// of the guest hands it over.
    fn on_host_socket(&mut self, key: u32, body: &[u8]) -> bool {
        self.give_host_socket(key, body, kind::HOST_SOCKET_OK, |g, ep, handle| {
            g.hand_over(ep, handle)
        })
    }

    /// LISTENER_SOCKET: a copy of a NATIVE_ACCEPT listener's host socket, which the
    /// guest accepts its native clients on (`Guest::share_listener`).
    fn on_listener_socket(&mut self, key: u32, body: &[u8]) -> bool {
        self.give_host_socket(key, body, kind::LISTENER_SOCKET_OK, |g, _, handle| {
            g.share_listener(handle)
        })
    }

    /// CLOSE_CHECK: the guest closed its last descriptor of a shared socket; if no
    /// descriptor of it is left anywhere (its WATCH hung up: the other holders ended
    /// without closing it), it closes now, before the guest's close returns, as a
    /// native close frees a listener's or a datagram socket's address at once.
    fn on_close_check(&mut self, key: u32, body: &[u8]) -> bool {
        let Some(conn) = self.conns.get(&key) else {
            return false;
        };
        let Some(handle) = control::leading_u32(body) else {
            return send_error(&conn.fd, errno::EINVAL, "short request").is_ok();
        };
        let index = canal_abi::handle_index(handle);
        let gen = canal_abi::handle_generation(handle) as u16;
        let closed = self
            .watches
            .take_if_hung_up(&self.workers[0].ep, key, index, gen);
        if closed {
            self.on_guest_socket(key, index, gen, Guest::close_watched);
        }
        let Some(conn) = self.conns.get(&key) else {
            return false;
        };
        let mut reply = [0u8; 8];
        reply[..4].copy_from_slice(&handle.to_le_bytes());
        reply[4..].copy_from_slice(&u32::from(closed).to_le_bytes());
        send_msg(&conn.fd, kind::CLOSE_CHECK_OK, &reply, &[]).is_ok()
    }

    /// Answers a request naming a socket (`handle u32`) with `ok` and the host socket
    /// `give` returns, from whichever worker serves the socket (virtual RSS).
    fn give_host_socket(
        &mut self,
        key: u32,
        body: &[u8],
        ok: u16,
        give: impl Fn(
            &mut crate::guest::state::Guest,
            &crate::sys::Epoll,
            u32,
        ) -> Result<std::os::fd::OwnedFd, crate::guest::handover::Refusal>,
    ) -> bool {
        let Some(conn) = self.conns.get(&key) else {
            return false;
        };
        let Some(handle) = control::leading_u32(body) else {
            return send_error(&conn.fd, errno::EINVAL, "short request").is_ok();
        };
        let Some(home) = conn.worker.and_then(|i| self.workers.get(i)) else {
            return send_error(&conn.fd, errno::EINVAL, "request before HELLO").is_ok();
        };
        let mut r = Err((errno::EBADF, "no such guest"));
        let mut away = None;
        if let Some(g) = home.lock().guests.get_mut(&key) {
            away = g.away_owner(handle);
            if away.is_none() {
                r = give(g, &home.ep, handle);
            }
        }
        // The worker's next round wakes the socket's sleepers (HANDED_OVER is news).
        home.poke();
        if let Some(w) = away.and_then(|i| self.workers.get(i as usize)) {
            if let Some(g) = w.lock().shadows.get_mut(&key) {
                r = give(g, &w.ep, handle);
            }
            w.poke();
        }
        match r {
            Ok(fd) => send_msg(&conn.fd, ok, &handle.to_le_bytes(), &[fd.as_raw_fd()]).is_ok(),
            Err((e, why)) => send_error(&conn.fd, e, why).is_ok(),
        }
    }

    /// `feature::DIRECT` for a guest that asked, where it gives the guest nothing it
    /// could not do itself: canald's network, no destination policy, rate or socket
    /// quota to enforce (a quota's sockets are canald's to count).
    fn direct_feature(
        &self,
        hello_flags: u32,
        gcfg: &GuestConfig,
        limits: &crate::quota::Limits,
    ) -> u64 {
        let direct = self.cfg.direct
            && hello_flags & control::hello_flag::DIRECT != 0
            && unpoliced(gcfg, limits)
            && limits.sockets.is_none()
            && crate::guest::shared::lock(&self.shortcut)
                .directory
                .is_some();
        let native = hello_flags & control::hello_flag::NATIVE_ACCEPT != 0;
        let quiet = if hello_flags & control::hello_flag::NATIVE_QUIET != 0 {
            canal_abi::feature::NATIVE_QUIET
        } else {
            0
        };
        match (direct, native) {
            (true, true) => canal_abi::feature::DIRECT | canal_abi::feature::NATIVE_ACCEPT | quiet,
            (true, false) => canal_abi::feature::DIRECT,
            _ => 0,
        }
    }

    /// DIRECTORY: the port directory, for a guest with the DIRECT feature.
    fn on_directory(&mut self, key: u32) -> bool {
        let Some(conn) = self.conns.get(&key) else {
            return false;
        };
        let Some(home) = conn.worker.and_then(|i| self.workers.get(i)) else {
            return send_error(&conn.fd, errno::EINVAL, "DIRECTORY before HELLO").is_ok();
        };
        let direct = home
            .lock()
            .guests
            .get(&key)
            .is_some_and(|g| g.region().header().features & canal_abi::feature::DIRECT != 0);
        let file = crate::guest::shared::lock(&self.shortcut)
            .directory
            .as_ref()
            .filter(|_| direct)
            .map(|d| d.share());
        match file {
            Some(Ok(fd)) => send_msg(
                &conn.fd,
                kind::DIRECTORY_OK,
                &(control::directory::SIZE as u64).to_le_bytes(),
                &[fd.as_raw_fd()],
            )
            .is_ok(),
            Some(Err(e)) => send_error(&conn.fd, sys::errno_of(&e), "no directory").is_ok(),
            None => send_error(&conn.fd, errno::EOPNOTSUPP, "not a DIRECT guest").is_ok(),
        }
    }

    /// SEGMENT: a pair segment's memfd for a short-circuited connection.
    /// ARENA: a pair arena's memfd (protocol §8.7), the same way.
    fn on_segment(&mut self, key: u32, asked: u16, body: &[u8]) -> bool {
        let Some(conn) = self.conns.get(&key) else {
            return false;
        };
        let arena = asked == kind::ARENA;
        let Some(id) = control::leading_u32(body) else {
            let what = if arena {
                "short ARENA"
            } else {
                "short SEGMENT"
            };
            return send_error(&conn.fd, errno::EINVAL, what).is_ok();
        };
        let sh = self.shortcut.lock().unwrap_or_else(|e| e.into_inner());
        let (file, ok_kind, slots) = if arena {
            let slots = canal_abi::segment::ARENA_SLOTS;
            (sh.arenas.file_for(id, key), kind::ARENA_OK, slots)
        } else {
            (sh.segment_fd(id, key), kind::SEGMENT_OK, 0)
        };
        match file {
            Some((fd, size)) => {
                let mut reply = [0u8; control::SEGMENT_OK_BODY];
                reply[0..4].copy_from_slice(&id.to_le_bytes());
                reply[4..8].copy_from_slice(&slots.to_le_bytes());
                reply[8..16].copy_from_slice(&size.to_le_bytes());
                send_msg(&conn.fd, ok_kind, &reply, &[fd.as_raw_fd()]).is_ok()
            }
            None if arena => send_error(&conn.fd, errno::ENOENT, "no such arena").is_ok(),
            None => send_error(&conn.fd, errno::ENOENT, "no such segment").is_ok(),
        }
    }

    /// EVLOG: the guest's own event log, or that of the guest at the other side of
    /// one of its pair segments (protocol §8.6).
    fn on_evlog(&mut self, key: u32, body: &[u8]) -> bool {
        let Some(conn) = self.conns.get(&key) else {
            return false;
        };
        let Some(seg) = control::leading_u32(body) else {
            return send_error(&conn.fd, errno::EINVAL, "short EVLOG").is_ok();
        };
        let owner = if seg == 0 {
            Some(key)
        } else {
            let sh = self.shortcut.lock().unwrap_or_else(|e| e.into_inner());
            sh.segments
                .get(&seg)
                .filter(|r| r.conns.contains(&key))
                .map(|r| {
                    if r.conns[0] == key {
                        r.conns[1]
                    } else {
                        r.conns[0]
                    }
                })
        };
        let file = owner.and_then(|o| {
            let w = self.conns.get(&o)?.worker?;
            let sh = self.workers.get(w)?.lock();
            sh.guests.get(&o)?.evlog.clone().map(|f| (o, f))
        });
        match file {
            Some((owner, f)) => {
                let mut reply = [0u8; control::EVLOG_OK_BODY];
                reply[0..4].copy_from_slice(&owner.to_le_bytes());
                reply[8..16].copy_from_slice(&canal_abi::evlog::EVLOG_SIZE.to_le_bytes());
                send_msg(&conn.fd, kind::EVLOG_OK, &reply, &[f.fd.as_raw_fd()]).is_ok()
            }
            None => send_error(&conn.fd, errno::ENOENT, "no event log").is_ok(),
        }
    }

    /// VM_REGION: a region file for a VM guest (`canal vm`).
    fn on_vm_region(&mut self, key: u32, body: &[u8]) -> bool {
        let Some(conn) = self.conns.get(&key) else {
            return false;
        };
        {
            if conn.worker.is_some() {
                return send_error(&conn.fd, errno::EINVAL, "already attached").is_ok();
            }
            let id = self.next_guest;
            let bell_dir = self
                .cfg
                .socket
                .parent()
                .filter(|d| !d.as_os_str().is_empty())
                .unwrap_or(Path::new("."))
                .to_path_buf();
            let ep = &self.workers[0].ep;
            match self.vm.create(
                ep,
                key,
                id,
                conn.pid,
                &self.gcfg,
                body,
                &bell_dir,
                &mut self.networks,
            ) {
                Ok(c) => {
                    let g = c.guest;
                    let sent = send_msg(&conn.fd, kind::VM_REGION_OK, &c.reply, &[]);
                    log::info!(
                        "guest {id} attached: {} (VM region{})",
                        g.comm,
                        if c.host_vector.is_some() {
                            ", ivshmem doorbells"
                        } else {
                            ""
                        }
                    );
                    self.next_guest = self.next_guest.wrapping_add(1).max(1);
                    // VM guests live on worker 0: it serves the VM processes' pidfds
                    // and the ivshmem servers, and bounds its sleep while it has a VM
                    // that cannot kick it.
                    let w = self.workers[0].clone();
                    let mut sh = w.lock();
                    if let Some(hv) = c.host_vector {
                        // The guest's kicks: canald's ivshmem vector, read like a
                        // process guest's doorbell (and removed with it).
                        if w.ep
                            .add(
                                hv.as_raw_fd(),
                                sys::EP_IN,
                                token::make(token::DOORBELL, key, 0, 0),
                            )
                            .is_ok()
                        {
                            sh.doorbells.insert(key, hv);
                        }
                    }
                    sh.guests.insert(key, g);
                    drop(sh);
                    w.poke();
                    if let Some(c) = self.conns.get_mut(&key) {
                        c.worker = Some(0);
                    }
                    sent.is_ok()
                }
                Err((e, text)) => send_error(&conn.fd, e, &text).is_ok(),
            }
        }
    }

    /// VM_PID: the QEMU process whose exit ends a VM guest.
    fn on_vm_pid(&mut self, key: u32, body: &[u8], fds: Vec<OwnedFd>) -> bool {
        let Some(conn) = self.conns.get(&key) else {
            return false;
        };
        {
            let Some(pid) = control::leading_u32(body) else {
                return send_error(&conn.fd, errno::EINVAL, "short VM_PID").is_ok();
            };
            let ep = &self.workers[0].ep;
            match self.vm.set_pid(ep, key, pid, fds.into_iter().next()) {
                Ok(()) => {
                    if let Some(g) = self.workers[0].lock().guests.get_mut(&key) {
                        g.pid = pid;
                    }
                    send_msg(&conn.fd, kind::VM_PID_OK, &[], &[]).is_ok()
                }
                Err((e, text)) => send_error(&conn.fd, e, text).is_ok(),
            }
        }
    }

    /// DOORBELLS (virtual RSS): one doorbell per worker for this guest (its home's is
    /// the HELLO doorbell; the others are made on the first DOORBELLS and sent again to
    /// an exec'd image), then the home starts spreading the guest's sockets.
    fn doorbells(&mut self, key: u32) -> bool {
        let Some(conn) = self.conns.get(&key) else {
            return false;
        };
        let fail = |e: i32, t: &str| send_error(&conn.fd, e, t).is_ok();
        let (Some(home), Some(boxes)) = (conn.worker, self.boxes.clone()) else {
            return fail(errno::EINVAL, "DOORBELLS before HELLO");
        };
        let Some(hw) = self.workers.get(home) else {
            return fail(errno::EINVAL, "DOORBELLS before HELLO");
        };
        let offered = hw
            .lock()
            .guests
            .get(&key)
            .is_some_and(|g| g.region().header().features & canal_abi::feature::VRSS != 0);
        if !offered {
            return fail(errno::EOPNOTSUPP, "virtual RSS not offered");
        }
        let mut fds = Vec::new();
        for w in &self.workers {
            let d = if w.id as usize == home {
                let sh = w.lock();
                match sh.doorbells.get(&key).map(|d| d.try_clone()) {
                    Some(Ok(d)) => d,
                    _ => return fail(errno::EINVAL, "no doorbell"),
                }
            } else if let Some(d) = crate::daemon::existing_doorbell(w, key) {
                // Asked again (an exec'd image): the same eventfd, since the guest's
                // other processes still kick the one they hold.
                d
            } else {
                let d = match sys::eventfd() {
                    Ok(d) => d,
                    Err(e) => return fail(sys::errno_of(&e), "eventfd"),
                };
                let tok = token::make(token::VRSS_DOORBELL, key, 0, 0);
                if w.ep.add(d.as_raw_fd(), sys::EP_IN, tok).is_err() {
                    return fail(errno::ENOMEM, "epoll");
                }
                let mine = match d.try_clone() {
                    Ok(x) => x,
                    Err(e) => {
                        w.ep.delete(d.as_raw_fd());
                        return fail(sys::errno_of(&e), "dup");
                    }
                };
                let mut sh = w.lock();
                if let Some(old) = sh.vrss_doorbells.insert(key, d) {
                    w.ep.delete(old.as_raw_fd());
                }
                mine
            };
            fds.push(d);
        }
        let raw: Vec<i32> = fds.iter().map(|f| f.as_raw_fd()).collect();
        let body = (raw.len() as u32).to_le_bytes();
        let sent = send_msg(&conn.fd, kind::DOORBELLS_OK, &body, &raw).is_ok();
        if sent {
            if let Some(g) = hw.lock().guests.get_mut(&key) {
                g.enable_vrss(home as u32, boxes);
            }
        }
        sent
    }
}

/// A guest's name for the quota table: its network's (`isolated:NAME`, `vm:NAME`),
/// else its program's.
fn guest_name(net: Option<&crate::guest::netview::NetView>, comm: &str) -> String {
    net.and_then(|n| {
        n.name
            .strip_prefix("isolated:")
            .or_else(|| n.name.strip_prefix("vm:"))
    })
    .unwrap_or(comm)
    .to_string()
}

/// `feature::FAST_CONNECT` (protocol §8.10) for a guest that asked, whose connects
/// canald need not see: ring-to-ring connections in packed arenas without zones, one
/// worker, no connection or request rate to apply.
fn fast_feature(
    hello_flags: u32,
    features: u64,
    gcfg: &GuestConfig,
    limits: &crate::quota::Limits,
) -> u64 {
    use canal_abi::feature as f;
    use control::hello_flag as h;
    let needs = f::SHORTCUT | f::ARENAS | f::PACKED_ARENAS | f::CLOSE_MARK;
    // A network's view names a connection's local end apart from its destination:
    // only a library that reads the table's sources may connect by ticket there.
    let names_ok = gcfg.net.is_none() || hello_flags & h::FAST_SOURCE != 0;
    // The destination policy (--loopback-only, allow/deny lists) is a function of the
    // host address, fixed for the guest's life: a record is listed only after a
    // CONNECT to its destination passed it. Rates count requests a ticket skips.
    let ok = hello_flags & h::FAST_CONNECT != 0
        && features & needs == needs
        && features & (f::ZONES | f::VRSS | f::DOORBELL) == 0
        && names_ok
        && unmetered(limits);
    if ok {
        f::FAST_CONNECT
    } else {
        0
    }
}

/// A guest in canald's own network with no destination policy or rate quota: the
/// direct path, which bypasses canald's requests, gives it nothing it could not do
/// through them.
fn unpoliced(gcfg: &GuestConfig, limits: &crate::quota::Limits) -> bool {
    gcfg.net.is_none()
        && !gcfg.loopback_only
        && limits.allow.is_none()
        && limits.deny.is_none()
        && unmetered(limits)
}

/// No connection or request rate to count against the guest.
fn unmetered(limits: &crate::quota::Limits) -> bool {
    limits.connect_rate.unwrap_or(0) == 0 && limits.request_rate.unwrap_or(0) == 0
}
