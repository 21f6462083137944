//! Fuzz entry point for a VM's region: the VM_REGION body a client sends (decoded,
//! validated, sized by `vm_guest_config`) and then the region itself as the VM writes
//! it — header fields a guest may write (spare head, backoff kickers, ...), slots,
//! queue, socket entries and ring bytes — served as canald serves a VM guest (the VM's
//! network view, no eventfds).
//!
//! The input: `len u16 LE`, a VM_REGION body of that length, then the region bytes.
//! Region files are memfds of at most 4 MiB (larger requested sizes are clamped), so
//! nothing is created in /dev/shm.
#![forbid(unsafe_code)]

use crate::guest::config::GuestConfig;
use crate::guest::netview::NetView;
use crate::guest::state::Guest;
use crate::sys::Epoll;
use crate::vm::{vm_guest_config, VmRegion};
use canal_abi::Layout;
use std::sync::Arc;

const MAX_FILE: u64 = 4 << 20;

fn base() -> GuestConfig {
    GuestConfig {
        budget: 8,
        loopback_only: true,
        ..GuestConfig::with_layout(
            Layout::new(16, 16, 16 * canal_abi::DATA_CHUNK).expect("valid base layout"),
            canal_abi::DATA_CHUNK,
        )
    }
}

/// Runs one input; returns whether the body was a valid VM_REGION (seed tests).
pub fn fuzz_vm_region(data: &[u8]) -> bool {
    let n = data
        .get(..2)
        .map_or(0, |b| u16::from_le_bytes([b[0], b[1]]) as usize);
    let rest = data.get(2..).unwrap_or(&[]);
    let (body, region_bytes) = rest.split_at(n.min(rest.len()));
    let Some(req) = VmRegion::decode(body) else {
        return false;
    };
    // What decodes re-encodes to the same bytes (nothing is silently dropped).
    assert_eq!(req.encode().as_deref(), Some(body), "VM_REGION round trip");
    let net = Arc::new(NetView::new(
        format!("vm:{}", req.name),
        [127, 100, 0, 1],
        Vec::new(),
        None,
        None,
    ));
    let size = req.file_size.clamp(1 << 20, MAX_FILE).next_power_of_two();
    let Ok(cfg) = vm_guest_config(&base(), size, net.clone()) else {
        return true;
    };
    assert!(
        cfg.layout.region_size <= size,
        "a layout larger than its file"
    );
    // The full size asked for is judged the same way (without mapping it).
    if let Ok(c) = vm_guest_config(&base(), req.file_size, net) {
        assert!(c.layout.region_size <= req.file_size);
    }
    let Ok(file) = rustix::fs::memfd_create("canal-fuzz-vm", rustix::fs::MemfdFlags::CLOEXEC)
        .and_then(|f| rustix::fs::ftruncate(&f, size).map(|()| f))
    else {
        return true;
    };
    let features = canal_abi::feature::ALL_V1 & !canal_abi::feature::PORT_EVENTFD;
    let Ok((map, region)) = crate::sys::Mapping::init_file_region(&file, cfg.layout, 1, features)
    else {
        return true;
    };
    let Ok(ep) = Epoll::new() else { return true };
    let mut g = Guest::with_region(1, 1, 0, "vm:fuzz".into(), cfg, map, region);
    // The header's guest-writable words, then the rest as a process guest's.
    let header = std::mem::size_of::<canal_abi::region::RegionHeader>().min(region_bytes.len());
    let (head, tail) = region_bytes.split_at(header.min(256));
    write_guest_header(&g, head);
    super::requests::serve_over(&mut g, &ep, tail);
    g.close_all(&ep);
    true
}

/// Lays `b` over the words of the header a guest may write (canald wrote the rest and
/// never reads it back as truth).
fn write_guest_header(g: &Guest, b: &[u8]) {
    use canal_abi::sync::Ordering;
    let h = g.region().header();
    let word = |i: usize| {
        b.get(4 * i..4 * i + 4)
            .map_or(0, |w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]))
    };
    h.spare_head.store(word(0), Ordering::Relaxed);
    h.backoff_kickers.store(word(1), Ordering::Relaxed);
    // (queue_tail is the guests' own: canald's consumer reads only the cells, which
    // `serve_over` lays from the input.)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(req: &VmRegion, region: &[u8]) -> Vec<u8> {
        let body = req.encode().unwrap();
        let mut d = (body.len() as u16).to_le_bytes().to_vec();
        d.extend(body);
        d.extend_from_slice(region);
        d
    }

    #[test]
    fn seeds() {
        assert!(!fuzz_vm_region(&[]));
        assert!(!fuzz_vm_region(&[0xff; 300]));
        let req = VmRegion {
            file_size: 2 << 20,
            flags: 0,
            name: "fz".into(),
            publish: vec![(8080, 80)],
        };
        assert!(fuzz_vm_region(&input(&req, &[])));
        assert!(fuzz_vm_region(&input(&req, &[0xff; 70_000])));
        // A huge size is judged (refused) without mapping it.
        let big = VmRegion {
            file_size: 1 << 40,
            ..req.clone()
        };
        assert!(fuzz_vm_region(&input(&big, &[1; 5000])));
    }
}
