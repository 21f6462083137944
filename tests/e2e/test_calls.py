"""Socket calls beyond the suite's programs whose answers must be the kernel's
(progs/calls.py): TCP Fast Open's sendto/sendmsg with MSG_FASTOPEN, which canal
refused with EPIPE; splice(2) between canal sockets and pipes, which read
end-of-file from a canal socket and lost what it wrote into one. The same lines
natively and under canal, short-circuited and through canald."""

import shutil
import socket
import subprocess
import time
import urllib.request

import pytest

from canal_harness import clean_env, serving_canald
from e2e_util import ACCEPT_ALL, free_port, host_queue_len


# Both ends through canald: its relay, and a client that reaches a canal port through
# canald too (with the direct path a client of an unregistered listener would be a
# native one, whose connect the listener sees only once canald accepted it).
NO_SHORTCUT = ["--no-shortcut", "--direct", "off"]

@pytest.mark.parametrize("mode", ["shortcut", "no-shortcut"])
def test_calls_answer_as_the_kernel(canal_bin, procs, python, progs, mode):
    argv = [python, progs / "calls.py"]
    native = procs.run(argv, timeout=60, name="calls-native")
    assert native.returncode == 0 and native.stdout.endswith("done\n"), native.describe()
    assert "fastopen sendto -> 15" in native.stdout, native.describe()
    with serving_canald(canal_bin, procs, args=NO_SHORTCUT if mode == "no-shortcut" else []) as d:
        r = d.run(argv, timeout=60, name="calls-canal")
        assert r.returncode == 0, r.describe()
        assert r.stdout == native.stdout, f"natively:\n{native.stdout}\nunder canal ({mode}):\n{r.stdout}"


@pytest.mark.parametrize("mode", ["shortcut", "no-shortcut"])
def test_accepted_sockets_inherit_the_listeners_linger(canal_bin, procs, python, progs, mode):
    """progs/linger_inherit.py: a connection accepted on a listener with SO_LINGER
    reports the listener's value and, with {1, 0}, its close resets the client, as a
    kernel socket's; without, an orderly close. Short-circuited (the library's copy of
    the word) and through canald's relay (canald's emulated value). Before, canal's
    accepted sockets read {0, 0} and closed in order."""
    argv = [python, progs / "linger_inherit.py"]
    native = procs.run(argv, timeout=60, name="linger-native")
    assert native.returncode == 0 and native.stdout.endswith("done\n"), native.describe()
    assert "(1, 0): accepted SO_LINGER (1, 0), client reads ECONNRESET" in native.stdout
    args = NO_SHORTCUT if mode == "no-shortcut" else []
    with serving_canald(canal_bin, procs, args=args) as d:
        r = d.run(argv, timeout=60, name="linger-canal")
        assert r.returncode == 0, r.describe()
        assert r.stdout == native.stdout, f"natively:\n{native.stdout}\nunder canal ({mode}):\n{r.stdout}"


@pytest.mark.parametrize("mode", ["shortcut", "no-shortcut"])
def test_a_listener_pauses_and_resumes_as_natively(canal_bin, procs, python, progs, mode):
    """HAProxy's pause of a listener on Linux (shutdown SHUT_WR, listen, shutdown
    SHUT_RD; listen again to resume): while paused, clients are refused, the queued
    one is reset, accept says EINVAL and poll HUP|OUT; resumed, it accepts on its
    port (progs/listen_pause.py). canal kept the listener serving: a canal client
    still connected, and the queued connection stayed."""
    argv = [python, progs / "listen_pause.py"]
    native = procs.run(argv, timeout=60, name="pause-native")
    assert native.returncode == 0 and native.stdout.endswith("done\n"), native.describe()
    assert "SHUT_RD: connect ECONNREFUSED" in native.stdout, native.describe()
    args = NO_SHORTCUT if mode == "no-shortcut" else []
    with serving_canald(canal_bin, procs, args=args) as d:
        r = d.run(argv, timeout=60, name="pause-canal")
        assert r.returncode == 0, r.describe()
        assert r.stdout == native.stdout, f"natively:\n{native.stdout}\nunder canal:\n{r.stdout}"


OWN_LISTENER = r"""
import errno, select, socket
polled = accepted = 0
for i in range(300):
    l = socket.socket(); l.bind(("127.0.0.1", 0)); l.listen(8)
    c = socket.create_connection(l.getsockname())
    if i % 2:
        p = select.poll(); p.register(l, select.POLLIN); polled += bool(p.poll(0))
    else:
        l.setblocking(False)
        try: l.accept()[0].close(); accepted += 1
        except BlockingIOError: pass
    c.close(); l.close()
print("poll(0) IN", polled, "of 150; accept without blocking", accepted, "of 150")
"""


@pytest.mark.parametrize("mode", ["shortcut", "no-shortcut"])
def test_a_connect_to_its_own_listener_leaves_it_ready(canal_bin, procs, python, mode):
    """Once connect returns, the program's own listener holds the connection: a
    poll(0) says IN and an accept without blocking takes it, natively always. Through
    canald's relay the listener learnt of it only at canald's next pass, after the
    connector saw CONNECTED: 5-20% of polls found nothing (a listen_pause.py line
    flaked so)."""
    argv = [python, "-c", OWN_LISTENER]
    native = procs.run(argv, timeout=60, name="own-listener-native")
    want = "poll(0) IN 150 of 150; accept without blocking 150 of 150\n"
    assert native.stdout == want, native.describe()
    with serving_canald(canal_bin, procs, args=NO_SHORTCUT if mode == "no-shortcut" else []) as d:
        r = d.run(argv, timeout=60, name="own-listener-canal")
        assert r.returncode == 0 and r.stdout == want, r.describe()


SMALL_BACKLOGS = r"""
import select, socket, time
for backlog in (0, 1, 2):
    counts = []
    for round in range(3):
        l = socket.socket(); l.bind(("127.0.0.1", 0)); l.listen(backlog)
        cs = []
        for i in range(5):
            c = socket.socket(); c.setblocking(False)
            try: c.connect(l.getsockname())
            except BlockingIOError: pass
            cs.append(c)
        time.sleep(0.3)
        n = 0
        for c in cs:
            p = select.poll(); p.register(c, select.POLLOUT)
            if p.poll(0) and c.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                try: c.getpeername(); n += 1
                except OSError: pass
        counts.append(n)
        for c in cs: c.close()
        l.close()
    print("listen", backlog, "lets in", counts)
"""


@pytest.mark.parametrize("mode", ["shortcut", "no-shortcut"])
def test_small_backlogs_let_in_as_many_clients_as_natively(canal_bin, procs, python, mode):
    """Five clients against a listener that does not accept: listen(n) lets n + 1
    in, listen(0) one. Through canald's relay listen(0) let two in: canald held one
    and a host listener's queue holds at least one more; the host listener now drops
    every packet while canald holds the one (a socket filter)."""
    argv = [python, "-c", SMALL_BACKLOGS]
    native = procs.run(argv, timeout=60, name="backlogs-native")
    assert native.returncode == 0, native.describe()
    assert "listen 0 lets in [1, 1, 1]" in native.stdout, native.describe()
    with serving_canald(canal_bin, procs, args=NO_SHORTCUT if mode == "no-shortcut" else []) as d:
        r = d.run(argv, timeout=60, name="backlogs-canal")
        assert r.returncode == 0, r.describe()
        assert r.stdout == native.stdout, f"natively:\n{native.stdout}\nunder canal ({mode}):\n{r.stdout}"


KERNEL_QUEUE = ACCEPT_ALL + r"""
import select, socket, sys
l = socket.socket(); l.bind(("127.0.0.1", 0)); l.listen(8)
print("PORT", l.getsockname()[1], flush=True)
p = select.poll(); p.register(l, select.POLLIN)
for rnd in range(2):
    sys.stdin.readline()
    ready = "IN" if p.poll(5000) else "-"
    ids = []
    for c in accept_all(l):
        c.settimeout(5); ids.append(c.recv(1).decode()); c.close()
    print("round", rnd, ready, "accepted", " ".join(ids), flush=True)
"""


def _kernel_queue_rounds(proc):
    """Round 0: three clients wait in the queue before the first accept; round 1: seven
    arrive at once after it. Each round the program polls, then accepts without
    blocking until EAGAIN. Returns (queue lengths seen before round 0, the rounds)."""
    port = int(proc.wait_line("PORT ", 30).split()[1])
    clients, queue = [], None
    for rnd, ids in enumerate(["012", "3456789"]):
        for i in ids:
            c = socket.create_connection(("127.0.0.1", port), timeout=5)
            c.sendall(i.encode())
            clients.append(c)
        if rnd == 0:
            time.sleep(0.5)  # canald's passes: nothing may be taken ahead meanwhile
            queue = host_queue_len(port)
        proc.popen.stdin.write(b"go\n")
        proc.popen.stdin.flush()
        proc.wait_line(f"round {rnd} ", 30)
    for c in clients:
        c.close()
    return queue, [line for line in proc.stdout().splitlines() if line.startswith("round")]


@pytest.mark.parametrize("mode", ["shortcut", "no-shortcut"])
def test_clients_wait_in_the_kernels_queue_until_the_program_accepts(canal_bin, procs, python, mode):
    """Clients of a listener that has not accepted yet wait in the kernel's accept
    queue, as natively: `ss` shows all three there, and one poll and a non-blocking
    accept loop take them all, in order. Through canald's relay canald used to take one
    ahead at once (`ss` showed 2; a burst then could get one client more than the
    backlog lets in). After the first accept, seven clients arriving together are all
    taken by one accept loop (canald then holds four ahead): a non-blocking accept finding no record while the kernel
    holds clients canald did not take asks canald (HOST_QUEUED) rather than say
    EAGAIN."""
    argv = [python, "-c", KERNEL_QUEUE]
    native = procs.spawn(argv, name="kqueue-native", stdin=subprocess.PIPE)
    want = _kernel_queue_rounds(native)
    assert want == ([3], ["round 0 IN accepted 0 1 2", "round 1 IN accepted 3 4 5 6 7 8 9"]), \
        f"natively {want} (the test is wrong)"
    with serving_canald(canal_bin, procs, args=NO_SHORTCUT if mode == "no-shortcut" else []) as d:
        guest = d.spawn(argv, name="kqueue-canal", stdin=subprocess.PIPE)
        got = _kernel_queue_rounds(guest)
    assert got == want, f"natively {want}, under canal ({mode}) {got}"


EDGE_ARRIVALS = r"""
import select, socket, sys, time
l = socket.socket(); l.bind(("127.0.0.1", 0)); l.listen(8)
print("PORT", l.getsockname()[1], flush=True)
ep = select.epoll(); ep.register(l.fileno(), select.EPOLLIN | select.EPOLLET)
events, t = 0, time.monotonic()
while time.monotonic() - t < 2.5:
    events += len(ep.poll(0.2))
print("events", events, flush=True)
"""


def _edge_events_for_three_arrivals(proc):
    port = int(proc.wait_line("PORT ", 30).split()[1])
    clients = []
    for _ in range(3):
        time.sleep(0.4)
        clients.append(socket.create_connection(("127.0.0.1", port), timeout=5))
    line = proc.wait_line("events ", 30)
    for c in clients:
        c.close()
    return line


@pytest.mark.parametrize("mode", ["shortcut", "no-shortcut"])
def test_each_client_arrival_is_an_edge_before_the_first_accept(canal_bin, procs, python, mode):
    """An edge-triggered epoll item of a listener nobody accepts on gets one event per
    arriving client, as natively (three clients 0.4 s apart: three events). Through
    canald's relay the clients stay in the kernel's queue before the first accept, and
    each arrival marks the listener changed although HOST_QUEUED stays set. The first
    arrival is one event, not its flag's and its arrival's (two); with the program's own
    copy of the listener (shortcut: NATIVE_ACCEPT) the item's edges are canald's counts,
    not the copy's readiness, which shows a client first. Under CANAL_NOTIFY=poll the
    wait spins, and saw either double as an extra event (3–5 in ten runs)."""
    argv = [python, "-c", EDGE_ARRIVALS]
    want = _edge_events_for_three_arrivals(procs.spawn(argv, name="edge-native"))
    assert want == "events 3", f"natively {want} (the test is wrong)"
    with serving_canald(canal_bin, procs, args=NO_SHORTCUT if mode == "no-shortcut" else []) as d:
        got = _edge_events_for_three_arrivals(d.spawn(argv, name="edge-canal"))
    assert got == want, f"natively {want}, under canal ({mode}) {got}"


PASS_DATAGRAM = r"""
import array, errno, socket, sys
a, b = socket.socketpair()
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(("127.0.0.1", 0))
try:
    a.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [u.fileno()]))])
    print("udp sent", flush=True)
except OSError as e:
    print("udp", "EOPNOTSUPP" if e.errno == errno.EOPNOTSUPP else errno.errorcode[e.errno], flush=True)
b.setblocking(False)
try:
    b.recv(10); print("something was sent")
except BlockingIOError:
    print("nothing sent")
# The sender's own socket still works.
v = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); v.sendto(b"ok", u.getsockname()); u.settimeout(5); print("udp", u.recv(10).decode())
"""


def test_passing_a_socket_canald_keeps_is_refused_clearly(canal_bin, procs, python):
    """Under a destination policy (here --loopback-only) canald keeps a datagram socket
    (the program could send anywhere from the kernel's socket), so SCM_RIGHTS cannot
    carry it (a receiver would get its dummy descriptor): the sendmsg is refused with
    EOPNOTSUPP and a message naming the descriptor and the reason, before anything is
    sent, and the sender's socket goes on working. Without a policy the socket is
    handed over (test_passed_listeners_serve_in_the_receiver_as_natively)."""
    with serving_canald(canal_bin, procs, args=["--loopback-only"]) as d:
        r = d.run([python, "-c", PASS_DATAGRAM], timeout=30, name="pass")
    assert r.returncode == 0, r.describe()
    assert r.stdout.splitlines() == ["udp EOPNOTSUPP", "nothing sent", "udp ok"], r.describe()
    assert "is a datagram canal socket, which cannot be passed with SCM_RIGHTS" in r.stderr, \
        r.describe()
    assert "under a destination policy" in r.stderr, r.describe()


@pytest.mark.parametrize("mode", ["shortcut", "no-shortcut"])
def test_passed_listeners_serve_in_the_receiver_as_natively(canal_bin, procs, python, progs, mode):
    """A listener, a bound stream not yet listening, or a UDP socket passed with
    SCM_RIGHTS (multiprocessing's spawn and forkserver workers, a receiver that listens
    itself, a forked worker waiting in accept, epoll or recvfrom while its parent passes
    the socket on, a UDP socket that already served a datagram and still sends from the
    sender's copy) becomes the kernel socket canald held for it, in every process that
    holds it (progs/passlisten.py). Before, the sendmsg was refused with EOPNOTSUPP (for
    UDP sockets until 2026-11-29)."""
    argv = [python, progs / "passlisten.py"]
    native = procs.run(argv, timeout=120, name="passlisten-native")
    assert native.returncode == 0 and native.stdout.endswith("done\n"), native.describe()
    args = NO_SHORTCUT if mode == "no-shortcut" else []
    with serving_canald(canal_bin, procs, args=args) as d:
        r = d.run(argv, timeout=120, name="passlisten-canal")
        assert r.returncode == 0, r.describe()
        assert r.stdout == native.stdout, f"natively:\n{native.stdout}\nunder canal:\n{r.stdout}"
        assert "cannot" not in r.stderr, r.describe()


NODE_CLUSTER = r"""
const cluster = require('cluster'), http = require('http');
if (cluster.isPrimary) {
  let up = 0;
  for (let i = 0; i < 2; i++) cluster.fork().on('listening', () => { if (++up == 2) console.log('up'); });
  process.stdin.on('data', () => { for (const id in cluster.workers) cluster.workers[id].kill(); });
} else {
  http.createServer((q, r) => r.end('pid ' + process.pid + '\n')).listen(+process.env.PORT, '127.0.0.1');
}
"""


def node_cluster(canald, tmp_path, source, name, env):
    """Runs node program `source` under canal with PORT (a free port) and `env`, until
    its primary prints "up"; returns (the process, the port)."""
    node = shutil.which("node") or shutil.which("nodejs")
    if node is None:
        pytest.skip("node is not installed (Debian's nodejs package)")
    port = free_port()
    script = tmp_path / f"{name}.js"
    script.write_text(source)
    env = clean_env({**env, "PORT": str(port)})
    p = canald.spawn([node, script], name=name, env=env, stdin=subprocess.PIPE)
    p.wait_line("up", 30)
    return p, port


@pytest.mark.parametrize("policy", ["none", "rr"])
def test_node_cluster_serves_with_shared_handles(canald, tmp_path, policy):
    """node's cluster module: with NODE_CLUSTER_SCHED_POLICY=none the primary passes
    the bound listener to each worker (SCM_RIGHTS), which listen and accept themselves;
    with rr the primary accepts and passes connections. Both serve every request."""
    p, port = node_cluster(canald, tmp_path, NODE_CLUSTER, f"node-cluster-{policy}",
                           {"NODE_CLUSTER_SCHED_POLICY": policy})
    bodies = []
    for _ in range(20):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as resp:
            bodies.append(resp.read().decode().strip())
    p.send_line("q")
    r = p.finish(30)
    assert all(b.startswith("pid ") for b in bodies), bodies
    assert "cannot be passed" not in r.stderr, r.describe()


NODE_CLUSTER_UDP = r"""
const cluster = require('cluster'), dgram = require('dgram');
const port = +process.env.PORT;
if (cluster.isPrimary) {
  let up = 0;
  for (let i = 0; i < 2; i++) cluster.fork().on('listening', () => { if (++up == 2) console.log('up'); });
  process.stdin.on('data', () => { for (const id in cluster.workers) cluster.workers[id].kill(); });
} else {
  const s = dgram.createSocket('udp4');
  s.on('message', (m, r) => s.send('pid ' + process.pid + ' ' + m, r.port, r.address));
  s.bind(port, '127.0.0.1');
}
"""


def test_node_cluster_shares_a_datagram_socket(canald, tmp_path):
    """node's cluster module shares a UDP socket: the primary binds it and passes it to
    each worker (SCM_RIGHTS), and the workers answer on it. Under canal the primary's
    sendmsg was refused with EOPNOTSUPP until datagram sockets could be handed over."""
    p, port = node_cluster(canald, tmp_path, NODE_CLUSTER_UDP, "node-cluster-udp", {})
    c = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    c.settimeout(10)
    answers = []
    for i in range(20):
        c.sendto(b"q%d" % i, ("127.0.0.1", port))
        answers.append(c.recvfrom(100)[0].decode())
    p.send_line("q")
    r = p.finish(30)
    assert all(a.startswith("pid ") and a.endswith(" q%d" % i) for i, a in enumerate(answers)), answers
    assert "cannot be passed" not in r.stderr, r.describe()


@pytest.mark.parametrize("mode", ["shortcut", "no-shortcut"])
def test_epoll_wakes_when_another_thread_changes_the_set(canal_bin, procs, python, progs, mode):
    """One thread asleep in epoll_wait, another adding or re-arming a socket in the same
    set (Apache's event MPM hands kept-alive connections to its listener thread so;
    tokio and mio register from any thread): the sleeper must wake when the change
    makes the socket ready or data comes (progs/epoll_handoff.py: every case within
    0.5 s). Before the library kicked the set's sleepers (mux/kick.rs), a wait that
    began on a set without canal sockets slept its whole timeout and returned nothing,
    one on a set with some woke at its 1 s re-check; Apache served 7 kept-alive requests
    a second."""
    argv = [python, progs / "epoll_handoff.py"]
    native = procs.run(argv, timeout=60, name="handoff-native")
    assert native.returncode == 0, native.describe()
    with serving_canald(canal_bin, procs, args=NO_SHORTCUT if mode == "no-shortcut" else []) as d:
        p = d.spawn(argv, name="handoff-canal")
        d.wait_served(p, kind="tcp-listener")
        r = p.finish(60)
        assert r.returncode == 0 and r.stdout.count(" ok ") == native.stdout.count(" ok ") == 7, r.describe()
