"""Everything a program sees of UDP ancillary data (control messages), one JSON line per
case: what recvmsg delivers for the receive options (IP_PKTINFO, IP_RECVTTL, IP_RECVTOS,
SO_TIMESTAMPNS, IPV6_RECVPKTINFO, IPV6_RECVHOPLIMIT), what sendmsg's messages change
(IP_TTL, IP_TOS, IPV6_HOPLIMIT, the source chosen by IP_PKTINFO), MSG_CTRUNC with a short
control buffer or none, and the errnos of messages the kernel refuses. Then what else a
program controls about its datagrams: MSG_MORE parts and UDP_CORK making one datagram,
an empty error queue (MSG_ERRQUEUE), and calls that come after the sends before them
(a TTL set between two sends, a connect between two, the name an autobinding sendto
gave).

Usage: dgram_control.py [view]   ("view": leave out what a network's own address view
cannot show: 127.0.0.2/127.0.0.3 as addresses of their own, IPv6 hop limits and
original destinations)."""
import json
import socket
import struct
import sys

for _n, _v in (("IP_PKTINFO", 8), ("IP_RECVTTL", 12), ("IP_RECVTOS", 13), ("SO_TIMESTAMPNS", 35)):
    if not hasattr(socket, _n):
        setattr(socket, _n, _v)
VIEW = sys.argv[1:] == ["view"]
IP_ORIGDSTADDR, IPV6_ORIGDSTADDR = 20, 74  # also the IP_RECV*/IPV6_RECV* options' numbers
PORTS = {}  # the receivers' ports, to check the original destination's


def shown(anc):
    r = []
    for lvl, typ, data in anc:
        if (lvl, typ) == (socket.IPPROTO_IP, socket.IP_PKTINFO):
            ifi, spec, addr = struct.unpack("i4s4s", data)
            r.append(["IP_PKTINFO", ifi, socket.inet_ntoa(spec), socket.inet_ntoa(addr)])
        elif (lvl, typ) == (socket.IPPROTO_IP, socket.IP_TTL):
            r.append(["IP_TTL", struct.unpack("i", data)[0]])
        elif (lvl, typ) == (socket.IPPROTO_IP, socket.IP_TOS):
            r.append(["IP_TOS", data[0]])
        elif (lvl, typ) == (socket.IPPROTO_IPV6, socket.IPV6_PKTINFO):
            a, ifi = struct.unpack("16sI", data)
            r.append(["IPV6_PKTINFO", socket.inet_ntop(socket.AF_INET6, a), ifi])
        elif (lvl, typ) == (socket.IPPROTO_IPV6, socket.IPV6_HOPLIMIT):
            r.append(["IPV6_HOPLIMIT", struct.unpack("i", data)[0]])
        elif (lvl, typ) == (socket.IPPROTO_IP, IP_ORIGDSTADDR):
            fam, port, a = struct.unpack("!HH4s8x", data)
            r.append(["IP_ORIGDSTADDR", socket.inet_ntoa(a), port == PORTS.get("v4")])
        elif (lvl, typ) == (socket.IPPROTO_IPV6, IPV6_ORIGDSTADDR):
            fam, port, flow, a, scope = struct.unpack("!HHI16sI", data)
            r.append(["IPV6_ORIGDSTADDR", socket.inet_ntop(socket.AF_INET6, a), port == PORTS.get("v6")])
        elif (lvl, typ) == (socket.SOL_SOCKET, socket.SO_TIMESTAMPNS):
            r.append(["SO_TIMESTAMPNS", len(data)])
        else:
            r.append([lvl, typ, len(data)])
    return r


def emit(*row):
    print(json.dumps(list(row)), flush=True)


srv = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
srv.bind(("0.0.0.0", 0))
port = srv.getsockname()[1]
for o in (socket.IP_PKTINFO, socket.IP_RECVTTL, socket.IP_RECVTOS):
    srv.setsockopt(socket.IPPROTO_IP, o, 1)
srv.setsockopt(socket.SOL_SOCKET, socket.SO_TIMESTAMPNS, 1)
srv.setsockopt(socket.IPPROTO_IP, IP_ORIGDSTADDR, 1)
PORTS["v4"] = port
srv.settimeout(10)
cli = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
cli.bind(("127.0.0.1", 0))
BIG = 512


def got(label, bufsize=BIG):
    data, anc, flags, addr = srv.recvmsg(100, bufsize)
    emit(label, data.decode(), shown(anc), flags & socket.MSG_CTRUNC != 0, addr[0])


def ip(kind, fmt, v):
    return [(socket.IPPROTO_IP, kind, struct.pack(fmt, v))]


cli.sendto(b"plain", ("127.0.0.1", port)); got("plain")
if not VIEW:
    cli.sendto(b"to2", ("127.0.0.2", port)); got("to 127.0.0.2")
cli.sendmsg([b"ttl9"], ip(socket.IP_TTL, "i", 9), 0, ("127.0.0.1", port)); got("IP_TTL 9")
cli.sendmsg([b"tos"], ip(socket.IP_TOS, "i", 0x20), 0, ("127.0.0.1", port)); got("IP_TOS int")
cli.sendmsg([b"tos1"], ip(socket.IP_TOS, "B", 0x40), 0, ("127.0.0.1", port)); got("IP_TOS byte")
cli.connect(("127.0.0.1", port))
cli.sendmsg([b"conn"], ip(socket.IP_TTL, "i", 3)); got("connected IP_TTL 3")
cli.sendto(b"small", ("127.0.0.1", port)); got("short buffer", socket.CMSG_SPACE(12) + 4)
cli.sendto(b"none", ("127.0.0.1", port)); got("no buffer", 0)
# A reply from the address a query came to (spec_dst), as DNS servers send them.
s2 = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s2.bind(("0.0.0.0", 0))
src = "127.0.0.1" if VIEW else "127.0.0.3"
pk = struct.pack("i4s4s", 0, socket.inet_aton(src), b"\0\0\0\0")
s2.sendmsg([b"spec"], [(socket.IPPROTO_IP, socket.IP_PKTINFO, pk)], 0, ("127.0.0.1", port)); got("IP_PKTINFO source")
# What the kernel refuses, ignores, and (as root) allows: SO_MARK marks canal's sockets,
# whose guests are never privileged (EPERM, docs/compat.md).
for label, anc in [("IP_TTL 0", ip(socket.IP_TTL, "i", 0)),
                   ("IP_TTL 256", ip(socket.IP_TTL, "i", 256)),
                   ("IP_PKTINFO short", [(socket.IPPROTO_IP, socket.IP_PKTINFO, b"\0" * 8)]),
                   ("unknown IP message", [(socket.IPPROTO_IP, 99, b"\0" * 4)]),
                   ("another level", [(12345, 1, b"\0" * 4)]),
                   ("IPV6_HOPLIMIT on IPv4", [(socket.IPPROTO_IPV6, socket.IPV6_HOPLIMIT, struct.pack("i", 5))]),
                   ("SCM_RIGHTS", [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", 0))]),
                   ("SO_MARK", [(socket.SOL_SOCKET, socket.SO_MARK, struct.pack("I", 1))])]:
    try:
        res = ["sent", s2.sendmsg([b"x"], anc, 0, ("127.0.0.1", port))]
        srv.recvmsg(10, BIG)
    except OSError as e:
        res = ["errno", e.errno]
    emit(label, res)
# IPv6.
s6 = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
s6.bind(("::1", 0))
s6.settimeout(10)
s6.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_RECVPKTINFO, 1)
PORTS["v6"] = s6.getsockname()[1]
if not VIEW:
    s6.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_RECVHOPLIMIT, 1)
    s6.setsockopt(socket.IPPROTO_IPV6, IPV6_ORIGDSTADDR, 1)
c6 = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
c6.sendmsg([b"v6"], [(socket.IPPROTO_IPV6, socket.IPV6_HOPLIMIT, struct.pack("i", 7))], 0, ("::1", s6.getsockname()[1]))
data, anc, flags, addr = s6.recvmsg(100, BIG)
emit("IPv6", data.decode(), shown(anc), flags)
# Datagrams a program assembles: MSG_MORE parts and UDP_CORK make one datagram.
UDP_CORK = 1
a = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
a.bind(("127.0.0.1", 0))
a.settimeout(10)
b = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
b.connect(a.getsockname())
b.send(b"ab", socket.MSG_MORE); b.send(b"cd", socket.MSG_MORE); b.send(b"ef")
b.setsockopt(socket.IPPROTO_UDP, UDP_CORK, 1)
b.send(b"12"); b.sendto(b"34", a.getsockname())
emit("UDP_CORK read back", b.getsockopt(socket.IPPROTO_UDP, UDP_CORK))
b.setsockopt(socket.IPPROTO_UDP, UDP_CORK, 0)
b.send(b"alone")
emit("assembled", [a.recv(100).decode() for _ in range(3)])
# The error queue is empty: it neither blocks nor takes a datagram.
b.send(b"kept")
a.settimeout(0)  # Python's timeout would retry EAGAIN until it expires
try:
    a.recvmsg(100, 100, socket.MSG_ERRQUEUE)
    emit("MSG_ERRQUEUE", "took something")
except OSError as e:
    emit("MSG_ERRQUEUE", e.errno)
a.settimeout(10)
emit("after MSG_ERRQUEUE", a.recv(100).decode())
# A call on the socket comes after the sends before it: the TTL each datagram was
# sent with, the peer each went to, the port an autobinding sendto took.
a.setsockopt(socket.IPPROTO_IP, socket.IP_RECVTTL, 1)
c2 = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
a2 = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
a2.bind(("127.0.0.1", 0))
a2.settimeout(10)
c2.sendto(b"t1", a.getsockname())
emit("name after sendto", c2.getsockname()[0], c2.getsockname()[1] != 0)
c2.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, 5)
c2.sendto(b"t2", a.getsockname())
c2.connect(a.getsockname()); c2.send(b"to a")
c2.connect(a2.getsockname()); c2.send(b"to a2")
for sock, n in ((a, 3), (a2, 1)):
    for _ in range(n):
        d, anc, _, _ = sock.recvmsg(100, BIG)
        emit("in order", d.decode(), [x for x in shown(anc) if x[0] == "IP_TTL"])
emit("done")
