"""A client of a native TCP server and of a canal one (argv: native port, canal port):
one echo on each, then prints the local port of each connection and waits for stdin
to close, so the test can see with `ss` which process holds each connection."""
import socket
import sys


def echo(port):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"ping")
    assert s.recv(4) == b"ping"
    return s


native = echo(int(sys.argv[1]))
canal = echo(int(sys.argv[2]))
print("PORTS", native.getsockname()[1], canal.getsockname()[1], flush=True)
sys.stdin.read()
print("done", flush=True)
