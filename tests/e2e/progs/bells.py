"""Request/response between two guests whose every wait is a poll/select sleep
(tests/e2e/test_shortcut.py, protocol §8.8 bells).

  bells.py serve [--group K] [--epoll]
                                     echo server: one thread per K connections (1:
                                     select() on its one; more: poll(), or an epoll
                                     set of the thread's own, on all of its K)
  bells.py client --port P --count N [--conns C]
                                     C connections (threads), N round trips each;
                                     poll() before every recv; every reply checked
Prints READY <port> (server) and OK bells <round trips> (client)."""

import argparse
import os
import select
import socket
import sys
import threading


def serve(group, use_epoll):
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", 0))
    ls.listen(64)
    print("READY", ls.getsockname()[1], flush=True)

    def echo(c):
        with c:
            while True:
                select.select([c], [], [])
                data = c.recv(65536)
                if not data:
                    return
                c.sendall(data)

    def echo_group(conns):
        p = select.epoll() if use_epoll else select.poll()
        by_fd = {c.fileno(): c for c in conns}
        for c in conns:
            p.register(c, select.POLLIN)
        while by_fd:
            for fd, _ in p.poll():
                c = by_fd[fd]
                data = c.recv(65536)
                if not data:
                    p.unregister(c)
                    del by_fd[fd]
                    c.close()
                    continue
                c.sendall(data)

    pending = []
    while True:
        c, _ = ls.accept()
        if group == 1:
            threading.Thread(target=echo, args=(c,), daemon=True).start()
            continue
        pending.append(c)
        if len(pending) == group:
            threading.Thread(target=echo_group, args=(pending,), daemon=True).start()
            pending = []


def client(port, count, conns):
    errors = []

    def run(k):
        try:
            s = socket.create_connection(("127.0.0.1", port))
            p = select.poll()
            p.register(s, select.POLLIN)
            for i in range(count):
                msg = f"{k}:{i}:".encode() + os.urandom(8).hex().encode()
                s.sendall(msg)
                got = b""
                while len(got) < len(msg):
                    p.poll()
                    chunk = s.recv(65536)
                    if not chunk:
                        raise RuntimeError(f"conn {k}: EOF after {i} round trips")
                    got += chunk
                if got != msg:
                    raise RuntimeError(f"conn {k} trip {i}: sent {msg!r}, got {got!r}")
            s.close()
        except Exception as e:  # reported below, the test fails on it
            errors.append(repr(e))

    threads = [threading.Thread(target=run, args=(k,)) for k in range(conns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        print("FAIL", *errors, sep="\n", flush=True)
        sys.exit(1)
    print("OK bells", count * conns, flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["serve", "client"])
    ap.add_argument("--port", type=int)
    ap.add_argument("--count", type=int, default=200)
    ap.add_argument("--conns", type=int, default=1)
    ap.add_argument("--group", type=int, default=1)
    ap.add_argument("--epoll", action="store_true")
    a = ap.parse_args()
    if a.mode == "serve":
        serve(a.group, a.epoll)
    else:
        client(a.port, a.count, a.conns)


if __name__ == "__main__":
    main()
