//! The guest image: a host kernel plus an initramfs (static busybox, the virtio/9p modules
//! that kernel needs, and `guest/init.sh`), built once and cached.
//!
//! The initramfs is an uncompressed `newc` cpio written here, so building it needs no
//! external tool (modules compressed with xz/zstd are unpacked with `xz`/`zstd` if present).

use std::collections::{HashMap, HashSet};
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The guest's PID 1. Its hash is part of the cache key.
pub(crate) const INIT_SCRIPT: &str = include_str!("../guest/init.sh");

/// Modules the guest needs, in no particular order; dependencies are added from
/// `modules.dep`. A module the kernel has built in (absent from `modules.dep` but listed in
/// `modules.builtin`) is skipped.
pub(crate) const WANTED_MODULES: &[&str] = &[
    "virtio_pci",
    "virtio_console",
    "9pnet_virtio",
    "9p",
    "virtio_net",
];

/// Loaded only when the guest has an ivshmem-doorbell device: vfio-pci lets the guest
/// program receive the device's MSI-X interrupts on an eventfd (needs an IOMMU, which the
/// harness adds for doorbell guests). Optional: a kernel without them cannot use doorbells.
pub(crate) const DOORBELL_MODULES: &[&str] = &["vfio_pci", "vfio_iommu_type1"];

/// Bumped whenever the image layout changes in a way the hashed inputs do not show.
const FORMAT_VERSION: u32 = 1;

/// A bootable guest: kernel and initramfs paths.
#[derive(Debug, Clone)]
pub(crate) struct GuestImage {
    /// The host's compressed kernel (/boot/vmlinuz-VERSION).
    pub(crate) kernel: PathBuf,
    /// What QEMU boots: the uncompressed ELF vmlinux (cached, PVH entry) when it could be
    /// extracted from `kernel`, else `kernel` itself. Under TCG the uncompressed kernel
    /// saves the ~3 s the emulated decompressor takes.
    pub(crate) boot_kernel: PathBuf,
    pub(crate) kernel_version: String,
    pub(crate) initramfs: PathBuf,
    /// The initramfs has the vfio modules (DOORBELL_MODULES): the guest can take an
    /// ivshmem-doorbell device's interrupts.
    pub(crate) doorbell: bool,
}

/// The host kernel to boot: `$CANAL_VM_KERNEL` (a vmlinuz-VERSION path) if set, else the
/// newest /boot/vmlinuz-VERSION that has /lib/modules/VERSION.
pub(crate) fn find_kernel() -> io::Result<(PathBuf, String)> {
    if let Ok(k) = std::env::var("CANAL_VM_KERNEL") {
        let p = PathBuf::from(&k);
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let ver = name.strip_prefix("vmlinuz-").ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("CANAL_VM_KERNEL={k}: file name must be vmlinuz-VERSION"),
            )
        })?;
        return Ok((p.clone(), ver.to_string()));
    }
    let mut found: Vec<(Vec<u64>, String)> = Vec::new();
    for e in fs::read_dir("/boot")? {
        let name = e?.file_name().to_string_lossy().into_owned();
        if let Some(ver) = name.strip_prefix("vmlinuz-") {
            if Path::new("/lib/modules")
                .join(ver)
                .join("modules.dep")
                .exists()
            {
                found.push((version_key(ver), ver.to_string()));
            }
        }
    }
    found.sort();
    match found.pop() {
        Some((_, ver)) => Ok((PathBuf::from(format!("/boot/vmlinuz-{ver}")), ver)),
        None => Err(io::Error::new(
            io::ErrorKind::NotFound,
            "no /boot/vmlinuz-VERSION with /lib/modules/VERSION/modules.dep \
             (install linux-image-amd64 or set CANAL_VM_KERNEL)",
        )),
    }
}

fn version_key(v: &str) -> Vec<u64> {
    v.split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap_or(0))
        .collect()
}

/// A static busybox: `$CANAL_VM_BUSYBOX`, else /bin/busybox or /usr/bin/busybox.
pub(crate) fn find_busybox() -> io::Result<PathBuf> {
    let candidates: Vec<PathBuf> = match std::env::var("CANAL_VM_BUSYBOX") {
        Ok(p) => vec![PathBuf::from(p)],
        Err(_) => vec!["/bin/busybox".into(), "/usr/bin/busybox".into()],
    };
    for c in candidates {
        if let Ok(bytes) = fs::read(&c) {
            if is_static_elf(&bytes) {
                return Ok(c);
            }
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "{} is not a static ELF executable (install busybox-static)",
                    c.display()
                ),
            ));
        }
    }
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        "no busybox found (install busybox-static)",
    ))
}

/// True for a 64-bit little-endian ELF with no PT_INTERP program header.
fn is_static_elf(b: &[u8]) -> bool {
    if b.len() < 64 || &b[..4] != b"\x7fELF" || b[4] != 2 || b[5] != 1 {
        return false;
    }
    let phoff = u64::from_le_bytes(b[0x20..0x28].try_into().unwrap()) as usize;
    let phentsize = u16::from_le_bytes([b[0x36], b[0x37]]) as usize;
    let phnum = u16::from_le_bytes([b[0x38], b[0x39]]) as usize;
    for i in 0..phnum {
        let off = phoff + i * phentsize;
        if off + 4 > b.len() {
            return false;
        }
        let p_type = u32::from_le_bytes(b[off..off + 4].try_into().unwrap());
        if p_type == 3 {
            return false; // PT_INTERP: dynamically linked
        }
    }
    true
}

/// Module files (paths relative to /lib/modules/VERSION) in load order: dependencies first.
pub(crate) fn resolve_modules(kver: &str, wanted: &[&str]) -> io::Result<Vec<String>> {
    let base = Path::new("/lib/modules").join(kver);
    let dep = fs::read_to_string(base.join("modules.dep"))?;
    let builtin = fs::read_to_string(base.join("modules.builtin")).unwrap_or_default();
    // modules.dep: "kernel/fs/9p/9p.ko: kernel/net/9p/9pnet.ko ..."
    let mut deps: HashMap<String, Vec<String>> = HashMap::new();
    let mut by_name: HashMap<String, String> = HashMap::new();
    for line in dep.lines() {
        let Some((m, rest)) = line.split_once(':') else {
            continue;
        };
        by_name.insert(module_name(m), m.to_string());
        deps.insert(
            m.to_string(),
            rest.split_whitespace().map(str::to_string).collect(),
        );
    }
    let builtin: HashSet<String> = builtin.lines().map(module_name).collect();
    let mut order = Vec::new();
    let mut seen = HashSet::new();
    fn visit(
        m: &str,
        deps: &HashMap<String, Vec<String>>,
        seen: &mut HashSet<String>,
        order: &mut Vec<String>,
    ) {
        if !seen.insert(m.to_string()) {
            return;
        }
        for d in deps.get(m).into_iter().flatten() {
            visit(d, deps, seen, order);
        }
        order.push(m.to_string());
    }
    for w in wanted {
        let key = w.replace('-', "_");
        match by_name.get(&key) {
            Some(path) => visit(path, &deps, &mut seen, &mut order),
            None if builtin.contains(&key) => {}
            None => {
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!(
                        "kernel {kver} has no module {w} (neither in modules.dep nor built in)"
                    ),
                ))
            }
        }
    }
    Ok(order)
}

/// "kernel/fs/9p/9p.ko.xz" -> "9p"; dashes normalised to underscores like modprobe does.
fn module_name(path: &str) -> String {
    let file = path.rsplit('/').next().unwrap_or(path);
    let stem = file.split(".ko").next().unwrap_or(file);
    stem.replace('-', "_")
}

/// Reads a module, unpacking .ko.xz / .ko.zst / .ko.gz with the host's tools.
fn read_module(path: &Path) -> io::Result<Vec<u8>> {
    let name = path.to_string_lossy();
    let tool = if name.ends_with(".xz") {
        Some("xz")
    } else if name.ends_with(".zst") {
        Some("zstd")
    } else if name.ends_with(".gz") {
        Some("gzip")
    } else {
        None
    };
    match tool {
        None => fs::read(path),
        Some(t) => {
            let out = Command::new(t).arg("-dc").arg(path).output().map_err(|e| {
                io::Error::new(e.kind(), format!("{t} -dc {}: {e}", path.display()))
            })?;
            if !out.status.success() {
                return Err(io::Error::other(format!(
                    "{t} -dc {} failed",
                    path.display()
                )));
            }
            Ok(out.stdout)
        }
    }
}

/// FNV-1a, 64 bit: a cache key, not a security boundary.
pub(crate) fn fnv1a(seed: u64, data: &[u8]) -> u64 {
    let mut h = seed;
    for &b in data {
        h ^= b as u64;
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}
pub(crate) const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// The cache directory: $XDG_CACHE_HOME/canal-vm, else ~/.cache/canal-vm.
pub(crate) fn cache_dir() -> PathBuf {
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME").filter(|x| !x.is_empty()) {
        return PathBuf::from(x).join("canal-vm");
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/tmp".into());
    PathBuf::from(home).join(".cache").join("canal-vm")
}

/// Returns the cached image for the host kernel, building the initramfs if needed.
pub(crate) fn ensure_image() -> io::Result<GuestImage> {
    let (kernel, kver) = find_kernel()?;
    if fs::File::open(&kernel).is_err() {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("cannot read {}", kernel.display()),
        ));
    }
    let busybox = find_busybox()?;
    let modules = resolve_modules(&kver, WANTED_MODULES)?;
    let doorbell_modules: Vec<String> = resolve_modules(&kver, DOORBELL_MODULES)
        .unwrap_or_default()
        .into_iter()
        .filter(|m| !modules.contains(m))
        .collect();
    let has_doorbell_modules = !doorbell_modules.is_empty();
    let bb_meta = fs::metadata(&busybox)?;
    let mut h = fnv1a(FNV_OFFSET, &FORMAT_VERSION.to_le_bytes());
    h = fnv1a(h, INIT_SCRIPT.as_bytes());
    h = fnv1a(h, modules.join("\n").as_bytes());
    h = fnv1a(h, doorbell_modules.join("\n").as_bytes());
    h = fnv1a(h, busybox.to_string_lossy().as_bytes());
    h = fnv1a(h, &bb_meta.len().to_le_bytes());
    let mtime = bb_meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_secs())
        .unwrap_or(0);
    h = fnv1a(h, &mtime.to_le_bytes());
    let dir = cache_dir().join(format!("{kver}-{h:016x}"));
    let initramfs = dir.join("initramfs.cpio");
    if !initramfs.exists() {
        fs::create_dir_all(&dir)?;
        let tmp = dir.join(format!("initramfs.cpio.tmp{}", std::process::id()));
        let res = build_initramfs(&tmp, &busybox, &kver, &modules, &doorbell_modules);
        if let Err(e) = res {
            let _ = fs::remove_file(&tmp);
            return Err(e);
        }
        fs::rename(&tmp, &initramfs)?;
    }
    let boot_kernel = if std::env::var_os("CANAL_VM_NO_PVH").is_some() {
        kernel.clone()
    } else {
        pvh_kernel(&kernel, &kver).unwrap_or_else(|| kernel.clone())
    };
    Ok(GuestImage {
        kernel,
        boot_kernel,
        kernel_version: kver,
        initramfs,
        doorbell: has_doorbell_modules,
    })
}

/// The uncompressed vmlinux inside a bzImage, cached, if it is an ELF with a PVH entry
/// note (QEMU then boots it directly with `-kernel`). None if it cannot be had.
fn pvh_kernel(bzimage: &Path, kver: &str) -> Option<PathBuf> {
    let meta = fs::metadata(bzimage).ok()?;
    let mtime = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let mut h = fnv1a(FNV_OFFSET, bzimage.to_string_lossy().as_bytes());
    h = fnv1a(h, &meta.len().to_le_bytes());
    h = fnv1a(h, &mtime.to_le_bytes());
    let dir = cache_dir();
    let out = dir.join(format!("vmlinux-{kver}-{h:016x}"));
    let failed = dir.join(format!("vmlinux-{kver}-{h:016x}.none"));
    if out.exists() {
        return Some(out);
    }
    if failed.exists() {
        return None;
    }
    fs::create_dir_all(&dir).ok()?;
    match extract_vmlinux(bzimage, &dir) {
        Some(elf) if has_pvh_note(&elf) => {
            let tmp = dir.join(format!("vmlinux.tmp{}", std::process::id()));
            fs::write(&tmp, &elf).ok()?;
            fs::rename(&tmp, &out).ok()?;
            Some(out)
        }
        _ => {
            let _ = fs::write(&failed, "no PVH-capable vmlinux could be extracted\n");
            None
        }
    }
}

/// Finds a compressed payload in a bzImage (xz, zstd or gzip magic) and unpacks it with
/// the host's tool, like the kernel's scripts/extract-vmlinux.
fn extract_vmlinux(bzimage: &Path, tmpdir: &Path) -> Option<Vec<u8>> {
    let data = fs::read(bzimage).ok()?;
    let kinds: [(&[u8], &str, &[&str]); 3] = [
        (b"\xfd7zXZ\x00", "xz", &["-dc", "--single-stream"]),
        (b"\x28\xb5\x2f\xfd", "zstd", &["-dcq"]),
        (b"\x1f\x8b\x08", "gzip", &["-dcq"]),
    ];
    for (magic, tool, args) in kinds {
        let mut from = 0;
        while let Some(pos) = find(&data[from..], magic).map(|p| p + from) {
            from = pos + 1;
            let part = tmpdir.join(format!("payload.tmp{}", std::process::id()));
            if fs::write(&part, &data[pos..]).is_err() {
                return None;
            }
            let out = Command::new(tool)
                .args(args)
                .arg(&part)
                .stderr(std::process::Stdio::null())
                .output();
            let _ = fs::remove_file(&part);
            // Trailing bytes after the stream make some tools exit non-zero; what counts
            // is whether an ELF came out.
            if let Ok(o) = out {
                if o.stdout.len() > (1 << 20) && o.stdout.starts_with(b"\x7fELF") {
                    return Some(o.stdout);
                }
            }
        }
    }
    None
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// True if a 64-bit ELF has the Xen ELF note XEN_ELFNOTE_PHYS32_ENTRY (type 18), which is
/// what QEMU's PVH boot of `-kernel vmlinux` needs.
fn has_pvh_note(b: &[u8]) -> bool {
    let rd32 = |o: usize| {
        b.get(o..o + 4)
            .map(|s| u32::from_le_bytes(s.try_into().unwrap()))
    };
    let rd64 = |o: usize| {
        b.get(o..o + 8)
            .map(|s| u64::from_le_bytes(s.try_into().unwrap()))
    };
    if b.len() < 64 || &b[..4] != b"\x7fELF" || b[4] != 2 {
        return false;
    }
    let phoff = rd64(0x20).unwrap_or(0) as usize;
    let phentsize = u16::from_le_bytes([b[0x36], b[0x37]]) as usize;
    let phnum = u16::from_le_bytes([b[0x38], b[0x39]]) as usize;
    for i in 0..phnum {
        let ph = phoff + i * phentsize;
        if rd32(ph) != Some(4) {
            continue; // not PT_NOTE
        }
        let (Some(off), Some(size)) = (rd64(ph + 8), rd64(ph + 32)) else {
            return false;
        };
        let (mut p, end) = (off as usize, (off + size) as usize);
        while p + 12 <= end {
            let (Some(namesz), Some(descsz), Some(ty)) = (rd32(p), rd32(p + 4), rd32(p + 8)) else {
                return false;
            };
            let name_at = p + 12;
            let name = b.get(name_at..name_at + namesz as usize).unwrap_or(&[]);
            if ty == 18 && name.starts_with(b"Xen") {
                return true;
            }
            p = name_at + (namesz as usize).div_ceil(4) * 4 + (descsz as usize).div_ceil(4) * 4;
        }
    }
    false
}

fn build_initramfs(
    out: &Path,
    busybox: &Path,
    kver: &str,
    modules: &[String],
    doorbell_modules: &[String],
) -> io::Result<()> {
    let mut c = Cpio::new(io::BufWriter::new(fs::File::create(out)?));
    for d in ["bin", "dev", "proc", "sys", "newroot", "modules"] {
        c.dir(d)?;
    }
    c.node("dev/console", 0o020600, 5, 1)?;
    c.file("bin/busybox", 0o755, &fs::read(busybox)?)?;
    c.symlink("bin/sh", "busybox")?;
    c.file("init", 0o755, INIT_SCRIPT.as_bytes())?;
    let base = Path::new("/lib/modules").join(kver);
    for (set, list_name) in [
        (modules, "modules.list"),
        (doorbell_modules, "modules-doorbell.list"),
    ] {
        let mut list = String::new();
        for m in set {
            let name = format!("{}.ko", module_name(m));
            c.file(
                &format!("modules/{name}"),
                0o644,
                &read_module(&base.join(m))?,
            )?;
            list.push_str(&name);
            list.push('\n');
        }
        c.file(list_name, 0o644, list.as_bytes())?;
    }
    let mut w = c.finish()?;
    w.flush()?;
    w.into_inner().map_err(|e| e.into_error())?.sync_all()
}

/// A `newc` (SVR4, no CRC) cpio archive writer: what the kernel's initramfs unpacker reads.
struct Cpio<W: Write> {
    w: W,
    ino: u32,
    written: u64,
}

impl<W: Write> Cpio<W> {
    fn new(w: W) -> Self {
        Cpio {
            w,
            ino: 1,
            written: 0,
        }
    }

    fn entry(&mut self, name: &str, mode: u32, rdev: (u32, u32), data: &[u8]) -> io::Result<()> {
        let nlink = if mode & 0o170000 == 0o040000 { 2 } else { 1 };
        let hdr = format!(
            "070701{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}",
            self.ino,
            mode,
            0,
            0,
            nlink,
            0,
            data.len(),
            0,
            0,
            rdev.0,
            rdev.1,
            name.len() + 1,
            0
        );
        self.ino += 1;
        self.put(hdr.as_bytes())?;
        self.put(name.as_bytes())?;
        self.put(&[0])?;
        self.pad()?;
        self.put(data)?;
        self.pad()
    }

    fn put(&mut self, b: &[u8]) -> io::Result<()> {
        self.w.write_all(b)?;
        self.written += b.len() as u64;
        Ok(())
    }

    fn pad(&mut self) -> io::Result<()> {
        let n = (4 - (self.written % 4) as usize) % 4;
        self.put(&[0u8; 3][..n])
    }

    fn dir(&mut self, name: &str) -> io::Result<()> {
        self.entry(name, 0o040755, (0, 0), &[])
    }
    fn file(&mut self, name: &str, perm: u32, data: &[u8]) -> io::Result<()> {
        self.entry(name, 0o100000 | perm, (0, 0), data)
    }
    fn symlink(&mut self, name: &str, target: &str) -> io::Result<()> {
        self.entry(name, 0o120777, (0, 0), target.as_bytes())
    }
    fn node(&mut self, name: &str, mode: u32, major: u32, minor: u32) -> io::Result<()> {
        self.entry(name, mode, (major, minor), &[])
    }
    fn finish(mut self) -> io::Result<W> {
        self.entry("TRAILER!!!", 0, (0, 0), &[])?;
        Ok(self.w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpio_layout_is_newc_and_aligned() {
        let mut c = Cpio::new(Vec::new());
        c.file("ab", 0o644, b"xyz").unwrap();
        let v = c.finish().unwrap();
        assert_eq!(&v[..6], b"070701");
        // 110-byte header + "ab\0" = 113 -> padded to 116; data 3 -> 120.
        assert_eq!(&v[110..113], b"ab\0");
        assert_eq!(&v[116..119], b"xyz");
        assert_eq!(&v[120..126], b"070701");
        assert_eq!(v.len() % 4, 0);
        let trailer = &v[120 + 110..120 + 110 + 10];
        assert_eq!(trailer, b"TRAILER!!!");
    }

    #[test]
    fn module_names() {
        assert_eq!(module_name("kernel/fs/9p/9p.ko"), "9p");
        assert_eq!(
            module_name("kernel/net/9p/9pnet_virtio.ko.xz"),
            "9pnet_virtio"
        );
        assert_eq!(module_name("kernel/x/virtio-foo.ko"), "virtio_foo");
    }

    #[test]
    fn static_elf_detection() {
        assert!(!is_static_elf(b"not an elf"));
        if let Ok(b) = fs::read("/bin/sh") {
            // /bin/sh on any glibc distribution is dynamically linked.
            assert!(!is_static_elf(&b));
        }
    }

    #[test]
    fn pvh_note_found_in_the_host_kernel() {
        // Only where a kernel built with CONFIG_PVH is installed (Debian's is).
        let Ok((k, ver)) = find_kernel() else { return };
        let config = fs::read_to_string(format!("/boot/config-{ver}")).unwrap_or_default();
        if !config.lines().any(|l| l == "CONFIG_PVH=y") || fs::File::open(&k).is_err() {
            return;
        }
        let dir = std::env::temp_dir().join(format!("canal-vm-unit-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let elf = extract_vmlinux(&k, &dir);
        let _ = fs::remove_dir_all(&dir);
        let elf = elf.expect("vmlinux extracted");
        assert!(has_pvh_note(&elf));
        if let Ok(sh) = fs::read("/bin/sh") {
            assert!(!has_pvh_note(&sh));
        }
    }

    #[test]
    fn versions_sort_numerically() {
        assert!(version_key("6.10.0-1-amd64") > version_key("6.9.0-1-amd64"));
    }
}
