"""Helpers shared by the compatibility tests: the four modes and who runs under canal."""

import hashlib
import os
import random
import re
import socket
import threading
from pathlib import Path

import e2e_util
from canal_harness import runner

# canald's line for a guest whose sockets are all freed (crates/canald/src/worker.rs, -v).
FREED_LINE = re.compile(
    r'guest \d+ \(pid (?P<pid>\d+), "(?P<comm>[^"]*)"\) freed \(worker \d+\): \d+ requests '
    r'\(\d+ failed\), (?P<tx>\d+) bytes sent, (?P<rx>\d+) received')

# native        both ends run directly (no canal): proves the test itself is right
# canal-both    server and client each under its own `canal run` guest
# canal-client  the client end under canal, the server native
# canal-server  the server end under canal, the client native
MODES = ["native", "canal-both", "canal-client", "canal-server"]


def server_under_canal(mode):
    return mode in ("canal-both", "canal-server")


def client_under_canal(mode):
    return mode in ("canal-both", "canal-client")


def daemon_args(mode):
    """canald's switches for `mode`: where one end runs natively the canal end's
    connections to it go through canald (--direct off), the relay that VMs, isolated
    guests and guests under a policy take, tested with real programs (and the witness
    sockets that prove a program's sockets are canal's are such connections). In
    canal-both mode canald's default holds: a client's socket starts as its own kernel
    socket and becomes canal's at its connect to the canal server's port."""
    return ["--direct", "off"] if mode in ("canal-client", "canal-server") else []


def ends(request, mode):
    """(server_runner, client_runner) for mode. A runner has .spawn(argv, name=None, **kw)
    -> Proc and .run(argv, timeout, name=None, **kw) -> Result; under canal it is the
    canald fixture (one private daemon per test, each program its own `canal run`)."""
    assert mode in MODES, mode
    srv = runner(request, "canal" if server_under_canal(mode) else "native")
    cli = runner(request, "canal" if client_under_canal(mode) else "native")
    return srv, cli


def wait_listening(proc, port, what, timeout=30, host="127.0.0.1"):
    """Wait until something listens on host:port (canal's listener is a host socket on the
    same port, so /proc/net/tcp shows it in every mode); fail if proc exits first."""
    e2e_util.wait_for(
        lambda: proc.poll() is not None or e2e_util.tcp_listening(port, host),
        timeout,
        what=f"{what} to listen on {host}:{port}",
    )
    assert proc.poll() is None, f"{what} exited before listening\n{proc.describe()}"


def make_files(root, sizes, seed=b"canal-compat"):
    """Write files named f<size> of pseudo-random content under root; {name: sha256}."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    hashes = {}
    for size in sizes:
        name = f"f{size}"
        data = random.Random(seed + name.encode()).randbytes(size)
        (root / name).write_bytes(data)
        hashes[name] = hashlib.sha256(data).hexdigest()
    os.chmod(root, 0o755)
    return hashes


def free_udp_port():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def udp_bound(port):
    """True if /proc/net/udp shows a socket bound to 127.0.0.1:port or *:port."""
    want = {f"0100007F:{port:04X}", f"00000000:{port:04X}"}
    try:
        with open("/proc/net/udp") as f:
            next(f)
            return any(line.split()[1] in want for line in f)
    except OSError:
        return False


def assert_served_by_canal(request, mode, port, proto="tcp", what="server"):
    """In modes where the server runs under canal, `canal stat` must list a guest socket
    listening (TCP) or bound (UDP) on port: proof the server's socket really is canal's and
    the test is not passing over the kernel by accident. No-op in the other modes."""
    if server_under_canal(mode):
        assert_listed_by_canal(request.getfixturevalue("canald"), port, proto, f"{what} ({mode})")


def assert_listed_by_canal(canald, port, proto="tcp", what="server"):
    """`canal stat` lists (within 5 s) a guest socket listening (TCP) or bound (UDP) on port."""
    kind = "tcp-listener" if proto == "tcp" else "udp"

    def find():
        st = canald.stat()
        for g in st.get("guests", []):
            for s in g.get("sockets", []):
                if s.get("kind") == kind and str(s.get("local", "")).endswith(f":{port}"):
                    return g
        return None

    try:
        e2e_util.wait_for(find, 5, what=f"`canal stat` to list a {kind} socket on port {port}")
    except AssertionError:
        raise AssertionError(
            f"{what} runs under canal but `canal stat` lists no {kind} socket on port {port}: "
            f"its socket is not canal's\n{canald.stat()}"
        )


def kind_is(actual, want):
    """Whether a `canal stat` socket kind is `want`; a short-circuited connection between
    two canal guests ("tcp-shortcut", protocol.md §8) is a TCP connection too."""
    return actual == want or (want == "tcp" and actual == "tcp-shortcut")


def assert_socket_listed(canald, port, kind, what):
    """`canal stat` lists (within 5 s) a guest socket whose local port is port: kind "tcp4"
    or "tcp6" -> a "tcp" socket, "udp4"/"udp6" -> a "udp" one."""
    want = "udp" if kind.startswith("udp") else "tcp"

    def find():
        for g in canald.stat().get("guests", []):
            for s in g.get("sockets", []):
                if kind_is(s.get("kind"), want) and str(s.get("local", "")).endswith(f":{port}"):
                    return g
        return None

    try:
        e2e_util.wait_for(find, 5, what=f"`canal stat` to list a {want} socket with local port {port}")
    except AssertionError:
        raise AssertionError(
            f"{what} runs under canal, but `canal stat` lists no {want} socket with local port {port} "
            f"(its {kind} witness socket): its sockets are not canal's, so its checks prove nothing about canal\n"
            f"{canald.stat()}"
        )


class CanalSampler:
    """Polls `canal stat` in a background thread while a client runs, remembering every guest
    socket seen. Used where the client runs under canal (canal-client, canal-both) to prove
    its connections were canal's: `canal stat` lists only live guests, so a client that
    lives long enough is sampled many times. One quicker than the sampling (redis-benchmark
    once finished between two samples) is proven by canald's log of the guest it freed,
    given the program (the compat tests' canald runs with -v).

        with CanalSampler(request, mode) as sampler:
            client_run.run([wrk, ...])
        sampler.require_peer_port(port, "wrk", program=wrk)
    In modes whose client is native, it does nothing and require_peer_port passes."""

    def __init__(self, request, mode, interval=0.05, canald=None):
        """`canald`: the daemon to ask (default: the test's canald fixture)."""
        self.active = client_under_canal(mode)
        self.canald = (canald or request.getfixturevalue("canald")) if self.active else None
        self.interval = interval
        self.seen = []  # (comm, kind, local, peer)
        self.samples = 0
        self.errors = []
        # Where canald's log stood when the client started (see freed_guests).
        self.log_from = len(self.canald.proc.stderr()) if self.active and self.canald.proc else 0
        self._stop = threading.Event()
        self._thread = None

    def _run(self):
        while not self._stop.is_set():
            try:
                st = self.canald.stat()
                self.samples += 1
                for g in st.get("guests", []):
                    for s in g.get("sockets", []):
                        self.seen.append((g.get("comm"), s.get("kind"), str(s.get("local")), str(s.get("peer"))))
            except AssertionError as e:
                self.errors.append(str(e).splitlines()[0])
            self._stop.wait(self.interval)

    def __enter__(self):
        if self.active:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        if self._thread:
            self._stop.set()
            self._thread.join(timeout=15)

    def require_peer_port(self, port, what, program=None):
        """`program`: the client's executable, for a client that may finish between two
        samples: canald's log of its guests then proves it (see below)."""
        if not self.active:
            return
        hits = [s for s in self.seen if kind_is(s[1], "tcp") and s[3].endswith(f":{port}")]
        # The server's end of a short-circuited connection proves it too: canald pairs
        # only two canal sockets (protocol §8).
        hits += [s for s in self.seen if s[1] == "tcp-shortcut" and s[2].endswith(f":{port}")]
        if hits:
            return
        # A client quicker than the sampling (redis-benchmark's 60,000 requests took a
        # tenth of a second in CI: two samples, both outside its connections) is proven
        # by canald's own account once it leaves: a guest of that program, freed since
        # the sampler started, whose sockets moved bytes through canal both ways.
        # The kernel names a process after the path it executed (not resolved; a wrapper
        # such as Debian's pg_wrapper execs a file of the program's name).
        comm = Path(str(program)).name[:15] if program else None
        freed = []
        if comm:
            try:
                freed = e2e_util.wait_for(lambda: self.freed_guests(comm), 5,
                                          what=f"canald to log that it freed a {comm} guest")
            except AssertionError:
                pass
        assert freed, (
            f"{what} ran under canal, but in {self.samples} samples of `canal stat` no guest had a TCP "
            f"socket connected to port {port}"
            + (f", and canald freed no {comm} guest since it started that sent and received bytes "
               f"through canal" if comm else "")
            + f": its connections were not canal's (stat errors: {self.errors[:3]}; "
            f"sockets seen: {sorted(set(self.seen))[:10]})\n"
            f"--- canald's log since ---\n{self.canald.proc.stderr()[self.log_from:][-4000:]}"
        )

    def freed_guests(self, comm):
        """(pid, sent, received) of the guests of program `comm` that canald freed since
        the sampler started and whose sockets moved bytes both ways: its "freed" lines
        (logged with -v, which the compat tests' canald has)."""
        log = self.canald.proc.stderr()[self.log_from:]
        return [(int(m["pid"]), int(m["tx"]), int(m["rx"])) for m in FREED_LINE.finditer(log)
                if m["comm"] == comm and int(m["tx"]) > 0 and int(m["rx"]) > 0]
