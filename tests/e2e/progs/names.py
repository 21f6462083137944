"""getsockname/getpeername on connected streams (test_names.py): an accepted and a
connecting end facing the test's native peer, and a pair connected to itself
(short-circuited under canal). Steps wait for files the test creates in DIR.

usage: names.py NATIVE_SERVER_PORT DIR"""
import errno
import os
import socket
import sys
import time

port, d = int(sys.argv[1]), sys.argv[2]


def wait(name):
    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(d, name)):
        if time.monotonic() > deadline:
            sys.exit(f"no {name} from the test")
        time.sleep(0.01)


def name(f):
    try:
        return "%s:%d" % f()[:2]
    except OSError as e:
        return errno.errorcode[e.errno]


def state(f):
    """ok, or the errno: what a later step may compare with the same program natively."""
    try:
        f()
        return "ok"
    except OSError as e:
        return errno.errorcode[e.errno]


lst = socket.create_server(("127.0.0.1", 0))
print("listen", lst.getsockname()[1], flush=True)
accepted, _ = lst.accept()  # the test's native client
client = socket.create_connection(("127.0.0.1", port))  # the test's native server
c1 = socket.create_connection(lst.getsockname())
c2, _ = lst.accept()
print("ready", flush=True)
wait("go")
ends = (("accepted", accepted), ("client", client), ("pair-connector", c1), ("pair-acceptor", c2))
for _, s in ends:
    for _ in range(200):
        s.getsockname()
        s.getpeername()
for tag, s in ends:
    print(tag, name(s.getsockname), name(s.getpeername), flush=True)
print("counted", flush=True)
wait("reset")
# The test reset its end of `accepted` (SO_LINGER {1, 0}); `c1` closes in order.
accepted.settimeout(10)
try:
    print("accepted-recv", accepted.recv(1))
except OSError as e:
    print("accepted-recv", errno.errorcode[e.errno])
print("after-reset", state(accepted.getsockname), state(accepted.getpeername))
c1.close()
c2.settimeout(10)
print("pair-acceptor-recv", c2.recv(1))
print("after-close", state(c2.getsockname), state(c2.getpeername))
client.shutdown(socket.SHUT_WR)
client.settimeout(10)
print("client-recv", client.recv(1))
print("both-shut", state(client.getsockname), state(client.getpeername))
# The same on pairs of this process's own (short-circuited under canal): a reset, and
# both directions shut in order (the first closer in TIME_WAIT, the other closed).
import struct
c3 = socket.create_connection(lst.getsockname())
c4, _ = lst.accept()
c4.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
c4.close()
c3.settimeout(10)
print("pair-reset-recv", state(lambda: c3.recv(1)))
print("pair-after-reset", state(c3.getsockname), state(c3.getpeername))
c5 = socket.create_connection(lst.getsockname())
c6, _ = lst.accept()
print("pair-open", name(c5.getpeername) == name(c6.getsockname))
# The accepting end closes after a reply (a server's usual end): the connector is in
# CLOSE_WAIT, still connected.
c7 = socket.create_connection(lst.getsockname())
c8, _ = lst.accept()
c8.sendall(b"bye")
c8.close()
c7.settimeout(10)
print("pair-closed-by-acceptor", c7.recv(10), c7.recv(10), state(c7.getpeername))
c7.close()
c5.shutdown(socket.SHUT_WR)
c6.settimeout(10)
print("pair-fin-recv", c6.recv(1), state(c6.getpeername))  # CLOSE_WAIT: still a peer
c6.shutdown(socket.SHUT_WR)
c5.settimeout(10)
print("pair-fin-back", c5.recv(1))
time.sleep(0.1)  # the last ACK
print("pair-both-shut", state(c5.getsockname), state(c5.getpeername),
      state(c6.getsockname), state(c6.getpeername))
print("done", flush=True)
