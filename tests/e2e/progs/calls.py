"""Socket calls beyond the suite's programs whose answers must be the kernel's, one line
per case; run natively and under canal (short-circuited and through canald), the lines
must be equal.

    calls.py      (a listener on 127.0.0.1:0 and its clients, all in this process)

- TCP Fast Open: sendto/sendmsg with MSG_FASTOPEN and an address on an unconnected
  socket connect and send in one call, as curl --tcp-fastopen does. Only the blocking
  form is compared: a non-blocking one depends on the kernel's cookie cache
  (EINPROGRESS without a cookie, the bytes with one).
- splice(2) between TCP sockets and pipes, both ways: 300,000 bytes each way
  hash-checked, the non-blocking cases, the kernel's errors.
- shutdown's odd answers (`shutdowns`): ENOTCONN that shuts down all the same, UDP
  receives after SHUT_RD, a zero-length datagram.
- SO_RCVLOWAT on streams (`low_water`): readiness, blocking and non-blocking receives,
  the end, inheritance by an accepted socket, a lowered mark waking a poll.
"""
import errno
import hashlib
import os
import socket
import threading

MSG_FASTOPEN = getattr(socket, "MSG_FASTOPEN", 0x20000000)
SIZE = 300_000  # several pipefuls
NB = os.SPLICE_F_NONBLOCK


def err(e):
    return errno.errorcode.get(e.errno, str(e.errno))


def attempt(label, call):
    try:
        print(label, "->", call())
    except OSError as e:
        print(label, "->", err(e))


def pump(step, sink=None):
    """Calls step() until it returns 0 or empty; each result goes to sink (bytes) or
    is counted (a number of bytes moved). Returns the bytes moved."""
    moved = 0
    while True:
        r = step()
        if not r:
            return moved
        if sink:
            sink(r)
        moved += r if isinstance(r, int) else len(r)


listener = socket.socket()
listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_FASTOPEN, 8)
listener.bind(("127.0.0.1", 0))
listener.listen(8)
listener.settimeout(10)
where = listener.getsockname()


def pair():
    c = socket.create_connection(where)
    a, _ = listener.accept()
    return c, a


def read_n(a, n):
    a.settimeout(5)
    got = b""
    while len(got) < n:
        b = a.recv(n - len(got))
        if not b:
            break
        got += b
    return got


def fast_open():
    # Blocking: connects, sends, returns the count; the server reads the bytes.
    c = socket.socket()
    attempt("fastopen sendto", lambda: c.sendto(b"hello fast open", MSG_FASTOPEN, where))
    a, _ = listener.accept()
    print("server got", read_n(a, 15))
    attempt("fastopen again on the connected socket", lambda: c.sendto(b"x", MSG_FASTOPEN, where))
    attempt("plain send after", lambda: c.send(b"y"))
    print("server got", read_n(a, 1))
    c.close()
    a.close()
    # sendmsg with an address.
    c = socket.socket()
    attempt("fastopen sendmsg", lambda: c.sendmsg([b"two ", b"parts"], [], MSG_FASTOPEN, where))
    a, _ = listener.accept()
    print("server got", read_n(a, 9))
    c.close()
    a.close()
    # No address: nothing to connect to.
    c = socket.socket()
    attempt("fastopen without an address", lambda: c.send(b"z", MSG_FASTOPEN))
    c.close()
    # A refused destination.
    spare = socket.socket()
    spare.bind(("127.0.0.1", 0))
    closed = spare.getsockname()
    spare.close()
    c = socket.socket()
    attempt("fastopen to a closed port", lambda: c.sendto(b"z", MSG_FASTOPEN, closed))
    c.close()


def through_pipe(to_pipe):
    """SIZE bytes through splice, then end of file: socket -> pipe (a peer sends and
    closes, a thread drains the pipe) or pipe -> socket (a thread fills the pipe and
    closes it, the peer reads)."""
    data = os.urandom(SIZE)
    c, a = pair()
    r, w = os.pipe()
    got = bytearray()
    if to_pipe:
        read_end, fill = (lambda: os.read(r, 65536)), (lambda: (c.sendall(data), c.close()))
        step, finish = (lambda: os.splice(a.fileno(), w, 1 << 20)), (lambda: os.close(w))
    else:
        read_end, fill = (lambda: c.recv(65536)), (lambda: (os.write(w, data), os.close(w)))
        step, finish = (lambda: os.splice(r, a.fileno(), 1 << 20)), a.close
    reader = threading.Thread(target=pump, args=(read_end, got.extend))
    reader.start()
    threading.Thread(target=fill).start()
    moved = pump(step)
    finish()  # the reader's end of file
    reader.join()
    same = hashlib.sha256(got).digest() == hashlib.sha256(data).digest()
    print("socket -> pipe:" if to_pipe else "pipe -> socket:", moved, "bytes",
          "intact" if same else "CORRUPT", "then EOF")
    os.close(r)
    a.close()
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


def shutdowns():
    """shutdown where the kernel's answer is odd: a socket that is not connected says
    ENOTCONN but is shut down all the same (later sends fail with EPIPE); a UDP socket
    after SHUT_RD answers EAGAIN to a non-blocking receive and 0 to a blocking one."""
    a = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    a.bind(("127.0.0.1", 0))
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    attempt("udp shutdown, not connected", lambda: u.shutdown(socket.SHUT_RDWR))
    attempt("udp sendto after it", lambda: u.sendto(b"x", a.getsockname()))
    attempt("udp recv after it", lambda: u.recv(10, socket.MSG_DONTWAIT))
    c = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    c.connect(a.getsockname())
    attempt("udp SHUT_RD, connected", lambda: c.shutdown(socket.SHUT_RD))
    attempt("udp non-blocking recv after SHUT_RD", lambda: c.recv(10, socket.MSG_DONTWAIT))
    attempt("udp blocking recv after SHUT_RD", lambda: c.recv(10))
    attempt("udp send after SHUT_RD", lambda: c.send(b"y"))
    attempt("udp zero-length datagram", lambda: c.send(b""))
    attempt("udp its receiver", lambda: [a.recv(10), a.recv(10)])
    l = socket.create_server(("127.0.0.1", 0))
    t = socket.socket()
    attempt("tcp shutdown, not connected", lambda: t.shutdown(socket.SHUT_WR))
    attempt("tcp connect after it", lambda: t.connect(l.getsockname()))
    attempt("tcp send after it", lambda: t.send(b"x"))
    attempt("listener SHUT_WR", lambda: l.shutdown(socket.SHUT_WR))
    for x in (a, u, c, l, t):
        x.close()


def low_water():
    """SO_RCVLOWAT on a stream: poll, select and epoll report readable only at the
    mark; a blocking recv waits for min(buffer, mark) bytes; a non-blocking one returns
    what is there; the end is readable whatever the mark; an accepted socket inherits
    its listener's; lowering the mark wakes a waiting receiver."""
    import select
    import time
    c, a = pair()
    attempt("lowat default", lambda: a.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT))
    a.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 10)
    attempt("lowat set 10", lambda: a.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT))
    c.sendall(b"abc")
    time.sleep(0.2)
    ep = select.epoll()
    ep.register(a.fileno(), select.EPOLLIN)
    print("3 of 10: poll", _poll_in(a, 0),
          "select", bool(select.select([a], [], [], 0)[0]), "epoll", bool(ep.poll(0)))
    attempt("3 of 10: non-blocking recv", lambda: a.recv(100, socket.MSG_DONTWAIT))
    c.sendall(b"defgh")
    time.sleep(0.2)
    print("5 of 10: poll", _poll_in(a, 0))
    # What it copied does not count: it wakes when 10 more are queued (tcp_data_ready).
    threading.Timer(0.3, lambda: c.sendall(b"ijklmnopqr")).start()
    # Blocking without a timeout: Python's timeout would poll first (and poll says
    # not readable below the mark).
    a.settimeout(None)
    attempt("blocking recv waits for the mark", lambda: a.recv(100))
    c.sendall(b"rst")
    time.sleep(0.2)
    attempt("blocking recv of a 2-byte buffer", lambda: a.recv(2))
    a.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 0)
    attempt("lowat set 0", lambda: a.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT))
    print("1 of 1: poll", _poll_in(a, 0))
    attempt("then", lambda: a.recv(100))
    a.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 50)
    c.sendall(b"uv")
    # A receive already waiting keeps the mark it started with (tcp_recvmsg's target);
    # a poll is woken and looks again.
    threading.Timer(0.3, lambda: a.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)).start()
    t0 = time.monotonic()
    print("lowering the mark wakes a poll:", _poll_in(a, 5000), time.monotonic() - t0 < 4)
    attempt("then", lambda: a.recv(100))
    c.sendall(b"wx")
    c.shutdown(socket.SHUT_WR)
    a.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 100)
    time.sleep(0.2)
    print("2 of 100 and the end: poll", _poll_in(a, 0))
    attempt("recv", lambda: a.recv(100))
    attempt("recv", lambda: a.recv(100))
    ep.close()
    for x in (a, c):
        x.close()
    lst = socket.create_server(("127.0.0.1", 0))
    lst.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 7)
    c = socket.create_connection(lst.getsockname())
    a, _ = lst.accept()
    attempt("accepted inherits", lambda: a.getsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT))
    c.sendall(b"abc")
    time.sleep(0.2)
    print("accepted, 3 of 7: poll", _poll_in(a, 0))
    for x in (a, c, lst):
        x.close()


def peek_waits():
    """A blocking MSG_PEEK waits for tcp_recvmsg's target as a receive does — all of
    the buffer with MSG_WAITALL (programs peek at a whole header so), else
    SO_RCVLOWAT bytes — and what it saw counts; non-blocking, at the end, or when
    SO_RCVTIMEO passes, it returns what is queued. The data stays queued."""
    import struct
    import time
    c, a = pair()
    a.settimeout(None)
    c.sendall(b"a")
    threading.Timer(0.3, lambda: c.sendall(b"bcd")).start()
    attempt("peek|waitall waits for the buffer", lambda: a.recv(4, socket.MSG_PEEK | socket.MSG_WAITALL))
    attempt("still queued", lambda: read_n(a, 4))
    a.settimeout(None)
    a.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 3)
    c.sendall(b"e")
    threading.Timer(0.3, lambda: c.sendall(b"fg")).start()
    attempt("peek waits for the mark", lambda: a.recv(10, socket.MSG_PEEK))
    attempt("then recv", lambda: a.recv(10))
    a.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)
    c.sendall(b"hi")
    time.sleep(0.2)
    attempt("non-blocking peek|waitall", lambda: a.recv(10, socket.MSG_PEEK | socket.MSG_DONTWAIT | socket.MSG_WAITALL))
    a.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", 0, 300_000))
    t0 = time.monotonic()
    attempt("peek|waitall until SO_RCVTIMEO", lambda: a.recv(10, socket.MSG_PEEK | socket.MSG_WAITALL))
    print("after the timeout:", 0.2 < time.monotonic() - t0 < 3)
    c.shutdown(socket.SHUT_WR)
    attempt("peek|waitall at the end", lambda: a.recv(10, socket.MSG_PEEK | socket.MSG_WAITALL))
    attempt("recv", lambda: a.recv(10))
    attempt("recv", lambda: a.recv(10))
    for x in (a, c):
        x.close()


def _poll_in(s, timeout):
    import select
    p = select.poll()
    p.register(s.fileno(), select.POLLIN)
    return bool(p.poll(timeout))


fast_open()
through_pipe(True)
through_pipe(False)
edges()
shutdowns()
low_water()
peek_waits()
print("done")
