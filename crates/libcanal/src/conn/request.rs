//! Requests to canald: kicking its doorbell, publishing a slot, and waiting for the answer.
use crate::conn::guest::control_hung_up;
use crate::conn::guest::is_dead;
use crate::conn::guest::mark_dead;
use crate::conn::guest::Guest;
use crate::conn::sleep::YIELD_NS;
use crate::conn::slots::my_slot;
use crate::conn::slots::SlotRef;
use crate::notify;
use crate::sys;
use canal_abi::queue::QueueProducer;
use canal_abi::sleep_kind;
use canal_abi::slot_state;
use canal_abi::sync::fence;
use canal_abi::sync::Ordering;
use canal_abi::SLOT_PAYLOAD;

/// Tells the host there is new work (§6): fence, then wake it only if it sleeps.
pub(crate) fn kick(g: &Guest) {
    let h = g.region.header();
    // K1: SeqCst fence between our publication (request state / ring index /
    // attention bit) and the load of host_sleeping; pairs with the host's fence between
    // storing host_sleeping = 1 and re-checking for work (Dekker).
    fence(Ordering::SeqCst);
    if h.host_sleeping.load(Ordering::Relaxed) != 0
        && h.host_sleeping.swap(0, Ordering::AcqRel) == 1
    {
        if g.doorbell() >= 0 {
            if crate::ownfd::using(|| sys::eventfd_signal(g.doorbell())).is_err() {
                mark_dead();
            }
        } else {
            // Over ivshmem: the device's Doorbell register if the region has one and
            // this process mapped it (§9.5); else canald's sleep is bounded (§9.4).
            crate::conn::ivshmem::ring();
        }
        h.kicks.fetch_add(1, Ordering::Relaxed);
    }
}

/// Marks socket `index` for the host's attention (A1) and kicks the worker that owns
/// it (virtual RSS, protocol §6.3), or the home worker.
pub(crate) fn attention(g: &Guest, index: u32) {
    g.region.raise_attention(index);
    let n = g.nworkers.load(Ordering::Acquire);
    if n == 0 {
        return kick(g);
    }
    // K1 as in kick: the bit before the owner and sleep words.
    fence(Ordering::SeqCst);
    let w = g
        .region
        .socket(index)
        .map_or(u32::MAX, |e| e.owner.load(Ordering::Relaxed));
    let h = g.region.header();
    let (Some(word), Some(door)) = (h.worker_sleeping.get(w as usize), g.wdoor.get(w as usize))
    else {
        return kick(g);
    };
    if w >= n {
        return kick(g);
    }
    if word.load(Ordering::Relaxed) != 0 && word.swap(0, Ordering::AcqRel) == 1 {
        if sys::eventfd_signal(door.load(Ordering::Relaxed)).is_err() {
            mark_dead();
        }
        h.kicks.fetch_add(1, Ordering::Relaxed);
    }
}

/// Runs one request on the calling thread's slot. `out` receives the payload the host
/// returned; the result is the value (≥ 0) and the payload length, or an errno.
pub(crate) fn request(
    g: &'static Guest,
    op: u32,
    handle: u32,
    args: [u64; 4],
    payload: &[u8],
    out: &mut [u8],
) -> Result<(i64, usize), i32> {
    if is_dead(g) {
        return Err(libc::EIO);
    }
    let s = my_slot(g)?;
    let slot = s.slot;
    if payload.len() > SLOT_PAYLOAD {
        return Err(libc::EINVAL);
    }
    slot.op.store(op, Ordering::Relaxed);
    slot.socket.store(handle, Ordering::Relaxed);
    for (a, v) in slot.args.iter().zip(args) {
        a.store(v, Ordering::Relaxed);
    }
    slot.in_len.store(payload.len() as u32, Ordering::Relaxed);
    slot.out_len.store(0, Ordering::Relaxed);
    slot.write_payload(0, payload);
    let seq = slot.seq.load(Ordering::Relaxed).wrapping_add(1);
    slot.seq.store(seq, Ordering::Relaxed);
    // S1: Release publishes every field above; pairs with the host's Acquire CAS
    // REQUESTED→BUSY.
    slot.state.store(slot_state::REQUESTED, Ordering::Release);
    let q = QueueProducer::new(g.region.queue_cells(), &g.region.header().queue_tail);
    if q.push(s.idx).is_err() {
        // Cannot happen with an honest region (capacity = slot count).
        slot.state.store(slot_state::IDLE, Ordering::Relaxed);
        return Err(libc::EIO);
    }
    kick(g);
    wait_done(&s)?;
    let result = slot.result.load(Ordering::Relaxed);
    let done_seq = slot.done_seq.load(Ordering::Relaxed);
    let n = (slot.out_len.load(Ordering::Relaxed) as usize)
        .min(SLOT_PAYLOAD)
        .min(out.len());
    slot.read_payload(0, &mut out[..n]);
    slot.state.store(slot_state::IDLE, Ordering::Relaxed);
    if done_seq != seq {
        return Err(libc::EIO);
    }
    if result < 0 {
        let e = result.checked_neg().unwrap_or(libc::EIO as i64);
        return Err(if (1..4096).contains(&e) {
            e as i32
        } else {
            libc::EIO
        });
    }
    Ok((result, n))
}

fn wait_done(s: &SlotRef) -> Result<(), i32> {
    let g = s.g;
    let slot = s.slot;
    let mut spins = 0u32;
    let mut backoff = 1_000i64;
    let budget = notify::spin_iters(&g.wait);
    let t0 = if notify::adaptive(&g.wait) {
        sys::now_ns()
    } else {
        0
    };
    let mut yield_start: Option<i64> = None;
    loop {
        // S2: Acquire pairs with the host's Release store of DONE: result, out_len and
        // the payload are visible.
        if slot.state.load(Ordering::Acquire) == slot_state::DONE {
            if t0 != 0 {
                notify::record(&g.wait, sys::now_ns() - t0);
            }
            return Ok(());
        }
        if spins < budget {
            spins += 1;
            canal_abi::sync::spin_hint();
            if spins.is_multiple_of(notify::POLL_YIELD_EVERY) && g.wait.mode == notify::Mode::Poll {
                if is_dead(g) || control_hung_up(g) {
                    mark_dead();
                    return Err(libc::EIO);
                }
                sys::sched_yield();
                spins = 0; // poll mode: the budget never runs out
            }
            continue;
        }
        if is_dead(g) {
            mark_dead();
            return Err(libc::EIO);
        }
        if s.efd < 0 || g.ctl() < 0 {
            // In a VM (ivshmem): yield for a while first (a sleeping thread wakes late,
            // by timer or by interrupt); then back off without a wake-up port (§9.4),
            // or sleep on the slot's interrupt eventfd (§9.5).
            let now = sys::now_ns();
            let start = *yield_start.get_or_insert(now);
            if now - start < YIELD_NS.load(Ordering::Relaxed) {
                sys::sched_yield();
                continue;
            }
            if s.efd < 0 {
                sys::sleep_ns(backoff);
                backoff = (backoff * 2).min(1_000_000);
                continue;
            }
        }
        slot.sleep.store(sleep_kind::COMPLETION, Ordering::Relaxed);
        // W1: SeqCst fence between publishing `sleep` and re-checking the state; pairs
        // with the host's fence between storing DONE and reading `sleep` (§6).
        fence(Ordering::SeqCst);
        if slot.state.load(Ordering::Acquire) == slot_state::DONE {
            slot.sleep.store(sleep_kind::AWAKE, Ordering::Relaxed);
            return Ok(());
        }
        let mut pf = [
            libc::pollfd {
                fd: s.efd,
                events: libc::POLLIN,
                revents: 0,
            },
            crate::conn::guest::death_pollfd(g),
        ];
        let r = sys::ppoll(&mut pf, Some(1_000_000_000), sys::SigMask::NONE);
        slot.sleep.store(sleep_kind::AWAKE, Ordering::Relaxed);
        if pf[0].revents != 0 {
            crate::conn::slots::drain_port(s.idx, &pf[0]);
        }
        if crate::conn::guest::died(g, &pf[1], r == Ok(0)) {
            mark_dead();
        }
    }
}
