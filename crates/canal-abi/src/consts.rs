//! The protocol's constants (docs/protocol.md): magic and versions, feature bits,
//! opcodes, slot states, sleep kinds, socket kinds and flags, errno values, handles.

/// "CANALRGN" read as a little-endian u64.
pub const MAGIC: u64 = u64::from_le_bytes(*b"CANALRGN");
/// Incompatible changes bump the major version; a guest refuses another major.
pub const VERSION_MAJOR: u16 = 1;
/// Compatible additions (new opcodes, new feature bits, use of reserved bytes that
/// old readers ignore) bump the minor version.
pub const VERSION_MINOR: u16 = 23;

/// canald's ivshmem peer id in a region with `feature::DOORBELL` (the header's
/// `doorbell_peer`; protocol §9.5).
pub const DOORBELL_HOST_PEER: u32 = 1;

/// Feature bits in the header. A guest must not use a feature the host did not set.
pub mod feature {
    /// Stream (TCP) sockets with byte rings.
    pub const STREAM: u64 = 1 << 0;
    /// Datagram (UDP) sockets with message rings.
    pub const DGRAM: u64 = 1 << 1;
    /// Per-slot wake-ups through an eventfd registered on the control socket. Absent
    /// (e.g. inside a VM) the guest waits with bounded backoff instead.
    pub const PORT_EVENTFD: u64 = 1 << 2;
    pub const ALL_V1: u64 = STREAM | DGRAM | PORT_EVENTFD;
    /// The guest may send WATCH (control socket, with SCM_RIGHTS): canald closes a
    /// socket when the guest's last descriptor of it is gone, as counted by the kernel.
    pub const WATCH: u64 = 1 << 3;
    /// Co-resident short-circuit (protocol §8, minor 1): stream entries may be backed
    /// by a pair segment (`SocketEntry::segment` ≠ 0). Set only for guests that
    /// announced `hello_flag::SHORTCUT`.
    pub const SHORTCUT: u64 = 1 << 4;
    /// Virtual RSS (protocol §6.3, minor 2): the guest's sockets may be owned by
    /// different canald workers (`SocketEntry::owner`); attention kicks go to the
    /// owner's `worker_sleeping` word and doorbell (DOORBELLS). Set only for guests
    /// that announced `hello_flag::VRSS`, when canald runs more than one worker.
    pub const VRSS: u64 = 1 << 5;
    /// Buffer zones (protocol §10, minor 2): a pair segment given to this guest may
    /// carry zones (`segment::SEG_FLAG_ZONES`). Set only with `canald --zones on` and
    /// for guests that announced `hello_flag::ZONES`.
    pub const ZONES: u64 = 1 << 6;
    /// VM region served with ivshmem doorbells (protocol §9.5, minor 2): the header's
    /// `doorbell_peer` / `doorbell_vectors` are valid; a guest that can ring the
    /// device's Doorbell register must do so to kick, and interrupt vector *i* of the
    /// guest's peer wakes slot *i*. A guest that cannot ring counts itself in
    /// `backoff_kickers`. Old guests refuse such a region (unknown bit).
    pub const DOORBELL: u64 = 1 << 7;
    /// Spare stream sockets (minor 5): the host keeps a few fresh AF_INET stream
    /// sockets in the header's spare ring, and `socket()` takes one without a
    /// request. Set only for guests that announced `hello_flag::SPARES`.
    pub const SPARES: u64 = 1 << 8;
    /// Pair arenas (protocol §8.7, minor 7): a pair segment may be a slot of an arena
    /// shared by the two guests (`SocketEntry::arena` ≠ 0); the guest maps the arena
    /// once (control ARENA) and finds each later segment in it without a request.
    /// Set only for guests that announced `hello_flag::ARENAS`.
    pub const ARENAS: u64 = 1 << 9;
    /// Direct peer wake-ups (protocol §8.8, minor 8): a thread sleeping on arena
    /// connections registers a bell eventfd per peer guest (BELL_SET) and names it in
    /// the segment's bell word; the peer, given the bell by canald (BELL_GET), wakes
    /// it without canald. Set only with ARENAS, for guests that announced
    /// `hello_flag::BELLS`.
    pub const BELLS: u64 = 1 << 10;
    /// Exclusive accept wake-ups (protocol §6, minor 10): a thread blocked in
    /// accept() sleeps with `wait_socket` = index | `WAIT_ACCEPT`, and canald wakes
    /// such sleepers of a listener only as many as it has connections waiting, as
    /// the kernel wakes one exclusive waiter per connection. Set only for guests that
    /// announced `hello_flag::ACCEPT_ONE`.
    pub const ACCEPT_ONE: u64 = 1 << 11;
    /// Close marks (protocol §4 Close, minor 11): canald reads `SocketEntry::close_mark`
    /// when it serves a socket's attention bit and closes a socket whose mark is its
    /// handle. A guest process that has never shared its descriptors (no fork, exec,
    /// spawn, bridge or SCM_RIGHTS yet) then gives its sockets lone dummies without a
    /// WATCH and closes them by a mark. Set only for guests that announced
    /// `hello_flag::CLOSE_MARK`.
    pub const CLOSE_MARK: u64 = 1 << 12;
    /// Control messages in datagram records (protocol §5, minor 12): a DATAGRAM
    /// record's address section may be longer than the 32-byte address, the rest
    /// being control messages in the kernel's layout (`canal_abi::cmsg`): on tx the
    /// ones `sendmsg` was given that canal carries (packet info, TTL, TOS, hop limit,
    /// traffic class, don't-fragment, UDP segment size), on rx what the host socket's
    /// `recvmsg` produced. Set for every guest; a guest sends control only when set.
    pub const DGRAM_CONTROL: u64 = 1 << 13;
    /// Datagram parts (protocol §5, minor 12): a tx record may be of kind
    /// `DATAGRAM_MORE`, a program's `send` with MSG_MORE, which the host sends with
    /// MSG_MORE so that the next record completes the same datagram. Set for every
    /// guest; a guest writes such records only when set.
    pub const DGRAM_MORE: u64 = 1 << 14;
    /// Packed pair arenas (protocol §8.7, minor 15): an arena between two guests
    /// that both have this bit may be `segment::ArenaLayout::Packed` (its slots'
    /// headers together, 512 bytes each); the guest tells the layout from the
    /// arena's length. Set only with ARENAS, for guests that announced
    /// `hello_flag::PACKED_ARENAS`.
    pub const PACKED_ARENAS: u64 = 1 << 15;
    /// Native peers on kernel sockets (protocol §2 DIRECTORY, minor 17): the guest
    /// may give a new TCP or UDP socket a kernel socket of its own and keep it there
    /// when its first address is not a canal port (the port directory says so), so
    /// a connection to a native peer never passes through canald. Set only for a
    /// process guest in canald's own network without a destination policy, rate
    /// quota or socket quota (it could make such sockets itself), with `canald --direct on` (the
    /// default), for a guest that announced `hello_flag::DIRECT`.
    pub const DIRECT: u64 = 1 << 16;
    /// Native clients accepted by the guest itself (protocol §2 LISTENER_SOCKET,
    /// minor 18): a listener of such a guest carries `sock_flag::NATIVE_ACCEPT`;
    /// canald no longer accepts on its host socket but tells the guest when the
    /// kernel has clients queued (`sock_flag::NATIVE_QUEUED`), and the guest accepts
    /// them on a copy of that socket, so a native client's connection is the guest's
    /// own kernel socket. Clients that are canal guests still come as ACCEPT records.
    /// Set only with DIRECT, for a guest that announced `hello_flag::NATIVE_ACCEPT`.
    pub const NATIVE_ACCEPT: u64 = 1 << 17;
    /// The guest may send control CLOSE_CHECK (protocol §2, minor 19): close a socket
    /// now if its WATCH says no descriptor of it is left. Set for every process
    /// guest.
    pub const CLOSE_CHECK: u64 = 1 << 18;
    /// A relayed listener says when the kernel holds clients canald has not taken
    /// (protocol §5 Accept, minor 20: `sock_flag::HOST_QUEUED`), and takes none of
    /// them before the program's first accept asks, so a burst before that accept
    /// meets the kernel's one queue. Set for a guest that announced
    /// `hello_flag::HOST_QUEUED`.
    pub const HOST_QUEUED: u64 = 1 << 19;
    /// A NATIVE_ACCEPT listener's host queue is looked at only while the guest relies
    /// on it (protocol §2 Native accepts, minor 21): canald watches the host listener
    /// for one arrival after LISTEN, then not again until the guest sets
    /// `guest_flag::NATIVE_LOOKS` in the listener's entry (an epoll set holds it, or
    /// a process has no copy to look at itself) and raises its attention. A server
    /// whose threads block in accept(), or poll it, on the copy is then served by
    /// the kernel alone: no canald wake-up per native client. Set with NATIVE_ACCEPT
    /// for a guest that announced `hello_flag::NATIVE_QUIET`.
    pub const NATIVE_QUIET: u64 = 1 << 20;
    /// Fast connects (protocol §8.10, minor 22): canald keeps tickets for the
    /// listeners the guest connected to ring to ring in the region header's table
    /// (`fast::Table`), and reads the marks the guest's connects leave. Set only for
    /// a guest that announced `hello_flag::FAST_CONNECT`, with packed arenas, outside
    /// a network's view and without a policy.
    pub const FAST_CONNECT: u64 = 1 << 21;
    /// Every bit this version understands (the optional ones included).
    pub const KNOWN: u64 = ALL_V1
        | WATCH
        | SHORTCUT
        | VRSS
        | ZONES
        | DOORBELL
        | SPARES
        | ARENAS
        | BELLS
        | ACCEPT_ONE
        | CLOSE_MARK
        | DGRAM_CONTROL
        | DGRAM_MORE
        | PACKED_ARENAS
        | DIRECT
        | NATIVE_ACCEPT
        | HOST_QUEUED
        | NATIVE_QUIET
        | FAST_CONNECT
        | CLOSE_CHECK;
}

/// Request opcodes (the `op` field of a slot). Data moves through rings, not requests.
pub mod op {
    /// args: [domain, type (SOCK_STREAM|SOCK_DGRAM, flags stripped), protocol].
    /// result: socket handle.
    pub const SOCKET: u32 = 1;
    /// payload: CanalAddr.
    pub const BIND: u32 = 2;
    /// args: [backlog].
    pub const LISTEN: u32 = 3;
    /// payload: CanalAddr. result: 0, or -EINPROGRESS (completion is reported through
    /// the socket's flags and pending_error), or -errno.
    pub const CONNECT: u32 = 4;
    /// Drops the guest's last reference. The host finishes sending what is queued.
    pub const CLOSE: u32 = 5;
    /// args: [how] (SHUT_RD=0, SHUT_WR=1, SHUT_RDWR=2). SHUT_WR takes effect on the
    /// host once the transmit ring is drained.
    pub const SHUTDOWN: u32 = 6;
    /// args: [level, optname]; payload: option value (in_len bytes).
    pub const SETSOCKOPT: u32 = 7;
    /// args: [level, optname, optlen]; out payload: value (out_len bytes).
    pub const GETSOCKOPT: u32 = 8;
    /// out payload: CanalAddr.
    pub const GETSOCKNAME: u32 = 9;
    /// out payload: CanalAddr.
    pub const GETPEERNAME: u32 = 10;
    /// Does nothing; measures the request path.
    pub const NOP: u32 = 11;
    pub const MAX: u32 = 11;
}

/// GETSOCKOPT at canal's own level: host socket figures the kernel gives only by
/// ioctl (protocol §4). A canald that predates them answers ENOPROTOOPT.
pub mod canal_opt {
    /// The level ("CNL"): no kernel protocol level has this number.
    pub const LEVEL: i32 = 0x43_4e_4c;
    /// i32: the tx ring's bytes canald has not taken plus the host socket's SIOCOUTQ
    /// (bytes not yet acknowledged, or a datagram socket's queued bytes).
    pub const OUTQ: i32 = 1;
    /// i32: the same with the host socket's SIOCOUTQNSD (bytes not yet sent).
    pub const OUTQ_NOT_SENT: i32 = 2;
}

/// Slot states (the INR's state flag).
pub mod slot_state {
    /// Not owned by any guest thread.
    pub const FREE: u32 = 0;
    /// Owned by a guest thread, no request outstanding.
    pub const IDLE: u32 = 1;
    /// Filled by the guest and enqueued.
    pub const REQUESTED: u32 = 2;
    /// Taken by the host.
    pub const BUSY: u32 = 3;
    /// Result written by the host.
    pub const DONE: u32 = 4;
}

/// What a sleeping guest thread waits for (the slot's `sleep` word).
pub mod sleep_kind {
    pub const AWAKE: u32 = 0;
    /// Waiting for its own request to reach DONE.
    pub const COMPLETION: u32 = 1;
    /// Waiting for readiness of `wait_socket` (or any socket if WAIT_ANY).
    pub const EVENTS: u32 = 2;
}

/// `wait_socket` value meaning "any socket of this region".
pub const WAIT_ANY: u32 = u32::MAX;
/// `wait_socket` bit (with `feature::ACCEPT_ONE`, never in WAIT_ANY's sense): the
/// thread is blocked in accept() on the listener in the low bits.
pub const WAIT_ACCEPT: u32 = 1 << 31;

/// Socket kinds (entry `kind`).
pub mod sock_kind {
    pub const FREE: u32 = 0;
    pub const STREAM: u32 = 1;
    pub const DGRAM: u32 = 2;
    /// A stream socket after a successful LISTEN; its rx ring carries ACCEPT records.
    pub const LISTENER: u32 = 3;
}

/// Host-written socket flags (entry `flags`).
pub mod sock_flag {
    /// A non-blocking connect is under way.
    pub const CONNECTING: u32 = 1 << 0;
    /// Connected (stream) or has a default peer (datagram).
    pub const CONNECTED: u32 = 1 << 1;
    pub const LISTENING: u32 = 1 << 2;
    /// The peer will send no more: after the rx ring drains, recv returns 0.
    pub const RX_EOF: u32 = 1 << 3;
    /// Sending is over (peer reset, EPIPE, or our SHUT_WR done): send fails with EPIPE.
    pub const TX_CLOSED: u32 = 1 << 4;
    /// The connection failed or was reset; `pending_error` says why.
    pub const ERROR: u32 = 1 << 5;
    /// Both directions are finished (POLLHUP).
    pub const HUP: u32 = 1 << 6;
    /// The host stopped filling the rx ring because it was full: the guest sets the
    /// socket's attention bit and kicks after freeing space.
    pub const RX_WANT_SPACE: u32 = 1 << 7;
    /// The host broke off this socket because the guest violated the protocol.
    pub const BROKEN: u32 = 1 << 8;
    /// The guest closed it; the host is finishing.
    pub const CLOSING: u32 = 1 << 9;
    /// (minor 5) Listener: connections are queued for it that the host cannot give
    /// the guest, its socket quota being used up. While set, the listener is
    /// readable and accept without a queued record fails with EMFILE, as the
    /// kernel's does for a process at its descriptor limit; cleared once an entry is
    /// free and the host accepts again.
    pub const NO_ENTRY: u32 = 1 << 10;
    /// (minor 5) The host holds the guest's WATCH descriptor for this socket: the last
    /// close of the guest's descriptors closes it (the kernel reports the WATCH end's
    /// hang-up), so a connected stream's close needs no CLOSE request.
    pub const WATCHED: u32 = 1 << 11;
    /// (HOST_SOCKET) The host handed this socket's host socket to the guest, whose
    /// program passed it on with SCM_RIGHTS: the host no longer serves it. A process
    /// of the guest still holding a descriptor of it asks for the host socket too
    /// (HOST_SOCKET again) and puts it in place of its descriptors before any call.
    pub const HANDED_OVER: u32 = 1 << 12;
    /// (minor 18, `feature::NATIVE_ACCEPT`) Listener: native clients are accepted by
    /// the guest on a copy of the host listener (control LISTENER_SOCKET), not by
    /// canald; the rx ring carries only the ACCEPT records of canal clients.
    pub const NATIVE_ACCEPT: u32 = 1 << 13;
    /// (minor 18) Such a listener's host socket had clients queued when canald last
    /// looked (an epoll event, or the guest's attention after an accept that found
    /// none): the listener is readable. canald looks again, and clears it, when the
    /// guest raises the listener's attention bit.
    pub const NATIVE_QUEUED: u32 = 1 << 14;
    /// (minor 20, `feature::HOST_QUEUED`) A relayed listener's host socket had
    /// clients queued that canald had not taken when it last looked: the listener is
    /// readable. canald takes none before the program's first accept asks, so that
    /// until then the kernel's queue is the only one; afterwards it accepts ahead as
    /// before, and the flag says the kernel holds more than canald took. An accept
    /// that finds no record while it is set raises the listener's attention and waits
    /// for canald's answer, even when non-blocking: a record, or the flag cleared
    /// (then EAGAIN, as natively for a queue found empty).
    pub const HOST_QUEUED: u32 = 1 << 15;
}

/// Linux errno values used in results (results are `-errno`). Both sides are Linux;
/// the numbers are part of the ABI.
pub mod errno {
    pub const EPERM: i32 = 1;
    pub const ENOENT: i32 = 2;
    pub const EBADF: i32 = 9;
    pub const EEXIST: i32 = 17;
    pub const EAGAIN: i32 = 11;
    pub const ENOMEM: i32 = 12;
    pub const EACCES: i32 = 13;
    pub const EFAULT: i32 = 14;
    pub const EINVAL: i32 = 22;
    pub const EMFILE: i32 = 24;
    pub const ENOSPC: i32 = 28;
    pub const EPIPE: i32 = 32;
    pub const ENOSYS: i32 = 38;
    pub const ENOTSOCK: i32 = 88;
    pub const EMSGSIZE: i32 = 90;
    pub const EPROTOTYPE: i32 = 91;
    pub const ENOPROTOOPT: i32 = 92;
    pub const EPROTONOSUPPORT: i32 = 93;
    pub const EOPNOTSUPP: i32 = 95;
    pub const EAFNOSUPPORT: i32 = 97;
    pub const EADDRINUSE: i32 = 98;
    pub const EADDRNOTAVAIL: i32 = 99;
    pub const ENETUNREACH: i32 = 101;
    pub const ENOBUFS: i32 = 105;
    pub const EISCONN: i32 = 106;
    pub const ENOTCONN: i32 = 107;
    pub const ECONNRESET: i32 = 104;
    pub const ETIMEDOUT: i32 = 110;
    pub const ECONNREFUSED: i32 = 111;
    pub const EALREADY: i32 = 114;
    pub const EINPROGRESS: i32 = 115;
    pub const EIO: i32 = 5;
}

/// Socket handles name a socket-table entry and its generation, so a handle kept
/// after the entry was reused is rejected: `handle = generation << 16 | index`.
pub const fn make_handle(index: u32, generation: u32) -> u32 {
    (generation << 16) | (index & 0xffff)
}
pub const fn handle_index(handle: u32) -> u32 {
    handle & 0xffff
}
pub const fn handle_generation(handle: u32) -> u32 {
    handle >> 16
}
