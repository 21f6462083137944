//! VM harness (issue 6): boots a small QEMU guest (the host's kernel, a busybox initramfs,
//! the host's root filesystem read-only over 9p) with virtio-net and/or the canal
//! shared-memory device, runs one program in it and returns its exit status.
//! Entry point used by `canal vm`. See docs/vm.md.

pub mod bench;
pub mod image;
pub mod probe;
pub mod qemu;
pub mod region;
pub mod run;
mod sys;

use std::path::{Path, PathBuf};
use std::time::Duration;

use qemu::{Accel, Publish, VmConfig};
use region::RegionFile;
use run::{Deadlines, GuestCommand, Outcome, Output, RunDir};

/// `canal vm region`: a canald-served region for a VM someone else starts (libvirt,
/// a hand-written QEMU command line). The guest lives while this command runs.
fn cmd_region(args: &[String]) -> i32 {
    let mut name: Option<String> = None;
    let mut size = region::DEFAULT_REGION_MIB;
    let mut publish: Vec<(u16, u16)> = Vec::new();
    let mut pid: Option<u32> = None;
    let mut doorbell = false;
    let mut i = 0;
    while i < args.len() {
        let a = args[i].as_str();
        let v = args.get(i + 1).cloned();
        if a == "--doorbell" {
            doorbell = true;
            i += 1;
            continue;
        }
        match (a, v) {
            ("--name", Some(v)) => name = Some(v),
            ("--size", Some(v)) => match v.parse::<u64>() {
                Ok(s) if s.is_power_of_two() && s <= 1024 => size = s,
                _ => return usage_error("--size needs a power of two in MiB"),
            },
            ("--publish", Some(v)) => match v
                .split_once(':')
                .and_then(|(h, g)| Some((h.parse::<u16>().ok()?, g.parse::<u16>().ok()?)))
            {
                Some(p) => publish.push(p),
                None => return usage_error("--publish: expected HOSTPORT:GUESTPORT"),
            },
            ("--pid", Some(v)) => match v.parse::<u32>() {
                Ok(p) if p > 0 => pid = Some(p),
                _ => return usage_error("--pid needs a process id"),
            },
            _ => return usage_error(&format!("region: bad argument '{a}'")),
        }
        i += 2;
    }
    let Some(name) = name else {
        return usage_error("region: --name NAME is required");
    };
    if let Err(e) = sys::catch_termination_signals() {
        eprintln!("canal vm: {e}");
        return EXIT_HARNESS;
    }
    let socket = canald_socket();
    if let Err(e) = ensure_daemon(&socket) {
        eprintln!("canal vm: {e}");
        return 1;
    }
    let r = match region::canald_region(&socket, &name, size << 20, &publish, doorbell) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("canal vm: canald on {}: {e}", socket.display());
            return 1;
        }
    };
    if let Some(p) = pid {
        if let Err(e) = r.set_vm_pid(p) {
            eprintln!("canal vm: --pid {p}: {e}");
            return 1;
        }
    }
    match r.doorbell() {
        Some((sock, vectors)) => print!("{}", qemu::operator_doorbell_snippets(sock, *vectors)),
        None => print!("{}", qemu::operator_snippets(&name, &r.path, size)),
    }
    println!(
        "# serving; the guest ends when this command does{}",
        match pid {
            Some(p) => format!(" or process {p} exits"),
            None => String::new(),
        }
    );
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let conn = r
        .canald
        .as_ref()
        .map(|h| std::os::fd::AsRawFd::as_raw_fd(&h.conn));
    loop {
        if let Some(sig) = sys::pending_signal() {
            return 128 + sig;
        }
        if pid.is_some_and(|p| !std::path::Path::new(&format!("/proc/{p}")).exists()) {
            return 0;
        }
        // The connection turns readable (EOF) only if canald goes away.
        match conn.map(|c| sys::poll_readable(&[c], 200)) {
            Some(Ok(v)) if v.first() == Some(&true) => {
                eprintln!("canal vm: canald closed the connection");
                return 1;
            }
            Some(Err(e)) => {
                eprintln!("canal vm: {e}");
                return 1;
            }
            _ => {}
        }
    }
}

/// Exit status when the harness itself fails (no program status to report).
pub const EXIT_HARNESS: i32 = 125;
/// Exit status when `--timeout` expires.
pub const EXIT_TIMEOUT: i32 = 124;

const USAGE: &str = "\
usage: canal vm <command> [options]
commands:
  run [options] -- PROGRAM ARGS...   boot a guest, run PROGRAM in it, exit with its status
      --virtio             virtio-net with QEMU user networking (guest 10.0.2.15, host
                           127.0.0.1 reachable as 10.0.2.2); the default
      --canal              the canal device instead of virtio-net; the program gets
                           CANAL_TRANSPORT=ivshmem and LD_PRELOAD=libcanal.so. canald serves
                           it as ivshmem-doorbell (interrupt wake-ups; q35 + emulated IOMMU,
                           the guest binds it to vfio-pci) when the guest kernel has vfio,
                           else as ivshmem-plain (bounded backoff); CANAL_VM_WAKEUPS in the
                           program's environment says which
      --no-doorbell        with --canal: always ivshmem-plain with backoff wake-ups
      --canal --virtio     both devices
      --doorbell SOCKET    the canal device as ivshmem-doorbell: region and interrupt
                           eventfds from the ivshmem server on SOCKET (implies --canal;
                           adds an emulated IOMMU; the guest binds it to vfio-pci)
      --doorbell-vectors N MSI-X vectors of the doorbell device (default 1)
      --no-preload         with --canal: attach the device but do not set LD_PRELOAD
      --libcanal PATH      libcanal.so to preload (default: next to the canal binary,
                           or $CANAL_LIB)
      --shm-path PATH      back the canal device with this existing file instead of a
                           fresh /dev/shm/canal-vm-<pid> (size = the file's size)
      --shm-size MiB       size of a fresh region file (power of two; default 64)
      --accel auto|kvm|tcg KVM only if a (cached) probe boot succeeds; default auto
      --mem MiB            guest memory (default 512)
      --cpus N             guest CPUs (default 1)
      --timeout S          kill the guest after S seconds (exit 124)
      --boot-timeout S     fail if the guest is not ready after S seconds (default 120)
      --publish H:G        host 127.0.0.1:H reaches guest port G: with --canal canald
                           binds the guest's listener there, with --virtio alone QEMU's
                           hostfwd forwards it
      --env NAME=VALUE     set an environment variable for PROGRAM (repeatable)
      -v, --verbose        print the QEMU command line and boot timings
  qemu-args [--name NAME] [--size MiB] [--path FILE]
                           print QEMU options and libvirt XML for a canal region file
  qemu-args --doorbell SOCKET [--vectors N]
                           the same for a region with doorbells from an ivshmem server
  region --name NAME [--size MiB] [--publish H:G]... [--pid PID] [--doorbell]
                           for your own VM: canald creates /dev/shm/canal-NAME and serves
                           the guest in it; prints the QEMU options and libvirt XML, then
                           stays until SIGINT/SIGTERM or until process PID (the VM) exits;
                           --doorbell: canald is also the region's ivshmem server
                           (ivshmem-doorbell: interrupts and doorbell kicks)
  image                    build (or find) the cached guest image and print its paths
  probe [--force]          run (or show the cached) KVM probe
";

/// How `canal vm` makes sure a canald answers on a path (the CLI installs `canal run`'s
/// logic: start a private canald if none answers).
pub static ENSURE_DAEMON: std::sync::OnceLock<EnsureDaemon> = std::sync::OnceLock::new();

/// See [`ENSURE_DAEMON`].
pub type EnsureDaemon = fn(&Path) -> Result<(), String>;

fn ensure_daemon(socket: &Path) -> Result<(), String> {
    match ENSURE_DAEMON.get() {
        Some(f) => f(socket),
        None if canald::sys::seqpacket_connect(socket).is_ok() => Ok(()),
        None => Err(format!("no canald answers on {}", socket.display())),
    }
}

/// The canald the VM's region comes from: $CANAL_SOCKET or canald's default path.
fn canald_socket() -> PathBuf {
    canald::default_socket_path()
}

/// Entry point of `canal vm ARGS...`.
pub fn cli_main(args: Vec<String>) -> i32 {
    let Some((cmd, rest)) = args.split_first() else {
        eprint!("{USAGE}");
        return 2;
    };
    match cmd.as_str() {
        "run" => cmd_run(rest),
        "qemu-args" => cmd_qemu_args(rest),
        "region" => cmd_region(rest),
        "image" => cmd_image(),
        "probe" => cmd_probe(rest),
        "-h" | "--help" | "help" => {
            print!("{USAGE}");
            0
        }
        other => {
            eprintln!("canal vm: unknown command '{other}'\n{USAGE}");
            2
        }
    }
}

fn usage_error(msg: &str) -> i32 {
    eprintln!("canal vm: {msg}\n{USAGE}");
    2
}

/// Options of `canal vm run`.
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub canal: bool,
    pub virtio: bool,
    pub preload: bool,
    pub libcanal: Option<PathBuf>,
    pub shm_path: Option<PathBuf>,
    pub shm_mib: u64,
    pub doorbell: Option<PathBuf>,
    pub doorbell_vectors: u32,
    /// `--no-doorbell`: a canald region without the ivshmem server.
    pub no_doorbell: bool,
    pub accel: Option<Accel>,
    pub mem_mib: u64,
    pub cpus: u32,
    pub timeout: Option<Duration>,
    pub boot_timeout: Duration,
    pub publish: Vec<Publish>,
    pub env: Vec<(String, String)>,
    pub verbose: bool,
    pub program: Vec<String>,
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

fn parse_secs(s: &str) -> Result<Duration, String> {
    s.parse::<f64>()
        .ok()
        .filter(|v| *v > 0.0 && v.is_finite())
        .map(Duration::from_secs_f64)
        .ok_or_else(|| format!("bad number of seconds '{s}'"))
}

/// Parses the arguments of `canal vm run`.
pub fn parse_run(args: &[String]) -> Result<RunOptions, String> {
    let mut o = RunOptions::default();
    let mut i = 0;
    let val = |i: &mut usize, name: &str| -> Result<String, String> {
        *i += 1;
        args.get(*i)
            .cloned()
            .ok_or_else(|| format!("{name} needs a value"))
    };
    while i < args.len() {
        let a = args[i].as_str();
        match a {
            "--" => {
                o.program = args[i + 1..].to_vec();
                break;
            }
            "--canal" => o.canal = true,
            "--virtio" => o.virtio = true,
            "--no-preload" => o.preload = false,
            "--no-doorbell" => o.no_doorbell = true,
            "-v" | "--verbose" => o.verbose = true,
            "--libcanal" => o.libcanal = Some(val(&mut i, a)?.into()),
            "--shm-path" => o.shm_path = Some(val(&mut i, a)?.into()),
            "--doorbell" => {
                o.doorbell = Some(val(&mut i, a)?.into());
                o.canal = true;
            }
            "--doorbell-vectors" => {
                o.doorbell_vectors = val(&mut i, a)?
                    .parse()
                    .ok()
                    .filter(|v| (1..=1024).contains(v))
                    .ok_or("--doorbell-vectors needs 1..1024")?
            }
            "--shm-size" => {
                o.shm_mib = val(&mut i, a)?
                    .parse()
                    .map_err(|_| "--shm-size needs MiB".to_string())?
            }
            "--accel" => {
                o.accel = match val(&mut i, a)?.as_str() {
                    "auto" => None,
                    "kvm" => Some(Accel::Kvm),
                    "tcg" => Some(Accel::Tcg),
                    x => return Err(format!("--accel: unknown '{x}' (auto|kvm|tcg)")),
                }
            }
            "--mem" => {
                o.mem_mib = val(&mut i, a)?
                    .parse()
                    .ok()
                    .filter(|m| *m >= 64)
                    .ok_or("--mem needs MiB (>= 64)")?
            }
            "--cpus" => {
                o.cpus = val(&mut i, a)?
                    .parse()
                    .ok()
                    .filter(|c| *c >= 1)
                    .ok_or("--cpus needs a count")?
            }
            "--timeout" => o.timeout = Some(parse_secs(&val(&mut i, a)?)?),
            "--boot-timeout" => o.boot_timeout = parse_secs(&val(&mut i, a)?)?,
            "--publish" => {
                let v = val(&mut i, a)?;
                let p = v
                    .split_once(':')
                    .and_then(|(h, g)| {
                        Some(Publish {
                            host: h.parse().ok()?,
                            guest: g.parse().ok()?,
                        })
                    })
                    .ok_or_else(|| format!("--publish: expected HOSTPORT:GUESTPORT, got '{v}'"))?;
                o.publish.push(p);
            }
            "--env" => {
                let v = val(&mut i, a)?;
                let (k, val) = v
                    .split_once('=')
                    .ok_or_else(|| format!("--env: expected NAME=VALUE, got '{v}'"))?;
                o.env.push((k.to_string(), val.to_string()));
            }
            _ => return Err(format!("unknown option '{a}' (the program goes after --)")),
        }
        i += 1;
    }
    if o.program.is_empty() {
        return Err("no program: canal vm run [options] -- PROGRAM ARGS...".into());
    }
    if !o.canal {
        o.virtio = true;
    }
    if o.doorbell.is_some() && o.shm_path.is_some() {
        return Err("--doorbell takes the region from the ivshmem server; no --shm-path".into());
    }
    if !o.publish.is_empty() && !o.virtio && o.doorbell.is_some() {
        return Err("--publish with --doorbell: not supported (use --virtio)".into());
    }
    Ok(o)
}

/// The QEMU binary: $CANAL_VM_QEMU, else qemu-system-x86_64 on PATH.
pub fn find_qemu() -> Result<PathBuf, String> {
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
    Err("qemu-system-x86_64 not found (install qemu-system-x86 or set CANAL_VM_QEMU)".into())
}

/// libcanal.so for the guest: --libcanal, $CANAL_LIB, or next to the running binary.
/// Absolute, because the guest sees the host's root at the same paths.
/// Where the guest's init mounts the run directory (guest/init.sh).
const GUEST_RUN_DIR: &str = "/run/canal-vm";

fn find_libcanal(opt: &Option<PathBuf>) -> Result<PathBuf, String> {
    let candidates: Vec<PathBuf> = match (opt, std::env::var_os("CANAL_LIB")) {
        (Some(p), _) => vec![p.clone()],
        (None, Some(p)) => vec![p.into()],
        (None, None) => {
            let exe = std::env::current_exe().map_err(|e| e.to_string())?;
            let dir = exe.parent().unwrap_or(Path::new("/")).to_path_buf();
            vec![dir.join("libcanal.so"), dir.join("../lib/libcanal.so")]
        }
    };
    for c in &candidates {
        if let Ok(p) = c.canonicalize() {
            return Ok(p);
        }
    }
    Err(format!(
        "libcanal.so not found (tried {}); build it, pass --libcanal, or use --no-preload",
        candidates
            .iter()
            .map(|c| c.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    ))
}

fn cmd_run(args: &[String]) -> i32 {
    let o = match parse_run(args) {
        Ok(o) => o,
        Err(e) => return usage_error(&e),
    };
    match run_program(&o) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("canal vm: {e}");
            EXIT_HARNESS
        }
    }
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
) -> Result<Prepared, String> {
    let run_dir = RunDir::create().map_err(|e| format!("creating the run directory: {e}"))?;
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
                ensure_daemon(&socket)?;
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
        .map_err(|e| format!("canal region: {e}"))?;
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
            std::fs::copy(&lib, run_dir.path.join("libcanal.so"))
                .map_err(|e| format!("copying {} into the run directory: {e}", lib.display()))?;
            cmd.preload = Some(PathBuf::from(GUEST_RUN_DIR).join("libcanal.so"));
        }
    }
    cmd.env.extend(o.env.iter().cloned());
    let script = cmd.script().map_err(|e| e.to_string())?;
    std::fs::write(run_dir.path.join("cmd.sh"), script)
        .map_err(|e| format!("writing cmd.sh: {e}"))?;
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
fn run_kvm_probe(img: &image::GuestImage, qemu: &Path) -> (probe::Verdict, bool) {
    let o = RunOptions {
        program: vec!["true".into()],
        virtio: false,
        ..RunOptions::default()
    };
    let timeout = probe::probe_timeout();
    let p = match prepare(&o, img, qemu, Accel::Kvm) {
        Ok(p) => p,
        Err(e) => return (probe::Verdict(Err(e)), false),
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
pub fn run_program(o: &RunOptions) -> Result<i32, String> {
    let qemu = find_qemu()?;
    let img = image::ensure_image().map_err(|e| format!("guest image: {e}"))?;
    sys::catch_termination_signals().map_err(|e| e.to_string())?;
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

fn cmd_qemu_args(args: &[String]) -> i32 {
    let mut name = String::from("vm0");
    let mut size = region::DEFAULT_REGION_MIB;
    let mut path: Option<PathBuf> = None;
    let mut doorbell: Option<PathBuf> = None;
    let mut vectors = 1u32;
    let mut i = 0;
    while i < args.len() {
        let a = args[i].as_str();
        let v = args.get(i + 1).cloned();
        match (a, v) {
            ("--name", Some(v)) => name = v,
            ("--doorbell", Some(v)) => doorbell = Some(v.into()),
            ("--vectors", Some(v)) => match v.parse::<u32>() {
                Ok(n) if (1..=1024).contains(&n) => vectors = n,
                _ => return usage_error("--vectors needs 1..1024"),
            },
            ("--size", Some(v)) => match v.parse::<u64>() {
                Ok(s) if s.is_power_of_two() => size = s,
                _ => return usage_error("--size needs a power of two in MiB"),
            },
            ("--path", Some(v)) => path = Some(v.into()),
            _ => return usage_error(&format!("qemu-args: bad argument '{a}'")),
        }
        i += 2;
    }
    if let Some(server) = doorbell {
        print!("{}", qemu::operator_doorbell_snippets(&server, vectors));
        return 0;
    }
    let path = path.unwrap_or_else(|| region::region_path(&name));
    print!("{}", qemu::operator_snippets(&name, &path, size));
    0
}

fn cmd_image() -> i32 {
    match image::ensure_image() {
        Ok(img) => {
            println!("kernel {}", img.kernel.display());
            println!("boot-kernel {}", img.boot_kernel.display());
            println!("kernel-version {}", img.kernel_version);
            println!("initramfs {}", img.initramfs.display());
            0
        }
        Err(e) => {
            eprintln!("canal vm: guest image: {e}");
            EXIT_HARNESS
        }
    }
}

fn cmd_probe(args: &[String]) -> i32 {
    let force = match args {
        [] => false,
        [f] if f == "--force" => true,
        _ => return usage_error("probe takes only --force"),
    };
    let qemu = match find_qemu() {
        Ok(q) => q,
        Err(e) => {
            eprintln!("canal vm: {e}");
            return EXIT_HARNESS;
        }
    };
    let img = match image::ensure_image() {
        Ok(i) => i,
        Err(e) => {
            eprintln!("canal vm: guest image: {e}");
            return EXIT_HARNESS;
        }
    };
    if force {
        let _ = std::fs::remove_file(probe::cache_file(&img, &qemu));
    }
    if let Err(e) = sys::catch_termination_signals() {
        eprintln!("canal vm: {e}");
        return EXIT_HARNESS;
    }
    let (accel, reason) = probe::choose_auto(&img, &qemu, || run_kvm_probe(&img, &qemu));
    println!("accel {}", accel.name());
    if let Some(r) = reason {
        println!("reason {r}");
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn parse_run_options() {
        let o = parse_run(&s(&["--canal", "--mem", "256", "--", "curl", "--canal"])).unwrap();
        assert!(o.canal && !o.virtio);
        assert_eq!(o.mem_mib, 256);
        assert_eq!(o.program, s(&["curl", "--canal"]));
        let o = parse_run(&s(&["--", "true"])).unwrap();
        assert!(o.virtio && !o.canal, "virtio is the default");
        let o = parse_run(&s(&["--publish", "8080:80", "--env", "A=b=c", "--", "x"])).unwrap();
        assert_eq!(
            o.publish,
            vec![Publish {
                host: 8080,
                guest: 80
            }]
        );
        assert_eq!(o.env, vec![("A".to_string(), "b=c".to_string())]);
        assert!(
            parse_run(&s(&["--canal", "--publish", "1:2", "--", "x"])).is_ok(),
            "canald publishes for canal guests"
        );
        assert!(parse_run(&s(&["--doorbell", "/s", "--publish", "1:2", "--", "x"])).is_err());
        assert!(parse_run(&s(&["--bogus", "--", "x"])).is_err());
        assert!(parse_run(&s(&["--canal"])).is_err());
        assert!(parse_run(&s(&["--timeout", "0", "--", "x"])).is_err());
    }
}
