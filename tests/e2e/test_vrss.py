"""Virtual RSS (`canald --workers 2`): one guest's connections spread over both workers
by their flow hash (docs/architecture.md "Threads", protocol.md §6.3). A native echo
server; a Python client under canal opens 16 connections; `canal stat --json` must show
its sockets owned by both workers; then data (SHA-256 checked), sockopts, names,
shutdown and close on every connection — those on the non-home worker go through
forwarded requests — must behave as natively. A second test ends the client with every
connection open: canald must close the host sockets on both workers."""

import subprocess

import pytest

from canal_harness import serving_canald
import e2e_util

CONNS = 16


@pytest.fixture
def canald2(canal_bin, libcanal_so, canald_bin, procs):
    with serving_canald(canal_bin, procs, ["--workers", "2"]) as d:
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
