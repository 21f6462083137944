//! vfork. A vfork child shares its parent's memory, so the library must not change
//! anything from it: no bridge, no CANAL_REJOIN, no carried LD_PRELOAD for the image it
//! execs (docs/compat.md) — and CPython's subprocess and dash spawn through vfork. So a
//! process that holds canal sockets gets fork() from vfork() (POSIX lets vfork be
//! fork; programs may only exec or _exit in the child), and its child runs the exec
//! hooks as any forked child does. Otherwise the real vfork runs, entered by a tail jump:
//! a wrapper's stack frame would be reused by the child before the parent returned into
//! it.
//!
//! x86-64 only (a naked function); elsewhere vfork is not hooked.
use core::sync::atomic::{AtomicUsize, Ordering};

/// libc's vfork, resolved by the library constructor (0: not found; fork then).
static REAL_VFORK: AtomicUsize = AtomicUsize::new(0);

/// Library constructor.
pub(crate) fn at_start() {
    REAL_VFORK.store(crate::sys::dlsym_next(c"vfork"), Ordering::Relaxed);
}

/// Whether this vfork must be a fork: attached and holding a canal or bridged socket.
/// Undecided sockets stay the kernel's first (the child holds copies; direct.rs).
extern "C" fn fork_instead() -> bool {
    crate::direct::settle_all_kernel();
    crate::conn::guest::guest().is_some() && crate::fdtable::TABLE.any_socket()
}

extern "C" fn fork_for_vfork() -> libc::pid_t {
    // SAFETY: fork through libc, so the atfork handlers (ours and the program's) run.
    unsafe { libc::fork() }
}

#[cfg(target_arch = "x86_64")]
#[unsafe(naked)]
#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn vfork() -> libc::pid_t {
    // The decision is a complete call (its frame is gone) before either jump; the
    // stack is as the caller left it when vfork or fork is entered.
    core::arch::naked_asm!(
        "sub rsp, 8",
        "call {decide}",
        "add rsp, 8",
        "test al, al",
        "jnz 2f",
        "mov rax, qword ptr [rip + {real}]",
        "test rax, rax",
        "jz 2f",
        "jmp rax",
        "2:",
        "jmp {fork}",
        decide = sym fork_instead,
        real = sym REAL_VFORK,
        fork = sym fork_for_vfork,
    )
}
