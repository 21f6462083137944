#!/usr/bin/env python3
"""A burst of datagrams from one socket to two receivers, checked for order, content
and destination (stdlib only).

  udpburst.py recv --count N
      Two UDP sockets on 127.0.0.1 (4 MiB receive buffers); prints "READY P1 P2", then
      receives until N datagrams arrived in all (or 20 s passed). Every datagram carries
      its sequence number, the port it was meant for and a payload derived from both;
      each socket must see only its own, in increasing order, none missing. Prints
      "OK <n>" or fails with a message on stderr (exit 1).
  udpburst.py send --ports P1 P2 --count N
      Sends N datagrams (sizes 12..1500 bytes) back to back from one unconnected socket:
      every third to P2, the others to P1, so destinations change inside any batch a
      relay makes of them.
"""

import argparse
import select
import socket
import struct
import sys
import time


def payload(seq, port):
    size = 12 + (seq * 37) % 1489
    head = struct.pack("<IIi", seq, port, size)
    body = bytes((seq + port + i) & 0xFF for i in range(size - len(head)))
    return head + body


def dest(seq, p1, p2):
    return p2 if seq % 3 == 0 else p1


def recv(count):
    socks = []
    for _ in range(2):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    print("READY", *ports, flush=True)
    expect = {p: [q for q in range(count) if dest(q, *ports) == p] for p in ports}
    got = {p: [] for p in ports}
    deadline = time.time() + 20
    n = 0
    while n < count and time.time() < deadline:
        ready, _, _ = select.select(socks, [], [], 1.0)
        for s in ready:
            d = s.recv(65536)
            port = s.getsockname()[1]
            seq, meant, size = struct.unpack("<IIi", d[:12])
            if meant != port:
                sys.exit(f"udpburst: datagram {seq} for port {meant} arrived at {port}")
            if d != payload(seq, port):
                sys.exit(f"udpburst: datagram {seq} damaged ({len(d)} of {size} bytes)")
            got[port].append(seq)
            n += 1
    for p in ports:
        if got[p] != expect[p]:
            missing = sorted(set(expect[p]) - set(got[p]))[:5]
            order = got[p] == sorted(got[p])
            sys.exit(f"udpburst: port {p}: {len(got[p])} of {len(expect[p])} datagrams, "
                     f"in order: {order}, first missing: {missing}")
    print("OK", n, flush=True)


def send(ports, count):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for q in range(count):
        p = dest(q, *ports)
        s.sendto(payload(q, p), ("127.0.0.1", p))
    print("SENT", count, flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["recv", "send"])
    ap.add_argument("--count", type=int, default=3000)
    ap.add_argument("--ports", type=int, nargs=2)
    a = ap.parse_args()
    if a.mode == "recv":
        recv(a.count)
    else:
        send(a.ports, a.count)


if __name__ == "__main__":
    main()
