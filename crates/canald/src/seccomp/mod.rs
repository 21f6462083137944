//! Programs LD_PRELOAD cannot reach — static binaries, Go — inside an isolated network,
//! served through seccomp user notification (the approach bypass4netns published;
//! docs/isolation.md, "Static and Go programs").
//!
//! `canal run --isolate` installs `filter_program()` in the program before exec and
//! hands canald the notification listener (control message SECCOMP). canald serves it
//! on a thread of its own with the network's view: `socket(AF_INET/AF_INET6)` gets a
//! socket canald creates in the host's namespace, installed in the program
//! (SECCOMP_IOCTL_NOTIF_ADDFD); connect, bind, accept, getsockname, getpeername and
//! sendto/recvfrom with an address are translated through the view; data then flows
//! through the kernel at its own speed, unnotified.
//!
//! **The invariant that makes races harmless.** A host socket the program holds is
//! either bound to its network's private loopback or its IPv6-only twin (every socket
//! is on the first from birth) or in
//! a state canald gave it after translating (bound where the view says, or connected
//! where the view allowed). A call canald lets through (SECCOMP_USER_NOTIF_FLAG_CONTINUE,
//! for descriptors that are not such sockets) could meet such a socket if the program
//! swapped descriptors meanwhile: bind then fails (already bound), and a connect or send
//! from the private loopback reaches only the host's loopback, which the guest reaches
//! as 10.0.2.2 anyway — never a host port that was not published.
#![forbid(unsafe_code)]

mod calls;
mod ctx;
pub mod filter;
pub(crate) mod installed;

use crate::guest::netview::NetView;
use crate::sys;
use ctx::Ctx;
use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

/// Serves `listener` for network `net` on a new thread until every program using
/// the filter has exited.
pub(crate) fn serve(
    listener: OwnedFd,
    net: Arc<NetView>,
    loopback_only: bool,
    policy: Arc<crate::quota::GuestPolicy>,
) -> io::Result<()> {
    let probe = sys::socket(libc::AF_INET, libc::SOCK_DGRAM, 0)?;
    let ctx = Arc::new(Ctx {
        listener,
        own_cookie: sys::netns_cookie(&probe)?,
        net,
        loopback_only,
        policy,
        blocked: AtomicUsize::new(0),
    });
    std::thread::Builder::new()
        .name("canald-seccomp".into())
        .spawn(move || run(ctx))?;
    Ok(())
}

fn run(ctx: Arc<Ctx>) {
    log::info!("seccomp: serving {}", ctx.net.name);
    loop {
        // The listener hangs up once no process uses the filter any more.
        match sys::wait_readable(&ctx.listener, -1) {
            Ok(true) if sys::hung_up(&ctx.listener) => break,
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
        let n = match sys::notif_recv(&ctx.listener) {
            Ok(n) => n,
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::EINTR)) => {
                continue
            }
            Err(e) => {
                log::info!("seccomp: {}: {e}", ctx.net.name);
                break;
            }
        };
        calls::handle(&ctx, n);
    }
    log::info!("seccomp: {} has no program left", ctx.net.name);
}
