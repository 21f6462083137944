"""A client of a native TCP server and of a canal one (argv: native TCP port, canal
port, native UDP port[, WARM]): one echo on each, one more with a TCP socket bound before it
connects to the native server and one with a UDP socket bound before it connects to
the native UDP server; then prints the local port of the three TCP connections and
waits for stdin to close, so the test can see with `ss` which process holds each.

With WARM, first WARM short connections (connect, echo, close) to the canal server:
the library then guesses that this process's next streams go to canal ports and
starts them as canal's (libcanal `direct::guess_canal`), so the first native connect
is a wrong guess, mended by handing the socket over; the options set on it before
its connect must hold after."""
import socket
import sys


def echo(port, bound=False, opts=False):
    s = socket.socket()
    if bound:
        s.bind(("127.0.0.1", 0))
    if opts:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    s.connect(("127.0.0.1", port))
    s.sendall(b"ping")
    assert s.recv(4) == b"ping"
    if opts:
        assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
        assert s.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert s.getpeername() == ("127.0.0.1", port)
    return s


for _ in range(int(sys.argv[4]) if len(sys.argv) > 4 else 0):
    echo(int(sys.argv[2])).close()
native = echo(int(sys.argv[1]), opts=True)
canal = echo(int(sys.argv[2]))
bound = echo(int(sys.argv[1]), bound=True)
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.bind(("127.0.0.1", 0))
mine = u.getsockname()
u.connect(("127.0.0.1", int(sys.argv[3])))
u.send(b"udp-ping")
u.settimeout(5)
assert u.recv(64) == b"udp-ping"
assert u.getsockname() == mine
print("PORTS", native.getsockname()[1], canal.getsockname()[1], bound.getsockname()[1], flush=True)
sys.stdin.read()
print("done", flush=True)
