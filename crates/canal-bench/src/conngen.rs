//! The generator's connection workloads (B12, B13), beside `gen`'s rr/stream/idle:
//!
//! - `conn` (B12): `--clients` client threads each loop connect, 1-byte echo, close until the
//!   time runs out; the server has as many threads, each accepting and serving one
//!   connection at a time. The client reports connections/s and the p50/p99 of one
//!   connection's whole life (connect to close). It ends the server with a connection
//!   that sends `Q`.
//! - `hold` (B13): the client connects its request-response connection first, then
//!   `--idle` connections the server accepts and holds, all in one epoll set with the
//!   listener (one thread, as a real server); it prints `BASE` before and
//!   `HELD n` after them and waits each time (the harness samples every process's
//!   memory then), then runs the usual
//!   64-byte ping-pong on the first connection among the idle ones.
use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::stats::self_cpu_seconds;

/// Raises the soft descriptor limit to the hard one (thousands of connections).
pub(crate) fn raise_nofile() {
    // SAFETY: getrlimit/setrlimit only read and write the struct we own.
    unsafe {
        let mut r: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 {
            r.rlim_cur = r.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
}

fn serve_one(mut c: TcpStream) -> io::Result<bool> {
    let mut b = [0u8; 1];
    if c.read(&mut b)? == 0 {
        return Ok(false);
    }
    if b[0] == b'Q' {
        return Ok(true);
    }
    c.write_all(&b)?;
    // Until the client's close.
    while c.read(&mut b)? != 0 {}
    Ok(false)
}

/// B12 server: `clients` threads accepting on `l`; returns the RESULT line once a
/// client sends `Q`.
pub(crate) fn serve_conns(l: TcpListener, clients: usize) -> io::Result<String> {
    let cpu0 = self_cpu_seconds();
    let l = Arc::new(l);
    let served = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let (tx, rx) = std::sync::mpsc::channel::<io::Result<()>>();
    for _ in 0..clients.max(1) {
        let (l, tx, served) = (l.clone(), tx.clone(), served.clone());
        std::thread::spawn(move || loop {
            let c = match l.accept() {
                Ok((c, _)) => c,
                Err(e) => match e.raw_os_error() {
                    Some(libc::EINTR | libc::ECONNABORTED | libc::EAGAIN | libc::EPROTO) => {
                        continue
                    }
                    // Out of descriptors or memory: natively too; try again shortly.
                    Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM) => {
                        std::thread::sleep(std::time::Duration::from_millis(1));
                        continue;
                    }
                    // The listener is gone (e.g. EIO: canald went away): the server
                    // ends with the error instead of retrying it forever.
                    _ => {
                        let _ = tx.send(Err(e));
                        return;
                    }
                },
            };
            let _ = c.set_nodelay(true);
            match serve_one(c) {
                Ok(true) => {
                    let _ = tx.send(Ok(()));
                    return;
                }
                Ok(false) => {
                    served.fetch_add(1, Ordering::Relaxed);
                }
                Err(_) => {}
            }
        });
    }
    if let Ok(Err(e)) = rx.recv() {
        return Err(io::Error::new(e.kind(), format!("accept: {e}")));
    }
    let served = served.load(Ordering::Relaxed);
    Ok(format!(
        "RESULT role=server msgs={served} bytes={served} cpu_s={:.6}",
        self_cpu_seconds() - cpu0
    ))
}

/// One connection's life: connect, send a byte, read it back, close.
fn one_conn(addr: &str) -> io::Result<()> {
    let mut c = TcpStream::connect(addr)?;
    c.set_nodelay(true)?;
    c.write_all(b"x")?;
    let mut b = [0u8; 1];
    c.read_exact(&mut b)?;
    if b[0] != b'x' {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "wrong echo"));
    }
    Ok(())
}

/// B12 client: `clients` threads for `secs` seconds against `addr`.
pub(crate) fn client_conns(
    addr: &str,
    clients: usize,
    secs: f64,
    connect_timeout: f64,
) -> io::Result<String> {
    // The server may not listen yet (a guest's start-up): the first connection retries.
    let first = Instant::now() + Duration::from_secs_f64(connect_timeout);
    while let Err(e) = one_conn(addr) {
        if Instant::now() >= first || e.kind() != io::ErrorKind::ConnectionRefused {
            return Err(e);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let cpu0 = self_cpu_seconds();
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let dur = Duration::from_secs_f64(secs);
    let threads: Vec<_> = (0..clients.max(1))
        .map(|_| {
            let (addr, stop) = (addr.to_string(), stop.clone());
            std::thread::spawn(move || -> io::Result<Vec<u64>> {
                let mut lat = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let t0 = Instant::now();
                    one_conn(&addr)?;
                    lat.push(t0.elapsed().as_nanos() as u64);
                    if start.elapsed() >= dur {
                        stop.store(true, Ordering::Relaxed);
                    }
                }
                Ok(lat)
            })
        })
        .collect();
    let mut lat = Vec::new();
    for t in threads {
        lat.extend(
            t.join()
                .map_err(|_| io::Error::other("client thread panicked"))??,
        );
    }
    let elapsed = start.elapsed().as_secs_f64();
    // Ends the server.
    let mut q = TcpStream::connect(addr)?;
    q.write_all(b"Q")?;
    lat.sort_unstable();
    let pct = |p: f64| crate::stats::percentile_sorted_u64(&lat, p);
    let n = lat.len();
    Ok(format!(
        "RESULT role=client mode=conn clients={} msgs={n} bytes={n} elapsed_s={elapsed:.6} \
         conns_per_s={:.1} p50_ns={:.0} p99_ns={:.0} cpu_s={:.6}",
        clients,
        n as f64 / elapsed,
        pct(50.0),
        pct(99.0),
        self_cpu_seconds() - cpu0,
    ))
}

/// B13 server, as a real server holds many clients: one thread, one epoll set with the
/// listener and every connection. It echoes `size`-byte requests on `rr` (accepted
/// first) and holds the others, until `rr` ends; returns the requests served.
pub(crate) fn serve_epoll(l: TcpListener, mut rr: TcpStream, size: usize) -> io::Result<u64> {
    use std::os::fd::AsRawFd;
    let check = |r: libc::c_int| {
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(r)
        }
    };
    // SAFETY: plain epoll system calls on descriptors this function owns; `ev` and
    // `evs` are live locals the kernel reads or fills.
    let ep = check(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
    let add = |fd: libc::c_int| {
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: fd as u64,
        };
        // SAFETY: as above.
        check(unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut ev) })
    };
    l.set_nonblocking(true)?;
    add(l.as_raw_fd())?;
    add(rr.as_raw_fd())?;
    let mut held = std::collections::HashMap::new();
    let mut evs = vec![libc::epoll_event { events: 0, u64: 0 }; 64];
    let mut buf = vec![0u8; size];
    let mut msgs = 0u64;
    'serve: loop {
        // SAFETY: as above.
        let n = unsafe { libc::epoll_wait(ep, evs.as_mut_ptr(), evs.len() as i32, -1) };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        for ev in &evs[..n as usize] {
            let fd = ev.u64 as libc::c_int;
            if fd == l.as_raw_fd() {
                while let Ok((c, _)) = l.accept() {
                    add(c.as_raw_fd())?;
                    held.insert(c.as_raw_fd(), c);
                }
            } else if fd == rr.as_raw_fd() {
                if let Err(e) = rr.read_exact(&mut buf) {
                    if e.kind() == io::ErrorKind::UnexpectedEof {
                        break 'serve;
                    }
                    return Err(e);
                }
                rr.write_all(&buf)?;
                msgs += 1;
            } else if let Some(mut c) = held.remove(&fd) {
                // A held client closed (or sent): let it go.
                let mut b = [0u8; 64];
                if !matches!(c.read(&mut b), Ok(n) if n > 0) {
                    drop(c);
                } else {
                    held.insert(fd, c);
                }
            }
        }
    }
    // SAFETY: ep is ours.
    unsafe { libc::close(ep) };
    Ok(msgs)
}

/// B13 client, before the ping-pong: `idle` connections to `addr`, then `HELD n` and a
/// second for the harness to sample memory.
pub(crate) fn open_idle(addr: &str, idle: usize) -> io::Result<Vec<TcpStream>> {
    // The harness samples memory before, too: every process is up and connected once.
    println!("BASE");
    io::stdout().flush()?;
    std::thread::sleep(Duration::from_millis(500));
    let mut v = Vec::with_capacity(idle);
    for _ in 0..idle {
        v.push(TcpStream::connect(addr)?);
    }
    println!("HELD {}", v.len());
    io::stdout().flush()?;
    std::thread::sleep(Duration::from_secs(1));
    Ok(v)
}
