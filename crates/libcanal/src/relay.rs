//! The bridge helper's side (bridge.rs): an image started with CANAL_BRIDGE relays
//! between its canal socket (descriptor 3) and Q (descriptor 4) from the library
//! constructor, with the library's own hooks as any program would, and exits without
//! running the program whose image it is.
use crate::bridge::{HELPER_Q, HELPER_SOCK, HELPER_TOKEN, VAR};
use crate::sys;
use libc::c_int;

/// Library constructor, in a helper image (CANAL_BRIDGE set, the guest rejoined):
/// relays until the connection is over, then exits without running the program.
pub(crate) fn at_start() {
    let Ok(v) = std::env::var(VAR) else { return };
    let ours = v == format!("{HELPER_SOCK},{HELPER_Q},{HELPER_TOKEN}");
    let code = if ours && crate::fdtable::TABLE.handle(HELPER_SOCK).is_some() {
        relay(HELPER_SOCK, HELPER_Q, HELPER_TOKEN)
    } else {
        2
    };
    // SAFETY: exit_group has no preconditions; a helper never returns to the program.
    unsafe { crate::sys::raw_syscall!(libc::SYS_exit_group, code as libc::c_long) };
}

/// One direction's bytes in flight.
struct Pipe {
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    /// The source said EOF.
    eof: bool,
    /// EOF passed on (shutdown(SHUT_WR) of the destination).
    shut: bool,
}

impl Pipe {
    fn new() -> Pipe {
        Pipe {
            buf: vec![0u8; 256 << 10].into_boxed_slice(),
            start: 0,
            end: 0,
            eof: false,
            shut: false,
        }
    }
    fn wants_input(&self) -> bool {
        !self.eof && self.end < self.buf.len()
    }
    fn has_output(&self) -> bool {
        self.end > self.start
    }
}

/// The relay loop: canal socket `s` ↔ Q. Returns the exit code.
/// While the receive token (`token`, bridge.rs) lives, the relay also receives.
fn relay(s: c_int, q: c_int, token: c_int) -> i32 {
    // SAFETY: ignoring SIGPIPE in our own process (writes to a closed Q report EPIPE).
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
    let fl = sys::fcntl_int(q, libc::F_GETFL, 0).unwrap_or(0) as libc::c_long;
    let _ = sys::fcntl_int(q, libc::F_SETFL, fl | libc::O_NONBLOCK as libc::c_long);
    let (mut down, mut up) = (Pipe::new(), Pipe::new()); // down: socket → Q; up: Q → socket
                                                         // Receiving stops for good once the token's last holder is gone: the socket's
                                                         // replies then stay for the processes that read it through the ring.
    let mut receiving = true;
    loop {
        let ev = |read: bool, write: bool| {
            (if read { libc::POLLIN } else { 0 }) | (if write { libc::POLLOUT } else { 0 })
        };
        let take = receiving && down.wants_input();
        let mut fds = [
            libc::pollfd {
                fd: s,
                events: ev(take, up.has_output()),
                revents: 0,
            },
            libc::pollfd {
                fd: q,
                events: ev(up.wants_input(), down.has_output()),
                revents: 0,
            },
            libc::pollfd {
                fd: if receiving { token } else { -1 },
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: fds is a valid array of three pollfds (our own poll hook: the canal
        // socket and the kernel descriptors together).
        let n = unsafe { crate::hooks::poll::poll(fds.as_mut_ptr(), 3, -1) };
        if n < 0 {
            if sys::errno() == libc::EINTR {
                continue;
            }
            return 3;
        }
        // Socket → Q.
        if fds[2].revents != 0 {
            // The token's write ends are all gone (it never carries data).
            receiving = false;
            let _ = sys::close(token);
        }
        if take && receiving && fds[0].revents != 0 {
            match io(s, &mut down.buf[down.end..], Dir::RecvSock) {
                Ok(0) => down.eof = true,
                Ok(k) => down.end += k,
                Err(libc::EAGAIN) => {}
                Err(_) => return finish(s, q, 0), // reset: the kernel end sees EOF
            }
        }
        if down.has_output() {
            match io(q, &mut down.buf[down.start..down.end], Dir::WriteQ) {
                Ok(k) => down.start += k,
                Err(libc::EAGAIN) => {}
                Err(_) => return finish(s, q, 0), // P closed everywhere
            }
        }
        // Q → socket.
        if up.wants_input() && fds[1].revents != 0 {
            match io(q, &mut up.buf[up.end..], Dir::ReadQ) {
                Ok(0) => up.eof = true,
                Ok(k) => up.end += k,
                Err(libc::EAGAIN) => {}
                Err(_) => return finish(s, q, 0),
            }
        }
        if up.has_output() {
            match io(s, &mut up.buf[up.start..up.end], Dir::SendSock) {
                Ok(k) => up.start += k,
                Err(libc::EAGAIN) => {}
                Err(_) => return finish(s, q, 0),
            }
        }
        for p in [&mut down, &mut up] {
            if p.start == p.end {
                (p.start, p.end) = (0, 0);
            }
        }
        if down.eof && !down.has_output() && !down.shut {
            // SAFETY: our own descriptor.
            unsafe { libc::shutdown(q, libc::SHUT_WR) };
            down.shut = true;
        }
        // EOF from Q with the hang-up: every copy of P is closed. That is a close, not a
        // shutdown: other descriptors of the socket (the parent's) keep it open, and
        // our reference goes (finish). EOF without it: someone shut P down for
        // writing, which natively shuts the socket down for everyone.
        let q_gone = fds[1].revents & (libc::POLLHUP | libc::POLLERR) != 0;
        if up.eof && !up.has_output() && q_gone {
            return finish(s, q, 0);
        }
        if up.eof && !up.has_output() && !up.shut {
            // SAFETY: our own descriptor (the canal socket: our shutdown hook).
            unsafe { crate::hooks::socket::shutdown(s, libc::SHUT_WR) };
            up.shut = true;
        }
        if down.shut && up.shut {
            return finish(s, q, 0);
        }
    }
}

fn finish(s: c_int, q: c_int, code: i32) -> i32 {
    // SAFETY: our own descriptors; close of the canal socket goes through our hook.
    unsafe {
        crate::hooks::fd::close(s);
        libc::close(q);
    }
    code
}

enum Dir {
    RecvSock,
    SendSock,
    ReadQ,
    WriteQ,
}

fn io(fd: c_int, buf: &mut [u8], dir: Dir) -> Result<usize, i32> {
    let p = buf.as_mut_ptr() as *mut libc::c_void;
    let n = buf.len();
    // SAFETY: buf is valid for n bytes; the canal calls go through our own hooks.
    let r = unsafe {
        match dir {
            Dir::RecvSock => crate::hooks::io::recv(fd, p, n, libc::MSG_DONTWAIT),
            Dir::SendSock => {
                crate::hooks::io::send(fd, p, n, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL)
            }
            Dir::ReadQ => libc::read(fd, p, n),
            Dir::WriteQ => libc::write(fd, p, n),
        }
    };
    if r < 0 {
        Err(sys::errno())
    } else {
        Ok(r as usize)
    }
}
