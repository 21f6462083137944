#!/usr/bin/env python3
"""TCP semantics a short-circuited connection must keep (canal protocol §8), checked
from both ends. Runs natively too (that is how its expectations are validated).

  shortcut.py serve [--port P]
      Listen on 127.0.0.1:P (0: any), print "READY <port>", serve until killed. Each
      connection starts with one command byte:
        N  send back "<local ip> <local port> <peer ip> <peer port>\\n", then close
        H  echo everything until EOF, then close (the client half-closed)
        R  wait 0.3 s without reading, then close with the client's bytes unread (RST)
        F  close at once (FIN; nothing unread)
        B  print "HOLDING" and block without reading until killed
  shortcut.py check --port P
      Run the N, H, R, F, poll-after-F and non-blocking-connect checks; print "OK <what>"
      per check.
  shortcut.py options [--spin N]
      Within this one process (under canal: a short-circuit between two sockets of
      one guest): the options a connection keeps — inherited from the listener,
      read back, refused with the kernel's errno — as "OK kept options"; with
      --spin, then print "BEFORE", wait 1 s, set and read TCP_NODELAY N times, print
      "AFTER" and sleep until killed.
  shortcut.py hold --port P
      Connect, send B, print "CONNECTED", then block in recv() until the peer goes away;
      print "PEER-GONE eof" or "PEER-GONE reset" (exit 0), fail after 20 s.

Exit status 0 on success; on failure a message on stderr and exit status 1."""

import argparse
import errno
import hashlib
import os
import select
import socket
import sys
import threading
import time

HOST = "127.0.0.1"


def fail(msg):
    print(f"FAIL {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


def serve_conn(c):
    try:
        cmd = c.recv(1)
        if cmd == b"N":
            l, p = c.getsockname(), c.getpeername()
            c.sendall(f"{l[0]} {l[1]} {p[0]} {p[1]}\n".encode())
        elif cmd == b"H":
            while True:
                b = c.recv(65536)
                if not b:
                    break
                c.sendall(b)
        elif cmd == b"O":
            c.sendall((accepted_options(c) + "\n").encode())
        elif cmd == b"R":
            time.sleep(0.3)
        elif cmd == b"B":
            print("HOLDING", flush=True)
            while True:
                time.sleep(60)
    finally:
        c.close()


def accepted_options(c):
    """What an accepted, connected stream answers to option and address calls: set
    and read back TCP_NODELAY and SO_KEEPALIVE, TCP_INFO's state, and the errno of
    bind and listen (a connected socket refuses both with EINVAL)."""
    out = []
    for level, name in ((socket.IPPROTO_TCP, socket.TCP_NODELAY), (socket.SOL_SOCKET, socket.SO_KEEPALIVE)):
        before = c.getsockopt(level, name)
        c.setsockopt(level, name, 1)
        out.append(f"{before}>{c.getsockopt(level, name)}")
    out.append(f"state={c.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)[0]}")
    for call in (lambda: c.bind((HOST, 0)), lambda: c.listen(1)):
        try:
            call()
            out.append("ok")
        except OSError as e:
            out.append(errno.errorcode.get(e.errno, str(e.errno)))
    return " ".join(out)


def serve(args):
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((HOST, args.port))
    ls.listen(16)
    print(f"READY {ls.getsockname()[1]}", flush=True)
    while True:
        c, _ = ls.accept()
        threading.Thread(target=serve_conn, args=(c,), daemon=True).start()


def connect(port):
    s = socket.create_connection((HOST, port), timeout=10)
    s.settimeout(10)
    return s


def recv_all(s):
    out = []
    while True:
        b = s.recv(65536)
        if not b:
            return b"".join(out)
        out.append(b)


def check_names(port):
    s = connect(port)
    s.sendall(b"N")
    line = recv_all(s).decode().split()
    if len(line) != 4:
        fail(f"names: server answered {line!r}")
    srv_local = (line[0], int(line[1]))
    srv_peer = (line[2], int(line[3]))
    my_local, my_peer = s.getsockname(), s.getpeername()
    if my_peer != srv_local or my_local != srv_peer:
        fail(f"names: client {my_local}->{my_peer}, server {srv_local}<-{srv_peer}")
    if my_peer != (HOST, port) or my_local[1] == 0 or my_local[1] == port:
        fail(f"names: client {my_local}->{my_peer} (port {port})")
    s.close()
    print(f"OK names client {my_local[0]}:{my_local[1]} <-> server {srv_local[0]}:{srv_local[1]}")


def check_half_close(port):
    s = connect(port)
    data = os.urandom(3 << 20)
    s.sendall(b"H")
    got = []

    def reader():
        got.append(recv_all(s))

    t = threading.Thread(target=reader)
    t.start()
    s.sendall(data)
    s.shutdown(socket.SHUT_WR)
    try:
        s.send(b"x")
        fail("half-close: send after SHUT_WR succeeded")
    except BrokenPipeError:
        pass
    t.join(30)
    if t.is_alive() or not got:
        fail("half-close: no EOF from the server")
    if hashlib.sha256(got[0]).digest() != hashlib.sha256(data).digest():
        fail(f"half-close: echoed {len(got[0])} bytes differ from the {len(data)} sent")
    if s.recv(10) != b"":
        fail("half-close: recv after EOF is not 0 again")
    s.close()
    print(f"OK half-close {len(data)} bytes echoed after SHUT_WR, then EOF")


def check_reset(port):
    s = connect(port)
    s.sendall(b"R" + b"u" * 1000)  # the server closes with these unread: RST
    try:
        b = s.recv(10)
        fail(f"reset: recv returned {b!r}, not ECONNRESET")
    except ConnectionResetError:
        pass
    # After the reset: EOF (Linux reports the error once).
    if s.recv(10) != b"":
        fail("reset: second recv is not EOF")
    try:
        s.send(b"x")
        fail("reset: send after reset succeeded")
    except (BrokenPipeError, ConnectionResetError):
        pass
    s.close()
    print("OK reset: ECONNRESET once, then EOF, send fails")


def check_fin(port):
    s = connect(port)
    s.sendall(b"F")
    if s.recv(10) != b"":
        fail("fin: no EOF after the server closed")
    # Linux: the first send after the peer closed still succeeds (the bytes reach a
    # peer that has no socket for them, which answers with a reset); a later one fails
    # with EPIPE, and poll then says HUP.
    try:
        s.send(b"y")
    except OSError as e:
        fail(f"fin: the first send after the peer's close failed ({e}); natively it succeeds")
    for i in range(5):
        try:
            s.send(b"y")
        except (BrokenPipeError, ConnectionResetError):
            break
        time.sleep(0.1)
    else:
        fail("fin: sends to a closed peer keep succeeding")
    got = readiness(s)
    if "HUP" not in got[0] or "HUP" not in got[1]:
        fail(f"fin: poll/epoll after the reset: {got}, natively with HUP")
    s.close()
    print("OK fin: EOF, the first send succeeds, a later one fails, then HUP")


def check_reset_after_fin(port):
    """The reset a CLOSE_WAIT send provokes is the kernel's tcp_reset: poll says ERR
    (and HUP) and SO_ERROR says EPIPE, once; recv still says EOF (the FIN came first)
    and leaves the error; a later send fails with EPIPE."""
    everything = {"IN", "OUT", "RDHUP", "HUP", "ERR"}
    for read_first in (False, True):
        s = connect(port)
        s.sendall(b"F")
        if s.recv(10) != b"":
            fail("reset after fin: no EOF after the server closed")
        s.send(b"y")
        deadline = time.monotonic() + 5
        while "ERR" not in readiness(s)[0] and time.monotonic() < deadline:
            time.sleep(0.01)
        got = readiness(s)
        if got != (everything, everything):
            fail(f"reset after fin: poll/epoll {got}, natively {everything}")
        if read_first:
            if s.recv(10) != b"" or readiness(s) != (everything, everything):
                fail(f"reset after fin: recv then poll {readiness(s)}, natively EOF and {everything}")
        err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if err != errno.EPIPE:
            fail(f"reset after fin: SO_ERROR {err}, natively EPIPE ({errno.EPIPE})")
        got = readiness(s)
        if got != (everything - {"ERR"}, everything - {"ERR"}):
            fail(f"reset after fin: poll/epoll once the error is taken {got}")
        if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) != 0 or s.recv(10) != b"":
            fail("reset after fin: the error is reported more than once")
        try:
            s.send(b"z")
            fail("reset after fin: a later send succeeded")
        except BrokenPipeError:
            pass
        s.close()
    print("OK reset after fin: ERR and SO_ERROR EPIPE once, recv EOF, then sends EPIPE")


def readiness(s):
    """What poll and epoll report for s now, each as a set of names."""
    p = select.poll()
    p.register(s, select.POLLIN | select.POLLOUT | select.POLLRDHUP)
    ev = p.poll(0)
    e = select.epoll()
    e.register(s, select.EPOLLIN | select.EPOLLOUT | select.EPOLLRDHUP)
    eev = e.poll(0)
    e.close()

    def names(m, prefix):
        return {n for n in ("IN", "OUT", "RDHUP", "HUP", "ERR") if m & getattr(select, prefix + n)}
    return names(ev[0][1] if ev else 0, "POLL"), names(eev[0][1] if eev else 0, "EPOLL")


def check_poll_after_fin(port):
    """The peer's orderly close leaves this end in CLOSE_WAIT: readable (EOF),
    writable, RDHUP, no HUP; HUP once this end shuts down writing too."""
    s = connect(port)
    s.sendall(b"F")
    select.select([s], [], [], 10)
    time.sleep(0.3)  # whatever follows the FIN (canald's flags) has landed
    closed_wait = {"IN", "OUT", "RDHUP"}
    got = readiness(s)
    if got != (closed_wait, closed_wait):
        fail(f"poll/epoll after the peer's close: {got}, natively {closed_wait}")
    if s.recv(10) != b"":
        fail("poll after fin: no EOF")
    got = readiness(s)
    if got != (closed_wait, closed_wait):
        fail(f"poll/epoll after reading EOF: {got}, natively {closed_wait}")
    s.shutdown(socket.SHUT_WR)
    time.sleep(0.1)
    both = closed_wait | {"HUP"}
    got = readiness(s)
    if got != (both, both):
        fail(f"poll/epoll after SHUT_WR too: {got}, natively {both}")
    s.close()
    print("OK poll after the peer's close: IN OUT RDHUP, HUP only after SHUT_WR")


def check_nonblocking_connect(port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setblocking(False)
    r = s.connect_ex((HOST, port))
    if r not in (0, errno.EINPROGRESS):
        fail(f"nonblocking connect: {errno.errorcode.get(r, r)}")
    _, w, _ = select.select([], [s], [], 10)
    if not w:
        fail("nonblocking connect: not writable within 10 s")
    err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    if err != 0:
        fail(f"nonblocking connect: SO_ERROR {err}")
    s.setblocking(True)
    s.sendall(b"N")
    s.settimeout(10)
    if not recv_all(s):
        fail("nonblocking connect: no answer")
    s.close()
    print(f"OK nonblocking connect ({'EINPROGRESS' if r else 'immediate'}), writable, SO_ERROR 0")


def check_accepted_options(port):
    s = connect(port)
    s.sendall(b"O")
    got = recv_all(s).decode().strip()
    want = "0>1 0>1 state=1 EINVAL EINVAL"
    if got != want:
        fail(f"accepted end's options: {got!r}, natively {want!r}")
    s.close()
    print(f"OK accepted end's options and names: {got}")


def kept_options():
    """A connection's TCP_NODELAY, SO_KEEPALIVE and keepalive timers: the accepted end
    inherits the listener's, values read back, bad ones fail as the kernel fails them
    and change nothing. Returns (report, client end, accepted end, listener)."""
    T, S = socket.IPPROTO_TCP, socket.SOL_SOCKET
    ls = socket.socket()
    ls.bind((HOST, 0))
    ls.listen(4)
    ls.setsockopt(T, socket.TCP_NODELAY, 1)
    ls.setsockopt(S, socket.SO_KEEPALIVE, 1)
    ls.setsockopt(T, socket.TCP_KEEPIDLE, 30)
    c = socket.create_connection(ls.getsockname(), timeout=10)
    a, _ = ls.accept()
    out = ["accepted", *(str(a.getsockopt(T, n)) for n in (socket.TCP_NODELAY, socket.TCP_KEEPIDLE))]
    out.append(str(a.getsockopt(S, socket.SO_KEEPALIVE)))
    out += ["client", str(c.getsockopt(T, socket.TCP_NODELAY)), str(c.getsockopt(S, socket.SO_KEEPALIVE))]
    # A timer never set: the network namespace's default.
    with open("/proc/sys/net/ipv4/tcp_keepalive_time") as f:
        default = int(f.read())
    out.append("idle=default" if c.getsockopt(T, socket.TCP_KEEPIDLE) == default else "idle!=default")

    def err(f):
        try:
            f()
            return "ok"
        except OSError as e:
            return errno.errorcode.get(e.errno, str(e.errno))

    for name, v in (("TCP_KEEPIDLE", 0), ("TCP_KEEPIDLE", 32768), ("TCP_KEEPINTVL", -1),
                    ("TCP_KEEPCNT", 128), ("TCP_KEEPCNT", 127), ("TCP_KEEPINTVL", 32767)):
        out.append(f"{name}={v}:{err(lambda: c.setsockopt(T, getattr(socket, name), v))}")
    out.append(f"short:{err(lambda: c.setsockopt(T, socket.TCP_NODELAY, bytes([1, 0])))}")
    out.append(f"short:{err(lambda: c.setsockopt(S, socket.SO_KEEPALIVE, bytes([1])))}")
    out.append(f"long:{err(lambda: c.setsockopt(T, socket.TCP_NODELAY, bytes([1] + [0] * 7)))}")
    out.append(f"nodelay={c.getsockopt(T, socket.TCP_NODELAY)}")
    out.append(f"cnt={c.getsockopt(T, socket.TCP_KEEPCNT)} intvl={c.getsockopt(T, socket.TCP_KEEPINTVL)}")
    out.append(f"1byte={c.getsockopt(T, socket.TCP_NODELAY, 1).hex()}")
    c.setsockopt(T, socket.TCP_NODELAY, 0)
    out.append(f"off={c.getsockopt(T, socket.TCP_NODELAY)}")
    return " ".join(out), c, a, ls


KEPT_NATIVE = (
    "accepted 1 30 1 client 0 0 idle=default TCP_KEEPIDLE=0:EINVAL TCP_KEEPIDLE=32768:EINVAL "
    "TCP_KEEPINTVL=-1:EINVAL TCP_KEEPCNT=128:EINVAL TCP_KEEPCNT=127:ok TCP_KEEPINTVL=32767:ok "
    "short:EINVAL short:EINVAL long:ok nodelay=1 cnt=127 intvl=32767 1byte=01 off=0"
)


def check_kept_options():
    got, c, a, ls = kept_options()
    if got != KEPT_NATIVE:
        fail(f"kept options:\n  got      {got}\n  natively {KEPT_NATIVE}")
    for s in (c, a, ls):
        s.close()
    print("OK kept options: inherited, read back, refused as natively")


def options(args):
    check_kept_options()
    if args.spin:
        _, c, a, ls = kept_options()
        print("BEFORE", flush=True)
        time.sleep(1)
        for i in range(args.spin):
            c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, i & 1)
            if c.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != i & 1:
                fail(f"TCP_NODELAY did not read back at round {i}")
        print("AFTER", flush=True)
        time.sleep(60)


def check(args):
    check_names(args.port)
    check_accepted_options(args.port)
    check_half_close(args.port)
    check_reset(args.port)
    check_fin(args.port)
    check_reset_after_fin(args.port)
    check_poll_after_fin(args.port)
    check_nonblocking_connect(args.port)
    check_kept_options()
    print("OK all")


def hold(args):
    s = connect(args.port)
    s.settimeout(20)
    s.sendall(b"B")
    print("CONNECTED", flush=True)
    try:
        b = s.recv(10)
    except ConnectionResetError:
        print("PEER-GONE reset", flush=True)
        return
    except socket.timeout:
        fail("hold: the peer's death was not seen within 20 s")
    if b:
        fail(f"hold: unexpected bytes {b!r}")
    print("PEER-GONE eof", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["serve", "check", "hold", "options"])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--spin", type=int, default=0)
    args = ap.parse_args()
    {"serve": serve, "check": check, "hold": hold, "options": options}[args.mode](args)


if __name__ == "__main__":
    main()
