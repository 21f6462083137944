//! posix_spawn, system, popen: glibc execs the child itself, where no hook runs (no
//! CANAL_REJOIN, no bridge). What it does to the child's descriptors is known in advance, though: a
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

/// Every way a program starts another process without fork or exec going through the
/// library: the child inherits this process's descriptors without close-on-exec, so
/// its sockets get their WATCH first (sock/watch.rs), as for fork.
fn before_spawn() {
    let Some(g) = crate::conn::guest::guest() else {
        return;
    };
    if crate::hooks::exec::vfork_child() {
        return;
    }
    if let Some(_r) = crate::hooks::common::Reentry::enter() {
        crate::sock::watch::share(g);
    }
    // The child holds copies of the undecided sockets: they stay the kernel's.
    crate::direct::settle_all_kernel();
}

type FnSpawn = unsafe extern "C" fn(
    *mut libc::pid_t,
    *const libc::c_char,
    *const libc::posix_spawn_file_actions_t,
    *const libc::posix_spawnattr_t,
    *const *mut libc::c_char,
    *const *mut libc::c_char,
) -> c_int;

/// posix_spawn and posix_spawnp (the same arguments; the second searches PATH).
macro_rules! spawn_hook {
    ($name:ident, $sym:literal) => {
        #[cfg_attr(not(test), no_mangle)]
        pub unsafe extern "C" fn $name(
            pid: *mut libc::pid_t,
            file: *const libc::c_char,
            fa: *const libc::posix_spawn_file_actions_t,
            attr: *const libc::posix_spawnattr_t,
            argv: *const *mut libc::c_char,
            envp: *const *mut libc::c_char,
        ) -> c_int {
            before_spawn();
            // SAFETY: forwarding the caller's arguments to libc's function.
            unsafe { real!($sym, FnSpawn)(pid, file, fa, attr, argv, envp) }
        }
    };
}

spawn_hook!(posix_spawn, c"posix_spawn");
spawn_hook!(posix_spawnp, c"posix_spawnp");

type FnSystem = unsafe extern "C" fn(*const libc::c_char) -> c_int;

/// system(3): glibc spawns the shell itself, past the hooks above.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn system(cmd: *const libc::c_char) -> c_int {
    before_spawn();
    // SAFETY: as above.
    unsafe { real!(c"system", FnSystem)(cmd) }
}

type FnPopen = unsafe extern "C" fn(*const libc::c_char, *const libc::c_char) -> *mut libc::FILE;

/// popen(3): as system.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn popen(
    cmd: *const libc::c_char,
    mode: *const libc::c_char,
) -> *mut libc::FILE {
    before_spawn();
    // SAFETY: as above.
    unsafe { real!(c"popen", FnPopen)(cmd, mode) }
}
