//! `syscall()`: libc's door for a system call a program makes by number. Libraries do
//! this for calls glibc wrapped late or not at all: libuv 1.44 (Debian 12's, under
//! bind9's `dig`, `host`, `nsupdate` and `named`) sends and receives datagrams with
//! `syscall(__NR_sendmmsg, …)` / `__NR_recvmmsg`; libseccomp installs its filter with
//! `syscall(__NR_seccomp, …)`. Such a call on a canal socket reached the dummy
//! descriptor (ENOTCONN, or bytes nobody reads); a filter went in unprepared.
//!
//! So a call by number goes where the libc function of that name would: every call this
//! library hooks is routed to its hook (which passes an ordinary descriptor on to the
//! kernel), `seccomp` prepares for confinement first, as `prctl` does. Anything else is
//! the system call itself. The routed calls take the kernel's argument types: an `int`
//! argument is cut to 32 bits as the kernel cuts it, and the calls whose kernel form
//! differs from libc's (the signal-set size of `ppoll`, `epoll_pwait`, `epoll_pwait2`,
//! `pselect6`'s packed mask) are unpacked; a size other than the kernel's one gets the
//! kernel's EINVAL from the kernel itself. Not routed: `clone`/`fork`/`vfork` (a child
//! made by number skips `pthread_atfork`, as with glibc's `syscall()`).
//!
//! C's `syscall` is variadic. Its arguments are integers or pointers, passed in the
//! integer registers and then on the stack, so a seven-argument function receives them
//! as given; a call with fewer arguments leaves garbage in the unused ones, which are
//! never read as arguments of a call that does not take them.
use super::{exec, fd, io, ns, poll, seccomp, socket, splice};
use crate::sys::raw_syscall;
use libc::{c_int, c_long, c_uint, c_ulong, c_void};

/// The kernel's signal set size (`_NSIG / 8`): what the kernel accepts with a mask.
const KERNEL_SIGSET: c_long = 8;

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn syscall(
    n: c_long,
    a1: c_long,
    a2: c_long,
    a3: c_long,
    a4: c_long,
    a5: c_long,
    a6: c_long,
) -> c_long {
    // SAFETY: each arm passes the caller's arguments to the hook of the same call with
    // the kernel's types; the hooks have the contracts of the libc functions, which are
    // the system calls' contracts.
    unsafe {
        match routed(n, [a1, a2, a3, a4, a5, a6]) {
            Some(r) => r,
            None => raw_syscall!(n, a1, a2, a3, a4, a5, a6),
        }
    }
}

/// The hook a call by number goes to, and its result; `None`: the system call itself.
unsafe fn routed(n: c_long, a: [c_long; 6]) -> Option<c_long> {
    let int = |i: usize| a[i] as c_int;
    let ptr = |i: usize| a[i] as *mut c_void;
    // SAFETY: the caller's contract (see `syscall`).
    unsafe {
        Some(match n {
            libc::SYS_socket => socket::socket(int(0), int(1), int(2)) as c_long,
            libc::SYS_bind => socket::bind(int(0), ptr(1).cast(), a[2] as u32) as c_long,
            libc::SYS_connect => socket::connect(int(0), ptr(1).cast(), a[2] as u32) as c_long,
            libc::SYS_listen => socket::listen(int(0), int(1)) as c_long,
            #[cfg(target_arch = "x86_64")]
            libc::SYS_accept => socket::accept(int(0), ptr(1).cast(), ptr(2).cast()) as c_long,
            libc::SYS_accept4 => {
                socket::accept4(int(0), ptr(1).cast(), ptr(2).cast(), int(3)) as c_long
            }
            libc::SYS_shutdown => socket::shutdown(int(0), int(1)) as c_long,
            libc::SYS_getsockname => {
                socket::getsockname(int(0), ptr(1).cast(), ptr(2).cast()) as c_long
            }
            libc::SYS_getpeername => {
                socket::getpeername(int(0), ptr(1).cast(), ptr(2).cast()) as c_long
            }
            libc::SYS_setsockopt => {
                socket::setsockopt(int(0), int(1), int(2), ptr(3), a[4] as u32) as c_long
            }
            libc::SYS_getsockopt => {
                socket::getsockopt(int(0), int(1), int(2), ptr(3), ptr(4).cast()) as c_long
            }
            libc::SYS_sendto => io::sendto(
                int(0),
                ptr(1),
                a[2] as usize,
                int(3),
                ptr(4).cast(),
                a[5] as u32,
            ) as c_long,
            libc::SYS_recvfrom => io::recvfrom(
                int(0),
                ptr(1),
                a[2] as usize,
                int(3),
                ptr(4).cast(),
                ptr(5).cast(),
            ) as c_long,
            libc::SYS_sendmsg => io::sendmsg(int(0), ptr(1).cast(), int(2)) as c_long,
            libc::SYS_recvmsg => io::recvmsg(int(0), ptr(1).cast(), int(2)) as c_long,
            libc::SYS_sendmmsg => {
                io::sendmmsg(int(0), ptr(1).cast(), a[2] as c_uint, int(3)) as c_long
            }
            libc::SYS_recvmmsg => {
                io::recvmmsg(int(0), ptr(1).cast(), a[2] as c_uint, int(3), ptr(4).cast()) as c_long
            }
            libc::SYS_read => io::read(int(0), ptr(1), a[2] as usize) as c_long,
            libc::SYS_write => io::write(int(0), ptr(1), a[2] as usize) as c_long,
            libc::SYS_readv => io::readv(int(0), ptr(1).cast(), int(2)) as c_long,
            libc::SYS_writev => io::writev(int(0), ptr(1).cast(), int(2)) as c_long,
            libc::SYS_sendfile => {
                io::sendfile(int(0), int(1), ptr(2).cast(), a[3] as usize) as c_long
            }
            libc::SYS_splice => splice::splice(
                int(0),
                ptr(1).cast(),
                int(2),
                ptr(3).cast(),
                a[4] as usize,
                a[5] as c_uint,
            ) as c_long,
            libc::SYS_close => fd::close(int(0)) as c_long,
            libc::SYS_close_range => {
                fd::close_range(a[0] as c_uint, a[1] as c_uint, int(2)) as c_long
            }
            libc::SYS_dup => fd::dup(int(0)) as c_long,
            #[cfg(target_arch = "x86_64")]
            libc::SYS_dup2 => fd::dup2(int(0), int(1)) as c_long,
            libc::SYS_dup3 => fd::dup3(int(0), int(1), int(2)) as c_long,
            libc::SYS_fcntl => fd::fcntl(int(0), int(1), a[2] as c_ulong) as c_long,
            libc::SYS_ioctl => fd::ioctl(int(0), a[1] as c_ulong, ptr(2)) as c_long,
            #[cfg(target_arch = "x86_64")]
            libc::SYS_poll => poll::poll(ptr(0).cast(), a[1] as libc::nfds_t, int(2)) as c_long,
            libc::SYS_ppoll if mask_size_ok(a[3], a[4]) => poll::ppoll(
                ptr(0).cast(),
                a[1] as libc::nfds_t,
                ptr(2).cast(),
                ptr(3).cast(),
            ) as c_long,
            #[cfg(target_arch = "x86_64")]
            libc::SYS_select => poll::select(
                int(0),
                ptr(1).cast(),
                ptr(2).cast(),
                ptr(3).cast(),
                ptr(4).cast(),
            ) as c_long,
            libc::SYS_pselect6 => {
                let mask = pselect6_mask(a[5])?;
                poll::pselect(
                    int(0),
                    ptr(1).cast(),
                    ptr(2).cast(),
                    ptr(3).cast(),
                    ptr(4).cast(),
                    mask,
                ) as c_long
            }
            libc::SYS_epoll_ctl => poll::epoll_ctl(int(0), int(1), int(2), ptr(3).cast()) as c_long,
            #[cfg(target_arch = "x86_64")]
            libc::SYS_epoll_wait => {
                poll::epoll_wait(int(0), ptr(1).cast(), int(2), int(3)) as c_long
            }
            libc::SYS_epoll_pwait if mask_size_ok(a[4], a[5]) => {
                poll::epoll_pwait(int(0), ptr(1).cast(), int(2), int(3), ptr(4).cast()) as c_long
            }
            libc::SYS_epoll_pwait2 if mask_size_ok(a[4], a[5]) => {
                poll::epoll_pwait2(int(0), ptr(1).cast(), int(2), ptr(3).cast(), ptr(4).cast())
                    as c_long
            }
            libc::SYS_execve => exec::execve(ptr(0).cast(), ptr(1).cast(), ptr(2).cast()) as c_long,
            libc::SYS_unshare => ns::unshare(int(0)) as c_long,
            libc::SYS_setns => ns::setns(int(0), int(1)) as c_long,
            libc::SYS_prctl => seccomp::prctl(
                int(0),
                a[1] as c_ulong,
                a[2] as c_ulong,
                a[3] as c_ulong,
                a[4] as c_ulong,
            ) as c_long,
            libc::SYS_seccomp => {
                seccomp::before_seccomp(a[0] as c_uint);
                return None;
            }
            _ => return None,
        })
    }
}

/// Whether a call's signal mask (`mask`, `size` bytes) is one the hook may take: none,
/// or the kernel's size. Any other size goes to the kernel, which refuses it.
fn mask_size_ok(mask: c_long, size: c_long) -> bool {
    mask == 0 || size == KERNEL_SIGSET
}

/// `pselect6`'s sixth argument, `{const sigset_t *ss; size_t ss_len}` or null, as
/// pselect's mask; `None` (the kernel's own answer) for a size the kernel refuses.
/// A pointer the kernel would fault on is read here too: that program gets SIGSEGV
/// where the kernel would say EFAULT.
unsafe fn pselect6_mask(packed: c_long) -> Option<*const libc::sigset_t> {
    if packed == 0 {
        return Some(core::ptr::null());
    }
    // SAFETY: the kernel's layout of pselect6's sixth argument; the caller passed it.
    let [ss, len] = unsafe { *(packed as *const [c_long; 2]) };
    mask_size_ok(ss, len).then_some(ss as *const libc::sigset_t)
}
