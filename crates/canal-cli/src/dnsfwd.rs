//! The resolver inside `canal run --isolate`: 10.0.2.3:53.
//!
//! A program's own sockets to 10.0.2.3 are canal sockets, and canald forwards them
//! (its `--dns`). glibc's stub resolver is different: libc calls its own socket
//! functions internally, past any LD_PRELOAD hook, so its queries leave on kernel
//! sockets inside the namespace. For those the child puts 10.0.2.3 on the
//! namespace's `lo` and binds UDP and TCP sockets there; canal run, outside, holds
//! them and relays each query to the same resolver canald uses, from the host's
//! namespace.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, SocketAddrV4, TcpListener, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

/// The guest's resolver address.
pub(crate) const GUEST_DNS: [u8; 4] = [10, 0, 2, 3];

/// Queries waiting for an answer longer than this are forgotten (the stub resolver
/// has retried or given up by then).
const PENDING_TTL: Duration = Duration::from_secs(10);

/// Relays UDP queries arriving on `inside` (a socket bound in the guest's namespace)
/// to `upstream`, and answers back to whoever asked. Runs until `inside` fails.
pub(crate) fn relay_udp(inside: UdpSocket, upstream: SocketAddrV4) -> io::Result<()> {
    let out = UdpSocket::bind("0.0.0.0:0")?;
    out.connect(upstream)?;
    let out2 = out.try_clone()?;
    let inside2 = inside.try_clone()?;
    // (transaction id, asker, when): answers are matched to askers by id.
    let pending = std::sync::Arc::new(std::sync::Mutex::new(
        Vec::<(u16, SocketAddr, Instant)>::new(),
    ));
    let p2 = pending.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 65536];
        while let Ok(n) = out2.recv(&mut buf) {
            if n < 2 {
                continue;
            }
            let id = u16::from_be_bytes([buf[0], buf[1]]);
            let mut p = p2.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(i) = p.iter().position(|e| e.0 == id) {
                let (_, asker, _) = p.swap_remove(i);
                let _ = inside2.send_to(&buf[..n], asker);
            }
        }
    });
    let mut buf = [0u8; 65536];
    loop {
        let (n, asker) = inside.recv_from(&mut buf)?;
        if n < 12 {
            continue;
        }
        let id = u16::from_be_bytes([buf[0], buf[1]]);
        {
            let mut p = pending.lock().unwrap_or_else(|e| e.into_inner());
            p.retain(|e| e.2.elapsed() < PENDING_TTL);
            p.push((id, asker, Instant::now()));
        }
        let _ = out.send(&buf[..n]);
    }
}

/// Relays DNS over TCP (the stub resolver's retry for a truncated answer): each
/// connection on `inside` is joined to a new one to `upstream`.
pub(crate) fn relay_tcp(inside: TcpListener, upstream: SocketAddrV4) -> io::Result<()> {
    loop {
        let (c, _) = inside.accept()?;
        std::thread::spawn(move || {
            let Ok(u) = TcpStream::connect_timeout(&upstream.into(), Duration::from_secs(5)) else {
                return;
            };
            let (Ok(c2), Ok(u2)) = (c.try_clone(), u.try_clone()) else {
                return;
            };
            let t = std::thread::spawn(move || copy(c2, u2));
            copy(u, c);
            let _ = t.join();
        });
    }
}

fn copy(mut from: TcpStream, mut to: TcpStream) {
    let mut buf = [0u8; 16384];
    while let Ok(n) = from.read(&mut buf) {
        if n == 0 || to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Write);
}
