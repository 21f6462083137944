//! Bridges: a canal connection carried on a kernel socket, for code the hooks cannot see.
//!
//! The library sees a program's socket calls only through the libc functions it
//! interposes. Some code reaches a descriptor without them: glibc's stdio (fflush,
//! fgets... call the kernel directly, not `write`/`read`), a program without the
//! library (static, Go, or one that received the descriptor over SCM_RIGHTS), raw
//! system calls. On a canal socket they would act on its dummy descriptor. Where that
//! can happen — a connected TCP socket carried across exec, or passed with SCM_RIGHTS —
//! the socket is *bridged*: a helper process relays between the canal socket and one
//! end (Q) of an AF_UNIX stream pair, and the program's descriptors are replaced by the
//! other end (P), a real kernel socket every code path can use. Data calls on P go to
//! the kernel; names and socket options still answer for the canal socket (the
//! descriptor table marks P `Bridged`); `canal stat` still lists the connection.
//!
//! The helper is a fresh image of the program's own executable (`/proc/self/exe`) whose
//! libcanal rejoins the guest (CANAL_REJOIN), finds CANAL_BRIDGE and relays until the
//! connection is over, without running the program (relay.rs). It is started by a double
//! clone, so it is nobody's child the program could wait for, and it outlives the
//! process that started it (an exec'd image, a daemon's short-lived child).
//!
//! Not bridged: listeners and UDP sockets (they keep the CANAL_REJOIN path), and
//! processes holding the socket through the ring while another uses the bridge compete
//! for received data (docs/compat.md).

use crate::conn::guest::Guest;
use crate::fdtable::TABLE;
use crate::sock::core::Sock;
use crate::sys;
use canal_abi::sock_flag;
use canal_abi::sock_kind;
use core::sync::atomic::{AtomicI32, AtomicU32, Ordering};
use libc::c_int;
use std::ffi::CString;

pub(crate) const VAR: &str = "CANAL_BRIDGE";

/// The descriptor numbers the helper gets: the canal socket, Q.
pub(crate) const HELPER_SOCK: c_int = 3;
pub(crate) const HELPER_Q: c_int = 4;

/// Whether socket `h` is one a bridge can carry: a connected (or connecting) TCP
/// stream, over the host or short-circuited.
pub(crate) fn bridgeable(g: &'static Guest, h: u32) -> bool {
    Sock::new(g, h).is_ok_and(|s| {
        s.kind() == sock_kind::STREAM
            && s.flags() & (sock_flag::CONNECTED | sock_flag::CONNECTING) != 0
    })
}

/// A bridge receives for the program only while a *receive token* lives: the write end
/// of a pipe whose read end the helper watches. The process that made the bridge holds
/// it (close-on-exec, hidden like the library's other descriptors), its forked children
/// share it, and an exec keeps it only for an image that gets the socket as stdin
/// (`prepare_exec`). So a child that gets the connection as stdout or stderr and execs
/// (`prog >&sock`, `subprocess.run(..., stdout=sock)`) leaves a send-only bridge, and
/// its parent, still reading through the ring, keeps the replies, as natively; a
/// process that bridged a socket and reads through it (bash's `printf >&3; read <&3`)
/// keeps receiving.
pub(crate) const HELPER_TOKEN: c_int = 5;

/// The tokens this process holds: (handle, descriptor), -1 when free.
static TOKEN_H: [AtomicU32; 64] = [const { AtomicU32::new(0) }; 64];
static TOKEN_FD: [AtomicI32; 64] = [const { AtomicI32::new(-1) }; 64];

fn keep_token(h: u32, fd: c_int) -> bool {
    for (th, tf) in TOKEN_H.iter().zip(TOKEN_FD.iter()) {
        if tf
            .compare_exchange(-1, fd, Ordering::SeqCst, Ordering::Relaxed)
            .is_ok()
        {
            th.store(h, Ordering::SeqCst);
            return true;
        }
    }
    false
}

/// Points the token held at `old` to `new` (it moved: ownfd.rs).
pub(crate) fn retarget_token(old: c_int, new: c_int) -> bool {
    crate::ownfd::retarget(&TOKEN_FD, old, new)
}

/// Before exec: the tokens of sockets the new image gets as stdin (`stdin_of`) survive
/// it; the others close with it. Returns the survivors (for CANAL_REJOIN).
pub(crate) fn prepare_exec(stdin_of: Option<u32>) -> Vec<(c_int, u32)> {
    let mut kept = Vec::new();
    for (th, tf) in TOKEN_H.iter().zip(TOKEN_FD.iter()) {
        let fd = tf.load(Ordering::SeqCst);
        if fd < 0 {
            continue;
        }
        let h = th.load(Ordering::SeqCst);
        let keep = stdin_of == Some(h);
        let flag = if keep {
            0
        } else {
            libc::FD_CLOEXEC as libc::c_long
        };
        let _ = sys::fcntl_int(fd, libc::F_SETFD, flag);
        if keep {
            kept.push((fd, h));
        }
    }
    kept
}

/// After a failed exec: every token is close-on-exec again.
pub(crate) fn exec_failed() {
    for tf in TOKEN_FD.iter() {
        let fd = tf.load(Ordering::SeqCst);
        if fd >= 0 {
            let _ = sys::fcntl_int(fd, libc::F_SETFD, libc::FD_CLOEXEC as libc::c_long);
        }
    }
}

/// In an image that inherited tokens (CANAL_REJOIN): hold them as its own.
pub(crate) fn adopt_tokens(tokens: &[(c_int, u32)]) {
    for &(fd, h) in tokens {
        if sys::fcntl_int(fd, libc::F_SETFD, libc::FD_CLOEXEC as libc::c_long).is_ok() {
            let _ = TABLE.set_internal(fd);
            if !keep_token(h, fd) {
                let _ = sys::close(fd);
            }
        }
    }
}

/// Bridges socket `h` (at `fd`) if it is a connection (`bridgeable`); a failure leaves
/// it as it was (the hooks still serve it; only paths they cannot see miss it).
pub(crate) fn bridge_if_connected(g: &'static Guest, fd: c_int, h: u32) {
    if bridgeable(g, h) {
        if let Err(e) = bridge(g, fd, h) {
            crate::rt::debug!(g, "canal: bridging handle {h:#x} failed: errno {e}\n");
        }
    }
}

/// Bridges canal socket `h` (held here at `fd`, among others): starts its helper and
/// replaces every descriptor of this process that holds it by the kernel socket.
pub(crate) fn bridge(g: &'static Guest, fd: c_int, h: u32) -> Result<(), i32> {
    let p = spawn(g, fd, h)?;
    adopt_bridge(g, h, p);
    let _ = sys::close(p);
    Ok(())
}

/// Starts a helper for canal socket `h` (held here at `fd`) and returns P, the kernel
/// end the program gets in the socket's place (close-on-exec; blocking as the socket
/// was). The helper holds its own reference to the socket; this process holds the
/// receive token.
fn spawn(g: &'static Guest, fd: c_int, h: u32) -> Result<c_int, i32> {
    let s = Sock::new(g, h)?;
    let mut sv = [-1 as c_int; 2];
    // SAFETY: sv is a writable array of two ints.
    sys::check(unsafe {
        crate::sys::raw_syscall!(
            libc::SYS_socketpair,
            libc::AF_UNIX as libc::c_long,
            (libc::SOCK_STREAM | libc::SOCK_CLOEXEC) as libc::c_long,
            0 as libc::c_long,
            sv.as_mut_ptr(),
        )
    })?;
    let mut tk = [-1 as c_int; 2];
    // SAFETY: tk is a writable array of two ints.
    let r = unsafe { crate::sys::raw_syscall!(libc::SYS_pipe2, tk.as_mut_ptr(), libc::O_CLOEXEC) };
    if let Err(e) = sys::check(r) {
        let _ = sys::close(sv[0]);
        let _ = sys::close(sv[1]);
        return Err(e);
    }
    let (p, q) = (sv[0], sv[1]);
    let r = start_helper(g, fd, h, q, tk[0]);
    let _ = sys::close(q);
    let _ = sys::close(tk[0]);
    if let Err(e) = r {
        let _ = sys::close(p);
        let _ = sys::close(tk[1]);
        return Err(e);
    }
    let token = crate::ownfd::adopt(tk[1]);
    if !keep_token(h, token) {
        // No room to remember it: the bridge stays two-way for as long as we live.
        crate::rt::debug!(g, "canal: no room for the receive token of {h:#x}\n");
    }
    if s.nonblocking() {
        let fl = sys::fcntl_int(p, libc::F_GETFL, 0).unwrap_or(0) as libc::c_long;
        let _ = sys::fcntl_int(p, libc::F_SETFL, fl | libc::O_NONBLOCK as libc::c_long);
    }
    crate::rt::debug!(g, "canal: handle {h:#x} bridged (kernel socket fd {p})\n");
    Ok(p)
}

/// Everything the helper's image needs, made before cloning: after the clone only raw
/// system calls run (the copy of a multi-threaded process may hold any lock).
struct Launch {
    env: crate::launch::ExecEnv,
    _bridge: CString,
    argv: [*const libc::c_char; 2],
    keep: [c_int; 4],
}

fn start_helper(g: &'static Guest, fd: c_int, h: u32, q: c_int, token: c_int) -> Result<(), i32> {
    // The helper shares the control connection and holds the socket (sock/watch.rs).
    crate::sock::watch::share(g);
    let ids = crate::conn::guest::rejoin_fds(g).ok_or(libc::ENOTSUP)?;
    let rejoin = crate::conn::inherit::encode(ids, u32::MAX, &[(HELPER_SOCK, h)], &[], &[]);
    let rejoin = CString::new(format!("{}={rejoin}", crate::conn::inherit::VAR))
        .map_err(|_| libc::EINVAL)?;
    let bridge = CString::new(format!("{VAR}={HELPER_SOCK},{HELPER_Q},{HELPER_TOKEN}"))
        .map_err(|_| libc::EINVAL)?;
    let own_env = [bridge.as_ptr(), core::ptr::null()];
    // SAFETY: own_env is a NULL-terminated array of C strings that outlives the exec.
    let env = unsafe { crate::launch::exec_env(own_env.as_ptr(), Some(rejoin), true) };
    let l = Launch {
        env,
        _bridge: bridge,
        argv: [c"canal-bridge".as_ptr(), core::ptr::null()],
        keep: [ids.0, ids.1, ids.2, ids.3],
    };
    // The helper's reference, taken before it can drop it.
    crate::sock::close::add_ref(g, h);
    // SAFETY: clone without CLONE_VM is fork without atfork handlers; the child runs
    // only `intermediate`, which makes raw system calls and exits.
    let pid = unsafe {
        crate::sys::raw_syscall!(
            libc::SYS_clone,
            0 as libc::c_long,
            0 as libc::c_long,
            0,
            0,
            0,
        )
    };
    if pid < 0 {
        crate::sock::close::release(g, h);
        return Err(sys::errno());
    }
    if pid == 0 {
        intermediate(&l, fd, q, token);
    }
    // Reap the intermediate (exit signal 0: only __WCLONE waits see it, so the
    // program's own waits never do).
    let mut status = 0;
    // SAFETY: status is a valid out-pointer.
    unsafe {
        crate::sys::raw_syscall!(
            libc::SYS_wait4,
            pid,
            &mut status as *mut c_int,
            libc::__WCLONE,
            0,
        );
    }
    if libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0 {
        Ok(())
    } else {
        crate::sock::close::release(g, h);
        Err(libc::ECHILD)
    }
}

/// In the intermediate: clone the helper (reparented to init when we exit) and exit.
fn intermediate(l: &Launch, fd: c_int, q: c_int, token: c_int) -> ! {
    // SAFETY: as above, a fork without atfork handlers; exit signal SIGCHLD so that
    // whoever inherits the helper reaps it.
    let pid = unsafe {
        crate::sys::raw_syscall!(
            libc::SYS_clone,
            libc::SIGCHLD as libc::c_long,
            0 as libc::c_long,
            0,
            0,
            0,
        )
    };
    if pid == 0 {
        helper_exec(l, fd, q, token);
    }
    // SAFETY: exit_group has no preconditions.
    unsafe { crate::sys::raw_syscall!(libc::SYS_exit_group, if pid < 0 { 1 } else { 0 }) };
    unreachable!()
}

/// In the helper, before exec: the socket at 3, Q at 4, the token's read end at 5,
/// /dev/null on 0-2, the guest's
/// descriptors kept, everything else of the program's closed on exec.
fn helper_exec(l: &Launch, fd: c_int, q: c_int, token: c_int) -> ! {
    // SAFETY: raw system calls on this process's own descriptors and on strings and
    // arrays `l` made before the clone; on any failure the process exits.
    unsafe {
        let a = crate::sys::raw_syscall!(libc::SYS_fcntl, fd, libc::F_DUPFD_CLOEXEC, 10);
        let b = crate::sys::raw_syscall!(libc::SYS_fcntl, q, libc::F_DUPFD_CLOEXEC, 10);
        let t = crate::sys::raw_syscall!(libc::SYS_fcntl, token, libc::F_DUPFD_CLOEXEC, 10);
        let null = crate::sys::raw_syscall!(
            libc::SYS_openat,
            libc::AT_FDCWD,
            c"/dev/null".as_ptr(),
            libc::O_RDWR,
        );
        if a < 0 || b < 0 || t < 0 || null < 0 {
            crate::sys::raw_syscall!(libc::SYS_exit_group, 126);
        }
        for t in 0..3 {
            crate::sys::raw_syscall!(libc::SYS_dup3, null, t, 0);
        }
        crate::sys::raw_syscall!(libc::SYS_dup3, a, HELPER_SOCK, 0);
        crate::sys::raw_syscall!(libc::SYS_dup3, b, HELPER_Q, 0);
        crate::sys::raw_syscall!(libc::SYS_dup3, t, HELPER_TOKEN, 0);
        crate::sys::raw_syscall!(
            libc::SYS_close_range,
            HELPER_TOKEN + 1,
            c_int::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        );
        for k in l.keep {
            crate::sys::raw_syscall!(libc::SYS_fcntl, k, libc::F_SETFD, 0);
        }
        crate::sys::raw_syscall!(
            libc::SYS_execve,
            c"/proc/self/exe".as_ptr(),
            l.argv.as_ptr(),
            l.env.as_ptr(),
        );
        crate::sys::raw_syscall!(libc::SYS_exit_group, 127);
    }
    unreachable!()
}

/// Replaces every descriptor of this process that holds canal socket `h` by a copy of
/// P (keeping each one's close-on-exec flag), marked bridged; their references go.
fn adopt_bridge(g: &'static Guest, h: u32, p: c_int) {
    let mut fds = Vec::new();
    TABLE.for_each_canal(|fd, hh| {
        if hh == h {
            fds.push(fd);
        }
    });
    for fd in fds {
        if sys::replace_fd(p, fd).is_err() {
            continue;
        }
        crate::mux::epoll::forget_fd(fd);
        if let Some(crate::fdtable::Entry::Canal(old)) = TABLE.set_bridged(fd, h).ok().flatten() {
            crate::sock::close::release_closed(g, old);
        }
    }
}
