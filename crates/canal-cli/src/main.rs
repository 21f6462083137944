//! `canal`: the front door. `run`, `stat` and `daemon` sit on canald's library;
//! `bench` and `vm` take their options from their own crates.
//!
//! `main` is the C entry point (`no_main`): Rust's runtime would reopen closed standard
//! descriptors on /dev/null before a Rust `main`, and the program `canal run` execs must
//! find them as its caller left them (`prog >&-` fails natively at its first write).
#![cfg_attr(not(test), no_main)]

mod dnsfwd;
mod docgen;
mod elfcheck;
mod isolate;
mod oci_hook;
mod run;
mod stdfds;
mod top;

use clap::{Args, Subcommand};
use std::path::PathBuf;

/// canal: socket-level para-virtual networking for unmodified programs.
#[derive(clap::Parser, Debug)]
#[command(name = "canal", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    cmd: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run PROGRAM with its AF_INET/AF_INET6 TCP and UDP sockets served by canald
    Run(run::RunArgs),
    /// List guests and their sockets
    Stat(StatArgs),
    /// Guests and workers refreshed in the terminal, with rates (like top)
    Top(top::TopArgs),
    /// Run canald in the foreground
    Daemon(Box<canald::config::DaemonArgs>),
    /// Benchmark harness (docs/bench/README.md)
    #[command(
        after_help = "Exit status: 0 when every native baseline ran (canal cells may \
        fail; they are reported with their reason), 1 when a native baseline failed, 2 on \
        bad usage."
    )]
    Bench(BenchCmd),
    /// QEMU guests over canal (docs/vm.md)
    #[command(subcommand)]
    Vm(canal_vm::cli::VmCommand),
    /// OCI runtime hook (createRuntime/prestart): registers a container's network
    /// namespace and its io.canal.publish ports with canald (docs/isolation.md)
    #[command(name = "oci-hook")]
    OciHook(oci_hook::OciHookArgs),
    /// Print a shell completion script for canal and canald
    Completions(docgen::CompletionsArgs),
    /// Write the man pages (canal.1, canal-SUBCOMMAND.1, canald.8) into a directory
    Man(docgen::ManArgs),
}

#[derive(Args, Debug)]
struct StatArgs {
    /// Control socket [default: $CANAL_SOCKET; else a daemon of yours at
    /// $XDG_RUNTIME_DIR/canal/canald.sock or /tmp/canal-$UID/canald.sock; else the
    /// host-wide service /run/canal/canald.sock if it runs as you; else the per-user
    /// path, where canal run starts a private daemon]
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// JSON instead of a table
    #[arg(long, conflicts_with = "prometheus")]
    json: bool,
    /// The Prometheus text exposition format (what canald --metrics serves)
    #[arg(long)]
    prometheus: bool,
}

#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
struct BenchCmd {
    #[command(subcommand)]
    b11: Option<BenchSub>,
    #[command(flatten)]
    args: canal_bench::cli::BenchArgs,
}

#[derive(Subcommand, Debug)]
enum BenchSub {
    /// B11: one QEMU guest over canal and over virtio-net, beside the host baseline
    #[command(
        name = "b11",
        alias = "B11",
        after_help = "Needs qemu-system-x86_64, iperf3, and canal-bench-gen next to canal."
    )]
    B11(canal_vm::bench::B11Args),
    /// B14: isolated guests — canal run --isolate against pasta and slirp4netns
    #[command(
        name = "b14",
        alias = "B14",
        after_help = "Needs iperf3, and pasta (passt) and slirp4netns for their columns; as root the namespaced programs run as --user."
    )]
    B14(canal_bench::isolation::B14Args),
}

fn stat(a: &StatArgs) -> i32 {
    let path = canald::spawn::locate(a.socket.as_deref());
    let listing = if a.prometheus {
        canald::fetch_metrics(&path)
    } else {
        canald::fetch_stat(&path, !a.json)
    };
    match listing {
        Ok(mut text) => {
            if !text.ends_with('\n') {
                text.push('\n');
            }
            canald::output::print_or_fail("canal stat", &text)
        }
        Err(e) => {
            eprintln!("canal stat: no canald answers on {}: {e}", path.display());
            1
        }
    }
}

/// The process entry point: notes which standard descriptors are closed and holds
/// each with /dev/null meanwhile (so nothing canal opens lands on them), then runs.
#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn main(_argc: libc::c_int, _argv: *const *const libc::c_char) -> libc::c_int {
    stdfds::hold_closed();
    canal_main().clamp(0, 255)
}

fn canal_main() -> i32 {
    let cli = match canald::cli::parse_or_status::<Cli>("canal") {
        Ok(c) => c,
        Err(status) => return status,
    };
    match &cli.cmd {
        Command::Run(a) => run::run(a),
        Command::Stat(a) => stat(a),
        Command::Top(a) => top::run(a),
        Command::Daemon(a) => canald::cli::serve(a),
        Command::Bench(BenchCmd {
            b11: Some(BenchSub::B11(a)),
            ..
        }) => canal_vm::bench::run_b11(a),
        Command::Bench(BenchCmd {
            b11: Some(BenchSub::B14(a)),
            ..
        }) => canal_bench::isolation::run_b14(a),
        Command::Bench(b) => canal_bench::run(&b.args),
        Command::Vm(c) => canal_vm::cli::run_command(c),
        Command::OciHook(a) => oci_hook::run(a),
        Command::Completions(a) => docgen::completions(a, <Cli as clap::CommandFactory>::command()),
        Command::Man(a) => docgen::man(a, <Cli as clap::CommandFactory>::command()),
    }
}
