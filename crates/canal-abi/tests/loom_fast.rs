//! Model check of fast connects' tickets (protocol §8.10) with loom:
//! `RUSTFLAGS="--cfg loom" cargo test -p canal-abi --test loom_fast --release`.
//! A guest claims a ticket while canald withdraws the record and lists another
//! listener in it, with a new ticket at the same index.
#![cfg(loom)]

use canal_abi::fast::{state, Record, Ticket};
use canal_abi::sync::{AtomicU32, AtomicU64, Ordering};
use canal_abi::CanalAddr;
use loom::sync::Arc;
use loom::thread;

fn ticket(segment: u32) -> Ticket {
    Ticket {
        arena: AtomicU32::new(1),
        arena_offset: AtomicU32::new(0),
        segment: AtomicU32::new(segment),
        rings: AtomicU32::new(16384),
        ring_size: AtomicU32::new(4096),
        port: AtomicU32::new(40000),
    }
}

/// A record listing port `port` with ticket 0 (segment 100) ready, sequence 2.
fn record(port: u16) -> Record {
    let r = Record {
        state: AtomicU64::new(state(2, 0b1)),
        family: AtomicU32::new(2),
        port: AtomicU32::new(0),
        addr: [
            AtomicU32::new(0),
            AtomicU32::new(0),
            AtomicU32::new(0),
            AtomicU32::new(0),
        ],
        tickets: [ticket(100), ticket(0), ticket(0), ticket(0)],
    };
    r.set_destination(&CanalAddr::v4([127, 0, 0, 1], port));
    r
}

/// Whatever the interleaving: a claim for the first listener gets the first
/// listener's ticket (never the one canald wrote for the second at the same index),
/// and the ticket is either the guest's or back with canald, never both or neither.
#[test]
fn a_claim_never_takes_a_ticket_of_the_record_written_after_it() {
    loom::model(|| {
        let r = Arc::new(record(1));
        let canald = {
            let r = r.clone();
            thread::spawn(move || {
                let (odd, ready) = r.withdraw();
                // Another listener (the port is the part of the destination that
                // differs; the model keeps the rest still to stay small).
                r.port.store(2, Ordering::Relaxed);
                r.publish(odd, 0);
                // A ticket for the new listener, at the index the old one had.
                r.tickets[0].segment.store(200, Ordering::Relaxed);
                let (odd, keep) = r.withdraw();
                r.publish(odd, keep | 0b1);
                ready & 0b1 != 0
            })
        };
        let got = r.claim(
            |rec| rec.port.load(Ordering::Relaxed) == 1,
            |t| t.segment.load(Ordering::Relaxed),
        );
        let taken_back = canald.join().unwrap();
        match got {
            Some((0, seg)) => {
                assert_eq!(seg, 100, "a ticket of the record written after the claim");
                assert!(!taken_back, "claimed and taken back");
            }
            None => assert!(taken_back, "neither claimed nor taken back"),
            Some(other) => panic!("claimed {other:?}"),
        }
    });
}
