//! Hooks of self-confinement: `prctl(PR_SET_SECCOMP)`. A program that installs a seccomp
//! filter (sshd's pre-authentication child, privilege-separated daemons) allows only
//! the system calls it makes itself, and is killed for any other: before the filter
//! goes in, the calling thread claims its request slot and wake-up port (which take
//! system calls no such filter allows), and the library switches to the calls those
//! filters allow (sys.rs, "confinement"). A filter installed through seccomp(2) by way
//! of libc's `syscall()` (libseccomp's `seccomp_load`) is prepared for the same way
//! (hooks/syscall.rs); one a program installs with its own system call instruction is
//! not seen; one already in force at start is (`lib.rs`).
use crate::hooks::exec::vfork_child;
use crate::sys;
use crate::sys::real;
use libc::c_int;
use libc::c_ulong;

type FnPrctl = unsafe extern "C" fn(c_int, c_ulong, c_ulong, c_ulong, c_ulong) -> c_int;

/// prctl is variadic in C; its arguments are integers (or pointers) in the integer
/// argument registers, so a five-argument function receives and forwards them as given.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn prctl(
    option: c_int,
    a2: c_ulong,
    a3: c_ulong,
    a4: c_ulong,
    a5: c_ulong,
) -> c_int {
    if option == libc::PR_SET_SECCOMP && !vfork_child() {
        prepare_for_confinement();
    }
    // SAFETY: forwarding the caller's arguments to libc's prctl.
    unsafe { real!(c"prctl", FnPrctl)(option, a2, a3, a4, a5) }
}

/// `seccomp(2)` called by number: strict mode or a filter going in is prepared for as
/// `prctl(PR_SET_SECCOMP)` is; the other operations confine nothing.
pub(crate) fn before_seccomp(op: libc::c_uint) {
    let confining = op == libc::SECCOMP_SET_MODE_STRICT || op == libc::SECCOMP_SET_MODE_FILTER;
    if confining && !vfork_child() {
        prepare_for_confinement();
    }
}

/// Everything that needs system calls a filter may forbid, done now; then confined.
fn prepare_for_confinement() {
    let _ = sys::gettid();
    if let Some(g) = crate::conn::guest::guest() {
        let _ = crate::conn::slots::own_slot(g);
        // pidfd_open is another call such filters forbid (conn/guest.rs).
        let _ = crate::conn::guest::death_pollfd(g);
        // Taking a socket side from its owner needs membarrier, which such filters
        // forbid: end biasing on every socket this process holds while it still can.
        crate::fdtable::TABLE.for_each_canal(|_, h| {
            if let Some(e) = g.region.socket(canal_abi::handle_index(h)) {
                crate::shortcut::sidelock::revoke_both(e);
            }
        });
    }
    sys::set_confined();
}
