//! Rough numbers for the report, not a benchmark suite (that is `canal bench`).
//! Ignored by default: `cargo test --release -p canald --test perf -- --ignored --nocapture`.

mod common;
use canal_abi::{op, sock_flag};
use common::*;
use std::io::Read;
use std::net::TcpListener;
use std::time::{Duration, Instant};

#[test]
#[ignore]
fn nop_round_trip_and_stream_throughput() {
    let d = TestDaemon::start(&[]);
    let mut g = TestGuest::attach(&d.path, "perf");
    for _ in 0..1000 {
        g.request(op::NOP, 0, [0; 4], &[]);
    }
    let n = 100_000;
    let t0 = Instant::now();
    for _ in 0..n {
        g.request(op::NOP, 0, [0; 4], &[]);
    }
    let per = t0.elapsed() / n;
    eprintln!("NOP round trip (host polling): {per:?}");

    // After an idle pause the host sleeps: the next request pays for the doorbell.
    let mut worst = Duration::ZERO;
    let mut total = Duration::ZERO;
    for _ in 0..50 {
        std::thread::sleep(Duration::from_millis(2));
        let t = Instant::now();
        g.request(op::NOP, 0, [0; 4], &[]);
        let e = t.elapsed();
        total += e;
        worst = worst.max(e);
    }
    eprintln!(
        "NOP round trip after idle (doorbell): avg {:?} max {worst:?}",
        total / 50
    );

    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let h = g.socket(AF_INET, STREAM);
    g.connect(h, &localhost(port));
    let (mut peer, _) = l.accept().unwrap();
    g.wait_flags(h, sock_flag::CONNECTED);
    const TOTAL: usize = 1 << 30;
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0u8; 1 << 20];
        let mut n = 0;
        while n < TOTAL {
            n += peer.read(&mut buf).unwrap();
        }
    });
    let chunk = vec![7u8; 1 << 20];
    let t0 = Instant::now();
    for _ in 0..TOTAL / chunk.len() {
        g.send_all(h, &chunk);
    }
    reader.join().unwrap();
    let secs = t0.elapsed().as_secs_f64();
    eprintln!(
        "stream guest→native: {:.2} GB/s ({} MiB in {secs:.2}s)",
        TOTAL as f64 / secs / 1e9,
        TOTAL >> 20
    );
}
