//! Small safe wrappers around the system calls canald needs (virtiofsd's `oslib.rs`
//! style), one file per kind of object; this facade re-exports them as `sys::…`. This
//! is the only module of canald that contains `unsafe`; every block names the invariant
//! it relies on. Everything else in the crate is `forbid(unsafe_code)`.
#![allow(unsafe_code)]

mod activation;
mod diag;
mod epoll;
mod inet;
mod io;
mod mem;
mod netns;
mod process;
mod seccomp;
mod unix;
mod util;

pub use activation::*;
pub use diag::*;
pub use epoll::*;
pub(crate) use inet::*;
pub use io::*;
pub use mem::*;
pub use netns::*;
pub use process::*;
pub use seccomp::*;
pub use unix::*;
pub(crate) use util::*;
