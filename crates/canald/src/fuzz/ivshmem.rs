//! Fuzz entry point for the ivshmem server's client (a VM's QEMU connects to the
//! server canald runs for a doorbell VM, `ivshmem_server.rs`). The server sends its
//! setup messages on accept; whatever the client sends back — bytes, a hang-up —
//! must end that client's connection and nothing else: the input is what it sends,
//! split into writes (`len u8`, bytes).
#![forbid(unsafe_code)]

use crate::ivshmem_server::Server;
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;

/// Runs one input. Returns whether the server closed the client (always, unless the
/// input was empty and the client stayed silent).
pub fn fuzz_ivshmem_client(data: &[u8]) -> bool {
    let dir = std::env::temp_dir().join(format!("canal-fuzz-ivs-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&dir);
    let path = dir.join("s.sock");
    let _ = std::fs::remove_file(&path);
    let Ok(mut server) = Server::create(&path, 2).map(|c| c.server) else {
        return false;
    };
    let Ok(mut client) = UnixStream::connect(&path) else {
        return false;
    };
    let Ok(shm) = rustix::fs::memfd_create("canal-fuzz-ivs", rustix::fs::MemfdFlags::CLOEXEC)
    else {
        return false;
    };
    let uid = crate::sys::getuid();
    match server.accept(shm.as_fd(), uid) {
        Ok(Some(_)) => {}
        _ => return false,
    }
    // The setup messages arrived in full (8 bytes each).
    let _ = client.set_nonblocking(true);
    let mut got = Vec::new();
    let mut buf = [0u8; 256];
    while let Ok(n) = client.read(&mut buf) {
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    assert_eq!(got.len() % 8, 0, "a partial setup message");
    let mut closed = false;
    let mut rest = data;
    while let Some((&n, tail)) = rest.split_first() {
        let (chunk, tail) = tail.split_at((n as usize).min(tail.len()));
        rest = tail;
        if chunk.is_empty() {
            continue;
        }
        if client.write_all(chunk).is_err() {
            break;
        }
        closed |= server.client_event();
        if closed {
            assert!(server.client_fd().is_none(), "closed, yet still polled");
            break;
        }
    }
    if data.is_empty() {
        drop(client);
        closed = server.client_event();
    }
    closed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds() {
        assert!(fuzz_ivshmem_client(&[]), "a hang-up closes the client");
        assert!(fuzz_ivshmem_client(&[3, b'a', b'b', b'c']));
        assert!(fuzz_ivshmem_client(&[0xff; 600]));
    }
}
