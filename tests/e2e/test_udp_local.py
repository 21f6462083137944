"""Datagrams between canal guests (protocol §8.9): canald moves them ring to ring, not
through the kernel's UDP, with UDP's semantics intact.

progs/udp_local.py's checks (names, sizes, truncation, a connected socket's filter,
receive options, wildcard and IPv6 receivers) pass natively too
(test_udp_semantics_native), which validates them. The path is proven two ways: the
kernel's UDP counter of received datagrams (`/proc/net/snmp`, this network namespace)
barely moves while thousands cross between two guests, and `canal stat` counts them
as received ring to ring on the server's socket."""

import pytest


def _udp_in_datagrams():
    with open("/proc/net/snmp") as f:
        rows = [line.split() for line in f if line.startswith("Udp:")]
    return int(rows[1][rows[0].index("InDatagrams")])


def _shortcut_on(canald):
    return canald.stat()["daemon"].get("config", {}).get("shortcut", True)


def _server_socket(canald, server):
    g = canald.guest(server)
    assert g, f"server not listed: {canald.stat()}"
    return [s for s in g["sockets"] if s["kind"] == "udp"]


def test_udp_semantics_native(procs, python, progs):
    server = procs.spawn([python, progs / "udp_local.py", "serve"], name="native-udp-server")
    port = int(server.wait_line("READY", 30).split()[1])
    r = procs.run([python, progs / "udp_local.py", "check", "--port", port], timeout=60)
    assert r.returncode == 0 and "OK all" in r.stdout, r.describe()


def test_udp_between_guests(canald, python, progs):
    server = canald.spawn([python, progs / "udp_local.py", "serve"], name="udp-server")
    port = int(server.wait_line("READY", 30).split()[1])
    r = canald.run([python, progs / "udp_local.py", "check", "--port", port], timeout=60)
    assert r.returncode == 0 and "OK all" in r.stdout, r.describe()
    n = 3000
    before = _udp_in_datagrams()
    r = canald.run(
        [python, progs / "udp_local.py", "flood", "--port", port, "--n", n], timeout=120
    )
    assert r.returncode == 0 and f"FLOOD {n}" in r.stdout, r.describe()
    through_kernel = _udp_in_datagrams() - before
    socks = _server_socket(canald, server)
    if not _shortcut_on(canald):
        # --no-shortcut: every datagram goes through the kernel, and the same checks
        # pass that way.
        assert through_kernel >= 2 * n, through_kernel
        assert all("local_in" not in s for s in socks), socks
        return
    # Both directions of the flood (2n datagrams) went ring to ring; the kernel saw
    # at most the host's own background traffic.
    assert through_kernel < n // 10, f"{through_kernel} datagrams went through the kernel"
    assert socks and socks[0].get("local_in", 0) >= n, socks
    assert socks[0].get("local_drops") == 0, socks


def test_a_receiver_that_does_not_read_drops_datagrams_and_blocks_no_sender(
    canald, python, tmp_path
):
    """UDP's rule between guests too: a receiver that never reads loses what its
    buffers cannot hold (counted in `canal stat` as local_drops), and its sender is
    never held up by it — it goes on to reach another receiver at once."""
    if not _shortcut_on(canald):
        pytest.skip("canald runs without the short-circuit (--no-shortcut)")
    prog = tmp_path / "deaf.py"
    prog.write_text(
        """
import socket, sys, time
role = sys.argv[1]
if role == "deaf":
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("127.0.0.1", 0))
    print("READY", s.getsockname()[1], flush=True)
    time.sleep(600)
elif role == "echo":
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("127.0.0.1", 0))
    print("READY", s.getsockname()[1], flush=True)
    d, a = s.recvfrom(100); s.sendto(d, a)
else:
    deaf, echo = int(sys.argv[2]), int(sys.argv[3])
    c = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    t = time.monotonic()
    for i in range(20000):
        c.sendto(b"z" * 1000, ("127.0.0.1", deaf))
    c.sendto(b"ping", ("127.0.0.1", echo)); c.settimeout(10)
    print("ECHO", c.recvfrom(100)[0].decode(), "%.1f" % (time.monotonic() - t), flush=True)
"""
    )
    deaf = canald.spawn([python, prog, "deaf"], name="deaf")
    deaf_port = int(deaf.wait_line("READY", 30).split()[1])
    echo = canald.spawn([python, prog, "echo"], name="echo")
    echo_port = int(echo.wait_line("READY", 30).split()[1])
    r = canald.run([python, prog, "send", deaf_port, echo_port], timeout=60)
    assert r.returncode == 0 and "ECHO ping" in r.stdout, r.describe()
    socks = _server_socket(canald, deaf)
    assert socks, canald.stat()
    drops, took = socks[0].get("local_drops", 0), socks[0].get("local_in", 0)
    assert drops > 0 and took + drops == 20000, socks
