//! The co-resident short-circuit (protocol §8), from canald's side: two test guests
//! that announced SHORTCUT connect through a pair segment (STAT says tcp-shortcut),
//! move data both ways over it, half-close, reset, and see a dying peer as EOF.
mod common;

use canal_abi::control::{hello_flag, kind};
use canal_abi::ring::{record_kind, Consumer, Producer};
use canal_abi::segment::{side, ArenaLayout, SegHeader};
use canal_abi::sync::Ordering;
use canal_abi::{errno, op, sock_flag, CanalAddr};
use canald::sys::Mapping;
use common::*;
use std::time::{Duration, Instant};

fn guest(d: &TestDaemon, comm: &str) -> TestGuest {
    TestGuest::attach_with(&d.path, comm, hello_flag::SHORTCUT)
}

/// A listener on 127.0.0.1 (any port); returns (handle, port).
fn listen(g: &mut TestGuest) -> (u32, u16) {
    let l = g.socket(libc::AF_INET as u64, libc::SOCK_STREAM as u64);
    let (r, _) = g.request(op::BIND, l, [0; 4], &localhost(0).encode());
    assert_eq!(r, 0);
    assert_eq!(g.request(op::LISTEN, l, [8, 0, 0, 0], &[]).0, 0);
    let (r, out) = g.request(op::GETSOCKNAME, l, [0; 4], &[]);
    assert_eq!(r, 0);
    (l, CanalAddr::decode(&out).unwrap().port)
}

/// Maps the segment an entry names (SEGMENT / SEGMENT_OK).
fn map_segment(g: &TestGuest, h: u32) -> Mapping {
    let id = g.entry(h).segment.load(Ordering::Acquire);
    assert_ne!(id, 0, "entry is not segment-backed");
    send_ctl(&g.ctl, kind::SEGMENT, &id.to_le_bytes(), &[]);
    let (k, body, mut fds) = recv_ctl(&g.ctl);
    assert_eq!(k, kind::SEGMENT_OK, "{body:?}");
    let size = u64::from_le_bytes(body[8..16].try_into().unwrap());
    let fd = fds.pop().expect("memfd");
    let m = Mapping::map(&fd, size as usize).unwrap();
    let (h, _) = m.segment_view().expect("a valid segment");
    assert_eq!(
        canal_abi::segment::check_header(h, id, size),
        Ok(h.ring_size)
    );
    m
}

/// One end of a short-circuited connection, as a guest drives it.
struct End<'a> {
    seg: &'a SegHeader,
    rings: [canal_abi::ring::RawRing; 2],
    side: u32,
}

impl<'a> End<'a> {
    fn new(m: &'a Mapping, g: &TestGuest, h: u32) -> End<'a> {
        End::at(m, 0, g, h)
    }
    /// The end of a segment `off` bytes into `m` (an arena slot).
    fn at(m: &'a Mapping, off: u64, g: &TestGuest, h: u32) -> End<'a> {
        let (seg, rings) = m.segment_view_at(off as usize).unwrap();
        End {
            seg,
            rings,
            side: g.entry(h).segment_side.load(Ordering::Acquire),
        }
    }
    fn send(&self, data: &[u8]) -> usize {
        let d = &self.seg.dirs[self.side as usize];
        let mut p = Producer {
            storage: &self.rings[self.side as usize],
            head_shared: &d.head,
            tail_shared: &d.tail,
            head: d.head.load(Ordering::Relaxed),
        };
        p.push(data).unwrap()
    }
    fn recv(&self, buf: &mut [u8]) -> usize {
        let d = &self.seg.dirs[1 - self.side as usize];
        let mut c = Consumer {
            storage: &self.rings[1 - self.side as usize],
            head_shared: &d.head,
            tail_shared: &d.tail,
            tail: d.tail.load(Ordering::Relaxed),
        };
        c.pop(buf).unwrap()
    }
}

/// Connects `c` to `port`; returns (client handle, accepted handle in `s`).
fn connect(c: &mut TestGuest, s: &TestGuest, l: u32, port: u16) -> (u32, u32) {
    let h = c.socket(libc::AF_INET as u64, libc::SOCK_STREAM as u64);
    let r = c.connect(h, &localhost(port));
    assert!(r == 0 || r == -(errno::EINPROGRESS as i64), "connect: {r}");
    c.wait_flags(h, sock_flag::CONNECTED | sock_flag::ERROR);
    assert_eq!(c.flags(h) & sock_flag::ERROR, 0);
    let (k, peer, p) = s.wait_record(l);
    assert_eq!(k, record_kind::ACCEPT);
    let a = u32::from_le_bytes(p[..4].try_into().unwrap());
    // The accept record's peer address is the client's real, reserved address.
    let (r, out) = c.request(op::GETSOCKNAME, h, [0; 4], &[]);
    assert_eq!(r, 0);
    assert_eq!(CanalAddr::decode(&out).unwrap(), peer);
    assert_ne!(peer.port, 0);
    (h, a)
}

fn wait(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + T;
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn shortcut_connection_lifecycle() {
    let d = TestDaemon::start(&[]);
    let mut srv = guest(&d, "srv");
    let cli = guest(&d, "cli");
    let l = listen(&mut srv);
    lifecycle(&d, srv, cli, l);
}

/// The guest's home worker, as STAT lists it.
fn home_of(d: &TestDaemon, id: u32) -> u32 {
    let st = d.stat();
    let at = st
        .find(&format!("{{\"id\":{id},"))
        .unwrap_or_else(|| panic!("guest {id} listed: {st}"));
    let w = st[at..].find("\"worker\":").expect("guest worker") + at + 9;
    st[w..w + 1].parse().unwrap()
}

/// With two workers, the two guests of a short-circuit sit on different workers:
/// pairing, the wake-up of a sleeping side, half-close, reset and guest death cross
/// between them (protocol §8.5). The daemon sleeps as soon as a round is idle, so a
/// job left on the wrong worker would hang the test.
#[test]
fn shortcut_across_workers() {
    let d = TestDaemon::start(&["--workers", "2", "--notify", "sleep"]);
    let both = hello_flag::SHORTCUT | hello_flag::VRSS;
    let mut srv = TestGuest::attach_with(&d.path, "srv", both);
    let mut cli = TestGuest::attach_with(&d.path, "cli", both);
    srv.doorbells().expect("DOORBELLS");
    cli.doorbells().expect("DOORBELLS");
    assert_ne!(
        home_of(&d, srv.id),
        home_of(&d, cli.id),
        "the guests share a worker"
    );
    // Listeners spread by their local address: one served by the server's home and
    // one by the other worker (the pairing then goes through the listener's owner).
    let shome = home_of(&d, srv.id);
    let (mut at_home, mut away) = (None, None);
    while at_home.is_none() || away.is_none() {
        let (l, port) = listen(&mut srv);
        let slot = if srv.entry(l).owner.load(Ordering::Acquire) == shome {
            &mut at_home
        } else {
            &mut away
        };
        if slot.is_none() {
            *slot = Some((l, port));
        }
    }
    let (l, port) = away.unwrap();
    let (c, a) = connect(&mut cli, &srv, l, port);
    // Short-circuited entries are served by their guest's home (owner word).
    assert_eq!(
        cli.entry(c).owner.load(Ordering::Acquire),
        home_of(&d, cli.id)
    );
    assert_eq!(
        srv.entry(a).owner.load(Ordering::Acquire),
        home_of(&d, srv.id)
    );

    // The server sleeps on its connection; the client sends, raises its own
    // attention bit (its peer sleeps) and kicks its home: the client's worker relays
    // the wake-up to the server's worker, which writes the server's eventfd.
    let (cm, am) = (map_segment(&cli, c), map_segment(&srv, a));
    let (ce, ae) = (End::new(&cm, &cli, c), End::new(&am, &srv, a));
    let mut buf = vec![0u8; 64];
    let woke = srv.sleep_on_events(Some(a), 10_000, || {
        assert_eq!(ce.send(b"wake up"), 7);
        cli.attention(c);
        false
    });
    assert!(woke, "the sleeping server was never woken across workers");
    assert_eq!(ae.recv(&mut buf), 7);
    // And the other way round.
    let woke = cli.sleep_on_events(Some(c), 10_000, || {
        assert_eq!(ae.send(b"back"), 4);
        srv.attention(a);
        false
    });
    assert!(woke, "the sleeping client was never woken across workers");
    assert_eq!(ce.recv(&mut buf), 4);
    drop((cm, am));
    assert_eq!(cli.request(op::CLOSE, c, [0; 4], &[]).0, 0);
    srv.wait_flags(a, sock_flag::RX_EOF);
    assert_eq!(srv.request(op::CLOSE, a, [0; 4], &[]).0, 0);
    lifecycle(&d, srv, cli, at_home.unwrap());
}

/// Connection to listener `l` (handle, port), data both ways, half-close, reset, then
/// a guest's death.
fn lifecycle(d: &TestDaemon, mut srv: TestGuest, mut cli: TestGuest, (l, port): (u32, u16)) {
    let (c, a) = connect(&mut cli, &srv, l, port);

    // Both entries name the same segment, from opposite sides.
    let id = cli.entry(c).segment.load(Ordering::Relaxed);
    assert_eq!(id, srv.entry(a).segment.load(Ordering::Relaxed));
    assert_eq!(
        cli.entry(c).segment_side.load(Ordering::Relaxed),
        side::CONNECTOR
    );
    assert_eq!(
        srv.entry(a).segment_side.load(Ordering::Relaxed),
        side::ACCEPTOR
    );
    let stat = d.stat();
    assert_eq!(stat.matches("tcp-shortcut").count(), 2, "{stat}");
    let other = guest(d, "other");
    // Names agree across the ends.
    let name =
        |g: &mut TestGuest, h, o| CanalAddr::decode(&g.request(o, h, [0; 4], &[]).1).unwrap();
    assert_eq!(
        name(&mut cli, c, op::GETPEERNAME),
        name(&mut srv, a, op::GETSOCKNAME)
    );
    assert_eq!(
        name(&mut srv, a, op::GETPEERNAME),
        name(&mut cli, c, op::GETSOCKNAME)
    );
    assert_eq!(name(&mut cli, c, op::GETPEERNAME).port, port);

    // A guest outside the connection cannot have its segment.
    send_ctl(&other.ctl, kind::SEGMENT, &id.to_le_bytes(), &[]);
    let (k, body, fds) = recv_ctl(&other.ctl);
    assert_eq!(k, kind::ERROR);
    assert_eq!(
        i32::from_le_bytes(body[..4].try_into().unwrap()),
        errno::ENOENT
    );
    assert!(fds.is_empty());

    // 4 MiB each way through 1 MiB rings, interleaved (back-pressure), in order.
    let (cm, am) = (map_segment(&cli, c), map_segment(&srv, a));
    let (ce2, ae2) = (End::new(&cm, &cli, c), End::new(&am, &srv, a));
    let up = pattern(1, 4 << 20);
    let down = pattern(2, 4 << 20);
    let (mut us, mut ds) = (0, 0);
    let (mut ur, mut dr) = (Vec::new(), Vec::new());
    let mut buf = vec![0u8; 100_000];
    let deadline = Instant::now() + T;
    while ur.len() < up.len() || dr.len() < down.len() {
        assert!(Instant::now() < deadline, "transfer timed out");
        us += ce2.send(&up[us..(us + 70_000).min(up.len())]);
        ds += ae2.send(&down[ds..(ds + 50_000).min(down.len())]);
        let n = ae2.recv(&mut buf);
        ur.extend_from_slice(&buf[..n]);
        let n = ce2.recv(&mut buf);
        dr.extend_from_slice(&buf[..n]);
    }
    assert!(ur == up && dr == down, "bytes differ");
    // No kernel TCP moved them: canald saw no tx/rx on host sockets, but STAT reports
    // the segment's counts.
    let stat = d.stat();
    assert!(
        stat.contains(&format!("\"tx_bytes\":{}", 4 << 20)),
        "{stat}"
    );

    // Half-close: the client's SHUT_WR is the server's EOF; the server still sends.
    assert_eq!(
        cli.request(op::SHUTDOWN, c, [libc::SHUT_WR as u64, 0, 0, 0], &[])
            .0,
        0
    );
    srv.wait_flags(a, sock_flag::RX_EOF);
    assert_eq!(srv.flags(a) & (sock_flag::TX_CLOSED | sock_flag::ERROR), 0);
    assert_eq!(ae2.send(b"after"), 5);
    wait("bytes after half-close", || ce2.recv(&mut buf) == 5);

    // Reset: the client closes with bytes it never read. The server had its FIN (it
    // is in CLOSE_WAIT), so the error is EPIPE, as the kernel's tcp_reset reports.
    assert_eq!(ae2.send(b"unread"), 6);
    assert_eq!(cli.request(op::CLOSE, c, [0; 4], &[]).0, 0);
    let fl = srv.wait_flags(a, sock_flag::ERROR);
    assert_eq!(
        fl & (sock_flag::RX_EOF | sock_flag::TX_CLOSED),
        sock_flag::RX_EOF | sock_flag::TX_CLOSED
    );
    assert_eq!(
        srv.entry(a).pending_error.load(Ordering::Acquire),
        errno::EPIPE as u32
    );
    drop(cm);
    drop(am);

    // A guest that dies with nothing unread: its peer sees EOF (FIN), not a reset.
    let (c2, a2) = connect(&mut cli, &srv, l, port);
    let m2 = map_segment(&cli, c2);
    let e2 = End::new(&m2, &cli, c2);
    assert_eq!(e2.send(b"read me"), 7);
    let sm = map_segment(&srv, a2);
    wait("the server to read", || {
        let se = End::new(&sm, &srv, a2);
        se.recv(&mut buf) == 7
    });
    drop(sm);
    drop(srv);
    let fl = cli.wait_flags(c2, sock_flag::RX_EOF);
    wait("TX_CLOSED", || cli.flags(c2) & sock_flag::TX_CLOSED != 0);
    assert_eq!(fl & sock_flag::ERROR, 0, "a clean death is a FIN");
    assert_eq!(cli.entry(c2).pending_error.load(Ordering::Acquire), 0);
}

#[test]
fn no_shortcut_without_the_flag() {
    // A guest that did not announce SHORTCUT (an older libcanal) gets kernel TCP.
    let d = TestDaemon::start(&[]);
    let mut srv = guest(&d, "srv");
    let mut cli = TestGuest::attach(&d.path, "old");
    assert_eq!(
        cli.region.header().features & canal_abi::feature::SHORTCUT,
        0
    );
    let (l, port) = listen(&mut srv);
    let h = cli.socket(libc::AF_INET as u64, libc::SOCK_STREAM as u64);
    cli.connect(h, &localhost(port));
    cli.wait_flags(h, sock_flag::CONNECTED);
    let (k, _, _) = srv.wait_record(l);
    assert_eq!(k, record_kind::ACCEPT);
    assert_eq!(cli.entry(h).segment.load(Ordering::Relaxed), 0);
    assert!(!d.stat().contains("tcp-shortcut"));
    // And --no-shortcut turns it off for everyone.
    let d2 = TestDaemon::start(&["--no-shortcut"]);
    let mut s2 = guest(&d2, "srv");
    let mut c2 = guest(&d2, "cli");
    let (l2, port2) = listen(&mut s2);
    let h2 = c2.socket(libc::AF_INET as u64, libc::SOCK_STREAM as u64);
    c2.connect(h2, &localhost(port2));
    c2.wait_flags(h2, sock_flag::CONNECTED);
    s2.wait_record(l2);
    assert_eq!(c2.entry(h2).segment.load(Ordering::Relaxed), 0);
    assert!(!d2.stat().contains("tcp-shortcut"));
}

/// Asks for arena `id` (ARENA / ARENA_OK): Ok(mapping) or Err(errno).
fn map_arena(g: &TestGuest, id: u32) -> Result<Mapping, i32> {
    let (k, body, mut fds) = ctl_call(&g.ctl, kind::ARENA, &id.to_le_bytes(), &[])?;
    assert_eq!(k, kind::ARENA_OK, "{body:?}");
    assert_eq!(u32::from_le_bytes(body[..4].try_into().unwrap()), id);
    let size = u64::from_le_bytes(body[8..16].try_into().unwrap());
    Ok(Mapping::map(&fds.pop().expect("memfd"), size as usize).unwrap())
}

/// (arena, offset) an entry names.
fn place(g: &TestGuest, h: u32) -> (u32, u64) {
    let e = g.entry(h);
    (
        e.arena.load(Ordering::Acquire),
        e.arena_offset.load(Ordering::Acquire),
    )
}

/// Guests that announced ARENAS get their connections' segments as slots of one
/// arena of theirs (protocol §8.7): both map it once, a third guest cannot, SEGMENT
/// does not hand out a slot, and a slot both ends closed comes back empty (its
/// pages punched) for the pair's next connection.
#[test]
fn shortcut_segments_in_pair_arenas() {
    let flags = hello_flag::SHORTCUT | hello_flag::ARENAS;
    segments_in_pair_arenas(flags, ArenaLayout::Paged);
    segments_in_pair_arenas(flags | hello_flag::PACKED_ARENAS, ArenaLayout::Packed);
}

/// A guest of each kind: an arena packed only if both know packed arenas.
#[test]
fn arenas_are_packed_only_between_guests_that_know_them() {
    let d = TestDaemon::start(&[]);
    let flags = hello_flag::SHORTCUT | hello_flag::ARENAS;
    let mut srv = TestGuest::attach_with(&d.path, "srv", flags | hello_flag::PACKED_ARENAS);
    let mut cli = TestGuest::attach_with(&d.path, "cli", flags);
    let (l, port) = listen(&mut srv);
    let (c, _) = connect(&mut cli, &srv, l, port);
    let m = map_arena(&cli, place(&cli, c).0).unwrap();
    assert_eq!(
        ArenaLayout::of_len(m.len() as u64).map(|x| x.0),
        Some(ArenaLayout::Paged)
    );
}

fn segments_in_pair_arenas(flags: u32, layout: ArenaLayout) {
    let d = TestDaemon::start(&[]);
    let mut srv = TestGuest::attach_with(&d.path, "srv", flags);
    let mut cli = TestGuest::attach_with(&d.path, "cli", flags);
    let other = TestGuest::attach_with(&d.path, "other", flags);
    let (l, port) = listen(&mut srv);
    let conns: Vec<(u32, u32)> = (0..3).map(|_| connect(&mut cli, &srv, l, port)).collect();
    let (arena, _) = place(&cli, conns[0].0);
    assert_ne!(arena, 0, "no arena for two guests with ARENAS");
    let mut offsets = Vec::new();
    for &(c, a) in &conns {
        assert_eq!(place(&cli, c), place(&srv, a), "the two ends disagree");
        assert_eq!(place(&cli, c).0, arena, "one arena per guest pair");
        offsets.push(place(&cli, c).1);
    }
    offsets.sort();
    offsets.dedup();
    assert_eq!(offsets.len(), 3, "each connection has a slot of its own");

    let id = cli.entry(conns[0].0).segment.load(Ordering::Acquire);
    send_ctl(&cli.ctl, kind::SEGMENT, &id.to_le_bytes(), &[]);
    let (k, _, fds) = recv_ctl(&cli.ctl);
    assert!(
        k == kind::ERROR && fds.is_empty(),
        "SEGMENT handed out an arena slot"
    );
    assert_eq!(map_arena(&other, arena).err(), Some(errno::ENOENT));
    let (cm, am) = (
        map_arena(&cli, arena).unwrap(),
        map_arena(&srv, arena).unwrap(),
    );
    assert_eq!(
        ArenaLayout::of_len(am.len() as u64).map(|x| x.0),
        Some(layout)
    );

    // Bytes cross through the two guests' own mappings of the arena.
    let (c0, a0) = conns[0];
    let off = place(&cli, c0).1;
    let (ce, ae) = (End::at(&cm, off, &cli, c0), End::at(&am, off, &srv, a0));
    assert_eq!(ce.send(b"left in the ring"), 16);
    // The connector's tx ring, where its entry says (counted from the header).
    let ring = off + cli.entry(c0).tx_offset.load(Ordering::Acquire);
    assert_eq!(read_at(&am, ring, 16), b"left in the ring");
    let mut buf = [0u8; 4];
    assert_eq!(ae.recv(&mut buf), 4);
    assert_eq!(&buf, b"left");

    // Both ends close (the server with 12 bytes unread: a reset for nobody, the
    // client is gone): the slot comes back with a clean header for the pair's next
    // connection (a warm slot keeps its ring pages, §8.7: their stale bytes are the
    // same two guests' and count only between indices, which start at zero).
    assert_eq!(cli.request(op::CLOSE, c0, [0; 4], &[]).0, 0);
    srv.wait_flags(a0, sock_flag::RX_EOF);
    assert_eq!(srv.request(op::CLOSE, a0, [0; 4], &[]).0, 0);
    let mut reused = None;
    for _ in 0..50 {
        let (c, a) = connect(&mut cli, &srv, l, port);
        if place(&cli, c) == (arena, off) {
            reused = Some((c, a));
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let (c, a) = reused.expect("the freed slot was never reused");
    for dir in [side::CONNECTOR, side::ACCEPTOR] {
        for at in [
            canal_abi::segment::head_offset(dir),
            canal_abi::segment::tail_offset(dir),
        ] {
            assert_eq!(read_at(&am, off + at, 8), [0u8; 8], "index {at} reused");
        }
    }
    let (ce, ae) = (End::at(&cm, off, &cli, c), End::at(&am, off, &srv, a));
    assert_eq!(ae.send(b"fresh"), 5);
    let mut buf = [0u8; 8];
    assert_eq!(ce.recv(&mut buf), 5);
    assert_eq!(&buf[..5], b"fresh");
}

/// `--arenas off`: the same guests get a segment file per connection.
#[test]
fn arenas_off_gives_a_file_per_connection() {
    let d = TestDaemon::start(&["--arenas", "off"]);
    let flags = hello_flag::SHORTCUT | hello_flag::ARENAS;
    let mut srv = TestGuest::attach_with(&d.path, "srv", flags);
    let mut cli = TestGuest::attach_with(&d.path, "cli", flags);
    let (l, port) = listen(&mut srv);
    let (c, _) = connect(&mut cli, &srv, l, port);
    assert_eq!(place(&cli, c).0, 0);
    map_segment(&cli, c);
}

fn read_at(m: &Mapping, off: u64, n: usize) -> Vec<u8> {
    m.read_bytes(off as usize, n)
}

/// BELL_SET / BELL_GET with `fd` (or none): Ok(the fds of BELL_OK) or Err(errno).
fn bell(
    g: &TestGuest,
    k: u16,
    arena: u32,
    tag: u32,
    fd: &[i32],
) -> Result<Vec<std::os::fd::OwnedFd>, i32> {
    let body = canal_abi::control::Bell { arena, tag }.encode();
    let (rk, rb, fds) = ctl_call(&g.ctl, k, &body, fd)?;
    assert_eq!((rk, &rb[..]), (kind::BELL_OK, &body[..]));
    Ok(fds)
}

/// Bells (protocol §8.8): a guest's thread registers an eventfd for the guest at the
/// other side of an arena; only that guest gets it (the same file: what it writes, the
/// owner reads), never a third guest, never the owner asking as if it were the peer;
/// only an eventfd is taken; a new holder of the slot (PORT) drops the old bells.
#[test]
fn bells_go_only_to_the_peer_they_were_registered_for() {
    use canal_abi::segment::bell::tag;
    use std::os::fd::AsRawFd;
    let d = TestDaemon::start(&[]);
    let flags = hello_flag::SHORTCUT | hello_flag::ARENAS | hello_flag::BELLS;
    let mut srv = TestGuest::attach_with(&d.path, "srv", flags);
    let mut cli = TestGuest::attach_with(&d.path, "cli", flags);
    let other = TestGuest::attach_with(&d.path, "other", flags);
    assert_ne!(srv.region.header().features & canal_abi::feature::BELLS, 0);
    let (l, port) = listen(&mut srv);
    let (c, _) = connect(&mut cli, &srv, l, port);
    let (arena, _) = place(&cli, c);
    let efd = canald::sys::eventfd().unwrap();
    let t = tag(1, 7);
    assert_eq!(
        bell(&srv, kind::BELL_SET, arena, t, &[efd.as_raw_fd()]).map(|f| f.len()),
        Ok(0)
    );
    assert_eq!(
        bell(&other, kind::BELL_GET, arena, t, &[]).err(),
        Some(errno::ENOENT)
    );
    assert_eq!(
        bell(&other, kind::BELL_SET, arena, t, &[efd.as_raw_fd()]).err(),
        Some(errno::ENOENT)
    );
    assert_eq!(
        bell(&srv, kind::BELL_GET, arena, t, &[]).err(),
        Some(errno::ENOENT),
        "the owner"
    );
    assert_eq!(
        bell(&cli, kind::BELL_GET, arena, tag(1, 8), &[]).err(),
        Some(errno::ENOENT)
    );
    assert_eq!(
        bell(&cli, kind::BELL_GET, arena, 0, &[]).err(),
        Some(errno::EINVAL)
    );
    let got = bell(&cli, kind::BELL_GET, arena, t, &[]).unwrap();
    assert_eq!(got.len(), 1);
    canald::sys::eventfd_write(got[0].as_raw_fd()).unwrap();
    assert_eq!(
        canald::sys::eventfd_read(&efd).unwrap(),
        1,
        "not the owner's eventfd"
    );
    // A Unix socket is not a bell (a peer must never block or send writing one).
    let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
    assert_eq!(
        bell(&srv, kind::BELL_SET, arena, tag(2, 1), &[a.as_raw_fd()]).err(),
        Some(errno::EINVAL)
    );
    // Slot 1 gets a new holder: its old bells go.
    let port_fd = canald::sys::eventfd().unwrap();
    send_ctl(
        &srv.ctl,
        kind::PORT,
        &1u32.to_le_bytes(),
        &[port_fd.as_raw_fd()],
    );
    assert_eq!(recv_ctl(&srv.ctl).0, kind::PORT_OK);
    assert_eq!(
        bell(&cli, kind::BELL_GET, arena, t, &[]).err(),
        Some(errno::ENOENT)
    );
}
