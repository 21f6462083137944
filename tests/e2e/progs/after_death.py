"""An event-loop server that logs errors and goes on (as unbound, PHP's built-in
server, MariaDB and stunnel do), to see what it does once canald is gone: a UDP socket
and a listener in one selectors loop, and a connected stream to a peer of its own.

Prints READY, waits for a line on stdin (the test kills canald meanwhile), then runs its
loop for LOOP seconds, counting the errors each socket reported, and prints:
  udp N / listener N     errors each reported (its calls after the first must not fail)
  stream ERRNO           the connection's recv (a reset, reported on every call)
  again udp ERRNO / again listener ERRNO   a non-blocking call after the loop
  blocking-recv ERROR SECONDS              a recv with a 0.3 s timeout
  cpu SECONDS            the CPU the process used during the loop
"""
import errno
import os
import selectors
import socket
import sys
import time

LOOP = 2.0

u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.bind(("127.0.0.1", 0))
u.setblocking(False)
lst = socket.socket()
lst.bind(("127.0.0.1", 0))
lst.listen()
lst.setblocking(False)
c = socket.create_connection(lst.getsockname())
peer, _ = lst.accept()
print("READY", flush=True)
sys.stdin.readline()

sel = selectors.DefaultSelector()
sel.register(u, selectors.EVENT_READ, "udp")
sel.register(lst, selectors.EVENT_READ, "listener")
errors = {"udp": 0, "listener": 0}
t0 = time.monotonic()
cpu0 = time.process_time()
while time.monotonic() - t0 < LOOP:
    for key, _ in sel.select(timeout=0.5):
        try:
            if key.data == "udp":
                u.recvfrom(100)
            else:
                lst.accept()
        except BlockingIOError:
            pass
        except OSError:
            errors[key.data] += 1  # logged, and the loop goes on
cpu = time.process_time() - cpu0
print("udp", errors["udp"], flush=True)
print("listener", errors["listener"], flush=True)
try:
    c.recv(10)
    print("stream ok", flush=True)
except OSError as e:
    print("stream", errno.errorcode.get(e.errno, e.errno), flush=True)
for name, f in (("udp", lambda: u.recvfrom(10)), ("listener", lst.accept)):
    try:
        f()
        print("again", name, "ok", flush=True)
    except OSError as e:
        print("again", name, errno.errorcode.get(e.errno, e.errno), flush=True)
u.setblocking(True)
u.settimeout(0.3)
t = time.monotonic()
try:
    u.recvfrom(10)
    print("blocking-recv ok", flush=True)
except OSError as e:
    print("blocking-recv", type(e).__name__, round(time.monotonic() - t, 1), flush=True)
print("cpu %.2f" % cpu, flush=True)
