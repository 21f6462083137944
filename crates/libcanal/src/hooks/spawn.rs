//! posix_spawn: glibc execs the child itself, where no hook runs (no CANAL_REJOIN, no
//! bridge). What it does to the child's descriptors is known in advance, though: a
//! program that redirects a connected canal socket onto a standard stream
//! (`posix_spawn_file_actions_adddup2(fa, sock, 0..2)`: Rust's `Command`, GLib, many
//! launchers) has the connection bridged right then (bridge.rs), so the child inherits
//! a kernel socket that carries it — stdio and all — and this process uses the same
//! one from then on.
use crate::sys::real;
use libc::c_int;

type FnAddDup2 = unsafe extern "C" fn(*mut libc::posix_spawn_file_actions_t, c_int, c_int) -> c_int;

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn posix_spawn_file_actions_adddup2(
    fa: *mut libc::posix_spawn_file_actions_t,
    fd: c_int,
    newfd: c_int,
) -> c_int {
    if (0..=2).contains(&newfd) && !crate::hooks::exec::vfork_child() {
        if let (Some(h), Some(g)) = (
            crate::fdtable::TABLE.handle(fd),
            crate::conn::guest::guest(),
        ) {
            if let Some(_r) = crate::hooks::common::Reentry::enter() {
                crate::bridge::bridge_if_connected(g, fd, h);
            }
        }
    }
    // SAFETY: forwarding the caller's arguments to libc's function.
    unsafe { real!(c"posix_spawn_file_actions_adddup2", FnAddDup2)(fa, fd, newfd) }
}
