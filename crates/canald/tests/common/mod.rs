//! A test guest written directly against canal-abi: HELLO, map the region, claim a
//! slot, register an eventfd, issue requests, push/pop ring bytes, kick. It plays
//! the part libcanal plays in real use, so canald can be tested on its own.
#![allow(dead_code)]

use canal_abi::control::{self, kind, CTL_MAX};
use canal_abi::ring::{record_kind, Consumer, Producer, RawRing};
use canal_abi::sync::{fence, Ordering};
use canal_abi::{
    errno, op, sleep_kind, slot_state, sock_flag, CanalAddr, Region, SocketEntry, WAIT_ANY,
};
use canald::sys::{self, Mapping};
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::AtomicU32;
use std::time::{Duration, Instant};

pub const T: Duration = Duration::from_secs(10);

static N: AtomicU32 = AtomicU32::new(0);

/// A canald subprocess on a private socket path.
pub struct TestDaemon {
    pub child: Child,
    pub dir: PathBuf,
    pub path: PathBuf,
}

impl TestDaemon {
    pub fn start(extra: &[&str]) -> TestDaemon {
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("canald-test-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("sub").join("canald.sock");
        let child = Command::new(env!("CARGO_BIN_EXE_canald"))
            .arg("--socket")
            .arg(&path)
            .args(extra)
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn canald");
        let d = TestDaemon { child, dir, path };
        let deadline = Instant::now() + T;
        while sys::seqpacket_connect(&d.path).is_err() {
            assert!(Instant::now() < deadline, "canald did not come up");
            std::thread::sleep(Duration::from_millis(10));
        }
        d
    }

    pub fn alive(&mut self) -> bool {
        self.child.try_wait().expect("try_wait").is_none()
    }

    pub fn stat(&self) -> String {
        canald::fetch_stat(&self.path, false).expect("stat")
    }
}

impl Drop for TestDaemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub fn send_ctl(fd: &OwnedFd, k: u16, body: &[u8], fds: &[i32]) {
    let mut m = control::encode_header(k, body.len() as u32).to_vec();
    m.extend_from_slice(body);
    sys::send_with_fds(fd, &m, fds, false).expect("send control");
}

pub fn recv_ctl(fd: &OwnedFd) -> (u16, Vec<u8>, Vec<OwnedFd>) {
    let mut buf = vec![0u8; CTL_MAX];
    let r = sys::recv_with_fds(fd, &mut buf)
        .expect("recv control")
        .expect("blocking socket");
    let (k, body) = control::decode(&buf[..r.len]).expect("valid reply");
    (k, body.to_vec(), r.fds)
}

/// Sends one control request and reads its reply: Ok(kind, body, descriptors), or
/// Err(errno) for an ERROR reply (which carries no descriptor).
pub fn ctl_call(
    fd: &OwnedFd,
    k: u16,
    body: &[u8],
    fds: &[i32],
) -> Result<(u16, Vec<u8>, Vec<OwnedFd>), i32> {
    send_ctl(fd, k, body, fds);
    let (rk, rb, rfds) = recv_ctl(fd);
    if rk == control::kind::ERROR {
        assert!(rfds.is_empty());
        return Err(i32::from_le_bytes(rb[..4].try_into().unwrap()));
    }
    Ok((rk, rb, rfds))
}

pub struct TestGuest {
    pub ctl: OwnedFd,
    pub doorbell: OwnedFd,
    pub region: Region,
    pub map: Mapping,
    pub id: u32,
    pub slot: u32,
    pub port: OwnedFd,
    seq: u32,
    /// Virtual RSS: one doorbell per canald worker (`doorbells`); empty: none.
    pub wdoors: Vec<OwnedFd>,
}

impl TestGuest {
    pub fn attach(path: &Path, comm: &str) -> TestGuest {
        TestGuest::attach_with(path, comm, 0)
    }

    /// As `attach`, with HELLO flags (e.g. `hello_flag::SHORTCUT`).
    pub fn attach_with(path: &Path, comm: &str, flags: u32) -> TestGuest {
        let ctl = sys::seqpacket_connect(path).expect("connect");
        let mut body = Vec::new();
        body.extend_from_slice(&std::process::id().to_le_bytes());
        body.extend_from_slice(&flags.to_le_bytes());
        let mut c = [0u8; 16];
        c[..comm.len().min(15)].copy_from_slice(&comm.as_bytes()[..comm.len().min(15)]);
        body.extend_from_slice(&c);
        send_ctl(&ctl, kind::HELLO, &body, &[]);
        let (k, body, mut fds) = recv_ctl(&ctl);
        assert_eq!(k, kind::HELLO_OK, "HELLO refused: {body:?}");
        assert_eq!(fds.len(), 2);
        let id = u32::from_le_bytes(body[0..4].try_into().unwrap());
        let size = u64::from_le_bytes(body[8..16].try_into().unwrap());
        let doorbell = fds.pop().unwrap();
        let memfd = fds.pop().unwrap();
        let (map, region) = Mapping::attach_region(&memfd, size as usize).expect("attach");
        assert_eq!(region.header().guest_id, id);
        let slot = (0..region.layout().slot_count)
            .find(|&i| {
                region
                    .slot(i)
                    .unwrap()
                    .state
                    .compare_exchange(
                        slot_state::FREE,
                        slot_state::IDLE,
                        Ordering::Acquire,
                        Ordering::Relaxed,
                    )
                    .is_ok()
            })
            .expect("a free slot");
        let port = sys::eventfd().unwrap();
        let mut g = TestGuest {
            ctl,
            doorbell,
            region,
            map,
            id,
            slot,
            port,
            seq: 0,
            wdoors: Vec::new(),
        };
        g.register_port();
        g
    }

    fn register_port(&mut self) {
        send_ctl(
            &self.ctl,
            kind::PORT,
            &self.slot.to_le_bytes(),
            &[self.port.as_raw_fd()],
        );
        let (k, body, _) = recv_ctl(&self.ctl);
        assert_eq!(k, kind::PORT_OK, "{body:?}");
    }

    /// Protocol §6 kick.
    pub fn kick(&self) {
        fence(Ordering::SeqCst);
        let h = self.region.header();
        if h.host_sleeping.swap(0, Ordering::SeqCst) == 1 {
            sys::eventfd_write(self.doorbell.as_raw_fd()).unwrap();
            h.kicks.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Virtual RSS: asks for the per-worker doorbells (DOORBELLS); from then on data
    /// kicks go to the owner of the socket (protocol §6.3).
    pub fn doorbells(&mut self) -> Result<(), Vec<u8>> {
        send_ctl(&self.ctl, kind::DOORBELLS, &[], &[]);
        let (k, body, fds) = recv_ctl(&self.ctl);
        if k != kind::DOORBELLS_OK {
            return Err(body);
        }
        assert_eq!(
            u32::from_le_bytes(body[..4].try_into().unwrap()) as usize,
            fds.len()
        );
        self.wdoors = fds;
        Ok(())
    }

    /// Raises socket `h`'s attention bit and kicks the worker that owns it, as the
    /// library does after a change canald must look at.
    pub fn attention(&self, h: u32) {
        let i = canal_abi::handle_index(h);
        self.region.raise_attention(i);
        self.kick_socket(i);
    }

    /// The kick after raising socket `index`'s attention bit: to the owning worker
    /// (virtual RSS) if it sleeps, else the §6 kick.
    pub fn kick_socket(&self, index: u32) {
        if self.wdoors.is_empty() {
            return self.kick();
        }
        fence(Ordering::SeqCst);
        let w = self
            .region
            .socket(index)
            .unwrap()
            .owner
            .load(Ordering::Relaxed) as usize;
        let word = &self.region.header().worker_sleeping[w];
        if word.swap(0, Ordering::SeqCst) == 1 {
            sys::eventfd_write(self.wdoors[w].as_raw_fd()).unwrap();
        }
    }

    fn push_queue(&self, value: u32) {
        let q = canal_abi::queue::QueueProducer::new(
            self.region.queue_cells(),
            &self.region.header().queue_tail,
        );
        // An honest guest never finds it full (one entry per slot); a test guest that
        // flooded its own queue waits for canald to drain it.
        let deadline = Instant::now() + T;
        while q.push(value).is_err() {
            assert!(Instant::now() < deadline, "request queue stays full");
            self.kick();
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    /// Issues a request and waits for it (spin, then sleep on the slot's eventfd).
    pub fn request(
        &mut self,
        opc: u32,
        handle: u32,
        args: [u64; 4],
        input: &[u8],
    ) -> (i64, Vec<u8>) {
        let s = self.region.slot(self.slot).unwrap();
        assert_eq!(s.state.load(Ordering::Relaxed), slot_state::IDLE);
        self.seq = self.seq.wrapping_add(1);
        s.op.store(opc, Ordering::Relaxed);
        s.socket.store(handle, Ordering::Relaxed);
        for (a, v) in s.args.iter().zip(args) {
            a.store(v, Ordering::Relaxed);
        }
        s.in_len.store(input.len() as u32, Ordering::Relaxed);
        s.write_payload(0, input);
        s.seq.store(self.seq, Ordering::Relaxed);
        s.state.store(slot_state::REQUESTED, Ordering::Release);
        self.push_queue(self.slot);
        self.kick();
        let deadline = Instant::now() + T;
        loop {
            for _ in 0..2000 {
                if s.state.load(Ordering::Acquire) == slot_state::DONE {
                    return self.finish(s);
                }
                std::hint::spin_loop();
            }
            s.sleep.store(sleep_kind::COMPLETION, Ordering::Relaxed);
            fence(Ordering::SeqCst);
            if s.state.load(Ordering::Acquire) == slot_state::DONE {
                s.sleep.store(sleep_kind::AWAKE, Ordering::Relaxed);
                return self.finish(s);
            }
            wait_fd(&self.port, 200);
            let _ = sys::eventfd_read(&self.port);
            s.sleep.store(sleep_kind::AWAKE, Ordering::Relaxed);
            assert!(Instant::now() < deadline, "request {opc} timed out");
        }
    }

    fn finish(&self, s: &canal_abi::Slot) -> (i64, Vec<u8>) {
        let r = s.result.load(Ordering::Relaxed);
        let n = (s.out_len.load(Ordering::Relaxed) as usize).min(canal_abi::SLOT_PAYLOAD);
        let mut out = vec![0u8; n];
        s.read_payload(0, &mut out);
        assert_eq!(s.done_seq.load(Ordering::Relaxed), self.seq);
        s.state.store(slot_state::IDLE, Ordering::Release);
        (r, out)
    }

    pub fn socket(&mut self, domain: u64, ty: u64) -> u32 {
        let (r, _) = self.request(op::SOCKET, 0, [domain, ty, 0, 0], &[]);
        assert!(r > 0, "SOCKET failed: {r}");
        r as u32
    }

    pub fn connect(&mut self, h: u32, a: &CanalAddr) -> i64 {
        self.request(op::CONNECT, h, [0; 4], &a.encode()).0
    }

    pub fn entry(&self, h: u32) -> &SocketEntry {
        self.region.socket(canal_abi::handle_index(h)).unwrap()
    }

    pub fn flags(&self, h: u32) -> u32 {
        self.entry(h).flags.load(Ordering::Acquire)
    }

    /// Waits (polling) until `f` holds or T passes.
    pub fn wait_until(&self, what: &str, mut f: impl FnMut() -> bool) {
        let deadline = Instant::now() + T;
        while !f() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            self.kick();
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    pub fn wait_flags(&self, h: u32, any: u32) -> u32 {
        let mut fl = 0;
        self.wait_until("socket flags", || {
            fl = self.flags(h);
            fl & any != 0
        });
        fl
    }

    fn rings(&self, h: u32) -> (RawRing, RawRing) {
        let e = self.entry(h);
        let tx = self
            .region
            .ring(
                e.tx_offset.load(Ordering::Relaxed),
                e.tx_size.load(Ordering::Relaxed) as u64,
            )
            .unwrap();
        let rx = self
            .region
            .ring(
                e.rx_offset.load(Ordering::Relaxed),
                e.rx_size.load(Ordering::Relaxed) as u64,
            )
            .unwrap();
        (tx, rx)
    }

    /// Pushes what fits of `data` onto the tx ring; raises attention and kicks.
    pub fn send_some(&self, h: u32, data: &[u8]) -> usize {
        let e = self.entry(h);
        let (tx, _) = self.rings(h);
        let mut p = Producer {
            storage: &tx,
            head_shared: &e.tx_head,
            tail_shared: &e.tx_tail,
            head: e.tx_head.load(Ordering::Relaxed),
        };
        let n = p.push(data).expect("tx ring sane");
        if n > 0 {
            self.attention(h);
        }
        n
    }

    pub fn send_all(&self, h: u32, mut data: &[u8]) {
        let deadline = Instant::now() + T;
        while !data.is_empty() {
            let n = self.send_some(h, data);
            data = &data[n..];
            if n == 0 {
                assert!(Instant::now() < deadline, "send timed out");
                assert_eq!(self.flags(h) & sock_flag::TX_CLOSED, 0, "tx closed");
                std::thread::sleep(Duration::from_micros(100));
            }
        }
    }

    /// Pops up to `buf.len()` rx bytes; frees space (attention if RX_WANT_SPACE).
    pub fn recv_some(&self, h: u32, buf: &mut [u8]) -> usize {
        let e = self.entry(h);
        let (_, rx) = self.rings(h);
        let mut c = Consumer {
            storage: &rx,
            head_shared: &e.rx_head,
            tail_shared: &e.rx_tail,
            tail: e.rx_tail.load(Ordering::Relaxed),
        };
        let n = c.pop(buf).expect("rx ring sane");
        if n > 0 {
            fence(Ordering::SeqCst);
            if e.flags.load(Ordering::Relaxed) & sock_flag::RX_WANT_SPACE != 0 {
                self.attention(h);
            }
        }
        n
    }

    /// Reads until `n` bytes arrived or EOF; returns them.
    pub fn recv_exact(&self, h: u32, n: usize) -> Vec<u8> {
        let mut out = vec![0u8; n];
        let mut got = 0;
        let deadline = Instant::now() + T;
        while got < n {
            let k = self.recv_some(h, &mut out[got..]);
            got += k;
            if k == 0 {
                if self.flags(h) & sock_flag::RX_EOF != 0 && self.rx_queued(h) == 0 {
                    out.truncate(got);
                    return out;
                }
                assert!(
                    Instant::now() < deadline,
                    "recv timed out after {got} bytes"
                );
                self.kick();
                std::thread::sleep(Duration::from_micros(100));
            }
        }
        out
    }

    pub fn rx_queued(&self, h: u32) -> u64 {
        let e = self.entry(h);
        e.rx_head
            .load(Ordering::Acquire)
            .wrapping_sub(e.rx_tail.load(Ordering::Relaxed))
    }

    /// Next record on a datagram socket's or listener's rx ring:
    /// (kind, address, payload).
    pub fn next_record(&self, h: u32) -> Option<(u16, CanalAddr, Vec<u8>)> {
        let e = self.entry(h);
        let (_, rx) = self.rings(h);
        let mut c = Consumer {
            storage: &rx,
            head_shared: &e.rx_head,
            tail_shared: &e.rx_tail,
            tail: e.rx_tail.load(Ordering::Relaxed),
        };
        let info = c.next_record().expect("rx records sane")?;
        let mut a = [0u8; 32];
        c.record_addr(&info, &mut a);
        let mut p = vec![0u8; info.len as usize];
        c.record_payload(&info, 0, &mut p);
        c.consume_record(&info);
        // Room freed for a listener or datagram socket canald stopped for (§3.4).
        if e.flags.load(Ordering::Relaxed) & sock_flag::RX_WANT_SPACE != 0 {
            self.attention(h);
        }
        // The address is the first 32 bytes; an ACCEPT record's names pair (§4
        // Names) or a datagram's control messages may follow.
        let addr = if info.addr_len >= 32 {
            CanalAddr::decode(&a).expect("host address valid")
        } else {
            CanalAddr::default()
        };
        Some((info.kind, addr, p))
    }

    pub fn wait_record(&self, h: u32) -> (u16, CanalAddr, Vec<u8>) {
        let mut r = None;
        self.wait_until("a record", || {
            r = self.next_record(h);
            r.is_some()
        });
        r.unwrap()
    }

    /// Pushes a DATAGRAM record (to `to`, or the connected peer if None).
    pub fn send_dgram(&self, h: u32, to: Option<&CanalAddr>, data: &[u8]) -> bool {
        let ok = self.queue_dgram(h, to, data);
        if ok {
            self.attention(h);
        }
        ok
    }

    /// Writes a datagram record into `h`'s tx ring without telling canald.
    pub fn queue_dgram(&self, h: u32, to: Option<&CanalAddr>, data: &[u8]) -> bool {
        let e = self.entry(h);
        let (tx, _) = self.rings(h);
        let mut p = Producer {
            storage: &tx,
            head_shared: &e.tx_head,
            tail_shared: &e.tx_tail,
            head: e.tx_head.load(Ordering::Relaxed),
        };
        let a = to.map(|a| a.encode());
        p.push_record(
            record_kind::DATAGRAM,
            a.as_ref().map_or(&[][..], |a| &a[..]),
            &[data],
        )
        .expect("tx sane")
    }

    /// Sleeps per §6 on readiness of `h` (or ANY): returns whether the eventfd fired
    /// within `ms`.
    pub fn sleep_on_events(&self, h: Option<u32>, ms: i32, ready: impl Fn() -> bool) -> bool {
        let s = self.region.slot(self.slot).unwrap();
        let hd = self.region.header();
        s.wait_socket.store(
            h.map_or(WAIT_ANY, canal_abi::handle_index),
            Ordering::Relaxed,
        );
        s.sleep.store(sleep_kind::EVENTS, Ordering::Relaxed);
        hd.event_waiters.fetch_add(1, Ordering::Relaxed);
        fence(Ordering::SeqCst);
        let fired = if ready() {
            true
        } else {
            wait_fd(&self.port, ms)
        };
        let _ = sys::eventfd_read(&self.port);
        hd.event_waiters.fetch_sub(1, Ordering::Relaxed);
        s.sleep.store(sleep_kind::AWAKE, Ordering::Relaxed);
        fired
    }
}

/// poll() for readability with a timeout (via a tiny epoll, to stay unsafe-free).
pub fn wait_fd(fd: &OwnedFd, ms: i32) -> bool {
    let ep = sys::Epoll::new().unwrap();
    ep.add(fd.as_raw_fd(), sys::EP_IN, 1).unwrap();
    let mut ev = sys::empty_events(1);
    ep.wait(&mut ev, ms).unwrap() > 0
}

pub fn localhost(port: u16) -> CanalAddr {
    CanalAddr::v4([127, 0, 0, 1], port)
}

/// A TCP listener of guest `g` on 127.0.0.1 (backlog 16): its handle and port.
pub fn tcp_listener(g: &mut TestGuest) -> (u32, u16) {
    let l = g.socket(AF_INET, STREAM);
    assert_eq!(g.request(op::BIND, l, [0; 4], &localhost(0).encode()).0, 0);
    assert_eq!(g.request(op::LISTEN, l, [16, 0, 0, 0], &[]).0, 0);
    let (_, out) = g.request(op::GETSOCKNAME, l, [0; 4], &[]);
    (l, CanalAddr::decode(&out).unwrap().port)
}

pub const AF_INET: u64 = 2;
pub const STREAM: u64 = 1;
pub const DGRAM: u64 = 2;
pub const EINPROGRESS: i64 = -(errno::EINPROGRESS as i64);

/// A deterministic byte pattern (xorshift) and an FNV-1a hash for transfers.
pub fn pattern(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

pub fn fnv(h: &mut u64, data: &[u8]) {
    for &b in data {
        *h ^= b as u64;
        *h = h.wrapping_mul(0x100000001b3);
    }
}

pub const FNV0: u64 = 0xcbf29ce484222325;

/// A few bytes each way between guest socket `h` and its native peer arrive intact.
pub fn echoes_both_ways(g: &TestGuest, h: u32, peer: &mut TcpStream) {
    use std::io::{Read, Write};
    g.send_all(h, b"there");
    let mut b = [0u8; 5];
    peer.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"there");
    peer.write_all(b"back").unwrap();
    assert_eq!(g.recv_exact(h, 4), b"back");
}

pub fn connected_pair(g: &mut TestGuest) -> (u32, TcpStream) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let h = g.socket(AF_INET, STREAM);
    let r = g.connect(h, &localhost(port));
    assert!(r == 0 || r == EINPROGRESS, "connect: {r}");
    let (peer, _) = l.accept().unwrap();
    let f = g.wait_flags(h, sock_flag::CONNECTED | sock_flag::ERROR);
    assert_eq!(f & sock_flag::ERROR, 0, "flags {f:#x}");
    assert_eq!(f & sock_flag::CONNECTING, 0);
    peer.set_read_timeout(Some(T)).unwrap();
    (h, peer)
}

/// utime + stime of a process, in clock ticks (normally 10 ms).
pub fn cpu_ticks(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the parenthesised comm; utime and stime are fields 14 and 15.
    let rest = &s[s.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}
