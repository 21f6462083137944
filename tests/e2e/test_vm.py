"""The VM harness (`canal vm`, crates/canal-vm): a QEMU guest booted from the host's
kernel and a busybox initramfs, with the host root read-only over 9p.

Each test boots its own guest (about 7-10 s under TCG here). The guest's program output
arrives over virtio-serial and `canal vm run` exits with the program's status.

Skipped (with the reason) only when qemu-system-x86_64 or a guest kernel is absent.
"""

import glob
import hashlib
import os
import random
import select
import shutil
import signal
import socket
import struct
import subprocess
import threading
import time
from pathlib import Path

import pytest

import e2e_util
from canal_harness import clean_env, need_tool, short_tmpdir as e2e_util_short_dir

pytestmark = pytest.mark.deadline(150)


def _kernel_present():
    for k in glob.glob("/boot/vmlinuz-*"):
        ver = os.path.basename(k)[len("vmlinuz-") :]
        if os.path.exists(f"/lib/modules/{ver}/modules.dep"):
            return True
    return bool(os.environ.get("CANAL_VM_KERNEL"))


@pytest.fixture(scope="module", autouse=True)
def _need_qemu():
    if not (os.environ.get("CANAL_VM_QEMU") or shutil.which("qemu-system-x86_64")):
        pytest.skip("qemu-system-x86_64 is not installed (scripts/packages/vm.txt)")
    if not _kernel_present():
        pytest.skip("no /boot/vmlinuz-VERSION with /lib/modules/VERSION (linux-image-amd64)")


def vm_argv(canal_bin, opts, program):
    # --accel auto: the KVM probe runs once and is cached; on hosts where KVM cannot boot
    # the guest it falls back to TCG.
    return [canal_bin, "vm", "run", "--timeout", "120", *opts, "--", *program]


def _qemu_children(pid):
    out = []
    for c in e2e_util.children_of(pid):
        try:
            with open(f"/proc/{c}/comm") as f:
                if f.read().startswith("qemu-system"):
                    out.append(c)
        except OSError:
            pass
    return out


def test_exit_status_args_and_streams(canal_bin, procs):
    args = ["a b", "it's", "$HOME", '"q"', ""]
    r = procs.run(
        vm_argv(
            canal_bin,
            ["--virtio"],
            ["sh", "-c", 'printf "<%s>" "$@"; echo; echo to-stderr >&2; exit 3', "sh", *args],
        ),
        timeout=140,
    )
    assert r.returncode == 3, r.describe()
    assert r.stdout == "".join(f"<{a}>" for a in args) + "\n", r.describe()
    assert "to-stderr" in r.stderr, r.describe()
    assert "to-stderr" not in r.stdout, r.describe()


def test_curl_over_virtio_net(canal_bin, procs):
    curl = need_tool("curl")
    blob = random.Random(6).randbytes(8 << 20)
    want = hashlib.sha256(blob).hexdigest()
    with e2e_util.BlobHTTPServer(blob) as srv:
        # 10.0.2.2 is the host's 127.0.0.1 under QEMU user networking.
        r = procs.run(
            vm_argv(
                canal_bin,
                ["--virtio"],
                [
                    "sh",
                    "-c",
                    f'{curl} -sS --max-time 60 -o /tmp/blob "$1" && sha256sum /tmp/blob',
                    "sh",
                    f"http://10.0.2.2:{srv.port}/blob",
                ],
            ),
            timeout=140,
        )
    assert r.returncode == 0, r.describe()
    assert r.stdout.split()[0] == want, r.describe()


# Runs in the guest: maps the ivshmem BAR through sysfs and talks to the host through it.
GUEST_SHM = r"""
import hashlib, mmap, os, sys, time
dev = os.environ["CANAL_IVSHMEM_DEVICE"]
size = int(os.environ["CANAL_REGION_SIZE"])
assert os.environ["CANAL_TRANSPORT"] == "ivshmem"
assert open(dev + "/vendor").read().strip() == "0x1af4"
assert open(dev + "/device").read().strip() == "0x1110"
f = open(dev + "/resource2", "r+b")
assert os.fstat(f.fileno()).st_size == size, (os.fstat(f.fileno()).st_size, size)
m = mmap.mmap(f.fileno(), size)
print("host-pattern", hashlib.sha256(m[0:4096] + m[size - 4096:size]).hexdigest(), flush=True)
reply = os.urandom(4096)
m[8192:12288] = reply
m[4096:4104] = b"GUESTRDY"
print("guest-reply", hashlib.sha256(reply).hexdigest(), flush=True)
deadline = time.monotonic() + 60
while m[12288:12296] != b"HOSTACK!":
    if time.monotonic() > deadline:
        print("no ack from the host", flush=True)
        sys.exit(2)
    time.sleep(0.005)
print("host-ack", hashlib.sha256(m[12296:12296 + 4096]).hexdigest(), flush=True)
"""


def test_ivshmem_region_is_shared_both_ways(canal_bin, procs, python):
    size = 4 << 20
    path = f"/dev/shm/canal-test-vm-{os.getpid()}"
    rnd = random.Random(66)
    head, tail = rnd.randbytes(4096), rnd.randbytes(4096)
    with open(path, "wb") as f:
        f.truncate(size)
        f.write(head)
        f.seek(size - 4096)
        f.write(tail)
    try:
        p = procs.spawn(
            vm_argv(
                canal_bin,
                ["--canal", "--no-preload", "--shm-path", path],
                [python, "-c", GUEST_SHM],
            ),
            name="vm-shm",
        )
        line = p.wait_line("host-pattern", timeout=120)
        assert line.split()[1] == hashlib.sha256(head + tail).hexdigest(), p.describe()
        line = p.wait_line("guest-reply", timeout=30)
        fd = os.open(path, os.O_RDWR)
        try:
            # The guest wrote its reply, then the flag: both must be visible in the file.
            assert os.pread(fd, 8, 4096) == b"GUESTRDY", p.describe()
            assert hashlib.sha256(os.pread(fd, 4096, 8192)).hexdigest() == line.split()[1]
            ack = rnd.randbytes(4096)
            os.pwrite(fd, ack, 12296)
            os.pwrite(fd, b"HOSTACK!", 12288)
        finally:
            os.close(fd)
        line = p.wait_line("host-ack", timeout=30)
        assert line.split()[1] == hashlib.sha256(ack).hexdigest(), p.describe()
        r = p.finish(timeout=30)
        assert r.returncode == 0, r.describe()
        assert os.path.exists(path), "a region file given with --shm-path belongs to the caller"
    finally:
        if os.path.exists(path):
            os.unlink(path)


class IvshmemServer:
    """A minimal ivshmem server (the protocol of QEMU's contrib/ivshmem-server, which
    canald is to speak): hands the connecting QEMU its peer id, the region fd and one
    eventfd per vector for itself (host -> guest interrupts) and for the host's peer id
    (guest -> host doorbell)."""

    GUEST_ID = 7
    HOST_ID = 1

    def __init__(self, sock_path, region_path):
        self.sock_path = sock_path
        self.region_path = region_path
        self.srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.srv.bind(sock_path)
        self.srv.listen(1)
        self.guest_irq = os.eventfd(0, os.EFD_NONBLOCK)
        self.host_bell = os.eventfd(0, os.EFD_NONBLOCK)
        self.conn = None
        self.error = None
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        try:
            self.srv.settimeout(120)
            c, _ = self.srv.accept()
            self.conn = c
            region = os.open(self.region_path, os.O_RDWR)

            def send(value, fd=None):
                data = struct.pack("<q", value)
                if fd is None:
                    c.sendall(data)
                else:
                    socket.send_fds(c, [data], [fd])

            send(0)  # protocol version
            send(self.GUEST_ID)  # the client's own id
            send(-1, region)  # the shared memory
            send(self.GUEST_ID, self.guest_irq)  # own vector 0
            send(self.HOST_ID, self.host_bell)  # peer HOST_ID, vector 0
            os.close(region)
        except Exception as e:  # reported by the test
            self.error = e

    def wait_doorbell(self, timeout):
        r, _, _ = select.select([self.host_bell], [], [], timeout)
        assert r, f"no doorbell from the guest within {timeout} s (server error: {self.error})"
        return os.eventfd_read(self.host_bell)

    def interrupt(self):
        os.eventfd_write(self.guest_irq, 1)

    def close(self):
        if self.conn:
            self.conn.close()
        self.srv.close()
        os.close(self.guest_irq)
        os.close(self.host_bell)


def test_doorbell_interrupts_both_ways(canal_bin, procs, tmp_path):
    gcc = need_tool("gcc")
    # The guest sees the host's root except /tmp (and a checkout may live under /tmp),
    # so the helper goes under /var/tmp.
    out_dir = Path("/var/tmp") / "canal-e2e-vm"
    out_dir.mkdir(parents=True, exist_ok=True)
    helper = out_dir / f"doorbell_check.{os.getpid()}"
    src = Path(__file__).resolve().parents[2] / "crates" / "canal-vm" / "guest" / "doorbell_check.c"
    cp = subprocess.run([gcc, "-O2", "-static", "-o", helper, src], capture_output=True, text=True, timeout=120)
    if cp.returncode != 0 and "cannot find -lc" in cp.stderr:
        pytest.skip("no static libc to build the guest helper (libc6-dev)")
    assert cp.returncode == 0, cp.stderr
    sock_dir = e2e_util_short_dir()
    region = f"/dev/shm/canal-test-bell-{os.getpid()}"
    with open(region, "wb") as f:
        f.truncate(4 << 20)
    srv = IvshmemServer(os.path.join(sock_dir, "ivshmem.sock"), region)
    try:
        p = procs.spawn(
            vm_argv(
                canal_bin,
                ["--doorbell", srv.sock_path, "--no-preload"],
                [helper, str(IvshmemServer.HOST_ID)],
            ),
            name="vm-bell",
        )
        # 1. guest -> host: the guest rings once it is armed.
        srv.wait_doorbell(timeout=120)
        with open(region, "r+b") as f:
            head = f.read(12)
            assert head[:5] == b"ARMED", (head, p.describe())
            assert struct.unpack("<I", head[8:12])[0] == IvshmemServer.GUEST_ID, "IVPosition"
            f.seek(64)
            f.write(b"hello-from-host")
        # 2. host -> guest: an MSI-X interrupt, delivered to the guest program's eventfd.
        t0 = time.monotonic()
        srv.interrupt()
        srv.wait_doorbell(timeout=30)
        round_trip = time.monotonic() - t0
        r = p.finish(timeout=30)
        assert r.returncode == 0, r.describe()
        assert "message=hello-from-host" in r.stdout, r.describe()
        assert f"ivposition={IvshmemServer.GUEST_ID}" in r.stdout, r.describe()
        print(f"interrupt + doorbell round trip under the harness: {round_trip * 1e3:.1f} ms")
    finally:
        srv.close()
        os.unlink(region)
        helper.unlink(missing_ok=True)
        shutil.rmtree(sock_dir, ignore_errors=True)


def test_sigterm_kills_qemu_and_cleans_up(canal_bin, procs):
    p = procs.spawn(
        vm_argv(canal_bin, ["--canal", "--no-preload"], ["sh", "-c", "echo started; exec sleep 300"]),
        name="vm-term",
    )
    p.wait_line("started", timeout=120)
    qemus = _qemu_children(p.pid)
    assert len(qemus) == 1, p.describe()
    region = f"/dev/shm/canal-vm-{p.pid}"
    assert os.path.exists(region), "canal vm run --canal creates /dev/shm/canal-vm-<pid>"
    rundirs = glob.glob(f"/tmp/canal-vm.{p.pid}.*")
    assert len(rundirs) == 1, rundirs
    os.kill(p.pid, signal.SIGTERM)  # canal vm only, not its process group
    r = p.finish(timeout=10)
    assert r.returncode == 128 + signal.SIGTERM, r.describe()
    assert not e2e_util.pid_alive(qemus[0]), "QEMU outlived canal vm run"
    assert not os.path.exists(region), "region file left behind"
    assert not os.path.exists(rundirs[0]), "run directory left behind"


def test_sigkill_of_the_harness_takes_qemu_down(canal_bin, procs):
    p = procs.spawn(
        vm_argv(canal_bin, ["--virtio"], ["sh", "-c", "echo started; exec sleep 300"]),
        name="vm-kill",
    )
    p.wait_line("started", timeout=120)
    qemus = _qemu_children(p.pid)
    assert len(qemus) == 1, p.describe()
    rundirs = glob.glob(f"/tmp/canal-vm.{p.pid}.*")
    os.kill(p.pid, signal.SIGKILL)
    p.finish(timeout=10)
    # PR_SET_PDEATHSIG: the kernel kills QEMU when its parent dies.
    e2e_util.wait_for(lambda: not e2e_util.pid_alive(qemus[0]), timeout=5, what="QEMU to die")
    for d in rundirs:  # SIGKILL leaves no chance to clean up; tidy after the test
        shutil.rmtree(d, ignore_errors=True)


GUEST_LISTENER = r"""
import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 8080))
s.listen(1)
print("listening", flush=True)
c, peer = s.accept()
data = c.recv(100)
c.sendall(b"guest got " + data)
c.close()
print("served", peer[0], flush=True)
"""


def test_published_guest_listener_over_virtio(canal_bin, procs, python):
    import socket

    port = e2e_util.free_port()
    p = procs.spawn(
        vm_argv(canal_bin, ["--virtio", "--publish", f"{port}:8080"], [python, "-c", GUEST_LISTENER]),
        name="vm-listen",
    )
    p.wait_line("listening", timeout=120)
    with socket.create_connection(("127.0.0.1", port), timeout=20) as c:
        c.sendall(b"ping")
        got = b""
        while True:
            b = c.recv(100)
            if not b:
                break
            got += b
    assert got == b"guest got ping", p.describe()
    line = p.wait_line("served", timeout=30)
    assert line.split()[1] == "10.0.2.2", "user networking presents the host as 10.0.2.2"
    r = p.finish(timeout=30)
    assert r.returncode == 0, r.describe()


def test_qemu_args_prints_options_and_libvirt_xml(canal_bin):
    cp = subprocess.run(
        [canal_bin, "vm", "qemu-args", "--name", "web1", "--size", "128"],
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert cp.returncode == 0, cp.stderr
    out = cp.stdout
    assert "-object memory-backend-file,id=canal-region,share=on,mem-path=/dev/shm/canal-web1,size=134217728" in out
    assert "-device ivshmem-plain,memdev=canal-region" in out
    assert "<shmem name='canal-web1'>" in out
    assert "<model type='ivshmem-plain'/>" in out
    assert "<size unit='M'>128</size>" in out


def test_usage_errors_do_not_boot(canal_bin):
    t0 = time.monotonic()
    cp = subprocess.run([canal_bin, "vm", "run", "--canal"], capture_output=True, text=True, timeout=10)
    assert cp.returncode == 2 and "no program" in cp.stderr
    cp = subprocess.run(
        [canal_bin, "vm", "run", "--doorbell", "/nonexistent.sock", "--publish", "8080:80", "--", "true"],
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert cp.returncode == 2 and "--publish with --doorbell" in cp.stderr
    assert time.monotonic() - t0 < 5


# ---- the ivshmem transport: programs in the guest use canal (issue 6) -----------------
#
# With --canal alone the guest kernel has no NIC (only lo): every byte a guest program
# moves to or from the host goes through libcanal, the ivshmem BAR and canald, so a
# transfer that completes is itself the proof that canal served it.


def _vm_env(canald):
    return clean_env({"CANAL_SOCKET": canald.socket})


def _vm_guests(canald):
    return [g for g in canald.stat().get("guests", []) if g.get("comm", "").startswith("vm:")]


GUEST_UDP = r"""
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(20)
s.sendto(b"ping", ("10.0.2.2", int(sys.argv[1])))
data, src = s.recvfrom(100)
print("udp", data.decode(), src[0], src[1] == int(sys.argv[1]), s.getsockname()[0])
"""


def test_curl_64mib_via_canal_in_a_guest(canal_bin, canald, procs, python):
    curl = need_tool("curl")
    blob = random.Random(64).randbytes(64 << 20)
    want = hashlib.sha256(blob).hexdigest()
    # A UDP echo on the host's loopback: the guest reaches it as 10.0.2.2 and sees the
    # reply come from there.
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    udp.settimeout(130)

    def echo():
        try:
            d, a = udp.recvfrom(100)
            udp.sendto(b"pong:" + d, a)
        except OSError:
            pass

    t = threading.Thread(target=echo, daemon=True)
    t.start()
    try:
        with e2e_util.BlobHTTPServer(blob) as srv:
            r = procs.run(
                vm_argv(
                    canal_bin,
                    ["--canal"],
                    [
                        "sh",
                        "-c",
                        "echo $(ls /sys/class/net); "
                        f'{curl} -sS --max-time 90 -o /tmp/blob "$1" && sha256sum /tmp/blob && '
                        f'{python} -c "$2" "$3"',
                        "sh",
                        f"http://10.0.2.2:{srv.port}/blob",
                        GUEST_UDP,
                        str(udp.getsockname()[1]),
                    ],
                ),
                timeout=140,
                env=_vm_env(canald),
            )
    finally:
        udp.close()
    assert r.returncode == 0, r.describe()
    lines = r.stdout.split("\n")
    assert lines[0] == "lo", "the guest must have no NIC besides lo: " + r.describe()
    assert lines[1].split()[0] == want, r.describe()
    # An unconnected UDP socket autobound by sendto is bound to the wildcard, as in the
    # kernel.
    assert lines[2] == "udp pong:ping 10.0.2.2 True 0.0.0.0", r.describe()
    assert not glob.glob("/dev/shm/canal-vm-*"), "canald removes the region file"


def test_iperf3_via_canal_in_a_guest(canal_bin, canald, procs):
    import json

    iperf3 = need_tool("iperf3")
    port = e2e_util.free_port()
    srv = procs.spawn([iperf3, "-s", "-1", "-B", "127.0.0.1", "-p", str(port), "--json"], name="iperf3-s")
    e2e_util.wait_for(lambda: e2e_util.tcp_listening(port), timeout=10, what="iperf3 server")
    r = procs.run(
        vm_argv(canal_bin, ["--canal"], [iperf3, "-c", "10.0.2.2", "-p", str(port), "-t", "1", "--json"]),
        timeout=140,
        env=_vm_env(canald),
    )
    assert r.returncode == 0, r.describe()
    s = srv.finish(timeout=20)
    assert s.returncode == 0, s.describe()
    cli, sv = json.loads(r.stdout), json.loads(s.stdout)
    sent = cli["end"]["sum_sent"]["bytes"]
    # Up to the bytes in flight when TEST_END overtook them go uncounted (e2e_util).
    received = sv["end"]["sum_received"]["bytes"]
    assert sent > 0 and sent - e2e_util.iperf3_slack() <= received <= sent, (sent, sv["end"]["sum_received"])
    # The server saw the guest connect from the host's loopback.
    assert sv["start"]["connected"][0]["remote_host"] == "127.0.0.1"


GUEST_PUBLISHED = r"""
import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 8080))
s.listen(1)
print("listening", s.getsockname()[1], flush=True)
c, peer = s.accept()
data = c.recv(100)
c.sendall(b"guest got " + data)
c.close()
print("served", peer[0], flush=True)
"""


def test_published_guest_listener_via_canald(canal_bin, canald, procs, python):
    port = e2e_util.free_port()
    p = procs.spawn(
        vm_argv(canal_bin, ["--canal", "--publish", f"{port}:8080"], [python, "-c", GUEST_PUBLISHED]),
        name="vm-publish",
        env=_vm_env(canald),
    )
    line = p.wait_line("listening", timeout=120)
    assert line.split()[1] == "8080", "the guest sees its own port: " + p.describe()
    g = _vm_guests(canald)
    assert len(g) == 1 and [s["local"] for s in g[0]["sockets"]] == [f"127.0.0.1:{port}"], g
    with socket.create_connection(("127.0.0.1", port), timeout=20) as c:
        c.sendall(b"ping")
        got = b""
        while True:
            b = c.recv(100)
            if not b:
                break
            got += b
    assert got == b"guest got ping", p.describe()
    line = p.wait_line("served", timeout=30)
    assert line.split()[1] == "10.0.2.2", "the host appears as 10.0.2.2, as with user networking"
    r = p.finish(timeout=30)
    assert r.returncode == 0, r.describe()


GUEST_HOLD = r"""
import socket, sys, time
port = int(sys.argv[1])
ss = [socket.create_connection(("10.0.2.2", port)) for _ in range(3)]
print("connected", flush=True)
time.sleep(300)
"""


def test_killing_the_vm_closes_its_host_sockets(canal_bin, canald, procs, python):
    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen(8)
    port = lst.getsockname()[1]
    p = procs.spawn(
        vm_argv(canal_bin, ["--canal"], [python, "-c", GUEST_HOLD, str(port)]),
        name="vm-hold",
        env=_vm_env(canald),
    )
    try:
        p.wait_line("connected", timeout=120)
        lst.settimeout(10)
        conns = [lst.accept()[0] for _ in range(3)]
        g = _vm_guests(canald)
        assert len(g) == 1 and len(g[0]["sockets"]) == 3, g
        qemu = g[0]["pid"]
        assert _qemu_children(p.pid) == [qemu], "canald knows the VM by its QEMU process"
        region = f"/dev/shm/canal-vm-{p.pid}"
        assert os.path.exists(region)
        assert oct(os.stat(region).st_mode & 0o777) == "0o600"
        os.kill(qemu, signal.SIGKILL)
        t0 = time.monotonic()
        e2e_util.wait_for(
            lambda: not any(x.get("sockets") for x in _vm_guests(canald)),
            timeout=1.0,
            what="canald to close the VM's host sockets",
        )
        gone = time.monotonic() - t0
        for c in conns:
            c.settimeout(1)
            assert c.recv(10) == b"", "host peer sees EOF"
            c.close()
        assert gone < 1.0
        assert not os.path.exists(region), "region file removed when the VM ended"
        p.finish(timeout=15)
    finally:
        lst.close()


GUEST_SELF_SERVER = r"""
import socket
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 9099))
s.listen(2)
for _ in range(2):
    c, _ = s.accept()
    c.sendall(c.recv(100)[::-1])
    c.close()
"""

GUEST_SELF_CLIENT = r"""
import socket, sys, time
deadline = time.monotonic() + 60
for host in ("10.0.2.15", "127.0.0.1"):
    while True:
        try:
            c = socket.create_connection((host, 9099), timeout=10)
            break
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    c.sendall(b"hello")
    print("got", host, c.recv(100).decode(), flush=True)
"""


def test_two_programs_in_one_guest_share_the_region(canal_bin, canald, procs, python):
    """Two independent processes (not forked from each other) attach to the VM's one
    region; one listens, the other reaches it as 10.0.2.15 and as 127.0.0.1, also when
    the port is published on another host port."""
    port = e2e_util.free_port()
    r = procs.run(
        vm_argv(
            canal_bin,
            ["--canal", "--publish", f"{port}:9099", "--env", "CANAL_LOG=debug"],
            ["sh", "-c", f'{python} -c "$1" & {python} -c "$2"; wait', "sh", GUEST_SELF_SERVER, GUEST_SELF_CLIENT],
        ),
        timeout=140,
        env=_vm_env(canald),
    )
    assert r.returncode == 0, r.describe()
    assert r.stdout.split("\n")[:2] == ["got 10.0.2.15 olleh", "got 127.0.0.1 olleh"], r.describe()
    # Both live at once and a VFIO group has one owner: one process takes the doorbell
    # interrupts, the other waits by backoff; both ring the doorbell (protocol §9.5).
    modes = sorted(l.rsplit(" ", 1)[1] for l in r.stderr.split("\n") if "ivshmem doorbell: kicks" in l)
    assert modes == ["backoff", "interrupt"], r.describe()
    assert r.stderr.count("kicks ring the doorbell") == 2, r.describe()


# ---- wake-ups: ivshmem doorbells, and the backoff fallback (protocol §9.4, §9.5) -------

GUEST_PINGPONG = r"""
import os, socket, sys, time
print("wakeups", os.environ.get("CANAL_VM_WAKEUPS"), flush=True)
port, n = int(sys.argv[1]), int(sys.argv[2])
c = socket.create_connection(("10.0.2.2", port), timeout=60)
for i in range(n):
    # Longer than any spin budget: canald is asleep when this send kicks it.
    time.sleep(0.05)
    c.sendall(b"req-%d" % i)
    # The host answers after 50 ms: this thread is asleep when the reply arrives.
    got = b""
    while not got.endswith(b"."):
        b = c.recv(100)
        assert b, "EOF"
        got += b
    print("reply", got.decode(), flush=True)
"""


def _pingpong_server(canald, n, seen):
    """A host server answering each request 50 ms late; before the last answer it
    takes canald's listing (the VM guest is still there)."""
    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen(1)
    lst.settimeout(130)

    def serve():
        try:
            c, _ = lst.accept()
            c.settimeout(60)
            with c:
                for i in range(n):
                    got = c.recv(100)
                    seen.append(got)
                    time.sleep(0.05)
                    if i == n - 1:
                        seen.append(_vm_guests(canald))
                    c.sendall(b"re:" + got + b".")
        except OSError as e:
            seen.append(e)
        finally:
            lst.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return lst.getsockname()[1], t


def _run_pingpong(canal_bin, canald, procs, python, opts, n):
    seen = []
    port, t = _pingpong_server(canald, n, seen)
    r = procs.run(
        vm_argv(canal_bin, ["--canal", *opts], [python, "-c", GUEST_PINGPONG, str(port), str(n)]),
        timeout=140,
        env=_vm_env(canald),
    )
    t.join(timeout=10)
    assert r.returncode == 0, r.describe()
    lines = r.stdout.strip().split("\n")
    assert lines[1:] == [f"reply re:req-{i}." for i in range(n)], r.describe()
    assert seen[:-1] == [b"req-%d" % i for i in range(n)], seen
    guests = seen[-1]
    assert isinstance(guests, list) and len(guests) == 1, seen
    return lines[0], guests[0], r


def test_doorbell_wakeups_in_a_canal_guest(canal_bin, canald, procs, python):
    """`canal vm run --canal`: canald serves the region through its ivshmem server; the
    guest's kicks are doorbell writes and canald's wake-ups are MSI-X interrupts taken
    through VFIO, both sides sleeping between messages."""
    n = 8
    mode, g, r = _run_pingpong(canal_bin, canald, procs, python, ["-v"], n)
    assert mode == "wakeups doorbell", r.describe()
    assert "wake-ups: doorbell" in r.stderr, r.describe()
    assert "ivshmem-doorbell,chardev=canalbell,vectors=64" in r.stderr, r.describe()
    bell = g.get("doorbell")
    assert bell is not None, g
    print(f"doorbell counters after {n} exchanges: {bell}")
    # Each of the n requests found canald asleep (a 50 ms gap) and each reply found the
    # guest thread asleep: without doorbells both counters stay 0.
    assert bell["kicks"] >= n // 2, bell
    assert bell["interrupts"] >= n // 2, bell
    assert not glob.glob("/dev/shm/canal-vm-*"), "canald removes the region file"
    assert not glob.glob(os.path.join(os.path.dirname(canald.socket), "ivshmem-*.sock")), (
        "the ivshmem server socket is gone once QEMU attached"
    )


def test_backoff_wakeups_without_doorbell(canal_bin, canald, procs, python):
    """`--no-doorbell`: ivshmem-plain; both sides fall back to bounded backoff and the
    exchange is the same."""
    n = 4
    mode, g, r = _run_pingpong(canal_bin, canald, procs, python, ["-v", "--no-doorbell"], n)
    assert mode == "wakeups backoff", r.describe()
    assert "wake-ups: backoff (--no-doorbell)" in r.stderr, r.describe()
    assert "ivshmem-plain" in r.stderr and "ivshmem-doorbell" not in r.stderr, r.describe()
    assert "doorbell" not in g and g["wakes"] == 0, g
