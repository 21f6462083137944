//! Socket operations on canal sockets: the data path over the rings (no round trip
//! when data or room is there) and the control operations as requests. Every function
//! returns `Result<_, errno>`; the hooks turn that into -1/errno.
//!
//! `core` is the socket itself; each other file is one family of operations on it.

pub(crate) mod accept;
pub(crate) mod close;
pub(crate) mod control;
pub(crate) mod core;
pub(crate) mod create;
pub(crate) mod data;
pub(crate) mod dead;
pub(crate) mod dgram;
pub(crate) mod kept;
pub(crate) mod names;
pub(crate) mod native;
pub(crate) mod opts;
pub(crate) mod stream;
pub(crate) mod watch;
