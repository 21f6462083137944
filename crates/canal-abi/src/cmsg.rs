//! Control messages (ancillary data) carried in datagram records (protocol §5, minor
//! 12, feature `DGRAM_CONTROL`): after a record's 32-byte address come control
//! messages laid out as the kernel lays them out on 64-bit Linux — `cmsg_len: u64`
//! (header and data), `cmsg_level: i32`, `cmsg_type: i32`, the data, padding to 8.
//!
//! Both sides walk such bytes: libcanal the program's `msg_control` (with the kernel's
//! rules, so a malformed buffer gets the kernel's EINVAL) and canald's answers; canald
//! the records a guest wrote (untrusted) and its host socket's `recvmsg` control. No
//! unsafe code: everything works on byte slices.

/// Bytes of a control message header.
pub const HEADER: usize = 16;

/// Control bytes one record carries at most, in either direction: room for every
/// message canal carries at once (packet info, TTL, TOS, a timestamp, the original
/// destination, and their IPv6 twins).
pub const MAX_CONTROL: usize = 512;

/// CMSG_ALIGN.
pub const fn align(n: usize) -> usize {
    (n + 7) & !7
}

/// CMSG_LEN: header and `data` bytes.
pub const fn len(data: usize) -> usize {
    HEADER + data
}

/// CMSG_SPACE: what a message with `data` bytes takes in a buffer.
pub const fn space(data: usize) -> usize {
    HEADER + align(data)
}

/// One control message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cmsg<'a> {
    pub level: i32,
    pub kind: i32,
    pub data: &'a [u8],
}

/// A header the kernel's `CMSG_OK` refuses: shorter than a header, or longer than
/// what is left of the buffer (the kernel's sendmsg answers EINVAL).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Malformed;

/// Walks `buf` as the kernel's `for_each_cmsghdr` does: a message starts wherever the
/// previous one's aligned length ends, while a whole header fits; bytes after the
/// last such header are ignored.
pub fn parse(buf: &[u8]) -> Parse<'_> {
    Parse { buf, at: 0 }
}

pub struct Parse<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Iterator for Parse<'a> {
    type Item = Result<Cmsg<'a>, Malformed>;

    fn next(&mut self) -> Option<Self::Item> {
        let rest = self.buf.get(self.at..)?;
        if rest.len() < HEADER {
            return None;
        }
        let n = u64::from_ne_bytes(rest[0..8].try_into().unwrap_or([0; 8]));
        if n < HEADER as u64 || n > rest.len() as u64 {
            self.at = self.buf.len();
            return Some(Err(Malformed));
        }
        let n = n as usize;
        let level = i32::from_ne_bytes(rest[8..12].try_into().unwrap_or([0; 4]));
        let kind = i32::from_ne_bytes(rest[12..16].try_into().unwrap_or([0; 4]));
        self.at = self.at.saturating_add(align(n));
        Some(Ok(Cmsg {
            level,
            kind,
            data: &rest[HEADER..n],
        }))
    }
}

/// Appends a whole message at `*at` of `out`; false (nothing written) when it does
/// not fit.
pub fn push(out: &mut [u8], at: &mut usize, m: &Cmsg<'_>) -> bool {
    let need = space(m.data.len());
    let Some(dst) = out.get_mut(*at..).filter(|d| d.len() >= need) else {
        return false;
    };
    dst[..need].fill(0);
    write_header(dst, len(m.data.len()), m.level, m.kind);
    dst[HEADER..HEADER + m.data.len()].copy_from_slice(m.data);
    *at += need;
    true
}

/// Writes a message into a program's receive buffer as the kernel's `put_cmsg` does:
/// a message that does not fit is cut to the room left (its `cmsg_len` says how much
/// was written) and the answer's MSG_CTRUNC is due; with less than a header left
/// nothing is written. Returns false when the message was cut or left out.
pub fn put(out: &mut [u8], at: &mut usize, m: &Cmsg<'_>) -> bool {
    let room = out.len().saturating_sub(*at);
    if room < HEADER {
        return false;
    }
    let whole = len(m.data.len());
    let n = whole.min(room);
    let dst = &mut out[*at..];
    write_header(dst, n, m.level, m.kind);
    dst[HEADER..n].copy_from_slice(&m.data[..n - HEADER]);
    *at += space(m.data.len()).min(room);
    n == whole
}

fn write_header(dst: &mut [u8], n: usize, level: i32, kind: i32) {
    dst[0..8].copy_from_slice(&(n as u64).to_ne_bytes());
    dst[8..12].copy_from_slice(&level.to_ne_bytes());
    dst[12..16].copy_from_slice(&kind.to_ne_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(level: i32, kind: i32, data: &[u8]) -> Vec<u8> {
        let mut v = vec![0u8; space(data.len())];
        let mut at = 0;
        assert!(push(&mut v, &mut at, &Cmsg { level, kind, data }));
        assert_eq!(at, v.len());
        v
    }

    #[test]
    fn layout_is_the_kernels() {
        assert_eq!(len(4), 20);
        assert_eq!(space(4), 24);
        assert_eq!(space(12), 32);
        let v = msg(0, 8, &[1, 2, 3, 4]);
        assert_eq!(&v[0..8], &20u64.to_ne_bytes());
        assert_eq!(&v[12..16], &8i32.to_ne_bytes());
        assert_eq!(&v[16..20], &[1, 2, 3, 4]);
        assert_eq!(&v[20..24], &[0; 4], "padding is zero");
    }

    #[test]
    fn parse_walks_and_refuses_bad_lengths() {
        let mut buf = msg(0, 8, &[7; 4]);
        buf.extend(msg(41, 50, &[9; 20]));
        let all: Vec<_> = parse(&buf).collect();
        assert_eq!(all.len(), 2);
        assert_eq!(all[1].unwrap().data, &[9; 20]);
        // Trailing bytes shorter than a header are ignored.
        buf.extend([0u8; 15]);
        assert_eq!(parse(&buf).count(), 2);
        // A length below a header, or past the end: malformed.
        let mut bad = msg(0, 8, &[7; 4]);
        bad[0..8].copy_from_slice(&8u64.to_ne_bytes());
        assert_eq!(parse(&bad).next(), Some(Err(Malformed)));
        bad[0..8].copy_from_slice(&25u64.to_ne_bytes());
        assert_eq!(parse(&bad).next(), Some(Err(Malformed)));
        bad[0..8].copy_from_slice(&u64::MAX.to_ne_bytes());
        assert_eq!(parse(&bad).collect::<Vec<_>>(), vec![Err(Malformed)]);
        // The unpadded last message of a buffer is whole (cmsg_len need not be
        // padded at the end).
        let short = &msg(0, 8, &[7; 4])[..20];
        assert_eq!(parse(short).next().unwrap().unwrap().data, &[7; 4]);
    }

    #[test]
    fn put_cuts_as_the_kernel() {
        let m = Cmsg {
            level: 0,
            kind: 8,
            data: &[5; 12],
        };
        // Room for all of it.
        let mut out = [0u8; 64];
        let mut at = 0;
        assert!(put(&mut out, &mut at, &m));
        assert_eq!(at, 32);
        // Room for the header and 4 bytes: cut, cmsg_len 20, all room used.
        let mut out = [0u8; 20];
        let mut at = 0;
        assert!(!put(&mut out, &mut at, &m));
        assert_eq!(at, 20);
        assert_eq!(&out[0..8], &20u64.to_ne_bytes());
        // Less than a header: nothing.
        let mut out = [0u8; 15];
        let mut at = 0;
        assert!(!put(&mut out, &mut at, &m));
        assert_eq!(at, 0);
        // Exactly CMSG_LEN but not CMSG_SPACE: whole, the padding is left out.
        let m4 = Cmsg {
            level: 0,
            kind: 2,
            data: &[1; 4],
        };
        let mut out = [0u8; 20];
        let mut at = 0;
        assert!(put(&mut out, &mut at, &m4));
        assert_eq!(at, 20);
    }
}
