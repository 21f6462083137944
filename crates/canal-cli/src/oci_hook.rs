//! `canal oci-hook`: an OCI runtime hook (podman, docker, any runtime that runs
//! `createRuntime`/`prestart` hooks) that registers a container's network namespace with
//! canald — its name and published ports — before the container's program starts, so
//! the container's canal guests get that view (docs/isolation.md, "Containers").
//!
//! The runtime passes the container's state on stdin (`pid`, `id`, `annotations`).
//! Published ports come from the annotation `io.canal.publish` (comma-separated
//! `[HOST_IP:]HOST_PORT:GUEST_PORT[/udp]`). A hook must return before the container
//! starts, but a registration lasts as long as its connection: the hook leaves a small
//! holder process that keeps the connection until the container's first process exits
//! (or canald goes away). Any error fails the hook, so the runtime does not start a
//! container its user expected to be served.

use std::io::{self, Read};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

/// The annotation that lists published ports.
pub(crate) const PUBLISH_ANNOTATION: &str = "io.canal.publish";

#[derive(clap::Args, Debug)]
pub(crate) struct OciHookArgs {
    /// Control socket [default: $CANAL_SOCKET; else a daemon of yours at
    /// $XDG_RUNTIME_DIR/canal/canald.sock or /tmp/canal-$UID/canald.sock; else the
    /// host-wide service /run/canal/canald.sock if it runs as you; else the per-user
    /// path, where canal run starts a private daemon]
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
}

/// What the hook reads from the OCI state.
#[derive(Debug, PartialEq)]
pub(crate) struct Container {
    pub(crate) pid: u32,
    pub(crate) name: String,
    pub(crate) publish: Vec<canald::guest::netview::Publish>,
}

/// Parses the OCI state JSON (runtime-spec "State").
pub(crate) fn parse_state(text: &str) -> Result<Container, String> {
    let v: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| format!("the OCI state on stdin is not JSON: {e}"))?;
    let pid = v
        .get("pid")
        .and_then(|p| p.as_u64())
        .filter(|&p| p > 0 && p <= u32::MAX as u64)
        .ok_or("the OCI state has no container pid (is this a createRuntime or prestart hook?)")?
        as u32;
    let id = v.get("id").and_then(|i| i.as_str()).unwrap_or("");
    // A network name: `ctr-` and the id's first characters the name rules allow.
    let short: String = id
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
        .take(28)
        .collect();
    let name = if short.is_empty() {
        format!("ctr-{pid}")
    } else {
        format!("ctr-{short}")
    };
    let publish = match v
        .get("annotations")
        .and_then(|a| a.get(PUBLISH_ANNOTATION))
        .and_then(|p| p.as_str())
    {
        Some(list) => list
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(canald::network::parse_publish)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("{PUBLISH_ANNOTATION}: {e}"))?,
        None => Vec::new(),
    };
    Ok(Container { pid, name, publish })
}

pub(crate) fn run(a: &OciHookArgs) -> i32 {
    let socket = canald::spawn::locate(a.socket.as_deref());
    match hook(&socket) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("canal oci-hook: {e}");
            1
        }
    }
}

fn hook(socket: &Path) -> Result<(), String> {
    let mut text = String::new();
    io::stdin()
        .take(1 << 20)
        .read_to_string(&mut text)
        .map_err(|e| format!("reading the OCI state: {e}"))?;
    let c = parse_state(&text)?;
    // The pidfd first: the namespace read next is then known to be this process's.
    let pidfd =
        canald::sys::pidfd_open(c.pid).map_err(|e| format!("container pid {}: {e}", c.pid))?;
    let ns = std::fs::File::open(format!("/proc/{}/ns/net", c.pid))
        .map(OwnedFd::from)
        .map_err(|e| format!("container pid {}: its network namespace: {e}", c.pid))?;
    let h = canald::network::register_network(socket, &c.name, &c.publish, &ns).map_err(|e| {
        format!(
            "registering {} with canald at {}: {e}",
            c.name,
            socket.display()
        )
    })?;
    hold(h.conn, pidfd)
}

/// Leaves a holder process with the registration; returns in the hook.
fn hold(conn: OwnedFd, pidfd: OwnedFd) -> Result<(), String> {
    // SAFETY: canal is single-threaded here; the child only makes system calls.
    match unsafe { libc::fork() } {
        -1 => Err(format!("fork: {}", io::Error::last_os_error())),
        0 => {
            // Detached: the runtime may wait for the hook's output pipes to close.
            // SAFETY: setsid and dup2 onto our own standard descriptors.
            unsafe {
                libc::setsid();
                let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
                for fd in 0..3 {
                    libc::dup2(null, fd);
                }
            }
            wait_either(&conn, &pidfd);
            // SAFETY: ends the holder without the parent's atexit handlers.
            unsafe { libc::_exit(0) }
        }
        _ => Ok(()),
    }
}

/// Until the container's process exits (its pidfd turns readable) or canald hangs up.
fn wait_either(conn: &OwnedFd, pidfd: &OwnedFd) {
    let mut fds = [
        libc::pollfd {
            fd: pidfd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: conn.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    loop {
        // SAFETY: two valid pollfd entries.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if r > 0 || (r < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINTR)) {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oci_state() {
        let c = parse_state(
            r#"{"ociVersion":"1.0.2","id":"3f1c0ffee/x","status":"created","pid":4242,
                "bundle":"/b","annotations":{"io.canal.publish":"8080:80, 127.0.0.1:5353:53/udp"}}"#,
        )
        .unwrap();
        assert_eq!(c.pid, 4242);
        assert_eq!(c.name, "ctr-3f1c0ffeex");
        assert_eq!(c.publish.len(), 2);
        assert_eq!(parse_state(r#"{"pid":7}"#).unwrap().name, "ctr-7");
        assert!(parse_state(r#"{"id":"x"}"#)
            .unwrap_err()
            .contains("no container pid"));
        assert!(parse_state("nope").is_err());
        let e = parse_state(r#"{"pid":7,"annotations":{"io.canal.publish":"80"}}"#).unwrap_err();
        assert!(e.contains("io.canal.publish"), "{e}");
    }
}
