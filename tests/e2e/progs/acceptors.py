"""A server blocked in accept(): N threads of one process, or N forked processes, each
taking one connection after another (accept, one byte "x" back, close). Prints
"LISTEN" and the pids of every process once listening; ends (its children killed)
at a line on stdin.

usage: acceptors.py PORT threads|processes N

Used by test_scale.py and docs/bench/accept-herd/herd.py."""
import os
import socket
import sys
import threading

l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", int(sys.argv[1])))
l.listen(64)
kind, n = sys.argv[2], int(sys.argv[3])


def serve():
    while True:
        c, _ = l.accept()
        c.sendall(b"x")
        c.close()


pids = [os.getpid()]
for _ in range(n):
    if kind == "threads":
        threading.Thread(target=serve, daemon=True).start()
    else:
        pid = os.fork()
        if pid == 0:
            serve()
        pids.append(pid)
print("LISTEN", *pids, flush=True)
sys.stdin.readline()
for pid in pids[1:]:
    os.kill(pid, 9)
