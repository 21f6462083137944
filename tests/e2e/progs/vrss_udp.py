"""Datagram sockets and listeners of one program (virtual RSS test, test_vrss.py).

serve: a native UDP echo server on 127.0.0.1; prints "READY <port>".
client --port P --socks N: opens N UDP sockets bound to 127.0.0.1:0 and N connected
       to the server, plus N TCP listeners on 127.0.0.1:0, prints "READY", waits for
       "go" on stdin, then on every UDP socket sends datagrams of sizes that differ per
       socket and checks the echoes (SHA-256 of everything sent and received), connects
       once to every listener and echoes a line through it, closes everything and
       prints "OK <datagrams>"."""

import hashlib
import socket
import sys


def serve():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    print("READY", s.getsockname()[1], flush=True)
    while True:
        b, a = s.recvfrom(65536)
        s.sendto(b, a)


def fail(msg):
    print(f"FAIL {msg}", file=sys.stderr, flush=True)
    sys.exit(1)


def client(port, n):
    dst = ("127.0.0.1", port)
    bound, connected, listeners = [], [], []
    for _ in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind(("127.0.0.1", 0))
        s.settimeout(10)
        bound.append(s)
    for _ in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.connect(dst)
        s.settimeout(10)
        connected.append(s)
    for _ in range(n):
        ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        ls.bind(("127.0.0.1", 0))
        ls.listen(4)
        ls.settimeout(10)
        listeners.append(ls)
    print("READY", flush=True)
    if sys.stdin.readline().strip() != "go":
        fail("no go")
    count = 0
    for i, s in enumerate(bound + connected):
        sent, got = hashlib.sha256(), hashlib.sha256()
        for k in range(20):
            size = 1 + (i * 977 + k * 1531) % 8000
            data = hashlib.sha256(f"{i}/{k}".encode()).digest() * (size // 32 + 1)
            data = data[:size]
            sent.update(data)
            if s in bound:
                s.sendto(data, dst)
            else:
                s.send(data)
            try:
                b, a = s.recvfrom(65536)
            except socket.timeout:
                fail(f"socket {i}: datagram {k} not echoed")
            if a != dst:
                fail(f"socket {i}: echo from {a}")
            got.update(b)
            count += 1
        if sent.digest() != got.digest():
            fail(f"socket {i}: echoed bytes differ")
    for i, ls in enumerate(listeners):
        c = socket.create_connection(ls.getsockname(), timeout=10)
        a, _ = ls.accept()
        line = f"listener {i}\n".encode()
        c.sendall(line)
        a.settimeout(10)
        if a.recv(100) != line:
            fail(f"listener {i}: line differs")
        c.close()
        a.close()
    for s in bound + connected + listeners:
        s.close()
    print("OK", count, flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve()
    else:
        a = sys.argv
        client(int(a[a.index("--port") + 1]), int(a[a.index("--socks") + 1]))
