//! The `canal vm` command line: one clap subcommand per job (`run`, `qemu-args`,
//! `region`, `image`, `probe`) and its dispatch.

use crate::qemu::{self, Accel, Publish};
use crate::{canald_socket, RunOptions, EXIT_HARNESS};
use crate::{find_qemu, image, probe, region, run_kvm_probe, run_program, sys};
use clap::{Args, Subcommand};
use std::path::PathBuf;
use std::time::Duration;

/// QEMU guests over canal (see docs/vm.md).
#[derive(Subcommand, Debug)]
pub enum VmCommand {
    /// Boot a guest, run PROGRAM in it, exit with its status
    Run(RunArgs),
    /// Print QEMU options and libvirt XML for a canal region file (or, with
    /// --doorbell, for a region with doorbells from an ivshmem server)
    QemuArgs(QemuArgsArgs),
    /// For your own VM: canald creates /dev/shm/canal-NAME and serves the guest in it;
    /// prints the QEMU options and libvirt XML, then stays until SIGINT/SIGTERM or
    /// until process PID (the VM) exits
    Region(RegionArgs),
    /// Build (or find) the cached guest image and print its paths
    Image,
    /// Show whether KVM boots a guest here, as far as known: the cached verdict of an
    /// earlier probe, without building or booting anything unless --run
    Probe {
        /// Boot a guest under KVM to find out when no verdict is cached
        #[arg(long)]
        run: bool,
        /// Probe again (boots) even if a verdict is cached
        #[arg(long)]
        force: bool,
    },
}

/// Options of `canal vm run`.
#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// Virtio-net with QEMU user networking (guest 10.0.2.15, host 127.0.0.1 reachable
    /// as 10.0.2.2); the default
    #[arg(long)]
    pub(crate) virtio: bool,
    /// The canal device instead of virtio-net (both with --virtio); the program gets
    /// CANAL_TRANSPORT=ivshmem and LD_PRELOAD=libcanal.so. canald serves it as
    /// ivshmem-doorbell (interrupt wake-ups) when the guest kernel has vfio, else as
    /// ivshmem-plain (bounded backoff); CANAL_VM_WAKEUPS says which
    #[arg(long)]
    pub(crate) canal: bool,
    /// With --canal: always ivshmem-plain with backoff wake-ups
    #[arg(long)]
    pub(crate) no_doorbell: bool,
    /// The canal device as ivshmem-doorbell: region and interrupt eventfds from the
    /// ivshmem server on SOCKET (implies --canal; adds an emulated IOMMU)
    #[arg(long, value_name = "SOCKET")]
    pub(crate) doorbell: Option<PathBuf>,
    /// MSI-X vectors of the doorbell device
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub(crate) doorbell_vectors: u32,
    /// With --canal: attach the device but do not set LD_PRELOAD
    #[arg(long)]
    pub(crate) no_preload: bool,
    /// libcanal.so to preload [default: next to the canal binary, or $CANAL_LIB]
    #[arg(long, value_name = "PATH")]
    pub(crate) libcanal: Option<PathBuf>,
    /// Back the canal device with this existing file instead of a fresh
    /// /dev/shm/canal-vm-<pid> (size = the file's size)
    #[arg(long, value_name = "PATH")]
    pub(crate) shm_path: Option<PathBuf>,
    /// Size of a fresh region file in MiB (a power of two)
    #[arg(long = "shm-size", value_name = "MiB", default_value_t = region::DEFAULT_REGION_MIB)]
    pub(crate) shm_mib: u64,
    /// KVM only if a (cached) probe boot succeeds
    #[arg(long, value_name = "auto|kvm|tcg", default_value = "auto", value_parser = parse_accel)]
    pub(crate) accel: AccelChoice,
    /// Guest memory in MiB
    #[arg(long = "mem", value_name = "MiB", default_value_t = 512,
          value_parser = clap::value_parser!(u64).range(64..))]
    pub(crate) mem_mib: u64,
    /// Guest CPUs
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) cpus: u32,
    /// Kill the guest after S seconds (exit 124)
    #[arg(long, value_name = "S", value_parser = parse_secs)]
    pub(crate) timeout: Option<Duration>,
    /// Fail if the guest is not ready after S seconds
    #[arg(long, value_name = "S", default_value = "120", value_parser = parse_secs)]
    pub(crate) boot_timeout: Duration,
    /// Host 127.0.0.1:H reaches guest port G: with --canal canald binds the guest's
    /// listener there, with --virtio alone QEMU's hostfwd forwards it (repeatable)
    #[arg(long, value_name = "H:G", value_parser = parse_publish)]
    pub(crate) publish: Vec<Publish>,
    /// Set an environment variable for PROGRAM (repeatable)
    #[arg(long, value_name = "NAME=VALUE", value_parser = parse_env)]
    pub(crate) env: Vec<(String, String)>,
    /// Print the QEMU command line and boot timings
    #[arg(short, long)]
    pub(crate) verbose: bool,
    /// The program and its arguments, after --
    #[arg(last = true, value_name = "PROGRAM")]
    pub(crate) program: Vec<String>,
}

/// `--accel`: auto (probe) or a fixed accelerator.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AccelChoice(pub Option<Accel>);

fn parse_accel(s: &str) -> Result<AccelChoice, String> {
    match s {
        "auto" => Ok(AccelChoice(None)),
        "kvm" => Ok(AccelChoice(Some(Accel::Kvm))),
        "tcg" => Ok(AccelChoice(Some(Accel::Tcg))),
        x => Err(format!("unknown '{x}' (auto|kvm|tcg)")),
    }
}

fn parse_secs(s: &str) -> Result<Duration, String> {
    s.parse::<f64>()
        .ok()
        .filter(|v| *v > 0.0 && v.is_finite())
        .map(Duration::from_secs_f64)
        .ok_or_else(|| format!("bad number of seconds '{s}'"))
}

fn parse_publish(v: &str) -> Result<Publish, String> {
    v.split_once(':')
        .and_then(|(h, g)| {
            Some(Publish {
                host: h.parse().ok()?,
                guest: g.parse().ok()?,
            })
        })
        .ok_or_else(|| format!("expected HOSTPORT:GUESTPORT, got '{v}'"))
}

fn parse_env(v: &str) -> Result<(String, String), String> {
    v.split_once('=')
        .map(|(k, val)| (k.to_string(), val.to_string()))
        .ok_or_else(|| format!("expected NAME=VALUE, got '{v}'"))
}

fn parse_pow2_mib(v: &str) -> Result<u64, String> {
    v.parse::<u64>()
        .ok()
        .filter(|s| s.is_power_of_two() && *s <= 1024)
        .ok_or_else(|| "needs a power of two in MiB (at most 1024)".to_string())
}

impl RunArgs {
    /// The run these options describe, with the combinations checked.
    pub(crate) fn options(&self) -> Result<RunOptions, String> {
        if self.program.is_empty() {
            return Err("no program: canal vm run [options] -- PROGRAM ARGS...".into());
        }
        let canal = self.canal || self.doorbell.is_some();
        if self.doorbell.is_some() && self.shm_path.is_some() {
            return Err(
                "--doorbell takes the region from the ivshmem server; no --shm-path".into(),
            );
        }
        let virtio = self.virtio || !canal;
        if !self.publish.is_empty() && !virtio && self.doorbell.is_some() {
            return Err("--publish with --doorbell: not supported (use --virtio)".into());
        }
        if !self.shm_mib.is_power_of_two() {
            return Err("--shm-size needs a power of two in MiB".into());
        }
        Ok(RunOptions {
            canal,
            virtio,
            preload: !self.no_preload,
            libcanal: self.libcanal.clone(),
            shm_path: self.shm_path.clone(),
            shm_mib: self.shm_mib,
            doorbell: self.doorbell.clone(),
            doorbell_vectors: self.doorbell_vectors,
            no_doorbell: self.no_doorbell,
            accel: self.accel.0,
            mem_mib: self.mem_mib,
            cpus: self.cpus,
            timeout: self.timeout,
            boot_timeout: self.boot_timeout,
            publish: self.publish.clone(),
            env: self.env.clone(),
            verbose: self.verbose || RunOptions::default().verbose,
            program: self.program.clone(),
        })
    }
}

/// Options of `canal vm qemu-args`.
#[derive(Args, Debug, Clone)]
pub struct QemuArgsArgs {
    /// Region name (its file is /dev/shm/canal-NAME unless --path)
    #[arg(long, default_value = "vm0")]
    pub(crate) name: String,
    /// Region size in MiB (a power of two)
    #[arg(long, value_name = "MiB", default_value_t = region::DEFAULT_REGION_MIB,
          value_parser = parse_pow2_mib)]
    pub(crate) size: u64,
    /// The region file
    #[arg(long, value_name = "FILE")]
    pub(crate) path: Option<PathBuf>,
    /// The ivshmem server socket of a region with doorbells
    #[arg(long, value_name = "SOCKET")]
    pub(crate) doorbell: Option<PathBuf>,
    /// MSI-X vectors of the doorbell device
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub(crate) vectors: u32,
}

/// Options of `canal vm region`.
#[derive(Args, Debug, Clone)]
pub struct RegionArgs {
    /// Region name: the file is /dev/shm/canal-NAME
    #[arg(long)]
    pub(crate) name: String,
    /// Region size in MiB (a power of two)
    #[arg(long, value_name = "MiB", default_value_t = region::DEFAULT_REGION_MIB,
          value_parser = parse_pow2_mib)]
    pub(crate) size: u64,
    /// Host 127.0.0.1:H reaches the guest's port G (repeatable)
    #[arg(long, value_name = "H:G", value_parser = parse_publish)]
    pub(crate) publish: Vec<Publish>,
    /// End when process PID (the VM) exits
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) pid: Option<u32>,
    /// canald is also the region's ivshmem server (ivshmem-doorbell: interrupts and
    /// doorbell kicks)
    #[arg(long)]
    pub(crate) doorbell: bool,
}

/// Runs one `canal vm` subcommand; returns the exit status.
pub fn run_command(cmd: &VmCommand) -> i32 {
    match cmd {
        VmCommand::Run(a) => cmd_run(a),
        VmCommand::QemuArgs(a) => cmd_qemu_args(a),
        VmCommand::Region(a) => cmd_region(a),
        VmCommand::Image => cmd_image(),
        VmCommand::Probe { run, force } => cmd_probe(*run, *force),
    }
}

fn cmd_qemu_args(a: &QemuArgsArgs) -> i32 {
    if let Some(server) = &a.doorbell {
        print!("{}", qemu::operator_doorbell_snippets(server, a.vectors));
        return 0;
    }
    let path = a
        .path
        .clone()
        .unwrap_or_else(|| region::region_path(&a.name));
    print!("{}", qemu::operator_snippets(&a.name, &path, a.size));
    0
}

fn cmd_run(a: &RunArgs) -> i32 {
    let o = match a.options() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("canal vm run: {e}");
            return 2;
        }
    };
    match run_program(&o) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("canal vm: {e}");
            EXIT_HARNESS
        }
    }
}

// `canal vm region`: a canald-served region for a VM someone else starts (libvirt,
/// a hand-written QEMU command line). The guest lives while this command runs.
fn cmd_region(a: &RegionArgs) -> i32 {
    let (name, size, doorbell, pid) = (&a.name, a.size, a.doorbell, a.pid);
    let publish: Vec<(u16, u16)> = a.publish.iter().map(|p| (p.host, p.guest)).collect();
    if let Err(e) = sys::catch_termination_signals() {
        eprintln!("canal vm: {e}");
        return EXIT_HARNESS;
    }
    let socket = canald_socket();
    if let Err(e) = canald::spawn::ensure_daemon(&socket) {
        eprintln!("canal vm: {e}");
        return 1;
    }
    let r = match region::canald_region(&socket, name, size << 20, &publish, doorbell) {
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
        None => print!("{}", qemu::operator_snippets(name, &r.path, size)),
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

fn cmd_probe(run: bool, force: bool) -> i32 {
    let qemu = match find_qemu() {
        Ok(q) => q,
        Err(e) => {
            eprintln!("canal vm: {e}");
            return EXIT_HARNESS;
        }
    };
    if !run && !force {
        return show_probe(&qemu);
    }
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

/// `canal vm probe` without --run: what is known, from the cache only.
fn show_probe(qemu: &std::path::Path) -> i32 {
    let text = if let Some(r) = probe::kvm_unavailable() {
        format!("accel tcg\nreason {r}\n")
    } else {
        let (kernel, kver) = match image::find_kernel() {
            Ok(k) => k,
            Err(e) => {
                eprintln!("canal vm: guest kernel: {e}");
                return EXIT_HARNESS;
            }
        };
        let file = probe::cache_file_for(&kernel, &kver, qemu);
        match probe::read_verdict(&file) {
            Some(probe::Verdict(Ok(()))) => {
                format!("accel kvm\ncached {}\n", file.display())
            }
            Some(probe::Verdict(Err(r))) => format!(
                "accel tcg\nreason KVM probe failed: {r}\ncached {}\n",
                file.display()
            ),
            None => format!(
                "accel unknown\nreason no verdict is cached (no {}); `canal vm probe --run` \
                 boots a guest under KVM to find out\n",
                file.display()
            ),
        }
    };
    canald::output::print_or_fail("canal vm probe", &text)
}

#[cfg(test)]
mod tests {
    use super::*;

    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(subcommand)]
        cmd: VmCommand,
    }

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    fn parse_run(v: &[String]) -> Result<RunOptions, String> {
        let argv = ["vm", "run"]
            .into_iter()
            .map(String::from)
            .chain(v.iter().cloned());
        match Cli::try_parse_from(argv).map_err(|e| e.to_string())?.cmd {
            VmCommand::Run(a) => a.options(),
            _ => unreachable!(),
        }
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
        assert!(parse_run(&s(&["--mem=32", "--", "x"])).is_err());
        let o = parse_run(&s(&["--mem=128", "--accel=tcg", "--", "x"])).unwrap();
        assert_eq!((o.mem_mib, o.accel), (128, Some(Accel::Tcg)));
    }
}
