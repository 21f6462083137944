"""A writer that fills the connection and waits for room, in every way a program
waits: a blocking send (SO_SNDTIMEO 5 s), two threads blocked in send at once, poll
for POLLOUT, and epoll for EPOLLOUT level- and edge-triggered after EAGAIN. The
reader starts late and reads in slices with pauses, so the writer sleeps for room
many times; each wait must end when the reader frees room. A lost wake-up shows as a
wait of about a second (the sleeper's periodic re-check finds the room) or a 5 s
timeout; the reader never pauses longer than 0.2 s, so a wait over LONGEST fails.
Prints one line per mode: "MODE ok BYTES".

Usage: room.py [MODE...] (default: every mode).
"""
import hashlib
import os
import select
import socket
import sys
import threading
import time

TOTAL = 8 << 20
CHUNK = 256 << 10
MODES = ["block", "two-threads", "poll", "epoll", "epoll-et"]
LONGEST = 0.6
longest = [0.0]


def timed(f, *a):
    t = time.monotonic()
    try:
        return f(*a)
    finally:
        longest[0] = max(longest[0], time.monotonic() - t)


def reader(ls):
    c, _ = ls.accept()
    ls.close()
    time.sleep(0.2)  # the writer fills everything and sleeps first
    h, got, pause = hashlib.sha256(), 0, 0
    while True:
        b = c.recv(64 << 10)
        if not b:
            break
        h.update(b)
        got += len(b)
        if got - pause >= (1 << 20):
            pause = got
            time.sleep(0.01)  # the writer sleeps for room again
    c.sendall(h.hexdigest().encode() + b" %d" % got)
    c.close()


def payload(i):
    return bytes((i * 7 + k) & 0xFF for k in range(256)) * (CHUNK // 256)


def send_blocking(c, data):
    view = memoryview(data)
    while view:
        try:
            n = timed(c.send, view)
        except BlockingIOError:  # SO_SNDTIMEO ran out: nobody woke us
            raise SystemExit("blocking send timed out waiting for room")
        view = view[n:]


def send_waiting(c, data, wait):
    view = memoryview(data)
    while view:
        try:
            view = view[c.send(view):]
        except BlockingIOError:
            if not timed(wait):
                raise SystemExit("timed out waiting for room")


def write(mode, c):
    chunks = [payload(i) for i in range(TOTAL // CHUNK)]
    if mode in ("block", "two-threads"):
        c.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, b"\x05" + bytes(15))
    if mode == "block":
        for d in chunks:
            send_blocking(c, d)
        return chunks
    if mode == "two-threads":
        half = len(chunks) // 2
        errs = []

        def run(part):
            try:
                for d in part:
                    send_blocking(c, d)
            except SystemExit as e:
                errs.append(str(e))

        ts = [threading.Thread(target=run, args=(p,)) for p in (chunks[:half], chunks[half:])]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        if errs:
            raise SystemExit(errs[0])
        return None  # interleaved: only the count is checked
    c.setblocking(False)
    if mode == "poll":
        p = select.poll()
        p.register(c, select.POLLOUT)
        wait = lambda: bool(p.poll(5000))
    else:
        ep = select.epoll()
        ep.register(c, select.EPOLLOUT | (select.EPOLLET if mode == "epoll-et" else 0))
        wait = lambda: bool(ep.poll(5))
    for d in chunks:
        send_waiting(c, d, wait)
    c.setblocking(True)
    return chunks


def run(mode):
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(1)
    port = ls.getsockname()[1]
    pid = os.fork()
    if pid == 0:
        try:
            reader(ls)
        finally:
            os._exit(0)
    ls.close()
    c = socket.create_connection(("127.0.0.1", port))
    chunks = write(mode, c)
    c.shutdown(socket.SHUT_WR)
    with c, c.makefile("rb") as f:
        answer = f.read()
    os.waitpid(pid, 0)
    digest, got = answer.split()
    assert int(got) == TOTAL, f"{mode}: the reader got {int(got)} of {TOTAL} bytes"
    if chunks is not None:
        assert digest.decode() == hashlib.sha256(b"".join(chunks)).hexdigest(), f"{mode}: bytes differ"
    assert longest[0] < LONGEST, (
        f"{mode}: a wait for room lasted {longest[0]:.2f} s although the reader freed "
        "room sooner: its wake-up was lost"
    )
    longest[0] = 0.0
    print(f"{mode} ok {TOTAL}", flush=True)


if __name__ == "__main__":
    for m in sys.argv[1:] or MODES:
        assert m in MODES, m
        run(m)
