//! splice(2) with a canal socket at one end. The kernel moves pages between a socket
//! and a pipe; a canal socket's bytes are in its rings and its descriptor is a dummy,
//! so without this hook a splice from it read end-of-file and one into it wrote into
//! the dummy, where the bytes were lost. The library moves them itself and never takes
//! from one side more than the other accepts: from a socket it peeks, writes what the
//! pipe takes, then consumes exactly that; into a socket it reads from the pipe no
//! more than the socket takes (all it is given, when the socket blocks).
//!
//! Blocking follows splice(2): the pipe side does not block with SPLICE_F_NONBLOCK or
//! a non-blocking pipe; the socket side blocks unless the socket is non-blocking.
//! Natively one end must be a pipe (EINVAL otherwise), a pipe takes no offset
//! (ESPIPE) and a socket none either (EINVAL).
use crate::hooks::common::{canal, run, sock_of, Reentry};
use crate::sock::core::{RecvMeta, Sock};
use crate::sock::data;
use crate::sys;
use crate::sys::real;
use libc::{c_int, c_uint, loff_t, size_t, ssize_t};

/// At most this much per call (the kernel's default pipe holds 64 KiB).
const CHUNK: usize = 1 << 16;

type FnSplice =
    unsafe extern "C" fn(c_int, *mut loff_t, c_int, *mut loff_t, size_t, c_uint) -> ssize_t;

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn splice(
    fd_in: c_int,
    off_in: *mut loff_t,
    fd_out: c_int,
    off_out: *mut loff_t,
    len: size_t,
    flags: c_uint,
) -> ssize_t {
    let ours = (canal(fd_in), canal(fd_out));
    let guard = match ours {
        (None, None) => None,
        _ => Reentry::enter(),
    };
    if guard.is_none() {
        // SAFETY: forwarding the caller's own arguments to glibc's splice.
        return unsafe { real!(c"splice", FnSplice)(fd_in, off_in, fd_out, off_out, len, flags) };
    }
    let (at_in, at_out) = (!off_in.is_null(), !off_out.is_null());
    run(|| match ours {
        (Some(h), _) => {
            crate::conn::pin::set_current_fd(fd_in);
            let s = sock_of(h)?;
            check_ends(fd_out, at_out, at_in)?;
            socket_to_pipe(s, fd_out, len, flags)
        }
        (None, Some(h)) => {
            crate::conn::pin::set_current_fd(fd_out);
            let s = sock_of(h)?;
            check_ends(fd_in, at_in, at_out)?;
            pipe_to_socket(fd_in, s, len, flags)
        }
        (None, None) => Err(libc::EINVAL), // not reached: handled above
    })
}

/// The other end must be a pipe (a canal socket is not: EINVAL); an offset for the
/// pipe is ESPIPE, then one for the socket EINVAL (it cannot pread), in the kernel's
/// order.
fn check_ends(other: c_int, pipe_offset: bool, socket_offset: bool) -> Result<(), i32> {
    if canal(other).is_some() || sys::fd_kind(other)?.0 != libc::S_IFIFO {
        return Err(libc::EINVAL);
    }
    if pipe_offset {
        return Err(libc::ESPIPE);
    }
    if socket_offset {
        return Err(libc::EINVAL);
    }
    Ok(())
}

/// Whether the pipe side of this call must not block.
fn pipe_nonblocking(pipe: c_int, flags: c_uint) -> Result<bool, i32> {
    let fl = sys::fcntl_int(pipe, libc::F_GETFL, 0)? as c_int;
    Ok(flags & libc::SPLICE_F_NONBLOCK != 0 || fl & libc::O_NONBLOCK != 0)
}

/// Bytes queued in a pipe.
fn pipe_queued(pipe: c_int) -> Result<usize, i32> {
    let mut n: c_int = 0;
    // SAFETY: FIONREAD writes one int to a valid pointer.
    sys::check(unsafe {
        crate::sys::raw_syscall!(
            libc::SYS_ioctl,
            pipe as libc::c_long,
            libc::FIONREAD as libc::c_long,
            &mut n as *mut c_int,
        )
    })?;
    Ok(n.max(0) as usize)
}

/// Waits (or, `nonblocking`, only looks) until `pipe` reports `event`; the events it
/// reported. EAGAIN when it does not and must not wait; EINTR as the kernel's.
fn pipe_wait(pipe: c_int, event: i16, nonblocking: bool) -> Result<i16, i32> {
    let mut p = [libc::pollfd {
        fd: pipe,
        events: event,
        revents: 0,
    }];
    let timeout = if nonblocking { Some(0) } else { None };
    if sys::ppoll(&mut p, timeout, sys::SigMask::NONE)? == 0 {
        return Err(libc::EAGAIN);
    }
    Ok(p[0].revents)
}

/// socket → pipe: at most what the pipe has room for, peeked, written, then consumed.
fn socket_to_pipe(s: Sock, pipe: c_int, len: usize, flags: c_uint) -> Result<isize, i32> {
    if len == 0 {
        return Ok(0);
    }
    let nonblocking = pipe_nonblocking(pipe, flags)?;
    let capacity = sys::fcntl_int(pipe, libc::F_GETPIPE_SZ, 0)?;
    let room = loop {
        let room = capacity.saturating_sub(pipe_queued(pipe)?);
        if room > 0 {
            break room;
        }
        // Full: wait for the reader (POLLERR: it is gone, and the write says EPIPE).
        if pipe_wait(pipe, libc::POLLOUT, nonblocking)? & libc::POLLERR != 0 {
            break 1;
        }
    };
    let mut buf = vec![0u8; len.min(room).min(CHUNK)];
    let mut meta = RecvMeta::default();
    let iov = [crate::iov::single(buf.as_mut_ptr().cast(), buf.len())];
    let got = data::recv(s, &iov, libc::MSG_PEEK, &mut meta)?;
    if got == 0 {
        return Ok(0); // end of file
    }
    // No reader left: EPIPE, and the kernel's write raised SIGPIPE as splice would.
    let written = sys::write(pipe, &buf[..got])?;
    // The bytes the pipe took leave the socket; the rest stay queued for the next call.
    let iov = [crate::iov::single(buf.as_mut_ptr().cast(), written)];
    data::recv(s, &iov, 0, &mut meta)?;
    Ok(written as isize)
}

/// pipe → socket: waits for bytes in the pipe (end of file when it has no writer),
/// reads no more than the socket takes without blocking (when it must not block), and
/// queues every byte read.
fn pipe_to_socket(pipe: c_int, s: Sock, len: usize, flags: c_uint) -> Result<isize, i32> {
    if len == 0 {
        return Ok(0);
    }
    let nonblocking = pipe_nonblocking(pipe, flags)?;
    let queued = loop {
        let q = pipe_queued(pipe)?;
        if q > 0 {
            break q;
        }
        if pipe_wait(pipe, libc::POLLIN, nonblocking)? & libc::POLLHUP != 0
            && pipe_queued(pipe)? == 0
        {
            return Ok(0); // no writer left: the kernel's splice returns 0 too
        }
    };
    let mut want = len.min(queued).min(CHUNK);
    if s.nonblocking() && s.kind() == canal_abi::sock_kind::STREAM {
        // A datagram is one record whatever the room: the send below waits for it.
        want = match s.snapshot().tx_free() as usize {
            0 => return Err(libc::EAGAIN),
            room => want.min(room),
        };
    }
    let mut buf = vec![0u8; want];
    let got = sys::read(pipe, &mut buf)?;
    let mut sent = 0;
    while sent < got {
        let iov = [crate::iov::single(
            buf[sent..].as_mut_ptr().cast(),
            got - sent,
        )];
        match data::send(s, &iov, 0, None) {
            Ok(n) => sent += n,
            // Another thread filled the ring after we looked: wait for room rather than
            // drop bytes already taken from the pipe.
            Err(libc::EAGAIN) => {
                let _ =
                    crate::conn::wait::wait_until(s.g, s.idx, None, || s.snapshot().tx_free() > 0);
            }
            // The connection is over: what was not queued could not have been delivered.
            Err(e) => return if sent > 0 { Ok(sent as isize) } else { Err(e) },
        }
    }
    Ok(got as isize)
}
