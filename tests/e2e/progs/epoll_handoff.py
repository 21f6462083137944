"""One thread sleeps in epoll_wait while another changes the set: the pattern of
Apache's event MPM (a worker hands a kept-alive connection to the listener thread),
tokio's and mio's runtimes (any thread registers, one waits). The kernel wakes the
waiter when the change makes a descriptor ready, or later when data comes. Each case
must end within LONGEST of its event; the waiter's own timeout is 5 s (canal's periodic
re-check, a second, would fail too). Prints "CASE ok SECONDS" per case.

Cases (the waiter's set is *bare* — no socket at all when it starts waiting, so the
kernel serves the wait — or *watched*: it already watches a listener):
  add-ready-bare, add-ready-watched   ADD of a socket with data already queued
  add-later-bare, add-later-watched   ADD, then data 0.1 s later
  rearm-oneshot                       EPOLLONESHOT item fired and taken; data queued
                                      meanwhile; another thread's MOD re-arms it
  edge-after-add                      EPOLLET item added while the waiter sleeps
  two-waiters                         two threads asleep on one watched set, two
                                      sockets added (two threads in the kernel's wait on
                                      a bare set: only one wakes, docs/compat.md)

Usage: epoll_handoff.py [CASE...] (default: every case).
"""
import select
import socket
import sys
import threading
import time

LONGEST = 0.5
SETTLE = 0.2  # how long the waiter is given to fall asleep


def pair(listener):
    c = socket.create_connection(listener.getsockname())
    s, _ = listener.accept()
    return c, s


def new_set(listener, watched):
    """An epoll set, watching `listener` if `watched`, and a fresh connection."""
    ep = select.epoll()
    if watched:
        ep.register(listener.fileno(), select.EPOLLIN)
    return (ep, *pair(listener))


def readable_after(waiter, since, sock):
    """How long after `since` the waiter woke, which must be for `sock` alone."""
    took, events = waiter.took(since)
    assert events == [(sock.fileno(), select.EPOLLIN)], events
    return took


class Waiter(threading.Thread):
    """Waits once on `ep` (5 s) and records when and what it got."""

    def __init__(self, ep):
        super().__init__(daemon=True)
        self.ep, self.events, self.at = ep, None, None
        self.start()
        time.sleep(SETTLE)

    def run(self):
        self.events = self.ep.poll(5)
        self.at = time.monotonic()

    def took(self, since):
        self.join(6)
        if not self.events:
            raise AssertionError(f"the waiter got {self.events!r} after {self.at - since:.3f} s")
        return self.at - since, self.events


def case_add(listener, watched, ready):
    ep, c, s = new_set(listener, watched)
    if ready:
        c.send(b"x")
        time.sleep(0.05)
    w = Waiter(ep)
    t = time.monotonic()
    ep.register(s.fileno(), select.EPOLLIN)
    if not ready:
        time.sleep(0.1)
        t = time.monotonic()
        c.send(b"x")
    return readable_after(w, t, s)


def case_rearm(listener):
    ep, c, s = new_set(listener, True)
    ep.register(s.fileno(), select.EPOLLIN | select.EPOLLONESHOT)
    c.send(b"x")
    assert ep.poll(5) == [(s.fileno(), select.EPOLLIN)]
    assert s.recv(1) == b"x"
    c.send(b"y")  # arrives while the item is disarmed
    time.sleep(0.05)
    w = Waiter(ep)
    t = time.monotonic()
    ep.modify(s.fileno(), select.EPOLLIN | select.EPOLLONESHOT)
    return readable_after(w, t, s)


def case_edge(listener):
    ep, c, s = new_set(listener, True)
    w = Waiter(ep)
    ep.register(s.fileno(), select.EPOLLIN | select.EPOLLET)
    time.sleep(0.1)
    t = time.monotonic()
    c.send(b"x")
    return readable_after(w, t, s)


def case_two_waiters(listener):
    ep, c1, s1 = new_set(listener, True)
    c2, s2 = pair(listener)
    w1, w2 = Waiter(ep), Waiter(ep)
    ep.register(s1.fileno(), select.EPOLLIN)
    ep.register(s2.fileno(), select.EPOLLIN)
    time.sleep(0.1)
    t = time.monotonic()
    c1.send(b"1")
    c2.send(b"2")
    took = max(w1.took(t)[0], w2.took(t)[0])
    got = {fd for w in (w1, w2) for fd, _ in w.events}
    assert got <= {s1.fileno(), s2.fileno()} and got, got
    return took


CASES = {
    "add-ready-bare": lambda l: case_add(l, False, True),
    "add-ready-watched": lambda l: case_add(l, True, True),
    "add-later-bare": lambda l: case_add(l, False, False),
    "add-later-watched": lambda l: case_add(l, True, False),
    "rearm-oneshot": case_rearm,
    "edge-after-add": case_edge,
    "two-waiters": case_two_waiters,
}


def main():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    failed = 0
    for name in sys.argv[1:] or CASES:
        try:
            took = CASES[name](listener)
            ok = took <= LONGEST
            print(f"{name} {'ok' if ok else 'SLOW'} {took:.3f}", flush=True)
        except AssertionError as e:
            ok = False
            print(f"{name} FAIL {e}", flush=True)
        failed += not ok
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
