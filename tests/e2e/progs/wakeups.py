"""Sleeps of a server that waits for each request (the client takes its time), per
exchange: natively one (it sleeps for the request). A canal peer that woke it for
nothing — reading the answer freed room the server never asked for — made it two.

Usage: wakeups.py block|poll|epoll EXCHANGES. Prints "MODE SLEEPS" with SLEEPS the
server's voluntary context switches per exchange (getrusage), two decimals.
"""
import os
import resource
import select
import socket
import sys
import time

mode, n = sys.argv[1], int(sys.argv[2])
ls = socket.socket()
ls.bind(("127.0.0.1", 0))
ls.listen(1)
port = ls.getsockname()[1]
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    c, _ = ls.accept()
    ls.close()
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if mode == "poll":
        p = select.poll()
        p.register(c, select.POLLIN)
        wait = lambda: p.poll()
    elif mode == "epoll":
        ep = select.epoll()
        ep.register(c, select.EPOLLIN)
        wait = lambda: ep.poll()
    else:
        wait = lambda: None
    c.recv(1)  # the client's first byte: both ends are up
    before = resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw
    for _ in range(n):
        wait()
        c.sendall(c.recv(64))
    slept = resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw - before
    os.write(w, b"%d\n" % slept)
    os._exit(0)
ls.close()
c = socket.create_connection(("127.0.0.1", port))
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
c.sendall(b"!")
for _ in range(n):
    c.sendall(b"x" * 64)
    time.sleep(0.003)  # the server answers, then sleeps for the next request
    got = b""
    while len(got) < 64:
        got += c.recv(64 - len(got))
    time.sleep(0.003)  # reading the answer must not wake it
c.close()
os.waitpid(pid, 0)
print(f"{mode} {int(os.read(r, 100)) / n:.2f}")
