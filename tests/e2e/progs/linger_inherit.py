"""An accepted connection inherits its listener's SO_LINGER, as a kernel socket does.

  linger_inherit.py

For a listener without SO_LINGER, with {1, 0} and with {1, 5}: a client of this same
program connects (under canal: a short-circuited connection), the listener's program
accepts, prints the accepted socket's SO_LINGER, closes it, and prints what the client
then reads: end of file after an orderly close, ECONNRESET after {1, 0}'s abortive
one. Prints "done" at the end. The same lines natively and under canal.
"""

import errno
import socket
import struct


def case(linger):
    l = socket.socket()
    l.bind(("127.0.0.1", 0))
    if linger is not None:
        l.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", *linger))
    l.listen(4)
    c = socket.create_connection(l.getsockname())
    a, _ = l.accept()
    got = struct.unpack("ii", a.getsockopt(socket.SOL_SOCKET, socket.SO_LINGER, 8))
    a.close()
    c.settimeout(5)
    try:
        seen = "eof" if c.recv(16) == b"" else "data"
    except OSError as e:
        seen = errno.errorcode.get(e.errno, str(e.errno))
    c.close()
    l.close()
    print(f"listener {linger}: accepted SO_LINGER {got}, client reads {seen}", flush=True)


for v in (None, (1, 0), (1, 5)):
    case(v)
print("done", flush=True)
