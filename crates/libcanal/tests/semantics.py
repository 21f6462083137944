#!/usr/bin/env python3
"""Socket semantics under libcanal, checked against native peers.

Run under the preload library with a canald answering:
    CANAL_SOCKET=/tmp/x.sock LD_PRELOAD=$PWD/target/release/libcanal.so \
        python3 crates/libcanal/tests/semantics.py
Native peers run in child processes started without LD_PRELOAD. Every check is
bounded by timeouts; the script exits 0 only if all checks pass, 77 if it is not
running under canal (skipped).

SEMANTICS_NATIVE=1 runs the same checks on kernel sockets (without the "is canal"
checks), to confirm that every expectation here is the kernel's behaviour.
"""
import errno
import hashlib
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import textwrap
import time

FAILS = []
NATIVE = os.environ.get("SEMANTICS_NATIVE") == "1"
NATIVE_ENV = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD",)}


def check(name, cond, detail=""):
    print(("PASS " if cond else "FAIL ") + name + ("" if cond else f"  [{detail}]"), flush=True)
    if not cond:
        FAILS.append(name)


def unix_inodes():
    out = set()
    with open("/proc/net/unix") as f:
        next(f)
        for line in f:
            parts = line.split()
            if len(parts) >= 7:
                out.add(parts[6])
    return out


def is_canal(s):
    """A canal socket is backed by an AF_UNIX dummy descriptor."""
    if NATIVE:
        return True
    link = os.readlink(f"/proc/self/fd/{s.fileno()}")
    return link.startswith("socket:[") and link[8:-1] in unix_inodes()


def native(code, *args):
    """Starts a native (not preloaded) Python peer; it prints its port first."""
    p = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *map(str, args)],
        env=NATIVE_ENV,
        stdout=subprocess.PIPE,
        text=True,
    )
    port = int(p.stdout.readline())
    return p, port


ECHO = """
import socket, sys
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", 0)); l.listen(8)
print(l.getsockname()[1], flush=True)
l.settimeout(20)
c, _ = l.accept(); c.settimeout(20)
while True:
    d = c.recv(65536)
    if not d: break
    c.sendall(d)
c.close()
"""

HASHER = """
import socket, sys, hashlib
l = socket.socket(); l.bind(("127.0.0.1", 0)); l.listen(1)
print(l.getsockname()[1], flush=True)
l.settimeout(20)
c, _ = l.accept(); c.settimeout(20)
h = hashlib.sha256(); n = 0
while True:
    d = c.recv(1 << 20)
    if not d: break
    h.update(d); n += len(d)
c.sendall(f"{n} {h.hexdigest()}".encode()); c.close()
"""


def t_tcp_client():
    p, port = native(ECHO)
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    check("socket is canal", is_canal(s))
    check("getpeername", s.getpeername() == ("127.0.0.1", port), s.getpeername())
    check("getsockname", s.getsockname()[0] == "127.0.0.1" and s.getsockname()[1] > 0)
    check("SO_TYPE", s.getsockopt(socket.SOL_SOCKET, socket.SO_TYPE) == socket.SOCK_STREAM)
    s.sendall(b"hello")
    check("echo", s.recv(100) == b"hello")
    s.sendall(b"peekdata")
    time.sleep(0.2)
    check("MSG_PEEK", s.recv(4, socket.MSG_PEEK) == b"peek")
    check("after peek", s.recv(8, socket.MSG_WAITALL) == b"peekdata")
    s.setblocking(False)
    try:
        s.recv(10)
        check("EAGAIN nonblocking recv", False, "no error")
    except BlockingIOError:
        check("EAGAIN nonblocking recv", True)
    check("MSG_DONTWAIT", _raises(lambda: s.recv(10), BlockingIOError))
    s.setblocking(True)
    s.settimeout(None)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", 0, 200000))
    t0 = time.monotonic()
    e = _err(lambda: s.recv(10))
    dt = time.monotonic() - t0
    check("SO_RCVTIMEO -> EAGAIN", e == errno.EAGAIN and 0.15 < dt < 2, (e, dt))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", 0, 0))
    # Half close: the echo server sees EOF, echoes what it had, then closes.
    s.sendall(b"last")
    s.shutdown(socket.SHUT_WR)
    data = b""
    while True:
        d = s.recv(100)
        if not d:
            break
        data += d
    check("half-close: data then EOF", data == b"last", data)
    check("recv after EOF is 0", s.recv(10) == b"")
    e = _err(lambda: s.send(b"x", socket.MSG_NOSIGNAL))
    check("send after SHUT_WR: EPIPE", e == errno.EPIPE, e)
    s.close()
    p.wait(10)


def _err(f):
    try:
        f()
        return 0
    except OSError as e:
        return e.errno


def _raises(f, exc):
    try:
        f()
        return False
    except exc:
        return True


def t_refused():
    # A port nobody listens on: bind natively, close, then connect.
    tmp = socket.socket()
    tmp.bind(("127.0.0.1", 0))
    port = tmp.getsockname()[1]
    tmp.close()
    s = socket.socket()
    e = _err(lambda: s.connect(("127.0.0.1", port)))
    check("blocking connect ECONNREFUSED", e == errno.ECONNREFUSED, e)
    s.close()
    s = socket.socket()
    s.setblocking(False)
    e = _err(lambda: s.connect(("127.0.0.1", port)))
    check("nonblocking connect EINPROGRESS or refused", e in (errno.EINPROGRESS, errno.ECONNREFUSED), e)
    if e == errno.EINPROGRESS:
        _, w, _ = select.select([], [s], [], 5)
        check("select writable after failed connect", w == [s])
        err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        check("SO_ERROR = ECONNREFUSED", err == errno.ECONNREFUSED, err)
        check("SO_ERROR read once", s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0)
    s.close()


def t_nonblocking_connect_ok():
    p, port = native(ECHO)
    s = socket.socket()
    s.setblocking(False)
    e = _err(lambda: s.connect(("127.0.0.1", port)))
    check("nonblocking connect EINPROGRESS/0", e in (0, errno.EINPROGRESS), e)
    po = select.poll()
    po.register(s, select.POLLOUT)
    ev = po.poll(5000)
    check("poll POLLOUT on connect", ev and ev[0][1] & select.POLLOUT, ev)
    check("SO_ERROR 0", s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0)
    e = _err(lambda: s.connect(("127.0.0.1", port)))
    check("second connect after completion: 0 (as Linux)", e == 0, e)
    e = _err(lambda: s.connect(("127.0.0.1", port)))
    check("third connect EISCONN", e == errno.EISCONN, e)
    s.setblocking(True)
    s.sendall(b"x")
    check("data after nb connect", s.recv(1) == b"x")
    s.close()
    p.wait(10)


def t_epipe_sigpipe():
    p, port = native(
        """
import socket
l = socket.socket(); l.bind(("127.0.0.1", 0)); l.listen(1)
print(l.getsockname()[1], flush=True)
c, _ = l.accept()
c.settimeout(10); c.recv(1)
c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\\x01\\x00\\x00\\x00\\x00\\x00\\x00\\x00")
c.close()
"""
    )
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(b"!")
    p.wait(10)
    time.sleep(0.3)
    got = []
    old = signal.signal(signal.SIGPIPE, lambda *a: got.append(1))
    errs = set()
    for _ in range(50):
        try:
            s.send(b"x" * 1000)
        except OSError as e:
            errs.add(e.errno)
            break
        time.sleep(0.02)
    signal.signal(signal.SIGPIPE, old)
    check("send to reset peer fails (ECONNRESET/EPIPE)", errs & {errno.ECONNRESET, errno.EPIPE}, errs)
    # Next send: EPIPE; with MSG_NOSIGNAL no signal.
    got.clear()
    signal.signal(signal.SIGPIPE, lambda *a: got.append(1))
    e = _err(lambda: s.send(b"y", socket.MSG_NOSIGNAL))
    check("EPIPE with MSG_NOSIGNAL, no signal", e == errno.EPIPE and not got, (e, got))
    e = _err(lambda: s.send(b"y"))
    check("EPIPE raises SIGPIPE", e == errno.EPIPE and got, (e, got))
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    s.close()


def t_server_and_bulk():
    # A canal listener, a native client, 32 MiB both ways with hashes.
    l = socket.socket()
    l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind(("127.0.0.1", 0))
    l.listen(4)
    check("listener is canal", is_canal(l))
    check("SO_ACCEPTCONN", l.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1)
    port = l.getsockname()[1]
    client = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent("""
            import socket, sys, hashlib
            import threading
            s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=20)
            blob = bytes(range(256)) * 4096 * 32
            def tx():
                s.sendall(blob); s.shutdown(socket.SHUT_WR)
            threading.Thread(target=tx).start()
            h = hashlib.sha256(); n = 0
            while True:
                d = s.recv(1 << 20)
                if not d: break
                h.update(d); n += len(d)
            print(n, h.hexdigest(), hashlib.sha256(blob).hexdigest())
        """), str(port)],
        env=NATIVE_ENV, stdout=subprocess.PIPE, text=True)
    l.settimeout(10)
    c, addr = l.accept()
    check("accepted socket is canal", is_canal(c))
    check("accept peer address", addr[0] == "127.0.0.1", addr)
    c.settimeout(20)
    h = hashlib.sha256()
    n = 0
    while True:
        d = c.recv(1 << 20)
        if not d:
            break
        h.update(d)
        n += len(d)
        c.sendall(d)
    c.close()
    out = client.stdout.read().split()
    client.wait(20)
    check("bulk 32 MiB in", n == 32 * 1024 * 1024 and h.hexdigest() == out[2], (n,))
    check("bulk 32 MiB echoed back", out[:2] == [str(32 * 1024 * 1024), out[2]], out)
    l.close()


def t_bulk_out():
    p, port = native(HASHER)
    s = socket.create_connection(("127.0.0.1", port), timeout=20)
    blob = os.urandom(1 << 20) * 64
    t0 = time.monotonic()
    s.sendall(blob)
    s.shutdown(socket.SHUT_WR)
    res = s.recv(200).decode().split()
    dt = time.monotonic() - t0
    check("bulk 64 MiB out, hash", res == [str(len(blob)), hashlib.sha256(blob).hexdigest()], res)
    print(f"     64 MiB out in {dt:.2f}s ({len(blob) / dt / 1e6:.0f} MB/s)")
    s.close()
    p.wait(10)


def t_udp():
    p, port = native(
        """
import socket
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(("127.0.0.1", 0))
print(u.getsockname()[1], flush=True)
u.settimeout(10)
for _ in range(3):
    d, a = u.recvfrom(65536)
    u.sendto(d.upper(), a)
"""
    )
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    check("udp socket is canal", is_canal(u))
    check("udp send unconnected: EDESTADDRREQ", _err(lambda: u.send(b"x")) == errno.EDESTADDRREQ)
    u.settimeout(5)
    u.sendto(b"hello", ("127.0.0.1", port))
    d, a = u.recvfrom(100)
    check("udp recvfrom data+source", d == b"HELLO" and a == ("127.0.0.1", port), (d, a))
    u.sendto(b"x" * 1000, ("127.0.0.1", port))
    time.sleep(0.2)
    n = u.recv_into(bytearray(10), 10, socket.MSG_TRUNC)
    check("MSG_TRUNC returns real length", n == 1000, n)
    u.sendto(b"y" * 100, ("127.0.0.1", port))
    time.sleep(0.2)
    d, anc, flags, a = u.recvmsg(10)
    check("recvmsg MSG_TRUNC flag + source", flags & socket.MSG_TRUNC and len(d) == 10 and a[1] == port, (flags, a))
    e = _err(lambda: u.sendto(b"z" * 70000, ("127.0.0.1", port)))
    check("udp EMSGSIZE", e == errno.EMSGSIZE, e)
    u.close()
    p.wait(10)


def t_poll_mixed():
    p, port = native(ECHO)
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    r, w = os.pipe()
    t0 = time.monotonic()
    rr, _, _ = select.select([s, r], [], [], 0.3)
    dt = time.monotonic() - t0
    check("select timeout honoured", rr == [] and 0.25 < dt < 1.5, (rr, dt))
    os.write(w, b"a")
    rr, _, _ = select.select([s, r], [], [], 5)
    check("select wakes on ordinary fd", rr == [r], rr)
    os.read(r, 1)
    s.sendall(b"z")
    rr, _, _ = select.select([s, r], [], [], 5)
    check("select wakes on canal fd", rr == [s], rr)
    po = select.poll()
    po.register(s, select.POLLIN)
    po.register(r, select.POLLIN)
    check("poll canal ready", po.poll(1000) == [(s.fileno(), select.POLLIN)])
    s.recv(1)
    t0 = time.monotonic()
    ev = po.poll(200)
    dt = time.monotonic() - t0
    check("poll timeout", ev == [] and 0.15 < dt < 1.5, (ev, dt))
    check("poll zero timeout", po.poll(0) == [])
    # EINTR from a signal during a sleeping poll.
    signal.signal(signal.SIGALRM, lambda *a: None)
    signal.setitimer(signal.ITIMER_REAL, 0.2)
    t0 = time.monotonic()
    try:
        os.set_blocking(r, True)
        # select.poll retries on EINTR (PEP 475) with the remaining timeout; the
        # wake-up shows as returning at the deadline, not hanging.
        ev = po.poll(600)
    except InterruptedError:
        ev = "eintr"
    dt = time.monotonic() - t0
    check("poll survives signal, honours timeout", ev == [] and 0.5 < dt < 2, (ev, dt))
    os.close(r)
    os.close(w)
    s.close()
    p.wait(10)


def t_fork_shared():
    p, port = native(ECHO)
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    pid = os.fork()
    if pid == 0:
        try:
            s.sendall(b"child")
            ok = s.recv(5) == b"child"
            # os._exit skips exit(): close explicitly (see docs/compat.md).
            s.close()
            os._exit(0 if ok else 1)
        except Exception:
            os._exit(2)
    _, st = os.waitpid(pid, 0)
    check("fork: child uses inherited socket", os.WEXITSTATUS(st) == 0, st)
    s.sendall(b"parent")
    check("fork: parent still works", s.recv(6) == b"parent")
    # The child closed its copy at exit: the connection must still be open.
    d = s.dup()
    s.close()
    d.sendall(b"dup")
    check("dup survives close of the original", d.recv(3) == b"dup")
    d.close()
    p.wait(10)


def t_fork_exit_exec():
    """References of children that exit() or exec() are dropped: the peer sees EOF
    as soon as the parent closes."""
    for how in ("exit", "execv", "subprocess", "subprocess-fork"):
        p, port = native(ECHO)
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        if how == "subprocess":
            subprocess.run(["true"], check=True)
        elif how == "subprocess-fork":
            # preexec_fn makes Python fork (not vfork); the child closes descriptors
            # with close_range before exec.
            subprocess.run(["true"], check=True, preexec_fn=lambda: None)
        else:
            pid = os.fork()
            if pid == 0:
                if how == "exit":
                    sys.exit(0)
                os.execv("/bin/true", ["true"])
            os.waitpid(pid, 0)
        s.sendall(b"k")
        check(f"{how}: socket still works", s.recv(1) == b"k")
        s.close()
        try:
            p.wait(5)
            check(f"{how}: peer sees EOF after parent close", True)
        except subprocess.TimeoutExpired:
            p.kill()
            check(f"{how}: peer sees EOF after parent close", False, "peer still connected")


def t_misc_errors():
    s = socket.socket()
    check("getpeername unconnected: ENOTCONN", _err(s.getpeername) == errno.ENOTCONN)
    check("recv unconnected: ENOTCONN", _err(lambda: s.recv(1)) == errno.ENOTCONN)
    check("send unconnected: EPIPE", _err(lambda: s.send(b"x", socket.MSG_NOSIGNAL)) == errno.EPIPE)
    l = socket.socket()
    l.bind(("127.0.0.1", 0))
    l.listen(1)
    e = _err(lambda: s.bind(l.getsockname()))
    check("bind EADDRINUSE", e == errno.EADDRINUSE, e)
    l.setblocking(False)
    check("accept nonblocking: EAGAIN", _err(l.accept) == errno.EAGAIN)
    l.setblocking(True)
    l.settimeout(0.2)
    t0 = time.monotonic()
    check("accept timeout", _raises(l.accept, socket.timeout) and time.monotonic() - t0 < 2)
    s.close()
    l.close()
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.bind(("127.0.0.1", 0))
    v = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    v.connect(u.getsockname())
    big = os.urandom(60000)
    v.send(big)
    u.settimeout(5)
    d, a = u.recvfrom(65536)
    check("udp 60000-byte datagram via connected socket", d == big and a == v.getsockname(), (len(d), a))
    check("udp SHUT_RD unconnected: ENOTCONN", _err(lambda: u.shutdown(socket.SHUT_RD)) == errno.ENOTCONN)
    v.shutdown(socket.SHUT_RD)
    check("udp recv after SHUT_RD: 0 bytes", v.recv(10) == b"")
    u.close()
    v.close()


def t_send_timeout_and_shut_rd():
    p, port = native(
        """
import socket, time
l = socket.socket(); l.bind(("127.0.0.1", 0)); l.listen(1)
print(l.getsockname()[1], flush=True)
c, _ = l.accept()
time.sleep(8)
"""
    )
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.settimeout(None)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", 0, 300000))
    chunk = b"x" * 65536
    err, t_last, total = 0, 0.0, 0
    deadline = time.monotonic() + 6
    while time.monotonic() < deadline:
        t0 = time.monotonic()
        try:
            total += s.send(chunk)
        except OSError as e:
            err, t_last = e.errno, time.monotonic() - t0
            break
    check("SO_SNDTIMEO: send fails with EAGAIN once buffers are full", err == errno.EAGAIN and 0.2 < t_last < 2,
          (err, t_last, total))
    s.shutdown(socket.SHUT_RD)
    check("recv after SHUT_RD: 0 bytes", s.recv(10) == b"")
    s.close()
    p.kill()
    p.wait(10)


def t_sendfile():
    import tempfile
    data = os.urandom(3 << 20)
    with tempfile.TemporaryFile() as f:
        f.write(data)
        f.flush()
        for how in ("socket.sendfile", "os.sendfile+offset"):
            p, port = native(HASHER)
            s = socket.create_connection(("127.0.0.1", port), timeout=20)
            s.settimeout(None)
            if how == "socket.sendfile":
                f.seek(0)
                n = s.sendfile(f)
                check("sendfile: file position advanced", f.tell() == len(data), f.tell())
            else:
                n, off = 0, 1000
                while off < len(data):
                    k = os.sendfile(s.fileno(), f.fileno(), off, len(data) - off)
                    if k == 0:
                        break
                    off += k
                    n += k
            s.shutdown(socket.SHUT_WR)
            res = s.recv(200).decode().split()
            want = data if how == "socket.sendfile" else data[1000:]
            check(f"{how}: all bytes, hash", n == len(want) and res == [str(len(want)), hashlib.sha256(want).hexdigest()], (n, res))
            s.close()
            p.wait(10)


def t_canal_to_canal():
    l = socket.socket()
    l.bind(("127.0.0.1", 0))
    l.listen(1)
    c = socket.create_connection(l.getsockname(), timeout=5)
    a, _ = l.accept()
    c.sendall(b"ping")
    check("canal<->canal", a.recv(4) == b"ping")
    a.close()
    check("peer close -> EOF", c.recv(10) == b"")
    c.close()
    l.close()


def main():
    probe = socket.socket()
    if not NATIVE and not is_canal(probe):
        print("skipped: not running under libcanal with a canald (sockets are kernel sockets)")
        sys.exit(77)
    probe.close()
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    for t in [t_tcp_client, t_refused, t_nonblocking_connect_ok, t_epipe_sigpipe, t_udp,
              t_poll_mixed, t_fork_shared, t_fork_exit_exec, t_misc_errors, t_send_timeout_and_shut_rd, t_sendfile, t_canal_to_canal, t_server_and_bulk, t_bulk_out]:
        try:
            t()
        except Exception as e:  # a crash in one group must not hide the others
            check(t.__name__ + " (raised)", False, repr(e))
    print(f"{len(FAILS)} failed: {FAILS}" if FAILS else "all passed")
    sys.exit(1 if FAILS else 0)


if __name__ == "__main__":
    main()
