"""Isolated guests (docs/isolation.md): `canal run --isolate` and any guest in a network
namespace other than canald's get that namespace's own address view — their own
loopback, the host as 10.0.2.2, the resolver as 10.0.2.3, published ports only.

Each test compares what the program sees with what the kernel would give it in such a
namespace, and checks the boundary from both sides: the guest never reaches the host's
loopback or another guest's, and the host reaches a guest only on a published port."""

import errno
import json
import re
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import e2e_util
from canal_harness import Canald, serving_canald

PROGS = Path(__file__).parent / "progs"


def _host_server(procs, python, port, tag, host="127.0.0.1"):
    """A native TCP server on the host answering every connection with `tag` and the
    peer's address."""
    p = procs.spawn([python, "-c", HOST_SERVER, host, str(port), tag], name=f"host-{tag}")
    p.wait_line("ready", 10)
    return p


HOST_SERVER = r"""
import socket, sys
s = socket.socket(socket.AF_INET6 if ":" in sys.argv[1] else socket.AF_INET)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(16)
print("ready", flush=True)
while True:
    c, a = s.accept()
    c.sendall(f"{sys.argv[3]} {a[0]}\n".encode()); c.close()
"""

# Inside: a server on port G (wildcard) answering with its tag and the peer it sees;
# then a client of 127.0.0.1:G, ::1:G, 10.0.2.15:G and a UDP round trip on 127.0.0.1:G.
GUEST_OWN = r"""
import socket, sys, threading
port, tag = int(sys.argv[1]), sys.argv[2]
s = socket.socket(socket.AF_INET6)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("::", port)); s.listen(16)
print("listener", s.getsockname()[0], s.getsockname()[1], flush=True)
def serve():
    while True:
        c, a = s.accept()
        c.sendall(f"{tag} {a[0]}\n".encode()); c.close()
threading.Thread(target=serve, daemon=True).start()
for host, fam in (("127.0.0.1", socket.AF_INET), ("::1", socket.AF_INET6), ("10.0.2.15", socket.AF_INET)):
    c = socket.socket(fam); c.settimeout(10); c.connect((host, port))
    print("own", host, c.recv(100).decode().strip(), "|", c.getsockname()[0], c.getpeername()[0], c.getpeername()[1], flush=True)
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(("127.0.0.1", port))
v = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); v.settimeout(10)
v.sendto(b"ping", ("127.0.0.1", port)); d, a = u.recvfrom(100)
u.sendto(b"pong:" + d, a); d2, a2 = v.recvfrom(100)
print("udp", a[0], d2.decode(), a2[0], a2[1], flush=True)
print("done", flush=True)
sys.stdin.readline()
"""


def _lines(r):
    return [l for l in r.stdout.splitlines() if l]


def isolated(canald, argv, publish=(), name=None, extra=()):
    args = [canald.canal_bin, "run", "--socket", canald.socket, "--isolate"]
    for p in publish:
        args += ["--publish", p]
    if name:
        args += ["--name", name]
    return args + list(extra) + ["--"] + [str(a) for a in argv]


def _network_of(canald, proc):
    g = canald.guest(proc)
    assert g and g.get("network"), f"canal stat shows no network for {proc.name}: {g}"
    return g["network"]


def _connect(addr, port, timeout=3):
    try:
        c = socket.create_connection((addr, port), timeout=timeout)
        c.settimeout(timeout)
        return c.recv(100).decode().strip()
    except OSError as e:
        return f"error {e.errno}"


def test_namespaced_program_stays_out_of_the_host_loopback(canald, procs, python):
    """The finding: a program in its own namespace (`unshare -n`) under `canal run`
    against an outside canald reached the host's 127.0.0.1. Now canald sees the
    namespace and gives it its own loopback; the host is 10.0.2.2."""
    port = e2e_util.free_port()
    _host_server(procs, python, port, "HOST")
    prog = (
        "import socket,sys\n"
        "for h in ('127.0.0.1', '10.0.2.2'):\n"
        "    try:\n"
        "        c = socket.create_connection((h, int(sys.argv[1])), timeout=5); print(h, c.recv(100).decode().strip(), flush=True)\n"
        "    except OSError as e: print(h, 'errno', e.errno, flush=True)\n"
    )
    unshare = ["unshare", "-n"] if os.geteuid() == 0 else ["unshare", "-rn"]
    r = procs.run([*unshare, *canald.argv([python, "-c", prog, port])], timeout=60)
    assert r.returncode == 0, r.describe()
    assert _lines(r) == [f"127.0.0.1 errno {errno.ECONNREFUSED}", "10.0.2.2 HOST 127.0.0.1"], r.describe()


def test_two_isolated_guests_each_have_their_own_loopback(canald, procs, python):
    """Two guests listen on the same port; each reaches its own server as 127.0.0.1,
    ::1 and 10.0.2.15 (and sees its own client as 127.0.0.1), UDP too; a host server
    on that port is reached by neither, and the host reaches only its own."""
    port = e2e_util.free_port()
    _host_server(procs, python, port, "HOST")
    a = procs.spawn(isolated(canald, [python, "-c", GUEST_OWN, port, "A"], name="iso-a"), name="iso-a", stdin=subprocess.PIPE)
    b = procs.spawn(isolated(canald, [python, "-c", GUEST_OWN, port, "B"], name="iso-b"), name="iso-b", stdin=subprocess.PIPE)
    for p, tag in ((a, "A"), (b, "B")):
        p.wait_line("done", 30)
        out = [l for l in p.stdout().splitlines() if l]
        assert out[0] == f"listener :: {port}", p.describe()
        assert out[1] == f"own 127.0.0.1 {tag} ::ffff:127.0.0.1 | 127.0.0.1 127.0.0.1 {port}", p.describe()
        # As natively: a client of ::1 is ::1 at both ends (it speaks from lo6).
        assert out[2] == f"own ::1 {tag} ::1 | ::1 ::1 {port}", p.describe()
        assert out[3].startswith(f"own 10.0.2.15 {tag} "), p.describe()
        assert out[4] == f"udp 127.0.0.1 pong:ping 127.0.0.1 {port}", p.describe()
    na, nb = _network_of(canald, a), _network_of(canald, b)
    assert na["name"] == "isolated:iso-a" and nb["name"] == "isolated:iso-b"
    assert na["loopback"] != nb["loopback"]
    # The host's own server is still the host's.
    assert _connect("127.0.0.1", port) == "HOST 127.0.0.1"
    # Knowing a guest's private loopback does not get a host process in.
    for n in (na, nb):
        got = _connect(n["loopback"], port)
        assert got.startswith("error") or got == "", f"host reached {n['name']}'s unpublished listener: {got}"
    for p in (a, b):
        p.send_line("")
        assert p.finish(20).returncode == 0, p.describe()


GUEST_PUBLISHED = r"""
import socket, sys
port = int(sys.argv[1])
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", port)); s.listen(4)
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(("0.0.0.0", port))
print("ready", flush=True)
c, a = s.accept()
print("accepted", a[0], c.getsockname()[0], c.getsockname()[1], flush=True)
c.sendall(b"guest\n"); c.close()
d, a = u.recvfrom(100)
print("datagram", d.decode(), a[0], flush=True)
u.sendto(b"back:" + d, a)
"""


def test_published_ports_are_the_only_way_in(canald, procs, python):
    """`--publish H:G` and `H:G/udp`: the host reaches the guest's port G on
    127.0.0.1:H; the guest sees the host as 10.0.2.2 and itself as 10.0.2.15:G."""
    g, h = e2e_util.free_port(), e2e_util.free_port()
    p = procs.spawn(
        isolated(canald, [python, "-c", GUEST_PUBLISHED, g], publish=[f"{h}:{g}", f"127.0.0.1:{h}:{g}/udp"], name="pub"),
        name="pub",
    )
    p.wait_line("ready", 30)
    # Not on the guest's port, which is private: on the published one.
    assert _connect("127.0.0.1", g).startswith("error"), "the guest's own port reached from the host"
    assert _connect("127.0.0.1", h) == "guest"
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.settimeout(10)
    u.sendto(b"hi", ("127.0.0.1", h))
    d, a = u.recvfrom(100)
    assert (d, a) == (b"back:hi", ("127.0.0.1", h))
    r = p.finish(20)
    assert r.returncode == 0, r.describe()
    lines = _lines(r)
    assert lines[1] == f"accepted 10.0.2.2 10.0.2.15 {g}", r.describe()
    assert lines[2] == "datagram hi 10.0.2.2", r.describe()


GUEST_BACKLOG = e2e_util.ACCEPT_ALL + r"""
import socket, sys
l = socket.socket(); l.bind(("0.0.0.0", int(sys.argv[1]))); l.listen(2)
print("ready", flush=True)
sys.stdin.readline()
print("accepted", len(accept_all(l)), flush=True)
"""


def test_a_published_listener_queues_clients_as_the_kernel(canald, procs, python):
    """Six host clients at once against an isolated guest's published `listen(fd, 2)`
    before it accepts: three complete (backlog + 1, as natively), all three wait in the
    kernel's queue of the published port (`ss`; canald takes none before the program's
    first accept, feature HOST_QUEUED), and one non-blocking accept loop then takes all
    three. canald used to take one ahead at once (`ss` showed 2)."""
    g, h = e2e_util.free_port(), e2e_util.free_port()
    p = procs.spawn(
        isolated(canald, [python, "-c", GUEST_BACKLOG, g], publish=[f"{h}:{g}"], name="backlog"),
        name="backlog", stdin=subprocess.PIPE,
    )
    p.wait_line("ready", 30)
    got, socks = e2e_util.handshakes_within(h, 6, 0.4)
    time.sleep(0.3)  # canald's passes: nothing may be taken ahead meanwhile
    queue = e2e_util.host_queue_len(h)
    p.popen.stdin.write(b"go\n")
    p.popen.stdin.flush()
    line = p.wait_line("accepted", 30)
    for c in socks:
        c.close()
    assert (got, queue, line) == (3, [3], "accepted 3"), p.describe()


GUEST_CLIENT = r"""
import socket, sys, time
c = socket.create_connection(("10.0.2.2", int(sys.argv[1])), timeout=10)
c.sendall(b"x" * 100000)
got = b""
while len(got) < 100000:
    got += c.recv(65536)
print("echoed", len(got), c.getpeername()[0], flush=True)
sys.stdin.readline()
"""

GUEST_ECHO = r"""
import socket, sys
host = sys.argv[2] if len(sys.argv) > 2 else "0.0.0.0"
s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
s.bind((host, int(sys.argv[1]))); s.listen(4)
print("ready", flush=True)
c, a = s.accept()
print("peer", a[0], flush=True)
while True:
    d = c.recv(65536)
    if not d:
        break
    c.sendall(d)
"""


@pytest.mark.parametrize("listener", ["0.0.0.0", "::"])
def test_isolated_guests_short_circuit_each_other(canald, procs, python, listener):
    """A guest connecting to another guest's published port is connected ring to ring,
    as between ordinary canal guests; also when the listener is a dual-stack `[::]` one
    (node's, nginx's), whose accepted socket names the client IPv4-mapped, as natively."""
    g, h = e2e_util.free_port(), e2e_util.free_port()
    srv = procs.spawn(isolated(canald, [python, "-c", GUEST_ECHO, g, listener], publish=[f"{h}:{g}"], name="echo"),
                      name="echo")
    srv.wait_line("ready", 30)
    cli = procs.spawn(isolated(canald, [python, "-c", GUEST_CLIENT, h], name="client"), name="client", stdin=subprocess.PIPE)
    cli.wait_line("echoed", 30)
    assert "echoed 100000 10.0.2.2" in cli.stdout(), cli.describe()
    canald.wait_served(cli, kind="tcp-shortcut")
    canald.wait_served(srv, kind="tcp-shortcut")
    cli.send_line("")
    assert cli.finish(20).returncode == 0, cli.describe()
    r = srv.finish(20)
    peer = "10.0.2.2" if listener == "0.0.0.0" else "::ffff:10.0.2.2"
    assert r.returncode == 0 and f"peer {peer}\n" in r.stdout, r.describe()


DNS_SERVER = r"""
import socket, struct, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("127.0.0.1", int(sys.argv[1]) if len(sys.argv) > 1 else 0))
print("port", s.getsockname()[1], flush=True)
while True:
    q, a = s.recvfrom(512)
    i = 12
    while q[i]:
        i += q[i] + 1
    qtype = struct.unpack("!H", q[i + 1:i + 3])[0]
    ans = b"\xc0\x0c" + struct.pack("!HHIH", 1, 1, 60, 4) + bytes([192, 0, 2, 7]) if qtype == 1 else b""
    s.sendto(q[:2] + struct.pack("!HHHHH", 0x8180, 1, 1 if ans else 0, 0, 0) + q[12:i + 5] + ans, a)
"""

GUEST_RESOLVE = r"""
import socket
print("glibc", socket.getaddrinfo("www.example.test", 80, socket.AF_INET, socket.SOCK_STREAM)[0][4][0], flush=True)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(10)
s.sendto(b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x03foo\x04test\x00\x00\x01\x00\x01", ("10.0.2.3", 53))
d, a = s.recvfrom(512)
print("own", ".".join(map(str, d[-4:])), a[0], a[1], flush=True)
"""


@pytest.mark.parametrize("seccomp", ["seccomp", "no-seccomp"])
def test_resolver_inside(procs, canal_bin, python, seccomp):
    """The guest's resolver is 10.0.2.3: glibc's stub resolver (kernel sockets: served
    by seccomp notification, or with --no-seccomp relayed by canal run) and a program's
    own DNS socket (a canal socket, forwarded by canald) both reach the resolver canald
    is given, here one on the host's loopback."""
    dns = procs.spawn([python, "-c", DNS_SERVER], name="dns")
    port = int(dns.wait_line("port", 10).split()[1])
    extra = ["--no-seccomp"] if seccomp == "no-seccomp" else []
    with serving_canald(canal_bin, procs, args=["--dns", f"127.0.0.1:{port}"]) as d:
        r = procs.run(isolated(d, [python, "-c", GUEST_RESOLVE], extra=extra), timeout=60)
        assert r.returncode == 0, r.describe()
        assert _lines(r) == ["glibc 192.0.2.7", "own 192.0.2.7 10.0.2.3 53"], r.describe()
        r = procs.run(isolated(d, ["getent", "hosts", "canal.example"], extra=extra), timeout=60)
        assert r.returncode == 0 and r.stdout.split() == ["192.0.2.7", "canal.example"], r.describe()


def test_isolate_errors_and_exit_status(canald, procs, python):
    """Usage errors are rc 2 with the reason; a host port published twice is refused
    with the network holding it; the program's exit status and signal come through;
    inside, `canal stat` is refused (a guest cannot list other guests)."""
    base = [canald.canal_bin, "run", "--socket", canald.socket]
    r = procs.run([*base, "--publish", "8080:80", "--", "true"], timeout=20)
    assert r.returncode == 2 and "--isolate" in r.stderr, r.describe()
    for bad in ("80", "0:80", "x:1:2", "1:2/sctp", "127.100.0.1:1:2"):
        r = procs.run([*base, "--isolate", "--publish", bad, "--", "true"], timeout=20)
        assert r.returncode == 2 and "invalid value" in r.stderr, r.describe()
    h = e2e_util.free_port()
    holder = procs.spawn(isolated(canald, ["sleep", "30"], publish=[f"{h}:80"], name="holder"), name="holder")
    # Registered before the program runs: wait for `sleep` under canal run.
    e2e_util.wait_for(lambda: _runs(holder, "sleep"), 10, what="the holder's program to start")
    r = procs.run(isolated(canald, ["true"], publish=[f"{h}:81"]), timeout=20)
    assert r.returncode == 1 and "already published by isolated:holder" in r.stderr, r.describe()
    holder.stop()
    r = procs.run(isolated(canald, ["sh", "-c", "exit 7"]), timeout=20)
    assert r.returncode == 7, r.describe()
    r = procs.run(isolated(canald, ["sh", "-c", "kill -TERM $$"]), timeout=20)
    assert r.returncode == -15, r.describe()
    r = procs.run(isolated(canald, [canald.canal_bin, "stat", "--socket", canald.socket]), timeout=20)
    assert r.returncode != 0 and "not from another network namespace" in r.stderr, r.describe()
    r = procs.run(isolated(canald, ["/nonexistent/prog"]), timeout=20)
    assert r.returncode == 127 and "cannot run" in r.stderr, r.describe()


def _runs(proc, comm):
    """Whether a child of `proc` (canal run --isolate) is the program `comm`."""
    for c in e2e_util.children_of(proc.pid):
        try:
            if Path(f"/proc/{c}/comm").read_text().strip() == comm:
                return True
        except OSError:
            pass
    return False


def test_loopback_only_policy_applies_inside(procs, canal_bin, python):
    """`canald --loopback-only` holds for isolated guests too: the host (10.0.2.2) is
    loopback; another address is refused with EACCES."""
    prog = (
        "import socket\n"
        "for h in ('10.0.2.2', '192.0.2.1'):\n"
        "    s = socket.socket(); s.settimeout(3)\n"
        "    print(h, s.connect_ex((h, 9)), flush=True)\n"
    )
    with serving_canald(canal_bin, procs, args=["--loopback-only"]) as d:
        r = procs.run(isolated(d, [python, "-c", prog]), timeout=60)
    assert r.returncode == 0, r.describe()
    assert _lines(r) == [f"10.0.2.2 {errno.ECONNREFUSED}", f"192.0.2.1 {errno.EACCES}"], r.describe()


def _nobody_can_unshare():
    r = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "unshare", "-U", "-n", "true"],
        capture_output=True, text=True,
    )
    return r.returncode == 0, r.stderr.strip()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become another user")
def test_isolate_unprivileged(procs, canal_bin, tmp_path):
    """Unprivileged, as rootless podman: a user namespace too (the program keeps its
    uid), canald of that user outside; the host is reachable as 10.0.2.2 and a port
    published."""
    ok, why = _nobody_can_unshare()
    if not ok:
        pytest.skip(f"unprivileged user namespaces are not available here: {why}")
    # The system's interpreter: the test's own may live under root's home.
    python = "/usr/bin/python3"
    port, g, h = e2e_util.free_port(), e2e_util.free_port(), e2e_util.free_port()
    _host_server(procs, sys.executable, port, "HOST")
    wrapper = tmp_path / "canal-as-nobody"
    wrapper.write_text(f"#!/bin/sh\nexec setpriv --reuid=65534 --regid=65534 --clear-groups {canal_bin} \"$@\"\n")
    wrapper.chmod(0o755)
    os.chmod(tmp_path, 0o755)
    d = Canald(str(wrapper), procs)
    os.chown(d.dir, 65534, 65534)
    d.start()
    try:
        prog = (
            "import os, socket, sys\n"
            "c = socket.create_connection(('10.0.2.2', int(sys.argv[1])), timeout=10)\n"
            "print('uid', os.getuid(), c.recv(100).decode().strip(), flush=True)\n"
            "s = socket.socket(); s.bind(('0.0.0.0', int(sys.argv[2]))); s.listen(1)\n"
            "print('ready', flush=True)\n"
            "a, _ = s.accept(); a.sendall(b'nobody-guest\\n')\n"
        )
        p = procs.spawn(isolated(d, [python, "-c", prog, port, g], publish=[f"{h}:{g}"]), name="nobody")
        p.wait_line("ready", 30)
        assert _connect("127.0.0.1", h) == "nobody-guest"
        r = p.finish(20)
        assert r.returncode == 0 and "uid 65534 HOST 127.0.0.1" in r.stdout, r.describe()
    finally:
        d.stop()


UNSHARE_AFTER_ATTACH = r"""
import ctypes, os, socket, sys
port = int(sys.argv[1])
before = socket.create_connection(("127.0.0.1", port), timeout=5)
libc = ctypes.CDLL(None, use_errno=True)
flags = 0x40000000  # CLONE_NEWNET
if os.geteuid() != 0:
    flags |= 0x10000000  # CLONE_NEWUSER
assert libc.unshare(flags) == 0, os.strerror(ctypes.get_errno())
print("before", before.recv(100).decode().strip(), flush=True)
after = socket.socket(); after.settimeout(5)
print("after", after.connect_ex(("127.0.0.1", port)), flush=True)
"""


def test_a_process_that_moves_keeps_old_sockets_and_makes_new_ones_there(canald, procs, python):
    """unshare(CLONE_NEWNET) after attaching: sockets made before stay canal's (the
    kernel keeps a socket in the namespace it was made in), new ones are the new
    namespace's kernel sockets — whose loopback is down and empty."""
    port = e2e_util.free_port()
    _host_server(procs, python, port, "HOST")
    r = canald.run([python, "-c", UNSHARE_AFTER_ATTACH, port], timeout=60)
    assert r.returncode == 0, r.describe()
    assert _lines(r)[0] == "before HOST 127.0.0.1", r.describe()
    assert _lines(r)[1] in (f"after {errno.ENETUNREACH}", f"after {errno.ECONNREFUSED}"), r.describe()


SERVE_ONCE = r"""
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen(4)
print("ready", flush=True)
c, a = s.accept(); c.sendall(f"container {a[0]}\n".encode()); c.close()
"""


def _oci_state(pid, publish, cid="c0ffee123"):
    return json.dumps({"ociVersion": "1.0.2", "id": cid, "status": "created", "pid": pid, "bundle": "/nonexistent",
                       "annotations": {"io.canal.publish": publish}})


@pytest.mark.skipif(os.geteuid() != 0, reason="nsenter into the test's namespace needs root")
def test_oci_hook_registers_a_container(canald, procs, python):
    """`canal oci-hook` as a runtime calls it: the OCI state on stdin names the
    container's pid; its namespace is registered under ctr-<id> with the annotation's
    ports, so a program in it is reachable on the published port; the registration
    ends with the container (a second container may then publish the same port)."""
    g, h = e2e_util.free_port(), e2e_util.free_port()
    ctr = procs.spawn(["unshare", "-n", python, "-c", "import time; print('up', flush=True); time.sleep(120)"], name="ctr")
    ctr.wait_line("up", 10)
    hook = [canald.canal_bin, "oci-hook", "--socket", canald.socket]
    r = subprocess.run(hook, input=_oci_state(ctr.pid, f"{h}:{g}"), capture_output=True, text=True, timeout=20)
    assert r.returncode == 0, r.stderr
    srv = procs.spawn(["nsenter", "-t", str(ctr.pid), "-n", *canald.argv([python, "-c", SERVE_ONCE, g])], name="in-ctr")
    srv.wait_line("ready", 30)
    # Asked before connecting: the server ends after its one client.
    assert _network_of(canald, srv)["name"] == "isolated:ctr-c0ffee123"
    assert _connect("127.0.0.1", h) == "container 10.0.2.2"
    # While the container lives, its host port is taken.
    other = procs.spawn(["unshare", "-n", "sleep", "60"], name="ctr2")
    e2e_util.wait_for(lambda: _netns(other.pid) != _netns(os.getpid()), 5, what="the second namespace")
    r = subprocess.run(hook, input=_oci_state(other.pid, f"{h}:{g}", "second"), capture_output=True, text=True, timeout=20)
    assert r.returncode == 1 and "already published by isolated:ctr-c0ffee123" in r.stderr, r.stderr
    assert srv.finish(20).returncode == 0, srv.describe()
    ctr.stop()

    def registered_again():
        r = subprocess.run(hook, input=_oci_state(other.pid, f"{h}:{g}", "second"), capture_output=True, text=True,
                           timeout=20)
        return r.returncode == 0 or None

    e2e_util.wait_for(registered_again, 10, interval=0.1, what="the first container's registration to end")
    # Bad input fails the hook (the runtime then does not start the container).
    for bad in ("not json", json.dumps({"id": "x"}), _oci_state(other.pid, "80")):
        r = subprocess.run(hook, input=bad, capture_output=True, text=True, timeout=20)
        assert r.returncode == 1 and r.stderr.startswith("canal oci-hook: "), r.stderr


def _netns(pid):
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def test_podman_container_under_canal(canald, procs, python, tmp_path):
    """A podman container (the host's root as its root filesystem, no image needed)
    with --network=none, libcanal and the control socket mounted, and the hook: its
    server is reachable on the published port. Skipped where podman cannot start a
    container."""
    podman = shutil.which("podman")
    if not podman:
        pytest.skip("podman is not installed")
    probe = subprocess.run([podman, "run", "--rm", "--network=none", "--rootfs", "/", "true"],
                           capture_output=True, text=True, timeout=120)
    if probe.returncode != 0:
        pytest.skip(f"podman cannot start a container here: {probe.stderr.strip()[-300:]}")
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "canal.json").write_text(json.dumps({
        "version": "1.0.0",
        "hook": {"path": canald.canal_bin, "args": ["canal", "oci-hook", "--socket", canald.socket]},
        "when": {"annotations": {"^io\\.canal\\.publish$": ".*"}},
        "stages": ["createRuntime"],
    }))
    lib = str(Path(canald.canal_bin).with_name("libcanal.so"))
    g, h = e2e_util.free_port(), e2e_util.free_port()
    d = os.path.dirname(canald.socket)
    p = procs.spawn([podman, "--hooks-dir", str(hooks), "run", "--rm", "--network=none", "--rootfs", "/",
                     "-v", f"{d}:{d}", "-e", f"LD_PRELOAD={lib}", "-e", f"CANAL_SOCKET={canald.socket}",
                     "--annotation", f"io.canal.publish={h}:{g}", python, "-c", SERVE_ONCE, str(g)], name="podman")
    p.wait_line("ready", 60)
    assert _connect("127.0.0.1", h) == "container 10.0.2.2"
    assert p.finish(30).returncode == 0, p.describe()


GUEST_UDP_PRIVATE = r"""
import socket, sys
port = int(sys.argv[1])
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(("0.0.0.0", port))
print("ready", flush=True)
sys.stdin.readline()
v = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); v.sendto(b"own", ("127.0.0.1", port))
u.settimeout(5)
d, a = u.recvfrom(100)
print("got", d.decode(), a[0], flush=True)
"""


def test_unpublished_datagram_port_takes_only_its_own(canald, procs, python):
    """A host process that sends to a guest's unpublished UDP port on its private
    loopback is dropped; the guest's own datagram arrives (first, and only it)."""
    g = e2e_util.free_port()
    p = procs.spawn(isolated(canald, [python, "-c", GUEST_UDP_PRIVATE, g], name="udp"), name="udp",
                    stdin=subprocess.PIPE)
    p.wait_line("ready", 30)
    lo = _network_of(canald, p)["loopback"]
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for _ in range(3):
        s.sendto(b"intruder", (lo, g))
    time.sleep(0.3)
    p.send_line("")
    r = p.finish(20)
    assert r.returncode == 0 and _lines(r)[-1] == "got own 127.0.0.1", r.describe()


def test_datagram_control_messages_name_the_guests_own_addresses(canald, procs, python):
    """recvmsg's packet info and sendmsg's chosen source inside --isolate, line for line
    as the same program natively in a namespace of its own (progs/dgram_control.py
    `view`: it leaves out 127.0.0.2 as an address of its own and IPv6 hop limits, which
    the view does not carry, docs/isolation.md). The host's private loopback never
    shows; SO_MARK stays refused (EPERM), which also proves the sockets were canal's."""
    argv = [python, PROGS / "dgram_control.py", "view"]
    native = _natively_in_a_namespace(procs, argv)
    r = procs.run(isolated(canald, argv), timeout=60)
    assert r.returncode == 0, r.describe()
    want = native.replace('["SO_MARK", ["sent", 1]]', '["SO_MARK", ["errno", 1]]')
    assert '["IP_PKTINFO", 1, "127.0.0.1", "127.0.0.1"]' in native, native
    assert r.stdout == want, f"natively:\n{native}\nunder canal --isolate:\n{r.stdout}"


def _dns_answer(port, name, qid, timeout=5):
    """The first A record the DNS server on 127.0.0.1:port gives for `name`."""
    q = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"
    msg = qid.to_bytes(2, "big") + bytes.fromhex("0100 0001 0000 0000 0000") + q + bytes.fromhex("0001 0001")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(timeout)
        s.sendto(msg, ("127.0.0.1", port))
        r, src = s.recvfrom(512)
    assert src == ("127.0.0.1", port) and r[:2] == qid.to_bytes(2, "big"), (src, r)
    return socket.inet_ntoa(r[-4:]) if int.from_bytes(r[6:8], "big") else None


def test_dns_server_inside_published_on_udp(canald, procs, tmp_path):
    """dnsmasq with its defaults (a wildcard socket that reads IP_PKTINFO to tell which
    address each query came to, and answers from it) inside --isolate on port 53,
    published on a host UDP port: the host's queries are answered, and dnsmasq logs
    them as coming from 10.0.2.2 (the host, in the guest's view)."""
    dnsmasq = shutil.which("dnsmasq")
    if not dnsmasq:
        pytest.skip("dnsmasq is not installed (scripts/install-deps installs it)")
    conf = tmp_path / "dnsmasq.conf"
    conf.write_text("port=53\nno-resolv\nno-hosts\naddress=/canal.test/10.9.8.7\nlog-queries\n")
    host = e2e_util.free_port()
    user = f"--user={pwd.getpwuid(os.geteuid()).pw_name}"
    p = procs.spawn(isolated(canald, [dnsmasq, "--keep-in-foreground", "--log-facility=-", "-C", conf, user],
                             publish=[f"{host}:53/udp"]), name="dnsmasq")
    # dnsmasq logs to stderr (--log-facility=-).
    e2e_util.wait_for(lambda: p.poll() is not None or "started" in p.stderr(), 30, what="dnsmasq to start")
    assert p.poll() is None, p.describe()
    answers = []
    for qid in range(1, 4):
        e2e_util.wait_for(lambda: p.poll() is not None or _try_dns(host, qid, answers), 20,
                          what="dnsmasq inside to answer through its published port")
    assert answers == ["10.9.8.7"] * 3, (answers, p.describe())
    e2e_util.wait_for(lambda: "canal.test from 10.0.2.2" in p.stderr(), 10, what="dnsmasq's log line")


def _try_dns(port, qid, answers):
    try:
        answers.append(_dns_answer(port, "canal.test", qid, timeout=1))
        return True
    except OSError:
        return False


# ---- programs LD_PRELOAD cannot reach: static and Go, served by seccomp notification ---

@pytest.fixture(scope="module")
def netstatic(tmp_path_factory):
    """tests/e2e/progs/netstatic.c built with gcc -static."""
    gcc = shutil.which("gcc")
    if not gcc:
        pytest.skip("gcc is not installed")
    out = tmp_path_factory.mktemp("static") / "netstatic"
    r = subprocess.run([gcc, "-static", "-O1", "-o", str(out), str(PROGS / "netstatic.c")],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot link statically here: {r.stderr.strip()[-300:]}")
    os.chmod(out.parent, 0o755)
    return str(out)


@pytest.fixture(scope="module")
def netgo(tmp_path_factory):
    """tests/e2e/progs/netgo.go built with CGO_ENABLED=0 (a static Go binary)."""
    go = shutil.which("go")
    if not go:
        pytest.skip("go is not installed (golang-go)")
    d = tmp_path_factory.mktemp("go")
    out = d / "netgo"
    # One build cache for every run of the suite (the mode reruns build it again).
    cache = "/tmp/canal-e2e-gocache"
    env = dict(os.environ, CGO_ENABLED="0", GOCACHE=cache, HOME=str(d), GO111MODULE="off", GOFLAGS="")
    r = subprocess.run([go, "build", "-o", str(out), str(PROGS / "netgo.go")], capture_output=True, text=True,
                       env=env, timeout=240)
    assert r.returncode == 0, r.stderr
    os.chmod(d, 0o755)
    return str(out)


def test_static_program_reaches_the_host_and_nothing_else(canald, procs, python, netstatic):
    """A static binary inside --isolate: the host is 10.0.2.2 (and it is 10.0.2.15),
    UDP as well (sendto/recvfrom and sendmsg/recvmsg); 127.0.0.1 is its own, empty; no warning (it is served); canal stat
    counts its seccomp-served sockets."""
    port = e2e_util.free_port()
    _host_server(procs, python, port, "HOST")
    udp = procs.spawn([python, "-c", UDP_ECHO], name="udp-echo")
    uport = int(udp.wait_line("port", 10).split()[1])
    p = procs.spawn(isolated(canald, ["sh", "-c",
                                      f"{netstatic} dial 10.0.2.2 {port}; {netstatic} dial 127.0.0.1 {port}; "
                                      f"{netstatic} udp 10.0.2.2 {uport}; {netstatic} udpself {uport}; "
                                      f"{netstatic} udpmsg 10.0.2.2 {uport}; {netstatic} udpmsgself {uport}; "
                                      "echo done; read x"], name="static"), name="static", stdin=subprocess.PIPE)
    p.wait_line("done", 30)
    out = [l for l in p.stdout().splitlines() if l]
    assert out[0].startswith("got HOST 127.0.0.1 | local 10.0.2.15:") and out[0].endswith(f"peer 10.0.2.2:{port}"), p.describe()
    assert out[1] == f"udp pong:ping from 10.0.2.2:{uport}", p.describe()
    assert out[2].startswith("udpself own from 127.0.0.1:"), p.describe()
    # sendmsg/recvmsg (the address inside the msghdr, the data in two iovecs each way).
    assert out[3] == f"udpmsg pong:ping from 10.0.2.2:{uport} (9 bytes, namelen 16)", p.describe()
    assert out[4].startswith("udpmsgself own from 127.0.0.1:") and out[4].endswith("(3 bytes, namelen 16)"), p.describe()
    assert "connect: Connection refused" in p.stderr(), p.describe()
    assert "statically linked" not in p.stderr(), "a served program gets no warning"
    nets = [n for n in canald.stat().get("networks", []) if n["name"] == "isolated:static"]
    assert nets and nets[0]["seccomp"]["sockets"] >= 4, canald.stat()
    p.send_line("")
    assert p.finish(20).returncode == 0, p.describe()


def test_static_program_batches_datagrams(canald, procs, python, netstatic):
    """sendmmsg/recvmmsg from a static binary inside --isolate are translated as
    sendmsg/recvmsg are: 3 datagrams with addresses to the host's echo at 10.0.2.2
    come back from 10.0.2.2 (each msg_len written back); 2 between two own sockets in
    one blocking recvmmsg come from 127.0.0.1 (the private loopback, never a host
    address); on a connected socket (no addresses) the kernel's own batch runs."""
    udp = procs.spawn([python, "-c", UDP_ECHO], name="udp-echo")
    uport = int(udp.wait_line("port", 10).split()[1])
    own = e2e_util.free_port()
    p = procs.spawn(isolated(canald, ["sh", "-c",
                                      f"{netstatic} udpmmsg 10.0.2.2 {uport}; "
                                      f"{netstatic} udpmmsgself {own}; "
                                      f"{netstatic} udpmmsgconn 10.0.2.2 {uport}; echo done"],
                             name="mmsg"), name="mmsg")
    p.wait_line("done", 30)
    out = [l for l in p.stdout().splitlines() if l]
    host = f"10.0.2.2:{uport}"
    assert out[:4] == ["udpmmsg sent 3: 2 3 4",
                       f"udpmmsg got pong:m1 (7 bytes) from {host}",
                       f"udpmmsg got pong:m22 (8 bytes) from {host}",
                       f"udpmmsg got pong:m333 (9 bytes) from {host}"], p.describe()
    assert out[4] == "udpmmsgself sent 2: 4 5", p.describe()
    srcs = {l.split(" from ")[1] for l in out[5:7]}
    assert len(srcs) == 1 and srcs.pop().startswith("127.0.0.1:"), p.describe()
    assert [l.split(" from ")[0] for l in out[5:7]] == ["udpmmsgself got own1 (4 bytes)",
                                                         "udpmmsgself got own22 (5 bytes)"], p.describe()
    assert out[7] == "udpmmsgself 2 in 1 call(s)", p.describe()
    assert out[8:11] == ["udpmmsgconn sent 2: 2 3",
                         f"udpmmsgconn got pong:c1 (7 bytes) from {host}",
                         f"udpmmsgconn got pong:c22 (8 bytes) from {host}"], p.describe()
    assert p.finish(20).returncode == 0, p.describe()


UDP_ECHO = r"""
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("127.0.0.1", 0))
print("port", s.getsockname()[1], flush=True)
while True:
    d, a = s.recvfrom(100); s.sendto(b"pong:" + d, a)
"""


GUEST_UDP_BOUND = r"""
import socket, sys
port, hport = int(sys.argv[1]), int(sys.argv[2])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("0.0.0.0", port))
print("bound", flush=True)
s.sendto(b"ping", ("10.0.2.2", hport))
d, a = s.recvfrom(100)
print("udpbound %s from %s:%d" % (d.decode(), a[0], a[1]), flush=True)
print("name %s:%d" % s.getsockname(), flush=True)
s.connect(("10.0.2.2", hport)); s.send(b"ping")
d, a = s.recvfrom(100)
print("udpbound connected %s from %s:%d" % (d.decode(), a[0], a[1]), flush=True)
print("name %s:%d" % s.getsockname(), flush=True)
"""


@pytest.mark.parametrize("kind", ["canal", "static"])
def test_a_bound_datagram_socket_keeps_its_port_and_takes_its_replies(canald, procs, python, netstatic, kind):
    """A UDP socket bound to a port inside --isolate that talks to a host server (a
    resolver, an NTP or syslog server): the host sees that port, the replies arrive
    (sent to, then connected), the socket's name stays the guest's; a stranger
    sending to the same host address is still dropped."""
    srv = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    srv.bind(("127.0.0.1", 0))
    srv.settimeout(20)
    hport = srv.getsockname()[1]
    g = e2e_util.free_port()
    argv = ([python, "-c", GUEST_UDP_BOUND, g, hport] if kind == "canal"
            else [netstatic, "udpbound", g, "10.0.2.2", hport])
    p = procs.spawn(isolated(canald, argv, name=f"udpbound-{kind}"), name=f"udpbound-{kind}")
    stranger = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for _ in range(2):
        d, src = srv.recvfrom(100)
        assert d == b"ping" and src[1] == g, (d, src, p.describe())
        stranger.sendto(b"intruder", src)
        time.sleep(0.2)
        srv.sendto(b"pong", src)
    r = p.finish(20)
    assert _lines(r) == ["bound", f"udpbound pong from 10.0.2.2:{hport}", f"name 0.0.0.0:{g}",
                         f"udpbound connected pong from 10.0.2.2:{hport}", f"name 10.0.2.15:{g}"], r.describe()


def test_static_and_canal_programs_share_one_network(canald, procs, python, netstatic):
    """In one namespace a static server and clients of both kinds: each reaches the
    other as 127.0.0.1 (a canal server from a static client, a static server from a
    canal client and a static one); the host reaches the static server only on its
    published port, not on the private loopback."""
    g, h, g2 = e2e_util.free_port(), e2e_util.free_port(), e2e_util.free_port()
    script = (f"{netstatic} serve {g} 3 & "
              f"{python} -c \"$1\" {g2} & "
              f"sleep 1; {netstatic} dial 127.0.0.1 {g}; "
              f"{python} -c 'import socket,sys; c=socket.create_connection((\"127.0.0.1\", {g})); "
              f"print(\"canal-client\", c.recv(100).decode().strip())'; "
              f"{netstatic} dial 127.0.0.1 {g2}; echo all-done; wait")
    p = procs.spawn(isolated(canald, ["sh", "-c", script, "sh", SERVE_ONCE], publish=[f"{h}:{g}"], name="mixed"),
                    name="mixed")
    p.wait_line("all-done", 30)
    out = p.stdout()
    assert f"listening [::]:{g}" in out, p.describe()
    assert "got static [::ffff:127.0.0.1]:" in out, p.describe()
    assert "canal-client static [::ffff:127.0.0.1]:" in out, p.describe()
    assert f"got container 127.0.0.1 | local 127.0.0.1:" in out, "a static client of a canal server"
    net = next(n for n in canald.stat()["networks"] if n["name"] == "isolated:mixed")
    # canal stat lists the seccomp-served sockets still open: the static server's
    # listener only (its clients exited, its accepted connections are closed).
    open_ = net["seccomp"]["open"]
    assert [(s["kind"], s["state"], s["local"], s["host_local"]) for s in open_] == [
        ("tcp-listener", "listen", f"[::]:{g}", f"[::ffff:127.0.0.1]:{h}")], open_
    assert Path(f"/proc/{open_[0]['pid']}/comm").read_text().strip() == "netstatic", open_
    text = subprocess.run([canald.canal_bin, "stat", "--socket", canald.socket], capture_output=True,
                          text=True, timeout=20).stdout
    row = f"{open_[0]['pid']}  {open_[0]['fd']:>5}  tcp-listener  listen"
    assert "(served by seccomp)" in text and row in text, text
    lo = net["loopback"]
    got = _connect(lo, g)
    assert got.startswith("error") or got == "", f"the host reached the unpublished static server: {got}"
    assert _connect("127.0.0.1", h).startswith("static [::ffff:10.0.2.2]:")
    assert p.finish(20).returncode == 0, p.describe()


def test_go_program_dials_listens_and_resolves(procs, canal_bin, python, netgo):
    """A static Go binary (CGO_ENABLED=0: the runtime's own system calls) inside
    --isolate dials the host, resolves through 10.0.2.3 with Go's own resolver, and
    serves a published port and its own clients."""
    port = e2e_util.free_port()
    _host_server(procs, python, port, "HOST")
    dns = procs.spawn([python, "-c", DNS_SERVER], name="dns")
    dport = int(dns.wait_line("port", 10).split()[1])
    g, h = e2e_util.free_port(), e2e_util.free_port()
    with serving_canald(canal_bin, procs, args=["--dns", f"127.0.0.1:{dport}"]) as d:
        r = procs.run(isolated(d, ["sh", "-c", f"{netgo} dial 10.0.2.2:{port}; {netgo} resolve go.example.test"]),
                      timeout=60)
        assert r.returncode == 0, r.describe()
        lines = _lines(r)
        assert lines[0].startswith("got HOST 127.0.0.1 local 10.0.2.15:"), r.describe()
        assert lines[0].endswith(f"remote 10.0.2.2:{port}"), r.describe()
        assert lines[1] == "resolved [192.0.2.7]", r.describe()
        p = procs.spawn(isolated(d, ["sh", "-c", f"{netgo} serve {g} 2 & sleep 1; {netgo} dial 127.0.0.1:{g}; wait"],
                                 publish=[f"{h}:{g}"]), name="go-serve")
        p.wait_line("got go", 30)
        assert _connect("127.0.0.1", h).startswith("go 10.0.2.2:")
        r = p.finish(20)
        assert r.returncode == 0, r.describe()
        assert f"listening [::]:{g}" in r.stdout and f"remote 127.0.0.1:{g}" in r.stdout, r.describe()


GUEST_NAMES_BY_ROUTE = r"""
import socket, sys
port = int(sys.argv[1])
for dst in (("10.0.2.2", port), ("10.0.2.3", 53)):
    c = socket.create_connection(dst, timeout=10)
    print("tcp", dst[0], c.recv(64).decode().split()[0], *c.getpeername(), flush=True)
    c.close()
q = b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x03foo\x04test\x00\x00\x01\x00\x01"
for dst in (("10.0.2.2", port), ("10.0.2.3", 53)):
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.settimeout(10)
    u.sendto(q, dst)
    d, a = u.recvfrom(512)
    print("udp", dst[0], *a, flush=True)
"""


def test_resolver_port_shared_with_a_host_server_reads_as_each_route(procs, canal_bin, python, netgo):
    """The host's resolver (UDP) and a TCP server share a port number P, so host
    127.0.0.1:P is both 10.0.2.3:53 and 10.0.2.2:P to the guest. Each socket reads
    its peer as the address it named — a canal socket (forwarded by canald) and a
    static Go program's (served by seccomp). Found when the Go test's free TCP port
    drew the resolver's UDP port: its dial of 10.0.2.2 read 10.0.2.3:53."""
    # A number free for both protocols: the resolver's own pick (UDP) was once held
    # by a TCP socket of another process, and the host server's bind failed.
    port = e2e_util.port_free_for_tcp_and_udp()
    dns = procs.spawn([python, "-c", DNS_SERVER, str(port)], name="dns")
    dns.wait_line("port", 10)
    _host_server(procs, python, port, "HOST")  # TCP, the same number
    with serving_canald(canal_bin, procs, args=["--dns", f"127.0.0.1:{port}"]) as d:
        r = procs.run(isolated(d, [python, "-c", GUEST_NAMES_BY_ROUTE, str(port)]), timeout=60)
        assert r.returncode == 0, r.describe()
        assert _lines(r) == [f"tcp 10.0.2.2 HOST 10.0.2.2 {port}", "tcp 10.0.2.3 HOST 10.0.2.3 53",
                             f"udp 10.0.2.2 10.0.2.2 {port}", "udp 10.0.2.3 10.0.2.3 53"], r.describe()
        r = procs.run(isolated(d, ["sh", "-c", f"{netgo} dial 10.0.2.2:{port}; {netgo} dial 10.0.2.3:53"]),
                      timeout=60)
        assert r.returncode == 0, r.describe()
        lines = _lines(r)
        assert lines[0].endswith(f"remote 10.0.2.2:{port}"), r.describe()
        assert lines[1].endswith("remote 10.0.2.3:53"), r.describe()


def test_without_seccomp_a_static_program_is_warned_and_has_no_way_out(canald, procs, python, netstatic):
    """--no-seccomp: the static program gets canal run's warning and only the
    namespace's own loopback."""
    port = e2e_util.free_port()
    _host_server(procs, python, port, "HOST")
    r = procs.run(isolated(canald, [netstatic, "dial", "10.0.2.2", port], extra=["--no-seccomp"]), timeout=60)
    assert r.returncode == 1 and "statically linked" in r.stderr, r.describe()
    assert "Network is unreachable" in r.stderr, r.describe()


def test_isolate_starts_its_private_canald_outside(procs, canal_bin, python):
    """No canald running: `canal run --isolate` starts the private one in its own
    (the host's) namespace before making the program's, so the program reaches the
    host — the finding was a daemon started inside the namespace, with no network."""
    from canal_harness import short_tmpdir
    port = e2e_util.free_port()
    _host_server(procs, python, port, "HOST")
    d = short_tmpdir()
    sock = os.path.join(d, "canald.sock")
    try:
        prog = ("import socket,sys; c = socket.create_connection(('10.0.2.2', int(sys.argv[1])), timeout=10); "
                "print(c.recv(100).decode().strip())")
        r = procs.run([canal_bin, "run", "--socket", sock, "--isolate", "--", python, "-c", prog, port], timeout=60)
        assert r.returncode == 0 and r.stdout.strip() == "HOST 127.0.0.1", r.describe()
        pid = int(json.loads(subprocess.run([canal_bin, "stat", "--socket", sock, "--json"], capture_output=True,
                                            text=True, timeout=10).stdout)["daemon"]["pid"])
        assert _netns(pid) == _netns(os.getpid()), "the private canald runs in the host's namespace"
    finally:
        subprocess.run(["pkill", "-f", f"--socket {sock}"], capture_output=True)
        shutil.rmtree(d, ignore_errors=True)


def test_a_served_program_killed_in_accept_frees_its_port(canald, procs, netstatic):
    """A static server blocked in accept is killed: canald's waiting thread lets go
    of the listener, so the published port can be taken again (within about a second),
    as after a native server's death."""
    g, h = e2e_util.free_port(), e2e_util.free_port()
    first = procs.spawn(isolated(canald, [netstatic, "serve", g, 1], publish=[f"{h}:{g}"]), name="first")
    first.wait_line("listening", 30)
    time.sleep(0.3)  # it sits in accept
    first.signal_group(signal.SIGKILL)
    first.finish(10)

    def again():
        p = procs.spawn(isolated(canald, [netstatic, "serve", g, 1], publish=[f"{h}:{g}"]), name="again")
        try:
            p.wait_line("listening", 10)
        except AssertionError:
            p.finish(10)
            return None
        return p

    p = e2e_util.wait_for(again, 5, interval=0.3, what="the published port to be free again")
    assert _connect("127.0.0.1", h).startswith("static [::ffff:10.0.2.2]:")
    assert p.finish(20).returncode == 0, p.describe()


def test_canal_guests_inside_are_not_taken_for_confined(canald, procs, python):
    """The seccomp filter `--isolate` installs only notifies canald and allows every
    call: a canal guest under it must not switch to the backoff waits of a program
    confined by a sandbox's filter (they cost every wait up to a millisecond: B14's
    64 B RR went from 15 µs to 1 ms). A second filter, as a sandbox adds, does confine."""
    prog = "import socket; socket.socket()"
    r = procs.run(isolated(canald, [python, "-c", prog]), timeout=60, env={**os.environ, "CANAL_LOG": "debug"})
    attached = [l for l in r.stderr.splitlines() if "attached as guest" in l]
    assert r.returncode == 0 and attached, r.describe()
    assert "confined" not in attached[0], r.describe()
    # A program started under one more filter (as a sandboxing service manager adds):
    # an allow-everything filter installed, then a fresh image.
    r = procs.run(isolated(canald, [python, "-c", ONE_MORE_FILTER, python]), timeout=60,
                  env={**os.environ, "CANAL_LOG": "debug"})
    attached = [l for l in r.stderr.splitlines() if "attached as guest" in l]
    assert r.returncode == 0 and attached and "confined" in attached[-1], r.describe()


ONE_MORE_FILTER = r"""
import ctypes, os, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
assert libc.prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS
allow = ctypes.create_string_buffer(struct.pack("=HBBI", 0x06, 0, 0, 0x7FFF0000))  # ret ALLOW
prog = ctypes.create_string_buffer(struct.pack("=HxxxxxxQ", 1, ctypes.addressof(allow)))
assert libc.prctl(22, 2, ctypes.c_void_p(ctypes.addressof(prog)), 0, 0) == 0, os.strerror(ctypes.get_errno())  # PR_SET_SECCOMP
os.execv(sys.argv[1], [sys.argv[1], "-c", "import socket; socket.socket()"])
"""


# ---- IPv6-only sockets (IPV6_V6ONLY): their own port space, as natively -------------

def _natively_in_a_namespace(procs, argv):
    """argv run natively in a fresh network namespace (loopback up): the reference."""
    unshare = ["unshare", "-n"] if os.geteuid() == 0 else ["unshare", "-rn"]
    r = procs.run([*unshare, sys.executable, str(PROGS / "lo_up.py"), *map(str, argv)], timeout=60)
    assert r.returncode == 0, r.describe()
    return r.stdout


@pytest.mark.parametrize("mode", ["shortcut", "no-shortcut"])
def test_ipv6_only_sockets_behave_as_natively(canal_bin, procs, python, mode):
    """A program with an IPv4 and an IPV6_V6ONLY socket on one port (asyncio's
    start_server without a host; before, its bind was EINVAL inside --isolate): each
    takes its own family's clients, a lone one refuses the other family, the kernel's
    rules for the option (read back, EINVAL after bind or on a mapped address,
    ENETUNREACH to one, ENOPROTOOPT on IPv4, inherited by an accepted socket), UDP,
    the dual-stack/IPv6-only collision, every peer and local name — line for line as the same program natively in a
    namespace of its own; short-circuited and through canald."""
    base = e2e_util.free_port()
    argv = [python, PROGS / "v6only.py", base]
    native = _natively_in_a_namespace(procs, argv)
    assert "::1 -> listener 1 peer ::1 local ::1:0 v6only 1" in native and native.endswith("done\n"), native
    with serving_canald(canal_bin, procs, args=["--no-shortcut"] if mode == "no-shortcut" else []) as d:
        r = procs.run(isolated(d, argv), timeout=60)
        assert r.returncode == 0, r.describe()
        assert r.stdout == native, f"natively:\n{native}\nunder canal ({mode}):\n{r.stdout}"


def test_static_and_go_ipv6_only_listeners(canald, procs, netstatic, netgo):
    """The same for programs served through seccomp: a static C program's IPv4 and
    IPV6_V6ONLY listeners on one port (getsockopt answered, the kernel's rules), and a
    Go "tcp6" listener on ::1 (Go probes IPV6_V6ONLY at start: refused, it believed the
    namespace had no IPv6 and dialled ::1 as 127.0.0.1)."""
    port = e2e_util.free_port()
    native = _natively_in_a_namespace(procs, [netstatic, "v6only", port])
    assert "::1: listener v6 peer [::1]" in native, native
    r = procs.run(isolated(canald, [netstatic, "v6only", port]), timeout=60)
    assert r.returncode == 0 and r.stdout == native, f"natively:\n{native}\nunder canal:\n{r.describe()}"
    script = f"{netgo} serve6 {port} 1 & sleep 1; {netgo} dial [::1]:{port}; {netgo} dial 127.0.0.1:{port}; wait"
    native = _natively_in_a_namespace(procs, ["sh", "-c", script])
    r = procs.run(isolated(canald, ["sh", "-c", script]), timeout=60)
    strip = lambda out: re.sub(r"\]:\d+ local \[::1\]:\d+", "]:P local [::1]:P", out)
    assert f"listening [::1]:{port}" in native and "connection refused" in native, native
    assert strip(r.stdout) == strip(native), f"natively:\n{native}\nunder canal:\n{r.describe()}"
