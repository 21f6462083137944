//! PostgreSQL with pgbench (B10): a multi-process server (a postmaster forking a backend
//! per connection) and its benchmark client, 8 clients over TCP, the select-only
//! script and the default TPC-B-like one; transactions per second of each.
//!
//! PostgreSQL refuses to run as root. Run as root, the harness runs the server, pgbench
//! and a canald of their own as the `postgres` user (canal serves a guest only from a
//! daemon of its own uid): the runner's canald is stopped for the cell. The database
//! (scale 1) is made once per run, natively, in a directory of its own beside the run's
//! scratch directory (which is root's, 0700), removed with the run.
use crate::model::Cell;
use crate::procs::{status_text, wait_connectable, Proc};
use crate::runner::{sv, Outcome, Runner, Status};
use std::path::PathBuf;
use std::time::Duration;

const CLIENTS: &str = "8";

/// What every PostgreSQL cell of a run shares: binaries, who runs them, the database.
pub(crate) struct PgSetup {
    bin: PathBuf,
    /// `setpriv` to the postgres user when the harness runs as root, else empty.
    as_user: Vec<String>,
    top: PathBuf,
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
            ["postgres", "initdb", "pgbench"]
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

/// Runs `argv` to the end (at most `secs`); its stdout, or why it failed.
fn run_to_end(label: &str, argv: &[String], secs: u64) -> Result<String, String> {
    let mut p = Proc::spawn(label, argv, &[])?;
    let st = p.wait(Duration::from_secs(secs))?;
    if !st.success() {
        return Err(format!("{label} {}: {}", status_text(st), p.tail()));
    }
    Ok(p.stdout() + &p.stderr())
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
    fn new(tmp: &std::path::Path, port: u16) -> Result<PgSetup, Status> {
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
        run_to_end("initdb", &initdb, 120).map_err(fail)?;
        let mut server = Proc::spawn("postgres", &s.server_argv(port), &[]).map_err(fail)?;
        let r = s
            .ready(&mut server, port)
            .and_then(|_| {
                let init = s.pgbench_argv(port, &["-i", "-s", "1", "-q"]);
                run_to_end("pgbench -i", &init, 120)
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

    fn server_argv(&self, port: u16) -> Vec<String> {
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

    fn pgbench_argv(&self, port: u16, args: &[&str]) -> Vec<String> {
        let p = port.to_string();
        let mut a = vec!["-h", "127.0.0.1", "-p", &p, "-U", "postgres"];
        a.extend_from_slice(args);
        a.push("postgres");
        self.argv("pgbench", &a)
    }

    fn ready(&self, server: &mut Proc, port: u16) -> Result<(), String> {
        if wait_connectable(Some(port), None, Duration::from_secs(30)) {
            return Ok(());
        }
        Err(match server.try_wait() {
            Some(st) => format!("postgres exited ({}): {}", status_text(st), server.tail()),
            None => format!("postgres not accepting on port {port}: {}", server.tail()),
        })
    }

    /// A fast shutdown (SIGINT: the postmaster ends its backends and checkpoints), so
    /// the next cell starts without crash recovery; killed if it takes over 10 s.
    fn stop(&self, server: &mut Proc) {
        server.interrupt_and_wait(Duration::from_secs(10));
        server.kill();
    }

    /// `canal run` in front of a guest's program, keeping the user switch outermost.
    fn wrapped(&self, argv: Vec<String>, canal: Option<(&str, &str)>) -> Vec<String> {
        let Some((canal, socket)) = canal else {
            return argv;
        };
        let n = self.as_user.len();
        let mut v = argv[..n].to_vec();
        v.extend(sv(&[canal, "run", "--socket", socket, "--"]));
        v.extend_from_slice(&argv[n..]);
        v
    }
}

impl Drop for PgSetup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.top);
    }
}

impl Runner {
    pub(crate) fn run_postgres(&mut self, cell: &Cell) -> Outcome {
        let (port, init_port) = match (self.port(), self.port()) {
            (Ok(p), Ok(q)) => (p, q),
            (Err(e), _) | (_, Err(e)) => return Outcome::fail(e, String::new()),
        };
        let setup = match self.pg.take() {
            Some(Ok(s)) => Ok(s),
            Some(Err(st)) => Err(st),
            None => PgSetup::new(&self.tmp, init_port),
        };
        match setup {
            Ok(s) => {
                let out = self.postgres_cell(cell, &s, port);
                self.pg = Some(Ok(s));
                out
            }
            Err(st) => {
                self.pg = Some(Err(st.clone()));
                Outcome {
                    status: st,
                    metrics: vec![],
                    raw_command: String::new(),
                    detail: String::new(),
                }
            }
        }
    }

    fn postgres_cell(&mut self, cell: &Cell, setup: &PgSetup, port: u16) -> Outcome {
        let fail = |e: String, raw: String| Outcome::fail(e, raw);
        let canal = self.canal_s();
        // As root, the guests' canald runs as the postgres user (the runner's own is
        // stopped: one daemon on the two cores, as in every other cell).
        let mut own_daemon = None;
        let socket = if cell.system.uses_canal() && !setup.as_user.is_empty() {
            self.stop_daemon();
            let socket = setup.top.join("canald.sock");
            let _ = std::fs::remove_file(&socket);
            let mut argv = setup.as_user.clone();
            argv.extend(sv(&[
                &canal,
                "daemon",
                "--socket",
                &socket.to_string_lossy(),
            ]));
            match Proc::spawn("canal daemon (postgres)", &argv, &[]) {
                Ok(p) => own_daemon = Some(p),
                Err(e) => return fail(e, String::new()),
            }
            // (A SOCK_SEQPACKET socket: its appearance is the sign, as in `ensure_daemon`.)
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            while !socket.exists() && std::time::Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            if !socket.exists() {
                let tail = own_daemon.as_ref().map(Proc::tail).unwrap_or_default();
                return fail(
                    format!("the postgres user's canald did not start: {tail}"),
                    String::new(),
                );
            }
            socket.to_string_lossy().into_owned()
        } else {
            self.daemon
                .as_ref()
                .map(|d| d.socket.to_string_lossy().into_owned())
                .unwrap_or_default()
        };
        let via = |guest: bool| guest.then_some((canal.as_str(), socket.as_str()));
        let sargv = setup.wrapped(setup.server_argv(port), via(cell.system.server_is_guest()));
        let mut raw = procs_cmd(&sargv) + " &";
        let mut server = match Proc::spawn("postgres", &sargv, &[]) {
            Ok(p) => p,
            Err(e) => return fail(e, raw),
        };
        let secs = self.knobs.tool_secs.ceil() as u64;
        let mut metrics = vec![];
        let mut result = setup.ready(&mut server, port);
        for (metric, extra) in [("select_tps", vec!["-S"]), ("tpcb_tps", vec![])] {
            if result.is_err() {
                break;
            }
            let t = secs.to_string();
            let mut args = vec!["-c", CLIENTS, "-j", "2", "-T", &t];
            args.extend(extra);
            let cargv = setup.wrapped(
                setup.pgbench_argv(port, &args),
                via(cell.system.client_is_guest()),
            );
            raw.push_str(&format!(" ; {}", procs_cmd(&cargv)));
            result = run_to_end("pgbench", &cargv, secs + 30 + self.knobs.canal_grace as u64)
                .and_then(|out| parse_pgbench(&out))
                .map(|tps| metrics.push((metric.to_string(), tps)));
        }
        setup.stop(&mut server);
        drop(own_daemon);
        match result {
            Ok(()) => Outcome {
                status: Status::Ok,
                metrics,
                raw_command: raw,
                detail: String::new(),
            },
            Err(e) => fail(e, raw),
        }
    }
}

fn procs_cmd(argv: &[String]) -> String {
    crate::procs::cmdline(&[], argv)
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
