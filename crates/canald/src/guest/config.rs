//! Per-guest settings (`GuestConfig`) and the sizing rules of rings and drains.
use canal_abi::Layout;
use std::time::Duration;

/// A closed stream keeps draining its transmit ring as long as the peer takes bytes:
/// it is reset only after this long without progress (the kernel keeps an orphaned
/// connection for as long; `tcp_fin_timeout`'s default). Bytes a guest's `send`
/// accepted are thus delivered after `close` or `exit` as natively, and where they
/// cannot be the peer sees a reset, never a clean end of stream.
pub(crate) const DRAIN_STALL: Duration = Duration::from_secs(60);

/// Largest datagram canald receives in one call.
pub(crate) const DGRAM_MAX: usize = 65536;

/// The smallest ring a socket is given when the data area is short of the configured
/// size (one allocation chunk).
pub(crate) const MIN_RING: u64 = canal_abi::DATA_CHUNK;

/// `ring` halved (not below MIN_RING) until a data area of `data` bytes holds eight
/// rings: four sockets' tx and rx.
pub(crate) fn ring_for_four_sockets(mut ring: u64, data: u64) -> u64 {
    while ring > MIN_RING && 8 * ring > data {
        ring /= 2;
    }
    ring
}

/// Per-guest limits and sizes (from the command line).
#[derive(Clone, Debug)]
pub(crate) struct GuestConfig {
    pub(crate) layout: Layout,
    /// Bytes of each ring (tx and rx) given to a socket.
    pub(crate) ring_size: u64,
    /// Requests served per guest per round.
    pub(crate) budget: usize,
    /// Only loopback destinations are allowed (fuzzing, tests).
    pub(crate) loopback_only: bool,
    /// Largest byte count of one host send/receive call on a stream (`--no-batch`
    /// sets one guest send's worth; else unlimited: one writev/readv per batch).
    pub(crate) chunk: u64,
    /// Receive and transmit bytes a guest may move per round (deficit round robin).
    pub(crate) rx_quantum: u64,
    pub(crate) tx_quantum: u64,
    /// The guest network's own address view (a VM, an isolated namespace); None for
    /// a process guest in canald's namespace.
    pub(crate) net: Option<std::sync::Arc<crate::guest::netview::NetView>>,
    /// A VM guest (`vm.rs`): an ivshmem region, no eventfds.
    pub(crate) vm: bool,
    /// Its destination policy and quota counters (shared with its view's holders).
    pub(crate) policy: std::sync::Arc<crate::quota::GuestPolicy>,
}

impl GuestConfig {
    /// Defaults for everything but the layout.
    pub(crate) fn with_layout(layout: Layout, ring_size: u64) -> GuestConfig {
        GuestConfig {
            layout,
            ring_size,
            budget: 16,
            loopback_only: false,
            chunk: u64::MAX,
            rx_quantum: 256 << 10,
            tx_quantum: 1 << 20,
            net: None,
            vm: false,
            policy: Default::default(),
        }
    }
}

// ---- epoll tokens -----------------------------------------------------------------
