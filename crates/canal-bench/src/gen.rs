//! The built-in traffic generator behind `canal-bench-gen`: blocking-socket ping-pong
//! (request-response) and one-way stream over TCP or Unix stream sockets.
//!
//! It uses only the plain BSD calls a typical program makes through Rust's std
//! (`socket`, `bind`, `listen`, `accept4`, `connect`, `send`, `recv`, `shutdown`), so the
//! same binary measures the kernel natively and canal when run under `canal run`.
//!
//! Protocol (both ends are this program):
//! - `rr`: the client sends `size` bytes, the server reads exactly `size` bytes and sends
//!   them back; the client times each round trip. The first 8 bytes carry a sequence
//!   number the client checks on the echo, so a transport that loses or reorders data
//!   fails the run instead of producing a number.
//! - `stream`: the client sends `size`-byte messages until its time or count runs out,
//!   shuts down its write side, and waits for the server's 8-byte little-endian count of
//!   bytes received; throughput = bytes the server received / time until that ack.
//! - `idle`: the client connects and sends nothing for `duration` seconds (idle CPU).
//!
//! Each end prints one line `RESULT key=value ...` on stdout when it finishes; the
//! server prints `READY <addr>` once it listens.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Net {
    Tcp,
    Unix,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Rr,
    Stream,
    Idle,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Server,
    Client,
}

#[derive(Clone, Debug)]
pub struct GenArgs {
    pub role: Role,
    pub net: Net,
    pub addr: String,
    pub mode: Mode,
    pub size: usize,
    pub duration: Option<f64>,
    pub count: Option<u64>,
    pub warmup: u64,
    pub cpu: Option<usize>,
    pub connect_timeout: f64,
}

pub const USAGE: &str = "usage: canal-bench-gen server|client --net tcp|unix --addr ADDR \
--mode rr|stream|idle --size BYTES [--duration SECS | --count N] [--warmup N] [--cpu N] \
[--connect-timeout SECS]\n  ADDR is HOST:PORT for tcp, a filesystem path for unix.\n  \
The server serves one connection and exits when the client closes it.";

pub fn parse_args(args: &[String]) -> Result<GenArgs, String> {
    let mut it = args.iter();
    let role = match it.next().map(String::as_str) {
        Some("server") => Role::Server,
        Some("client") => Role::Client,
        Some(o) => return Err(format!("unknown role '{o}'")),
        None => return Err("missing role".into()),
    };
    let mut g = GenArgs {
        role,
        net: Net::Tcp,
        addr: String::new(),
        mode: Mode::Rr,
        size: 64,
        duration: None,
        count: None,
        warmup: 0,
        cpu: None,
        connect_timeout: 5.0,
    };
    while let Some(flag) = it.next() {
        let mut val = || {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--net" => {
                g.net = match val()?.as_str() {
                    "tcp" => Net::Tcp,
                    "unix" => Net::Unix,
                    o => return Err(format!("unknown --net '{o}'")),
                }
            }
            "--addr" => g.addr = val()?,
            "--mode" => {
                g.mode = match val()?.as_str() {
                    "rr" => Mode::Rr,
                    "stream" => Mode::Stream,
                    "idle" => Mode::Idle,
                    o => return Err(format!("unknown --mode '{o}'")),
                }
            }
            "--size" => g.size = num(&val()?)?,
            "--duration" => g.duration = Some(num(&val()?)?),
            "--count" => g.count = Some(num(&val()?)?),
            "--warmup" => g.warmup = num(&val()?)?,
            "--cpu" => g.cpu = Some(num(&val()?)?),
            "--connect-timeout" => g.connect_timeout = num(&val()?)?,
            o => return Err(format!("unknown option '{o}'")),
        }
    }
    if g.addr.is_empty() {
        return Err("--addr is required".into());
    }
    if g.size == 0 || g.size > 64 << 20 {
        return Err("--size must be 1 .. 64 MiB".into());
    }
    if g.role == Role::Client && g.duration.is_none() && g.count.is_none() {
        return Err("client needs --duration or --count".into());
    }
    Ok(g)
}

fn num<T: std::str::FromStr>(s: &str) -> Result<T, String> {
    s.parse().map_err(|_| format!("bad number '{s}'"))
}

enum Conn {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Conn {
    fn shutdown_write(&self) -> io::Result<()> {
        match self {
            Conn::Tcp(s) => s.shutdown(Shutdown::Write),
            Conn::Unix(s) => s.shutdown(Shutdown::Write),
        }
    }
    fn nodelay(&self) -> io::Result<()> {
        match self {
            Conn::Tcp(s) => s.set_nodelay(true),
            Conn::Unix(_) => Ok(()),
        }
    }
}

impl Read for Conn {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        match self {
            Conn::Tcp(s) => s.read(b),
            Conn::Unix(s) => s.read(b),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        match self {
            Conn::Tcp(s) => s.write(b),
            Conn::Unix(s) => s.write(b),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Reads exactly `buf.len()` bytes. `Ok(false)` on a clean EOF before the first byte.
fn read_full(c: &mut Conn, buf: &mut [u8]) -> io::Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        match c.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("EOF after {got} of {} bytes", buf.len()),
                ))
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// CPU time (user + system) this process used so far, in seconds, all threads included.
pub fn self_cpu_seconds() -> f64 {
    // SAFETY: getrusage only writes into the zeroed `rusage` we own; RUSAGE_SELF is valid.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru
    };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

fn pin_to(cpu: usize) -> Result<(), String> {
    // SAFETY: `set` is a plain bitmask we own; CPU_SET bounds-checks against its size and
    // sched_setaffinity(0, ..) only reads it for the calling thread.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if rc != 0 {
        return Err(format!(
            "sched_setaffinity(cpu {cpu}): {}",
            io::Error::last_os_error()
        ));
    }
    Ok(())
}

pub fn run(g: &GenArgs) -> Result<String, String> {
    if let Some(c) = g.cpu {
        pin_to(c)?;
    }
    match g.role {
        Role::Server => server(g).map_err(|e| format!("server: {e}")),
        Role::Client => client(g).map_err(|e| format!("client: {e}")),
    }
}

fn server(g: &GenArgs) -> io::Result<String> {
    let mut conn = match g.net {
        Net::Tcp => {
            let l = TcpListener::bind(&g.addr)?;
            println!("READY {}", l.local_addr()?);
            io::stdout().flush()?;
            Conn::Tcp(l.accept()?.0)
        }
        Net::Unix => {
            let _ = std::fs::remove_file(&g.addr);
            let l = UnixListener::bind(&g.addr)?;
            println!("READY {}", g.addr);
            io::stdout().flush()?;
            let c = Conn::Unix(l.accept()?.0);
            let _ = std::fs::remove_file(&g.addr);
            c
        }
    };
    // CPU is counted from here: start-up (and whatever a preload library does before
    // main) is not part of the transfer.
    let cpu0 = self_cpu_seconds();
    let mut buf = vec![0u8; g.size];
    let (mut msgs, mut bytes) = (0u64, 0u64);
    match g.mode {
        Mode::Rr => {
            conn.nodelay()?;
            while read_full(&mut conn, &mut buf)? {
                conn.write_all(&buf)?;
                msgs += 1;
            }
            bytes = msgs * 2 * g.size as u64;
        }
        Mode::Stream => {
            loop {
                match conn.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => bytes += n as u64,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            msgs = bytes / g.size as u64;
            conn.write_all(&bytes.to_le_bytes())?;
        }
        Mode::Idle => while conn.read(&mut buf)? != 0 {},
    }
    Ok(format!(
        "RESULT role=server msgs={msgs} bytes={bytes} cpu_s={:.6}",
        self_cpu_seconds() - cpu0
    ))
}

fn connect(g: &GenArgs) -> io::Result<Conn> {
    let deadline = Instant::now() + Duration::from_secs_f64(g.connect_timeout);
    loop {
        let r = match g.net {
            Net::Tcp => TcpStream::connect(&g.addr).map(Conn::Tcp),
            Net::Unix => UnixStream::connect(&g.addr).map(Conn::Unix),
        };
        match r {
            Ok(c) => return Ok(c),
            Err(e)
                if Instant::now() < deadline
                    && matches!(
                        e.kind(),
                        io::ErrorKind::ConnectionRefused | io::ErrorKind::NotFound
                    ) =>
            {
                std::thread::sleep(Duration::from_millis(5))
            }
            Err(e) => return Err(e),
        }
    }
}

fn client(g: &GenArgs) -> io::Result<String> {
    let mut conn = connect(g)?;
    // CPU is counted from the connection on (see server()).
    let cpu0 = self_cpu_seconds();
    let deadline = g
        .duration
        .map(|d| Instant::now() + Duration::from_secs_f64(d));
    let max = g.count.unwrap_or(u64::MAX);
    match g.mode {
        Mode::Rr => {
            conn.nodelay()?;
            let mut out = vec![0x5au8; g.size];
            let mut back = vec![0u8; g.size];
            let mut seq = 0u64;
            let mut one = |conn: &mut Conn, seq: u64| -> io::Result<()> {
                let tag = seq.to_le_bytes();
                let k = g.size.min(8);
                out[..k].copy_from_slice(&tag[..k]);
                conn.write_all(&out)?;
                if !read_full(conn, &mut back)? {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "server closed",
                    ));
                }
                if back[..k] != tag[..k] {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!("echo of message {seq} carries the wrong sequence number"),
                    ));
                }
                Ok(())
            };
            for _ in 0..g.warmup {
                one(&mut conn, seq)?;
                seq += 1;
            }
            let mut lat: Vec<u64> = Vec::with_capacity(1 << 16);
            let start = Instant::now();
            while (lat.len() as u64) < max {
                let t0 = Instant::now();
                one(&mut conn, seq)?;
                let t1 = Instant::now();
                seq += 1;
                lat.push((t1 - t0).as_nanos() as u64);
                if deadline.is_some_and(|d| t1 >= d) || lat.len() >= 50_000_000 {
                    break;
                }
            }
            let elapsed = start.elapsed().as_secs_f64();
            drop(conn);
            let n = lat.len() as u64;
            let mean = lat.iter().sum::<u64>() as f64 / n.max(1) as f64;
            lat.sort_unstable();
            let pct = |p: f64| crate::stats::percentile_sorted_u64(&lat, p);
            Ok(format!(
                "RESULT role=client mode=rr size={} msgs={n} bytes={} elapsed_s={elapsed:.6} \
                 p50_ns={:.0} p99_ns={:.0} mean_ns={mean:.0} min_ns={} max_ns={} cpu_s={:.6}",
                g.size,
                n * 2 * g.size as u64,
                pct(50.0),
                pct(99.0),
                lat.first().copied().unwrap_or(0),
                lat.last().copied().unwrap_or(0),
                self_cpu_seconds() - cpu0,
            ))
        }
        Mode::Stream => {
            let buf = vec![0xa5u8; g.size];
            let mut sent = 0u64;
            let check_every = if g.size >= 4096 { 1 } else { 64 };
            let start = Instant::now();
            for _ in 0..g.warmup {
                conn.write_all(&buf)?;
            }
            let warm_bytes = g.warmup * g.size as u64;
            let start = if g.warmup > 0 { Instant::now() } else { start };
            while sent < max {
                conn.write_all(&buf)?;
                sent += 1;
                if sent % check_every == 0 && deadline.is_some_and(|d| Instant::now() >= d) {
                    break;
                }
            }
            conn.shutdown_write()?;
            let mut ack = [0u8; 8];
            if !read_full(&mut conn, &mut ack)? {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "no ack from server",
                ));
            }
            let elapsed = start.elapsed().as_secs_f64();
            let got = u64::from_le_bytes(ack);
            let bytes = sent * g.size as u64;
            if got != bytes + warm_bytes {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "server received {got} bytes, client sent {}",
                        bytes + warm_bytes
                    ),
                ));
            }
            Ok(format!(
                "RESULT role=client mode=stream size={} msgs={sent} bytes={bytes} elapsed_s={elapsed:.6} \
                 bytes_per_s={:.0} msgs_per_s={:.0} cpu_s={:.6}",
                g.size,
                bytes as f64 / elapsed,
                sent as f64 / elapsed,
                self_cpu_seconds() - cpu0,
            ))
        }
        Mode::Idle => {
            let start = Instant::now();
            std::thread::sleep(Duration::from_secs_f64(g.duration.unwrap_or(1.0)));
            conn.shutdown_write()?;
            let mut b = [0u8; 1];
            while conn.read(&mut b)? != 0 {}
            Ok(format!(
                "RESULT role=client mode=idle size={} msgs=0 bytes=0 elapsed_s={:.6} cpu_s={:.6}",
                g.size,
                start.elapsed().as_secs_f64(),
                self_cpu_seconds() - cpu0
            ))
        }
    }
}

/// Parses a `RESULT k=v ...` line into pairs.
pub fn parse_result(line: &str) -> Option<Vec<(String, String)>> {
    let rest = line.trim().strip_prefix("RESULT ")?;
    Some(
        rest.split_whitespace()
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn parses_client_args() {
        let g = parse_args(&s(&[
            "client", "--net", "unix", "--addr", "/tmp/x", "--mode", "stream", "--size", "1024",
            "--count", "10",
        ]))
        .unwrap();
        assert_eq!(
            (g.net, g.mode, g.size, g.count),
            (Net::Unix, Mode::Stream, 1024, Some(10))
        );
        assert!(parse_args(&s(&["client", "--addr", "x"])).is_err());
        assert!(parse_args(&s(&["server", "--addr", "x", "--size", "0"])).is_err());
    }

    #[test]
    fn loopback_rr_and_stream_over_unix_socket() {
        let dir = std::env::temp_dir().join(format!("canal-gen-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (mode, size) in [("rr", "100"), ("stream", "3000")] {
            let path = dir
                .join(format!("{mode}.sock"))
                .to_string_lossy()
                .into_owned();
            let srv = parse_args(&s(&[
                "server", "--net", "unix", "--addr", &path, "--mode", mode, "--size", size,
            ]))
            .unwrap();
            let cli = parse_args(&s(&[
                "client", "--net", "unix", "--addr", &path, "--mode", mode, "--size", size,
                "--count", "200",
            ]))
            .unwrap();
            let h = std::thread::spawn(move || run(&srv));
            let out = run(&cli).unwrap();
            let srv_out = h.join().unwrap().unwrap();
            let kv = parse_result(&out).unwrap();
            let get = |k: &str| kv.iter().find(|(a, _)| a == k).unwrap().1.clone();
            assert_eq!(get("msgs"), "200", "{out}");
            assert!(srv_out.contains("msgs=200"), "{srv_out}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
