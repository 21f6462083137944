"""UDP between two programs, checked as the kernel behaves (run natively too).

serve            an echo server on 127.0.0.1 (READY <port>); a datagram "count?"
                 answers how many datagrams it took; "quit" ends it.
check --port P   the checks below against a running server; prints "OK all".
flood --port P --n N
                 sends N numbered 200-byte datagrams at the pace the server echoes
                 them (windows of 64), checks every echo's bytes and order, prints
                 "FLOOD <n>".
"""
import argparse
import socket
import struct
import sys

ap = argparse.ArgumentParser()
ap.add_argument("role")
ap.add_argument("--port", type=int)
ap.add_argument("--n", type=int, default=1000)
args = ap.parse_args()


# Linux IP_PKTINFO (Python 3.11 has no name for it).
IP_PKTINFO = getattr(socket, "IP_PKTINFO", 8)


def fail(what):
    print("FAIL", what, flush=True)
    sys.exit(1)


def serve():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    print("READY", s.getsockname()[1], flush=True)
    taken = 0
    while True:
        d, a = s.recvfrom(70000)
        if d == b"quit":
            return
        if d == b"count?":
            s.sendto(str(taken).encode(), a)
            continue
        taken += 1
        s.sendto(d, a)


def recv_or_none(s, n=70000, timeout=0.5):
    s.settimeout(timeout)
    try:
        return s.recvfrom(n)
    except socket.timeout:
        return None
    finally:
        s.settimeout(None)


def check(port):
    srv = ("127.0.0.1", port)
    # An unbound sender: autobound by its first send, names its source as the kernel
    # would (127.0.0.1 and the port getsockname reports); boundaries kept, sizes from
    # 0 bytes to the largest IPv4 UDP payload.
    c = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for size in (1, 0, 1000, 65507):
        msg = bytes((i * 7 + size) & 0xFF for i in range(size))
        c.sendto(msg, srv)
        r = recv_or_none(c, timeout=5)
        if r is None:
            fail(f"no echo of {size} bytes")
        if r != (msg, srv):
            fail(f"echo of {size} bytes: {len(r[0])} bytes from {r[1]}")
    if c.getsockname()[0] != "0.0.0.0" or c.getsockname()[1] == 0:
        fail(f"autobound name {c.getsockname()}")
    # A short buffer truncates the datagram and drops the rest (MSG_TRUNC semantics).
    c.sendto(b"x" * 100, srv)
    d, _ = c.recvfrom(10)
    if d != b"x" * 10 or recv_or_none(c, timeout=0.2) is not None:
        fail("truncated datagram")
    print("OK names and sizes", flush=True)

    # A connected socket takes its peer's datagrams only.
    k = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    k.connect(srv)
    other = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    other.sendto(b"stranger", k.getsockname())
    k.send(b"mine")
    r = recv_or_none(k, timeout=5)
    if r is None or r[0] != b"mine":
        fail(f"connected socket got {r}")
    if recv_or_none(k, timeout=0.3) is not None:
        fail("connected socket took a stranger's datagram")
    print("OK connected filter", flush=True)

    # A receiver asking for IP_PKTINFO gets it with every datagram; one bound with
    # SO_REUSEADDR gets its datagrams too.
    p = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    p.setsockopt(socket.IPPROTO_IP, IP_PKTINFO, 1)
    p.bind(("127.0.0.1", 0))
    c.sendto(b"info", p.getsockname())
    p.settimeout(5)
    d, anc, _, frm = p.recvmsg(100, 256)
    if d != b"info" or not any(l == socket.IPPROTO_IP and t == IP_PKTINFO for l, t, _ in anc):
        fail(f"pktinfo: {d} {anc}")
    if frm != ("127.0.0.1", c.getsockname()[1]):
        fail(f"pktinfo sender {frm}")
    q = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    q.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    q.bind(("127.0.0.1", 0))
    c.sendto(b"reuse", q.getsockname())
    r = recv_or_none(q, timeout=5)
    if r is None or r[0] != b"reuse":
        fail(f"reuseaddr receiver got {r}")
    print("OK options", flush=True)

    # A wildcard-bound receiver is reached through any loopback address; the source
    # is 127.0.0.1 whichever 127/8 address was the destination.
    w = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    w.bind(("0.0.0.0", 0))
    wp = w.getsockname()[1]
    for dst in ("127.0.0.1", "127.0.0.7"):
        c.sendto(dst.encode(), (dst, wp))
        r = recv_or_none(w, timeout=5)
        if r != (dst.encode(), ("127.0.0.1", c.getsockname()[1])):
            fail(f"wildcard receiver via {dst}: {r}")
    # IPv6 loopback both ways.
    s6 = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    s6.bind(("::1", 0))
    c6 = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    c6.sendto(b"six", s6.getsockname())
    r = recv_or_none(s6, timeout=5)
    if r is None or r[0] != b"six" or r[1][:2] != ("::1", c6.getsockname()[1]):
        fail(f"ipv6: {r}")
    s6.sendto(b"back", r[1])
    r = recv_or_none(c6, timeout=5)
    if r is None or r[0] != b"back":
        fail(f"ipv6 reply: {r}")
    print("OK wildcard and ipv6", flush=True)
    c.sendto(b"count?", srv)
    r = recv_or_none(c, timeout=5)
    print("SERVED", r[0].decode() if r else "?", flush=True)
    print("OK all", flush=True)


def flood(port, n):
    srv = ("127.0.0.1", port)
    c = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    c.settimeout(10)
    got = 0
    sent = 0
    while got < n:
        while sent < n and sent - got < 64:
            c.sendto(struct.pack("<Q", sent) + bytes([sent & 0xFF]) * 192, srv)
            sent += 1
        d, a = c.recvfrom(1000)
        want = struct.pack("<Q", got) + bytes([got & 0xFF]) * 192
        if d != want or a != srv:
            fail(f"echo {got}: {d[:8]!r} from {a}")
        got += 1
    print("FLOOD", got, flush=True)


if args.role == "serve":
    serve()
elif args.role == "check":
    check(args.port)
elif args.role == "flood":
    flood(args.port, args.n)
