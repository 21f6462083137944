//! The address format on the wire: one fixed 32-byte little-endian layout for IPv4 and
//! IPv6, independent of either side's `sockaddr` ABI.

/// Bytes of an encoded address.
pub const ADDR_SIZE: usize = 32;

pub const FAMILY_INET: u16 = 2;
pub const FAMILY_INET6: u16 = 10;

/// `family: u16, port: u16 (host order), flowinfo: u32, addr: [u8; 16] (network
/// order; IPv4 in the first 4 bytes), scope_id: u32, reserved: u32 (zero)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CanalAddr {
    pub family: u16,
    pub port: u16,
    pub flowinfo: u32,
    pub addr: [u8; 16],
    pub scope_id: u32,
}

impl CanalAddr {
    pub fn v4(ip: [u8; 4], port: u16) -> Self {
        let mut addr = [0u8; 16];
        addr[..4].copy_from_slice(&ip);
        CanalAddr {
            family: FAMILY_INET,
            port,
            flowinfo: 0,
            addr,
            scope_id: 0,
        }
    }

    pub fn v6(ip: [u8; 16], port: u16, flowinfo: u32, scope_id: u32) -> Self {
        CanalAddr {
            family: FAMILY_INET6,
            port,
            flowinfo,
            addr: ip,
            scope_id,
        }
    }

    pub fn encode(&self) -> [u8; ADDR_SIZE] {
        let mut b = [0u8; ADDR_SIZE];
        b[0..2].copy_from_slice(&self.family.to_le_bytes());
        b[2..4].copy_from_slice(&self.port.to_le_bytes());
        b[4..8].copy_from_slice(&self.flowinfo.to_le_bytes());
        b[8..24].copy_from_slice(&self.addr);
        b[24..28].copy_from_slice(&self.scope_id.to_le_bytes());
        b
    }

    /// Decodes and validates: unknown family, non-zero reserved bytes or IPv4 bytes
    /// beyond the first four are rejected.
    pub fn decode(b: &[u8]) -> Option<Self> {
        if b.len() < ADDR_SIZE {
            return None;
        }
        let family = u16::from_le_bytes([b[0], b[1]]);
        let mut addr = [0u8; 16];
        addr.copy_from_slice(&b[8..24]);
        let a = CanalAddr {
            family,
            port: u16::from_le_bytes([b[2], b[3]]),
            flowinfo: u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
            addr,
            scope_id: u32::from_le_bytes([b[24], b[25], b[26], b[27]]),
        };
        if b[28..32] != [0; 4] {
            return None;
        }
        match family {
            FAMILY_INET if a.flowinfo == 0 && a.scope_id == 0 && addr[4..] == [0; 12] => Some(a),
            FAMILY_INET6 => Some(a),
            _ => None,
        }
    }

    pub fn ip4(&self) -> [u8; 4] {
        [self.addr[0], self.addr[1], self.addr[2], self.addr[3]]
    }
}
