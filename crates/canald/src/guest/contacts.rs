//! The outside addresses a datagram socket on a network's private loopback has sent
//! to (docs/isolation.md, item 4). Such a socket takes datagrams from its own network
//! only — and also the replies of those it spoke to, as a NAT's connection tracking
//! lets the replies of an outgoing flow in: a host resolver, an NTP or syslog server
//! answering a guest that bound its port. A stranger that learnt the port is still
//! dropped (a "restricted cone"). Bounded: the oldest address is forgotten first.
#![forbid(unsafe_code)]

use canal_abi::addr::FAMILY_INET;
use canal_abi::CanalAddr;
use std::collections::VecDeque;

/// Addresses remembered per socket: clients of this kind talk to a few servers.
pub(crate) const MAX_CONTACTS: usize = 64;

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Contacts(VecDeque<([u8; 16], u16)>);

/// An address as one key whatever the host socket's family: IPv4 in its mapped form.
fn key(a: &CanalAddr) -> ([u8; 16], u16) {
    if a.family == FAMILY_INET {
        let mapped = std::net::Ipv4Addr::from(a.ip4()).to_ipv6_mapped();
        (mapped.octets(), a.port)
    } else {
        (a.addr, a.port) // IPv6, an IPv4 one already in its mapped form
    }
}

impl Contacts {
    /// The socket sent to host address `a`.
    pub(crate) fn note(&mut self, a: &CanalAddr) {
        let k = key(a);
        if self.0.back() == Some(&k) {
            return; // the common case: the same server again
        }
        if let Some(i) = self.0.iter().position(|x| *x == k) {
            self.0.remove(i);
        } else if self.0.len() == MAX_CONTACTS {
            self.0.pop_front();
        }
        self.0.push_back(k);
    }

    /// Whether the socket sent to host address `a`.
    pub(crate) fn has(&self, a: &CanalAddr) -> bool {
        let k = key(a);
        self.0.iter().rev().any(|x| *x == k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_is_known_in_either_family_and_strangers_are_not() {
        let mut c = Contacts::default();
        let server = CanalAddr::v4([127, 0, 0, 1], 53);
        c.note(&server);
        assert!(c.has(&server));
        let mapped = CanalAddr::v6(
            std::net::Ipv4Addr::new(127, 0, 0, 1)
                .to_ipv6_mapped()
                .octets(),
            53,
            0,
            0,
        );
        assert!(
            c.has(&mapped),
            "an AF_INET6 host socket's source of the same server"
        );
        assert!(!c.has(&CanalAddr::v4([127, 0, 0, 1], 54)), "another port");
        assert!(
            !c.has(&CanalAddr::v4([127, 0, 0, 2], 53)),
            "another address"
        );
    }

    #[test]
    fn the_oldest_is_forgotten_and_a_repeated_one_is_kept() {
        let mut c = Contacts::default();
        let first = CanalAddr::v4([127, 0, 0, 1], 1);
        c.note(&first);
        for p in 2..=MAX_CONTACTS as u16 {
            c.note(&CanalAddr::v4([127, 0, 0, 1], p));
        }
        c.note(&first); // spoken to again: now the newest
        c.note(&CanalAddr::v4([127, 0, 0, 2], 9));
        assert!(c.has(&first));
        assert!(!c.has(&CanalAddr::v4([127, 0, 0, 1], 2)), "the oldest went");
        assert_eq!(c.0.len(), MAX_CONTACTS);
    }
}
