//! The control socket protocol (a Unix SOCK_SEQPACKET socket): attaching a guest,
//! registering wake-up ports, and asking canald for its listing. Rare messages; the
//! data path never uses it. Every message starts with a 16-byte header.

/// "CNLC" little-endian.
pub const CTL_MAGIC: u32 = u32::from_le_bytes(*b"CNLC");
pub const CTL_VERSION: u16 = 1;
pub const CTL_HEADER: usize = 16;
/// Largest message canald reads.
pub const CTL_MAX: usize = 64 * 1024;

/// Message kinds.
pub mod kind {
    /// guest → host: body `Hello`. Reply: HELLO_OK with SCM_RIGHTS [region memfd,
    /// doorbell eventfd], or ERROR.
    pub const HELLO: u16 = 1;
    /// host → guest: body `HelloOk`.
    pub const HELLO_OK: u16 = 2;
    /// guest → host: body `u32 slot` + SCM_RIGHTS [eventfd]. Reply: PORT_OK or ERROR.
    pub const PORT: u16 = 3;
    pub const PORT_OK: u16 = 4;
    /// any → host: optional body `format: u32` (0 JSON, 1 text table). Reply: one or more STAT_CHUNK messages whose bodies
    /// concatenate to a JSON document; the last one has an empty body.
    pub const STAT: u16 = 5;
    pub const STAT_CHUNK: u16 = 6;
    /// host → any: body `i32 errno` then UTF-8 text.
    pub const ERROR: u16 = 7;
    /// guest → host: body `u32 handle` + SCM_RIGHTS [one end of a Unix socketpair
    /// whose other end is the socket's descriptor in the guest]. No reply (invalid
    /// ones are ignored). Only with `feature::WATCH`.
    pub const WATCH: u16 = 8;
    /// guest → host: body `id: u32` (a pair-segment id from a socket entry). Reply:
    /// SEGMENT_OK with SCM_RIGHTS [segment memfd], or ERROR (ENOENT: no such segment
    /// of this guest).
    pub const SEGMENT: u16 = 9;
    /// host → guest: body `id: u32, reserved: u32, size: u64`.
    pub const SEGMENT_OK: u16 = 10;
    /// host tool → host: body VM_REGION_BODY below (encoded by canald::vm::VmRegion): a
    /// VM guest's region as a named file a hypervisor maps (protocol.md §9). Reply:
    /// VM_REGION_OK or ERROR. The VM guest lives until this connection closes or its VM
    /// process (VM_PID) exits.
    pub const VM_REGION: u16 = 11;
    /// host → tool: `guest_id u32, doorbell_vectors u32, region_size u64, file_size
    /// u64`, then the file's path (UTF-8, to the end of the body); with
    /// `doorbell_vectors` ≠ 0 (a VM_REGION with `vm_flag::DOORBELL`), the path is
    /// followed by a NUL and the path of the VM's ivshmem server socket.
    pub const VM_REGION_OK: u16 = 12;
    /// host tool → host: `pid u32` (the VM process, e.g. QEMU), optionally with a pidfd
    /// of it in SCM_RIGHTS. Reply: VM_PID_OK (empty) or ERROR.
    pub const VM_PID: u16 = 13;
    pub const VM_PID_OK: u16 = 14;
    /// guest → host, only with `feature::VRSS`: empty body. Reply: DOORBELLS_OK with
    /// body `count: u32` and SCM_RIGHTS [one doorbell eventfd per worker, in worker
    /// order], or ERROR. Sent after HELLO_OK and again by an exec'd image (rejoin).
    pub const DOORBELLS: u16 = 15;
    pub const DOORBELLS_OK: u16 = 16;
    /// host tool → host: body NETWORK_BODY below + SCM_RIGHTS [a network namespace
    /// descriptor]: guests that attach from that namespace share one address view
    /// with these published ports (protocol.md §2, §9.3). Only from a peer in canald's own
    /// namespace. Reply: NETWORK_OK or ERROR. The registration lasts while this
    /// connection is open; the view, while guests use it.
    pub const NETWORK: u16 = 17;
    /// host → tool: `lo [u8; 4]` (the host address standing for the network's own
    /// addresses), `dns_ip [u8; 4], dns_port u16` (where the guest's 10.0.2.3:53
    /// goes; port 0: nowhere), two zero bytes.
    pub const NETWORK_OK: u16 = 18;
    /// host tool → host, on a connection that sent NETWORK: empty body + SCM_RIGHTS
    /// [a seccomp user-notification listener] of the filter the tool installed in the
    /// network's program (protocol.md §2): canald serves its notified socket calls
    /// through the network's view. Reply: SECCOMP_OK (empty) or ERROR.
    pub const SECCOMP: u16 = 19;
    pub const SECCOMP_OK: u16 = 20;
    /// guest → host: body `segment: u32` — 0 for the guest's own event log, else a
    /// pair segment of this guest, for the event log of the guest at its other side
    /// (protocol.md §8.6). Reply: EVLOG_OK with SCM_RIGHTS [the log's memfd], or ERROR
    /// (ENOENT: no such segment, or that guest has no log).
    pub const EVLOG: u16 = 21;
    /// host → guest: body `owner: u32` (the log's owner key, as in a segment header's
    /// `owners`), `reserved: u32`, `size: u64`.
    pub const EVLOG_OK: u16 = 22;
    /// guest → host, only with `feature::ARENAS`: body `arena: u32` (an arena id from
    /// a socket entry). Reply: ARENA_OK with SCM_RIGHTS [the arena's memfd], or ERROR
    /// (ENOENT: no such arena of this guest). protocol.md §8.7.
    pub const ARENA: u16 = 23;
    /// host → guest: body `arena: u32, slots: u32, size: u64` (the SEGMENT_OK shape).
    pub const ARENA_OK: u16 = 24;
    /// guest → host, only with `feature::BELLS`: body `arena: u32, tag: u32` +
    /// SCM_RIGHTS [an eventfd]: the calling thread's bell (tag `tag`, protocol §8.8)
    /// for the guest at the other side of `arena`. Reply: BELL_OK (no fd) or ERROR
    /// (ENOENT: not one of this guest's arenas; EINVAL: a bad tag or not an eventfd;
    /// ENOSPC: too many bells).
    pub const BELL_SET: u16 = 25;
    /// guest → host, only with `feature::BELLS`: body `arena: u32, tag: u32`: the bell
    /// that the guest at the other side of `arena` registered with `tag` for the
    /// asker. Reply: BELL_OK with SCM_RIGHTS [that eventfd], or ERROR (ENOENT).
    pub const BELL_GET: u16 = 26;
    /// host → guest: body `arena: u32, tag: u32` (the request's).
    pub const BELL_OK: u16 = 27;
    /// guest → host: body `handle: u32`, a listener or a stream not yet connected
    /// that the guest's program passes with SCM_RIGHTS. canald takes the socket out of
    /// its table (entry freed, queued connections reset) and gives its host socket to
    /// the guest. Reply: HOST_SOCKET_OK, or ERROR (EBADF: no such socket;
    /// EOPNOTSUPP: not a listener or unconnected stream, a guest with a network view
    /// of its own, or an unconnected stream under a destination policy).
    /// protocol.md §2.
    pub const HOST_SOCKET: u16 = 28;
    /// host → guest: body `handle: u32` (the request's) + SCM_RIGHTS [the host socket].
    pub const HOST_SOCKET_OK: u16 = 29;
    /// guest → host, only with `feature::DIRECT`: no body. Reply: DIRECTORY_OK with
    /// SCM_RIGHTS [the port directory's memfd, sealed against writable mappings and
    /// resizing], or ERROR (EOPNOTSUPP without the feature). protocol.md §2.
    pub const DIRECTORY: u16 = 30;
    /// host → guest: body `size: u64` (`directory::SIZE`).
    pub const DIRECTORY_OK: u16 = 31;
    /// guest → host, only with `feature::NATIVE_ACCEPT`: body `handle: u32`, a
    /// listener with `sock_flag::NATIVE_ACCEPT`. Reply: LISTENER_SOCKET_OK with
    /// SCM_RIGHTS [a copy of its host socket, non-blocking], which the guest accepts
    /// native clients on while canald keeps serving the listener; or ERROR (EBADF: no
    /// such socket; EOPNOTSUPP: not such a listener). protocol.md §2.
    pub const LISTENER_SOCKET: u16 = 32;
    /// host → guest: body `handle: u32` (the request's) + SCM_RIGHTS [the socket].
    pub const LISTENER_SOCKET_OK: u16 = 33;
    /// guest → host, only with `feature::CLOSE_CHECK`: body `handle: u32`, a watched
    /// socket whose last descriptor in this process was just closed while its
    /// reference count says others hold it (they may have been in processes that
    /// ended without closing them). canald closes the socket now, as its WATCH's
    /// hang-up would, if that WATCH reports every descriptor of it closed. Sent on the
    /// control connection, after the socket's WATCH, so canald holds the WATCH when it
    /// looks. Reply: CLOSE_CHECK_OK. protocol.md §2.
    pub const CLOSE_CHECK: u16 = 34;
    /// host → guest: body `handle: u32` (the request's), `closed: u32` (1: the socket
    /// is closed and its address free; 0: a descriptor of it is still open, or canald
    /// holds no WATCH for it).
    pub const CLOSE_CHECK_OK: u16 = 35;
}

/// The port directory (protocol §2 DIRECTORY): which ports canal guests listen on
/// (TCP) or receive at (UDP), so that a guest with `feature::DIRECT` knows which
/// destinations canald may short-circuit. Two bitmaps of 65,536 bits, canald writes
/// them (atomic u64 words, bit `port % 64` of word `port / 64`), guests only read.
pub mod directory {
    /// The TCP bitmap's offset: a canal listener on the port (any address).
    pub const TCP: usize = 0;
    /// The UDP bitmap's offset: a canal datagram socket canald routes to on the port.
    pub const UDP: usize = 8192;
    /// The file's size.
    pub const SIZE: usize = 16384;

    /// The word index and bit of `port` in a bitmap.
    pub const fn slot(port: u16) -> (usize, u64) {
        ((port / 64) as usize, 1u64 << (port % 64))
    }
}

/// BELL_SET, BELL_GET and BELL_OK body bytes.
pub const BELL_BODY: usize = 8;

/// EVLOG_OK body bytes.
pub const EVLOG_OK_BODY: usize = 16;

/// NETWORK body: `flags u32` (0), `npublish u32`, `name [u8; 32]` (as a VM name), then
/// `npublish` entries of NETWORK_PUBLISH bytes: `host_ip [u8; 4], host_port u16,
/// guest_port u16, proto u8` (6 TCP, 17 UDP), three zero bytes.
pub const NETWORK_BODY: usize = 40;
pub const NETWORK_PUBLISH: usize = 12;
pub const NETWORK_OK_BODY: usize = 12;

/// VM_REGION `flags` bits (the u32 at body offset 12; zero before minor 2).
pub mod vm_flag {
    /// Serve the region through an ivshmem server with doorbells (protocol §9.5):
    /// canald listens on a per-VM socket for the VM's `ivshmem-doorbell` device.
    pub const DOORBELL: u32 = 1 << 0;
}

/// VM_REGION body: `file_size u64, npublish u32, flags u32, name [u8; 32]` (NUL
/// padded; `[A-Za-z0-9_.-]`, not starting with '.'), then `npublish` entries of
/// `host_port u16, guest_port u16`.
pub const VM_REGION_BODY: usize = 48;
/// Most published ports per VM.
pub const VM_MAX_PUBLISH: usize = 64;
/// VM_REGION_OK body before the path.
pub const VM_REGION_OK_BODY: usize = 24;

/// A VM name: 1..=32 bytes of `[A-Za-z0-9_.-]`, not starting with '.'.
pub fn valid_vm_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 32
        && !n.starts_with('.')
        && n.bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'))
}

/// A 32-byte, NUL-padded name field (VM_REGION, NETWORK): the name if it is valid
/// (`valid_vm_name`) and nothing but NULs follows it.
pub fn name_from_field(raw: &[u8]) -> Option<&str> {
    let raw = raw.get(..32)?;
    let end = raw.iter().position(|&c| c == 0).unwrap_or(32);
    if raw[end..].iter().any(|&c| c != 0) {
        return None;
    }
    let name = core::str::from_utf8(&raw[..end]).ok()?;
    valid_vm_name(name).then_some(name)
}

/// HELLO `flags` bits.
pub mod hello_flag {
    /// The guest can use pair segments (protocol §8); canald may then set
    /// `feature::SHORTCUT` and short-circuit its connections to other canal guests.
    pub const SHORTCUT: u32 = 1 << 0;
    /// The guest understands pair segments with buffer zones (protocol §10); canald
    /// may then set `feature::ZONES`. (Bit 6, as the feature bit.)
    pub const ZONES: u32 = 1 << 6;
    /// The guest understands virtual RSS (`feature::VRSS`, protocol §6.3).
    pub const VRSS: u32 = 1 << 1;
    /// The guest takes spare sockets from the header's ring (`feature::SPARES`).
    pub const SPARES: u32 = 1 << 8;
    /// The guest finds pair segments in arenas (`feature::ARENAS`, protocol §8.7).
    pub const ARENAS: u32 = 1 << 9;
    /// The guest rings its peers' bells and registers its own (`feature::BELLS`,
    /// protocol §8.8).
    pub const BELLS: u32 = 1 << 10;
    /// The guest marks threads blocked in accept() (`feature::ACCEPT_ONE`, §6).
    pub const ACCEPT_ONE: u32 = 1 << 11;
    /// The guest closes unwatched sockets by a close mark (`feature::CLOSE_MARK`).
    pub const CLOSE_MARK: u32 = 1 << 12;
    /// The guest finds segments in packed arenas too (`feature::PACKED_ARENAS`,
    /// protocol §8.7).
    pub const PACKED_ARENAS: u32 = 1 << 15;
    /// The guest may keep sockets to native peers on kernel sockets
    /// (`feature::DIRECT`).
    pub const DIRECT: u32 = 1 << 16;
    /// The guest accepts native clients on its listeners itself
    /// (`feature::NATIVE_ACCEPT`).
    pub const NATIVE_ACCEPT: u32 = 1 << 17;
    /// The guest waits on a relayed listener's HOST_QUEUED (`feature::HOST_QUEUED`).
    pub const HOST_QUEUED: u32 = 1 << 18;
    /// The guest looks at a NATIVE_ACCEPT listener's copy itself and says when it
    /// relies on canald's NATIVE_QUEUED (`feature::NATIVE_QUIET`).
    pub const NATIVE_QUIET: u32 = 1 << 19;
    /// The guest connects fast with tickets (`feature::FAST_CONNECT`).
    pub const FAST_CONNECT: u32 = 1 << 20;
    /// The guest names a fast connect's local end from the table's sources (minor
    /// 23): canald may then give FAST_CONNECT to a guest with a network view.
    pub const FAST_SOURCE: u32 = 1 << 21;
}

/// SEGMENT_OK body bytes.
pub const SEGMENT_OK_BODY: usize = 16;

/// Encodes a header for a body of `len` bytes.
pub fn encode_header(kind: u16, len: u32) -> [u8; CTL_HEADER] {
    let mut h = [0u8; CTL_HEADER];
    h[0..4].copy_from_slice(&CTL_MAGIC.to_le_bytes());
    h[4..6].copy_from_slice(&CTL_VERSION.to_le_bytes());
    h[6..8].copy_from_slice(&kind.to_le_bytes());
    h[8..12].copy_from_slice(&len.to_le_bytes());
    h
}

/// Decodes a message: returns (kind, body) if the header is valid and the length
/// matches what was received.
pub fn decode(msg: &[u8]) -> Option<(u16, &[u8])> {
    if msg.len() < CTL_HEADER {
        return None;
    }
    let magic = u32::from_le_bytes([msg[0], msg[1], msg[2], msg[3]]);
    let version = u16::from_le_bytes([msg[4], msg[5]]);
    let kind = u16::from_le_bytes([msg[6], msg[7]]);
    let len = u32::from_le_bytes([msg[8], msg[9], msg[10], msg[11]]) as usize;
    if magic != CTL_MAGIC || version != CTL_VERSION || msg[12..16] != [0; 4] {
        return None;
    }
    if msg.len() != CTL_HEADER + len {
        return None;
    }
    Some((kind, &msg[CTL_HEADER..]))
}

/// HELLO body: `pid: u32, flags: u32, comm: [u8; 16]` (24 bytes).
pub const HELLO_BODY: usize = 24;
/// HELLO_OK body: `guest_id: u32, reserved: u32, region_size: u64` (16 bytes).
pub const HELLO_OK_BODY: usize = 16;

/// HELLO: a process attaches (`pid` 0: use the peer's SO_PEERCRED pid).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello {
    pub pid: u32,
    /// `hello_flag` bits: what the guest library can do.
    pub flags: u32,
    /// The process name, NUL-padded (PR_GET_NAME).
    pub comm: [u8; 16],
}

impl Hello {
    pub fn encode(&self) -> [u8; HELLO_BODY] {
        let mut b = [0u8; HELLO_BODY];
        b[0..4].copy_from_slice(&self.pid.to_le_bytes());
        b[4..8].copy_from_slice(&self.flags.to_le_bytes());
        b[8..24].copy_from_slice(&self.comm);
        b
    }

    /// None if the body is short (longer bodies: later fields are ignored).
    pub fn decode(b: &[u8]) -> Option<Hello> {
        Some(Hello {
            pid: u32_at(b, 0)?,
            flags: u32_at(b, 4)?,
            comm: b.get(8..24)?.try_into().ok()?,
        })
    }

    /// The name up to its first NUL.
    pub fn comm(&self) -> &[u8] {
        let end = self.comm.iter().position(|&c| c == 0).unwrap_or(16);
        &self.comm[..end]
    }
}

/// HELLO_OK: the guest's id and its region's size (the memfd and doorbell ride along).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HelloOk {
    pub guest_id: u32,
    pub region_size: u64,
}

impl HelloOk {
    pub fn encode(&self) -> [u8; HELLO_OK_BODY] {
        let mut b = [0u8; HELLO_OK_BODY];
        b[0..4].copy_from_slice(&self.guest_id.to_le_bytes());
        b[8..16].copy_from_slice(&self.region_size.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Option<HelloOk> {
        Some(HelloOk {
            guest_id: u32_at(b, 0)?,
            region_size: u64::from_le_bytes(b.get(8..16)?.try_into().ok()?),
        })
    }
}

/// BELL_SET, BELL_GET and BELL_OK: a bell named by an arena of the pair and the owner
/// thread's tag (protocol §8.8).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bell {
    pub arena: u32,
    pub tag: u32,
}

impl Bell {
    pub fn encode(&self) -> [u8; BELL_BODY] {
        let mut b = [0u8; BELL_BODY];
        b[0..4].copy_from_slice(&self.arena.to_le_bytes());
        b[4..8].copy_from_slice(&self.tag.to_le_bytes());
        b
    }

    /// None if the body is short.
    pub fn decode(b: &[u8]) -> Option<Bell> {
        Some(Bell {
            arena: u32_at(b, 0)?,
            tag: u32_at(b, 4)?,
        })
    }
}

/// The leading `u32` of a body: PORT's slot, STAT's format, WATCH's handle, SEGMENT's
/// id, VM_PID's pid, ERROR's errno. None if the body is shorter.
pub fn leading_u32(b: &[u8]) -> Option<u32> {
    u32_at(b, 0)
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_bodies() {
        let h = Hello {
            pid: 0x0102_0304,
            flags: hello_flag::SHORTCUT | hello_flag::VRSS,
            comm: *b"curl\0\0\0\0\0\0\0\0\0\0\0\0",
        };
        let b = h.encode();
        assert_eq!(&b[0..8], &[4, 3, 2, 1, 3, 0, 0, 0]);
        assert_eq!(Hello::decode(&b), Some(h));
        assert_eq!(h.comm(), b"curl");
        assert_eq!(Hello::decode(&b[..23]), None);
        let ok = HelloOk {
            guest_id: 7,
            region_size: 1 << 33,
        };
        assert_eq!(HelloOk::decode(&ok.encode()), Some(ok));
        assert_eq!(HelloOk::decode(&[0; 15]), None);
        let bell = Bell {
            arena: 3,
            tag: 0x2005,
        };
        assert_eq!(bell.encode(), [3, 0, 0, 0, 5, 0x20, 0, 0]);
        assert_eq!(Bell::decode(&bell.encode()), Some(bell));
        assert_eq!(Bell::decode(&[3, 0, 0, 0, 5]), None);
        assert_eq!(leading_u32(&[9, 0, 0, 0, 1]), Some(9));
        assert_eq!(leading_u32(&[9, 0, 0]), None);
    }
}
