//! What one seccomp server shares with its call threads.
use crate::guest::addr_view::GuestView;
use crate::guest::netview::NetView;
use std::os::fd::OwnedFd;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

/// Blocking calls (a blocking connect, accept or recvfrom) served at once, each on a
/// thread of its own; beyond this a call gets EAGAIN.
pub(crate) const MAX_BLOCKED: usize = 512;

/// The listener, the network and what the threads count.
pub(crate) struct Ctx {
    pub(crate) listener: OwnedFd,
    pub(crate) net: Arc<NetView>,
    pub(crate) loopback_only: bool,
    /// The registering user's destination policy (quota) and its counters.
    pub(crate) policy: Arc<crate::quota::GuestPolicy>,
    /// canald's own network namespace, as sockets report it.
    pub(crate) own_cookie: u64,
    pub(crate) blocked: AtomicUsize,
}

impl Ctx {
    pub(crate) fn view(&self) -> GuestView {
        GuestView {
            loopback_only: self.loopback_only,
            net: Some(self.net.clone()),
            policy: self.policy.clone(),
        }
    }
}
