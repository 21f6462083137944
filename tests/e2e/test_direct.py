"""`canald --direct on` (protocol §2 DIRECTORY, docs/architecture.md): a guest's socket
to a native peer is a kernel socket of the guest's own, so its data never passes
through canald, while a connection to a canal port is still short-circuited. Checked
the way an operator would: `ss` names the process holding each connection's kernel
socket (the guest itself; canald with `--direct off`), and `canal stat` lists the
short-circuited one. The socket calls of progs/calls.py (sockets used before their
first address, shut down before connecting, TCP Fast Open, UDP) answer as natively."""

import os
import signal
import socket
import subprocess
import time

import pytest

from canal_harness import clean_env, guest_pids, serving_canald
from e2e_util import wait_for


def _holders(port):
    """pids `ss` lists for the established TCP socket with local port `port`."""
    out = subprocess.run(["ss", "-tnpH", "state", "established", f"( sport = :{port} )"],
                         capture_output=True, text=True, check=True).stdout
    return {int(p.split("=")[1]) for p in out.replace(",", " ").split() if p.startswith("pid=")}


@pytest.mark.parametrize("direct,warm", [("on", 0), ("off", 0), ("on", 40)])
def test_native_peers_go_direct_and_canal_ports_short_circuit(canal_bin, procs, python, progs, direct,
                                                              warm):
    """With `warm`, the client first makes 40 short connections to the canal server, so
    its next streams start as canal's (libcanal `direct::guess_canal`; CANAL_LOG=debug
    says so): its first native connect is a wrong guess, mended by a hand-over, and the
    socket must end up the guest's own kernel socket all the same."""
    native = procs.spawn([python, progs / "echo.py", "serve", "tcp"], name="native-echo")
    nport = int(native.wait_line("READY", 30).split()[1])
    udp = procs.spawn([python, progs / "echo.py", "serve", "udp"], name="native-udp-echo")
    uport = int(udp.wait_line("READY", 30).split()[1])
    with serving_canald(canal_bin, procs, args=["--direct", direct]) as d:
        server = d.spawn([python, progs / "echo.py", "serve", "tcp"], name="canal-echo")
        cport = int(server.wait_line("READY", 30).split()[1])
        d.wait_served(server, kind="tcp-listener")
        client = d.spawn([python, progs / "direct_peer.py", nport, cport, uport, warm], name="client",
                         stdin=subprocess.PIPE, env=clean_env({"CANAL_LOG": "debug"} if warm else {}))
        mine, theirs, bound = (int(x) for x in client.wait_line("PORTS", 30).split()[1:])
        d.wait_served(client, kind="tcp-shortcut", peer_port=cport)
        # A socket bound first is canal's from its bind; connected to a native peer it
        # is handed to the guest (`direct::at_native_connect`), the TCP one and the UDP one.
        for port in (mine, bound):
            held = wait_for(lambda: _holders(port) or None, 10, what=f"ss to list local port {port}")
            if direct == "on":
                assert held <= guest_pids(client), f"native peer's socket held by {held}, not the guest"
            else:
                assert held == {d.pid}, f"with --direct off canald ({d.pid}) holds it, not {held}"
        # The UDP one: canal's no more (its entry freed with the hand-over), or relayed.
        udp_state = [s["state"] for s in d.guest(client)["sockets"] if s["kind"] == "udp"]
        assert udp_state == ([] if direct == "on" else ["connected"]), udp_state
        if direct == "on":
            assert not _holders(theirs), "the canal connection must not be a kernel TCP connection"
        client.popen.stdin.close()
        r = client.finish(30)
        assert r.returncode == 0 and r.stdout.endswith("done\n"), r.describe()
        guessed = "a stream starts canal's" in r.stderr
        assert guessed == bool(warm), r.describe()


def test_calls_answer_as_the_kernel_with_direct(canal_bin, procs, python, progs):
    argv = [python, progs / "calls.py"]
    native = procs.run(argv, timeout=60, name="calls-native")
    assert native.returncode == 0 and native.stdout.endswith("done\n"), native.describe()
    with serving_canald(canal_bin, procs, args=["--direct", "on"]) as d:
        r = d.run(argv, timeout=60, name="calls-canal")
        assert r.returncode == 0, r.describe()
        assert r.stdout == native.stdout, f"natively:\n{native.stdout}\nunder canal --direct on:\n{r.stdout}"


def test_sockets_used_before_their_first_address_answer_as_natively(canal_bin, procs, python, progs):
    """progs/direct_cases.py: fork, dup, an epoll set, options, flags and a timeout
    before the first connect, to a native peer and to a canal port, and UDP both ways;
    the same lines natively and under canal (direct path, the default)."""
    def servers(run, tag):
        ports = []
        for proto in ("tcp", "udp"):
            p = run.spawn([python, progs / "echo.py", "serve", proto], name=f"{tag}-{proto}")
            ports.append(int(p.wait_line("READY", 30).split()[1]))
        return ports

    native = servers(procs, "native")
    alike = servers(procs, "native2")
    want = procs.run([python, progs / "direct_cases.py", *native, *alike], timeout=60, name="cases-native")
    assert want.returncode == 0 and want.stdout.endswith("done\n"), want.describe()
    with serving_canald(canal_bin, procs) as d:
        canal = servers(d, "canal")
        d.wait_served(d.procs.all[-1], kind="udp")
        r = d.run([python, progs / "direct_cases.py", *native, *canal], timeout=60, name="cases-canal")
        assert r.returncode == 0, r.describe()
        assert r.stdout == want.stdout, f"natively:\n{want.stdout}\nunder canal:\n{r.stdout}"


@pytest.mark.parametrize("direct", ["on", "off"])
def test_native_clients_of_a_canal_server_are_its_own_kernel_sockets(canal_bin, procs, python, progs, direct):
    """A canal guest's listener (feature NATIVE_ACCEPT): canald listens but accepts
    nothing; the guest accepts its native clients on its own copy of the host listener,
    so `ss` lists the accepted connection under the guest (under canald with
    `--direct off`, which relays it), while a canal client of the same listener is
    still short-circuited."""
    with serving_canald(canal_bin, procs, args=["--direct", direct]) as d:
        server = d.spawn([python, progs / "echo.py", "serve", "tcp"], name="canal-echo")
        port = int(server.wait_line("READY", 30).split()[1])
        listener = d.wait_served(server, kind="tcp-listener")[0]
        assert listener.get("native_accept", False) == (direct == "on"), listener
        native = procs.spawn([python, progs / "echo.py", "idle", "--port", port], name="native-client")
        native.wait_line("CONNECTED", 30)
        held = wait_for(lambda: _holders(port) or None, 10, what=f"ss to list local port {port}")
        if direct == "on":
            assert held <= guest_pids(server), f"the accepted native client is held by {held}, not the guest"
        else:
            assert held == {d.pid}, f"with --direct off canald ({d.pid}) holds it, not {held}"
        r = d.run([python, progs / "echo.py", "tcp-msgs", "--port", port, "--count", "200"],
                  timeout=60, name="canal-client")
        assert r.returncode == 0, r.describe()


def test_native_clients_are_accepted_as_natively(canal_bin, procs, python, progs, tmp_path):
    """progs/native_accept.py: native clients taken by blocking accept, a timeout,
    poll/select/epoll (level and edge), a non-blocking drain, two threads, a dup, a
    forked child, an exec'd program, close, SO_LINGER inherited or not and a backlog
    nobody accepts, the clients native (a pool the test starts outside canal); the same lines
    natively and under canal, where the guest accepts them itself (NATIVE_ACCEPT).
    canald's relay (`--direct off`) is not held to this program: a listener polled
    right after a native client's connect returned is readable only once canald has
    accepted that client (natively at once)."""
    argv = [python, progs / "native_accept.py"]
    want = procs.run(argv, timeout=90, name="native-accept-native")
    assert want.returncode == 0 and want.stdout.endswith("done\n"), want.describe()
    # The clients, outside canal (a child of the program would be under canal too).
    pool = tmp_path / "pool.sock"
    procs.spawn([python, progs / "native_accept.py", "helper", pool], name="native-pool").wait_line("READY", 30)
    with serving_canald(canal_bin, procs) as d:
        r = d.run(argv, timeout=90, name="native-accept-canal",
                  env=clean_env({"NATIVE_ACCEPT_POOL": str(pool)}))
        assert r.returncode == 0, r.describe()
        assert r.stdout == want.stdout, f"natively:\n{want.stdout}\nunder canal:\n{r.stdout}"


def _voluntary_switches(pid):
    """Voluntary context switches of all of process `pid`'s threads so far."""
    n = 0
    for t in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{t}/status") as f:
            n += sum(int(l.split()[1]) for l in f if l.startswith("voluntary_ctxt_switches"))
    return n


def _native_client(port):
    """One native client: connect, 1 byte echoed, close; seconds it took."""
    t = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as c:
        c.sendall(b"x")
        assert c.recv(1) == b"x"
    return time.monotonic() - t


@pytest.mark.parametrize(
    "mode", ["accept", "poll", "select", "exec-poll", "epoll", "epoll-et", "epoll-oneshot"]
)
def test_native_clients_need_nothing_of_canald(canal_bin, procs, python, progs, mode):
    """Feature NATIVE_QUIET (protocol §2 Native accepts): a server whose threads wait
    for native clients in accept(), poll() or select() sleeps on its own copy of the
    host listener (a program exec'd with the listener asks for its own as it starts),
    so the kernel wakes it and canald does nothing per client. An epoll set holds the
    copy in its real epoll instance, whose events are the listener's edges (level,
    edge-triggered and one-shot sets; progs/native_accept.py checks the edges). Checked
    twice: canald's voluntary context switches over 200 clients (before the feature
    one per client, from watching the host listener), and 20 clients served, each at
    once, while canald is stopped (SIGSTOP) — a poll or select sleep waiting for
    canald's wake-up would wait a second (its re-check) per client."""
    with serving_canald(canal_bin, procs) as d:
        server = d.spawn([python, progs / "native_quiet.py", mode], name=f"quiet-{mode}")
        port = int(server.wait_line("READY", 30).split()[1])
        _native_client(port)  # the first arrival after LISTEN is canald's to see
        time.sleep(0.2)
        before = _voluntary_switches(d.pid)
        for _ in range(200):
            _native_client(port)
        woke = _voluntary_switches(d.pid) - before
        print(f"canald woke {woke} times for 200 clients ({mode})")
        assert woke < 40, f"canald woke {woke} times for 200 native clients of a {mode} server"
        os.kill(d.pid, signal.SIGSTOP)
        try:
            took = [_native_client(port) for _ in range(20)]
        finally:
            os.kill(d.pid, signal.SIGCONT)
        assert max(took) < 0.5, f"with canald stopped, clients took {sorted(took)[-3:]} s"
