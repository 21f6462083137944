//! The QEMU command line for a harness guest, and the options/XML an operator adds to
//! their own VM to attach a canal region.

use std::path::{Path, PathBuf};

/// How the guest executes: hardware virtualization or QEMU's emulator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Accel {
    Kvm,
    Tcg,
}

impl Accel {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
        }
    }
}

/// Port publishing for virtio-net's user networking: host 127.0.0.1:host -> guest :guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Publish {
    pub(crate) host: u16,
    pub(crate) guest: u16,
}

/// Everything that decides the QEMU command line of one harness guest.
#[derive(Debug, Clone)]
pub(crate) struct VmConfig {
    pub(crate) qemu: PathBuf,
    pub(crate) accel: Accel,
    pub(crate) mem_mib: u64,
    pub(crate) cpus: u32,
    /// `-machine` type (`pc`; `q35` e.g. for an emulated IOMMU).
    pub(crate) machine: String,
    /// Appended to the kernel command line.
    pub(crate) extra_append: String,
    /// `-cpu` model; None = `host` under KVM, `max` under TCG.
    pub(crate) cpu_model: Option<String>,
    pub(crate) kernel: PathBuf,
    pub(crate) initramfs: PathBuf,
    /// Host directory shared read-only as 9p tag `canalrun` (cmd.sh lives here).
    pub(crate) run_dir: PathBuf,
    /// Unix sockets QEMU connects to (as client) for the control/stdout/stderr ports.
    pub(crate) ctl_sock: PathBuf,
    pub(crate) out_sock: PathBuf,
    pub(crate) err_sock: PathBuf,
    /// Kernel console (serial 0) goes to this file.
    pub(crate) console_log: PathBuf,
    /// virtio-net with user networking (guest 10.0.2.15, host 10.0.2.2).
    pub(crate) virtio_net: bool,
    pub(crate) publish: Vec<Publish>,
    /// The canal device: ivshmem-plain backed by this file of this size.
    pub(crate) region: Option<(PathBuf, u64)>,
    /// The canal device as ivshmem-doorbell instead: the region and the interrupt eventfds
    /// come from an ivshmem server (protocol of QEMU's contrib/ivshmem-server) listening on
    /// this Unix socket; N MSI-X vectors. Implies `-machine q35` with an emulated IOMMU so
    /// the guest can take the interrupts through vfio-pci.
    pub(crate) doorbell: Option<(PathBuf, u32)>,
    /// Appended verbatim ($CANAL_VM_QEMU_EXTRA, split on whitespace): for experiments.
    pub(crate) extra: Vec<String>,
}

/// QEMU's option-value escaping: a comma inside a value is written as two commas.
fn esc(p: &Path) -> String {
    p.to_string_lossy().replace(',', ",,")
}

/// The `-object`/`-device` pair that attaches a region file as ivshmem-plain.
pub(crate) fn ivshmem_args(id: &str, path: &Path, size: u64) -> Vec<String> {
    vec![
        "-object".into(),
        format!(
            "memory-backend-file,id={id},share=on,mem-path={},size={size}",
            esc(path)
        ),
        "-device".into(),
        format!("ivshmem-plain,memdev={id}"),
    ]
}

/// The `-chardev`/`-device` pair that attaches an ivshmem server's region with doorbells.
pub(crate) fn ivshmem_doorbell_args(id: &str, server: &Path, vectors: u32) -> Vec<String> {
    vec![
        "-chardev".into(),
        format!("socket,id={id},path={}", esc(server)),
        "-device".into(),
        format!("ivshmem-doorbell,chardev={id},vectors={vectors}"),
    ]
}

impl VmConfig {
    /// The arguments after the QEMU binary name.
    pub(crate) fn args(&self) -> Vec<String> {
        let mut a: Vec<String> = Vec::new();
        let mut push = |xs: &[&str]| a.extend(xs.iter().map(|s| s.to_string()));
        let (accel, cpu) = match self.accel {
            Accel::Kvm => ("kvm", "host"),
            Accel::Tcg => ("tcg", "max"),
        };
        push(&["-nodefaults", "-no-user-config", "-display", "none"]);
        let cpu = self.cpu_model.as_deref().unwrap_or(cpu);
        let machine = match (&self.doorbell, self.accel) {
            (None, _) => format!("{},accel={accel}", self.machine),
            // Interrupt remapping with KVM needs the split irqchip.
            (Some(_), Accel::Kvm) => "q35,accel=kvm,kernel-irqchip=split".to_string(),
            (Some(_), Accel::Tcg) => "q35,accel=tcg".to_string(),
        };
        push(&["-machine", &machine, "-cpu", cpu]);
        if self.doorbell.is_some() {
            push(&["-device", "intel-iommu,intremap=on"]);
        }
        push(&["-m", &self.mem_mib.to_string()]);
        push(&["-smp", &self.cpus.to_string()]);
        // A guest panic or reboot ends QEMU instead of looping.
        push(&["-no-reboot"]);
        push(&["-kernel", &self.kernel.to_string_lossy()]);
        push(&["-initrd", &self.initramfs.to_string_lossy()]);
        let mut append = String::from(
            "console=ttyS0 quiet loglevel=3 panic=-1 rdinit=/init 8250.nr_uarts=1 \
             i8042.noaux i8042.nokbd tsc=reliable no_timer_check",
        );
        if self.doorbell.is_some() {
            append.push_str(" intel_iommu=on");
        }
        if !self.extra_append.is_empty() {
            append.push(' ');
            append.push_str(&self.extra_append);
        }
        push(&["-append", &append]);
        push(&[
            "-chardev",
            &format!("file,id=console,path={}", esc(&self.console_log)),
            "-serial",
            "chardev:console",
        ]);
        push(&["-device", "virtio-serial-pci,id=vser"]);
        for (id, sock, name) in [
            ("ctl", &self.ctl_sock, "canal.ctl"),
            ("out", &self.out_sock, "canal.stdout"),
            ("err", &self.err_sock, "canal.stderr"),
        ] {
            push(&[
                "-chardev",
                &format!("socket,id={id},path={}", esc(sock)),
                "-device",
                &format!("virtserialport,bus=vser.0,chardev={id},name={name}"),
            ]);
        }
        push(&[
            "-fsdev",
            "local,id=hostroot,path=/,security_model=none,readonly=on,multidevs=remap",
            "-device",
            "virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot",
        ]);
        push(&[
            "-fsdev",
            &format!(
                "local,id=canalrun,path={},security_model=none,readonly=on",
                esc(&self.run_dir)
            ),
            "-device",
            "virtio-9p-pci,fsdev=canalrun,mount_tag=canalrun",
        ]);
        if self.virtio_net {
            let mut netdev = String::from("user,id=net0");
            for p in &self.publish {
                netdev.push_str(&format!(",hostfwd=tcp:127.0.0.1:{}-:{}", p.host, p.guest));
            }
            push(&["-netdev", &netdev, "-device", "virtio-net-pci,netdev=net0"]);
        }
        if let Some((path, size)) = &self.region {
            a.extend(ivshmem_args("canalmem", path, *size));
        }
        if let Some((sock, vectors)) = &self.doorbell {
            a.extend(ivshmem_doorbell_args("canalbell", sock, *vectors));
        }
        a.extend(self.extra.iter().cloned());
        a
    }
}

/// What `canal vm qemu-args` prints: QEMU options and libvirt XML for a region file.
pub(crate) fn operator_snippets(name: &str, path: &Path, size_mib: u64) -> String {
    let qemu = ivshmem_args("canal-region", path, size_mib << 20).join(" ");
    format!(
        "# canal region '{name}': {path} ({size_mib} MiB)\n\
         # The file must exist before QEMU starts (canald creates it; it must be readable and\n\
         # writable by the QEMU process). Inside the guest it appears as PCI 1af4:1110\n\
         # (ivshmem-plain); libcanal maps BAR 2 through /sys/bus/pci/devices/*/resource2.\n\
         \n\
         # QEMU command line options:\n\
         {qemu}\n\
         \n\
         # libvirt domain XML (inside <devices>); libvirt maps /dev/shm/<name>, so the\n\
         # name below must match the file name under /dev/shm:\n\
         <shmem name='{shm_name}'>\n  \
           <model type='ivshmem-plain'/>\n  \
           <size unit='M'>{size_mib}</size>\n\
         </shmem>\n",
        path = path.display(),
        shm_name = path
            .strip_prefix("/dev/shm")
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_else(|_| format!("(file is not under /dev/shm: {})", path.display())),
    )
}

/// What `canal vm qemu-args --doorbell SOCKET` prints: the doorbell variant, where the
/// region and the eventfds come from an ivshmem server (canald) on SOCKET.
pub(crate) fn operator_doorbell_snippets(server: &Path, vectors: u32) -> String {
    let qemu = ivshmem_doorbell_args("canal-bell", server, vectors).join(" ");
    format!(
        "# canal region with doorbells from the ivshmem server on {server}\n\
         # The server hands QEMU the region and the interrupt eventfds. The guest takes\n\
         # MSI-X interrupts in user space through vfio-pci, which needs an IOMMU: use q35\n\
         # with an emulated Intel IOMMU and boot the guest kernel with intel_iommu=on.\n\
         \n\
         # QEMU command line options (with KVM also: -machine q35,kernel-irqchip=split):\n\
         -machine q35 -device intel-iommu,intremap=on {qemu}\n\
         \n\
         # libvirt domain XML: in <features>: <ioapic driver='qemu'/>; in <devices>:\n\
         <iommu model='intel'>\n  \
           <driver intremap='on'/>\n\
         </iommu>\n\
         <shmem name='canal-bell'>\n  \
           <model type='ivshmem-doorbell'/>\n  \
           <server path='{server}'/>\n  \
           <msi vectors='{vectors}' ioeventfd='on'/>\n\
         </shmem>\n",
        server = server.display(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> VmConfig {
        VmConfig {
            qemu: "qemu-system-x86_64".into(),
            accel: Accel::Tcg,
            mem_mib: 512,
            cpus: 1,
            cpu_model: None,
            machine: "pc".into(),
            extra_append: String::new(),
            kernel: "/boot/vmlinuz-x".into(),
            initramfs: "/c/initramfs.cpio".into(),
            run_dir: "/tmp/r,un".into(),
            ctl_sock: "/tmp/r/ctl.sock".into(),
            out_sock: "/tmp/r/out.sock".into(),
            err_sock: "/tmp/r/err.sock".into(),
            console_log: "/tmp/r/console.log".into(),
            virtio_net: true,
            publish: vec![Publish {
                host: 8080,
                guest: 80,
            }],
            region: Some(("/dev/shm/canal-x".into(), 64 << 20)),
            doorbell: None,
            extra: Vec::new(),
        }
    }

    #[test]
    fn command_line_has_devices() {
        let a = cfg().args();
        let s = a.join(" ");
        assert!(s.contains("pc,accel=tcg"));
        assert!(s.contains(
            "memory-backend-file,id=canalmem,share=on,mem-path=/dev/shm/canal-x,size=67108864"
        ));
        assert!(s.contains("ivshmem-plain,memdev=canalmem"));
        assert!(s.contains("hostfwd=tcp:127.0.0.1:8080-:80"));
        assert!(s.contains("path=/tmp/r,,un"), "commas are doubled: {s}");
        let mut c = cfg();
        c.virtio_net = false;
        c.region = None;
        let s = c.args().join(" ");
        assert!(!s.contains("virtio-net") && !s.contains("ivshmem"));
        c.doorbell = Some(("/run/canald/ivshmem.sock".into(), 2));
        let s = c.args().join(" ");
        assert!(s.contains("-machine q35,accel=tcg"));
        assert!(s.contains("-device intel-iommu,intremap=on"));
        assert!(s.contains("intel_iommu=on"));
        assert!(s.contains("socket,id=canalbell,path=/run/canald/ivshmem.sock"));
        assert!(s.contains("ivshmem-doorbell,chardev=canalbell,vectors=2"));
    }

    #[test]
    fn snippets() {
        let s = operator_snippets("vm1", Path::new("/dev/shm/canal-vm1"), 64);
        assert!(s.contains("<shmem name='canal-vm1'>"));
        assert!(s.contains("<size unit='M'>64</size>"));
        assert!(s.contains("mem-path=/dev/shm/canal-vm1,size=67108864"));
        let s = operator_doorbell_snippets(Path::new("/run/canald/ivshmem.sock"), 1);
        assert!(s.contains("ivshmem-doorbell,chardev=canal-bell,vectors=1"));
        assert!(s.contains("<server path='/run/canald/ivshmem.sock'/>"));
    }
}
