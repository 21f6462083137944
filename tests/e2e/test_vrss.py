"""Virtual RSS (`canald --workers 2`): one guest's connections spread over both workers
by their flow hash (docs/architecture.md "Threads", protocol.md §6.3). A native echo
server; a Python client under canal opens 16 connections; `canal stat --json` must show
its sockets owned by both workers; then data (SHA-256 checked), sockopts, names,
shutdown and close on every connection — those on the non-home worker go through
forwarded requests — must behave as natively. A second test ends the client with every
connection open: canald must close the host sockets on both workers. Then datagram
sockets spread too, and two guests homed on different workers are short-circuited
(protocol §8.5) with TCP's semantics intact."""

import signal
import subprocess

import pytest

from canal_harness import serving_canald
import e2e_util
import test_shortcut

CONNS = 16


@pytest.fixture
def canald2(canal_bin, libcanal_so, canald_bin, procs):
    # vRSS spreads the host sockets canald relays: the guest's native peers too.
    with serving_canald(canal_bin, procs, ["--workers", "2", "--direct", "off"]) as d:
        yield d


def _setup(canald2, procs, python, progs):
    server = procs.spawn([python, progs / "vrss.py", "serve"], name="vrss-server")
    port = int(server.wait_line("READY", 30).split()[1])
    client = canald2.spawn([python, progs / "vrss.py", "client", "--port", port, "--conns", CONNS],
                           name="vrss-client", stdin=subprocess.PIPE)
    client.wait_line("CONNECTED", 30)
    socks = canald2.wait_served(client, kind="tcp", peer_port=port, count=CONNS, state="connected")
    st = canald2.stat()
    assert st["daemon"]["config"]["workers"] == 2, st["daemon"]
    owners = {s["worker"] for s in socks}
    assert owners == {0, 1}, f"sockets of one guest not spread over both workers: {socks}"
    per_worker = {w["id"]: w["sockets"] for w in st["daemon"]["workers"]}
    assert per_worker[0] > 0 and per_worker[1] > 0, st["daemon"]["workers"]
    return server, client


def test_vrss_spreads_one_guest(canald2, procs, python, progs):
    server, client = _setup(canald2, procs, python, progs)
    client.send_line("go")
    r = client.finish(120)
    assert r.returncode == 0, r.describe()
    assert any(l.startswith("OK ") for l in r.stdout.splitlines()), r.describe()
    # Every connection was closed by the client, the server saw each end.
    server.wait_line(f"EOF {CONNS}", 30)
    assert server.poll() is None, server.describe()


def test_vrss_guest_exit_closes_both_workers(canald2, procs, python, progs):
    server, client = _setup(canald2, procs, python, progs)
    client.send_line("exit")
    r = client.finish(30)
    assert r.returncode == 0, r.describe()
    # canald closed the host sockets of both workers: the server sees every EOF.
    server.wait_line(f"EOF {CONNS}", 30)

    def gone():
        st = canald2.stat()
        ws = st["daemon"]["workers"]
        return st if not st["guests"] and all(w["sockets"] == 0 for w in ws) else None

    e2e_util.wait_for(gone, 20, interval=0.05, what="canald to drop the guest on both workers")


# ---- datagram sockets and listeners -------------------------------------------------

UDP_SOCKS = 16


def test_vrss_spreads_datagram_sockets_and_listeners(canald2, procs, python, progs):
    """Bound datagram sockets and listeners spread by their local address, connected
    datagram sockets by the flow hash: one program's UDP sockets and listeners are
    served by both workers (canal stat); every datagram is echoed intact (SHA-256) and
    every listener accepts (a listener away from home gets its entries from the home)."""
    server = procs.spawn([python, progs / "vrss_udp.py", "serve"], name="udp-echo")
    port = int(server.wait_line("READY", 30).split()[1])
    client = canald2.spawn([python, progs / "vrss_udp.py", "client", "--port", port, "--socks", UDP_SOCKS],
                           name="udp-client", stdin=subprocess.PIPE)
    client.wait_line("READY", 30)
    udp = canald2.wait_served(client, kind="udp", count=2 * UDP_SOCKS)
    assert {s["worker"] for s in udp} == {0, 1}, f"datagram sockets not spread over both workers: {udp}"
    listeners = canald2.wait_served(client, kind="tcp-listener", count=UDP_SOCKS)
    assert {s["worker"] for s in listeners} == {0, 1}, f"listeners not spread over both workers: {listeners}"
    client.send_line("go")
    r = client.finish(120)
    assert r.returncode == 0, r.describe()
    assert f"OK {2 * UDP_SOCKS * 20}" in r.stdout, r.describe()


# ---- the short-circuit across workers ---------------------------------------------


def _homes(canald, *procs_):
    """The home worker of each guest program, from canal stat."""
    st = canald.stat()
    return [canald.guest(p, st)["worker"] for p in procs_]


def test_shortcut_bulk_across_workers(canald2, python, progs):
    """Two guests homed on different workers are short-circuited (both ends listed as
    tcp-shortcut, no kernel TCP connection): 4 concurrent 8 MiB echoes, SHA-256
    checked."""
    server, client = test_shortcut.start_bulk_echo(canald2, python, progs)
    s, c = _homes(canald2, server, client)
    assert s != c, f"both guests on worker {s}"
    test_shortcut.go_bulk_echo(client)


def _hold(canald, python, progs, port, code=None):
    argv = [python, "-c", code] if code else [python, progs / "shortcut.py", "hold", "--port", port]
    hold = canald.spawn(argv, name="hold")
    hold.wait_line("CONNECTED", 30)
    return hold


def test_shortcut_semantics_across_workers(canald2, python, progs):
    """Names, half-close, reset, FIN and a non-blocking connect (progs/shortcut.py
    check) between guests on different workers, after proving such a pair is
    short-circuited."""
    server, port = test_shortcut._start_server(canald2, python, progs)
    hold = _hold(canald2, python, progs, port)
    server.wait_line("HOLDING", 30)
    test_shortcut._assert_shortcut(canald2, hold, server, port)
    s, h = _homes(canald2, server, hold)
    assert s != h, f"both guests on worker {s}"
    # The holder exits abruptly; once it is gone the next guest goes to the worker
    # with fewer guests: not the server's.
    hold.signal_group(signal.SIGKILL)
    hold.finish(10)

    def settled():
        st = canald2.stat()
        counts = {w["id"]: w["guests"] for w in st["daemon"]["workers"]}
        return counts if counts[s] == 1 and counts[1 - s] == 0 else None

    e2e_util.wait_for(settled, 20, interval=0.05, what="canald to drop the killed guest")
    r = canald2.run([python, progs / "shortcut.py", "check", "--port", port], timeout=60)
    assert r.returncode == 0 and "OK all" in r.stdout, r.describe()


@pytest.mark.parametrize("unread", [False, True], ids=["eof", "reset"])
def test_shortcut_peer_death_across_workers(canald2, python, progs, unread):
    """A guest killed with a short-circuited connection open to a guest on the other
    worker: the peer sees EOF, or ECONNRESET if the dead guest left bytes unread."""
    server, port = test_shortcut._start_server(canald2, python, progs)
    code = test_shortcut.unread_holder_code(port) if unread else None
    hold = _hold(canald2, python, progs, port, code)
    server.wait_line("HOLDING", 30)
    test_shortcut._assert_shortcut(canald2, hold, server, port)
    s, h = _homes(canald2, server, hold)
    assert s != h, f"both guests on worker {s}"
    server.signal_group(signal.SIGKILL)
    line = hold.wait_line("PEER-GONE", 10)
    assert line == ("PEER-GONE reset" if unread else "PEER-GONE eof"), hold.describe()
    assert hold.finish(10).returncode == 0, hold.describe()
