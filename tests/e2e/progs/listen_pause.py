"""A listener paused and resumed the way HAProxy does on Linux: shutdown(SHUT_WR),
listen(), shutdown(SHUT_RD) stops it (clients refused, queued ones reset, accept
EINVAL, poll HUP|OUT), listen() starts it again on the same port; connect(AF_UNSPEC)
stops it too; closed, it resets the connection it queued."""
import ctypes
import errno
import select
import socket
t = socket.socket(); t.bind(("127.0.0.1", 0)); port = t.getsockname()[1]; t.close()
l = socket.socket(); l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); l.bind(("127.0.0.1", port)); l.listen(8)
def tryc():
    c = socket.socket(); c.settimeout(3)
    try:
        c.connect(("127.0.0.1", port)); c.sendall(b"?")
        c.settimeout(0.5)
        try:
            d = c.recv(1); return "connected" + (" then reset" if d == b"" else "")
        except socket.timeout: return "connected"
        except OSError as e: return "connected then " + errno.errorcode[e.errno]
    except OSError as e: return errno.errorcode.get(e.errno, str(e))
    finally: c.close()
def ev(s):
    p = select.poll(); p.register(s, select.POLLIN | select.POLLOUT); r = p.poll(0)
    return "|".join(n for b, n in ((select.POLLIN, "IN"), (select.POLLOUT, "OUT"), (select.POLLHUP, "HUP")) if r and r[0][1] & b) or "-"
q = socket.create_connection(("127.0.0.1", port)); q.sendall(b"x")
print("listening poll", ev(l))
l.shutdown(socket.SHUT_WR); print("SHUT_WR: connect", tryc())
l.listen(8)
l.shutdown(socket.SHUT_RD); print("SHUT_RD: connect", tryc(), "poll", ev(l))
q.settimeout(3)
try: print("queued:", q.recv(1))
except OSError as e: print("queued:", errno.errorcode[e.errno])
l.setblocking(False)
try: l.accept(); print("accept ok")
except OSError as e: print("accept", errno.errorcode[e.errno])
l.setblocking(True); l.listen(8); print("listen again: connect", tryc())
l.settimeout(3)
n = 0
while True:
    try: s, _ = l.accept(); n += 1; s.settimeout(1); s.recv(1)
    except OSError: break
    if n > 5: break
print("accepted after resume", n)
print("same port", l.getsockname()[1] == port)
# connect(AF_UNSPEC) stops a listener the same way (tcp_disconnect); a stream not
# connected has nothing to undo.
libc = ctypes.CDLL(None, use_errno=True)
unspec = (ctypes.c_ubyte * 16)()
print("AF_UNSPEC on listener", libc.connect(l.fileno(), unspec, 16), "connect", tryc())
l.listen(8); print("listen again: connect", tryc())
u = socket.socket()
print("AF_UNSPEC on fresh stream", libc.connect(u.fileno(), unspec, 16))
u.close()
# Closed with a connection queued: the client is reset, as by a stopped listener.
q = socket.create_connection(("127.0.0.1", port)); q.sendall(b"y"); q.settimeout(3)
select.select([l], [], [], 3)
l.close()
try: print("closed, queued:", q.recv(1))
except OSError as e: print("closed, queued:", errno.errorcode[e.errno])
print("done")
