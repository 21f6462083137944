//! canald, the canal host service: performs guests' socket calls on the host's
//! network stack. Guests reach it through a Unix control socket (attach, wake-up
//! ports, listing) and a shared-memory region each (requests, rings), as described in
//! `docs/protocol.md`; guest memory is treated as hostile (`docs/threat-model.md`).
//!
//! Code map (each file uses no file that uses it; `scripts/check-layout`): `sys/` (the
//! only unsafe code: system-call wrappers behind a facade), `alloc` (data-area
//! allocator), `request` (copy-then-validate of request slots), `sockopt` (which socket options
//! reach the host socket), `config` (`Config`,
//! defaults, the clap command line), `cli` (the `canald` entry point), `logging`
//! (timestamped log lines), `guest/` (one guest: settings, address view, host sockets,
//! wake-ups, operations, data pumps, service round, short-circuit, vRSS), `engine`
//! (spin budget and coalescing), `worker` (pollers), `daemon` (control socket, guest
//! registry, worker 0), `control` (one handler per control message), `watch` (WATCH),
//! `stat` (the listing), `vm` (VM guests: region files, lifetime), `ivshmem_server`
//! (doorbell VMs), `spawn` (starting a private canald), `fuzz` (the request consumer's
//! fuzz entry point), `ctldir` (trust checks on the control directory and the daemon's
//! uid), `fdbudget` (descriptor limit, per-guest socket cap, reserve).
#![deny(unsafe_code)]

pub mod accept;
pub mod alloc;
pub mod cli;
pub mod client;
pub mod config;
pub mod control;
pub mod ctldir;
pub mod daemon;
pub mod engine;
pub mod fdbudget;
pub mod fuzz;
pub mod guest;
pub mod ivshmem_server;
pub mod logging;
pub mod metrics;
pub mod network;
pub mod output;
pub mod quota;
pub mod request;
pub mod seccomp;
pub mod sockopt;
pub mod spawn;
pub mod stat;
pub mod sys;
pub mod users;
pub mod vm;
pub mod watch;
pub mod worker;

pub use cli::cli_main;
pub use client::{fetch_metrics, fetch_stat};
pub use config::{default_socket_path, Config};
pub use daemon::{Bound, Daemon};
