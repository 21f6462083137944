//! The daemon: control socket, guest registry and the poller loop.
//!
//! One poller thread serves everything: epoll over the control listener, control
//! connections, guests' doorbells and host sockets. Each round it serves every guest
//! (round-robin start, bounded requests per guest), then, after `spin` rounds without
//! work, sleeps per protocol §6.
#![forbid(unsafe_code)]

use crate::guest::{token, Guest, GuestConfig};
use crate::stat::{self, Snapshot};
use crate::sys::{self, Epoll};
use canal_abi::control::{self, kind, CTL_HEADER, CTL_MAX, HELLO_BODY, HELLO_OK_BODY};
use canal_abi::sync::{fence, Ordering};
use canal_abi::{errno, Layout};
use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(Clone, Debug)]
pub struct Config {
    pub socket: PathBuf,
    /// Exit after this long without guests (None: never).
    pub idle_exit: Option<Duration>,
    pub slots: u32,
    pub sockets: u32,
    pub data_mib: u64,
    pub ring_kib: u64,
    /// Empty rounds before the poller sleeps; None: calibrated at start so the
    /// poller spins about SPIN_TARGET.
    pub spin: Option<u32>,
    /// Requests per guest per round.
    pub budget: usize,
    /// Policy: guests may only bind/connect/send to loopback addresses.
    pub loopback_only: bool,
    pub verbose: bool,
}

impl Config {
    pub fn new(socket: PathBuf) -> Config {
        Config {
            socket,
            idle_exit: None,
            slots: 256,
            sockets: 1024,
            data_mib: 256,
            ring_kib: 256,
            spin: None,
            budget: 64,
            loopback_only: false,
            verbose: false,
        }
    }

    pub fn guest_config(&self) -> Result<GuestConfig, String> {
        let data = self
            .data_mib
            .checked_mul(1 << 20)
            .ok_or("--data-mib too large")?;
        let layout = Layout::new(self.slots, self.sockets, data).ok_or_else(|| {
            format!(
                "bad region size: --slots must be a power of two <= {}, --sockets 1..={}, \
                 --data-mib >= 1",
                canal_abi::MAX_SLOTS,
                canal_abi::MAX_SOCKETS
            )
        })?;
        let ring = (self.ring_kib.max(64) * 1024).next_power_of_two();
        if 2 * ring > data {
            return Err("--ring-kib too large for --data-mib".into());
        }
        Ok(GuestConfig {
            layout,
            ring_size: ring,
            budget: self.budget.max(1),
            loopback_only: self.loopback_only,
            vm: None,
        })
    }
}

/// How long an idle poller keeps polling before it sleeps. Long enough to catch the
/// next request of a guest in a request/response loop without a doorbell, short
/// enough that an idle canald costs nothing measurable.
pub const SPIN_TARGET: Duration = Duration::from_micros(30);

/// Counts empty rounds worth SPIN_TARGET: an empty round is dominated by one
/// epoll_wait(0), so time a few of those (the guests' scans add a little on top).
fn calibrate_spin(ep: &Epoll) -> u32 {
    let mut ev = sys::empty_events(8);
    let n = 200u32;
    let t0 = Instant::now();
    for _ in 0..n {
        let _ = ep.wait(&mut ev, 0);
    }
    let per = (t0.elapsed() / n).max(Duration::from_nanos(50));
    (SPIN_TARGET.as_nanos() / per.as_nanos()).clamp(8, 4096) as u32
}

struct Conn {
    fd: OwnedFd,
    pid: u32,
    /// The doorbell eventfd of this connection's guest.
    doorbell: Option<OwnedFd>,
    /// Reply messages (STAT chunks) waiting for the peer to read: the poller never
    /// blocks on a slow reader, it waits for EPOLLOUT.
    out: std::collections::VecDeque<Vec<u8>>,
    out_bytes: usize,
}

/// Largest backlog of unread replies per connection before it is dropped.
const OUT_MAX: usize = 16 << 20;

pub struct Daemon {
    cfg: Config,
    gcfg: GuestConfig,
    ep: Epoll,
    listener: OwnedFd,
    signals: Option<OwnedFd>,
    _lock: std::fs::File,
    conns: BTreeMap<u32, Conn>,
    /// Guests by connection key (departed ones stay until their sockets are closed).
    guests: BTreeMap<u32, Guest>,
    next_conn: u32,
    next_guest: u32,
    rr: usize,
    keys: Vec<u32>,
    idle_since: Instant,
    stop: bool,
    /// VM guests (`vm.rs`): region files, VM processes, the bounded sleep.
    vm: crate::vm::Vms,
}

/// What `Daemon::bind` found at the socket path.
pub enum Bound {
    Serving(Box<Daemon>),
    /// Another canald answers there; nothing to do.
    AlreadyRunning,
}

fn log(cfg: &Config, msg: std::fmt::Arguments) {
    if cfg.verbose {
        eprintln!("canald: {msg}");
    }
}

fn answers(path: &Path) -> bool {
    sys::seqpacket_connect(path).is_ok()
}

impl Daemon {
    /// Creates the control socket (parent dir 0700, a lock file so that two daemons
    /// racing for one path cannot both serve, stale socket removal).
    pub fn bind(cfg: Config) -> Result<Bound, String> {
        let gcfg = cfg.guest_config()?;
        let path = cfg.socket.clone();
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            use std::os::unix::fs::DirBuilderExt;
            if !dir.exists() {
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(dir)
                    .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
            }
        }
        let mut lock_path = path.clone().into_os_string();
        lock_path.push(".lock");
        let lock_path = PathBuf::from(lock_path);
        let lock = match sys::try_lock_file(&lock_path)
            .map_err(|e| format!("cannot open {}: {e}", lock_path.display()))?
        {
            Some(f) => f,
            None => {
                // Another daemon holds the lock: it is starting or serving. Wait for
                // it to answer.
                let deadline = Instant::now() + Duration::from_secs(5);
                while Instant::now() < deadline {
                    if answers(&path) {
                        return Ok(Bound::AlreadyRunning);
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                return Err(format!(
                    "{} is locked by another canald that does not answer",
                    lock_path.display()
                ));
            }
        };
        if let Ok(meta) = std::fs::symlink_metadata(&path) {
            use std::os::unix::fs::FileTypeExt;
            if !meta.file_type().is_socket() {
                return Err(format!("{} exists and is not a socket", path.display()));
            }
            if answers(&path) {
                return Ok(Bound::AlreadyRunning);
            }
            // Nothing answers and we hold the lock: a stale socket file.
            std::fs::remove_file(&path)
                .map_err(|e| format!("cannot remove stale {}: {e}", path.display()))?;
        }
        let listener = sys::seqpacket_listen(&path)
            .map_err(|e| format!("cannot listen on {}: {e}", path.display()))?;
        let ep = Epoll::new().map_err(|e| e.to_string())?;
        ep.add(
            listener.as_raw_fd(),
            sys::EP_IN,
            token::make(token::LISTENER, 0, 0, 0),
        )
        .map_err(|e| e.to_string())?;
        sys::ignore_sigpipe();
        Ok(Bound::Serving(Box::new(Daemon {
            cfg,
            gcfg,
            ep,
            listener,
            signals: None,
            _lock: lock,
            conns: BTreeMap::new(),
            guests: BTreeMap::new(),
            next_conn: 1,
            next_guest: 1,
            rr: 0,
            keys: Vec::new(),
            idle_since: Instant::now(),
            stop: false,
            vm: Default::default(),
        })))
    }

    /// SIGINT/SIGTERM end the loop cleanly (regions marked abandoned, socket removed).
    pub fn handle_signals(&mut self) -> io::Result<()> {
        let fd = sys::term_signalfd()?;
        self.ep.add(
            fd.as_raw_fd(),
            sys::EP_IN,
            token::make(token::SIGNAL, 0, 0, 0),
        )?;
        self.signals = Some(fd);
        Ok(())
    }

    pub fn socket_path(&self) -> &Path {
        &self.cfg.socket
    }

    /// Runs until a signal or the idle timeout.
    pub fn run(&mut self) -> io::Result<()> {
        let mut events = sys::empty_events(256);
        let mut idle_rounds = 0u32;
        let spin = self.cfg.spin.unwrap_or_else(|| calibrate_spin(&self.ep));
        log(
            &self.cfg,
            format_args!("serving {} (spin {spin} rounds)", self.cfg.socket.display()),
        );
        while !self.stop {
            let sleeping = idle_rounds >= spin;
            let timeout = if sleeping { self.prepare_sleep() } else { 0 };
            let n = if timeout != 0 && self.vm.active() {
                // VM guests cannot kick us: sleep in bounded backoff (vm.rs).
                let ns = self.vm.next_sleep_ns(timeout);
                self.ep.wait_ns(&mut events, ns)?
            } else {
                self.ep.wait(&mut events, timeout)?
            };
            if sleeping {
                for g in self.guests.values() {
                    g.set_host_sleeping(0);
                }
                idle_rounds = 0;
            }
            let mut work = n > 0;
            for ev in &events[..n] {
                let (tok, bits) = (ev.u64, ev.events);
                self.dispatch(tok, bits);
            }
            work |= self.serve_guests();
            self.reap();
            if self.guests.is_empty() {
                if let Some(limit) = self.cfg.idle_exit {
                    if self.idle_since.elapsed() >= limit {
                        log(&self.cfg, format_args!("no guests for {limit:?}, exiting"));
                        break;
                    }
                }
            } else {
                self.idle_since = Instant::now();
            }
            idle_rounds = if work {
                self.vm.note_work();
                0
            } else {
                idle_rounds.saturating_add(1)
            };
        }
        self.shutdown();
        Ok(())
    }

    /// Protocol §6, host side: publish "sleeping", fence, re-check every guest. Returns
    /// the epoll timeout: 0 if work showed up, else until the next deadline (or -1).
    fn prepare_sleep(&mut self) -> i32 {
        for g in self.guests.values() {
            if g.gone.is_none() {
                g.set_host_sleeping(1);
            }
        }
        fence(Ordering::SeqCst);
        if self
            .guests
            .values()
            .any(|g| g.gone.is_none() && g.has_pending())
        {
            for g in self.guests.values() {
                g.set_host_sleeping(0);
            }
            return 0;
        }
        let now = Instant::now();
        let mut until: Option<Instant> =
            self.guests.values().filter_map(|g| g.next_deadline()).min();
        if self.guests.is_empty() {
            if let Some(limit) = self.cfg.idle_exit {
                let t = self.idle_since + limit;
                until = Some(until.map_or(t, |u| u.min(t)));
            }
        }
        match until {
            None => -1,
            Some(t) => {
                let ms = t.saturating_duration_since(now).as_millis() + 1;
                ms.min(60_000) as i32
            }
        }
    }

    fn serve_guests(&mut self) -> bool {
        if self.guests.is_empty() {
            return false;
        }
        self.keys.clear();
        self.keys.extend(self.guests.keys().copied());
        let n = self.keys.len();
        self.rr = self.rr.wrapping_add(1);
        let now = Instant::now();
        let mut work = false;
        for i in 0..n {
            let key = self.keys[(self.rr + i) % n];
            if let Some(g) = self.guests.get_mut(&key) {
                work |= g.service_round(&self.ep, now).did_work();
            }
        }
        work
    }

    /// Drops departed guests whose sockets are all closed (or whose drain time ran out).
    fn reap(&mut self) {
        let now = Instant::now();
        let mut done = Vec::new();
        for (k, g) in self.guests.iter_mut() {
            if let Some(deadline) = g.gone {
                if deadline <= now {
                    g.close_all(&self.ep);
                }
                if g.finished() {
                    done.push(*k);
                }
            }
        }
        for k in done {
            if let Some(g) = self.guests.remove(&k) {
                log(&self.cfg, format_args!("guest {} freed", g.id));
            }
        }
    }

    fn dispatch(&mut self, tok: u64, bits: u32) {
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
            token::DOORBELL => {
                if let Some(Some(d)) = self.conns.get(&token::conn(tok)).map(|c| &c.doorbell) {
                    let _ = sys::eventfd_read(d);
                }
            }
            token::SOCKET => {
                if let Some(g) = self.guests.get_mut(&token::conn(tok)) {
                    g.socket_event(tok, bits);
                }
            }
            token::VM_PROCESS => {
                let key = token::conn(tok);
                log(
                    &self.cfg,
                    format_args!("VM process of connection {key} exited"),
                );
                self.close_conn(key);
            }
            token::SIGNAL => {
                if let Some(fd) = &self.signals {
                    while let Some(sig) = sys::read_signal(fd) {
                        log(&self.cfg, format_args!("signal {sig}, exiting"));
                        self.stop = true;
                    }
                }
            }
            _ => {}
        }
    }

    fn alloc_conn_key(&mut self) -> u32 {
        loop {
            let k = self.next_conn;
            self.next_conn = if k >= 0xff_ffff { 1 } else { k + 1 };
            if !self.conns.contains_key(&k) && !self.guests.contains_key(&k) {
                return k;
            }
        }
    }

    fn accept_conns(&mut self) {
        loop {
            let fd = match sys::accept_unix(&self.listener) {
                Ok(Some(fd)) => fd,
                Ok(None) => return,
                Err(e) => {
                    log(&self.cfg, format_args!("accept: {e}"));
                    return;
                }
            };
            let me = sys::getuid();
            let (pid, uid) = match sys::peer_cred(&fd) {
                Ok(c) => c,
                Err(_) => continue,
            };
            if uid != me && uid != 0 {
                let _ = send_error(&fd, errno::EACCES, "peer uid not allowed");
                continue;
            }
            let key = self.alloc_conn_key();
            if self
                .ep
                .add(
                    fd.as_raw_fd(),
                    sys::EP_IN,
                    token::make(token::CONTROL, key, 0, 0),
                )
                .is_err()
            {
                continue;
            }
            self.conns.insert(
                key,
                Conn {
                    fd,
                    pid,
                    doorbell: None,
                    out: Default::default(),
                    out_bytes: 0,
                },
            );
        }
    }

    fn read_control(&mut self, key: u32) {
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
    fn close_conn(&mut self, key: u32) {
        if let Some(c) = self.conns.remove(&key) {
            self.ep.delete(c.fd.as_raw_fd());
            if let Some(d) = &c.doorbell {
                self.ep.delete(d.as_raw_fd());
            }
        }
        if let Some(g) = self.guests.get_mut(&key) {
            log(
                &self.cfg,
                format_args!("guest {} (pid {}) gone", g.id, g.pid),
            );
            g.depart(&self.ep, Instant::now());
        }
        self.vm.forget(&self.ep, key);
    }

    /// Handles one message; false closes the connection.
    fn handle_message(&mut self, key: u32, msg: &[u8], fds: Vec<OwnedFd>) -> bool {
        let Some(conn) = self.conns.get(&key) else {
            return false;
        };
        let Some((k, body)) = control::decode(msg) else {
            return send_error(&conn.fd, errno::EINVAL, "malformed control message").is_ok();
        };
        match k {
            kind::HELLO => {
                if body.len() < HELLO_BODY {
                    return send_error(&conn.fd, errno::EINVAL, "short HELLO").is_ok();
                }
                if self.guests.contains_key(&key) {
                    return send_error(&conn.fd, errno::EINVAL, "already attached").is_ok();
                }
                let pid = u32::from_le_bytes([body[0], body[1], body[2], body[3]]);
                let pid = if pid == 0 { conn.pid } else { pid };
                let comm_raw = &body[8..24];
                let end = comm_raw.iter().position(|&b| b == 0).unwrap_or(16);
                let comm = String::from_utf8_lossy(&comm_raw[..end]).into_owned();
                let id = self.next_guest;
                let (g, memfd) = match Guest::new(id, key, pid, comm, self.gcfg.clone()) {
                    Ok(x) => x,
                    Err(e) => {
                        return send_error(&conn.fd, sys::errno_of(&e), "cannot create region")
                            .is_ok()
                    }
                };
                let doorbell = match sys::eventfd() {
                    Ok(d) => d,
                    Err(e) => return send_error(&conn.fd, sys::errno_of(&e), "eventfd").is_ok(),
                };
                if self
                    .ep
                    .add(
                        doorbell.as_raw_fd(),
                        sys::EP_IN,
                        token::make(token::DOORBELL, key, 0, 0),
                    )
                    .is_err()
                {
                    return send_error(&conn.fd, errno::ENOMEM, "epoll").is_ok();
                }
                let mut reply = [0u8; HELLO_OK_BODY];
                reply[0..4].copy_from_slice(&id.to_le_bytes());
                reply[8..16].copy_from_slice(&g.region_size().to_le_bytes());
                let sent = send_msg(
                    &conn.fd,
                    kind::HELLO_OK,
                    &reply,
                    &[memfd.as_raw_fd(), doorbell.as_raw_fd()],
                );
                log(
                    &self.cfg,
                    format_args!("guest {id} attached: pid {pid} comm {}", g.comm),
                );
                self.next_guest = self.next_guest.wrapping_add(1).max(1);
                if let Some(c) = self.conns.get_mut(&key) {
                    c.doorbell = Some(doorbell);
                }
                self.guests.insert(key, g);
                sent.is_ok()
            }
            kind::PORT => {
                let Some(g) = self.guests.get_mut(&key) else {
                    return send_error(&conn.fd, errno::EINVAL, "PORT before HELLO").is_ok();
                };
                if body.len() < 4 {
                    return send_error(&conn.fd, errno::EINVAL, "short PORT").is_ok();
                }
                let slot = u32::from_le_bytes([body[0], body[1], body[2], body[3]]);
                let Some(fd) = fds.into_iter().next() else {
                    return send_error(&conn.fd, errno::EINVAL, "PORT without eventfd").is_ok();
                };
                match g.set_port(slot, fd) {
                    Ok(()) => send_msg(&conn.fd, kind::PORT_OK, &slot.to_le_bytes(), &[]).is_ok(),
                    Err(e) => send_error(&conn.fd, e, "bad PORT").is_ok(),
                }
            }
            kind::STAT => {
                let format = if body.len() >= 4 {
                    u32::from_le_bytes([body[0], body[1], body[2], body[3]])
                } else {
                    0
                };
                let snap = self.snapshot();
                let text = if format == 1 {
                    stat::render_text(&snap)
                } else {
                    stat::render_json(&snap)
                };
                let Some(conn) = self.conns.get_mut(&key) else {
                    return false;
                };
                for chunk in text
                    .as_bytes()
                    .chunks(CTL_MAX - CTL_HEADER - 1024)
                    .chain(std::iter::once(&[][..]))
                {
                    let mut m =
                        control::encode_header(kind::STAT_CHUNK, chunk.len() as u32).to_vec();
                    m.extend_from_slice(chunk);
                    conn.out_bytes += m.len();
                    conn.out.push_back(m);
                }
                if conn.out_bytes > OUT_MAX {
                    return false;
                }
                self.flush_out(key)
            }
            kind::VM_REGION => {
                if self.guests.contains_key(&key) {
                    return send_error(&conn.fd, errno::EINVAL, "already attached").is_ok();
                }
                let id = self.next_guest;
                match self.vm.create(key, id, conn.pid, &self.gcfg, body) {
                    Ok((g, reply)) => {
                        let sent = send_msg(&conn.fd, kind::VM_REGION_OK, &reply, &[]);
                        log(
                            &self.cfg,
                            format_args!("guest {id} attached: {} (VM region)", g.comm),
                        );
                        self.next_guest = self.next_guest.wrapping_add(1).max(1);
                        self.guests.insert(key, g);
                        sent.is_ok()
                    }
                    Err((e, text)) => send_error(&conn.fd, e, &text).is_ok(),
                }
            }
            kind::VM_PID => {
                if body.len() < 4 {
                    return send_error(&conn.fd, errno::EINVAL, "short VM_PID").is_ok();
                }
                let pid = u32::from_le_bytes([body[0], body[1], body[2], body[3]]);
                match self.vm.set_pid(&self.ep, key, pid, fds.into_iter().next()) {
                    Ok(()) => {
                        if let Some(g) = self.guests.get_mut(&key) {
                            g.pid = pid;
                        }
                        send_msg(&conn.fd, kind::VM_PID_OK, &[], &[]).is_ok()
                    }
                    Err((e, text)) => send_error(&conn.fd, e, text).is_ok(),
                }
            }
            _ => send_error(&conn.fd, errno::ENOSYS, "unknown message").is_ok(),
        }
    }

    /// Sends queued replies until done or the socket is full (then waits for
    /// EPOLLOUT). False: the connection failed.
    fn flush_out(&mut self, key: u32) -> bool {
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
        self.ep
            .modify(
                conn.fd.as_raw_fd(),
                ev,
                token::make(token::CONTROL, key, 0, 0),
            )
            .is_ok()
    }

    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            pid: std::process::id(),
            socket: self.cfg.socket.display().to_string(),
            guests: self.guests.values().map(stat::guest_stat).collect(),
        }
    }

    fn shutdown(&mut self) {
        for g in self.guests.values_mut() {
            g.close_all(&self.ep);
        }
        self.guests.clear();
        self.conns.clear();
        self.vm.forget_all(&self.ep);
        // We hold the lock: the socket file is ours.
        let _ = std::fs::remove_file(&self.cfg.socket);
    }
}

fn send_msg(fd: &OwnedFd, k: u16, body: &[u8], fds: &[i32]) -> io::Result<()> {
    let mut m = Vec::with_capacity(CTL_HEADER + body.len());
    m.extend_from_slice(&control::encode_header(k, body.len() as u32));
    m.extend_from_slice(body);
    sys::send_with_fds(fd, &m, fds, true)
}

fn send_error(fd: &OwnedFd, err: i32, text: &str) -> io::Result<()> {
    let mut body = err.to_le_bytes().to_vec();
    body.extend_from_slice(text.as_bytes());
    send_msg(fd, kind::ERROR, &body, &[])
}

// ---- client side --------------------------------------------------------------

fn recv_msg(fd: &OwnedFd, buf: &mut [u8]) -> io::Result<(u16, Vec<u8>, Vec<OwnedFd>)> {
    let r =
        sys::recv_with_fds(fd, buf)?.ok_or_else(|| io::Error::from_raw_os_error(libc::EAGAIN))?;
    if r.len == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "canald closed the connection",
        ));
    }
    let (k, body) = control::decode(&buf[..r.len])
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "malformed reply"))?;
    Ok((k, body.to_vec(), r.fds))
}

fn error_reply(body: &[u8]) -> io::Error {
    if body.len() >= 4 {
        let e = i32::from_le_bytes([body[0], body[1], body[2], body[3]]);
        let text = String::from_utf8_lossy(&body[4..]);
        io::Error::new(
            io::Error::from_raw_os_error(e).kind(),
            format!("canald: {text} ({})", io::Error::from_raw_os_error(e)),
        )
    } else {
        io::Error::other("canald: error")
    }
}

/// Asks the canald at `path` for its listing: JSON, or the text table if `text`.
pub fn fetch_stat(path: &Path, text: bool) -> io::Result<String> {
    let fd = sys::seqpacket_connect(path)?;
    let format: u32 = if text { 1 } else { 0 };
    let mut m = control::encode_header(kind::STAT, 4).to_vec();
    m.extend_from_slice(&format.to_le_bytes());
    sys::send_with_fds(&fd, &m, &[], false)?;
    let mut buf = vec![0u8; CTL_MAX];
    let mut out = Vec::new();
    loop {
        let (k, body, _) = recv_msg(&fd, &mut buf)?;
        match k {
            kind::STAT_CHUNK if body.is_empty() => break,
            kind::STAT_CHUNK => out.extend_from_slice(&body),
            kind::ERROR => return Err(error_reply(&body)),
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "unexpected reply",
                ))
            }
        }
    }
    String::from_utf8(out).map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "not UTF-8"))
}
