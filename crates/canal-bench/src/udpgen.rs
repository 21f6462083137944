//! The generator over UDP (B15): request-response and one-way stream of datagrams.
//!
//! - `rr`: the client sends a `size`-byte datagram whose first 8 bytes carry a sequence
//!   number, the server echoes it to the sender; the client times each round trip and
//!   checks the number. A datagram lost on the way fails the run after 2 s (loopback and
//!   canal do not lose datagrams of a request-response loop).
//! - `stream`: the client sends `size`-byte datagrams (≥ 8 bytes) until its time runs
//!   out, then END datagrams (8 × 0xff) until the server answers with the bytes and
//!   datagrams it received. Throughput counts what arrived: UDP may drop under a sender
//!   faster than its receiver, natively too, and the result says how many were lost.
//!
//! The server prints `READY <addr>`, each end one `RESULT` line as `gen` does.
use crate::stats::self_cpu_seconds;
use std::io::{self, Write};
use std::net::UdpSocket;
use std::time::{Duration, Instant};

/// What one end does (from the generator's command line).
pub(crate) struct UdpArgs<'a> {
    pub(crate) addr: &'a str,
    /// One-way stream, else request-response.
    pub(crate) stream: bool,
    pub(crate) size: usize,
    pub(crate) duration: Option<f64>,
    pub(crate) count: Option<u64>,
    pub(crate) warmup: u64,
}

const END: [u8; 8] = [0xff; 8];
const QUIT: [u8; 1] = [b'Q'];

pub(crate) fn server(g: &UdpArgs) -> io::Result<String> {
    let s = UdpSocket::bind(g.addr)?;
    println!("READY {}", s.local_addr()?);
    io::stdout().flush()?;
    let cpu0 = self_cpu_seconds();
    let mut buf = vec![0u8; g.size.max(64 * 1024)];
    let (mut msgs, mut bytes) = (0u64, 0u64);
    loop {
        let (n, from) = s.recv_from(&mut buf)?;
        match g.stream {
            true if buf[..n] == END => {
                let mut ack = [0u8; 16];
                ack[..8].copy_from_slice(&bytes.to_le_bytes());
                ack[8..].copy_from_slice(&msgs.to_le_bytes());
                s.send_to(&ack, from)?;
                // Further ENDs of this client (its retries) get the same answer until
                // it quits.
                loop {
                    let (n, from) = s.recv_from(&mut buf)?;
                    if buf[..n] == QUIT {
                        break;
                    }
                    s.send_to(&ack, from)?;
                }
                break;
            }
            true => {
                msgs += 1;
                bytes += n as u64;
            }
            _ if buf[..n] == QUIT => break,
            _ => {
                s.send_to(&buf[..n], from)?;
                msgs += 1;
                bytes += 2 * n as u64;
            }
        }
    }
    Ok(format!(
        "RESULT role=server msgs={msgs} bytes={bytes} cpu_s={:.6}",
        self_cpu_seconds() - cpu0
    ))
}

fn lost(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, what)
}

pub(crate) fn client(g: &UdpArgs) -> io::Result<String> {
    let s = UdpSocket::bind("127.0.0.1:0")?;
    s.connect(g.addr)?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    let cpu0 = self_cpu_seconds();
    let deadline = g
        .duration
        .map(|d| Instant::now() + Duration::from_secs_f64(d));
    let max = g.count.unwrap_or(u64::MAX);
    let r = if g.stream {
        stream(g, &s, deadline, max, cpu0)
    } else {
        rr(g, &s, deadline, max, cpu0)
    };
    let _ = s.send(&QUIT);
    r
}

fn rr(
    g: &UdpArgs,
    s: &UdpSocket,
    deadline: Option<Instant>,
    max: u64,
    cpu0: f64,
) -> io::Result<String> {
    let mut out = vec![0x5au8; g.size];
    let mut back = vec![0u8; g.size + 1];
    let k = g.size.min(8);
    let one = |seq: u64| -> io::Result<()> {
        out[..k].copy_from_slice(&seq.to_le_bytes()[..k]);
        s.send(&out)?;
        let n = s
            .recv(&mut back)
            .map_err(|e| lost(format!("no echo of datagram {seq} in 2 s ({e})")))?;
        if n != g.size || back[..k] != out[..k] {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("echo of datagram {seq}: {n} bytes or the wrong sequence number"),
            ));
        }
        Ok(())
    };
    crate::rrloop::run(g.size, g.warmup, max, deadline, cpu0, one)
}

fn stream(
    g: &UdpArgs,
    s: &UdpSocket,
    deadline: Option<Instant>,
    max: u64,
    cpu0: f64,
) -> io::Result<String> {
    if g.size < 8 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "a UDP stream needs datagrams of at least 8 bytes",
        ));
    }
    let buf = vec![0xa5u8; g.size];
    let mut sent = 0u64;
    let start = Instant::now();
    while sent < max {
        match s.send(&buf) {
            Ok(_) => sent += 1,
            // A full socket buffer (ENOBUFS/EAGAIN): as natively, try again.
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOBUFS | libc::EAGAIN)) => {}
            Err(e) => return Err(e),
        }
        if sent % 64 == 0 && deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
    }
    s.set_read_timeout(Some(Duration::from_millis(100)))?;
    let mut ack = [0u8; 16];
    let mut tries = 0;
    let got = loop {
        s.send(&END)?;
        match s.recv(&mut ack) {
            Ok(16) => break ack,
            _ if tries < 50 => tries += 1,
            _ => return Err(lost("no count from the server after END".into())),
        }
    };
    let elapsed = start.elapsed().as_secs_f64();
    let bytes = u64::from_le_bytes(got[..8].try_into().unwrap_or([0; 8]));
    let msgs = u64::from_le_bytes(got[8..].try_into().unwrap_or([0; 8]));
    Ok(format!(
        "RESULT role=client mode=stream size={} msgs={msgs} bytes={bytes} elapsed_s={elapsed:.6} \
         bytes_per_s={:.0} msgs_per_s={:.0} sent={sent} lost={} cpu_s={:.6}",
        g.size,
        bytes as f64 / elapsed,
        msgs as f64 / elapsed,
        sent.saturating_sub(msgs),
        self_cpu_seconds() - cpu0,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(stream: bool, size: usize) -> (String, String) {
        let port = {
            let s = UdpSocket::bind("127.0.0.1:0").unwrap();
            s.local_addr().unwrap().port()
        };
        let addr = format!("127.0.0.1:{port}");
        let a = addr.clone();
        let srv = std::thread::spawn(move || {
            let g = UdpArgs {
                addr: &a,
                stream,
                size,
                duration: None,
                count: None,
                warmup: 0,
            };
            server(&g).unwrap()
        });
        std::thread::sleep(Duration::from_millis(50));
        let g = UdpArgs {
            addr: &addr,
            stream,
            size,
            duration: None,
            count: Some(200),
            warmup: 5,
        };
        let c = client(&g).unwrap();
        (c, srv.join().unwrap())
    }

    #[test]
    fn loopback_udp_rr_and_stream() {
        let (c, s) = pair(false, 64);
        assert!(c.contains("mode=rr size=64 msgs=200 "), "{c}");
        assert!(s.contains("msgs=205 "), "{s}");
        let (c, s) = pair(true, 512);
        assert!(
            c.contains("mode=stream size=512 ") && c.contains("sent=200 "),
            "{c}"
        );
        assert!(s.starts_with("RESULT role=server"), "{s}");
    }
}
