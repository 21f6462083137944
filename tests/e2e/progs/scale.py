"""Many connections, a listener that does not accept, and a server at its descriptor
quota: the same program natively and under canal (tests/e2e/test_scale.py).

  server PORT N     listen, accept N clients, echo one byte on each: "SERVED N"; then
                    read one more byte from every client (their close) and exit
  client PORT N [hold]
                    open N connections, send a byte on each, check every echo:
                    "ECHOED N"; then (hold: after a line on stdin) close them all
  backlog PORT B    listen(B) and never accept: "LISTEN", then wait for stdin
  probe PORT M      M non-blocking connects, 2 s to complete: "ESTABLISHED k SERVER
                    e r" (the server side's connections on PORT, from /proc/net/tcp:
                    e established, r half-open in SYN_RECV)
  quota PORT        accept until accept fails: "STOPPED k errno"; then close 5
                    accepted connections and accept again: "AGAIN n" (n accepted)
  epserver PORT ET  one epoll set over the listener and every connection (ET=1:
                    edge-triggered, drained to EAGAIN), echoing, until every client
                    closed: "SERVED bytes closed" and "EVLOG yes|no" (whether canal's
                    event log served the set); exits 1 if 30 s pass without an event
  epclient PORT N   N connections, then rounds of a byte on 64 of them at a time, each
                    echo checked: "ECHOED n"; then close them all
  forkserver PORT N accept N clients and echo one byte on each: "SERVED N"; then run
                    a program (fork and exec) while holding them all: "RAN"; then, after
                    a line on stdin, close them all
  eofclient PORT N  as client, but then wait for the server's close on every
                    connection: "EOF n" (n connections saw end-of-file within 20 s)
"""

import errno
import os
import resource
import select
import socket
import sys
import time


def raise_nofile(want=None):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard if want is None else want, hard))


def listener(port, backlog):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", port))
    s.listen(backlog)
    return s


def server(port, n):
    l = listener(port, 4096)
    print("LISTEN", flush=True)
    conns = [l.accept()[0] for _ in range(n)]
    for c in conns:
        b = c.recv(1)
        assert b == b"x", b
        c.sendall(b)
    print(f"SERVED {len(conns)}", flush=True)
    for c in conns:
        c.recv(1)  # the client's close


def client(port, n, hold=False):
    conns = []
    for i in range(n):
        s = socket.socket()
        s.connect(("127.0.0.1", port))
        conns.append(s)
    for s in conns:
        s.sendall(b"x")
    ok = sum(1 for s in conns if s.recv(1) == b"x")
    print(f"ECHOED {ok}", flush=True)
    if hold:
        sys.stdin.readline()
    for s in conns:
        s.close()


def forkserver(port, n):
    import subprocess
    l = listener(port, 4096)
    print("LISTEN", flush=True)
    conns = [l.accept()[0] for _ in range(n)]
    for c in conns:
        assert c.recv(1) == b"x"
        c.sendall(b"x")
    print(f"SERVED {len(conns)}", flush=True)
    subprocess.run(["true"], check=True)
    print("RAN", flush=True)
    sys.stdin.readline()
    for c in conns:
        c.close()


def eofclient(port, n):
    conns = [socket.create_connection(("127.0.0.1", port)) for _ in range(n)]
    for s in conns:
        s.sendall(b"x")
    ok = sum(1 for s in conns if s.recv(1) == b"x")
    print(f"ECHOED {ok}", flush=True)
    eof = 0
    deadline = time.monotonic() + 20
    for s in conns:
        s.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            eof += s.recv(1) == b""
        except socket.timeout:
            pass
    print(f"EOF {eof}", flush=True)


def backlog(port, b):
    l = listener(port, b)
    print("LISTEN", flush=True)
    sys.stdin.readline()
    l.close()


def probe(port, m):
    socks = []
    for _ in range(m):
        s = socket.socket()
        s.setblocking(False)
        try:
            s.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        socks.append(s)
    pending = {s.fileno(): s for s in socks}
    done = 0
    deadline = time.monotonic() + 2.0
    p = select.poll()
    for fd in pending:
        p.register(fd, select.POLLOUT)
    while pending and time.monotonic() < deadline:
        for fd, _ in p.poll(max(0, int((deadline - time.monotonic()) * 1000))):
            s = pending.pop(fd)
            p.unregister(fd)
            if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                done += 1
    est, syn_recv = server_side(port)
    print(f"ESTABLISHED {done} SERVER {est} {syn_recv}", flush=True)


def server_side(port):
    """(established, SYN_RECV) connections whose local port is `port`: what the
    listening side holds, whatever the clients think (a client whose SYN-ACK came
    while its server's accept queue was full counts itself connected)."""
    est = syn_recv = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for row in f.readlines()[1:]:
                cols = row.split()
                if int(cols[1].rsplit(":", 1)[1], 16) != port:
                    continue
                est += cols[3] == "01"
                syn_recv += cols[3] == "03"
    return est, syn_recv


def quota(port):
    l = listener(port, 4096)
    print("LISTEN", flush=True)
    conns = []
    while True:
        try:
            conns.append(l.accept()[0])
        except OSError as e:
            print(f"STOPPED {len(conns)} {errno.errorcode.get(e.errno, e.errno)}", flush=True)
            break
    for c in conns[:5]:
        c.close()
    again = 0
    l.settimeout(10)
    for _ in range(5):
        conns.append(l.accept()[0])
        again += 1
    print(f"AGAIN {again}", flush=True)
    sys.stdin.readline()


def epserver(port, et):
    l = listener(port, 4096)
    l.setblocking(False)
    ep = select.epoll()
    ep.register(l.fileno(), select.EPOLLIN)
    flags = select.EPOLLIN | (select.EPOLLET if et else 0)
    conns, served, closed, accepted = {}, 0, 0, 0
    print("LISTEN", flush=True)
    while accepted == 0 or conns:
        events = ep.poll(30)
        if not events:
            print(f"STUCK served={served} open={len(conns)}", flush=True)
            sys.exit(1)
        for fd, _ in events:
            if fd == l.fileno():
                while True:
                    try:
                        c, _ = l.accept()
                    except BlockingIOError:
                        break
                    c.setblocking(False)
                    conns[c.fileno()] = c
                    ep.register(c.fileno(), flags)
                    accepted += 1
                continue
            c = conns[fd]
            while True:
                try:
                    b = c.recv(4096)
                except BlockingIOError:
                    break
                if not b:
                    ep.unregister(fd)
                    del conns[fd]
                    c.close()
                    closed += 1
                    break
                c.sendall(b)
                served += len(b)
                if not et:
                    break  # level-triggered: the rest is reported again
    print(f"SERVED {served} {closed}", flush=True)
    mapped = any("canal-evlog" in line for line in open("/proc/self/maps"))
    print(f"EVLOG {'yes' if mapped else 'no'}", flush=True)


def epclient(port, n):
    import random
    conns = [socket.create_connection(("127.0.0.1", port)) for _ in range(n)]
    for s in conns:
        s.settimeout(20)
    rng = random.Random(n)
    echoed = 0
    for r in range(150):
        batch = rng.sample(conns, min(64, n))
        for i, s in enumerate(batch):
            s.sendall(bytes([65 + (r + i) % 26]))
        for i, s in enumerate(batch):
            assert s.recv(1) == bytes([65 + (r + i) % 26])
            echoed += 1
    print(f"ECHOED {echoed}", flush=True)
    for s in conns:
        s.close()


def main():
    mode, port = sys.argv[1], int(sys.argv[2])
    arg = int(sys.argv[3]) if len(sys.argv) > 3 else 0
    if mode == "quota":
        raise_nofile(int(os.environ.get("SCALE_NOFILE", "0")) or None)
    else:
        raise_nofile()
    hold = sys.argv[4:5] == ["hold"]
    {"server": server, "client": lambda p, a: client(p, a, hold), "backlog": backlog, "probe": probe,
     "epserver": epserver, "epclient": epclient, "forkserver": forkserver,
     "eofclient": eofclient}.get(
        mode, lambda p, a: quota(p))(port, arg)


if __name__ == "__main__":
    main()
