//! Choosing between KVM and TCG.
//!
//! `/dev/kvm` existing does not mean KVM can boot an ordinary guest (nested or
//! para-virtualized hosts may hang such guests), so `--accel auto` boots the harness guest
//! once under KVM with `true` as the program and uses KVM only if the guest said READY
//! within the probe timeout. The answer is cached per (host kernel, guest kernel, QEMU
//! binary) in the cache directory.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::image::{self, GuestImage};
use crate::qemu::Accel;

/// How long the probe waits for the ready line ($CANAL_VM_KVM_PROBE_TIMEOUT seconds).
pub(crate) fn probe_timeout() -> Duration {
    let secs = std::env::var("CANAL_VM_KVM_PROBE_TIMEOUT")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| *s > 0.0)
        .unwrap_or(20.0);
    Duration::from_secs_f64(secs)
}

/// The cached verdict: Ok(()) if KVM boots the guest, Err(reason) otherwise.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Verdict(pub Result<(), String>);

impl Verdict {
    fn encode(&self) -> String {
        match &self.0 {
            Ok(()) => "ok\n".into(),
            Err(r) => format!("fail {r}\n"),
        }
    }
    fn decode(s: &str) -> Option<Verdict> {
        let s = s.trim_end();
        if s == "ok" {
            Some(Verdict(Ok(())))
        } else {
            s.strip_prefix("fail ").map(|r| Verdict(Err(r.to_string())))
        }
    }
}

/// Where the verdict for this host kernel, guest kernel and QEMU binary is cached.
pub(crate) fn cache_file(img: &GuestImage, qemu: &Path) -> PathBuf {
    cache_file_for(&img.kernel, &img.kernel_version, qemu)
}

/// The same, from the guest kernel alone (no image built): `canal vm probe` reads the
/// verdict without building anything.
pub(crate) fn cache_file_for(kernel: &Path, kernel_version: &str, qemu: &Path) -> PathBuf {
    let host = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let qmeta = fs::metadata(qemu)
        .ok()
        .and_then(|m| m.modified().ok())
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let mut h = image::fnv1a(image::FNV_OFFSET, host.trim().as_bytes());
    h = image::fnv1a(h, kernel_version.as_bytes());
    h = image::fnv1a(h, kernel.to_string_lossy().as_bytes());
    // What boots is derived from `kernel`: the extracted vmlinux unless CANAL_VM_NO_PVH.
    h = image::fnv1a(
        h,
        &[u8::from(std::env::var_os("CANAL_VM_NO_PVH").is_some())],
    );
    h = image::fnv1a(h, qemu.to_string_lossy().as_bytes());
    h = image::fnv1a(h, &qmeta.to_le_bytes());
    image::cache_dir().join(format!("kvm-probe-{h:016x}"))
}

/// Reads the cached verdict, if any.
pub(crate) fn cached(img: &GuestImage, qemu: &Path) -> Option<Verdict> {
    read_verdict(&cache_file(img, qemu))
}

/// The verdict stored in `file`, if it holds one.
pub(crate) fn read_verdict(file: &Path) -> Option<Verdict> {
    Verdict::decode(&fs::read_to_string(file).ok()?)
}

/// Stores a verdict (best effort: a failure only means probing again next time).
pub(crate) fn store(img: &GuestImage, qemu: &Path, v: &Verdict) {
    let p = cache_file(img, qemu);
    if let Some(d) = p.parent() {
        let _ = fs::create_dir_all(d);
    }
    let tmp = p.with_extension(format!("tmp{}", std::process::id()));
    if fs::write(&tmp, v.encode()).is_ok() {
        let _ = fs::rename(&tmp, &p);
    }
}

/// Why KVM cannot even be tried, if that is so.
pub(crate) fn kvm_unavailable() -> Option<String> {
    match fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
    {
        Ok(_) => None,
        Err(e) => Some(format!("cannot open /dev/kvm: {e}")),
    }
}

/// Picks the accelerator for `--accel auto`: KVM if the (cached) probe says it boots the
/// guest, TCG otherwise, with the reason. `run_probe` returns the verdict and whether it
/// is one about KVM (an interrupted probe is not, and is not cached).
pub(crate) fn choose_auto(
    img: &GuestImage,
    qemu: &Path,
    run_probe: impl FnOnce() -> (Verdict, bool),
) -> (Accel, Option<String>) {
    if let Some(r) = kvm_unavailable() {
        return (Accel::Tcg, Some(r));
    }
    let v = match cached(img, qemu) {
        Some(v) => v,
        None => {
            let (v, cacheable) = run_probe();
            if cacheable {
                store(img, qemu, &v);
            }
            v
        }
    };
    match v.0 {
        Ok(()) => (Accel::Kvm, None),
        Err(r) => (
            Accel::Tcg,
            Some(format!(
                "KVM probe failed: {r} (cached in {}; delete it to probe again)",
                cache_file(img, qemu).display()
            )),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdict_roundtrip() {
        for v in [
            Verdict(Ok(())),
            Verdict(Err("no ready line in 20 s".into())),
        ] {
            assert_eq!(Verdict::decode(&v.encode()), Some(v));
        }
        assert_eq!(Verdict::decode("garbage"), None);
    }
}
