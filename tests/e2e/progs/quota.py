#!/usr/bin/env python3
"""Loads for the quota tests (tests/e2e/test_quota.py), stdlib only.

  quota.py serve                     threaded TCP echo on 127.0.0.1; prints "READY <port>"
  quota.py storm PORT SECS THREADS   connect+close to PORT as fast as THREADS threads can
                                     for SECS; prints "CONNECTS <n> <seconds>"
  quota.py rr PORT SECS              one connection, 1-byte ping-pong for SECS; prints
                                     "RR <count> <p50 ms> <p99 ms> <max ms>"
  quota.py sockets N                 N socket()+bind()+close(); prints "SOCKETS <n> <seconds>",
                                     then waits for stdin to close
  quota.py connect HOST PORT         one connect; prints "OK" or "ERR <errno name> <message>"
"""
import errno
import socket
import sys
import threading
import time


def serve():
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", 0))
    ls.listen(1024)
    print("READY", ls.getsockname()[1], flush=True)

    def echo(c):
        with c:
            while True:
                b = c.recv(65536)
                if not b:
                    return
                c.sendall(b)

    while True:
        c, _ = ls.accept()
        threading.Thread(target=echo, args=(c,), daemon=True).start()


def storm(port, secs, threads):
    end = time.monotonic() + secs
    counts = [0] * threads

    def run(i):
        while time.monotonic() < end:
            s = socket.socket()
            try:
                s.connect(("127.0.0.1", port))
                counts[i] += 1
            finally:
                s.close()

    t0 = time.monotonic()
    ts = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    print("CONNECTS", sum(counts), "%.3f" % (time.monotonic() - t0), flush=True)


def rr(port, secs):
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    lat = []
    end = time.monotonic() + secs
    while time.monotonic() < end:
        t = time.perf_counter()
        s.sendall(b"x")
        if s.recv(1) != b"x":
            raise SystemExit("echo lost")
        lat.append(time.perf_counter() - t)
    lat.sort()
    q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] * 1e3  # noqa: E731
    print("RR", len(lat), "%.3f %.3f %.3f" % (q(0.5), q(0.99), lat[-1] * 1e3), flush=True)


def sockets(n):
    t0 = time.monotonic()
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.close()
    print("SOCKETS", n, "%.3f" % (time.monotonic() - t0), flush=True)
    sys.stdin.read()


def connect(host, port):
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        s.connect((host, port))
        print("OK", flush=True)
    except OSError as e:
        print("ERR", errno.errorcode.get(e.errno, e.errno), e.strerror, flush=True)


if __name__ == "__main__":
    a = sys.argv[1:]
    {"serve": lambda: serve(),
     "storm": lambda: storm(int(a[1]), float(a[2]), int(a[3])),
     "rr": lambda: rr(int(a[1]), float(a[2])),
     "sockets": lambda: sockets(int(a[1])),
     "connect": lambda: connect(a[1], int(a[2]))}[a[0]]()
