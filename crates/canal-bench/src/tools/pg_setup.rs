//! PostgreSQL's side of B10's pgbench cells (`tools::postgres`): finding the binaries,
//! the user to run them as, the database made once per run, and the command lines.
//!
//! PostgreSQL refuses to run as root. Run as root, the harness runs the server, pgbench
//! and a canald of their own as the `postgres` user (canal serves a guest only from a
//! daemon of its own uid). The database (scale 1) is made once per run, natively, in a
//! directory of its own beside the run's scratch directory (which is root's, 0700),
//! removed with the run.
use crate::procs::{run_to_end, status_text, wait_connectable, Proc};
use crate::status::Status;
use std::path::PathBuf;
use std::time::Duration;

/// What every PostgreSQL cell of a run shares: binaries, who runs them, the database.
pub(crate) struct PgSetup {
    bin: PathBuf,
    /// `setpriv` to the postgres user when the harness runs as root, else empty.
    pub(crate) as_user: Vec<String>,
    pub(crate) top: PathBuf,
    data: PathBuf,
}

/// The newest installed PostgreSQL's binary directory (Debian: /usr/lib/postgresql/N/bin).
fn bin_dir() -> Option<PathBuf> {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            ["postgres", "initdb", "pgbench", "pg_isready"]
                .iter()
                .all(|b| bin.join(b).is_file())
                .then_some((v, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, b)| b)
}

/// (uid, gid) of the `postgres` user.
fn postgres_user() -> Option<(u32, u32)> {
    let name = std::ffi::CString::new("postgres").ok()?;
    // SAFETY: getpwnam reads a NUL-terminated name and returns a pointer to static data
    // (or NULL), read at once; the harness calls it from one thread.
    let pw = unsafe { libc::getpwnam(name.as_ptr()) };
    if pw.is_null() {
        return None;
    }
    // SAFETY: pw is non-null and points at a passwd record, as above.
    Some(unsafe { ((*pw).pw_uid, (*pw).pw_gid) })
}

fn chown(p: &std::path::Path, ids: Option<(u32, u32)>) -> Result<(), String> {
    match ids {
        Some((u, g)) => std::os::unix::fs::chown(p, Some(u), Some(g))
            .map_err(|e| format!("chown {}: {e}", p.display())),
        None => Ok(()),
    }
}

/// pgbench's summary: transactions per second, after checking that no transaction
/// failed and that some were processed.
pub(crate) fn parse_pgbench(out: &str) -> Result<f64, String> {
    let after = |key: &str| {
        out.lines()
            .find_map(|l| l.split(key).nth(1))
            .and_then(|r| r.split_whitespace().next())
            .and_then(|v| v.parse::<f64>().ok())
    };
    match after("number of failed transactions:") {
        Some(0.0) => {}
        Some(n) => return Err(format!("pgbench: {n} failed transactions")),
        None => return Err("pgbench printed no count of failed transactions".into()),
    }
    if !after("number of transactions actually processed:").is_some_and(|n| n > 0.0) {
        return Err("pgbench processed no transaction".into());
    }
    after("tps =").ok_or_else(|| "pgbench printed no tps".into())
}

impl PgSetup {
    /// Binaries, user, an initialised scale-1 database (its server started natively for
    /// `pgbench -i`, then stopped).
    pub(crate) fn new(tmp: &std::path::Path, port: u16) -> Result<PgSetup, Status> {
        let name = tmp
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let top = tmp.with_file_name(format!("{name}-postgres"));
        let bin = bin_dir().ok_or_else(|| {
            Status::NotAvailable(
                "PostgreSQL (postgres, initdb, pgbench) is not installed \
                 (scripts/packages/bench.txt)"
                    .into(),
            )
        })?;
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        let ids = if root {
            Some(postgres_user().ok_or_else(|| {
                Status::NotAvailable(
                    "no `postgres` user to run PostgreSQL as (it refuses root)".into(),
                )
            })?)
        } else {
            None
        };
        let as_user = match ids {
            Some((u, g)) => vec![
                "setpriv".into(),
                format!("--reuid={u}"),
                format!("--regid={g}"),
                "--clear-groups".into(),
            ],
            None => vec![],
        };
        let data = top.join("data");
        let fail = |e: String| Status::Failed(e);
        let _ = std::fs::remove_dir_all(&top);
        std::fs::create_dir_all(top.join("sock"))
            .map_err(|e| fail(format!("{}: {e}", top.display())))?;
        std::fs::set_permissions(&top, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .map_err(|e| fail(format!("{}: {e}", top.display())))?;
        for d in [top.clone(), top.join("sock")] {
            chown(&d, ids).map_err(fail)?;
        }
        let s = PgSetup {
            bin,
            as_user,
            top,
            data,
        };
        let initdb = s.argv(
            "initdb",
            &[
                "-D",
                &s.data.to_string_lossy(),
                "-A",
                "trust",
                "-U",
                "postgres",
                "--no-sync",
            ],
        );
        run_to_end("initdb", &initdb, Duration::from_secs(120)).map_err(fail)?;
        let mut server = Proc::spawn("postgres", &s.server_argv(port), &[]).map_err(fail)?;
        let r = s
            .ready(&mut server, port)
            .and_then(|_| {
                let init = s.pgbench_argv(port, &["-i", "-s", "1", "-q"]);
                run_to_end("pgbench -i", &init, Duration::from_secs(120))
            })
            .map_err(fail);
        s.stop(&mut server);
        r.map(|_| s)
    }

    fn argv(&self, tool: &str, args: &[&str]) -> Vec<String> {
        let mut v = self.as_user.clone();
        v.push(self.bin.join(tool).to_string_lossy().into_owned());
        v.extend(args.iter().map(|a| a.to_string()));
        v
    }

    pub(crate) fn server_argv(&self, port: u16) -> Vec<String> {
        let sock = self.top.join("sock");
        self.argv(
            "postgres",
            &[
                "-D",
                &self.data.to_string_lossy(),
                "-p",
                &port.to_string(),
                "-k",
                &sock.to_string_lossy(),
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                "fsync=off",
                "-c",
                "max_connections=40",
            ],
        )
    }

    pub(crate) fn pgbench_argv(&self, port: u16, args: &[&str]) -> Vec<String> {
        let p = port.to_string();
        let mut a = vec!["-h", "127.0.0.1", "-p", &p, "-U", "postgres"];
        a.extend_from_slice(args);
        a.push("postgres");
        self.argv("pgbench", &a)
    }

    /// The server takes queries: its port accepts, then `pg_isready` says so (a
    /// postmaster accepts connections while it is still starting up and refuses them
    /// with "the database system is starting up").
    pub(crate) fn ready(&self, server: &mut Proc, port: u16) -> Result<(), String> {
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        if wait_connectable(Some(port), None, Duration::from_secs(30)) {
            let p = port.to_string();
            let probe = self.argv("pg_isready", &["-h", "127.0.0.1", "-p", &p, "-t", "1"]);
            while std::time::Instant::now() < deadline && server.try_wait().is_none() {
                if run_to_end("pg_isready", &probe, Duration::from_secs(5)).is_ok() {
                    return Ok(());
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Err(match server.try_wait() {
            Some(st) => format!("postgres exited ({}): {}", status_text(st), server.tail()),
            None => format!("postgres not accepting on port {port}: {}", server.tail()),
        })
    }

    /// A fast shutdown (SIGINT: the postmaster ends its backends and checkpoints), so
    /// the next cell starts without crash recovery; killed if it takes over 10 s.
    pub(crate) fn stop(&self, server: &mut Proc) {
        server.interrupt_and_wait(Duration::from_secs(10));
        server.kill();
    }

    /// `canal run` in front of a guest's program, keeping the user switch outermost.
    pub(crate) fn wrapped(&self, argv: Vec<String>, canal: Option<(&str, &str)>) -> Vec<String> {
        let Some((canal, socket)) = canal else {
            return argv;
        };
        let n = self.as_user.len();
        let mut v = argv[..n].to_vec();
        v.extend([canal, "run", "--socket", socket, "--"].map(String::from));
        v.extend_from_slice(&argv[n..]);
        v
    }
}

impl Drop for PgSetup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.top);
    }
}

#[cfg(test)]
mod tests {
    use super::parse_pgbench;

    #[test]
    fn parses_pgbench() {
        let out = "transaction type: <builtin: select only>\nscaling factor: 1\n\
                   number of clients: 8\nnumber of transactions actually processed: 150123\n\
                   number of failed transactions: 0 (0.000%)\nlatency average = 0.213 ms\n\
                   initial connection time = 12.345 ms\n\
                   tps = 37530.123456 (without initial connection time)\n";
        assert_eq!(parse_pgbench(out), Ok(37530.123456));
        assert!(
            parse_pgbench(&out.replace("failed transactions: 0", "failed transactions: 3"))
                .is_err()
        );
        assert!(parse_pgbench(&out.replace("processed: 150123", "processed: 0")).is_err());
        assert!(parse_pgbench("pgbench: error: connection refused\n").is_err());
    }
}
