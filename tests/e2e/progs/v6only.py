"""IPv4 and IPv6-only sockets side by side, as servers make them (asyncio's
start_server without a host binds 0.0.0.0:P and an IPV6_V6ONLY [::]:P; nginx's
`listen [::]:80 ipv6only=on`; Go's "tcp6"). Prints one line per case; run natively in
a fresh network namespace and under `canal run --isolate`, the lines must be equal.

    v6only.py BASE_PORT      (uses BASE_PORT .. BASE_PORT+9)
"""
import asyncio
import errno
import socket
import sys

BASE = int(sys.argv[1])
V6 = socket.IPPROTO_IPV6, socket.IPV6_V6ONLY


def err(e):
    return errno.errorcode.get(e.errno, str(e.errno))


def show(a):
    return f"{a[0]}:{a[1] - BASE if BASE <= a[1] < BASE + 10 else 'eph'}"


def listener(family, port, v6only=None, host=None):
    s = socket.socket(family, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if v6only is not None:
        s.setsockopt(*V6, v6only)
    s.bind((host or ("::" if family == socket.AF_INET6 else "0.0.0.0"), port))
    s.listen(8)
    return s


def dial(host, port, family=None, v6only=None):
    family = family or (socket.AF_INET6 if ":" in host else socket.AF_INET)
    c = socket.socket(family, socket.SOCK_STREAM)
    try:
        if v6only is not None:
            c.setsockopt(*V6, v6only)
        c.settimeout(5)
        c.connect((host, port))
        return c, "ok"
    except OSError as e:
        c.close()
        return None, err(e)


def case(name, *listeners, host, port):
    """Which listener takes a connection to host:port, and the peer it sees."""
    c, r = dial(host, port)
    if c is None:
        print(name, r)
        return
    for i, l in enumerate(listeners):
        l.settimeout(0.5)
        try:
            a, peer = l.accept()
        except socket.timeout:
            continue
        # An accepted AF_INET6 socket inherits its listener's IPV6_V6ONLY.
        inherited = f" v6only {a.getsockopt(*V6)}" if a.family == socket.AF_INET6 else ""
        print(name, f"listener {i}", "peer", peer[0], "local", show(a.getsockname()) + inherited,
              "| client", c.getsockname()[0], "to", show(c.getpeername()))
        a.close()
        break
    else:
        print(name, "no listener took it")
    c.close()


def tcp():
    p = BASE
    four, six = listener(socket.AF_INET, p), listener(socket.AF_INET6, p, v6only=1)
    print("v6only reads back", six.getsockopt(*V6), "name", show(six.getsockname()))
    case("127.0.0.1 ->", four, six, host="127.0.0.1", port=p)
    case("::1 ->", four, six, host="::1", port=p)
    four.close(), six.close()
    # An IPv4 listener alone: an IPv6 client is refused.
    four = listener(socket.AF_INET, p + 1)
    case("v4 only, ::1 ->", four, host="::1", port=p + 1)
    four.close()
    # An IPv6-only listener alone: an IPv4 client is refused.
    six = listener(socket.AF_INET6, p + 2, v6only=1)
    case("v6 only, 127.0.0.1 ->", six, host="127.0.0.1", port=p + 2)
    case("v6 only, ::1 ->", six, host="::1", port=p + 2)
    six.close()
    # A dual-stack listener takes both, each peer in its own form.
    dual = listener(socket.AF_INET6, p + 3, v6only=0)
    case("dual, 127.0.0.1 ->", dual, host="127.0.0.1", port=p + 3)
    case("dual, ::1 ->", dual, host="::1", port=p + 3)
    # A dual-stack port and an IPv6-only bind of it collide, both ways.
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
        s.setsockopt(*V6, 1)
        attempt("v6only over dual", lambda: s.bind(("::", p + 3)))
    dual.close()


def attempt(label, call):
    """Prints "LABEL: ok" or "LABEL: ERRNO"."""
    try:
        call()
        print(f"{label}: ok")
    except OSError as e:
        print(f"{label}:", err(e))


def rules():
    s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    print("fresh v6 socket reads", s.getsockopt(*V6))
    s.setsockopt(*V6, 1)
    attempt("v6only bind mapped", lambda: s.bind(("::ffff:127.0.0.1", 0)))
    s.bind(("::1", 0))
    attempt("set after bind", lambda: s.setsockopt(*V6, 0))
    s.close()
    _, r = dial("::ffff:127.0.0.1", BASE + 4, socket.AF_INET6, v6only=1)
    print("v6only connect mapped:", r)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s4:
        attempt("on an IPv4 socket", lambda: s4.setsockopt(*V6, 1))


def udp():
    p = BASE + 5
    four = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    four.bind(("0.0.0.0", p))
    six = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    six.setsockopt(*V6, 1)
    six.bind(("::", p))
    for host, fam in (("127.0.0.1", socket.AF_INET), ("::1", socket.AF_INET6)):
        c = socket.socket(fam, socket.SOCK_DGRAM)
        c.sendto(host.encode(), (host, p))
        for name, r in (("v4", four), ("v6", six)):
            r.settimeout(0.5)
            try:
                data, src = r.recvfrom(100)
                print("udp", host, "->", name, "from", src[0])
                r.sendto(b"back", src)
                c.settimeout(2)
                back, frm = c.recvfrom(100)
                print("udp reply", back.decode(), "from", show(frm))
            except socket.timeout:
                continue
        c.close()
    # A dual-stack socket that first spoke to ::1 (so autobound there) takes IPv4
    # datagrams on its port too.
    dual = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    dual.sendto(b"hi", ("::1", p))
    six.settimeout(2)
    six.recvfrom(100)
    c4 = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    c4.sendto(b"four", ("127.0.0.1", dual.getsockname()[1]))
    dual.settimeout(2)
    data, src = dual.recvfrom(100)
    print("udp dual after ::1, 127.0.0.1 ->", data.decode(), "from", src[0])
    dual.close(), c4.close()
    four.close(), six.close()


async def asyncio_server():
    async def h(r, w):
        w.write(str(w.get_extra_info("peername")[0]).encode() + b"\n")
        await w.drain()
        w.close()

    s = await asyncio.start_server(h, port=BASE + 6)
    print("asyncio sockets", sorted(x.family.name for x in s.sockets))
    for host in ("127.0.0.1", "::1", "localhost"):
        r, w = await asyncio.open_connection(host, BASE + 6)
        print("asyncio", host, "sees", (await r.readline()).decode().strip())
        w.close()
    s.close()


tcp()
rules()
udp()
asyncio.run(asyncio_server())
print("done")
