//! The STAT listing: a snapshot of guests and sockets, rendered as JSON (the shape in
//! the contract) or as a human-readable table.
#![forbid(unsafe_code)]

use crate::guest::{Guest, Kind, Phase};
use canal_abi::CanalAddr;
use std::fmt::Write;

#[derive(Debug, Clone, PartialEq)]
pub struct SockStat {
    pub handle: u32,
    pub kind: &'static str,
    pub state: &'static str,
    pub local: String,
    pub peer: String,
    pub tx_bytes: u64,
    pub rx_bytes: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct GuestStat {
    pub id: u32,
    pub pid: u32,
    pub comm: String,
    pub sockets: Vec<SockStat>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    pub pid: u32,
    pub socket: String,
    pub guests: Vec<GuestStat>,
}

/// "1.2.3.4:80", "[::1]:80", or "" when unknown.
pub fn fmt_addr(a: Option<CanalAddr>) -> String {
    let Some(a) = a else {
        return String::new();
    };
    match a.family {
        canal_abi::addr::FAMILY_INET => {
            let ip = std::net::Ipv4Addr::from(a.ip4());
            format!("{ip}:{}", a.port)
        }
        _ => format!("[{}]:{}", std::net::Ipv6Addr::from(a.addr), a.port),
    }
}

pub fn guest_stat(g: &Guest) -> GuestStat {
    let mut sockets: Vec<SockStat> = g
        .sockets()
        .map(|s| SockStat {
            handle: s.handle,
            kind: match s.kind {
                // Short-circuited to another canal socket (protocol §8): no kernel TCP.
                Kind::Stream if s.is_shortcut() => "tcp-shortcut",
                Kind::Stream => "tcp",
                Kind::Dgram => "udp",
                Kind::Listener => "tcp-listener",
            },
            state: if s.is_closing() || g.gone.is_some() {
                "closing"
            } else {
                match s.phase {
                    Phase::Open => "open",
                    Phase::Connecting => "connecting",
                    Phase::Connected => "connected",
                    Phase::Listening => "listening",
                    // Dead until the guest closes it.
                    Phase::Failed | Phase::Broken => "closing",
                }
            },
            local: fmt_addr(s.local()),
            peer: fmt_addr(s.peer()),
            tx_bytes: g.sc_bytes(s).map_or(s.tx_bytes, |b| b.0),
            rx_bytes: g.sc_bytes(s).map_or(s.rx_bytes, |b| b.1),
        })
        .collect();
    sockets.sort_by_key(|s| s.handle & 0xffff);
    GuestStat {
        id: g.id,
        pid: g.pid,
        comm: g.comm.clone(),
        sockets,
    }
}

fn json_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

pub fn render_json(s: &Snapshot) -> String {
    let mut o = String::new();
    let _ = write!(o, "{{\"daemon\":{{\"pid\":{},\"socket\":", s.pid);
    json_str(&mut o, &s.socket);
    o.push_str("},\"guests\":[");
    for (i, g) in s.guests.iter().enumerate() {
        if i > 0 {
            o.push(',');
        }
        let _ = write!(o, "{{\"id\":{},\"pid\":{},\"comm\":", g.id, g.pid);
        json_str(&mut o, &g.comm);
        o.push_str(",\"sockets\":[");
        for (j, k) in g.sockets.iter().enumerate() {
            if j > 0 {
                o.push(',');
            }
            let _ = write!(o, "{{\"handle\":{},\"kind\":", k.handle);
            json_str(&mut o, k.kind);
            o.push_str(",\"state\":");
            json_str(&mut o, k.state);
            o.push_str(",\"local\":");
            json_str(&mut o, &k.local);
            o.push_str(",\"peer\":");
            json_str(&mut o, &k.peer);
            let _ = write!(
                o,
                ",\"tx_bytes\":{},\"rx_bytes\":{}}}",
                k.tx_bytes, k.rx_bytes
            );
        }
        o.push_str("]}");
    }
    o.push_str("]}");
    o
}

pub fn render_text(s: &Snapshot) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "canald pid {}  socket {}  guests {}",
        s.pid,
        s.socket,
        s.guests.len()
    );
    for g in &s.guests {
        let _ = writeln!(
            o,
            "\nguest {}  pid {}  comm {}  sockets {}",
            g.id,
            g.pid,
            g.comm,
            g.sockets.len()
        );
        if g.sockets.is_empty() {
            continue;
        }
        let _ = writeln!(
            o,
            "  {:>8}  {:<12}  {:<10}  {:<22}  {:<22}  {:>12}  {:>12}",
            "HANDLE", "KIND", "STATE", "LOCAL", "PEER", "TX_BYTES", "RX_BYTES"
        );
        for k in &g.sockets {
            let _ = writeln!(
                o,
                "  {:>8}  {:<12}  {:<10}  {:<22}  {:<22}  {:>12}  {:>12}",
                k.handle,
                k.kind,
                k.state,
                if k.local.is_empty() { "-" } else { &k.local },
                if k.peer.is_empty() { "-" } else { &k.peer },
                k.tx_bytes,
                k.rx_bytes
            );
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap() -> Snapshot {
        Snapshot {
            pid: 42,
            socket: "/tmp/x/canald.sock".into(),
            guests: vec![GuestStat {
                id: 1,
                pid: 1234,
                comm: "cu\"rl\n".into(),
                sockets: vec![
                    SockStat {
                        handle: 65537,
                        kind: "tcp",
                        state: "connected",
                        local: "127.0.0.1:80".into(),
                        peer: "127.0.0.1:5555".into(),
                        tx_bytes: 10,
                        rx_bytes: 20,
                    },
                    SockStat {
                        handle: 65538,
                        kind: "tcp-listener",
                        state: "listening",
                        local: "[::1]:8080".into(),
                        peer: String::new(),
                        tx_bytes: 0,
                        rx_bytes: 0,
                    },
                ],
            }],
        }
    }

    #[test]
    fn json_shape() {
        let j = render_json(&snap());
        assert_eq!(
            j,
            "{\"daemon\":{\"pid\":42,\"socket\":\"/tmp/x/canald.sock\"},\"guests\":[{\"id\":1,\
             \"pid\":1234,\"comm\":\"cu\\\"rl\\n\",\"sockets\":[{\"handle\":65537,\"kind\":\"tcp\",\
             \"state\":\"connected\",\"local\":\"127.0.0.1:80\",\"peer\":\"127.0.0.1:5555\",\
             \"tx_bytes\":10,\"rx_bytes\":20},{\"handle\":65538,\"kind\":\"tcp-listener\",\
             \"state\":\"listening\",\"local\":\"[::1]:8080\",\"peer\":\"\",\"tx_bytes\":0,\
             \"rx_bytes\":0}]}]}"
        );
        let empty = Snapshot {
            pid: 1,
            socket: "s".into(),
            guests: vec![],
        };
        assert_eq!(
            render_json(&empty),
            "{\"daemon\":{\"pid\":1,\"socket\":\"s\"},\"guests\":[]}"
        );
    }

    #[test]
    fn control_chars_escaped() {
        let mut o = String::new();
        json_str(&mut o, "a\u{1}b\\");
        assert_eq!(o, "\"a\\u0001b\\\\\"");
    }

    #[test]
    fn text_table() {
        let t = render_text(&snap());
        assert!(t.starts_with("canald pid 42  socket /tmp/x/canald.sock  guests 1\n"));
        assert!(t.contains("guest 1  pid 1234"));
        let row = t.lines().find(|l| l.contains("65538")).unwrap();
        assert!(row.contains("tcp-listener") && row.contains("listening"));
        assert!(row.contains("[::1]:8080") && row.contains(" - "));
        assert!(t
            .lines()
            .any(|l| l.contains("HANDLE") && l.contains("RX_BYTES")));
    }

    #[test]
    fn addresses() {
        assert_eq!(fmt_addr(None), "");
        assert_eq!(
            fmt_addr(Some(CanalAddr::v4([10, 0, 0, 1], 443))),
            "10.0.0.1:443"
        );
        let mut v6 = [0u8; 16];
        v6[15] = 1;
        assert_eq!(fmt_addr(Some(CanalAddr::v6(v6, 5, 0, 0))), "[::1]:5");
    }
}
