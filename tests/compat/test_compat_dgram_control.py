"""UDP control messages (ancillary data, protocol §5 minor 12): programs that learn a
datagram's destination, TTL or arrival time from recvmsg, and choose a reply's source
or TTL with sendmsg, see exactly what the kernel would show them; so do programs that
assemble a datagram from parts (MSG_MORE, UDP_CORK) or look at the error queue.

- tests/e2e/progs/dgram_control.py prints every case (receive options, send-side
  messages, MSG_CTRUNC, the kernel's errnos, parts and corking, MSG_ERRQUEUE, sends
  and the calls after them); natively and under canal the lines must
  be equal, but for the one documented difference that proves the sockets were canal's:
  an SO_MARK message, which root may send natively and a guest never may (EPERM).
- dnsmasq in its default mode (a wildcard socket that reads IP_PKTINFO to tell which
  address a query came to, and answers from it) serves queries to 127.0.0.1 and
  127.0.0.2 in the four modes. Before canal carried control messages it dropped every
  query it got under canal."""

import os
import struct
import sys
from pathlib import Path

import pytest

import compat_util
import e2e_util
from canal_harness import need_tool, runner
from compat_util import MODES

PROBE = Path(__file__).resolve().parent.parent / "e2e" / "progs" / "dgram_control.py"

# The one line allowed to differ, and how (docs/compat.md "ancillary data").
CANAL_ONLY = {'["SO_MARK", ["sent", 1]]': '["SO_MARK", ["errno", 1]]'}


@pytest.mark.deadline(60)
def test_control_messages_match_native(request):
    native = runner(request, "native").run([sys.executable, PROBE], timeout=30, name="native")
    canal = runner(request, "canal").run([sys.executable, PROBE], timeout=30, name="canal")
    for r in (native, canal):
        assert r.returncode == 0 and r.stdout.rstrip().endswith('["done"]'), r.describe()
    want = [CANAL_ONLY.get(l, l) for l in native.stdout.splitlines()]
    got = canal.stdout.splitlines()
    assert len(want) > 15, native.stdout
    assert got == want, "\n".join(
        f"native {w}\ncanal  {g}" for w, g in zip(want, got) if w != g)


def dns_query(name, qid):
    """A DNS query for `name`, type A."""
    q = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"
    return struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0) + q + struct.pack(">HH", 1, 1)


CLIENT = r"""
import socket, struct, sys
port = int(sys.argv[1])
for n, server in enumerate(["127.0.0.1", "127.0.0.2", "127.0.0.1"]):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(5)
    q = bytes.fromhex(sys.argv[2]); q = struct.pack(">H", 100 + n) + q[2:]
    s.sendto(q, (server, port))
    try:
        r, src = s.recvfrom(512)
    except socket.timeout:
        print(server, "timeout", flush=True); continue
    qid, flags, qd, an = struct.unpack(">HHHH", r[:8])
    print(server, "from", src[0], "id", qid, "answers", an, "address", socket.inet_ntoa(r[-4:]), flush=True)
"""


def start_dnsmasq(request, mode, tmp_path, server_run):
    """dnsmasq on both loopback addresses (its wildcard sockets), answering canal.test
    with 10.9.8.7; its UDP port, once canal serves it in the modes that say so."""
    dnsmasq = need_tool("dnsmasq")
    # dnsmasq binds TCP and UDP on the wildcard address.
    port = e2e_util.port_free_for_tcp_and_udp("0.0.0.0")
    conf = tmp_path / "dnsmasq.conf"
    conf.write_text(f"port={port}\nlisten-address=127.0.0.1,127.0.0.2\nno-resolv\nno-hosts\n"
                    "address=/canal.test/10.9.8.7\nlog-queries\n")
    user = ["--user=root"] if os.geteuid() == 0 else []
    server = server_run.spawn([dnsmasq, "--keep-in-foreground", "--log-facility=-", "-C", str(conf), *user],
                              name="dnsmasq")
    e2e_util.wait_for(lambda: server.poll() is not None or compat_util.udp_bound(port), 30,
                      what=f"dnsmasq to bind UDP port {port}")
    assert server.poll() is None, server.describe()
    compat_util.assert_served_by_canal(request, mode, port, proto="udp", what="dnsmasq")
    return server, port


@pytest.mark.deadline(90)
@pytest.mark.parametrize("mode", MODES)
def test_dnsmasq_answers_from_the_address_asked(request, mode, tmp_path):
    server_run, client_run = compat_util.ends(request, mode)
    server, port = start_dnsmasq(request, mode, tmp_path, server_run)
    r = client_run.run([sys.executable, "-c", CLIENT, str(port), dns_query("canal.test", 0).hex()],
                       timeout=40, name="client")
    assert r.returncode == 0, r.describe()
    lines = r.stdout.splitlines()
    assert lines == [f"{a} from {a} id {100 + n} answers 1 address 10.9.8.7"
                     for n, a in enumerate(["127.0.0.1", "127.0.0.2", "127.0.0.1"])], \
        f"{r.describe()}\n{server.describe()}"
    assert server.poll() is None, server.describe()


@pytest.mark.deadline(90)
@pytest.mark.parametrize("mode", MODES)
def test_dig_over_udp_and_tcp(request, mode, tmp_path):
    """bind9's dig runs on libuv 1.44, which sends its UDP queries with
    `syscall(__NR_sendmmsg)`: under canal every query timed out until the library
    hooked libc's `syscall()` (tests/e2e/test_bynumber.py)."""
    dig = need_tool("dig")
    server_run, client_run = compat_util.ends(request, mode)
    server, port = start_dnsmasq(request, mode, tmp_path, server_run)
    with compat_util.CanalSampler(request, mode, interval=0.01) as sampler:
        # dnsmasq's TCP side answers only on the address its wildcard socket names.
        for transport, addr in (("+notcp", "127.0.0.1"), ("+notcp", "127.0.0.2"), ("+tcp", "127.0.0.1")):
            r = client_run.run([dig, "+short", "+tries=1", "+time=5", transport, "-p", str(port),
                                f"@{addr}", "canal.test"], timeout=30, name=f"dig-{transport[1:]}-{addr}")
            assert r.returncode == 0 and r.stdout.split() == ["10.9.8.7"], \
                f"{r.describe()}\n{server.describe()}"
    sampler.require_peer_port(port, "dig", program=dig)
    assert server.poll() is None, server.describe()
