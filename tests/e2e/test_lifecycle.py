"""What canald does when guests die or sit idle."""

import os
import signal
import time

import pytest

import e2e_util
from canal_harness import guest_pids, serving_canald


def _connected_tcp(canald, proc, peer_port):
    """The guest entry of `proc` if stat lists its connected TCP socket to peer_port."""
    g = canald.guest(proc)
    if not g:
        return None
    for s in g.get("sockets", []):
        if s.get("kind") == "tcp" and s.get("state") == "connected" and s.get("peer") == f"127.0.0.1:{peer_port}":
            return g
    return None


@pytest.mark.relay
def test_guest_killed_mid_transfer(canald, python, progs):
    with e2e_util.SinkServer() as sink:
        p = canald.spawn([python, progs / "echo.py", "stream", "--port", sink.port])
        p.wait_line("STREAMING", 30)
        g = e2e_util.wait_for(lambda: _connected_tcp(canald, p, sink.port), 10,
                              what="stat to list the streaming guest's connection")
        pid = g["pid"]
        assert pid in guest_pids(p), f"stat lists pid {pid}, not canal run's program {guest_pids(p)}"
        before = sink.received
        e2e_util.wait_for(lambda: sink.received > before, 5, what="data to keep flowing to the sink")

        os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()

        def released():
            g = canald.guest(pid)
            return g is None or not g.get("sockets")

        try:
            e2e_util.wait_for(released, 5, interval=0.005, what="canald to drop the killed guest's sockets")
        finally:
            took = time.monotonic() - killed
        print(f"sockets of the killed guest gone from stat {took * 1000:.0f} ms after SIGKILL")
        assert took <= 1.0, f"the killed guest's sockets stayed listed for {took:.2f} s (limit 1 s)"

        # its host connection is closed too: the sink sees EOF or a reset
        e2e_util.wait_for(lambda: sink.ended, 2, what="the sink to see the killed guest's connection end")
        ended_after = sink.ended[0][0] - killed
        assert ended_after <= 1.0, f"the sink's connection ended {ended_after:.2f} s after SIGKILL (limit 1 s)"

    r = p.finish(10)
    # canal run execs the program (then the killed process is canal run itself), or waits
    # for it and passes its death on as 128+N
    assert r.returncode in (-signal.SIGKILL, 128 + signal.SIGKILL), (
        f"canal run must report the program's death by SIGKILL\n{r.describe()}"
    )


@pytest.mark.relay
def test_idle_cost(canald, python, progs):
    """One guest blocked in recv() on an idle TCP connection: canald + the guest (+ the
    `canal run` process waiting for it) use < 1% of a core over 10 s."""
    if e2e_util.poll_only():
        pytest.skip("poll-only notification never sleeps by design (a measurement mode): idle cost applies to hybrid and sleep")
    window = 10.0
    with e2e_util.HoldServer() as hold:
        p = canald.spawn([python, progs / "echo.py", "idle", "--port", hold.port])
        p.wait_line("CONNECTED", 30)
        g = e2e_util.wait_for(lambda: _connected_tcp(canald, p, hold.port), 10,
                              what="stat to list the idle guest's connection")
        pids = {"canald": canald.pid, "guest": g["pid"]}
        if p.pid != g["pid"]:
            pids["canal run"] = p.pid
        t0 = {k: e2e_util.cpu_seconds(v) for k, v in pids.items()}
        time.sleep(window)  # the measurement window, not a wait for readiness
        t1 = {k: e2e_util.cpu_seconds(v) for k, v in pids.items()}
        assert p.poll() is None, f"the idle guest exited during the window\n{p.describe()}"
        assert _connected_tcp(canald, p, hold.port), "the idle connection is gone after the window"
    used = {k: t1[k] - t0[k] for k in pids}
    total = sum(used.values())
    detail = ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in used.items())
    print(f"CPU over {window:.0f} s idle: {detail}; total {total * 1000:.0f} ms")
    assert total < 0.01 * window, f"idle CPU {total:.3f} s over {window:.0f} s exceeds 1% of a core ({detail})"
    r = p.finish(30)
    assert r.returncode == 0, f"the idle guest did not exit cleanly once its peer closed\n{r.describe()}"


@pytest.mark.parametrize("direct", ["on", "off"])
def test_a_shared_socket_closed_after_its_other_holder_died_is_gone_at_once(canal_bin, procs, python,
                                                                              progs, direct):
    """progs/forked_close.py: a listener or a bound UDP socket shared with a child that
    ended without closing it (`_exit`, SIGKILL: its reference stays counted), then
    closed by the parent. Natively the address is free when close returns: a connect
    is refused, a bind succeeds. Under canal the close asks canald to look at the
    socket's WATCH now (control CLOSE_CHECK) instead of leaving it to canald's next
    look; without that a connect right after was accepted and a bind found the port in
    use in about half the rounds. Both with the guest's native peers direct and through
    canald's relay."""
    argv = [python, progs / "forked_close.py", "40"]
    want = procs.run(argv, timeout=60, name="forked-close-native")
    assert want.returncode == 0 and want.stdout.endswith("done\n"), want.describe()
    with serving_canald(canal_bin, procs, args=["--direct", direct]) as d:
        got = d.run(argv, timeout=60, name="forked-close-canal")
        assert got.returncode == 0, got.describe()
        assert got.stdout == want.stdout, f"natively:\n{want.stdout}\nunder canal:\n{got.stdout}"
