//! `struct sockaddr` (the application's ABI) ↔ `CanalAddr` (the wire format), and the
//! addrlen in/out rules: an address is truncated to the caller's buffer, and the full
//! length is reported back.

use canal_abi::addr::{CanalAddr, FAMILY_INET, FAMILY_INET6};

pub(crate) const SOCKADDR_IN_LEN: usize = 16;
pub(crate) const SOCKADDR_IN6_LEN: usize = 28;
/// Linux accepts an IPv6 address without the trailing scope id (RFC 2133 length).
pub(crate) const SOCKADDR_IN6_MIN: usize = 24;

/// Decodes the bytes of a `sockaddr_in`/`sockaddr_in6` given by an application.
pub(crate) fn decode(b: &[u8]) -> Result<CanalAddr, i32> {
    if b.len() < 2 {
        return Err(libc::EINVAL);
    }
    let family = u16::from_ne_bytes([b[0], b[1]]);
    match family as i32 {
        libc::AF_INET => {
            if b.len() < SOCKADDR_IN_LEN {
                return Err(libc::EINVAL);
            }
            let port = u16::from_be_bytes([b[2], b[3]]);
            Ok(CanalAddr::v4([b[4], b[5], b[6], b[7]], port))
        }
        libc::AF_INET6 => {
            if b.len() < SOCKADDR_IN6_MIN {
                return Err(libc::EINVAL);
            }
            let port = u16::from_be_bytes([b[2], b[3]]);
            let flowinfo = u32::from_be_bytes([b[4], b[5], b[6], b[7]]);
            let mut ip = [0u8; 16];
            ip.copy_from_slice(&b[8..24]);
            let scope = if b.len() >= SOCKADDR_IN6_LEN {
                u32::from_ne_bytes([b[24], b[25], b[26], b[27]])
            } else {
                0
            };
            Ok(CanalAddr::v6(ip, port, flowinfo, scope))
        }
        _ => Err(libc::EAFNOSUPPORT),
    }
}

/// Encodes a `CanalAddr` as the bytes of a sockaddr; returns the full length.
pub(crate) fn encode(a: &CanalAddr, out: &mut [u8; SOCKADDR_IN6_LEN]) -> usize {
    *out = [0; SOCKADDR_IN6_LEN];
    match a.family {
        FAMILY_INET => {
            out[0..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
            out[2..4].copy_from_slice(&a.port.to_be_bytes());
            out[4..8].copy_from_slice(&a.ip4());
            SOCKADDR_IN_LEN
        }
        FAMILY_INET6 => {
            out[0..2].copy_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes());
            out[2..4].copy_from_slice(&a.port.to_be_bytes());
            out[4..8].copy_from_slice(&a.flowinfo.to_be_bytes());
            out[8..24].copy_from_slice(&a.addr);
            out[24..28].copy_from_slice(&a.scope_id.to_ne_bytes());
            SOCKADDR_IN6_LEN
        }
        // Not produced by a validated CanalAddr; report an empty address.
        _ => {
            out[0..2].copy_from_slice(&(libc::AF_UNSPEC as u16).to_ne_bytes());
            2
        }
    }
}

/// The addrlen rule: copies `min(full, cap)` bytes, returns (bytes to copy, full).
pub(crate) fn out_len(full: usize, cap: usize) -> usize {
    full.min(cap)
}

/// Reads an application's sockaddr (`addr`, `len`).
///
/// # Safety
/// `addr` must be null or point to `len` readable bytes.
pub(crate) unsafe fn read_sockaddr(
    addr: *const libc::sockaddr,
    len: libc::socklen_t,
) -> Result<CanalAddr, i32> {
    if addr.is_null() {
        return Err(libc::EFAULT);
    }
    if (len as i32) < 0 {
        return Err(libc::EINVAL);
    }
    let n = (len as usize).min(128);
    // SAFETY: the caller guarantees `len` readable bytes; we read at most that.
    let b = unsafe { core::slice::from_raw_parts(addr as *const u8, n) };
    decode(b)
}

/// Writes an address to an application's (`addr`, `addrlen`) pair following the
/// in/out rules. Does nothing if either pointer is null.
///
/// # Safety
/// `addrlen` must be null or valid; `addr` must be null or have `*addrlen` writable bytes.
pub(crate) unsafe fn write_sockaddr(
    a: &CanalAddr,
    addr: *mut libc::sockaddr,
    addrlen: *mut libc::socklen_t,
) {
    if addr.is_null() || addrlen.is_null() {
        return;
    }
    let mut buf = [0u8; SOCKADDR_IN6_LEN];
    let full = encode(a, &mut buf);
    // SAFETY: addrlen is valid (caller).
    let cap = unsafe { *addrlen } as usize;
    let n = out_len(full, cap);
    // SAFETY: addr has `cap >= n` writable bytes (caller).
    unsafe {
        core::ptr::copy_nonoverlapping(buf.as_ptr(), addr as *mut u8, n);
        *addrlen = full as libc::socklen_t;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sin(ip: [u8; 4], port: u16) -> Vec<u8> {
        // SAFETY: sockaddr_in is plain data.
        let mut s: libc::sockaddr_in = unsafe { core::mem::zeroed() };
        s.sin_family = libc::AF_INET as u16;
        s.sin_port = port.to_be();
        s.sin_addr.s_addr = u32::from_ne_bytes(ip);
        // SAFETY: reading the bytes of a plain struct.
        unsafe { core::slice::from_raw_parts(&s as *const _ as *const u8, 16) }.to_vec()
    }

    #[test]
    fn v4_round_trip() {
        let b = sin([127, 0, 0, 1], 8080);
        let a = decode(&b).unwrap();
        assert_eq!(a, CanalAddr::v4([127, 0, 0, 1], 8080));
        let mut out = [0u8; 28];
        assert_eq!(encode(&a, &mut out), 16);
        assert_eq!(&out[..16], &b[..]);
        assert_eq!(CanalAddr::decode(&a.encode()), Some(a));
    }

    #[test]
    fn v6_round_trip_and_short_form() {
        // SAFETY: sockaddr_in6 is plain data.
        let mut s: libc::sockaddr_in6 = unsafe { core::mem::zeroed() };
        s.sin6_family = libc::AF_INET6 as u16;
        s.sin6_port = 443u16.to_be();
        s.sin6_flowinfo = 7u32.to_be();
        s.sin6_addr.s6_addr[15] = 1;
        s.sin6_scope_id = 3;
        // SAFETY: reading the bytes of a plain struct.
        let b = unsafe { core::slice::from_raw_parts(&s as *const _ as *const u8, 28) };
        let a = decode(b).unwrap();
        assert_eq!(a.family, FAMILY_INET6);
        assert_eq!((a.port, a.flowinfo, a.scope_id, a.addr[15]), (443, 7, 3, 1));
        let mut out = [0u8; 28];
        assert_eq!(encode(&a, &mut out), 28);
        assert_eq!(&out[..], b);
        // 24-byte form: scope id 0.
        assert_eq!(decode(&b[..24]).unwrap().scope_id, 0);
        assert_eq!(decode(&b[..23]), Err(libc::EINVAL));
    }

    #[test]
    fn bad_inputs() {
        assert_eq!(decode(&[]), Err(libc::EINVAL));
        assert_eq!(decode(&sin([1, 2, 3, 4], 1)[..15]), Err(libc::EINVAL));
        let mut unix = [0u8; 16];
        unix[0..2].copy_from_slice(&(libc::AF_UNIX as u16).to_ne_bytes());
        assert_eq!(decode(&unix), Err(libc::EAFNOSUPPORT));
    }

    #[test]
    fn addrlen_rules() {
        let a = CanalAddr::v4([10, 0, 0, 1], 53);
        let mut store = [0xAAu8; 8];
        let mut len: libc::socklen_t = 8;
        // SAFETY: store has `len` writable bytes.
        unsafe { write_sockaddr(&a, store.as_mut_ptr() as *mut libc::sockaddr, &mut len) };
        assert_eq!(len, 16, "full length reported");
        assert_eq!(&store[..4], &sin([10, 0, 0, 1], 53)[..4], "truncated copy");
        assert_eq!(&store[4..8], &[10, 0, 0, 1]);
        // Null pointers: nothing happens.
        // SAFETY: null pointers are allowed.
        unsafe { write_sockaddr(&a, core::ptr::null_mut(), &mut len) };
    }
}
