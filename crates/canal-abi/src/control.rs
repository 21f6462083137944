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
}

/// HELLO `flags` bits.
pub mod hello_flag {
    /// The guest can use pair segments (protocol §8); canald may then set
    /// `feature::SHORTCUT` and short-circuit its connections to other canal guests.
    pub const SHORTCUT: u32 = 1 << 0;
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
