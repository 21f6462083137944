//! canald's life as a process: one daemon per socket path, stale sockets, idle exit,
//! SIGTERM, idle CPU, guests that exit, and other users.

mod common;
use canal_abi::sync::Ordering;
use canal_abi::{op, CanalAddr};
use common::*;
use std::io::Read;
use std::net::TcpStream;
use std::time::{Duration, Instant};

#[test]
fn guest_exit_closes_everything_within_a_second() {
    let d = TestDaemon::start(&[]);
    let mut g = TestGuest::attach(&d.path, "leaver");
    let (h, mut peer) = connected_pair(&mut g);
    let (h2, mut peer2) = connected_pair(&mut g);
    g.send_all(h, b"last words");
    let l = g.socket(AF_INET, STREAM);
    assert_eq!(g.request(op::BIND, l, [0; 4], &localhost(0).encode()).0, 0);
    assert_eq!(g.request(op::LISTEN, l, [4, 0, 0, 0], &[]).0, 0);
    let (_, out) = g.request(op::GETSOCKNAME, l, [0; 4], &[]);
    let lport = CanalAddr::decode(&out).unwrap().port;
    let _ = h2;
    assert_eq!(d.stat().matches("\"handle\"").count(), 3);

    let t0 = Instant::now();
    drop(g); // closes the control connection (and unmaps)
    let mut gone = false;
    while t0.elapsed() < Duration::from_secs(1) {
        let s = d.stat();
        if s.ends_with("\"guests\":[],\"networks\":[]}") {
            gone = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(gone, "guest still listed after 1 s: {}", d.stat());
    // The native peers see the end of the connection; queued bytes were flushed.
    let mut rest = Vec::new();
    peer.read_to_end(&mut rest).unwrap();
    assert_eq!(rest, b"last words");
    let mut b = [0u8; 1];
    assert!(matches!(peer2.read(&mut b), Ok(0) | Err(_)));
    // The listener is closed on the host.
    assert!(TcpStream::connect(("127.0.0.1", lport)).is_err());
}

#[test]
fn second_daemon_on_same_path_exits_quietly() {
    let d = TestDaemon::start(&[]);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_canald"))
        .arg("--socket")
        .arg(&d.path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(out.stderr.is_empty());
    // The first still serves.
    assert!(d.stat().contains("\"guests\":[]"));
    // The socket's directory was created private.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(d.path.parent().unwrap())
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700);
}

#[test]
fn stale_socket_file_is_replaced_and_idle_exit_works() {
    let mut d = TestDaemon::start(&["--idle-exit", "1"]);
    // Kill it hard: the socket file stays behind, nothing answers.
    d.child.kill().unwrap();
    d.child.wait().unwrap();
    assert!(d.path.exists());
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_canald"))
        .arg("--socket")
        .arg(&d.path)
        .arg("--idle-exit")
        .arg("1")
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    loop {
        if canald::fetch_stat(&d.path, false).is_ok() {
            break;
        }
        assert!(t0.elapsed() < T, "replacement daemon did not answer");
        std::thread::sleep(Duration::from_millis(10));
    }
    // No guests: it exits by itself after ~1 s and removes its socket.
    let t0 = Instant::now();
    loop {
        if let Some(st) = c.try_wait().unwrap() {
            assert!(st.success());
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "idle exit did not happen"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!d.path.exists());

    // A path that is not a socket is never removed.
    std::fs::write(&d.path, b"precious").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_canald"))
        .arg("--socket")
        .arg(&d.path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(std::fs::read(&d.path).unwrap(), b"precious");
}

#[test]
fn sigterm_marks_regions_abandoned() {
    let d = TestDaemon::start(&[]);
    let g = TestGuest::attach(&d.path, "orphan");
    assert_eq!(g.region.header().host_state.load(Ordering::Relaxed), 1);
    let pid = d.child.id() as i32;
    // SAFETY-free: kill(1) through the shell keeps the test without unsafe.
    let st = std::process::Command::new("kill")
        .arg("-TERM")
        .arg(pid.to_string())
        .status()
        .unwrap();
    assert!(st.success());
    g.wait_until("host_state abandoned", || {
        g.region.header().host_state.load(Ordering::Relaxed) == 2
    });
    // The control socket reports EOF to the guest.
    assert!(wait_fd(&g.ctl, 5000));
}

#[test]
fn idle_canald_uses_no_cpu() {
    let d = TestDaemon::start(&[]);
    let mut g = TestGuest::attach(&d.path, "idle");
    let (_h, _peer) = connected_pair(&mut g);
    std::thread::sleep(Duration::from_millis(100));
    let before = cpu_ticks(d.child.id());
    std::thread::sleep(Duration::from_millis(1500));
    let used = cpu_ticks(d.child.id()) - before;
    // A spinning poller would burn ~150 ticks here; allow one or two for noise.
    assert!(used <= 2, "idle canald used {used} ticks in 1.5 s");
}

#[test]
fn racing_daemons_only_one_serves() {
    let n = std::process::id();
    let dir = std::env::temp_dir().join(format!("canald-race-{n}"));
    let _ = std::fs::remove_dir_all(&dir);
    let path = dir.join("canald.sock");
    let spawn = || {
        std::process::Command::new(env!("CARGO_BIN_EXE_canald"))
            .arg("--socket")
            .arg(&path)
            .arg("--idle-exit")
            .arg("2")
            .spawn()
            .unwrap()
    };
    let mut a = spawn();
    let mut b = spawn();
    // One of them exits 0 quickly (the other answers); the other serves.
    let t0 = Instant::now();
    let (mut loser, mut winner) = loop {
        if let Some(st) = a.try_wait().unwrap() {
            assert!(st.success());
            break (a, b);
        }
        if let Some(st) = b.try_wait().unwrap() {
            assert!(st.success());
            break (b, a);
        }
        assert!(t0.elapsed() < T, "neither daemon stepped back");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(loser.try_wait().unwrap().is_some());
    assert!(winner.try_wait().unwrap().is_none(), "the winner serves");
    assert!(canald::fetch_stat(&path, false).is_ok());
    let _ = winner.kill();
    let _ = winner.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn other_uid_is_refused() {
    // Needs root (to act as another user) plus setpriv and a system python3.
    let py = std::path::Path::new("/usr/bin/python3");
    if canald::sys::getuid() != 0
        || !py.exists()
        || !std::path::Path::new("/usr/bin/setpriv").exists()
    {
        eprintln!("skipped: needs root, /usr/bin/setpriv and /usr/bin/python3");
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let n = std::process::id();
    let dir = std::env::temp_dir().join(format!("canald-uid-{n}"));
    let _ = std::fs::remove_dir_all(&dir);
    // An open directory and socket, so only SO_PEERCRED stands in the way.
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = dir.join("canald.sock");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_canald"))
        .arg("--socket")
        .arg(&path)
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while canald::sys::seqpacket_connect(&path).is_err() {
        assert!(t0.elapsed() < T);
        std::thread::sleep(Duration::from_millis(10));
    }
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777)).unwrap();
    let script = r#"
import socket, struct, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.connect(sys.argv[1])
body = struct.pack('<II16s', 0, 0, b'intruder')
# canald refuses at accept time: its ERROR may already be queued and the
# connection closed before our HELLO goes out, so a failed send is expected.
try:
    s.send(struct.pack('<IHHII', 0x434c4e43, 1, 1, len(body), 0) + body)
except OSError:
    pass
m = s.recv(65536)
kind = struct.unpack('<H', m[6:8])[0]
err = struct.unpack('<i', m[16:20])[0] if kind == 7 else 0
print(kind, err)
"#;
    let out = std::process::Command::new("/usr/bin/setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(py)
        .arg("-c")
        .arg(script)
        .arg(&path)
        .output()
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        text.trim(),
        "7 13",
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
