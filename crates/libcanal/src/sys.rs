//! The library's own contact with the OS: raw system calls and the real libc functions.
//!
//! When `libcanal.so` is preloaded, every libc symbol it exports (`read`, `write`,
//! `close`, `poll`, ...) shadows glibc's, *including for calls made from inside this
//! library* (Rust's std and the `libc` crate link to the same symbols). So the library
//! never does its own I/O through libc wrappers: it makes system calls itself
//! (`raw_syscall!`, the instruction, not libc's `syscall()`, which the library hooks:
//! hooks/syscall.rs) or calls function pointers resolved with `dlsym(RTLD_NEXT)`.
//!
//! `raw_syscall!` widens every argument to `c_long` with `as`, so no register's upper
//! half is garbage (an mmap offset of "0" passed as an int became EOVERFLOW).

use core::fmt::{self, Write};
use core::sync::atomic::{AtomicUsize, Ordering};
use libc::{c_int, c_long, c_void};

/// The calling thread's errno.
pub(crate) fn errno() -> i32 {
    // SAFETY: __errno_location returns the calling thread's errno slot, always valid.
    unsafe { *libc::__errno_location() }
}

pub(crate) fn set_errno(e: i32) {
    // SAFETY: as in `errno`.
    unsafe { *libc::__errno_location() = e }
}

/// Turns a raw `syscall()` return into a result carrying the errno.
#[inline]
pub(crate) fn check(r: c_long) -> Result<usize, i32> {
    if r < 0 {
        Err(errno())
    } else {
        Ok(r as usize)
    }
}

/// Looks up the next definition of `name` after this library (glibc's).
/// Aborts with a message if it does not exist: every symbol we hook exists in glibc.
pub(crate) fn dlsym_next(name: &core::ffi::CStr) -> usize {
    // SAFETY: RTLD_NEXT with a NUL-terminated name is dlsym's documented use.
    let p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) };
    if p.is_null() {
        log_fmt(format_args!(
            "canal: fatal: cannot resolve the real {:?}\n",
            name
        ));
        // SAFETY: abort is always safe to call.
        unsafe { libc::abort() }
    }
    p as usize
}

/// Resolves the real libc function once per call site (a relaxed load afterwards).
/// Usage: `real!("read", unsafe extern "C" fn(c_int, *mut c_void, size_t) -> ssize_t)`.
macro_rules! real {
    ($name:literal, $ty:ty) => {{
        static P: core::sync::atomic::AtomicUsize = core::sync::atomic::AtomicUsize::new(0);
        $crate::sys::real_ptr(&P, $name)
            .map(|p| {
                #[allow(unused_unsafe)]
                // SAFETY: `p` is the address of glibc's function of this name, whose C
                // prototype is the one written at the call site.
                unsafe {
                    core::mem::transmute::<usize, $ty>(p)
                }
            })
            .unwrap()
    }};
}
pub(crate) use real;

#[inline]
pub(crate) fn real_ptr(cache: &AtomicUsize, name: &core::ffi::CStr) -> Option<usize> {
    let p = cache.load(Ordering::Relaxed);
    if p != 0 {
        return Some(p);
    }
    let p = dlsym_next(name);
    cache.store(p, Ordering::Relaxed);
    Some(p)
}

// ---- raw system calls -------------------------------------------------------------

/// `raw_syscall!(SYS_x, a, b, ...)`: system call `SYS_x` with up to six arguments, each
/// cast to `c_long`; like libc's `syscall()`, -1 with errno set on failure.
macro_rules! raw_syscall {
    ($n:expr $(, $a:expr)* $(,)?) => {
        $crate::sys::raw_syscall_args($n, &[$(($a) as libc::c_long),*])
    };
}
pub(crate) use raw_syscall;

/// The system call instruction with `args` (at most six), errno set from a failure.
///
/// # Safety
/// As the system call: pointer arguments must be what the kernel expects.
#[inline(always)]
pub(crate) unsafe fn raw_syscall_args(n: c_long, args: &[c_long]) -> c_long {
    let mut a = [0 as c_long; 6];
    a[..args.len()].copy_from_slice(args);
    // SAFETY: the caller's contract.
    let r = unsafe { raw_syscall6(n, a) };
    if (-4095..0).contains(&r) {
        set_errno(-r as i32);
        -1
    } else {
        r
    }
}

#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn raw_syscall6(n: c_long, a: [c_long; 6]) -> c_long {
    let r: c_long;
    // SAFETY: the Linux x86-64 system call convention; the kernel clobbers rcx and r11
    // only. Memory is not declared untouched: the call may read or write through its
    // pointer arguments.
    unsafe {
        core::arch::asm!(
            "syscall",
            inlateout("rax") n => r,
            in("rdi") a[0], in("rsi") a[1], in("rdx") a[2],
            in("r10") a[3], in("r8") a[4], in("r9") a[5],
            lateout("rcx") _, lateout("r11") _,
            options(nostack),
        );
    }
    r
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
compile_error!("libcanal makes its own system calls on x86-64 and arm64 only");

#[cfg(target_arch = "aarch64")]
#[inline(always)]
unsafe fn raw_syscall6(n: c_long, a: [c_long; 6]) -> c_long {
    let r: c_long;
    // SAFETY: the Linux arm64 system call convention (number in x8, result in x0).
    unsafe {
        core::arch::asm!(
            "svc 0",
            in("x8") n,
            inlateout("x0") a[0] => r,
            in("x1") a[1], in("x2") a[2], in("x3") a[3], in("x4") a[4], in("x5") a[5],
            options(nostack),
        );
    }
    r
}

pub(crate) fn read(fd: c_int, buf: &mut [u8]) -> Result<usize, i32> {
    // SAFETY: buf is a valid writable buffer of buf.len() bytes.
    check(unsafe {
        crate::sys::raw_syscall!(libc::SYS_read, fd as c_long, buf.as_mut_ptr(), buf.len())
    })
}

pub(crate) fn write(fd: c_int, buf: &[u8]) -> Result<usize, i32> {
    // SAFETY: buf is a valid readable buffer of buf.len() bytes.
    check(unsafe {
        crate::sys::raw_syscall!(libc::SYS_write, fd as c_long, buf.as_ptr(), buf.len())
    })
}

pub(crate) fn close(fd: c_int) -> Result<usize, i32> {
    // SAFETY: closing a descriptor has no memory-safety preconditions.
    check(unsafe { crate::sys::raw_syscall!(libc::SYS_close, fd as c_long) })
}

pub(crate) fn socket(domain: c_int, ty: c_int, proto: c_int) -> Result<c_int, i32> {
    // SAFETY: no pointers involved.
    check(unsafe {
        crate::sys::raw_syscall!(
            libc::SYS_socket,
            domain as c_long,
            ty as c_long,
            proto as c_long,
        )
    })
    .map(|v| v as c_int)
}

/// fcntl with an integer argument.
pub(crate) fn fcntl_int(fd: c_int, cmd: c_int, arg: c_long) -> Result<usize, i32> {
    // SAFETY: callers only use commands whose argument is an integer.
    check(unsafe { crate::sys::raw_syscall!(libc::SYS_fcntl, fd as c_long, cmd as c_long, arg) })
}

/// Makes descriptor number `fd` a copy of `src` (dup3), keeping the close-on-exec flag
/// `fd` had: the library swapping the file behind a number the program holds.
pub(crate) fn replace_fd(src: c_int, fd: c_int) -> Result<(), i32> {
    let cloexec = fcntl_int(fd, libc::F_GETFD, 0).is_ok_and(|f| f as c_int & libc::FD_CLOEXEC != 0);
    let flags = if cloexec { libc::O_CLOEXEC } else { 0 };
    // SAFETY: dup3 on descriptor numbers only.
    check(unsafe {
        crate::sys::raw_syscall!(libc::SYS_dup3, src as c_long, fd as c_long, flags as c_long)
    })
    .map(|_| ())
}

pub(crate) fn eventfd() -> Result<c_int, i32> {
    if confined() {
        return Err(libc::EPERM);
    }
    let flags = libc::EFD_CLOEXEC | libc::EFD_NONBLOCK;
    // SAFETY: no pointers involved.
    check(unsafe { crate::sys::raw_syscall!(libc::SYS_eventfd2, 0 as c_long, flags as c_long) })
        .map(|v| v as c_int)
}

/// Adds 1 to an eventfd (a wake-up / doorbell).
pub(crate) fn eventfd_signal(fd: c_int) -> Result<usize, i32> {
    write(fd, &1u64.to_ne_bytes())
}

/// Drains an eventfd (non-blocking).
pub(crate) fn eventfd_drain(fd: c_int) {
    let mut b = [0u8; 8];
    let _ = read(fd, &mut b);
}

/// A signal mask for ppoll: null (keep the thread's mask) or a sigset the application
/// gave to ppoll/pselect, passed to the kernel untouched.
#[derive(Clone, Copy)]
pub(crate) struct SigMask(pub *const libc::sigset_t);

impl SigMask {
    pub(crate) const NONE: SigMask = SigMask(core::ptr::null());
}

// ---- confinement ------------------------------------------------------------------------------
//
// A program may confine itself with a seccomp filter (sshd's pre-authentication child
// allows little more than read, write, poll, futex and nanosleep, and kills the process
// on anything else). From then on the library makes only the calls such filters allow:
// poll instead of ppoll, a short nanosleep instead of sched_yield, no membarrier, no
// getrusage, no new descriptors, a cached thread id (hooks::seccomp sets this up).

static CONFINED: core::sync::atomic::AtomicBool = core::sync::atomic::AtomicBool::new(false);

/// Whether the process runs under a seccomp filter the library did not see (see above).
#[inline]
pub(crate) fn confined() -> bool {
    CONFINED.load(core::sync::atomic::Ordering::Relaxed)
}

pub(crate) fn set_confined() {
    CONFINED.store(true, core::sync::atomic::Ordering::Relaxed);
}

/// How many seccomp filters /proc/self/status says are in force at start (a program
/// started by a sandboxing service manager, or under `canal run --isolate`); None
/// without a filter. Unknown (unreadable) counts as none.
pub(crate) fn seccomp_filters_at_start() -> Option<u32> {
    let mut buf = [0u8; 4096];
    // SAFETY: a NUL-terminated path; flags only.
    let fd = unsafe {
        crate::sys::raw_syscall!(
            libc::SYS_openat,
            libc::AT_FDCWD,
            c"/proc/self/status".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return None;
    }
    let n = read(fd as c_int, &mut buf).unwrap_or(0);
    let _ = close(fd as c_int);
    let text = &buf[..n];
    let field = |name: &[u8]| {
        let i = text.windows(name.len()).position(|w| w == name)? + name.len();
        let end = text[i..]
            .iter()
            .position(|&c| c == b'\n')
            .map_or(text.len(), |e| i + e);
        core::str::from_utf8(&text[i..end])
            .ok()?
            .trim()
            .parse::<u32>()
            .ok()
    };
    match field(b"Seccomp:\t") {
        Some(2) => Some(field(b"Seccomp_filters:\t").unwrap_or(u32::MAX)),
        _ => None,
    }
}

/// ppoll with an optional relative timeout in nanoseconds and an optional signal mask.
/// The library's sleeps pass placeholder entries (fd -1) and its own descriptors along
/// with the program's; a process whose RLIMIT_NOFILE is below the entry count (sshd's
/// sandboxed child sets 1) gets EINVAL from the kernel, so the call is retried with
/// only the live entries, and failing that becomes a short sleep (callers re-check).
pub(crate) fn ppoll(
    fds: &mut [libc::pollfd],
    timeout_ns: Option<i64>,
    sigmask: SigMask,
) -> Result<usize, i32> {
    match ppoll_raw(fds, timeout_ns, sigmask) {
        Err(libc::EINVAL) if fds.len() > 1 => {}
        r => return r,
    }
    const MAX: usize = 64;
    let mut live = [libc::pollfd {
        fd: -1,
        events: 0,
        revents: 0,
    }; MAX];
    let mut at = [0usize; MAX];
    let mut n = 0;
    for (i, p) in fds.iter_mut().enumerate() {
        p.revents = 0;
        if p.fd >= 0 {
            if n == MAX {
                return Err(libc::EINVAL);
            }
            live[n] = *p;
            at[n] = i;
            n += 1;
        }
    }
    match ppoll_raw(&mut live[..n], timeout_ns, sigmask) {
        Ok(r) => {
            for k in 0..n {
                fds[at[k]].revents = live[k].revents;
            }
            Ok(r)
        }
        Err(libc::EINVAL) if n > 0 => {
            sleep_ns(timeout_ns.map_or(1_000_000, |t| t.clamp(0, 1_000_000)));
            Ok(0)
        }
        r => r,
    }
}

/// A timeout in ns (None: forever) as poll's or epoll_wait's milliseconds: rounded
/// up, never negative, at most `c_int::MAX`; -1 for forever.
pub(crate) fn ns_ms(timeout_ns: Option<i64>) -> c_int {
    timeout_ns.map_or(-1, |ns| {
        (ns.max(0).saturating_add(999_999) / 1_000_000).min(c_int::MAX as i64) as c_int
    })
}

/// `ns` (not negative) as a timespec.
pub(crate) fn timespec_of(ns: i64) -> libc::timespec {
    libc::timespec {
        tv_sec: (ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    }
}

/// One ppoll(2) (or poll(2) when confined without a mask: see "confinement").
fn ppoll_raw(
    fds: &mut [libc::pollfd],
    timeout_ns: Option<i64>,
    sigmask: SigMask,
) -> Result<usize, i32> {
    if confined() && sigmask.0.is_null() {
        let ms = ns_ms(timeout_ns);
        // SAFETY: fds is a valid array of fds.len() pollfds.
        return check(unsafe {
            crate::sys::raw_syscall!(
                libc::SYS_poll,
                fds.as_mut_ptr(),
                fds.len() as libc::nfds_t,
                ms as c_long,
            )
        });
    }
    let ts = timeout_ns.map(|ns| timespec_of(ns.max(0)));
    let tsp = ts
        .as_ref()
        .map_or(core::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: fds is a valid array of fds.len() pollfds; tsp is null or points to a
    // live timespec; sigmask is null or a caller-provided sigset (size 8 for the
    // kernel's sigset).
    check(unsafe {
        crate::sys::raw_syscall!(
            libc::SYS_ppoll,
            fds.as_mut_ptr(),
            fds.len() as libc::nfds_t,
            tsp,
            sigmask.0,
            8usize,
        )
    })
}

thread_local! {
    /// The calling thread's id once asked (0: not yet).
    static TID: core::cell::Cell<i32> = const { core::cell::Cell::new(0) };
}

/// The calling thread's id, asked of the kernel once per thread (a confined process
/// may not be allowed to ask; see "confinement").
pub(crate) fn gettid() -> i32 {
    let ask = || {
        // SAFETY: no arguments.
        unsafe { crate::sys::raw_syscall!(libc::SYS_gettid) as i32 }
    };
    TID.try_with(|t| {
        if t.get() == 0 {
            t.set(ask());
        }
        t.get()
    })
    .unwrap_or_else(|_| ask())
}

/// Forgets the cached thread id (in a fork child the thread has a new one).
pub(crate) fn forget_tid() {
    let _ = TID.try_with(|t| t.set(0));
}

pub(crate) fn getpid() -> i32 {
    // SAFETY: no arguments.
    unsafe { crate::sys::raw_syscall!(libc::SYS_getpid) as i32 }
}

/// Whether a thread or process id is still alive (kill(pid, 0)).
pub(crate) fn alive(tid: i32) -> bool {
    if tid <= 0 {
        return false;
    }
    if confined() {
        return true; // cannot ask; a confined process does not take over others' locks
    }
    // SAFETY: signal 0 only checks existence.
    let r = unsafe { crate::sys::raw_syscall!(libc::SYS_kill, tid as c_long, 0 as c_long) };
    !(r < 0 && errno() == libc::ESRCH)
}

/// Sends SIGPIPE to the calling thread (what the kernel does on EPIPE).
pub(crate) fn raise_sigpipe() {
    // SAFETY: tgkill to ourselves with a valid signal number.
    unsafe {
        crate::sys::raw_syscall!(
            libc::SYS_tgkill,
            getpid() as c_long,
            gettid() as c_long,
            libc::SIGPIPE as c_long,
        );
    }
}

/// membarrier(2) with no flags; the command's result (a bit mask for QUERY).
pub(crate) fn membarrier(cmd: c_int) -> Result<i64, i32> {
    if confined() {
        return Err(libc::EPERM);
    }
    // SAFETY: membarrier takes two integers and touches no user memory.
    let r = unsafe {
        crate::sys::raw_syscall!(
            libc::SYS_membarrier,
            cmd as c_long,
            0 as c_long,
            0 as c_long,
        )
    };
    check(r).map(|v| v as i64)
}

pub(crate) fn sched_yield() {
    if confined() {
        sleep_ns(1_000);
        return;
    }
    // SAFETY: no arguments.
    unsafe {
        crate::sys::raw_syscall!(libc::SYS_sched_yield);
    }
}

/// How often the calling thread was preempted (involuntary context switches,
/// getrusage(RUSAGE_THREAD)); None if the kernel refuses.
pub(crate) fn thread_preemptions() -> Option<u64> {
    if confined() {
        return None;
    }
    // SAFETY: an all-zero rusage is a valid value; getrusage only writes into it.
    let mut ru: libc::rusage = unsafe { core::mem::zeroed() };
    // SAFETY: ru is a valid out-pointer for the call's duration.
    let r = unsafe {
        crate::sys::raw_syscall!(
            libc::SYS_getrusage,
            libc::RUSAGE_THREAD,
            &mut ru as *mut libc::rusage
        )
    };
    (r == 0).then_some(ru.ru_nivcsw as u64)
}

/// Blocks every signal the C library lets a program block in the calling thread and
/// returns the mask it had before.
pub(crate) fn block_signals() -> libc::sigset_t {
    // SAFETY: both sigsets are plain values owned here; sigfillset/pthread_sigmask only
    // write them (glibc leaves its own internal signals unblocked).
    unsafe {
        let mut all: libc::sigset_t = core::mem::zeroed();
        let mut old: libc::sigset_t = core::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
        old
    }
}

/// Restores a mask `block_signals` returned.
pub(crate) fn restore_signals(old: &libc::sigset_t) {
    // SAFETY: `old` is a valid sigset; a null old-mask pointer is allowed.
    unsafe {
        libc::pthread_sigmask(libc::SIG_SETMASK, old, core::ptr::null_mut());
    }
}

pub(crate) fn sleep_ns(ns: i64) {
    let ts = timespec_of(ns);
    // SAFETY: ts is a live timespec; the remainder pointer may be null.
    unsafe {
        crate::sys::raw_syscall!(
            libc::SYS_nanosleep,
            &ts as *const libc::timespec,
            core::ptr::null_mut::<libc::timespec>(),
        );
    }
}

/// Monotonic clock in nanoseconds (vDSO, not hooked).
pub(crate) fn now_ns() -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

/// Maps a memfd canald handed over (`size`: what canald says it holds) and closes the
/// descriptor: (base, mapped bytes). EIO unless the file is at least that size and the
/// size lies in 4096..=`max`.
pub(crate) fn map_memfd(fd: c_int, size: u64, max: u64) -> Result<(*mut u8, u64), i32> {
    let ok = matches!(file_size(fd), Ok(a) if a >= size) && (4096..=max).contains(&size);
    let base = if ok {
        mmap_shared(fd, size as usize)
    } else {
        Err(libc::EIO)
    };
    let _ = close(fd);
    Ok((base?, size))
}

/// mmap(MAP_SHARED) of `len` bytes of `fd` (or anonymous memory with fd = -1).
pub(crate) fn mmap_shared(fd: c_int, len: usize) -> Result<*mut u8, i32> {
    mmap_prot(fd, len, libc::PROT_READ | libc::PROT_WRITE)
}

/// mmap(MAP_SHARED, PROT_READ) of `len` bytes of `fd` (a file canald sealed against
/// writable mappings).
pub(crate) fn mmap_read(fd: c_int, len: usize) -> Result<*mut u8, i32> {
    mmap_prot(fd, len, libc::PROT_READ)
}

fn mmap_prot(fd: c_int, len: usize, prot: c_int) -> Result<*mut u8, i32> {
    let flags = if fd < 0 {
        libc::MAP_SHARED | libc::MAP_ANONYMOUS
    } else {
        libc::MAP_SHARED
    };
    // SAFETY: a fresh mapping chosen by the kernel; no existing memory is touched.
    let r = unsafe {
        crate::sys::raw_syscall!(
            libc::SYS_mmap,
            core::ptr::null_mut::<c_void>(),
            len,
            prot as c_long,
            flags as c_long,
            fd as c_long,
            0 as c_long,
        )
    };
    check(r).map(|p| p as *mut u8)
}

/// munmap of a mapping this library made with `mmap_shared`.
pub(crate) fn munmap(base: *mut u8, len: usize) {
    // SAFETY: the caller passes a mapping it made and no longer uses.
    let _ = unsafe { crate::sys::raw_syscall!(libc::SYS_munmap, base as *mut c_void, len) };
}

pub(crate) fn file_size(fd: c_int) -> Result<u64, i32> {
    fd_kind(fd).map(|(_, size)| size)
}

/// (is a directory, owner uid, mode) of `path` (NUL-terminated), not following a
/// symlink at its last component (a symlink reports "not a directory").
pub(crate) fn lstat_dir(path: &[u8]) -> Result<(bool, u32, u32), i32> {
    // SAFETY: stat is plain data; all-zero is a valid value.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    if path.last() != Some(&0) {
        return Err(libc::EINVAL);
    }
    // SAFETY: path is NUL-terminated; st is a valid out-pointer.
    check(unsafe {
        crate::sys::raw_syscall!(
            libc::SYS_newfstatat,
            libc::AT_FDCWD as c_long,
            path.as_ptr(),
            &mut st as *mut libc::stat,
            libc::AT_SYMLINK_NOFOLLOW as c_long,
        )
    })?;
    Ok((
        st.st_mode & libc::S_IFMT == libc::S_IFDIR,
        st.st_uid,
        st.st_mode & 0o7777,
    ))
}

/// (file type bits, size) of an open descriptor.
pub(crate) fn fd_kind(fd: c_int) -> Result<(u32, u64), i32> {
    let st = fstat(fd)?;
    Ok((st.st_mode & libc::S_IFMT, st.st_size as u64))
}

pub(crate) fn fstat(fd: c_int) -> Result<libc::stat, i32> {
    // SAFETY: stat is plain data; all-zero is a valid value.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: st is a valid out-pointer.
    check(unsafe {
        crate::sys::raw_syscall!(libc::SYS_fstat, fd as c_long, &mut st as *mut libc::stat)
    })?;
    Ok(st)
}

/// pread(2): up to `buf.len()` bytes at `off`.
pub(crate) fn pread(fd: c_int, buf: &mut [u8], off: u64) -> Result<usize, i32> {
    // SAFETY: buf is a valid writable buffer of buf.len() bytes.
    check(unsafe {
        crate::sys::raw_syscall!(
            libc::SYS_pread64,
            fd as c_long,
            buf.as_mut_ptr(),
            buf.len(),
            off as c_long,
        )
    })
}

/// Whether `fd` is an eventfd (its /proc link reads "anon_inode:[eventfd]").
pub(crate) fn is_eventfd(fd: c_int) -> bool {
    let mut path = LineBuf::new();
    let _ = fmt::Write::write_fmt(&mut path, format_args!("/proc/self/fd/{fd}\0"));
    let mut link = [0u8; 64];
    // SAFETY: path is NUL-terminated (LineBuf holds it); link is a live buffer.
    let n = unsafe {
        crate::sys::raw_syscall!(
            libc::SYS_readlinkat,
            libc::AT_FDCWD as c_long,
            path.as_bytes().as_ptr(),
            link.as_mut_ptr(),
            link.len(),
        )
    };
    n > 0 && &link[..n as usize] == b"anon_inode:[eventfd]"
}

/// The uid of the process at the other end of a connected Unix socket (SO_PEERCRED).
pub(crate) fn peer_uid(fd: c_int) -> Result<u32, i32> {
    peer_cred(fd).map(|c| c.uid)
}

/// A process descriptor for `pid` (close-on-exec), pollable: readable once it exits.
pub(crate) fn pidfd_open(pid: i32) -> Result<c_int, i32> {
    // SAFETY: pidfd_open takes a pid and flags (0: close-on-exec is implied).
    check(unsafe { crate::sys::raw_syscall!(libc::SYS_pidfd_open, pid as c_long, 0 as c_long) })
        .map(|fd| fd as c_int)
}

/// The credentials of the other end of a connected Unix socket (SO_PEERCRED): its pid
/// in our pid namespace (0 when not visible there).
pub(crate) fn peer_cred(fd: c_int) -> Result<libc::ucred, i32> {
    let mut c = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = core::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: the kernel writes at most `len` bytes into `c`.
    check(unsafe {
        crate::sys::raw_syscall!(
            libc::SYS_getsockopt,
            fd as c_long,
            libc::SOL_SOCKET as c_long,
            libc::SO_PEERCRED as c_long,
            &mut c as *mut libc::ucred,
            &mut len as *mut libc::socklen_t,
        )
    })?;
    Ok(c)
}

// ---- logging ------------------------------------------------------------------------

/// A fixed stack buffer for formatting log lines without allocating.
pub(crate) struct LineBuf {
    buf: [u8; 512],
    len: usize,
}

impl LineBuf {
    pub(crate) fn new() -> Self {
        LineBuf {
            buf: [0; 512],
            len: 0,
        }
    }
    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl Default for LineBuf {
    fn default() -> Self {
        Self::new()
    }
}

impl Write for LineBuf {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let n = s.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

/// Writes a formatted line to stderr with one raw write (errno preserved).
pub(crate) fn log_fmt(args: fmt::Arguments) {
    let e = errno();
    let mut b = LineBuf::new();
    let _ = b.write_fmt(args);
    let _ = write(2, b.as_bytes());
    set_errno(e);
}

/// FUTEX_WAIT (shared: the word may live in memory another process maps) while
/// `*word == val`, at most `timeout_ns`. Returns when woken, on timeout, on a signal
/// (Err(EINTR)), or at once if the value differs.
pub(crate) fn futex_wait(
    word: &core::sync::atomic::AtomicU32,
    val: u32,
    timeout_ns: i64,
) -> Result<(), i32> {
    let ts = timespec_of(timeout_ns);
    // SAFETY: word is a valid aligned u32 for the call; ts is a valid timespec.
    let r = unsafe {
        crate::sys::raw_syscall!(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT as c_long,
            val as c_long,
            &ts as *const libc::timespec,
        )
    };
    match check(r) {
        Err(libc::EINTR) => Err(libc::EINTR),
        _ => Ok(()),
    }
}

/// FUTEX_WAKE one waiter on `word` (shared futex).
pub(crate) fn futex_wake_one(word: &core::sync::atomic::AtomicU32) {
    // SAFETY: word is a valid aligned u32.
    let _ = unsafe {
        crate::sys::raw_syscall!(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE as c_long,
            1 as c_long,
        )
    };
}

/// FUTEX_WAKE every waiter on `word` (shared futex).
pub(crate) fn futex_wake_all(word: &core::sync::atomic::AtomicU32) {
    // SAFETY: word is a valid aligned u32.
    let _ = unsafe {
        crate::sys::raw_syscall!(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE as c_long,
            i32::MAX as c_long,
        )
    };
}
