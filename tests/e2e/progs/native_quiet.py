"""A server of native clients that waits for them the way MODE says, then serves each
(1 byte echoed) and closes it, forever: `accept` (blocking accept()), `poll`
(poll() on the listener, then accept()), `select` (select(), then accept()),
`exec-poll` (the listener passed through exec to a new program that polls it),
`epoll` (a level-triggered epoll set), `epoll-et` (edge-triggered, non-blocking: each
event drained until EAGAIN), `epoll-oneshot` (EPOLLONESHOT, re-armed with MOD after
each client). Prints `READY <port>`. Used by test_direct.py: under canal, with
feature NATIVE_QUIET, canald has nothing to do for any of them once the listener
listens."""
import os
import select
import socket
import sys


def main():
    mode = sys.argv[1]
    if mode == "exec-poll":
        l = socket.socket()
        l.bind(("127.0.0.1", 0))
        l.listen(16)
        l.set_inheritable(True)
        os.execv(sys.executable, [sys.executable, __file__, "poll", str(l.fileno())])
    if len(sys.argv) > 2:
        l = socket.socket(fileno=int(sys.argv[2]))
    else:
        l = socket.socket()
        l.bind(("127.0.0.1", 0))
        l.listen(16)
    print("READY", l.getsockname()[1], flush=True)
    if mode.startswith("epoll"):
        serve_epoll(l, mode)
    p = select.poll()
    p.register(l, select.POLLIN)
    while True:
        if mode == "poll":
            assert p.poll(), "poll without a timeout returned nothing"
        elif mode == "select":
            assert select.select([l], [], [])[0] == [l]
        c = l.accept()[0]
        c.sendall(c.recv(1))
        c.close()


def serve(c):
    c.setblocking(True)
    c.sendall(c.recv(1))
    c.close()


def serve_epoll(l, mode):
    ep = select.epoll()
    flags = {"epoll": 0, "epoll-et": select.EPOLLET, "epoll-oneshot": select.EPOLLONESHOT}[mode]
    ep.register(l, select.EPOLLIN | flags)
    if mode == "epoll-et":
        l.setblocking(False)
    while True:
        events = ep.poll()
        assert events, "epoll without a timeout returned nothing"
        if mode == "epoll-et":
            while True:
                try:
                    serve(l.accept()[0])
                except BlockingIOError:
                    break
        else:
            serve(l.accept()[0])
            if mode == "epoll-oneshot":
                ep.modify(l, select.EPOLLIN | select.EPOLLONESHOT)


if __name__ == "__main__":
    main()
