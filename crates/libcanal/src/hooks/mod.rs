//! The `extern "C"` entry points that shadow libc's when preloaded. Each is thin: one
//! bounds check and one load in the descriptor table; an ordinary descriptor goes
//! straight to the real libc function; a canal descriptor goes to `sock`/`mux`.
//!
//! `#[cfg_attr(not(test), no_mangle)]` keeps unit tests from interposing themselves.
//!
//! One file per family: `socket`, `io`, `poll`, `fd`, `exec`, `execl`, `ns` (unshare/setns), `seccomp`, `spawn` (posix_spawn's dup2 actions), `splice`, `syscall` (libc's `syscall()`: a call by number goes to the hook of its name), `vfork`; `common` holds what they share.
#![allow(clippy::missing_safety_doc)]

pub(crate) mod common;
pub(crate) mod exec;
pub(crate) mod execl;
pub(crate) mod fd;
pub(crate) mod io;
pub(crate) mod ns;
pub(crate) mod poll;
pub(crate) mod seccomp;
pub(crate) mod socket;
pub(crate) mod spawn;
pub(crate) mod splice;
pub(crate) mod syscall;
pub(crate) mod vfork;
