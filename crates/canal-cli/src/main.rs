//! `canal`: the front door. `run`, `stat` and `daemon` are implemented here on top of
//! canald's library; `bench` and `vm` hand their arguments to their own crates.

use std::process::ExitCode;

fn usage() -> &'static str {
    "usage: canal <command> [args]\n\
     commands:\n  \
       run [--socket PATH] -- PROG ARGS...   run PROG under canal (starts a private canald if none answers)\n  \
       stat [--socket PATH] [--json]         list guests and their sockets\n  \
       daemon [--socket PATH] ...            run canald in the foreground\n  \
       bench ...                             benchmark harness (canal bench --help)\n  \
       vm ...                                QEMU guests over canal (canal vm --help)"
}

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    if args.is_empty() {
        eprintln!("{}", usage());
        return ExitCode::from(2);
    }
    let cmd = args.remove(0);
    let code = match cmd.as_str() {
        "bench" => canal_bench::cli_main(args),
        "vm" => canal_vm::cli_main(args),
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
