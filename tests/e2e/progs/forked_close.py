"""A socket shared with a child that ended without closing it, then closed by the parent:
its address must be free at once, as natively.

  forked_close.py [ROUNDS]

For each kind (a TCP listener, a bound UDP socket) and each way the child ends
(os._exit with the socket open; SIGKILL), ROUNDS times: bind 127.0.0.1:0 (listen),
fork, let the child end, wait for it, close the socket, then at once
  - TCP: connect to the port (natively: ECONNREFUSED, the listener is gone) and
    bind the port again (natively: free, no SO_REUSEADDR needed: nothing was
    connected);
  - UDP: bind the port again (natively: free).
Prints one line per (kind, ending) with the outcomes counted, then "done". Under
canal a parent's close whose other holders are dead processes must take effect
before close() returns, as the kernel's does (libcanal asks canald to check the
socket's WATCH: protocol §4 Close, CLOSE_CHECK).
"""

import errno
import os
import signal
import socket
import sys
import time
from collections import Counter


def child_ends(how):
    pid = os.fork()
    if pid == 0:
        if how == "kill":
            time.sleep(30)
        os._exit(0)
    if how == "kill":
        os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


def outcome(fn):
    try:
        fn()
        return "ok"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))


def tcp_round(how):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    port = s.getsockname()[1]
    child_ends(how)
    s.close()
    c = socket.socket()
    connected = outcome(lambda: c.connect(("127.0.0.1", port)))
    c.close()
    again = socket.socket()
    rebound = outcome(lambda: again.bind(("127.0.0.1", port)))
    again.close()
    return f"connect={connected} rebind={rebound}"


def udp_round(how):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    child_ends(how)
    s.close()
    again = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rebound = outcome(lambda: again.bind(("127.0.0.1", port)))
    again.close()
    return f"rebind={rebound}"


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    for kind, fn in (("tcp", tcp_round), ("udp", udp_round)):
        for how in ("exit", "kill"):
            seen = Counter(fn(how) for _ in range(rounds))
            counts = " ".join(f"[{k}]x{n}" for k, n in sorted(seen.items()))
            print(f"{kind} {how}: {counts}", flush=True)
    print("done", flush=True)


if __name__ == "__main__":
    main()
