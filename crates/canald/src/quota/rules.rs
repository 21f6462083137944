//! Destination rules (`allow`, `deny` of a quota): `NET[/PREFIX][:PORT[-PORT]]`, IPv6
//! in brackets when a port follows (`[fd00::/8]:443`). An IPv4 rule also matches the
//! IPv4-mapped IPv6 form of its addresses (`::ffff:10.0.0.1`), as the kernel routes it.
#![forbid(unsafe_code)]

use canal_abi::CanalAddr;
use std::net::{IpAddr, Ipv6Addr};

/// One destination rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DestRule {
    /// The network as an IPv6 address (IPv4 mapped) and its prefix length over 128.
    net: u128,
    prefix: u8,
    ports: (u16, u16),
    /// The rule as written (for --print-config and messages).
    text: String,
}

impl DestRule {
    pub fn parse(s: &str) -> Result<DestRule, String> {
        let bad = |why: &str| format!("'{s}' is not a destination ({why}; e.g. 10.0.0.0/8:443)");
        let t = s.trim();
        let (net, port) = if let Some(rest) = t.strip_prefix('[') {
            let (inside, after) = rest.split_once(']').ok_or_else(|| bad("no ']'"))?;
            let port = match after {
                "" => None,
                p => Some(p.strip_prefix(':').ok_or_else(|| bad("':' after ']'"))?),
            };
            (inside, port)
        } else if t.matches(':').count() > 1 {
            (t, None)
        } else {
            match t.split_once(':') {
                Some((n, p)) => (n, Some(p)),
                None => (t, None),
            }
        };
        let (ip, prefix) = match net.split_once('/') {
            Some((ip, p)) => (ip, Some(p.parse::<u8>().map_err(|_| bad("bad prefix"))?)),
            None => (net, None),
        };
        let ip: IpAddr = ip.parse().map_err(|_| bad("bad address"))?;
        let (bits, prefix) = match ip {
            IpAddr::V4(v4) => {
                let p = prefix.unwrap_or(32);
                if p > 32 {
                    return Err(bad("an IPv4 prefix is at most 32"));
                }
                (u128::from(v4.to_ipv6_mapped()), 96 + p)
            }
            IpAddr::V6(v6) => {
                let p = prefix.unwrap_or(128);
                if p > 128 {
                    return Err(bad("an IPv6 prefix is at most 128"));
                }
                (u128::from(v6), p)
            }
        };
        let ports = match port {
            None | Some("*") => (0, u16::MAX),
            Some(p) => {
                let num = |x: &str| x.parse::<u16>().map_err(|_| bad("bad port"));
                match p.split_once('-') {
                    Some((a, b)) => (num(a)?, num(b)?),
                    None => (num(p)?, num(p)?),
                }
            }
        };
        if ports.0 > ports.1 {
            return Err(bad("empty port range"));
        }
        Ok(DestRule {
            net: bits & mask(prefix),
            prefix,
            ports,
            text: t.to_string(),
        })
    }

    pub fn matches(&self, a: &CanalAddr) -> bool {
        let ip = match a.family {
            canal_abi::addr::FAMILY_INET => {
                u128::from(std::net::Ipv4Addr::from(a.ip4()).to_ipv6_mapped())
            }
            _ => u128::from(Ipv6Addr::from(a.addr)),
        };
        ip & mask(self.prefix) == self.net && (self.ports.0..=self.ports.1).contains(&a.port)
    }

    pub fn text(&self) -> &str {
        &self.text
    }
}

fn mask(prefix: u8) -> u128 {
    if prefix == 0 {
        0
    } else {
        u128::MAX << (128 - u32::from(prefix))
    }
}

/// Where a guest may send: none of `deny`, and one of `allow` unless it is empty.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DestPolicy {
    pub allow: Vec<DestRule>,
    pub deny: Vec<DestRule>,
}

impl DestPolicy {
    pub fn allows(&self, a: &CanalAddr) -> bool {
        !self.deny.iter().any(|r| r.matches(a))
            && (self.allow.is_empty() || self.allow.iter().any(|r| r.matches(a)))
    }

    pub fn is_open(&self) -> bool {
        self.allow.is_empty() && self.deny.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4(ip: [u8; 4], port: u16) -> CanalAddr {
        CanalAddr::v4(ip, port)
    }

    #[test]
    fn rules() {
        let r = DestRule::parse("10.0.0.0/8:443").unwrap();
        assert!(r.matches(&v4([10, 1, 2, 3], 443)));
        assert!(!r.matches(&v4([10, 1, 2, 3], 80)));
        assert!(!r.matches(&v4([11, 1, 2, 3], 443)));
        let mapped = CanalAddr::v6(
            Ipv6Addr::from([0, 0, 0, 0, 0, 0xffff, 0x0a01, 0x0203]).octets(),
            443,
            0,
            0,
        );
        assert!(r.matches(&mapped), "IPv4 rules match IPv4-mapped IPv6");
        let r = DestRule::parse("127.0.0.1").unwrap();
        assert!(r.matches(&v4([127, 0, 0, 1], 1)) && !r.matches(&v4([127, 0, 0, 2], 1)));
        let r = DestRule::parse("127.0.0.0/8:1000-2000").unwrap();
        assert!(r.matches(&v4([127, 9, 9, 9], 1500)) && !r.matches(&v4([127, 0, 0, 1], 2001)));
        let r = DestRule::parse("[::1]:53").unwrap();
        assert!(r.matches(&CanalAddr::v6(Ipv6Addr::LOCALHOST.octets(), 53, 0, 0)));
        let r = DestRule::parse("fd00::/8").unwrap();
        assert!(r.matches(&CanalAddr::v6(
            "fd12::1".parse::<Ipv6Addr>().unwrap().octets(),
            9,
            0,
            0
        )));
        assert!(!r.matches(&v4([10, 0, 0, 1], 9)));
        assert!(DestRule::parse("0.0.0.0/0")
            .unwrap()
            .matches(&v4([8, 8, 8, 8], 1)));
        for bad in [
            "10.0.0.0/33",
            "x",
            "10.0.0.1:70000",
            "[::1",
            "10.0.0.1:9-3",
            "::1/129",
        ] {
            assert!(DestRule::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn deny_wins_and_allow_restricts() {
        let p = DestPolicy {
            allow: vec![DestRule::parse("127.0.0.0/8").unwrap()],
            deny: vec![DestRule::parse("127.0.0.1:22").unwrap()],
        };
        assert!(p.allows(&v4([127, 0, 0, 1], 80)));
        assert!(!p.allows(&v4([127, 0, 0, 1], 22)));
        assert!(!p.allows(&v4([10, 0, 0, 1], 80)));
        assert!(DestPolicy::default().allows(&v4([10, 0, 0, 1], 80)));
    }
}
