"""splice(2) between TCP sockets and pipes, both ways, printing one line per case; the
lines must be the same natively and under canal (short-circuited or through canald).

    splice.py      (a listener on 127.0.0.1:0 and its clients, all in this process)
"""
import errno
import hashlib
import os
import socket
import threading

SIZE = 300_000  # several pipefuls
NB = os.SPLICE_F_NONBLOCK


def err(e):
    return errno.errorcode.get(e.errno, str(e.errno))


def attempt(label, call):
    try:
        print(label, "->", call())
    except OSError as e:
        print(label, "->", err(e))


listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen(4)
port = listener.getsockname()[1]


def pair():
    c = socket.create_connection(("127.0.0.1", port))
    a, _ = listener.accept()
    return c, a


def socket_to_pipe():
    """A peer sends SIZE bytes and closes; splice moves them into a pipe a thread
    drains; then end of file."""
    data = os.urandom(SIZE)
    c, a = pair()
    r, w = os.pipe()
    out = bytearray()
    drain = threading.Thread(target=lambda: [out.extend(b) for b in iter(lambda: os.read(r, 65536), b"")])
    drain.start()
    threading.Thread(target=lambda: (c.sendall(data), c.close())).start()
    calls, moved = 0, 0
    while True:
        n = os.splice(a.fileno(), w, 1 << 20)
        if n == 0:
            break
        moved, calls = moved + n, calls + 1
    os.close(w)
    drain.join()
    same = hashlib.sha256(out).digest() == hashlib.sha256(data).digest()
    print("socket -> pipe:", moved, "bytes", "intact" if same else "CORRUPT", "then EOF")
    os.close(r)
    a.close()


def pipe_to_socket():
    """A thread fills a pipe with SIZE bytes; splice moves them into a socket whose
    peer reads them all."""
    data = os.urandom(SIZE)
    c, a = pair()
    r, w = os.pipe()
    got = bytearray()

    def reader():
        while True:
            b = c.recv(65536)
            if not b:
                break
            got.extend(b)
    t = threading.Thread(target=reader)
    t.start()
    threading.Thread(target=lambda: (os.write(w, data), os.close(w))).start()
    moved = 0
    while True:
        n = os.splice(r, a.fileno(), 1 << 20)
        if n == 0:
            break
        moved += n
    a.close()
    t.join()
    same = hashlib.sha256(got).digest() == hashlib.sha256(data).digest()
    print("pipe -> socket:", moved, "bytes", "intact" if same else "CORRUPT", "then EOF")
    os.close(r)
    c.close()


def edges():
    c, a = pair()
    r, w = os.pipe()
    a.setblocking(False)
    attempt("empty non-blocking socket -> pipe", lambda: os.splice(a.fileno(), w, 100))
    attempt("empty pipe -> socket, SPLICE_F_NONBLOCK", lambda: os.splice(r, a.fileno(), 100, flags=NB))
    a.setblocking(True)
    # A full pipe: nothing moves without blocking, and the socket keeps its bytes.
    os.set_blocking(w, False)
    filled = 0
    try:
        while True:
            filled += os.write(w, b"f" * 4096)
    except BlockingIOError:
        pass
    os.set_blocking(w, True)
    c.sendall(b"kept")
    attempt("socket -> full pipe, SPLICE_F_NONBLOCK", lambda: os.splice(a.fileno(), w, 100, flags=NB))
    os.read(r, filled)
    attempt("the socket still has", lambda: a.recv(100))
    attempt("socket -> socket", lambda: os.splice(a.fileno(), c.fileno(), 10))
    attempt("socket -> pipe with an offset", lambda: os.splice(a.fileno(), w, 10, offset_src=0))
    attempt("socket -> pipe with a pipe offset", lambda: os.splice(a.fileno(), w, 10, offset_dst=0))
    attempt("pipe -> socket with a pipe offset", lambda: os.splice(r, a.fileno(), 10, offset_src=0))
    attempt("pipe -> socket with an offset", lambda: os.splice(r, a.fileno(), 10, offset_dst=0))
    with open(os.devnull, "wb") as f:
        attempt("socket -> /dev/null", lambda: os.splice(a.fileno(), f.fileno(), 10))
    attempt("socket -> pipe, 0 bytes", lambda: os.splice(a.fileno(), w, 0))
    os.close(w)
    attempt("pipe without a writer -> socket", lambda: os.splice(r, a.fileno(), 10))
    c.close()
    attempt("closed peer -> pipe", lambda: os.splice(a.fileno(), os.pipe()[1], 10))
    os.close(r)
    a.close()


socket_to_pipe()
pipe_to_socket()
edges()
print("done")
