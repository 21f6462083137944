//! The daemon: control socket, guest registry and the poller loop.
//!
//! The daemon's thread runs worker 0 (`worker`): epoll over the control listener,
//! control connections, and its guests' doorbells and host sockets; `--workers N`
//! adds pollers in their own threads, each owning a disjoint set of guests. Each round
//! a poller serves its guests (channel scheduler: requests, then receive, then
//! transmit work), then, after its adaptive spin budget, sleeps per protocol §6.
#![forbid(unsafe_code)]
use crate::config::Config;

use crate::engine::{self, NotifyMode};
use crate::guest::config::GuestConfig;
use crate::guest::shared::Shared as ShortcutShared;
use crate::guest::shared::SharedRef as ShortcutRef;
use crate::guest::socket::token;
use crate::guest::state::Guest;
use crate::stat::{self, Snapshot};
use crate::sys::{self, Epoll};
use crate::worker::{Poller, Worker};
use canal_abi::control::{self, kind, CTL_HEADER, CTL_MAX};
use canal_abi::errno;
use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A control connection.
pub(crate) struct Conn {
    pub(crate) fd: OwnedFd,
    pub(crate) pid: u32,
    /// The peer's uid (SO_PEERCRED): its quotas (`[quota.uid.*]`).
    pub(crate) uid: u32,
    /// A peer of another uid: its first message is answered with EACCES, then it is
    /// closed (closing at once would reset the peer before it reads the answer).
    pub(crate) refused: bool,
    /// The worker serving this connection's guest (after HELLO).
    pub(crate) worker: Option<usize>,
    /// Reply messages (STAT chunks) waiting for the peer to read: the poller never
    /// blocks on a slow reader, it waits for EPOLLOUT.
    pub(crate) out: std::collections::VecDeque<Vec<u8>>,
    pub(crate) out_bytes: usize,
    /// The peer's network namespace when it is not canald's, with a descriptor that
    /// pins it (`network.rs`): its guest gets the namespace's own address view.
    pub(crate) netns: Option<(sys::NsId, OwnedFd)>,
}

/// Refused peers (another uid) waiting to send their first message; beyond this they
/// are answered and closed at once.
pub(crate) const MAX_REFUSED: usize = 16;

/// Largest backlog of unread replies per connection before it is dropped.
pub(crate) const OUT_MAX: usize = 16 << 20;

pub struct Daemon {
    pub(crate) cfg: Config,
    pub(crate) gcfg: GuestConfig,
    /// Worker 0 (this thread; its epoll also holds the control descriptors), then the
    /// others.
    pub(crate) workers: Vec<Arc<Worker>>,
    pub(crate) threads: Vec<std::thread::JoinHandle<()>>,
    pub(crate) listener: OwnedFd,
    pub(crate) signals: Option<OwnedFd>,
    /// The lock on `<socket>.lock`; None when the service manager made the socket
    /// (socket activation), which then also keeps its file at exit.
    pub(crate) _lock: Option<std::fs::File>,
    /// A spare descriptor for accepting when out of descriptors (`fdbudget`).
    pub(crate) reserve: crate::fdbudget::Reserve,
    pub(crate) conns: BTreeMap<u32, Conn>,
    pub(crate) next_conn: u32,
    pub(crate) next_guest: u32,
    pub(crate) idle_since: Instant,
    pub(crate) stop: bool,
    /// Kernel-counted liveness of guest sockets (WATCH).
    pub(crate) watches: crate::watch::Watches,
    pub(crate) shortcut: ShortcutRef,
    /// VM guests (`vm.rs`): region files, VM processes, the bounded sleep.
    pub(crate) vm: crate::vm::Vms,
    /// Guest networks: isolated namespaces' and VMs' address views (`network.rs`).
    pub(crate) networks: crate::network::Networks,
    /// canald's own network namespace.
    pub(crate) own_ns: sys::NsId,
    /// Every worker's mailbox (virtual RSS), once all workers exist.
    pub(crate) boxes: Option<crate::guest::shared::Boxes>,
    /// A host-wide canald serving other users (`serve-users`): their own daemons.
    pub(crate) users: Option<crate::users::UserDaemons>,
}

/// Why canald could not start serving its control socket.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Trust(#[from] crate::ctldir::TrustError),
    #[error("{} is locked by another canald that does not answer", .0.display())]
    Locked(PathBuf),
    #[error("{} exists and is not a socket", .0.display())]
    NotSocket(PathBuf),
    #[error("{0}: {1}")]
    Io(String, #[source] std::io::Error),
}

/// What `Daemon::bind` found at the socket path.
pub enum Bound {
    Serving(Box<Daemon>),
    /// Another canald answers there; nothing to do.
    AlreadyRunning,
}

fn answers(path: &Path) -> bool {
    sys::seqpacket_connect(path).is_ok()
}

impl Daemon {
    /// Creates the control socket (parent dir 0700, a lock file so that two daemons
    /// racing for one path cannot both serve, stale socket removal).
    pub(crate) fn bind(mut cfg: Config) -> Result<Bound, BindError> {
        let nofile = sys::raise_nofile();
        let cap = crate::fdbudget::per_guest_cap(nofile);
        crate::guest::ports::keep_within(crate::fdbudget::headroom(nofile));
        if (cfg.sockets as u64) > cap {
            // One guest must not be able to take every descriptor and lock every other
            // guest out (docs/threat-model.md, "Memory and descriptors").
            log::info!(
                "socket quota per guest {cap} (asked {}): canald may hold {nofile} \
                 descriptors; a guest's entries and WATCH ends count one each",
                cfg.sockets
            );
            cfg.sockets = cap as _;
        }
        let gcfg = cfg.guest_config()?;
        let inherited = match cfg.user_channel {
            Some(fd) => sys::inherited_channel(fd)
                .map(|c| Some((c, None)))
                .map_err(|e| BindError::Io("--user-channel".into(), e))?,
            None => sys::inherited_listener()
                .map_err(|e| BindError::Io("socket activation".into(), e))?,
        };
        let (listener, lock) = match inherited {
            Some((fd, path)) => {
                if let Some(p) = path {
                    cfg.socket = p;
                }
                log::info!(
                    "serving {} ({})",
                    cfg.socket.display(),
                    if cfg.user_channel.is_some() {
                        "connections handed over by the host-wide canald"
                    } else {
                        "socket activation"
                    }
                );
                (fd, None)
            }
            None => match Self::listen_at(cfg.socket.clone(), cfg.serve_users)? {
                Some((fd, lock)) => (fd, Some(lock)),
                None => return Ok(Bound::AlreadyRunning),
            },
        };
        // After the listener: an activated socket's path is the one users' daemons report.
        let users = if cfg.serve_users {
            let args = crate::config::layers::user_daemon_args(&cfg);
            Some(
                crate::users::UserDaemons::new(args)
                    .map_err(|e| BindError::Io("--serve-users".into(), e))?,
            )
        } else {
            None
        };
        let seg_ring = (cfg.shortcut_ring_kib.clamp(64, 1 << 20) * 1024).next_power_of_two();
        let shortcut = ShortcutShared::new(cfg.shortcut, seg_ring);
        {
            let mut sh = shortcut.lock().unwrap_or_else(|e| e.into_inner());
            sh.zones = cfg.zones;
            sh.use_arenas = cfg.arenas;
        }
        let w0 = Worker::new(0, shortcut.clone())
            .map_err(|e| BindError::Io("cannot make worker 0".into(), e))?;
        w0.ep
            .add(
                listener.as_raw_fd(),
                sys::EP_IN,
                token::make(token::LISTENER, 0, 0, 0),
            )
            .map_err(|e| BindError::Io("cannot poll the control socket".into(), e))?;
        sys::ignore_sigpipe();
        let own_ns = sys::own_netns()
            .map_err(|e| BindError::Io("cannot read my network namespace".into(), e))?;
        let cfg_dns = cfg.dns;
        Ok(Bound::Serving(Box::new(Daemon {
            shortcut,
            cfg,
            gcfg,
            workers: vec![Arc::new(w0)],
            threads: Vec::new(),
            listener,
            signals: None,
            _lock: lock,
            reserve: crate::fdbudget::Reserve::new(),
            conns: BTreeMap::new(),
            next_conn: 1,
            next_guest: 1,
            idle_since: Instant::now(),
            stop: false,
            watches: Default::default(),
            vm: Default::default(),
            networks: crate::network::Networks::new(cfg_dns),
            own_ns,
            boxes: None,
            users,
        })))
    }

    /// Creates the control socket at `path` and takes its lock; None if another canald
    /// answers there.
    /// With `for_all_users` (`--serve-users`) a missing directory is made 0755 and the
    /// socket 0666: every user may connect, and canald sorts them by uid.
    fn listen_at(
        path: PathBuf,
        for_all_users: bool,
    ) -> Result<Option<(OwnedFd, std::fs::File)>, BindError> {
        if for_all_users {
            use std::os::unix::fs::DirBuilderExt;
            let _ = std::fs::DirBuilder::new()
                .mode(0o755)
                .create(crate::ctldir::dir_of(&path));
        }
        // Created 0700 if missing; refused if another user could have planted
        // anything in it (the lock file, the socket).
        crate::ctldir::ensure_dir(crate::ctldir::dir_of(&path), crate::ctldir::Role::Daemon)?;
        let mut lock_path = path.clone().into_os_string();
        lock_path.push(".lock");
        let lock_path = PathBuf::from(lock_path);
        let lock = match sys::try_lock_file(&lock_path)
            .map_err(|e| BindError::Io(format!("cannot open {}", lock_path.display()), e))?
        {
            Some(f) => f,
            None => {
                // Another daemon holds the lock: it is starting or serving. Wait for
                // it to answer.
                let deadline = Instant::now() + Duration::from_secs(5);
                while Instant::now() < deadline {
                    if answers(&path) {
                        return Ok(None);
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                return Err(BindError::Locked(lock_path));
            }
        };
        if let Ok(meta) = std::fs::symlink_metadata(&path) {
            use std::os::unix::fs::FileTypeExt;
            if !meta.file_type().is_socket() {
                return Err(BindError::NotSocket(path));
            }
            if answers(&path) {
                return Ok(None);
            }
            // Nothing answers and we hold the lock: a stale socket file.
            std::fs::remove_file(&path)
                .map_err(|e| BindError::Io(format!("cannot remove stale {}", path.display()), e))?;
        }
        let listener = sys::seqpacket_listen(&path)
            .map_err(|e| BindError::Io(format!("cannot listen on {}", path.display()), e))?;
        if for_all_users {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).map_err(
                |e| BindError::Io(format!("cannot open {} to all users", path.display()), e),
            )?;
        }
        Ok(Some((listener, lock)))
    }

    /// SIGINT/SIGTERM end the loop cleanly (regions marked abandoned, socket removed).
    pub(crate) fn handle_signals(&mut self) -> io::Result<()> {
        let fd = sys::term_signalfd()?;
        self.ep().add(
            fd.as_raw_fd(),
            sys::EP_IN,
            token::make(token::SIGNAL, 0, 0, 0),
        )?;
        self.signals = Some(fd);
        Ok(())
    }

    /// Worker 0's epoll: control descriptors live there.
    pub(crate) fn ep(&self) -> &Epoll {
        &self.workers[0].ep
    }

    pub(crate) fn no_guests(&self) -> bool {
        self.workers.iter().all(|w| w.lock().guests.is_empty())
    }

    /// Runs until a signal or the idle timeout.
    pub(crate) fn run(&mut self) -> io::Result<()> {
        let mode = self.cfg.notify;
        if mode == NotifyMode::Poll {
            log::warn!("--notify poll never sleeps and burns a core per worker (measurement only)");
        }
        // C_p: a poller's wake-up from epoll plus one round; C_v: a guest thread's
        // wake-up from poll() on its slot eventfd (both measured here, now). C_p also
        // prices a sleep in the adaptive spin budget.
        let round = crate::worker::round_cost_ns(self.ep());
        let c_p = engine::measure_wake_ns(true) + round;
        let c_v = engine::measure_wake_ns(false);
        let n = self.cfg.workers.max(1);
        for id in 1..n {
            let w = Arc::new(Worker::new(id as u32, self.shortcut.clone())?);
            self.workers.push(w.clone());
            let p = Poller::new(w, &self.cfg, c_p, c_v);
            let cpu = (!self.cfg.pin.is_empty()).then(|| self.cfg.pin[id % self.cfg.pin.len()]);
            self.threads.push(
                std::thread::Builder::new()
                    .name(format!("canald-w{id}"))
                    .spawn(move || crate::worker::run_worker(p, cpu))?,
            );
        }
        if let Some(&cpu) = self.cfg.pin.first() {
            if let Err(e) = crate::worker::pin(cpu) {
                log::warn!("cannot pin worker 0 to CPU {cpu}: {e}");
            }
        }
        let boxes: crate::guest::shared::Boxes =
            self.workers.iter().map(|w| w.mbox.clone()).collect();
        // Short-circuit jobs for a guest homed on another worker poke that worker.
        self.shortcut
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .set_boxes(boxes.clone());
        self.boxes = Some(boxes);
        let mut p = Poller::new(self.workers[0].clone(), &self.cfg, c_p, c_v);
        log::info!(
            "serving {} (notify {}, {n} worker(s), C_p {c_p} ns, C_v {c_v} ns)",
            self.cfg.socket.display(),
            mode.name()
        );
        let mut other = Vec::new();
        while !self.stop {
            let idle_deadline = match self.cfg.idle_exit {
                Some(limit) if self.no_guests() => Some(self.idle_since + limit),
                _ => None,
            };
            p.round(&mut other, idle_deadline)?;
            for (tok, bits) in other.drain(..) {
                self.dispatch(tok, bits);
            }
            if let Some(limit) = self.cfg.idle_exit {
                if !self.no_guests() {
                    self.idle_since = Instant::now();
                } else if self.idle_since.elapsed() >= limit {
                    log::info!("no guests for {limit:?}, exiting");
                    break;
                }
            }
        }
        self.shutdown();
        Ok(())
    }

    /// Runs `act` on socket (index, gen) of connection `conn`'s guest, in its home
    /// worker, and pokes that worker (its next round publishes what changed).
    pub(crate) fn on_guest_socket(
        &self,
        conn: u32,
        index: u32,
        gen: u16,
        act: fn(&mut Guest, &Epoll, u32, u16),
    ) {
        if let Some(w) = self
            .conns
            .get(&conn)
            .and_then(|c| c.worker)
            .and_then(|i| self.workers.get(i))
        {
            if let Some(g) = w.lock().guests.get_mut(&conn) {
                act(g, &w.ep, index, gen);
            }
            w.poke();
        }
    }

    pub(crate) fn dispatch(&mut self, tok: u64, bits: u32) {
        match token::ty(tok) {
            token::LISTENER => self.accept_conns(),
            token::CONTROL => {
                let key = token::conn(tok);
                if bits & sys::EP_OUT != 0 && !self.flush_out(key) {
                    self.close_conn(key);
                    return;
                }
                if bits & !sys::EP_OUT != 0 {
                    self.read_control(key);
                }
            }
            crate::watch::TOKEN => {
                let ep = &self.workers[0].ep;
                // HUP: the guest's last descriptor is gone. IN alone: bytes written
                // to it outside the hooks.
                let hup = bits & (sys::EP_HUP | sys::EP_ERR) != 0;
                let (target, act): (_, fn(&mut Guest, &Epoll, u32, u16)) = if hup {
                    (self.watches.fired(ep, tok), Guest::close_watched)
                } else {
                    (self.watches.unseen_send(ep, tok), Guest::unseen_send)
                };
                if let Some((conn, index, gen)) = target {
                    self.on_guest_socket(conn, index, gen, act);
                }
            }
            token::IVSHMEM => {
                let ep = &self.workers[0].ep;
                let key = token::conn(tok);
                if let Some(line) = self.vm.ivshmem_event(ep, key, token::index(tok)) {
                    log::info!("{line}");
                }
                if self.vm.doorbell_attached(key) {
                    // Its QEMU can ring us now: no bounded sleep for it (§9.5).
                    let w = &self.workers[0];
                    if let Some(d) = w
                        .lock()
                        .guests
                        .get_mut(&key)
                        .and_then(|g| g.doorbell.as_mut())
                    {
                        d.attached = true;
                    }
                }
            }
            token::VM_PROCESS => {
                let key = token::conn(tok);
                log::info!("VM process of connection {key} exited");
                self.close_conn(key);
            }
            token::SIGNAL => {
                if let Some(fd) = &self.signals {
                    while let Some(sig) = sys::read_signal(fd) {
                        log::info!("signal {sig}, exiting");
                        self.stop = true;
                    }
                }
            }
            _ => {}
        }
    }

    pub(crate) fn alloc_conn_key(&mut self) -> u32 {
        loop {
            let k = self.next_conn;
            self.next_conn = if k >= 0xff_ffff { 1 } else { k + 1 };
            if !self.conns.contains_key(&k)
                && !self.workers.iter().any(|w| {
                    let sh = w.lock();
                    sh.guests.contains_key(&k) || sh.shadows.contains_key(&k)
                })
            {
                return k;
            }
        }
    }

    pub(crate) fn read_control(&mut self, key: u32) {
        let mut buf = vec![0u8; CTL_MAX];
        loop {
            let Some(conn) = self.conns.get(&key) else {
                return;
            };
            match sys::recv_with_fds(&conn.fd, &mut buf) {
                Ok(None) => return,
                Ok(Some(r)) if r.len == 0 && r.fds.is_empty() => {
                    self.close_conn(key);
                    return;
                }
                Ok(Some(_)) if conn.refused => {
                    let _ = send_error(&conn.fd, errno::EACCES, "peer uid not allowed");
                    self.close_conn(key);
                    return;
                }
                Ok(Some(r)) => {
                    let ok = if r.truncated {
                        send_error(&conn.fd, errno::EMSGSIZE, "message too large").is_ok()
                    } else {
                        self.handle_message(key, &buf[..r.len], r.fds)
                    };
                    if !ok {
                        self.close_conn(key);
                        return;
                    }
                }
                Err(_) => {
                    self.close_conn(key);
                    return;
                }
            }
        }
    }

    /// A control connection ended: if it belonged to a guest, the guest is gone.
    pub(crate) fn close_conn(&mut self, key: u32) {
        self.watches.forget_conn(&self.workers[0].ep, key);
        self.vm.forget(&self.workers[0].ep, key);
        self.networks.forget_conn(key);
        let Some(c) = self.conns.remove(&key) else {
            return;
        };
        self.ep().delete(c.fd.as_raw_fd());
        let Some(w) = c.worker.and_then(|i| self.workers.get(i)) else {
            return;
        };
        // Virtual RSS: the sockets other workers own for this guest go too.
        for o in &self.workers {
            let mut sh = o.lock();
            if let Some(d) = sh.vrss_doorbells.remove(&key) {
                o.ep.delete(d.as_raw_fd());
            }
            if let Some(g) = sh.shadows.get_mut(&key) {
                g.depart(&o.ep, Instant::now());
            }
            drop(sh);
            o.poke();
        }
        let mut sh = w.lock();
        if let Some(d) = sh.doorbells.remove(&key) {
            w.ep.delete(d.as_raw_fd());
        }
        if let Some(g) = sh.guests.get_mut(&key) {
            log::info!("guest {} (pid {}) gone", g.id, g.pid);
            g.depart(&w.ep, Instant::now());
        }
        drop(sh);
        w.poke();
    }

    /// Sends queued replies until done or the socket is full (then waits for
    /// EPOLLOUT). False: the connection failed.
    pub(crate) fn flush_out(&mut self, key: u32) -> bool {
        let Some(conn) = self.conns.get_mut(&key) else {
            return false;
        };
        while let Some(m) = conn.out.front() {
            match sys::send_with_fds(&conn.fd, m, &[], true) {
                Ok(()) => {
                    conn.out_bytes -= m.len();
                    conn.out.pop_front();
                }
                Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => break,
                Err(_) => return false,
            }
        }
        let ev = if conn.out.is_empty() {
            sys::EP_IN
        } else {
            sys::EP_IN | sys::EP_OUT
        };
        self.workers[0]
            .ep
            .modify(
                conn.fd.as_raw_fd(),
                ev,
                token::make(token::CONTROL, key, 0, 0),
            )
            .is_ok()
    }

    pub(crate) fn snapshot(&self) -> Snapshot {
        let mut guests = Vec::new();
        let mut workers = Vec::new();
        // Guest id → connection key, for what the short-circuit registry keeps by key
        // (read after the worker locks are released: the registry's lock comes first
        // elsewhere).
        let mut keys = std::collections::HashMap::new();
        for w in &self.workers {
            let sh = w.lock();
            for (&key, g) in sh.guests.iter() {
                keys.insert(g.id, key);
                let mut gs = stat::guest_stat(g);
                gs.worker = w.id;
                for k in &mut gs.sockets {
                    k.worker = w.id;
                }
                guests.push(gs);
            }
            // Counted here, when asked, not by the worker: the count walks every
            // guest's table (6,000 sockets cost a worker more than the rest of a round
            // when it counted before each sleep).
            let sockets = sh
                .guests
                .values()
                .chain(sh.shadows.values())
                .map(|g| g.socket_count())
                .sum::<usize>() as u64;
            drop(sh);
            workers.push(stat::WorkerStat::from_stats(
                w.id,
                self.cfg.notify.name(),
                &w.stats,
                sockets,
            ));
        }
        // Virtual RSS: sockets owned by other workers join their guest's list.
        for w in &self.workers {
            let sh = w.lock();
            for g in sh.shadows.values() {
                let Some(gs) = guests.iter_mut().find(|x| x.id == g.id) else {
                    continue;
                };
                for mut k in stat::guest_stat(g).sockets {
                    k.worker = w.id;
                    gs.sockets.push(k);
                }
                gs.wakes += g.wakes;
                gs.deferred_wakes += g.deferred_wakes;
                gs.requests += g.served;
                gs.errors += g.failed;
                gs.closed_tx_bytes += g.freed_bytes.0;
                gs.closed_rx_bytes += g.freed_bytes.1;
            }
        }
        {
            let shc = self.shortcut.lock().unwrap_or_else(|e| e.into_inner());
            for g in &mut guests {
                let (registered, given) = keys.get(&g.id).map_or((0, 0), |&k| shc.bells.counts(k));
                if registered + given > 0 {
                    g.bells = Some(stat::BellStat { registered, given });
                }
            }
        }
        for g in &mut guests {
            g.sockets.sort_by_key(|s| s.handle & 0xffff);
        }
        guests.sort_by_key(|g| g.id);
        Snapshot {
            pid: std::process::id(),
            socket: self.cfg.socket.display().to_string(),
            config: Some(stat::ConfigStat::from_config(&self.cfg)),
            guests,
            workers,
            networks: self
                .networks
                .views()
                .iter()
                .map(|n| stat::net_stat(n, true))
                .collect(),
        }
    }

    pub(crate) fn shutdown(&mut self) {
        for w in &self.workers {
            w.stop.store(true, std::sync::atomic::Ordering::Relaxed);
            w.poke();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        for w in &self.workers {
            let mut sh = w.lock();
            for g in sh.guests.values_mut() {
                g.close_all(&w.ep);
            }
            for g in sh.shadows.values_mut() {
                g.close_all(&w.ep);
            }
            sh.guests.clear();
            sh.shadows.clear();
            sh.doorbells.clear();
            sh.vrss_doorbells.clear();
        }
        self.conns.clear();
        self.vm.forget_all(&self.workers[0].ep);
        // We hold the lock: the socket file is ours (an activated socket's file
        // belongs to the service manager, which keeps listening on it).
        if self._lock.is_some() {
            let _ = std::fs::remove_file(&self.cfg.socket);
        }
    }
}

/// A copy of worker `w`'s doorbell for guest `key`, if it made one (the shard lock is
/// released before the caller goes on).
pub(crate) fn existing_doorbell(w: &Worker, key: u32) -> Option<OwnedFd> {
    let sh = w.lock();
    sh.vrss_doorbells.get(&key).and_then(|d| d.try_clone().ok())
}

pub(crate) fn send_msg(fd: &OwnedFd, k: u16, body: &[u8], fds: &[i32]) -> io::Result<()> {
    let mut m = Vec::with_capacity(CTL_HEADER + body.len());
    m.extend_from_slice(&control::encode_header(k, body.len() as u32));
    m.extend_from_slice(body);
    sys::send_with_fds(fd, &m, fds, true)
}

pub(crate) fn send_error(fd: &OwnedFd, err: i32, text: &str) -> io::Result<()> {
    let mut body = err.to_le_bytes().to_vec();
    body.extend_from_slice(text.as_bytes());
    send_msg(fd, kind::ERROR, &body, &[])
}
