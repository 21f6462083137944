//! The exitless engine: notification modes, batching ablation, coalescing, the channel
//! scheduler's fairness, and virtual-RSS workers — each with data checked end to end.

mod common;
use canal_abi::queue::QueueProducer;
use canal_abi::sync::Ordering;
use canal_abi::{op, slot_state};
use common::*;
use std::io::{Read, Write};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A counter of worker `id` from the STAT JSON.
fn worker_num(stat: &str, id: u64, key: &str) -> u64 {
    let j: serde_json::Value = serde_json::from_str(stat).expect("STAT is JSON");
    j["daemon"]["workers"]
        .as_array()
        .and_then(|ws| ws.iter().find(|w| w["id"] == id))
        .and_then(|w| w[key].as_u64())
        .unwrap_or_else(|| panic!("no worker {id} {key} in {stat}"))
}

/// A guest's counter from the STAT JSON.
fn guest_num(stat: &str, id: u32, key: &str) -> u64 {
    let j: serde_json::Value = serde_json::from_str(stat).expect("STAT is JSON");
    j["guests"]
        .as_array()
        .and_then(|gs| gs.iter().find(|g| g["id"] == id))
        .and_then(|g| g[key].as_u64())
        .unwrap_or_else(|| panic!("no guest {id} {key} in {stat}"))
}

/// Moves `n` bytes each way between a guest and a native peer, compared by hash.
fn both_ways(g: &mut TestGuest, n: usize, seed: u64) {
    let (h, mut peer) = connected_pair(g);
    let up = pattern(seed, n);
    let down = pattern(seed + 1, n);
    let (up2, down2) = (up.clone(), down.clone());
    let native = std::thread::spawn(move || {
        let mut got = vec![0u8; up2.len()];
        peer.read_exact(&mut got).unwrap();
        assert!(got == up2, "guest→native bytes differ");
        peer.write_all(&down2).unwrap();
        peer
    });
    g.send_all(h, &up);
    let got = g.recv_exact(h, n);
    assert!(got == down, "native→guest bytes differ");
    drop(native.join().unwrap());
}

#[test]
fn every_notification_mode_moves_data() {
    for mode in ["poll", "sleep", "hybrid"] {
        let d = TestDaemon::start(&["--notify", mode]);
        let mut g = TestGuest::attach(&d.path, mode);
        both_ways(&mut g, 3 << 20, 11);
        // Requests complete too (the guest sleeps on its port when the host is slow).
        for _ in 0..200 {
            assert_eq!(g.request(op::NOP, 0, [0; 4], &[]).0, 0);
        }
        let st = d.stat();
        assert!(st.contains(&format!("\"notify\":\"{mode}\"")), "{st}");
        assert!(worker_num(&st, 0, "rounds") > 0);
        if mode == "poll" {
            assert_eq!(worker_num(&st, 0, "sleeps"), 0);
        }
    }
}

#[test]
fn sleep_mode_sleeps_and_hybrid_adapts() {
    // A guest that asks once every 3 ms: sleep mode sleeps between requests; hybrid's
    // budget shrinks towards its minimum (spinning 30 µs never catches a 3 ms gap).
    for mode in ["sleep", "hybrid"] {
        let d = TestDaemon::start(&["--notify", mode]);
        let mut g = TestGuest::attach(&d.path, mode);
        for _ in 0..40 {
            std::thread::sleep(Duration::from_millis(3));
            assert_eq!(g.request(op::NOP, 0, [0; 4], &[]).0, 0);
        }
        let st = d.stat();
        assert!(worker_num(&st, 0, "sleeps") >= 30, "{mode}: {st}");
        assert!(worker_num(&st, 0, "kicks") >= 30, "{mode}: {st}");
        if mode == "hybrid" {
            assert!(worker_num(&st, 0, "spin_ns") <= 5_000, "{st}");
        }
    }
}

#[test]
fn no_batch_moves_data() {
    let d = TestDaemon::start(&["--no-batch"]);
    let mut g = TestGuest::attach(&d.path, "nobatch");
    both_ways(&mut g, 2 << 20, 21);
}

#[test]
fn coalescing_limits_wakes_per_window() {
    // T_worst 4 ms, all of it on the guest side: at most one wake-up per 4 ms.
    let d = TestDaemon::start(&["--t-worst-us", "4000", "--split-us", "0"]);
    let mut g = TestGuest::attach(&d.path, "coalesce");
    let (h, mut peer) = connected_pair(&mut g);
    let msgs = 400usize;
    let writer = std::thread::spawn(move || {
        for i in 0..msgs {
            peer.write_all(&[i as u8; 16]).unwrap();
            std::thread::sleep(Duration::from_micros(200));
        }
        peer
    });
    let t0 = Instant::now();
    let before = guest_num(&d.stat(), g.id, "wakes");
    let mut got = Vec::new();
    let deadline = Instant::now() + T;
    while got.len() < msgs * 16 {
        assert!(
            Instant::now() < deadline,
            "only {} bytes arrived",
            got.len()
        );
        let mut buf = [0u8; 4096];
        let n = g.recv_some(h, &mut buf);
        if n > 0 {
            got.extend_from_slice(&buf[..n]);
            continue;
        }
        g.sleep_on_events(Some(h), 100, || g.rx_queued(h) > 0);
    }
    let elapsed = t0.elapsed();
    let st = d.stat();
    let wakes = guest_num(&st, g.id, "wakes") - before;
    let deferred = guest_num(&st, g.id, "deferred_wakes");
    drop(writer.join().unwrap());
    for (i, c) in got.chunks(16).enumerate() {
        assert!(c.iter().all(|&b| b == i as u8), "message {i} damaged");
    }
    let windows = elapsed.as_micros() as u64 / 4000 + 1;
    eprintln!("coalescing: {wakes} wakes, {deferred} deferred, {windows} windows in {elapsed:?}");
    assert!(
        wakes <= windows + 1,
        "{wakes} wakes in {windows} windows of 4 ms ({elapsed:?})"
    );
    assert!(deferred > 0, "nothing was coalesced: {st}");
    assert!(st.contains("\"t_v_ns\":4000000"), "{st}");
}

#[test]
fn coalescing_off_wakes_every_time() {
    let d = TestDaemon::start(&["--notify", "sleep"]);
    let mut g = TestGuest::attach(&d.path, "nocoal");
    let (h, mut peer) = connected_pair(&mut g);
    let before = guest_num(&d.stat(), g.id, "wakes");
    // Each message comes while the guest sleeps: each needs its own wake-up.
    let writer = std::thread::spawn(move || {
        for i in 0..20u8 {
            std::thread::sleep(Duration::from_millis(5));
            peer.write_all(&[i; 8]).unwrap();
        }
        peer
    });
    for i in 0..20u8 {
        let deadline = Instant::now() + T;
        while g.rx_queued(h) < 8 {
            assert!(Instant::now() < deadline);
            g.sleep_on_events(Some(h), 100, || g.rx_queued(h) >= 8);
        }
        assert_eq!(g.recv_exact(h, 8), vec![i; 8]);
    }
    drop(writer.join().unwrap());
    let st = d.stat();
    let wakes = guest_num(&st, g.id, "wakes") - before;
    assert!(wakes >= 15, "{wakes} wake-ups for 20 messages: {st}");
    assert_eq!(guest_num(&st, g.id, "deferred_wakes"), 0, "{st}");
    assert!(st.contains("\"t_worst_ns\":0"), "{st}");
}

/// Claims every free slot but the guest's own and keeps them all busy with NOPs.
fn flood_requests(g: &TestGuest, stop: &AtomicBool) -> u64 {
    let r = &g.region;
    let slots: Vec<u32> = (0..r.layout().slot_count)
        .filter(|&i| {
            r.slot(i)
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
        .take(64)
        .collect();
    let q = QueueProducer::new(r.queue_cells(), &r.header().queue_tail);
    let mut done = 0u64;
    let submit = |i: u32| {
        let s = r.slot(i).unwrap();
        s.op.store(op::NOP, Ordering::Relaxed);
        s.in_len.store(0, Ordering::Relaxed);
        s.state.store(slot_state::REQUESTED, Ordering::Release);
        while q.push(i).is_err() {
            std::hint::spin_loop();
        }
    };
    for &i in &slots {
        submit(i);
    }
    while !stop.load(Ordering::Relaxed) {
        for &i in &slots {
            if r.slot(i).unwrap().state.load(Ordering::Acquire) == slot_state::DONE {
                done += 1;
                submit(i);
            }
        }
        g.kick();
        // Leave the cores to canald and the other guest (2-core machines): 64
        // requests every ~100 µs is still more than one poller serves.
        std::thread::sleep(Duration::from_micros(50));
    }
    done
}

#[test]
fn a_flooding_guest_cannot_starve_another() {
    let d = TestDaemon::start(&[]);
    let stop = Arc::new(AtomicBool::new(false));
    let path = d.path.clone();
    let s2 = stop.clone();
    // The flood: 64 outstanding requests at all times, plus a socket streaming data
    // to a native sink as fast as it can.
    let flood = std::thread::spawn(move || {
        let mut g = TestGuest::attach(&path, "flood");
        let (h, mut peer) = connected_pair(&mut g);
        let sink = std::thread::spawn(move || {
            let mut buf = vec![0u8; 1 << 20];
            while peer.read(&mut buf).unwrap_or(0) > 0 {}
        });
        let chunk = vec![5u8; 256 << 10];
        while !s2.load(Ordering::Relaxed) {
            if g.send_some(h, &chunk) == 0 {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
        drop(g);
        let _ = sink.join();
    });
    let path = d.path.clone();
    let s4 = stop.clone();
    let reqflood = std::thread::spawn(move || {
        let g = TestGuest::attach(&path, "reqflood");
        flood_requests(&g, &s4)
    });
    std::thread::sleep(Duration::from_millis(200));
    let mut g = TestGuest::attach(&d.path, "latency");
    let mut lat = Vec::new();
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(2) {
        let t = Instant::now();
        assert_eq!(g.request(op::NOP, 0, [0; 4], &[]).0, 0);
        lat.push(t.elapsed());
        std::thread::sleep(Duration::from_micros(500));
    }
    stop.store(true, Ordering::Relaxed);
    let flooded = reqflood.join().unwrap();
    flood.join().unwrap();
    lat.sort();
    let p50 = lat[lat.len() / 2];
    let p99 = lat[lat.len() * 99 / 100];
    eprintln!(
        "latency guest under flood: {} requests, p50 {p50:?} p99 {p99:?}; flood served {flooded}",
        lat.len()
    );
    assert!(flooded > 1000, "the flood did not run: {flooded}");
    assert!(p99 < Duration::from_millis(10), "p99 {p99:?} (p50 {p50:?})");
}

#[test]
fn two_workers_move_eight_connections() {
    const GUESTS: usize = 4;
    const CONNS: usize = 2; // per guest: 8 connections in all
    const EACH: usize = 1 << 20;
    let d = TestDaemon::start(&["--workers", "2"]);
    let ids: Vec<u32> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..GUESTS)
            .map(|gi| {
                let path = d.path.clone();
                sc.spawn(move || {
                    let mut g = TestGuest::attach(&path, &format!("rss{gi}"));
                    let pairs: Vec<_> = (0..CONNS).map(|_| connected_pair(&mut g)).collect();
                    let mut natives = Vec::new();
                    let mut socks = Vec::new();
                    for (ci, (h, peer)) in pairs.into_iter().enumerate() {
                        let seed = (gi * 10 + ci) as u64;
                        natives.push(std::thread::spawn(move || {
                            let mut rd = peer.try_clone().unwrap();
                            let mut wr = peer;
                            let w = std::thread::spawn(move || {
                                wr.write_all(&pattern(500 + seed, EACH)).unwrap();
                            });
                            let mut got = vec![0u8; EACH];
                            rd.read_exact(&mut got).unwrap();
                            w.join().unwrap();
                            let mut hsh = FNV0;
                            fnv(&mut hsh, &got);
                            hsh
                        }));
                        socks.push((h, seed));
                    }
                    // One thread interleaves both connections of this guest.
                    let outs: Vec<Vec<u8>> =
                        socks.iter().map(|&(_, s)| pattern(900 + s, EACH)).collect();
                    let mut sent = [0usize; CONNS];
                    let mut got: Vec<Vec<u8>> = vec![Vec::new(); CONNS];
                    let mut buf = vec![0u8; 128 << 10];
                    let t0 = Instant::now();
                    while sent.iter().any(|&s| s < EACH) || got.iter().any(|v| v.len() < EACH) {
                        assert!(t0.elapsed() < Duration::from_secs(30), "stalled");
                        let mut progress = false;
                        for (ci, &(h, _)) in socks.iter().enumerate() {
                            if sent[ci] < EACH {
                                let n = g.send_some(h, &outs[ci][sent[ci]..]);
                                sent[ci] += n;
                                progress |= n > 0;
                            }
                            let n = g.recv_some(h, &mut buf);
                            got[ci].extend_from_slice(&buf[..n]);
                            progress |= n > 0;
                        }
                        if !progress {
                            g.kick();
                            std::thread::sleep(Duration::from_micros(100));
                        }
                    }
                    for (ci, n) in natives.into_iter().enumerate() {
                        let mut want = FNV0;
                        fnv(&mut want, &outs[ci]);
                        assert_eq!(n.join().unwrap(), want, "guest→native hash");
                        let mut have = FNV0;
                        fnv(&mut have, &got[ci]);
                        let mut want = FNV0;
                        fnv(&mut want, &pattern(500 + socks[ci].1, EACH));
                        assert_eq!(have, want, "native→guest hash");
                    }
                    let id = g.id;
                    // Stay attached until the listing was taken.
                    (id, g)
                })
            })
            .collect();
        let done: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        let st = d.stat();
        let mut on = [0u32; 2];
        for (id, _) in &done {
            on[guest_num(&st, *id, "worker") as usize] += 1;
        }
        assert_eq!(on, [2, 2], "guests spread over both workers: {st}");
        assert!(worker_num(&st, 1, "rounds") > 0, "{st}");
        done.into_iter().map(|(id, _)| id).collect()
    });
    assert_eq!(ids.len(), GUESTS);
}

#[test]
fn idle_two_workers_use_no_cpu() {
    let d = TestDaemon::start(&["--workers", "2"]);
    let mut a = TestGuest::attach(&d.path, "idle-a");
    let mut b = TestGuest::attach(&d.path, "idle-b");
    let (_ha, _pa) = connected_pair(&mut a);
    let (_hb, _pb) = connected_pair(&mut b);
    std::thread::sleep(Duration::from_millis(100));
    let before = cpu_ticks(d.child.id());
    std::thread::sleep(Duration::from_millis(1500));
    let used = cpu_ticks(d.child.id()) - before;
    assert!(
        used <= 2,
        "idle canald (2 workers) used {used} ticks in 1.5 s"
    );
}
