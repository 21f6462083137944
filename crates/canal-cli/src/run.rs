//! `canal run`: make sure a canald answers (start a private one if not), then exec the
//! program with the guest library preloaded.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// `canal run`. If no canald answers on the control socket, a private one is started;
/// it exits by itself a few seconds after its last guest. canal run execs PROGRAM (same
/// pid): the exit status is PROGRAM's, and a signal that kills PROGRAM kills canal run
/// the same way (a shell shows 128+N).
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// Control socket [default: $CANAL_SOCKET; else a daemon of yours at
    /// $XDG_RUNTIME_DIR/canal/canald.sock or /tmp/canal-$UID/canald.sock; else the
    /// host-wide service /run/canal/canald.sock if it runs as you; else the per-user
    /// path, where canal run starts a private daemon]
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// Run PROGRAM in a network namespace of its own (and a user namespace when not
    /// root) with only loopback: canald serves its sockets through a private address
    /// view (its own 127.0.0.1; the host is 10.0.2.2, the resolver 10.0.2.3).
    /// canal run then stays as PROGRAM's parent (docs/isolation.md)
    #[arg(long)]
    isolate: bool,
    /// With --isolate: make the guest's port GUEST_PORT reachable on the host's
    /// HOST_IP:HOST_PORT (HOST_IP defaults to 127.0.0.1; TCP unless /udp)
    #[arg(
        long,
        requires = "isolate",
        value_name = "[HOST_IP:]HOST_PORT:GUEST_PORT[/udp]",
        value_parser = canald::network::parse_publish
    )]
    publish: Vec<canald::guest::netview::Publish>,
    /// With --isolate: do not serve programs LD_PRELOAD cannot reach (static, Go)
    /// through seccomp user notification; they then have only the namespace's loopback
    #[arg(long, requires = "isolate")]
    no_seccomp: bool,
    /// With --isolate: the network's name in `canal stat` [default: run-PID]
    #[arg(long, requires = "isolate", value_name = "NAME", value_parser = parse_name)]
    name: Option<String>,
    /// The program and its arguments (after -- if they start with -)
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "PROGRAM"
    )]
    program: Vec<String>,
}

fn parse_name(s: &str) -> Result<String, String> {
    if canal_abi::control::valid_vm_name(s) {
        Ok(s.to_string())
    } else {
        Err(format!(
            "'{s}': 1-32 characters of A-Z a-z 0-9 _ . -, not starting with '.'"
        ))
    }
}

/// Where libcanal.so is: $CANAL_LIB, next to this binary (a cargo target dir), or
/// ../lib/canal/ (an installed layout).
fn find_library(exe: &Path) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("CANAL_LIB") {
        return Some(PathBuf::from(p));
    }
    let dir = exe.parent()?;
    [
        dir.join("libcanal.so"),
        dir.join("../lib/canal/libcanal.so"),
    ]
    .into_iter()
    .find(|p| p.is_file())
}

/// Runs `canal run`; returns the exit status if the program could not be started.
pub fn run(a: &RunArgs) -> i32 {
    let prog = &a.program;
    let path = canald::spawn::locate(a.socket.as_deref());
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("canal run: cannot find my own binary: {e}");
            return 1;
        }
    };
    let Some(lib) = find_library(&exe) else {
        eprintln!(
            "canal run: libcanal.so not found next to {} (set CANAL_LIB to its path)",
            exe.display()
        );
        return 1;
    };
    if let Err(e) = canald::spawn::ensure_daemon(&path) {
        eprintln!("canal run: {e}");
        return 1;
    }
    // Inside --isolate, seccomp service reaches what LD_PRELOAD cannot.
    if !a.isolate || a.no_seccomp {
        if let Some(w) = crate::elfcheck::warning(&prog[0]) {
            eprintln!("{w}");
        }
    }
    let preload = match std::env::var("LD_PRELOAD") {
        Ok(old) if !old.is_empty() => format!("{} {old}", lib.display()),
        _ => lib.display().to_string(),
    };
    let mut cmd = Command::new(&prog[0]);
    cmd.args(&prog[1..])
        .env("LD_PRELOAD", preload)
        .env("CANAL_SOCKET", &path);
    if a.isolate {
        if !a.no_seccomp {
            cmd.env("CANAL_SECCOMP", "1");
        }
        let iso = crate::isolate::Isolation {
            socket: &path,
            name: a
                .name
                .clone()
                .unwrap_or_else(|| format!("run-{}", std::process::id())),
            publish: a.publish.clone(),
            seccomp: !a.no_seccomp,
        };
        return crate::isolate::run(cmd, iso);
    }
    crate::stdfds::close_what_was_closed();
    let err = cmd.exec();
    eprintln!("canal run: cannot run '{}': {err}", prog[0]);
    if err.kind() == std::io::ErrorKind::NotFound {
        127
    } else {
        126
    }
}
