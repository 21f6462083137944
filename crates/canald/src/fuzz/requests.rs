//! Fuzz entry point for the request consumer (the logic lives here so unit tests run
//! it on seeds; `fuzz/fuzz_targets/request_consumer.rs` only calls it). `serve_over`
//! is shared with the VM target.
//!
//! The input is laid over a small region exactly where a hostile guest could write:
//! request slots, queue cells, socket entries (after the host created two live
//! sockets with rings), attention bits and ring bytes. Then the host runs service
//! rounds. Properties checked: no panic, no out-of-bounds access (the Region view and
//! ring helpers bound everything), and host-side invariants afterwards.
//!
//! Host sockets are real; the guest runs under the loopback-only policy, so whatever
//! the input asks for can only reach 127.0.0.0/8 or ::1.
#![forbid(unsafe_code)]

use crate::guest::config::GuestConfig;
use crate::guest::state::Guest;
use crate::request::Request;
use crate::sys::Epoll;
use canal_abi::sync::Ordering;
use canal_abi::{op, slot_state, Layout, SLOT_PAYLOAD};
use std::time::Instant;

const SLOTS: u32 = 4;
const SOCKETS: u32 = 4;
const RING: u64 = 64 * 1024;

fn config() -> GuestConfig {
    GuestConfig {
        budget: 8,
        loopback_only: true,
        net: None,
        vm: false,
        ..GuestConfig::with_layout(
            Layout::new(SLOTS, SOCKETS, 8 * RING).expect("valid fuzz layout"),
            RING,
        )
    }
}

/// What one fuzz run did (for seed tests).
#[derive(Debug, Default)]
pub struct Outcome {
    /// Queue entries popped.
    pub(crate) popped: usize,
    /// (slot, result) of slots left DONE.
    pub(crate) done: Vec<(u32, i64)>,
}

/// Runs the request consumer over `data`. Panics only on a canald bug.
pub fn fuzz_request_consumer(data: &[u8]) -> Outcome {
    let Ok(ep) = Epoll::new() else {
        return Outcome::default();
    };
    let Ok((mut g, _memfd)) = Guest::new(1, 1, 0, "fuzz".into(), config()) else {
        return Outcome::default();
    };
    // Two live sockets made by honest requests, so entries and rings exist.
    let mut out = [0u8; SLOT_PAYLOAD];
    for ty in [1u64, 2] {
        let r = g.execute(
            &ep,
            &Request::new(op::SOCKET, 0, [2, ty, 0, 0], &[]),
            &mut out,
        );
        assert!(r.is_ok(), "honest SOCKET failed: {r:?}");
    }
    let o = serve_over(&mut g, &ep, data);
    g.close_all(&ep);
    assert_eq!(g.socket_count(), 0);
    o
}

/// Lays `data` over what a guest may write in `g`'s region (slots, queue, socket
/// entries, attention bits, ring bytes; the first byte picks how honest the queue is)
/// and runs three service rounds; then checks the host's invariants.
pub(crate) fn serve_over(g: &mut Guest, ep: &Epoll, data: &[u8]) -> Outcome {
    let mut o = Outcome::default();
    let (mode, data) = match data.split_first() {
        Some((m, rest)) => (*m, rest),
        None => (0, data),
    };
    let l = *g.region().layout();
    let slots = l.slot_count.min(64);
    let mut rest = data;
    let lay = |off: u64, len: usize, rest: &mut &[u8]| {
        let n = len.min(rest.len());
        g.mapping().write_at(off as usize, &rest[..n]);
        *rest = &rest[n..];
    };
    lay(l.slots_offset, (slots as u64 * 512) as usize, &mut rest);
    if mode & 1 != 0 {
        lay(l.queue_offset, slots as usize * 8, &mut rest);
    }
    lay(
        l.sockets_offset,
        (l.socket_count as u64 * 256) as usize,
        &mut rest,
    );
    lay(l.attention_offset, 8, &mut rest);
    lay(l.data_offset, rest.len().min(4 * RING as usize), &mut rest);
    let r = *g.region();
    if mode & 2 != 0 {
        // Make every slot a pending request, whatever else the input wrote.
        for i in 0..slots {
            if let Some(s) = r.slot(i) {
                s.state.store(slot_state::REQUESTED, Ordering::Release);
            }
        }
    }
    if mode & 1 == 0 {
        // Honest queue entries naming (maybe garbage) slots.
        let q = canal_abi::queue::QueueProducer::new(r.queue_cells(), &r.header().queue_tail);
        for i in 0..slots {
            let v = if mode & 4 != 0 { i ^ 0x8000_0001 } else { i };
            let _ = q.push(v);
        }
    }
    for _ in 0..3 {
        o.popped += g.service_round(ep, Instant::now()).requests;
    }
    for i in 0..slots {
        if let Some(s) = r.slot(i) {
            if s.state.load(Ordering::Acquire) == slot_state::DONE {
                o.done.push((i, s.result.load(Ordering::Relaxed)));
            }
        }
    }
    check_invariants(g);
    o
}

fn check_invariants(g: &Guest) {
    let mut handles = std::collections::HashSet::new();
    for s in g.sockets() {
        assert!(s.index() < g.region().layout().socket_count);
        assert!(handles.insert(s.handle), "duplicate handle");
        assert_ne!(s.handle >> 16, 0, "generation 0 is never used");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use canal_abi::CanalAddr;

    fn slot_bytes(opc: u32, socket: u32, args: [u64; 4], payload: &[u8]) -> Vec<u8> {
        let mut b = vec![0u8; 512];
        b[0..4].copy_from_slice(&slot_state::REQUESTED.to_le_bytes());
        b[16..20].copy_from_slice(&opc.to_le_bytes());
        b[20..24].copy_from_slice(&socket.to_le_bytes());
        b[24..28].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        for (i, a) in args.iter().enumerate() {
            b[32 + 8 * i..40 + 8 * i].copy_from_slice(&a.to_le_bytes());
        }
        b[128..128 + payload.len()].copy_from_slice(payload);
        b
    }

    #[test]
    fn seeds() {
        fuzz_request_consumer(&[]);
        fuzz_request_consumer(&[0]);
        fuzz_request_consumer(&[2; 3000]);
        fuzz_request_consumer(&[0xff; 20000]);
        let mut x = 0x2545f4914f6cdd1du64;
        let noise: Vec<u8> = (0..300_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        for m in 0..8u8 {
            let mut d = noise.clone();
            d[0] = m;
            fuzz_request_consumer(&d);
        }
    }

    #[test]
    fn seed_with_valid_requests() {
        // mode 0: honest queue; slots: SOCKET, CONNECT (refused port on loopback),
        // CONNECT to a non-loopback address (refused by policy), garbage op.
        let mut d = vec![0u8];
        d.extend(slot_bytes(op::SOCKET, 0, [10, 1, 0, 0], &[]));
        d.extend(slot_bytes(
            op::CONNECT,
            canal_abi::make_handle(0, 1),
            [0; 4],
            &CanalAddr::v4([127, 0, 0, 1], 1).encode(),
        ));
        d.extend(slot_bytes(
            op::CONNECT,
            canal_abi::make_handle(1, 1),
            [0; 4],
            &CanalAddr::v4([192, 0, 2, 1], 80).encode(),
        ));
        d.extend(slot_bytes(0xdead, 7, [u64::MAX; 4], &[0xff; 384]));
        let o = fuzz_request_consumer(&d);
        assert_eq!(o.popped, 4);
        let res: Vec<i64> = o.done.iter().map(|x| x.1).collect();
        // A new handle (index 2, generation 1); connect in progress or refused;
        // EACCES from the policy; ENOSYS.
        assert_eq!(res[0], canal_abi::make_handle(2, 1) as i64);
        assert!(res[1] == -115 || res[1] == -111, "{res:?}");
        assert_eq!(res[2], -(canal_abi::errno::EACCES as i64));
        assert_eq!(res[3], -(canal_abi::errno::ENOSYS as i64));
        // The same with socket entries that claim huge ring indices.
        let mut e = d.clone();
        e.extend(vec![0xffu8; 1024]);
        fuzz_request_consumer(&e);
    }
}
