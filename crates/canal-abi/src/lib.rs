//! Canal's shared-memory ABI: the bytes a guest and canald agree on, and nothing else.
//!
//! A *region* is one shared-memory object per guest. Everything in it is addressed by
//! offset from the region's start, never by pointer, so the same bytes mean the same
//! thing in every address space (a host process, a container, a VM's PCI BAR).
//! `docs/protocol.md` describes every byte; the layout tests in `tests/layout.rs`
//! pin every offset.
//!
//! This crate holds no policy: which calls are allowed, how sockets are scheduled and
//! how waits are tuned belong to `canald` and `libcanal`.
#![cfg_attr(not(test), no_std)]

pub mod addr;
pub mod armlock;
pub mod bias;
pub mod cmsg;
pub mod consts;
pub mod control;
pub mod evlog;
pub mod fast;
pub mod names;
pub mod queue;
pub mod region;
pub mod ring;
pub mod segment;
pub mod sync;
pub mod wait;
pub mod zone;

pub use addr::CanalAddr;
pub use consts::*;
pub use region::*;
