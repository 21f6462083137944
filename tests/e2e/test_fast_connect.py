"""Fast connects (protocol §8.10): after a guest's first connect to a canal listener,
its next connects there are made with tickets canald prepared — no CONNECT, no wait
for canald — and behave as the kernel's: names, data, the close right after a send,
a listener closed or not accepting, non-blocking connects, forked children.

Each program runs natively too (progs/fast_connect.py, progs/scale.py), which
validates the checks; `canal stat` shows the connects were fast."""

import subprocess
import time

import pytest

import e2e_util
from canal_harness import clean_env, serving_canald

FAST = "fast_connect.py"


@pytest.fixture(autouse=True)
def _needs_fast_connects(request):
    """Fast connects need the short-circuit and one worker (protocol §8.10)."""
    if "canald" in request.fixturenames:
        st = request.getfixturevalue("canald").stat()
        cfg = st["daemon"].get("config", {})
        if not cfg.get("shortcut", True):
            pytest.skip("canald runs without the short-circuit (--no-shortcut)")
        if len(st["daemon"].get("workers", [])) > 1:
            pytest.skip("fast connects need one canald worker (protocol §8.10)")


class _Native:
    """Runs programs as `canald.spawn` does, without canal."""

    def __init__(self, procs):
        self.procs = procs

    def spawn(self, argv, name=None, **kw):
        return self.procs.spawn(argv, name=name, **kw)


def _runner(kind, canald, procs):
    return canald if kind == "canal" else _Native(procs)


def _say(proc, text):
    """A line to the program's stdin, which stays open."""
    proc.popen.stdin.write((text + "\n").encode())
    proc.popen.stdin.flush()


def _got(srv, n, timeout):
    """The server's first `n` GOT lines, once it printed them."""
    deadline = time.monotonic() + timeout
    while True:
        got = [x for x in srv.stdout().splitlines() if x.startswith("GOT ")]
        if len(got) >= n or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


def _server(runner, python, progs):
    srv = runner.spawn([python, progs / FAST, "server"], name="fast-server",
                       stdin=subprocess.PIPE)
    return srv, int(srv.wait_line("PORT", 30).split()[1])


@pytest.mark.parametrize("kind", ["native", "canal", "canal-off"])
def test_connects_one_after_another(canald, procs, python, progs, kind):
    """300 connections in a row, payloads up to 256 KiB: names agree on both ends and
    the echo's hash matches. Under canal all but the first few are fast; with
    CANAL_FAST_CONNECT=off none is."""
    runner = _runner("native" if kind == "native" else "canal", canald, procs)
    srv, port = _server(runner, python, progs)
    env = clean_env({"CANAL_FAST_CONNECT": "off"}) if kind == "canal-off" else None
    n = 300
    cl = runner.spawn([python, progs / FAST, "client", port, n], name="fast-client",
                      stdin=subprocess.PIPE, env=env)
    assert cl.wait_line("OK", 120) == f"OK {n}", cl.describe()
    g = canald.guest(cl) if kind != "native" else None
    if kind == "canal":
        assert g["fast_connects"] >= 0.8 * n, f"fewer than 80% of {n} connects were fast: {g}"
    elif kind == "canal-off":
        assert "fast_connects" not in g, g
    cl.send_line()
    assert cl.finish(20).returncode == 0, cl.describe()
    srv.popen.stdin.close()
    srv.finish(20)


@pytest.mark.parametrize("kind", ["native", "canal"])
@pytest.mark.parametrize("size", [1000, 3 << 20])
def test_bytes_sent_right_before_exit_arrive(canald, procs, python, progs, kind, size):
    """A client that connects, sends and exits at once (no close): the server gets
    every byte, then EOF — also when canald pairs the connection only after the
    client is gone, and when the bytes are more than the ring holds."""
    runner = _runner(kind, canald, procs)
    srv, port = _server(runner, python, progs)
    cl = runner.spawn([python, progs / FAST, "exit", port, size], name="fast-exit")
    sha = cl.wait_line("SENT", 60).split()[1]
    cl.finish(20)
    lines = _got(srv, 2, 30)
    assert f"GOT {sha} {size}" in lines, f"{lines}\n{srv.describe()}"
    srv.popen.stdin.close()
    srv.finish(20)


@pytest.mark.parametrize("kind", ["native", "canal"])
def test_connect_after_the_listener_closed_is_refused(canald, procs, python, progs, kind):
    """The client holds tickets for the listener; once the server's close() returned,
    a connect is refused (ECONNREFUSED), never completed with a ticket."""
    runner = _runner(kind, canald, procs)
    for _ in range(3):
        srv, port = _server(runner, python, progs)
        cl = runner.spawn([python, progs / FAST, "refused", port], name="fast-refused",
                          stdin=subprocess.PIPE)
        assert cl.wait_line("WARM", 30) == "WARM", cl.describe()
        _say(srv, "close")
        assert srv.wait_line("CLOSED", 20) == "CLOSED", srv.describe()
        cl.send_line()
        assert cl.wait_line("RESULT", 20) == "RESULT REFUSED", cl.describe()
        assert cl.finish(20).returncode == 0, cl.describe()
        srv.popen.stdin.close()
        srv.finish(20)


def test_non_blocking_connect_reports_as_natively(canald, procs, python, progs):
    """EINPROGRESS, then POLLOUT, SO_ERROR 0, a second connect 0 and a third EISCONN,
    as the kernel's loopback connect reports them."""
    got = {}
    for kind in ("native", "canal"):
        runner = _runner(kind, canald, procs)
        srv, port = _server(runner, python, progs)
        cl = runner.spawn([python, progs / FAST, "nonblock", port], name="fast-nb")
        got[kind] = cl.wait_line("NB", 30)
        assert cl.finish(20).returncode == 0, cl.describe()
        srv.popen.stdin.close()
        srv.finish(20)
    assert got["native"] == "NB EINPROGRESS POLLOUT 0 0 EISCONN echo", got
    assert got["canal"] == got["native"], got


def test_forked_children_connect_with_the_parents_tickets(canald, python, progs):
    """Children forked after the parent's first connect share its guest, and so its
    tickets: 4 children × 100 connections, every one checked."""
    srv, port = _server(canald, python, progs)
    cl = canald.spawn([python, progs / FAST, "fork", port, 4, 100], name="fast-fork")
    assert cl.wait_line("FORK", 120) == "FORKED", cl.describe()
    assert cl.finish(20).returncode == 0, cl.describe()
    srv.popen.stdin.close()
    srv.finish(20)


def _connected_clients(runner, procs, python, progs, backlog):
    """Clients of a listener that never accepts whose non-blocking connect completed
    (progs/scale.py backlog and probe, both under `runner`)."""
    port = e2e_util.free_port()
    srv = runner.spawn([python, progs / "scale.py", "backlog", port, backlog],
                       name="fast-backlog", stdin=subprocess.PIPE)
    srv.wait_line("LISTEN", 20)
    probe = runner.spawn([python, progs / "scale.py", "probe", port, backlog + 20],
                         name="fast-probe")
    line = probe.wait_line("ESTABLISHED", 60)
    assert probe.finish(30).returncode == 0, probe.describe()
    srv.send_line()
    assert srv.finish(20).returncode == 0, srv.describe()
    return int(line.split()[1])


@pytest.mark.parametrize("backlog", [1, 4, 64])
def test_listener_that_does_not_accept_holds_its_backlog(canald, procs, python, progs, backlog):
    """Canal clients of a canal listener that never accepts: exactly backlog + 1
    connect, as natively; tickets count against the queue, so the rest wait."""
    native = _connected_clients(_Native(procs), procs, python, progs, backlog)
    assert native == backlog + 1, f"natively {native} (the test is wrong)"
    canal = _connected_clients(canald, procs, python, progs, backlog)
    assert canal == native, f"under canal {canal} connected, natively {native}"


def _isolated(canald, argv, publish=(), name=None):
    """`canal run --isolate` (docs/isolation.md) around `argv`."""
    args = [canald.canal_bin, "run", "--socket", canald.socket, "--isolate"]
    for p in publish:
        args += ["--publish", p]
    return args + (["--name", name] if name else []) + ["--"] + [str(a) for a in argv]


@pytest.mark.parametrize("kind", ["canal", "canal-off"])
def test_isolated_guests_connect_fast_with_their_views_names(canald, procs, python, progs, kind):
    """Two isolated guests (each its own network view): the client connects to the
    server's published port through 10.0.2.2. Fast, its names are the view's as a
    CONNECT gives them (CANAL_FAST_CONNECT=off runs the same checks): getsockname
    10.0.2.15, getpeername 10.0.2.2:H, and the server's accept() 10.0.2.2 with the
    client's port. A client that sends 3 MiB and exits loses nothing."""
    g, h = e2e_util.free_port(), e2e_util.free_port()
    srv = procs.spawn(_isolated(canald, [python, progs / FAST, "server"], [f"{h}:{g}"], "fast-iso-srv"),
                      name="fast-iso-srv", stdin=subprocess.PIPE,
                      env=clean_env({"FAST_LISTEN": "0.0.0.0", "FAST_LISTEN_PORT": str(g)}))
    assert srv.wait_line("PORT", 30) == f"PORT {g}", srv.describe()
    view = {"FAST_DST": "10.0.2.2", "FAST_LOCAL": "10.0.2.15", "FAST_SEEN": "10.0.2.2"}
    if kind == "canal-off":
        view["CANAL_FAST_CONNECT"] = "off"
    n = 200
    cl = procs.spawn(_isolated(canald, [python, progs / FAST, "client", h, n]), name="fast-iso-cli",
                     stdin=subprocess.PIPE, env=clean_env(view))
    assert cl.wait_line("OK", 120) == f"OK {n}", cl.describe()
    g_cl = canald.guest(cl)
    assert g_cl and g_cl.get("network"), f"the client is not an isolated guest: {g_cl}"
    if kind == "canal":
        assert g_cl.get("fast_connects", 0) >= 0.8 * n, f"fewer than 80% of {n} were fast: {g_cl}"
    else:
        assert "fast_connects" not in g_cl, g_cl
    cl.send_line()
    assert cl.finish(20).returncode == 0, cl.describe()
    ex = procs.spawn(_isolated(canald, [python, progs / FAST, "exit", h, 3 << 20]), name="fast-iso-exit",
                     env=clean_env(view))
    sha = ex.wait_line("SENT", 60).split()[1]
    assert ex.finish(20).returncode == 0, ex.describe()
    lines = _got(srv, n + 2, 30)
    assert f"GOT {sha} {3 << 20}" in lines, f"{lines[-3:]}\n{srv.describe()}"
    srv.popen.stdin.close()
    srv.finish(20)


def test_policy_guests_connect_fast_and_metered_ones_do_not(canal_bin, procs, python, progs, tmp_path):
    """A destination policy (--loopback-only, an allow list) is fixed per guest and a
    record is listed only after a CONNECT passed it, so such guests connect fast; a
    guest under a connection rate does not (each connect is a request the rate
    counts): 40 connects at 20/s still take a second."""
    conf = tmp_path / "canald.toml"
    conf.write_text('[quota.default]\nallow = ["127.0.0.0/8"]\n'
                    '[quota.guest.metered]\nconnect-rate = 20\n')
    conf.chmod(0o644)
    metered = tmp_path / "metered"
    metered.symlink_to(python)
    with serving_canald(canal_bin, procs, args=["--config", conf, "--loopback-only"]) as d:
        srv, port = _server(d, python, progs)
        n = 100
        cl = d.spawn([python, progs / FAST, "client", port, n], name="fast-policy", stdin=subprocess.PIPE)
        assert cl.wait_line("OK", 120) == f"OK {n}", cl.describe()
        g = d.guest(cl)
        assert g.get("fast_connects", 0) >= 0.8 * n, f"fewer than 80% of {n} were fast: {g}"
        cl.send_line()
        assert cl.finish(20).returncode == 0, cl.describe()
        t = time.monotonic()
        m = d.spawn([metered, progs / FAST, "client", port, 40], name="fast-metered", stdin=subprocess.PIPE)
        assert m.wait_line("OK", 120) == "OK 40", m.describe()
        took = time.monotonic() - t
        g = d.guest(m)
        assert "fast_connects" not in g, g
        assert took >= 0.9, f"40 connects at 20/s took {took:.2f} s: the rate did not hold"
        m.send_line()
        assert m.finish(20).returncode == 0, m.describe()
        srv.popen.stdin.close()
        srv.finish(20)
