//! PostgreSQL with pgbench (B10): a multi-process server (a postmaster forking a backend
//! per connection) and its benchmark client, 8 clients over TCP, the select-only
//! script and the default TPC-B-like one; transactions per second of each. What the
//! cells share (binaries, user, database) is `tools::pg_setup`.
use crate::model::Cell;
use crate::procs::Proc;
use crate::procs::{cmdline, run_to_end};
use crate::runner::{sv, Outcome, Runner, Status};
use crate::tools::pg_setup::{parse_pgbench, PgSetup};
use std::time::Duration;

const CLIENTS: &str = "8";

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
                Outcome::not_run(st)
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
            let up = own_daemon
                .as_mut()
                .is_some_and(|d| d.wait_for_path(&socket, Duration::from_secs(5)));
            if !up {
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
        let mut raw = cmdline(&[], &sargv) + " &";
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
            raw.push_str(&format!(" ; {}", cmdline(&[], &cargv)));
            let limit = Duration::from_secs(secs + 30 + self.knobs.canal_grace as u64);
            result = run_to_end("pgbench", &cargv, limit)
                .and_then(|p| parse_pgbench(&(p.stdout() + &p.stderr())))
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
