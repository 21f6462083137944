//! Selection policy: which sockets canal takes over.
//!
//! By default every AF_INET/AF_INET6 TCP and UDP socket. `CANAL_EXCLUDE` leaves chosen
//! destinations to the kernel: a comma-separated list of rules `[ADDR[/BITS]][:PORT]`,
//! where ADDR is IPv4 dotted or `[IPv6]` (e.g. `10.0.0.0/8`, `127.0.0.1:6379`, `:53`,
//! `[::1]:8080`, `[fd00::]/8`). A rule matches an address when its network contains it
//! (IPv4-mapped IPv6 addresses match IPv4 rules) and, if it names a port, the port is
//! equal. An unparsable rule is reported once on stderr and ignored.
//!
//! The address is known only at the first bind, connect or sendto. A socket whose first
//! such call names an excluded address is handed to the kernel there (`handoff`): a
//! kernel socket of the same family and type, with the options set so far, replaces the
//! dummy descriptor at the same number, and the call proceeds on it. After that first
//! call a canal socket stays canal's.

use crate::ready::local;
use crate::sock::core::Sock;
use crate::sys;
use canal_abi::addr::{CanalAddr, FAMILY_INET6};
use canal_abi::sock_kind;
use canal_abi::sync::Ordering;
use core::sync::atomic::AtomicU8;
use libc::c_int;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rule {
    /// (16-byte address, IPv4-mapped if `v4`, prefix bits within its family).
    net: Option<([u8; 16], bool, u8)>,
    port: Option<u16>,
}

fn mapped(ip: [u8; 4]) -> [u8; 16] {
    let mut a = [0u8; 16];
    a[10] = 0xff;
    a[11] = 0xff;
    a[12..].copy_from_slice(&ip);
    a
}

/// Parses one rule; None if malformed.
pub(crate) fn parse_rule(r: &str) -> Option<Rule> {
    let r = r.trim();
    if r.is_empty() {
        return None;
    }
    let (host, port) = if let Some(rest) = r.strip_prefix('[') {
        let end = rest.find(']')?;
        let (h, tail) = (&rest[..end], &rest[end + 1..]);
        // "[v6]/bits:port" or "[v6]:port" or "[v6]/bits"
        let (bits, port) = match tail.split_once(':') {
            Some((b, p)) => (b, Some(p)),
            None => (tail, None),
        };
        (format!("[{h}]{bits}"), port)
    } else {
        match r.rsplit_once(':') {
            Some((h, p)) => (h.to_string(), Some(p)),
            None => (r.to_string(), None),
        }
    };
    let port = match port {
        Some(p) => Some(p.parse::<u16>().ok()?),
        None => None,
    };
    if host.is_empty() {
        return port.map(|p| Rule {
            net: None,
            port: Some(p),
        });
    }
    let (addr, bits) = match host.split_once('/') {
        Some((a, b)) => (a, Some(b.parse::<u8>().ok()?)),
        None => (host.as_str(), None),
    };
    let net = if let Some(v6) = addr.strip_prefix('[').and_then(|a| a.strip_suffix(']')) {
        let ip: std::net::Ipv6Addr = v6.parse().ok()?;
        let bits = bits.unwrap_or(128);
        if bits > 128 {
            return None;
        }
        (ip.octets(), false, bits)
    } else {
        let ip: std::net::Ipv4Addr = addr.parse().ok()?;
        let bits = bits.unwrap_or(32);
        if bits > 32 {
            return None;
        }
        (mapped(ip.octets()), true, bits)
    };
    Some(Rule {
        net: Some(net),
        port,
    })
}

fn prefix_eq(a: &[u8; 16], b: &[u8; 16], bits: u32) -> bool {
    let full = (bits / 8) as usize;
    if a[..full] != b[..full] {
        return false;
    }
    let rem = bits % 8;
    rem == 0 || (a[full] ^ b[full]) & (0xffu8 << (8 - rem)) == 0
}

impl Rule {
    pub(crate) fn matches(&self, a: &CanalAddr) -> bool {
        if self.port.is_some_and(|p| p != a.port) {
            return false;
        }
        let Some((net, v4, bits)) = self.net else {
            return true;
        };
        let ip = if a.family == FAMILY_INET6 {
            a.addr
        } else {
            mapped(a.ip4())
        };
        let is_v4 = ip[..12] == mapped([0; 4])[..12];
        if v4 {
            is_v4 && prefix_eq(&ip, &net, 96 + bits as u32)
        } else {
            prefix_eq(&ip, &net, bits as u32)
        }
    }
}

/// Parses a whole CANAL_EXCLUDE value: (rules, malformed pieces).
pub(crate) fn parse(v: &str) -> (Vec<Rule>, Vec<String>) {
    let mut rules = Vec::new();
    let mut bad = Vec::new();
    for piece in v.split(',').filter(|p| !p.trim().is_empty()) {
        match parse_rule(piece) {
            Some(r) => rules.push(r),
            None => bad.push(piece.trim().to_string()),
        }
    }
    (rules, bad)
}

// ---- process state -------------------------------------------------------------------------

/// 0 = not read yet, 1 = no rules, 2 = rules present.
static STATE: AtomicU8 = AtomicU8::new(0);

/// The rules (CANAL_EXCLUDE, read once).
static RULES: crate::rt::Locked<Vec<Rule>> = crate::rt::Locked::new(Vec::new());

/// Options set on undecided sockets, by handle, to replay on a handoff.
pub(crate) static SAVED: crate::sock::opts::SavedOpts<u32> = crate::sock::opts::SavedOpts::new();

/// Whether any exclusion rule is configured (reads CANAL_EXCLUDE once).
pub(crate) fn active() -> bool {
    match STATE.load(Ordering::Relaxed) {
        1 => false,
        2 => true,
        _ => {
            let v = std::env::var("CANAL_EXCLUDE").unwrap_or_default();
            let (rules, bad) = parse(&v);
            for b in &bad {
                sys::log_fmt(format_args!(
                    "canal: CANAL_EXCLUDE: ignoring malformed rule '{b}'\n"
                ));
            }
            let on = !rules.is_empty();
            RULES.with(|r| *r = rules);
            STATE.store(if on { 2 } else { 1 }, Ordering::Relaxed);
            on
        }
    }
}

/// Whether `a` is left to the kernel.
pub(crate) fn excluded(a: &CanalAddr) -> bool {
    active() && RULES.with(|r| r.iter().any(|x| x.matches(a)))
}

/// The socket has not been bound, connected or used yet.
pub(crate) fn undecided(s: &Sock) -> bool {
    s.e.guest_flags.load(Ordering::Relaxed) & local::COMMITTED == 0
        && matches!(s.kind(), sock_kind::STREAM | sock_kind::DGRAM)
        // Nothing but canald's note that it holds the WATCH (not a use of the socket).
        && s.flags() & !canal_abi::sock_flag::WATCHED == 0
}

/// The socket is canal's for good (its first bind/connect/send went to canal).
pub(crate) fn commit(s: &Sock) {
    if s.e.guest_flags.load(Ordering::Relaxed) & local::COMMITTED == 0 {
        s.e.guest_flags
            .fetch_or(local::COMMITTED, Ordering::Relaxed);
        if active() {
            SAVED.forget(s.handle);
        }
    }
}

/// The socket is gone: forget its saved options.
pub(crate) fn forget(handle: u32) {
    if STATE.load(Ordering::Relaxed) == 2 {
        SAVED.forget(handle);
    }
}

/// Remembers an option set on an undecided socket (only with rules configured).
pub(crate) fn record_option(s: &Sock, level: c_int, name: c_int, val: &[u8]) {
    if active() && undecided(s) {
        SAVED.record(s.handle, level, name, val);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(ip: [u8; 4], port: u16) -> CanalAddr {
        CanalAddr::v4(ip, port)
    }

    #[test]
    fn parsing() {
        let (r, bad) =
            parse("10.0.0.0/8, 127.0.0.1:6379,:53,[::1]:8080,[fd00::]/8,bogus,1.2.3.4/40,:99999");
        assert_eq!(r.len(), 5);
        assert_eq!(bad, vec!["bogus", "1.2.3.4/40", ":99999"]);
        assert_eq!(parse("").0.len(), 0);
    }

    #[test]
    fn matching() {
        let (r, _) = parse("10.0.0.0/8");
        assert!(r[0].matches(&v4([10, 1, 2, 3], 80)));
        assert!(!r[0].matches(&v4([11, 1, 2, 3], 80)));
        // IPv4-mapped IPv6 matches an IPv4 rule.
        let m = CanalAddr::v6(mapped([10, 9, 9, 9]), 1, 0, 0);
        assert!(r[0].matches(&m));
        let (r, _) = parse("127.0.0.1:6379");
        assert!(r[0].matches(&v4([127, 0, 0, 1], 6379)));
        assert!(!r[0].matches(&v4([127, 0, 0, 1], 6380)));
        let (r, _) = parse(":53");
        assert!(r[0].matches(&v4([8, 8, 8, 8], 53)));
        let mut one = [0u8; 16];
        one[15] = 1;
        assert!(r[0].matches(&CanalAddr::v6(one, 53, 0, 0)));
        let (r, _) = parse("[::1]:8080");
        assert!(r[0].matches(&CanalAddr::v6(one, 8080, 0, 0)));
        assert!(!r[0].matches(&v4([127, 0, 0, 1], 8080)));
        let (r, _) = parse("[fd00::]/8");
        let mut ula = [0u8; 16];
        ula[0] = 0xfd;
        ula[15] = 7;
        assert!(r[0].matches(&CanalAddr::v6(ula, 1, 0, 0)));
        ula[0] = 0xfe;
        assert!(!r[0].matches(&CanalAddr::v6(ula, 1, 0, 0)));
        let (r, _) = parse("0.0.0.0/0");
        assert!(r[0].matches(&v4([1, 2, 3, 4], 5)));
        assert!(
            !r[0].matches(&CanalAddr::v6(ula, 1, 0, 0)),
            "v4 rules never match v6"
        );
    }
}
