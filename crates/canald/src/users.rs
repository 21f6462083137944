//! Serving other users' programs from a host-wide canald (`serve-users = true`, root
//! only): each user's connections are handed, descriptor and all, to a canald of that
//! user's own — started on the first connection, running as the user, reading only the
//! system configuration — so every socket call is made with the user's credentials
//! (the kernel's port, `SO_REUSEPORT` and routing rules apply as natively) and the
//! user's quotas. The user's daemon exits after a while without guests and is started
//! again on the next connection. docs/operations.md, "Run as a service".
#![forbid(unsafe_code)]

use crate::sys;
use std::collections::HashMap;
use std::ffi::OsString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// How long a user's daemon stays without guests.
const USER_IDLE_EXIT_SECS: &str = "30";

/// A user, as /etc/passwd names it.
struct Account {
    gid: u32,
    home: String,
}

fn account(uid: u32) -> Option<Account> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.len() >= 7 && f[2].parse::<u32>().ok()? == uid).then(|| Account {
            gid: f[3].parse().unwrap_or(uid),
            home: f[5].to_string(),
        })
    })
}

struct UserDaemon {
    chan: OwnedFd,
    child: Child,
}

/// The per-user daemons of a host-wide canald.
pub(crate) struct UserDaemons {
    by_uid: HashMap<u32, UserDaemon>,
    /// How to start one: canald's binary and the options it passes on.
    exe: PathBuf,
    args: Vec<OsString>,
}

impl UserDaemons {
    /// `args`: options every user's daemon gets (the socket path it reports, the
    /// configuration file); the channel and idle exit are added here.
    pub(crate) fn new(args: Vec<OsString>) -> io::Result<UserDaemons> {
        Ok(UserDaemons {
            by_uid: HashMap::new(),
            exe: std::env::current_exe()?,
            args,
        })
    }

    /// Hands connection `conn` of a peer of `uid` to that user's daemon (started if
    /// none runs). Err: it could not be started or reached (the caller tells the peer).
    pub(crate) fn hand_over(&mut self, uid: u32, conn: &OwnedFd) -> io::Result<()> {
        self.reap();
        for _ in 0..2 {
            if !self.by_uid.contains_key(&uid) {
                let d = self.spawn(uid)?;
                self.by_uid.insert(uid, d);
            }
            let d = &self.by_uid[&uid];
            match sys::send_with_fds(&d.chan, b"C", &[conn.as_raw_fd()], true) {
                Ok(()) => return Ok(()),
                // It exited meanwhile (idle): start another.
                Err(e) if matches!(e.raw_os_error(), Some(libc::EPIPE | libc::ECONNRESET)) => {
                    if let Some(mut d) = self.by_uid.remove(&uid) {
                        let _ = d.child.wait();
                    }
                }
                Err(e) => return Err(e),
            }
        }
        Err(io::Error::other("the user's canald exited at once"))
    }

    /// Forgets daemons that exited (and collects their status).
    fn reap(&mut self) {
        self.by_uid.retain(|uid, d| match d.child.try_wait() {
            Ok(None) => true,
            Ok(Some(st)) => {
                log::info!(
                    "the canald of uid {uid} (pid {}) exited: {st}",
                    d.child.id()
                );
                false
            }
            Err(_) => false,
        });
    }

    fn spawn(&self, uid: u32) -> io::Result<UserDaemon> {
        let acct = account(uid).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("uid {uid} has no /etc/passwd entry"),
            )
        })?;
        let (ours, theirs) = sys::seqpacket_pair()?;
        let mut cmd = Command::new(&self.exe);
        cmd.arg("--user-channel")
            .arg("3")
            .arg("--idle-exit")
            .arg(USER_IDLE_EXIT_SECS)
            .args(&self.args)
            .env_clear()
            .env("HOME", &acct.home)
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .current_dir("/");
        {
            use std::os::unix::process::CommandExt;
            // std drops the supplementary groups when root sets a uid.
            cmd.uid(uid).gid(acct.gid);
        }
        sys::pass_as_fd3_on_exec(&mut cmd, theirs.as_raw_fd());
        let child = cmd.spawn()?;
        drop(theirs);
        log::info!("started the canald of uid {uid} (pid {})", child.id());
        Ok(UserDaemon { chan: ours, child })
    }
}

impl Drop for UserDaemons {
    fn drop(&mut self) {
        // Closing the channels lets each user's daemon finish its guests and leave.
        for (_, mut d) in self.by_uid.drain() {
            drop(d.chan);
            let _ = d.child.try_wait();
        }
    }
}
