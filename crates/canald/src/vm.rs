//! VM guests: a guest inside a virtual machine reaches canald through a
//! region that a hypervisor maps into the VM (QEMU `memory-backend-file,share=on` +
//! `ivshmem-plain`), not through a control connection of its own.
//!
//! - A host tool (`canal vm run`, or an operator for their own VM) sends VM_REGION on a
//!   control connection: canald creates `/dev/shm/canal-<name>` (mode 0600, created
//!   exclusively), initialises the region in it and registers a guest bound to that
//!   connection. The guest lives until the connection closes or the VM process named
//!   with VM_PID exits (its pidfd is in canald's epoll), whichever comes first; then
//!   all its host sockets close at once and the file is removed.
//! - The region has no PORT_EVENTFD feature (a guest in a VM has no eventfd to hand
//!   over), and the guest cannot ring canald's doorbell: while a VM guest exists the
//!   poller's sleep is bounded (50 µs doubling to 1 ms while idle, see [`Vms`]).
//! - The guest's address view follows QEMU's user networking: 10.0.2.2 is the host's
//!   127.0.0.1, the guest itself is 10.0.2.15 with a loopback of its own; guest
//!   listeners are reachable from the host only on a published port (the network
//!   view of `guest/netview.rs`, shared with isolated process guests).
#![forbid(unsafe_code)]

use crate::client::roundtrip;
use crate::guest::config::GuestConfig;
use crate::guest::netview::NetView;
use crate::guest::socket::token;
use crate::guest::state::Guest;
use crate::sys::{self, Epoll};
use canal_abi::{errno, feature, Layout};
use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;

/// Where region files go; libvirt's `<shmem name='canal-NAME'>` maps the same path.
pub(crate) const SHM_DIR: &str = "/dev/shm";

/// Request slots and sockets of a VM region (smaller than a process region: the
/// region is a PCI BAR, sized by the VM's configuration).
pub(crate) const VM_SLOTS: u32 = 64;
pub(crate) const VM_SOCKETS: u32 = 256;
/// Largest VM region file (256 sockets × two 256 KiB rings need 128 MiB).
pub(crate) const VM_MAX_FILE: u64 = 1 << 30;

/// Bounds of the poller's sleep while a VM guest exists: SLEEP_MIN_NS for the first
/// FAST_SLEEPS sleeps after the last work (a guest in a request/response loop comes
/// back within about a millisecond), then doubling up to SLEEP_MAX_NS.
pub(crate) const SLEEP_MIN_NS: u64 = 50_000;
pub(crate) const SLEEP_MAX_NS: u64 = 1_000_000;
pub(crate) const FAST_SLEEPS: u32 = 20;

/// The guest configuration of a VM region of `file_size` bytes (the region fills the
/// file as far as whole 64 KiB data chunks allow).
pub(crate) fn vm_guest_config(
    base: &GuestConfig,
    file_size: u64,
    net: Arc<NetView>,
) -> Result<GuestConfig, i32> {
    if !file_size.is_power_of_two() || !(1 << 20..=VM_MAX_FILE).contains(&file_size) {
        return Err(errno::EINVAL);
    }
    let sockets = base.layout.socket_count.min(VM_SOCKETS);
    let slots = base.layout.slot_count.min(VM_SLOTS);
    let probe = Layout::new(slots, sockets, canal_abi::DATA_CHUNK).ok_or(errno::EINVAL)?;
    let room = file_size
        .checked_sub(probe.data_offset)
        .ok_or(errno::EINVAL)?;
    let data = room / canal_abi::DATA_CHUNK * canal_abi::DATA_CHUNK;
    let layout = Layout::new(slots, sockets, data).ok_or(errno::EINVAL)?;
    if layout.region_size > file_size {
        return Err(errno::EINVAL);
    }
    // Each socket takes a tx and an rx ring: keep at least 4 sockets' worth.
    let ring = crate::guest::config::ring_for_four_sockets(base.ring_size, data);
    if 2 * ring > data {
        return Err(errno::EINVAL);
    }
    Ok(GuestConfig {
        layout,
        ring_size: ring,
        net: Some(net),
        vm: true,
        ..base.clone()
    })
}

/// A decoded VM_REGION request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct VmRegion {
    pub(crate) file_size: u64,
    /// `canal_abi::control::vm_flag` bits.
    pub(crate) flags: u32,
    pub(crate) name: String,
    /// (host port, guest port).
    pub(crate) publish: Vec<(u16, u16)>,
}

impl VmRegion {
    pub(crate) fn encode(&self) -> Option<Vec<u8>> {
        if !canal_abi::control::valid_vm_name(&self.name)
            || self.publish.len() > canal_abi::control::VM_MAX_PUBLISH
        {
            return None;
        }
        let mut b = vec![0u8; canal_abi::control::VM_REGION_BODY];
        b[0..8].copy_from_slice(&self.file_size.to_le_bytes());
        b[8..12].copy_from_slice(&(self.publish.len() as u32).to_le_bytes());
        b[12..16].copy_from_slice(&self.flags.to_le_bytes());
        b[16..16 + self.name.len()].copy_from_slice(self.name.as_bytes());
        for (h, g) in &self.publish {
            b.extend_from_slice(&h.to_le_bytes());
            b.extend_from_slice(&g.to_le_bytes());
        }
        Some(b)
    }

    /// Decodes and validates a body (untrusted input).
    pub(crate) fn decode(b: &[u8]) -> Option<VmRegion> {
        if b.len() < canal_abi::control::VM_REGION_BODY {
            return None;
        }
        let flags = u32::from_le_bytes(b[12..16].try_into().ok()?);
        if flags & !canal_abi::control::vm_flag::DOORBELL != 0 {
            return None;
        }
        let file_size = u64::from_le_bytes(b[0..8].try_into().ok()?);
        let n = u32::from_le_bytes(b[8..12].try_into().ok()?) as usize;
        if n > canal_abi::control::VM_MAX_PUBLISH
            || b.len() != canal_abi::control::VM_REGION_BODY + 4 * n
        {
            return None;
        }
        let name = canal_abi::control::name_from_field(&b[16..48])?.to_string();
        let publish = b[canal_abi::control::VM_REGION_BODY..]
            .chunks_exact(4)
            .map(|c| {
                (
                    u16::from_le_bytes([c[0], c[1]]),
                    u16::from_le_bytes([c[2], c[3]]),
                )
            })
            .collect();
        Some(VmRegion {
            file_size,
            flags,
            name,
            publish,
        })
    }
}

/// One VM guest's host-side extras, by control-connection key.
struct VmEntry {
    path: PathBuf,
    pidfd: Option<OwnedFd>,
    /// A doorbell VM: its ivshmem server and the region file it hands to QEMU.
    bell: Option<(crate::ivshmem_server::Server, OwnedFd)>,
}

/// What VM_REGION made: the guest, the VM_REGION_OK body, and for a doorbell VM
/// canald's vector eventfd (the poller reads it: a guest kick).
pub(crate) struct Created {
    pub(crate) guest: Guest,
    pub(crate) reply: Vec<u8>,
    pub(crate) host_vector: Option<OwnedFd>,
}

/// The VM guests' bookkeeping in the daemon.
#[derive(Default)]
pub(crate) struct Vms {
    entries: BTreeMap<u32, VmEntry>,
}

/// A poller's bounded sleep while it serves a VM guest (which cannot kick it): the
/// backoff step grows with the sleeps since the poller last found work.
#[derive(Default)]
pub(crate) struct SleepBackoff {
    idle_sleeps: u32,
}

impl SleepBackoff {
    /// The bounded sleep for an epoll timeout of `timeout_ms` (-1: none): the current
    /// backoff step (see SLEEP_MIN_NS).
    pub(crate) fn next_sleep_ns(&mut self, timeout_ms: i32) -> u64 {
        let cap = if timeout_ms < 0 {
            u64::MAX
        } else {
            timeout_ms as u64 * 1_000_000
        };
        let n = self.idle_sleeps.saturating_sub(FAST_SLEEPS).min(16);
        self.idle_sleeps = self.idle_sleeps.saturating_add(1);
        (SLEEP_MIN_NS << n).min(SLEEP_MAX_NS).min(cap)
    }

    /// The poller found work: the next sleeps are short again.
    pub(crate) fn note_work(&mut self) {
        self.idle_sleeps = 0;
    }
}

impl Vms {
    /// VM_REGION: creates the region file and the guest (and, with
    /// `vm_flag::DOORBELL`, the VM's ivshmem server in `bell_dir`, whose listener is
    /// added to `ep`). Errors are (errno, message) for an ERROR reply.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn create(
        &mut self,
        ep: &Epoll,
        key: u32,
        id: u32,
        pid: u32,
        base: &GuestConfig,
        body: &[u8],
        bell_dir: &std::path::Path,
        networks: &mut crate::network::Networks,
    ) -> Result<Created, (i32, String)> {
        if self.entries.contains_key(&key) {
            return Err((
                errno::EINVAL,
                "this connection already has a VM region".into(),
            ));
        }
        let req = VmRegion::decode(body).ok_or((errno::EINVAL, "malformed VM_REGION".into()))?;
        let doorbell = req.flags & canal_abi::control::vm_flag::DOORBELL != 0;
        let net = networks.vm(&req.name, &req.publish)?;
        let cfg = vm_guest_config(base, req.file_size, net).map_err(|e| {
            (
                e,
                format!(
                    "region size {} must be a power of two from 1 MiB to 1 GiB",
                    req.file_size
                ),
            )
        })?;
        let sock = bell_dir.join(format!("ivshmem-{}.sock", req.name));
        if doorbell && sock.as_os_str().len() >= 108 {
            return Err((
                libc::ENAMETOOLONG,
                format!("{}: too long for a socket path", sock.display()),
            ));
        }
        let path = PathBuf::from(format!("{SHM_DIR}/canal-{}", req.name));
        let file = create_file(&path, req.file_size)
            .map_err(|e| (sys::errno_of(&e), format!("{}: {e}", path.display())))?;
        let fail = |e: (i32, String)| {
            let _ = std::fs::remove_file(&path);
            Err(e)
        };
        let mut features = (feature::ALL_V1 | feature::DGRAM_CONTROL | feature::DGRAM_MORE)
            & !feature::PORT_EVENTFD;
        if doorbell {
            features |= feature::DOORBELL;
        }
        let r = sys::Mapping::init_file_region(&file, cfg.layout, id, features);
        let (map, region) = match r {
            Ok(x) => x,
            Err(e) => return fail((sys::errno_of(&e), "cannot map the region file".into())),
        };
        let region_size = cfg.layout.region_size;
        let vectors = cfg.layout.slot_count;
        let mut g = Guest::with_region(id, key, pid, format!("vm:{}", req.name), cfg, map, region);
        let mut bell = None;
        let mut host_vector = None;
        if doorbell {
            let c = match crate::ivshmem_server::Server::create(&sock, vectors) {
                Ok(c) => c,
                Err(e) => return fail((sys::errno_of(&e), format!("{}: {e}", sock.display()))),
            };
            // Slot i sleeps on the guest's vector i: canald's §6 wake-up of slot i is
            // an MSI-X interrupt in the VM.
            for (i, p) in c.ports.into_iter().enumerate() {
                if g.set_port(i as u32, p).is_err() {
                    return fail((errno::EINVAL, "cannot set the VM's wake-up ports".into()));
                }
            }
            g.doorbell = Some(Default::default());
            if let Some(l) = c.server.listener_fd() {
                if ep
                    .add(l, sys::EP_IN, token::make(token::IVSHMEM, key, 0, 0))
                    .is_err()
                {
                    return fail((errno::ENOMEM, "epoll".into()));
                }
            }
            bell = Some((c.server, file));
            host_vector = Some(c.host_vector);
        }
        let mut reply = Vec::with_capacity(canal_abi::control::VM_REGION_OK_BODY + 64);
        reply.extend_from_slice(&id.to_le_bytes());
        reply.extend_from_slice(&(if doorbell { vectors } else { 0 }).to_le_bytes());
        reply.extend_from_slice(&region_size.to_le_bytes());
        reply.extend_from_slice(&req.file_size.to_le_bytes());
        reply.extend_from_slice(path.as_os_str().as_encoded_bytes());
        if doorbell {
            reply.push(0);
            reply.extend_from_slice(sock.as_os_str().as_encoded_bytes());
        }
        self.entries.insert(
            key,
            VmEntry {
                path,
                pidfd: None,
                bell,
            },
        );
        Ok(Created {
            guest: g,
            reply,
            host_vector,
        })
    }

    /// Whether the doorbell VM of `key` has had its QEMU attached to the server.
    pub(crate) fn doorbell_attached(&self, key: u32) -> bool {
        self.entries
            .get(&key)
            .and_then(|e| e.bell.as_ref())
            .is_some_and(|(srv, _)| srv.served)
    }

    /// An event on a doorbell VM's ivshmem server (token IVSHMEM): index 0 the
    /// listener (QEMU connecting), 1 the client. Returns a line for the log.
    pub(crate) fn ivshmem_event(&mut self, ep: &Epoll, key: u32, index: u16) -> Option<String> {
        let e = self.entries.get_mut(&key)?;
        let (srv, shm) = e.bell.as_mut()?;
        if index == 0 {
            let listener = srv.listener_fd();
            match srv.accept(std::os::fd::AsFd::as_fd(shm), sys::getuid()) {
                Ok(Some(c)) => {
                    if let Some(l) = listener {
                        ep.delete(l);
                    }
                    let _ = ep.add(c, sys::EP_IN, token::make(token::IVSHMEM, key, 0, 1));
                    Some(format!(
                        "VM of connection {key}: QEMU attached to the ivshmem server ({} vectors)",
                        srv.vectors()
                    ))
                }
                Ok(None) => None,
                Err(err) => {
                    // The setup did not go through: QEMU fails to start; the server stays
                    // one-shot (the listener is kept for nobody else: close it too).
                    if let Some(l) = listener {
                        ep.delete(l);
                    }
                    let path = srv.path.clone();
                    e.bell = None;
                    Some(format!("ivshmem server {}: {err}", path.display()))
                }
            }
        } else {
            let c = srv.client_fd();
            if srv.client_event() {
                if let Some(c) = c {
                    ep.delete(c);
                }
                return Some(format!(
                    "VM of connection {key}: the ivshmem client disconnected or sent data"
                ));
            }
            None
        }
    }

    /// VM_PID: ties the guest of connection `key` to a process; its exit ends the
    /// guest. Uses the pidfd passed along, else opens one for `pid`.
    pub(crate) fn set_pid(
        &mut self,
        ep: &Epoll,
        key: u32,
        pid: u32,
        fd: Option<OwnedFd>,
    ) -> Result<(), (i32, &'static str)> {
        let e = self
            .entries
            .get_mut(&key)
            .ok_or((errno::EINVAL, "VM_PID before VM_REGION"))?;
        if e.pidfd.is_some() {
            return Err((errno::EINVAL, "VM_PID already given"));
        }
        let fd = match fd {
            Some(f) if sys::is_pidfd(&f) => f,
            Some(_) => return Err((errno::EINVAL, "VM_PID descriptor is not a pidfd")),
            None if pid == 0 => return Err((errno::EINVAL, "VM_PID without pid")),
            None => sys::pidfd_open(pid).map_err(|e| (sys::errno_of(&e), "pidfd_open"))?,
        };
        ep.add(
            fd.as_raw_fd(),
            sys::EP_IN,
            token::make(token::VM_PROCESS, key, 0, 0),
        )
        .map_err(|_| (errno::ENOMEM, "epoll"))?;
        e.pidfd = Some(fd);
        Ok(())
    }

    /// The guest of `key` is gone: its file goes (mappings stay valid until unmapped).
    pub(crate) fn forget(&mut self, ep: &Epoll, key: u32) {
        if let Some(e) = self.entries.remove(&key) {
            if let Some(fd) = &e.pidfd {
                ep.delete(fd.as_raw_fd());
            }
            if let Some((srv, _)) = &e.bell {
                for fd in [srv.listener_fd(), srv.client_fd()].into_iter().flatten() {
                    ep.delete(fd);
                }
            }
            let _ = std::fs::remove_file(&e.path);
        }
    }

    /// Daemon exit: removes every region file.
    pub(crate) fn forget_all(&mut self, ep: &Epoll) {
        let keys: Vec<u32> = self.entries.keys().copied().collect();
        for k in keys {
            self.forget(ep, k);
        }
    }
}

/// Creates the region file exclusively (never follows or reuses an existing path),
/// mode 0600, sized `size` (sparse).
fn create_file(path: &std::path::Path, size: u64) -> io::Result<OwnedFd> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(path)?;
    if let Err(e) = f.set_len(size) {
        let _ = std::fs::remove_file(path);
        return Err(e);
    }
    Ok(f.into())
}

// ---- client side (canal vm) -----------------------------------------------------------

#[derive(Debug)]
/// A VM region canald created: the connection that keeps the guest alive, and where
/// the file is.
pub struct VmRegionHandle {
    pub conn: OwnedFd,
    pub guest_id: u32,
    pub region_size: u64,
    pub file_size: u64,
    pub path: PathBuf,
    /// A doorbell VM: the ivshmem server socket for QEMU's `ivshmem-doorbell` device
    /// and its vector count.
    pub doorbell: Option<(PathBuf, u32)>,
}

/// Asks the canald at `socket` for a VM region (VM_REGION), served with ivshmem
/// doorbells if `doorbell` (an older canald refuses the flag with EINVAL).
pub fn request_region(
    socket: &std::path::Path,
    name: &str,
    file_size: u64,
    publish: &[(u16, u16)],
    doorbell: bool,
) -> io::Result<VmRegionHandle> {
    use canal_abi::control::{kind, VM_REGION_OK_BODY};
    let body = VmRegion {
        file_size,
        flags: if doorbell {
            canal_abi::control::vm_flag::DOORBELL
        } else {
            0
        },
        name: name.into(),
        publish: publish.to_vec(),
    }
    .encode()
    .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "bad VM name or too many ports"))?;
    let conn = crate::client::connect(socket)?;
    let rb = roundtrip(&conn, kind::VM_REGION, &body, &[], kind::VM_REGION_OK)?;
    if rb.len() <= VM_REGION_OK_BODY {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "short VM_REGION_OK",
        ));
    }
    let u64_at = |o: usize| u64::from_le_bytes(rb[o..o + 8].try_into().expect("8 bytes"));
    let vectors = u32::from_le_bytes([rb[4], rb[5], rb[6], rb[7]]);
    let tail = &rb[VM_REGION_OK_BODY..];
    let (file, sock) = match tail.iter().position(|&c| c == 0) {
        Some(i) => (&tail[..i], Some(&tail[i + 1..])),
        None => (tail, None),
    };
    let path = PathBuf::from(String::from_utf8_lossy(file).into_owned());
    let doorbell = match (vectors, sock) {
        (0, _) => None,
        (v, Some(s)) if !s.is_empty() => {
            Some((PathBuf::from(String::from_utf8_lossy(s).into_owned()), v))
        }
        _ => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "VM_REGION_OK with vectors but no socket",
            ))
        }
    };
    Ok(VmRegionHandle {
        doorbell,
        guest_id: u32::from_le_bytes([rb[0], rb[1], rb[2], rb[3]]),
        region_size: u64_at(8),
        file_size: u64_at(16),
        path,
        conn,
    })
}

impl VmRegionHandle {
    /// VM_PID: the guest ends when process `pid` exits (a pidfd is opened here and
    /// passed along, so a recycled pid cannot be confused).
    pub fn set_pid(&self, pid: u32) -> io::Result<()> {
        use canal_abi::control::kind;
        let fd = sys::pidfd_open(pid)?;
        roundtrip(
            &self.conn,
            kind::VM_PID,
            &pid.to_le_bytes(),
            &[fd.as_raw_fd()],
            kind::VM_PID_OK,
        )
        .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn test_net() -> Arc<NetView> {
        crate::network::Networks::new(None).vm("t", &[]).unwrap()
    }

    #[test]
    fn sleep_backoff() {
        let mut v = SleepBackoff::default();
        let steps: Vec<u64> = (0..FAST_SLEEPS + 8).map(|_| v.next_sleep_ns(-1)).collect();
        assert!(steps[..FAST_SLEEPS as usize]
            .iter()
            .all(|&s| s == SLEEP_MIN_NS));
        assert_eq!(steps[FAST_SLEEPS as usize + 1], 2 * SLEEP_MIN_NS);
        assert_eq!(*steps.last().unwrap(), SLEEP_MAX_NS);
        assert_eq!(v.next_sleep_ns(0), 0, "an earlier deadline wins");
        v.note_work();
        assert_eq!(v.next_sleep_ns(5), SLEEP_MIN_NS);
    }

    #[test]
    fn layouts_fit_their_file() {
        let base = crate::config::Config::new("/x".into())
            .guest_config()
            .unwrap();
        for mib in [1u64, 2, 16, 64, 256] {
            let c = vm_guest_config(&base, mib << 20, test_net()).unwrap();
            assert!(c.layout.region_size <= mib << 20, "{mib} MiB");
            assert!(c.ring_size * 8 <= c.layout.data_size || c.ring_size == 64 * 1024);
            assert!(c.net.is_some());
        }
        assert!(vm_guest_config(&base, 3 << 20, test_net()).is_err());
        assert!(vm_guest_config(&base, 1 << 19, test_net()).is_err());
        assert!(vm_guest_config(&base, 1 << 30, test_net()).is_ok());
        assert!(vm_guest_config(&base, 1 << 31, test_net()).is_err());
    }

    #[test]
    fn doorbell_region_and_its_ivshmem_server() {
        use canal_abi::control::vm_flag;
        let base = crate::config::Config::new("/x".into())
            .guest_config()
            .unwrap();
        let dir = std::env::temp_dir().join(format!("canald-vmbell-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        let name = format!("unit-bell-{}", std::process::id());
        let body = VmRegion {
            file_size: 4 << 20,
            flags: vm_flag::DOORBELL,
            name: name.clone(),
            publish: vec![],
        }
        .encode()
        .unwrap();
        let ep = Epoll::new().unwrap();
        let mut vms = Vms::default();
        let mut nets = crate::network::Networks::new(None);
        let c = vms
            .create(&ep, 3, 9, 0, &base, &body, &dir, &mut nets)
            .unwrap();
        let h = c.guest.region().header();
        assert_ne!(h.features & feature::DOORBELL, 0);
        assert_eq!(h.features & feature::PORT_EVENTFD, 0);
        assert_eq!(h.doorbell_peer, crate::ivshmem_server::HOST_PEER as u32);
        assert_eq!(h.doorbell_vectors, c.guest.region().layout().slot_count);
        assert!(c.guest.doorbell.is_some() && c.host_vector.is_some());
        // VM_REGION_OK: vectors at 4, the file path, NUL, the socket path.
        let r = &c.reply;
        assert_eq!(u32::from_le_bytes(r[4..8].try_into().unwrap()), VM_SLOTS);
        let tail = &r[canal_abi::control::VM_REGION_OK_BODY..];
        let nul = tail.iter().position(|&b| b == 0).unwrap();
        assert_eq!(tail[..nul], *format!("/dev/shm/canal-{name}").as_bytes());
        let sock = PathBuf::from(std::str::from_utf8(&tail[nul + 1..]).unwrap());
        assert_eq!(sock, dir.join(format!("ivshmem-{name}.sock")));
        let client = std::os::unix::net::UnixStream::connect(&sock).unwrap();
        assert!(!vms.doorbell_attached(3));
        let line = vms.ivshmem_event(&ep, 3, 0).unwrap();
        assert!(line.contains("QEMU attached"), "{line}");
        assert!(vms.doorbell_attached(3));
        assert!(!sock.exists(), "one VM per server");
        drop(client);
        assert!(vms.ivshmem_event(&ep, 3, 1).is_some(), "EOF of the client");
        assert!(vms.ivshmem_event(&ep, 4, 0).is_none(), "unknown VM");
        vms.forget(&ep, 3);
        assert!(!std::path::Path::new(&format!("/dev/shm/canal-{name}")).exists());
        // Without the flag: no server, vectors 0, no second path.
        let plain = VmRegion {
            flags: 0,
            ..VmRegion::decode(&body).unwrap()
        }
        .encode()
        .unwrap();
        let c = vms
            .create(&ep, 5, 10, 0, &base, &plain, &dir, &mut nets)
            .unwrap();
        assert_eq!(c.reply[4..8], [0; 4]);
        assert!(!c.reply[canal_abi::control::VM_REGION_OK_BODY..].contains(&0));
        assert!(c.guest.doorbell.is_none() && c.host_vector.is_none());
        vms.forget(&ep, 5);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn vm_region_body_layout() {
        use super::VmRegion;
        use canal_abi::control::*;
        let r = VmRegion {
            file_size: 64 << 20,
            flags: 0,
            name: "web-1".into(),
            publish: vec![(8080, 80), (2222, 22)],
        };
        let b = r.encode().unwrap();
        assert_eq!(b.len(), VM_REGION_BODY + 8);
        assert_eq!(&b[0..8], &(64u64 << 20).to_le_bytes(), "file_size at 0");
        assert_eq!(&b[8..12], &2u32.to_le_bytes(), "npublish at 8");
        assert_eq!(&b[12..16], &[0; 4], "flags at 12");
        assert_eq!(&b[16..21], b"web-1", "name at 16, NUL padded to 48");
        assert!(b[21..48].iter().all(|&c| c == 0));
        assert_eq!(&b[48..52], &[0x90, 0x1f, 80, 0], "host port, guest port");
        assert_eq!(VmRegion::decode(&b), Some(r));
        let mut bell = b.clone();
        bell[12] = 1;
        assert_eq!(
            VmRegion::decode(&bell).map(|r| r.flags),
            Some(vm_flag::DOORBELL),
            "flags bit 0: doorbell"
        );
        let mut bad = b.clone();
        bad[12] = 2;
        assert_eq!(VmRegion::decode(&bad), None, "unknown flags are refused");
        let mut bad = b.clone();
        bad[16] = b'/';
        assert_eq!(VmRegion::decode(&bad), None, "no path separators in names");
        let mut bad = b.clone();
        bad[30] = b'x';
        assert_eq!(VmRegion::decode(&bad), None, "bytes after the name's NUL");
        assert_eq!(VmRegion::decode(&b[..50]), None, "publish count vs length");
        let mut bad = b.clone();
        bad[8..12].copy_from_slice(&1000u32.to_le_bytes());
        assert_eq!(VmRegion::decode(&bad), None, "too many published ports");
        assert!(!valid_vm_name(".hidden") && !valid_vm_name("") && !valid_vm_name(&"a".repeat(33)));
        assert_eq!(VM_REGION_OK_BODY, 24);
    }
}
