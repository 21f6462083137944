"""Listening and unconnected TCP sockets passed to other processes with SCM_RIGHTS,
the ways servers do it; prints one line per case, the same natively and under canal.

- spawn / forkserver: multiprocessing pickles a listener for its workers (uvicorn's
  --workers), which sends it over a Unix socket;
- bound: a bound, not yet listening socket passed on, the receiver listens (node's
  cluster with shared handles);
- follow-block / follow-epoll: a forked worker waits on the listener (accept, or
  epoll) while its parent passes the listener to an unrelated process; both serve;
- follow-bound: a forked holder of a bound socket, passed on and made a listener by
  the receiver, sets TCP_NODELAY (kept by the library, but the kernel's now), asks its
  name, then accepts.
- udp-spawn: multiprocessing's spawn workers get a bound UDP socket (a pre-forked DNS
  or QUIC server; node's cluster shares datagram sockets so) and answer on it;
- udp-pass: a UDP socket that already served a datagram is passed to another process,
  which answers from it, while the sender still sends from its own copy;
- udp-follow: a forked worker blocked in recvfrom while its parent passes the socket
  on: both answer.
"""
import multiprocessing as mp
import os
import select
import socket
import subprocess
import sys


def mp_worker(sock, n):
    for _ in range(n):
        c, _ = sock.accept()
        c.sendall(b"w:" + c.recv(10))
        c.close()


def ask(port, data=b"x"):
    c = socket.create_connection(("127.0.0.1", port), timeout=10)
    c.sendall(data)
    r = c.recv(20)
    c.close()
    return r


def case_mp(method):
    ctx = mp.get_context(method)
    lst = socket.create_server(("127.0.0.1", 0))
    port = lst.getsockname()[1]
    ps = [ctx.Process(target=mp_worker, args=(lst, 2)) for _ in range(2)]
    for p in ps:
        p.start()
    got = [ask(port, b"%d" % i) for i in range(4)]
    for p in ps:
        p.join(20)
    print(method, sorted(got), [p.exitcode for p in ps], flush=True)


RECEIVER = r"""
import select, socket, sys
b = socket.socket(fileno=int(sys.argv[1]))
_, fds, _, _ = socket.recv_fds(b, 10, 1)
lst = socket.socket(fileno=fds[0])
if sys.argv[2] == "bound":
    lst.listen(8)
b.send(b"k")
n = 0
while n < int(sys.argv[3]):
    select.select([lst], [], [], 10)
    try:
        c, _ = lst.accept()
    except BlockingIOError:
        continue
    c.setblocking(True)
    c.sendall(b"B" + c.recv(10))
    c.close()
    n += 1
"""


def receiver(kind, n):
    a, b = socket.socketpair()
    p = subprocess.Popen([sys.executable, "-c", RECEIVER, str(b.fileno()), kind, str(n)],
                         pass_fds=[b.fileno()])
    b.close()
    return a, p


def case_bound():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    a, p = receiver("bound", 3)
    socket.send_fds(a, [b"L"], [s.fileno()])
    a.recv(1)
    s.close()
    got = [ask(port) for _ in range(3)]
    print("bound", got, p.wait(20), flush=True)


def case_follow(how):
    lst = socket.create_server(("127.0.0.1", 0))
    port = lst.getsockname()[1]
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        if how == "epoll":
            lst.setblocking(False)
            ep = select.epoll()
            ep.register(lst.fileno(), select.EPOLLIN)
        os.write(w, b"r")
        n = 0
        while n < 4:
            if how == "epoll":
                ep.poll(10)
                try:
                    c, _ = lst.accept()
                except BlockingIOError:
                    continue
            else:
                c, _ = lst.accept()
            c.setblocking(True)
            c.sendall(b"A" + c.recv(10))
            c.close()
            n += 1
        os._exit(0)
    os.close(w)
    os.read(r, 1)
    a, p = receiver("listening", 4)
    socket.send_fds(a, [b"L"], [lst.fileno()])
    a.recv(1)
    lst.close()
    got = sorted(ask(port)[:1] for _ in range(8))
    _, st = os.waitpid(pid, 0)
    print("follow-" + how, got, os.waitstatus_to_exitcode(st), p.wait(20), flush=True)


def case_follow_bound():
    """A forked holder of a bound socket whose parent passed it on follows at its next
    call of any kind (setsockopt of an option the library keeps, here), then accepts
    on the socket the receiver made a listener."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.read(r, 1)
        # An option the library would keep itself reaches the kernel socket.
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        same = s.getsockname()[1] == port
        same = same and s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
        c, _ = s.accept()
        c.sendall(b"A" + c.recv(10))
        c.close()
        os._exit(0 if same else 3)
    a, p = receiver("bound", 1)
    socket.send_fds(a, [b"L"], [s.fileno()])
    a.recv(1)
    os.write(w, b"g")
    s.close()
    got = sorted(ask(port)[:1] for _ in range(2))
    _, st = os.waitpid(pid, 0)
    print("follow-bound", got, os.waitstatus_to_exitcode(st), p.wait(20), flush=True)


def udp_ask(port, data):
    c = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    c.settimeout(10)
    c.sendto(data, ("127.0.0.1", port))
    r, src = c.recvfrom(64)
    c.close()
    return r, src[1] == port


def udp_serve(sock, n, tag):
    for _ in range(n):
        d, src = sock.recvfrom(64)
        sock.sendto(tag + d, src)


def case_udp_spawn():
    ctx = mp.get_context("spawn")
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.bind(("127.0.0.1", 0))
    port = u.getsockname()[1]
    ps = [ctx.Process(target=udp_serve, args=(u, 2, b"w:")) for _ in range(2)]
    for p in ps:
        p.start()
    got = [udp_ask(port, b"%d" % i) for i in range(4)]
    for p in ps:
        p.join(20)
    print("udp-spawn", sorted(got), [p.exitcode for p in ps], flush=True)


UDP_RECEIVER = r"""
import socket, sys
b = socket.socket(fileno=int(sys.argv[1]))
_, fds, _, _ = socket.recv_fds(b, 10, 1)
u = socket.socket(fileno=fds[0])
same = u.getsockname()[1] == int(sys.argv[2])
b.send(b"k")
for _ in range(int(sys.argv[3])):
    d, src = u.recvfrom(64)
    u.sendto(b"B" + d, src)
sys.exit(0 if same else 3)
"""


def udp_receiver(port, n):
    a, b = socket.socketpair()
    p = subprocess.Popen([sys.executable, "-c", UDP_RECEIVER, str(b.fileno()), str(port), str(n)],
                         pass_fds=[b.fileno()])
    b.close()
    return a, p


def case_udp_pass():
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.bind(("127.0.0.1", 0))
    port = u.getsockname()[1]
    c = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    c.settimeout(10)
    c.sendto(b"before", ("127.0.0.1", port))
    d, src = u.recvfrom(64)
    u.sendto(b"A" + d, src)
    first = c.recvfrom(64)[0]
    a, p = udp_receiver(port, 3)
    socket.send_fds(a, [b"U"], [u.fileno()])
    a.recv(1)
    got = [udp_ask(port, b"%d" % i) for i in range(3)]
    # The sender's own copy is the same socket: its datagram comes from the port.
    u.sendto(b"from the sender", c.getsockname())
    mine, src = c.recvfrom(64)
    print("udp-pass", first, got, mine, src[1] == port, p.wait(20), flush=True)


def case_udp_follow():
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.bind(("127.0.0.1", 0))
    port = u.getsockname()[1]
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.write(w, b"r")
        udp_serve(u, 4, b"A")
        os._exit(0)
    os.close(w)
    os.read(r, 1)
    a, p = udp_receiver(port, 4)
    socket.send_fds(a, [b"U"], [u.fileno()])
    a.recv(1)
    u.close()
    got = sorted((r[:1], ok) for r, ok in (udp_ask(port, b"x") for _ in range(8)))
    _, st = os.waitpid(pid, 0)
    print("udp-follow", got, os.waitstatus_to_exitcode(st), p.wait(20), flush=True)


if __name__ == "__main__":
    case_mp("spawn")
    case_mp("forkserver")
    case_bound()
    case_follow("block")
    case_follow("epoll")
    case_follow_bound()
    case_udp_spawn()
    case_udp_pass()
    case_udp_follow()
    print("done", flush=True)
