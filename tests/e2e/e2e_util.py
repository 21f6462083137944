"""Native (non-canal) helpers for the end-to-end tests: peers, servers, /proc readers.

Everything here runs in the pytest process, natively on the host's kernel sockets; the
programs under test run under `canal run` (see conftest.py) and talk to these.
"""

import hashlib
import os
import select
import socket
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HOST = "127.0.0.1"


def closed_port():
    """A TCP port on 127.0.0.1 nothing listens on (bound briefly, never listened)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind((HOST, 0))
    port = s.getsockname()[1]
    s.close()
    return port


def free_port():
    return closed_port()


def port_free_for_tcp_and_udp(host=HOST):
    """A port number a TCP and a UDP socket on `host` could both bind just now (for a
    server that binds both, or two servers sharing a number: a port free for one
    protocol only once picked one the other's socket held, "Address already in use")."""
    for _ in range(100):
        with socket.socket() as t, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
            t.bind((host, 0))
            port = t.getsockname()[1]
            try:
                u.bind((host, port))
            except OSError:
                continue
            return port
    raise AssertionError(f"no port free for both TCP and UDP on {host} in 100 tries")


def wait_for(pred, timeout, interval=0.01, what="condition"):
    """Poll pred() until it returns a true value (returned) or timeout seconds pass
    (AssertionError naming `what`)."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def tcp_listening(port, host=HOST):
    """True if /proc/net/tcp shows a socket listening on host:port (whoever owns it)."""
    want = f"{socket.htonl(int.from_bytes(socket.inet_aton(host), 'big')):08X}:{port:04X}"
    want_any = f"00000000:{port:04X}"
    try:
        with open("/proc/net/tcp") as f:
            next(f)
            for line in f:
                parts = line.split()
                if parts[3] == "0A" and parts[1] in (want, want_any):
                    return True
    except OSError:
        pass
    return False


class ThreadedServer:
    """A TCP listener on 127.0.0.1 with one thread per connection (daemon threads)."""

    def __init__(self):
        self.lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lsock.bind((HOST, 0))
        # A deep backlog: hundreds of clients connecting at once must not wait for
        # SYN retransmissions (seconds) before the accept thread catches up.
        self.lsock.listen(1024)
        self.port = self.lsock.getsockname()[1]
        self._closed = False
        self.conns = []
        threading.Thread(target=self._accept_loop, daemon=True).start()

    def _accept_loop(self):
        while not self._closed:
            try:
                conn, _ = self.lsock.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._handle_safe, args=(conn,), daemon=True).start()

    def _handle_safe(self, conn):
        try:
            self.handle(conn)
        except OSError:
            pass
        finally:
            try:
                conn.close()
            except OSError:
                pass

    def handle(self, conn):
        raise NotImplementedError

    def close(self):
        self._closed = True
        try:
            self.lsock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.lsock.close()
        for c in self.conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class PeerServer(ThreadedServer):
    """The peer of progs/errpaths.c: reads one command line per connection.

    CLOSE: close at once. HOLD: send nothing, discard input until EOF. HALF: send b"hello",
    shutdown(SHUT_WR), read until EOF and append what came to self.half_records.
    ECHO: echo until EOF."""

    def __init__(self):
        self.half_records = []
        self.commands = []
        super().__init__()

    def handle(self, conn):
        conn.settimeout(30)
        line = b""
        while not line.endswith(b"\n"):
            b = conn.recv(1)
            if not b:
                return
            line += b
        cmd = line.strip().decode()
        self.commands.append(cmd)
        if cmd == "CLOSE":
            return
        if cmd == "HOLD":
            while conn.recv(65536):
                pass
        elif cmd == "HALF":
            conn.sendall(b"hello")
            conn.shutdown(socket.SHUT_WR)
            got = b""
            while True:
                b = conn.recv(65536)
                if not b:
                    break
                got += b
            self.half_records.append(got)
        elif cmd == "ECHO":
            while True:
                b = conn.recv(65536)
                if not b:
                    return
                conn.sendall(b)


class SinkServer(ThreadedServer):
    """Reads and discards; counts bytes; records how each connection ended and when."""

    def __init__(self):
        self.received = 0
        self.ended = []  # (monotonic time, "eof" | "reset: ...")
        self.lock = threading.Lock()
        super().__init__()

    def handle(self, conn):
        while True:
            try:
                b = conn.recv(1 << 18)
            except OSError as e:
                with self.lock:
                    self.ended.append((time.monotonic(), f"error: {e}"))
                return
            if not b:
                with self.lock:
                    self.ended.append((time.monotonic(), "eof"))
                return
            with self.lock:
                self.received += len(b)


class HoldServer(ThreadedServer):
    """Accepts and keeps connections open without sending; ends when the client closes."""

    def handle(self, conn):
        while conn.recv(65536):
            pass


class BlobHTTPServer:
    """Native HTTP server: GET /blob serves `blob`; PUT or POST to any path reads the body
    and answers with its SHA-256 in hex (and remembers it in self.uploads).

    self.gate (a threading.Event, open by default): each request waits for it (at most
    30 s) before the body moves, so a test can inspect the connected client first."""

    def __init__(self, blob):
        self.blob = blob
        self.uploads = []
        self.gate = threading.Event()
        self.gate.set()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, fmt, *args):
                pass

            def do_GET(self):
                if self.path != "/blob":
                    self.send_error(404)
                    return
                outer.gate.wait(30)
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(len(outer.blob)))
                self.end_headers()
                view = memoryview(outer.blob)
                for off in range(0, len(view), 1 << 20):
                    self.wfile.write(view[off : off + (1 << 20)])

            def _upload(self):
                length = int(self.headers.get("Content-Length", "-1"))
                if length < 0:
                    self.send_error(411)
                    return
                outer.gate.wait(30)
                h = hashlib.sha256()
                left = length
                while left:
                    chunk = self.rfile.read(min(left, 1 << 20))
                    if not chunk:
                        break
                    h.update(chunk)
                    left -= len(chunk)
                digest = h.hexdigest()
                outer.uploads.append((length - left, digest))
                body = (digest + "\n").encode()
                self.send_response(200 if left == 0 else 400)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_PUT = _upload
            do_POST = _upload

        self.httpd = ThreadingHTTPServer((HOST, 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(1 << 20)
            if not b:
                return h.hexdigest()
            h.update(b)


CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    """utime+stime of process pid (all its threads), in seconds, from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as f:
        data = f.read()
    fields = data[data.rindex(")") + 2 :].split()
    # fields[0] is field 3 (state); utime is field 14, stime field 15.
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def children_of(pid):
    """Direct children of pid (from /proc/<pid>/task/*/children)."""
    out = set()
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    out.update(int(x) for x in f.read().split())
            except OSError:
                pass
    except OSError:
        pass
    return out


def pid_alive(pid):
    """True if pid exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            data = f.read()
    except OSError:
        return False
    return data[data.rindex(")") + 2] != "Z"


def poll_only():
    """Whether the tests run with canald in poll-only notification mode (scripts/test-modes):
    a measurement mode that never sleeps, so idle-CPU checks do not apply."""
    return "poll" in (os.environ.get("CANAL_NOTIFY", ""), *os.environ.get("CANAL_TEST_DAEMON_ARGS", "").split())


def iperf3_slack():
    """How many bytes an iperf3 receiver may count fewer than its sender, per stream:
    iperf3 stops the receiver's count when TEST_END arrives on the control connection,
    and TCP does not order two connections, so the bytes still in flight then — up to
    tcp_wmem max + tcp_rmem max, plus 16 MiB for canal's rings — go uncounted (natively
    too; tests/e2e/test_iperf3.py)."""

    def sysctl_max(name):
        with open(f"/proc/sys/net/ipv4/{name}") as f:
            return int(f.read().split()[-1])

    return sysctl_max("tcp_wmem") + sysctl_max("tcp_rmem") + (16 << 20)


def handshakes_within(port, n, seconds):
    """Starts n non-blocking connects; how many complete their handshake in time (a
    client whose SYN the kernel dropped retries only after a second)."""
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        socks.append(s)
    ep = select.epoll()
    for s in socks:
        ep.register(s.fileno(), select.EPOLLOUT)
    done, deadline = set(), time.monotonic() + seconds
    while len(done) < n and time.monotonic() < deadline:
        for fd, _ in ep.poll(0.05):
            done.add(fd)
            ep.unregister(fd)
    ok = sum(1 for s in socks if s.fileno() in done
             and s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0)
    return ok, socks


def host_queue_len(port):
    """The kernel's accept queue of the listener on 127.0.0.1:port, as `ss` shows it."""
    out = subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True).stdout
    return [int(line.split()[1]) for line in out.splitlines() if line.split()]


# Python source for a guest program: `accept_all(l)` takes every connection listener
# `l` has now, without blocking (an accept loop until EAGAIN, as event-driven servers
# drain a listener).
ACCEPT_ALL = """
def accept_all(l):
    l.setblocking(False)
    conns = []
    while True:
        try:
            conns.append(l.accept()[0])
        except BlockingIOError:
            return conns
"""
