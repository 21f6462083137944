//! One guest: its region, its request queue consumer, its host sockets, and one
//! service round over all of them. Everything a guest owns is in `Guest`, so guests
//! can be spread over worker threads without sharing state.
//!
//! Guest memory is hostile: every value read from the region is either copied and
//! validated (requests), checked against the host's own copy (ring indices), or only
//! used as a hint (attention bits, queue entries, sleep words).
//!
//! Files, bottom-up: `config` (per-guest settings), `contacts` (the outside addresses a
//! private datagram socket spoke to, whose replies it takes), `netview` (a guest network's
//! own address view and translation table: VMs, isolated namespaces), `addr_view` (the
//! translation every request goes through: loopback rules, then the network's view),
//! `dgram_control` (datagram control messages: the list that reaches `sendmsg`, addresses
//! in the view), `names` (getsockname/getpeername and a connected stream's final names), `socket` (a host socket's state),
//! `wake` (wake-up bookkeeping types), `state` (the `Guest`); then `impl Guest` by job:
//! `wakeups`, `ops` (socket operations), `handover` (a host socket given to its guest, whose
//! program passes it on), `stream` and `dgram` (data pumps) with `dgram_route` (datagrams
//! between canal guests, canald moving them ring to ring; its state in `dgram_local`), `directory`
//! (the ports canal guests listen or receive on, which DIRECT guests read), `service`
//! (a service round and request dispatch); `shortcut` (co-resident pairs) with `segmem`
//! (making a pair's segment), `arena` (their segments' shared files), `ports`
//! (connectors' local ports) and `fast` (connects with tickets, their books in
//! `fast_book`), and `vrss` (spreading one guest's sockets over workers).
#![forbid(unsafe_code)]

pub mod addr_view;
pub mod arena;
pub mod bells;
pub mod config;
pub mod contacts;
pub mod dgram;
pub mod dgram_control;
pub mod dgram_local;
pub mod dgram_route;
pub mod directory;
pub mod entries;
pub mod fast;
pub mod fast_book;
pub mod handover;
pub mod names;
pub mod netops;
pub mod netview;

pub mod ops;
pub mod ports;
pub mod segmem;
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
