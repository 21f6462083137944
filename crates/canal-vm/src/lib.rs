//! VM harness: boots a small QEMU guest (the host's kernel, a busybox initramfs,
//! the host's root filesystem read-only over 9p) with virtio-net and/or the canal
//! shared-memory device, runs one program in it and returns its exit status.
//! `cli` is the command line of `canal vm`. See docs/vm.md.

pub mod bench;
pub mod cli;
pub(crate) mod image;
pub(crate) mod probe;
pub(crate) mod qemu;
pub(crate) mod region;
pub(crate) mod run;
mod sys;

use std::path::{Path, PathBuf};
use std::time::Duration;

use qemu::{Accel, Publish, VmConfig};
use region::RegionFile;
use run::{Deadlines, GuestCommand, Outcome, Output, RunDir};

/// Exit status when the harness itself fails (no program status to report).
pub(crate) const EXIT_HARNESS: i32 = 125;
/// Exit status when `--timeout` expires.
pub(crate) const EXIT_TIMEOUT: i32 = 124;

/// The canald the VM's region comes from: $CANAL_SOCKET, a running service of this
/// user, or canald's default path (`canald::spawn::locate`).
pub(crate) fn canald_socket() -> PathBuf {
    canald::spawn::locate(None)
}

/// Options of `canal vm run`.
#[derive(Debug, Clone)]
pub(crate) struct RunOptions {
    pub(crate) canal: bool,
    pub(crate) virtio: bool,
    pub(crate) preload: bool,
    pub(crate) libcanal: Option<PathBuf>,
    pub(crate) shm_path: Option<PathBuf>,
    pub(crate) shm_mib: u64,
    pub(crate) doorbell: Option<PathBuf>,
    pub(crate) doorbell_vectors: u32,
    /// `--no-doorbell`: a canald region without the ivshmem server.
    pub(crate) no_doorbell: bool,
    pub(crate) accel: Option<Accel>,
    pub(crate) mem_mib: u64,
    pub(crate) cpus: u32,
    pub(crate) timeout: Option<Duration>,
    pub(crate) boot_timeout: Duration,
    pub(crate) publish: Vec<Publish>,
    pub(crate) env: Vec<(String, String)>,
    pub(crate) verbose: bool,
    pub(crate) program: Vec<String>,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            canal: false,
            virtio: false,
            preload: true,
            libcanal: None,
            shm_path: None,
            shm_mib: region::DEFAULT_REGION_MIB,
            doorbell: None,
            doorbell_vectors: 1,
            no_doorbell: false,
            accel: None,
            mem_mib: 512,
            cpus: 1,
            timeout: None,
            boot_timeout: Duration::from_secs(120),
            publish: Vec::new(),
            env: Vec::new(),
            verbose: std::env::var_os("CANAL_VM_VERBOSE").is_some_and(|v| v != "0"),
            program: Vec::new(),
        }
    }
}

/// The QEMU binary: $CANAL_VM_QEMU, else qemu-system-x86_64 on PATH.
pub(crate) fn find_qemu() -> anyhow::Result<PathBuf> {
    if let Some(q) = std::env::var_os("CANAL_VM_QEMU") {
        return Ok(q.into());
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into());
    for d in std::env::split_paths(&path) {
        let p = d.join("qemu-system-x86_64");
        if p.is_file() {
            return Ok(p);
        }
    }
    Err(anyhow::anyhow!(
        "qemu-system-x86_64 not found (install qemu-system-x86 or set CANAL_VM_QEMU)"
    ))
}

/// libcanal.so for the guest: --libcanal, $CANAL_LIB, or next to the running binary.
/// Absolute, because the guest sees the host's root at the same paths.
/// Where the guest's init mounts the run directory (guest/init.sh).
const GUEST_RUN_DIR: &str = "/run/canal-vm";

fn find_libcanal(opt: &Option<PathBuf>) -> anyhow::Result<PathBuf> {
    let candidates: Vec<PathBuf> = match (opt, std::env::var_os("CANAL_LIB")) {
        (Some(p), _) => vec![p.clone()],
        (None, Some(p)) => vec![p.into()],
        (None, None) => {
            let exe = std::env::current_exe()?;
            let dir = exe.parent().unwrap_or(Path::new("/")).to_path_buf();
            vec![dir.join("libcanal.so"), dir.join("../lib/libcanal.so")]
        }
    };
    for c in &candidates {
        if let Ok(p) = c.canonicalize() {
            return Ok(p);
        }
    }
    Err(anyhow::anyhow!(
        "libcanal.so not found (tried {}); build it, pass --libcanal, or use --no-preload",
        candidates
            .iter()
            .map(|c| c.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    ))
}

/// Builds everything for one VM (run dir, region, cmd.sh, QEMU config).
struct Prepared {
    cfg: VmConfig,
    // Dropped after QEMU is gone: removes the region file (if ours) and the run dir.
    _region: Option<RegionFile>,
    run_dir: RunDir,
}

fn prepare(
    o: &RunOptions,
    img: &image::GuestImage,
    qemu: &Path,
    accel: Accel,
) -> anyhow::Result<Prepared> {
    let run_dir =
        RunDir::create().map_err(|e| anyhow::anyhow!("creating the run directory: {e}"))?;
    let mut cmd = GuestCommand {
        program: o.program.clone(),
        env: Vec::new(),
        preload: None,
        cwd: std::env::current_dir().ok(),
    };
    if let Some(home) = std::env::var_os("HOME") {
        cmd.env
            .push(("HOME".into(), home.to_string_lossy().into_owned()));
    }
    // How host -> guest wake-ups work for a canald region (protocol §9.4/§9.5).
    let mut wakeups: Option<(&str, String)> = None;
    let region = if o.canal && o.doorbell.is_none() {
        let name = format!("vm-{}", std::process::id());
        let size = o.shm_mib << 20;
        let r = match &o.shm_path {
            Some(p) => RegionFile::existing(p),
            // Only the device, no libcanal: a plain file (the shared-memory test).
            None if !o.preload => region::create_region(&name, size),
            None => {
                let socket = canald_socket();
                canald::spawn::ensure_daemon(&socket)?;
                let publish: Vec<(u16, u16)> =
                    o.publish.iter().map(|p| (p.host, p.guest)).collect();
                let want = !o.no_doorbell && img.doorbell;
                let mut r = region::canald_region(&socket, &name, size, &publish, want);
                wakeups = Some(match (&r, want) {
                    (_, false) if o.no_doorbell => ("backoff", "--no-doorbell".into()),
                    (_, false) => (
                        "backoff",
                        format!(
                            "the guest kernel {} has no vfio modules",
                            img.kernel_version
                        ),
                    ),
                    (Err(e), true) if e.kind() == std::io::ErrorKind::InvalidInput => {
                        // An older canald refuses the doorbell flag: plain region.
                        let why = format!("canald refused a doorbell region ({e})");
                        r = region::canald_region(&socket, &name, size, &publish, false);
                        ("backoff", why)
                    }
                    (_, true) => ("doorbell", "canald's ivshmem server".into()),
                });
                r.map_err(|e| {
                    std::io::Error::new(e.kind(), format!("canald on {}: {e}", socket.display()))
                })
            }
        }
        .map_err(|e| anyhow::anyhow!("canal region: {e}"))?;
        Some(r)
    } else {
        None
    };
    let bell = region.as_ref().and_then(|r| r.doorbell().cloned());
    if let Some((mode, why)) = &wakeups {
        if o.verbose {
            match &bell {
                Some((sock, v)) => eprintln!(
                    "canal vm: wake-ups: doorbell ({why} on {}, {v} vectors)",
                    sock.display()
                ),
                None => eprintln!("canal vm: wake-ups: {mode} ({why})"),
            }
        }
        cmd.env
            .push(("CANAL_VM_WAKEUPS".into(), (*mode).to_string()));
    }
    if o.canal {
        // CANAL_IVSHMEM_DEVICE, CANAL_REGION_SIZE (and CANAL_IVSHMEM_VFIO_GROUP) come from
        // the guest's init, which finds the device.
        cmd.env.push(("CANAL_TRANSPORT".into(), "ivshmem".into()));
        if o.preload {
            // The guest sees the host's root read-only but not its /tmp (a fresh tmpfs),
            // where a checkout may well live: ship the library through the run
            // directory, which the guest mounts at GUEST_RUN_DIR.
            let lib = find_libcanal(&o.libcanal)?;
            std::fs::copy(&lib, run_dir.path.join("libcanal.so")).map_err(|e| {
                anyhow::anyhow!("copying {} into the run directory: {e}", lib.display())
            })?;
            cmd.preload = Some(PathBuf::from(GUEST_RUN_DIR).join("libcanal.so"));
        }
    }
    cmd.env.extend(o.env.iter().cloned());
    let script = cmd.script()?;
    std::fs::write(run_dir.path.join("cmd.sh"), script)
        .map_err(|e| anyhow::anyhow!("writing cmd.sh: {e}"))?;
    let p = &run_dir.path;
    let cfg = VmConfig {
        qemu: qemu.to_path_buf(),
        accel,
        mem_mib: o.mem_mib,
        cpus: o.cpus,
        cpu_model: std::env::var("CANAL_VM_CPU").ok().filter(|c| !c.is_empty()),
        machine: std::env::var("CANAL_VM_MACHINE")
            .ok()
            .filter(|m| !m.is_empty())
            .unwrap_or_else(|| "pc".into()),
        extra_append: std::env::var("CANAL_VM_APPEND").unwrap_or_default(),
        kernel: img.boot_kernel.clone(),
        initramfs: img.initramfs.clone(),
        run_dir: p.clone(),
        ctl_sock: p.join("ctl.sock"),
        out_sock: p.join("out.sock"),
        err_sock: p.join("err.sock"),
        console_log: p.join("console.log"),
        virtio_net: o.virtio,
        // With canal, canald publishes (VM_REGION); QEMU's hostfwd would take the ports.
        publish: if region.as_ref().is_some_and(|r| r.canald.is_some()) {
            Vec::new()
        } else {
            o.publish.clone()
        },
        // A doorbell region reaches QEMU through canald's ivshmem server, not the file.
        region: region
            .as_ref()
            .filter(|_| bell.is_none())
            .map(|r| (r.path.clone(), r.size)),
        doorbell: bell
            .clone()
            .or_else(|| o.doorbell.clone().map(|p| (p, o.doorbell_vectors))),
        extra: std::env::var("CANAL_VM_QEMU_EXTRA")
            .map(|e| e.split_whitespace().map(str::to_string).collect())
            .unwrap_or_default(),
    };
    Ok(Prepared {
        cfg,
        _region: region,
        run_dir,
    })
}

/// The KVM probe: boots the guest under KVM running `true`. Returns the verdict and
/// whether it may be cached.
pub(crate) fn run_kvm_probe(img: &image::GuestImage, qemu: &Path) -> (probe::Verdict, bool) {
    let o = RunOptions {
        program: vec!["true".into()],
        virtio: false,
        ..RunOptions::default()
    };
    let timeout = probe::probe_timeout();
    let p = match prepare(&o, img, qemu, Accel::Kvm) {
        Ok(p) => p,
        Err(e) => return (probe::Verdict(Err(e.to_string())), false),
    };
    let (outcome, _) = run::boot(
        &p.cfg,
        Deadlines {
            ready: timeout,
            total: Some(timeout + Duration::from_secs(10)),
            poweroff: Duration::from_secs(5),
        },
        Output::Discard,
    );
    let verdict = match outcome {
        Outcome::Exited(0) => Ok(()),
        Outcome::Exited(n) => Err(format!("probe program exited {n} under KVM")),
        Outcome::NotReady(d) => Err(format!(
            "guest did not say READY within {:.0} s under KVM",
            d.as_secs_f64()
        )),
        Outcome::TimedOut => Err("guest did not finish under KVM".into()),
        Outcome::GuestFailed(f) => Err(format!("guest init failed under KVM: {f}")),
        Outcome::QemuFailed(f) => Err(match f.split_once("QEMU said:\n") {
            // The first thing QEMU complained about is the useful part.
            Some((_, log)) => format!(
                "QEMU failed under KVM: {}",
                log.lines()
                    .next()
                    .unwrap_or("")
                    .trim_start_matches("qemu-system-x86_64: ")
            ),
            None => f,
        }),
        Outcome::Signalled(s) => {
            // Not a verdict about KVM; do not cache it as one.
            return (
                probe::Verdict(Err(format!("interrupted by signal {s}"))),
                false,
            );
        }
    };
    (probe::Verdict(verdict), true)
}

fn select_accel(o: &RunOptions, img: &image::GuestImage, qemu: &Path) -> Accel {
    match o.accel {
        Some(a) => a,
        None => {
            let (a, reason) = probe::choose_auto(img, qemu, || run_kvm_probe(img, qemu));
            if let Some(r) = reason {
                eprintln!("canal vm: using TCG: {r}");
            }
            a
        }
    }
}

/// Runs `o.program` in a fresh guest; returns the exit status to report.
pub(crate) fn run_program(o: &RunOptions) -> anyhow::Result<i32> {
    let qemu = find_qemu()?;
    let img = image::ensure_image().map_err(|e| anyhow::anyhow!("guest image: {e}"))?;
    sys::catch_termination_signals()?;
    let accel = select_accel(o, &img, &qemu);
    if let Some(sig) = sys::pending_signal() {
        return Ok(128 + sig);
    }
    let p = prepare(o, &img, &qemu, accel)?;
    if o.verbose {
        eprintln!(
            "canal vm: {} {}",
            qemu.display(),
            p.cfg
                .args()
                .iter()
                .map(|a| run::shell_quote(a))
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
    let region = p._region.as_ref();
    let (outcome, t) = run::boot_with(
        &p.cfg,
        Deadlines {
            ready: o.boot_timeout,
            total: o.timeout,
            poweroff: Duration::from_secs(10),
        },
        Output::Stream,
        &|pid| {
            if let Some(Err(e)) = region.map(|r| r.set_vm_pid(pid)) {
                eprintln!("canal vm: canald does not watch QEMU (its guest ends with this command instead): {e}");
            }
        },
    );
    if o.verbose {
        let f = |d: Option<Duration>| {
            d.map(|d| format!("{:.2}s", d.as_secs_f64()))
                .unwrap_or_else(|| "-".into())
        };
        eprintln!(
            "canal vm: accel={} ready={} (guest uptime {}) exit={} qemu-gone={}",
            accel.name(),
            f(t.ready),
            t.guest_uptime_at_ready
                .map(|u| format!("{u:.2}s"))
                .unwrap_or_else(|| "-".into()),
            f(t.exited),
            f(t.qemu_gone)
        );
    }
    let console = p.run_dir.path.join("console.log");
    Ok(match outcome {
        Outcome::Exited(code) => code,
        Outcome::Signalled(sig) => 128 + sig,
        Outcome::TimedOut => {
            eprintln!("canal vm: timed out; guest killed");
            EXIT_TIMEOUT
        }
        Outcome::NotReady(d) => {
            eprintln!(
                "canal vm: guest not ready after {:.0} s ({}); console:\n{}",
                d.as_secs_f64(),
                accel.name(),
                run::console_tail(&console, 30)
            );
            EXIT_HARNESS
        }
        Outcome::GuestFailed(f) => {
            eprintln!(
                "canal vm: guest setup failed: {f}; console:\n{}",
                run::console_tail(&console, 30)
            );
            EXIT_HARNESS
        }
        Outcome::QemuFailed(f) => {
            eprintln!(
                "canal vm: {f}\nconsole:\n{}",
                run::console_tail(&console, 30)
            );
            EXIT_HARNESS
        }
    })
}
