//! The built-in traffic generator behind `canal-bench-gen`: blocking-socket ping-pong
//! (request-response) and one-way stream over TCP or Unix stream sockets (UDP:
//! `udpgen`).
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

use crate::stats::self_cpu_seconds;
use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Net {
    Tcp,
    Unix,
    /// Datagrams (`udpgen`; modes rr and stream).
    Udp,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Mode {
    Rr,
    Stream,
    Idle,
    /// B12: connection rate with `--clients` concurrent clients (`conngen`).
    Conn,
    /// B13: `--idle` idle connections held, then ping-pong (`conngen`).
    Hold,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Role {
    Server,
    Client,
}

/// canal-bench-gen: one end of a blocking-socket ping-pong (rr), one-way stream, or
/// idle connection. The server serves one connection and exits when the client closes it.
#[derive(Clone, Debug, clap::Parser)]
#[command(name = "canal-bench-gen", version)]
pub struct GenArgs {
    /// Which end
    #[arg(value_enum)]
    pub(crate) role: Role,
    #[arg(long, value_enum, default_value = "tcp")]
    pub(crate) net: Net,
    /// HOST:PORT for tcp, a filesystem path for unix
    #[arg(long)]
    pub(crate) addr: String,
    #[arg(long, value_enum, default_value = "rr")]
    pub(crate) mode: Mode,
    /// Message size in bytes (1 .. 64 MiB)
    #[arg(long, value_name = "BYTES", default_value_t = 64, value_parser = parse_size)]
    pub(crate) size: usize,
    /// Client: run this many seconds
    #[arg(long, value_name = "SECS")]
    pub(crate) duration: Option<f64>,
    /// Client: this many messages
    #[arg(long, value_name = "N")]
    pub(crate) count: Option<u64>,
    /// Client: round trips before measuring
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub(crate) warmup: u64,
    /// Pin this process to CPU N
    #[arg(long, value_name = "N")]
    pub(crate) cpu: Option<usize>,
    /// Client: give up connecting after SECS
    #[arg(long, value_name = "SECS", default_value_t = 5.0)]
    pub(crate) connect_timeout: f64,
    /// Mode conn: concurrent clients (client) and serving threads (server)
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub(crate) clients: usize,
    /// Mode hold (client): idle connections to hold
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub(crate) idle: usize,
}

fn parse_size(s: &str) -> Result<usize, String> {
    s.parse::<usize>()
        .ok()
        .filter(|n| (1..=64 << 20).contains(n))
        .ok_or_else(|| format!("'{s}' is not 1 .. 64 MiB"))
}

/// Parses a generator command line (without the program name).
pub fn parse_args<I: IntoIterator<Item = String>>(args: I) -> Result<GenArgs, clap::Error> {
    use clap::{CommandFactory, Parser};
    let g = GenArgs::try_parse_from(std::iter::once("canal-bench-gen".to_string()).chain(args))?;
    if g.role == Role::Client && g.duration.is_none() && g.count.is_none() {
        return Err(GenArgs::command().error(
            clap::error::ErrorKind::MissingRequiredArgument,
            "a client needs --duration or --count",
        ));
    }
    Ok(g)
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
    if g.net == Net::Udp && !matches!(g.mode, Mode::Rr | Mode::Stream) {
        return Err(format!(
            "--net udp serves modes rr and stream, not {:?}",
            g.mode
        ));
    }
    let udp = crate::udpgen::UdpArgs {
        addr: &g.addr,
        stream: g.mode == Mode::Stream,
        size: g.size,
        duration: g.duration,
        count: g.count,
        warmup: g.warmup,
    };
    match (g.role, g.net) {
        (Role::Server, Net::Udp) => crate::udpgen::server(&udp).map_err(|e| format!("server: {e}")),
        (Role::Client, Net::Udp) => crate::udpgen::client(&udp).map_err(|e| format!("client: {e}")),
        (Role::Server, _) => server(g).map_err(|e| format!("server: {e}")),
        (Role::Client, _) => client(g).map_err(|e| format!("client: {e}")),
    }
}

fn server(g: &GenArgs) -> io::Result<String> {
    let mut conn = match g.net {
        Net::Tcp => {
            let l = TcpListener::bind(&g.addr)?;
            println!("READY {}", l.local_addr()?);
            io::stdout().flush()?;
            if matches!(g.mode, Mode::Conn | Mode::Hold) {
                crate::conngen::raise_nofile();
            }
            if g.mode == Mode::Conn {
                return crate::conngen::serve_conns(l, g.clients);
            }
            let c = l.accept()?.0;
            if g.mode == Mode::Hold {
                c.set_nodelay(true)?;
                let cpu0 = self_cpu_seconds();
                let msgs = crate::conngen::serve_epoll(l, c, g.size)?;
                return Ok(format!(
                    "RESULT role=server msgs={msgs} bytes={} cpu_s={:.6}",
                    msgs * 2 * g.size as u64,
                    self_cpu_seconds() - cpu0
                ));
            }
            Conn::Tcp(c)
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
        Net::Udp => return Err(io::Error::other("datagrams are udpgen's")),
    };
    // CPU is counted from here: start-up (and whatever a preload library does before
    // main) is not part of the transfer.
    let cpu0 = self_cpu_seconds();
    let mut buf = vec![0u8; g.size];
    let (mut msgs, mut bytes) = (0u64, 0u64);
    match g.mode {
        Mode::Rr | Mode::Hold => {
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
        Mode::Conn => {}
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
            Net::Udp => Err(io::Error::other("datagrams have no connection (udpgen)")),
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
    if g.mode == Mode::Conn {
        crate::conngen::raise_nofile();
        return crate::conngen::client_conns(
            &g.addr,
            g.clients,
            g.duration.unwrap_or(2.0),
            g.connect_timeout,
        );
    }
    let mut conn = connect(g)?;
    let _idle = if g.mode == Mode::Hold {
        crate::conngen::raise_nofile();
        crate::conngen::open_idle(&g.addr, g.idle)?
    } else {
        Vec::new()
    };
    // CPU is counted from the connection on (see server()).
    let cpu0 = self_cpu_seconds();
    let deadline = g
        .duration
        .map(|d| Instant::now() + Duration::from_secs_f64(d));
    let max = g.count.unwrap_or(u64::MAX);
    match g.mode {
        Mode::Rr | Mode::Hold => {
            conn.nodelay()?;
            let mut out = vec![0x5au8; g.size];
            let mut back = vec![0u8; g.size];
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
            crate::rrloop::run(g.size, g.warmup, max, deadline, cpu0, |seq| {
                one(&mut conn, seq)
            })
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
        // Answered by conngen before a connection is made (above).
        Mode::Conn => Err(io::Error::other("mode conn runs in conngen::client_conns")),
    }
}

/// Parses a `RESULT k=v ...` line into pairs.
pub(crate) fn parse_result(line: &str) -> Option<Vec<(String, String)>> {
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
        let g = parse_args(s(&[
            "client", "--net", "unix", "--addr", "/tmp/x", "--mode", "stream", "--size", "1024",
            "--count", "10",
        ]))
        .unwrap();
        assert_eq!(
            (g.net, g.mode, g.size, g.count),
            (Net::Unix, Mode::Stream, 1024, Some(10))
        );
        assert!(parse_args(s(&["client", "--addr", "x"])).is_err());
        assert!(parse_args(s(&["server", "--addr", "x", "--size", "0"])).is_err());
        assert!(parse_args(s(&["server", "--addr=x", "--net=sctp"])).is_err());
        assert_eq!(
            parse_args(s(&["server", "--addr=x", "--net=udp"]))
                .unwrap()
                .net,
            Net::Udp
        );
        assert!(parse_args(s(&["server", "--addr=x"])).is_ok());
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
            let srv = parse_args(s(&[
                "server", "--net", "unix", "--addr", &path, "--mode", mode, "--size", size,
            ]))
            .unwrap();
            let cli = parse_args(s(&[
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
