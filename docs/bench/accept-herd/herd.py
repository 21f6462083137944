#!/usr/bin/env python3
"""Servers blocked in accept(), native clients: wake-ups and rate, interleaved.

usage: herd.py CANAL_BEFORE SOCKET_BEFORE CANAL_AFTER SOCKET_AFTER [ROUNDS [SHAPES]]

CANAL_*: a `canal` binary; SOCKET_*: the socket of a canald of the same build,
already running. SHAPES: comma-separated KIND=N (threads=16: 16 threads in one
process; processes=8: 8 forked processes), by default threads=16,threads=200,
processes=8. For each shape and round, the kernel, the build before and the build after each serve
one client after another (connect, 1 byte back, close; the client is this script,
outside canal). Prints one line per run: connections/s and the server's voluntary
context switches per connection (all its threads and processes: who woke).
"""
import os
import socket
import subprocess
import sys
import time

# The server: tests/e2e/progs/acceptors.py (also the suite's blocked-acceptors test).
SERVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "tests", "e2e",
                      "progs", "acceptors.py")


def switches(pids):
    n = 0
    for pid in pids:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                n += sum(int(l.split()[1]) for l in f if l.startswith("voluntary_ctxt_switches"))
    return n


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(prefix, port, kind, n, clients):
    p = subprocess.Popen(prefix + [sys.executable, SERVER, str(port), kind, str(n)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline().split()
    if line[:1] != ["LISTEN"]:
        raise SystemExit(f"the server did not start ({' '.join(prefix[:1])})")
    pids = [int(x) for x in line[1:]]
    time.sleep(1.0)  # every thread asleep in accept()
    before = switches(pids)
    t = time.monotonic()
    for _ in range(clients):
        with socket.create_connection(("127.0.0.1", port)) as c:
            assert c.recv(1) == b"x"
    took = time.monotonic() - t
    woke = switches(pids) - before
    p.stdin.write("\n")
    p.stdin.flush()
    p.wait(10)
    return clients / took, woke / clients


def main():
    before = [sys.argv[1], "run", "--socket", sys.argv[2], "--"]
    after = [sys.argv[3], "run", "--socket", sys.argv[4], "--"]
    rounds = int(sys.argv[5]) if len(sys.argv) > 5 else 5
    shapes = sys.argv[6] if len(sys.argv) > 6 else "threads=16,threads=200,processes=8"
    for shape in shapes.split(","):
        kind, n = shape.split("=")
        if kind not in ("threads", "processes") or not n.isdigit():
            raise SystemExit(f"herd.py: bad shape {shape!r} (threads=N or processes=N)")
        n = int(n)
        clients = 1000 if n > 100 else 600
        for r in range(rounds):
            for name, prefix in (("kernel", []), ("before", before), ("after", after)):
                rate, per = run(prefix, free_port(), kind, n, clients)
                print(f"{kind}={n} round={r} {name} rate={rate:.0f}/s switches/conn={per:.2f}", flush=True)


if __name__ == "__main__":
    main()
