"""Selection policy under libcanal: run with CANAL_EXCLUDE=127.0.0.1:<excluded port>
as argv[1]/env by tests/preload.rs. Sockets to the excluded port are kernel sockets,
others are canal's; both carry data; options set before the hand-off survive it."""
import os
import socket
import sys
import threading

FAILS = []


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
    link = os.readlink(f"/proc/self/fd/{s.fileno()}")
    return link.startswith("socket:[") and link[8:-1] in unix_inodes()


def echo_server(l):
    def run():
        while True:
            try:
                c, _ = l.accept()
            except OSError:
                return
            data = c.recv(100)
            c.sendall(data)
            c.close()
    threading.Thread(target=run, daemon=True).start()


def main():
    excluded_port = int(sys.argv[1])
    # A kernel listener on the excluded port (bind to an excluded address → kernel).
    l = socket.socket()
    l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    check("fresh socket is canal's", is_canal(l))
    l.bind(("127.0.0.1", excluded_port))
    check("bind to an excluded address hands the socket to the kernel", not is_canal(l))
    check("the option set before the hand-off survives",
          l.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR) == 1)
    l.listen(8)
    echo_server(l)

    # A canal listener on another port.
    l2 = socket.socket()
    l2.bind(("127.0.0.1", 0))
    check("bind elsewhere stays canal", is_canal(l2))
    l2.listen(8)
    echo_server(l2)

    c = socket.socket()
    c.settimeout(5)
    c.connect(("127.0.0.1", excluded_port))
    check("connect to the excluded port: kernel socket", not is_canal(c))
    check("same descriptor number kept", c.fileno() >= 0)
    c.sendall(b"kernel")
    check("data over the kernel socket", c.recv(100) == b"kernel")
    import fcntl
    check("O_NONBLOCK (Python's timeout mode) set before the hand-off survives",
          fcntl.fcntl(c.fileno(), fcntl.F_GETFL) & os.O_NONBLOCK != 0)
    c.close()

    import select
    c = socket.socket()
    c.setblocking(False)
    ep = select.epoll()
    ep.register(c.fileno(), select.EPOLLOUT)
    try:
        c.connect(("127.0.0.1", excluded_port))
    except BlockingIOError:
        pass
    check("non-blocking connect to the excluded port: kernel socket", not is_canal(c))
    ev = ep.poll(5)
    check("the epoll registration made before the hand-off reports EPOLLOUT",
          len(ev) == 1 and ev[0][1] & select.EPOLLOUT, ev)
    ep.close()
    c.close()

    c = socket.socket()
    c.connect(l2.getsockname())
    check("connect elsewhere: canal socket", is_canal(c))
    c.sendall(b"canal")
    check("data over the canal socket", c.recv(100) == b"canal")
    c.close()

    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    r = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    r.bind(("127.0.0.1", excluded_port))
    check("UDP bind to the excluded port: kernel", not is_canal(r))
    u.sendto(b"dgram", ("127.0.0.1", excluded_port))
    check("UDP sendto the excluded port: kernel", not is_canal(u))
    r.settimeout(5)
    check("datagram arrives", r.recvfrom(100)[0] == b"dgram")
    print(f"{len(FAILS)} failed: {FAILS}" if FAILS else "all passed")
    sys.exit(1 if FAILS else 0)


if __name__ == "__main__":
    main()
