"""Many connections from one program (virtual RSS test, test_vrss.py).

serve: a native threaded TCP echo server on 127.0.0.1; prints "READY <port>", then
       "EOF <n>" each time a connection ends (n: connections ended so far).
client --port P --conns N: opens N connections, prints "CONNECTED", waits for a line on
       stdin: "go" moves data on every connection (sizes differ per connection, SHA-256
       checked), checks sockopts and names, shuts the write side down and reads the echo
       to EOF, closes, prints "OK <bytes>"; "exit" leaves at once with every connection
       open (os._exit: the host must clean up)."""

import hashlib
import os
import socket
import sys
import threading


def serve():
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", 0))
    ls.listen(128)
    print("READY", ls.getsockname()[1], flush=True)
    ended = [0]
    lock = threading.Lock()

    def echo(c):
        with c:
            while True:
                try:
                    b = c.recv(1 << 16)
                except OSError:
                    b = b""
                if not b:
                    break
                c.sendall(b)
        with lock:
            ended[0] += 1
            print("EOF", ended[0], flush=True)

    while True:
        c, _ = ls.accept()
        threading.Thread(target=echo, args=(c,), daemon=True).start()


def payload(i):
    n = 1000 + i * 37_123  # 1 KB .. ~560 KB, a different size per connection
    return hashlib.sha256(str(i).encode()).digest() * (n // 32 + 1)


def client(port, conns):
    socks = []
    for _ in range(conns):
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        socks.append(s)
    print("CONNECTED", flush=True)
    cmd = sys.stdin.readline().strip()
    if cmd == "exit":
        os._exit(0)
    total = 0
    errs = []

    def run(i, s):
        nonlocal total
        try:
            data = payload(i)
            # Sockopts and names on every socket (several are served by a worker
            # that is not the guest's home: forwarded requests).
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1, "TCP_NODELAY"
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 0)
            assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 0, "TCP_NODELAY off"
            assert s.getpeername() == ("127.0.0.1", port), s.getpeername()
            assert s.getsockname()[0] == "127.0.0.1", s.getsockname()
            got = bytearray()
            sender = threading.Thread(target=s.sendall, args=(data,))
            sender.start()
            while len(got) < len(data):
                b = s.recv(1 << 16)
                assert b, f"conn {i}: EOF after {len(got)} of {len(data)}"
                got += b
            sender.join()
            assert hashlib.sha256(got).digest() == hashlib.sha256(data).digest(), f"conn {i}: data differ"
            # Half-close: the server sees EOF, echoes nothing more and closes.
            s.shutdown(socket.SHUT_WR)
            try:
                s.send(b"x")
                raise AssertionError("send after SHUT_WR succeeded")
            except BrokenPipeError:
                pass
            assert s.recv(10) == b"", "EOF after the server closed"
            s.close()
            try:
                s.getsockname()
                raise AssertionError("getsockname on a closed socket")
            except OSError:
                pass
            total += len(data)
        except Exception as e:  # reported below
            errs.append(f"conn {i}: {e!r}")

    ts = [threading.Thread(target=run, args=(i, s)) for i, s in enumerate(socks)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errs:
        print("FAIL", "; ".join(errs), flush=True)
        sys.exit(1)
    print("OK", total, flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve()
    else:
        a = sys.argv
        client(int(a[a.index("--port") + 1]), int(a[a.index("--conns") + 1]))
