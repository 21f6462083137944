//! One guest: its region, its request queue consumer, its host sockets, and one
//! service round over all of them. Everything a guest owns is in `Guest`, so guests
//! can be spread over worker threads without sharing state.
//!
//! Guest memory is hostile: every value read from the region is either copied and
//! validated (requests), checked against the host's own copy (ring indices), or only
//! used as a hint (attention bits, queue entries, sleep words).
//!
//! Files, bottom-up: `config` (per-guest settings), `addr_view` (the guest's address
//! view: loopback rules and the VM's translation), `socket` (a host socket's state),
//! `wake` (wake-up bookkeeping types), `state` (the `Guest`); then `impl Guest` by job:
//! `wakeups`, `ops` (socket operations), `stream` and `dgram` (data pumps), `service`
//! (a service round and request dispatch); `shortcut` (co-resident pairs) and `vrss`
//! (spreading one guest's sockets over workers).
#![forbid(unsafe_code)]

pub mod addr_view;
pub mod config;
pub mod dgram;
pub mod entries;

pub mod ops;
pub mod service;
pub mod shared;
pub mod shortcut;
pub mod socket;
pub mod spares;
pub mod state;
pub mod stream;
pub mod vrss;
pub mod wake;
pub mod wakeups;
