//! `canal`: the front door. `run`, `stat` and `daemon` sit on canald's library;
//! `bench` and `vm` hand their arguments to their own crates.

mod elfcheck;
mod run;

use std::process::ExitCode;

fn usage() -> &'static str {
    "usage: canal <command> [args]\n\
     commands:\n  \
       run [--socket PATH] -- PROG ARGS...   run PROG under canal (starts a private canald if none answers)\n  \
       stat [--socket PATH] [--json]         list guests and their sockets\n  \
       daemon [--socket PATH] ...            run canald in the foreground (canal daemon --help)\n  \
       bench ...                             benchmark harness (canal bench --help)\n  \
       vm ...                                QEMU guests over canal (canal vm --help)"
}

fn stat(args: Vec<String>) -> i32 {
    let mut socket = None;
    let mut json = false;
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--json" => json = true,
            "--socket" => match it.next() {
                Some(p) => socket = Some(std::path::PathBuf::from(p)),
                None => {
                    eprintln!("canal stat: --socket needs a path");
                    return 2;
                }
            },
            "-h" | "--help" => {
                println!("usage: canal stat [--socket PATH] [--json]");
                return 0;
            }
            other => {
                eprintln!("canal stat: unknown argument '{other}'");
                return 2;
            }
        }
    }
    let path = socket.unwrap_or_else(canald::default_socket_path);
    match canald::fetch_stat(&path, !json) {
        Ok(text) => {
            print!("{text}");
            if !text.ends_with('\n') {
                println!();
            }
            0
        }
        Err(e) => {
            eprintln!("canal stat: no canald answers on {}: {e}", path.display());
            1
        }
    }
}

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    if args.is_empty() {
        eprintln!("{}", usage());
        return ExitCode::from(2);
    }
    let cmd = args.remove(0);
    let code = match cmd.as_str() {
        "run" => run::run(args),
        "stat" => stat(args),
        "daemon" => canald::cli_main(args),
        // B11 boots a VM: it lives with the VM harness (canal-vm's bench.rs).
        "bench" if matches!(args.first().map(String::as_str), Some("b11" | "B11")) => {
            let _ = canal_vm::ENSURE_DAEMON.set(run::ensure_daemon);
            canal_vm::bench::cli_main(&args[1..])
        }
        "bench" => canal_bench::cli_main(args),
        "vm" => {
            let _ = canal_vm::ENSURE_DAEMON.set(run::ensure_daemon);
            canal_vm::cli_main(args)
        }
        "-h" | "--help" | "help" => {
            println!("{}", usage());
            0
        }
        other => {
            eprintln!("canal: unknown command '{other}'\n{}", usage());
            2
        }
    };
    ExitCode::from(code.clamp(0, 255) as u8)
}
