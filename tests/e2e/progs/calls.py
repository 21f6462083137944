"""Socket calls whose answers must be the kernel's, one line per case; run natively and
under canal (short-circuited and through canald), the lines must be equal.

    calls.py      (a listener on 127.0.0.1:0 and its clients, all in this process)

TCP Fast Open (sendto/sendmsg with MSG_FASTOPEN and an address on an unconnected
socket: connect and send in one call, as curl --tcp-fastopen does). Only the blocking
form is compared: a non-blocking one depends on the kernel's cookie cache (EINPROGRESS
without a cookie, the bytes with one).
"""
import errno
import socket

MSG_FASTOPEN = getattr(socket, "MSG_FASTOPEN", 0x20000000)


def err(e):
    return errno.errorcode.get(e.errno, str(e.errno))


def attempt(label, call):
    try:
        print(label, "->", call())
    except OSError as e:
        print(label, "->", err(e))


listener = socket.socket()
listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_FASTOPEN, 8)
listener.bind(("127.0.0.1", 0))
listener.listen(8)
listener.settimeout(10)
where = listener.getsockname()


def read_n(a, n):
    a.settimeout(5)
    got = b""
    while len(got) < n:
        b = a.recv(n - len(got))
        if not b:
            break
        got += b
    return got


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
print("done")
