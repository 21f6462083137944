"""Connects as programs make them, for fast connects (protocol §8.10): the same checks
pass natively and under canal, where every connect after a listener's first is made
with a ticket, without a CONNECT.

  server               listen on 127.0.0.1:0 ("PORT p"); per connection: read to EOF,
                       answer sha256 and the peer name accept() gave, print
                       "GOT <sha> <len>". "close" on stdin closes the listener
                       ("CLOSED" once close() returned); EOF on stdin ends it.
  client PORT N        N connections one after another, payloads of 0..256 KiB: names
                       on both ends agree, the echo's hash matches; "OK N", then waits
                       for a line on stdin before it exits (its guest stays listed).
  exit PORT SIZE       one connection as above, then a connection that sends SIZE
                       bytes and exits at once (no close, no shutdown): "SENT <sha>".
  refused PORT         one connection as above ("WARM"); after a line on stdin, a
                       connect: "RESULT REFUSED" (ECONNREFUSED) or what happened instead.
  nonblock PORT        a connection as above, then a non-blocking one: connect,
                       poll for POLLOUT, SO_ERROR, connect again twice: "NB <results>".
  fork PORT K N        one connection, then K children of N connections each: "FORKED".

Addresses (the defaults are loopback's; an isolated guest sees others, docs/isolation.md):
  FAST_LISTEN     the server's listening address (127.0.0.1), FAST_LISTEN_PORT its port (0)
  FAST_DST        where clients connect (127.0.0.1)
  FAST_LOCAL      the address a client's getsockname() must give (FAST_DST)
  FAST_SEEN       the address the server's accept() must give for a client (FAST_LOCAL)
"""
import errno
import hashlib
import os
import select
import socket
import sys
import threading

LISTEN = os.environ.get("FAST_LISTEN", "127.0.0.1")
LISTEN_PORT = int(os.environ.get("FAST_LISTEN_PORT", "0"))
DST = os.environ.get("FAST_DST", "127.0.0.1")
LOCAL = os.environ.get("FAST_LOCAL", DST)
SEEN = os.environ.get("FAST_SEEN", LOCAL)


def serve():
    lsock = socket.socket()
    lsock.bind((LISTEN, LISTEN_PORT))
    lsock.listen(64)
    print("PORT", lsock.getsockname()[1], flush=True)
    closing = threading.Event()

    def control():
        for line in sys.stdin:
            if line.strip() == "close":
                closing.set()
        os._exit(0)

    threading.Thread(target=control, daemon=True).start()
    # The accepting thread closes the listener itself: a close() from another thread
    # while this one is blocked in accept() would leave it listening (Linux keeps the
    # socket until accept returns).
    while not closing.is_set():
        if not select.select([lsock], [], [], 0.05)[0]:
            continue
        c, peer = lsock.accept()
        threading.Thread(target=answer, args=(c, peer), daemon=True).start()
    lsock.close()
    print("CLOSED", flush=True)
    threading.Event().wait()


def answer(c, peer):
    h, n = hashlib.sha256(), 0
    with c:
        while True:
            b = c.recv(65536)
            if not b:
                break
            h.update(b)
            n += len(b)
        print("GOT", h.hexdigest(), n, flush=True)
        c.sendall(f"{h.hexdigest()} {peer[0]} {peer[1]}\n".encode())


def read_answer(s):
    """The server's answer line (to EOF if it never comes)."""
    reply = b""
    while not reply.endswith(b"\n"):
        b = s.recv(4096)
        if not b:
            break
        reply += b
    return reply


def round_trip(port, size, seed):
    """One connection: names, a payload, its echoed hash. Raises on any mismatch."""
    payload = os.urandom(16) * (size // 16) + os.urandom(size % 16) if seed else b""
    with socket.create_connection((DST, port), timeout=10) as s:
        local, peer = s.getsockname(), s.getpeername()
        assert peer == (DST, port), f"peer name {peer}"
        assert local[0] == LOCAL and local[1] != 0, f"local name {local}"
        s.sendall(payload)
        s.shutdown(socket.SHUT_WR)
        reply = read_answer(s)
        assert reply.endswith(b"\n"), f"EOF before the answer ({reply!r})"
        sha, host, pport = reply.decode().split()
        assert sha == hashlib.sha256(payload).hexdigest(), "echoed hash differs"
        assert (host, int(pport)) == (SEEN, local[1]), f"server saw {host}:{pport}, client is {local}"
        assert s.recv(1) == b"", "more after the answer"


def client(port, n):
    for i in range(n):
        round_trip(port, (i * 7919) % (256 * 1024), i)
    print("OK", n, flush=True)
    sys.stdin.readline()


def exit_after_send(port, size):
    round_trip(port, 100, 1)
    payload = os.urandom(size)
    s = socket.create_connection((DST, port), timeout=10)
    s.sendall(payload)
    print("SENT", hashlib.sha256(payload).hexdigest(), flush=True)
    os._exit(0)


def refused(port):
    round_trip(port, 100, 1)
    round_trip(port, 100, 2)
    print("WARM", flush=True)
    sys.stdin.readline()
    try:
        socket.create_connection((DST, port), timeout=5).close()
        print("RESULT CONNECTED", flush=True)
    except OSError as e:
        print("RESULT REFUSED" if e.errno == errno.ECONNREFUSED else f"RESULT {e}", flush=True)


def nonblock(port):
    round_trip(port, 100, 1)
    s = socket.socket()
    s.setblocking(False)
    out = [errno.errorcode.get(s.connect_ex((DST, port)), "0")]
    p = select.poll()
    p.register(s, select.POLLOUT)
    ev = p.poll(5000)
    out.append("POLLOUT" if ev and ev[0][1] & select.POLLOUT else f"poll {ev}")
    out.append(str(s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)))
    out.append(errno.errorcode.get(s.connect_ex((DST, port)), "0"))
    out.append(errno.errorcode.get(s.connect_ex((DST, port)), "0"))
    s.setblocking(True)
    s.sendall(b"x")
    s.shutdown(socket.SHUT_WR)
    s.settimeout(10)
    reply = read_answer(s)
    out.append("echo" if reply.split()[:1] == [hashlib.sha256(b"x").hexdigest().encode()] else "bad")
    print("NB", " ".join(out), flush=True)


def forked(port, k, n):
    round_trip(port, 100, 1)
    kids = []
    for j in range(k):
        pid = os.fork()
        if pid == 0:
            try:
                for i in range(n):
                    round_trip(port, (i * 131 + j) % 4096, i + 1)
            except BaseException as e:  # any failure is the child's exit status
                import traceback
                traceback.print_exc()
                print("CHILD", j, "FAILED", i, e, flush=True)
                os._exit(1)
            os._exit(0)
        kids.append(pid)
    bad = [p for p in kids if os.waitpid(p, 0)[1] != 0]
    print("FORKED" if not bad else f"FAILED {len(bad)}", flush=True)


if __name__ == "__main__":
    cmd, args = sys.argv[1], [int(a) for a in sys.argv[2:]]
    {"server": serve, "client": client, "exit": exit_after_send, "refused": refused,
     "nonblock": nonblock, "fork": forked}[cmd](*args)
