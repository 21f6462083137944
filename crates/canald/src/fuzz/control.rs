//! Fuzz entry point for the control socket: a client's messages, as canald handles
//! them (`Daemon::handle_message`), on a real daemon bound to a private socket. The
//! input is a sequence of messages, each `len u16 LE` then `len` bytes (header and
//! body as the client would send them); no descriptors travel (messages that need one
//! are refused as for a client that sent none). After each input the connection
//! closes and departed guests are reaped, so runs do not accumulate state.
//!
//! Properties: no panic, every reply is a well-formed control message, nothing is left
//! attached after the connection closes.
#![forbid(unsafe_code)]

use crate::config::Config;
use crate::daemon::{Bound, Conn, Daemon};
use crate::sys;
use std::cell::RefCell;

thread_local! {
    static DAEMON: RefCell<Option<Box<Daemon>>> = const { RefCell::new(None) };
}

fn daemon() -> Box<Daemon> {
    sweep_stale_dirs();
    let dir = std::env::temp_dir().join(format!("canal-fuzz-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let mut cfg = Config::new(dir.join("c.sock"));
    // Small guests: a HELLO costs little, so a run can make many.
    cfg.slots = 4;
    cfg.sockets = 8;
    cfg.data_mib = 1;
    cfg.shortcut = false;
    match Daemon::bind(cfg) {
        Ok(Bound::Serving(d)) => d,
        Ok(Bound::AlreadyRunning) => panic!("another daemon on the fuzz socket"),
        Err(e) => panic!("fuzz daemon: {e}"),
    }
}

/// Removes the socket directories of fuzz processes that have exited (a fuzzing
/// process never drops its daemon: it ends with the process).
fn sweep_stale_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("canal-fuzz-"))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// Splits `data` into length-prefixed messages (a short tail is one last message).
pub(crate) fn messages(mut data: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    while data.len() >= 2 && out.len() < 64 {
        let n = (u16::from_le_bytes([data[0], data[1]]) as usize).min(data.len() - 2);
        out.push(&data[2..2 + n]);
        data = &data[2 + n..];
    }
    if !data.is_empty() {
        out.push(data);
    }
    out
}

/// Runs one input. Returns the replies (message kinds) for seed tests. Panics only on
/// a canald bug.
pub fn fuzz_control(data: &[u8]) -> Vec<u16> {
    DAEMON.with(|cell| {
        let mut slot = cell.borrow_mut();
        let d = slot.get_or_insert_with(daemon);
        run(d, data)
    })
}

fn run(d: &mut Daemon, data: &[u8]) -> Vec<u16> {
    let Ok((ours, peer)) = sys::seqpacket_pair() else {
        return Vec::new();
    };
    let key = d.alloc_conn_key();
    d.conns.insert(
        key,
        Conn {
            fd: ours,
            pid: std::process::id(),
            uid: sys::getuid(),
            worker: None,
            refused: false,
            out: Default::default(),
            out_bytes: 0,
            netns: None,
        },
    );
    let mut kinds = Vec::new();
    let mut buf = vec![0u8; canal_abi::control::CTL_MAX];
    for m in messages(data) {
        let open = d.handle_message(key, m, Vec::new());
        // Read the replies as a client would (the pair is non-blocking).
        while let Ok(Some(r)) = sys::recv_with_fds(&peer, &mut buf) {
            if r.len == 0 {
                break;
            }
            let (k, _) = canal_abi::control::decode(&buf[..r.len])
                .expect("canald sent a malformed control message");
            kinds.push(k);
        }
        if !open {
            break;
        }
    }
    d.close_conn(key);
    for w in &d.workers {
        let mut sh = w.lock();
        crate::worker::reap(&mut sh, w);
    }
    assert!(
        !d.conns.contains_key(&key),
        "the connection outlived its close"
    );
    kinds
}

#[cfg(test)]
mod tests {
    use super::*;
    use canal_abi::control::{encode_header, kind};

    fn msg(k: u16, body: &[u8]) -> Vec<u8> {
        let mut m = encode_header(k, body.len() as u32).to_vec();
        m.extend_from_slice(body);
        let mut framed = (m.len() as u16).to_le_bytes().to_vec();
        framed.extend_from_slice(&m);
        framed
    }

    #[test]
    fn seeds() {
        // STAT answers with chunks; garbage with ERROR; an unknown kind with ERROR.
        let r = fuzz_control(&msg(kind::STAT, &2u32.to_le_bytes()));
        assert!(
            r.iter().all(|k| *k == kind::STAT_CHUNK) && r.len() >= 2,
            "{r:?}"
        );
        assert_eq!(fuzz_control(b"\x03\x00abc"), vec![kind::ERROR]);
        assert_eq!(fuzz_control(&msg(999, b"")), vec![kind::ERROR]);
        // A HELLO attaches (HELLO_OK) and the guest goes with the connection.
        let hello = canal_abi::control::Hello {
            pid: 0,
            flags: 0,
            comm: *b"fuzz\0\0\0\0\0\0\0\0\0\0\0\0",
        };
        let r = fuzz_control(&msg(kind::HELLO, &hello.encode()));
        assert_eq!(r, vec![kind::HELLO_OK], "{r:?}");
        // An attached guest gets its event log; a segment it does not have, none.
        let mut two = msg(kind::HELLO, &hello.encode());
        two.extend(msg(kind::EVLOG, &0u32.to_le_bytes()));
        two.extend(msg(kind::EVLOG, &7u32.to_le_bytes()));
        let r = fuzz_control(&two);
        assert_eq!(
            r,
            vec![kind::HELLO_OK, kind::EVLOG_OK, kind::ERROR],
            "{r:?}"
        );
        assert_eq!(fuzz_control(&msg(kind::EVLOG, &[])), vec![kind::ERROR]);
        // An arena it is not one of the two guests of, or a short ARENA: ERROR.
        let mut arena = msg(kind::HELLO, &hello.encode());
        arena.extend(msg(kind::ARENA, &1u32.to_le_bytes()));
        arena.extend(msg(kind::ARENA, &[1, 0]));
        let r = fuzz_control(&arena);
        assert_eq!(r, vec![kind::HELLO_OK, kind::ERROR, kind::ERROR], "{r:?}");
        // HOST_SOCKET: before HELLO, short, a handle of no socket: ERROR.
        assert_eq!(
            fuzz_control(&msg(kind::HOST_SOCKET, &1u32.to_le_bytes())),
            vec![kind::ERROR]
        );
        let mut host = msg(kind::HELLO, &hello.encode());
        host.extend(msg(kind::HOST_SOCKET, &[1, 0]));
        host.extend(msg(kind::HOST_SOCKET, &0x0001_0003u32.to_le_bytes()));
        let r = fuzz_control(&host);
        assert_eq!(r, vec![kind::HELLO_OK, kind::ERROR, kind::ERROR], "{r:?}");
        // Bells (§8.8): short, tag 0, an arena not its own, BELL_SET without an fd.
        let mut bells = msg(kind::HELLO, &hello.encode());
        bells.extend(msg(kind::BELL_GET, &[1, 0, 0, 0]));
        bells.extend(msg(kind::BELL_GET, &[0; 8]));
        bells.extend(msg(kind::BELL_GET, &[1, 0, 0, 0, 1, 16, 0, 0]));
        bells.extend(msg(kind::BELL_SET, &[1, 0, 0, 0, 1, 16, 0, 0]));
        let r = fuzz_control(&bells);
        assert_eq!(
            r,
            [&[kind::HELLO_OK][..], &[kind::ERROR; 4]].concat(),
            "{r:?}"
        );
        // Messages that need a descriptor are refused without one (WATCH has no
        // reply: a watch without a descriptor is dropped).
        assert!(fuzz_control(&msg(kind::WATCH, &[0; 16])).is_empty());
        for k in [kind::PORT, kind::SECCOMP, kind::VM_PID] {
            assert_eq!(
                fuzz_control(&msg(k, &[0; 16])),
                vec![kind::ERROR],
                "kind {k}"
            );
        }
        assert!(messages(&[5, 0, 1, 2]).len() == 1);
    }
}
