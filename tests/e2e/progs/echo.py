#!/usr/bin/env python3
"""Echo server and checking clients (stdlib only), for canal's end-to-end tests.

Usable as a CLI, natively or under `canal run`:

  echo.py serve tcp|udp [--host H] [--port P]
      Serve echo on H:P (port 0: any). Prints "READY <port>" on stdout once listening, then
      serves until killed. TCP: one thread per connection; on EOF from the client the
      server shuts down its sending side after echoing everything (half-close).
  echo.py tcp-msgs --port P [--count N] [--max-size B] [--seed S]
      N messages (default 10000) of random sizes 1..B bytes (default 256 KiB, log-uniform so
      small and large sizes are both common; the first is 1 B and the second B), each sent
      and read back over one connection, contents compared; message k goes out only after
      the echo of k-1 was checked (sent from a second thread, so big messages cannot
      deadlock on small buffers).
  echo.py udp-msgs --port P [--count N] [--max-size B] [--window W] [--seed S]
      N datagrams (default 3000) of random sizes 1..B (default 65507), at most W (default 8)
      and at most 96 KiB outstanding, so no socket buffer can overflow on loopback; every
      datagram must come back, intact and in order. A missing one fails after 5 s.
  echo.py tcp-bulk --port P [--conns C] [--bytes N]
      C concurrent connections (default 32), each sending N bytes (default 16 MiB) of random
      data and reading the echo; SHA-256 and length of what was sent and received compared.
  echo.py stream --port P
      Send random data to P forever (used to kill a guest mid-transfer). Prints
      "STREAMING" once connected and the first MiB went out.
  echo.py idle --port P
      Connect to P, print "CONNECTED", then block in recv() until the peer closes.
  echo.py selftest
      Start both echo servers in this process and run every client against them
      (what the e2e tests do under canal, natively).

Exit status 0 on success; on failure a message on stderr and exit status 1.
"""

import argparse
import hashlib
import math
import os
import random
import select
import socket
import sys
import threading
import time
from collections import deque

HOST = "127.0.0.1"
IO_TIMEOUT = 30.0  # seconds a single blocking socket operation may take


class CheckFailed(Exception):
    pass


def wait_go(args):
    """With --go-after-connect: print CONNECTED, then wait (at most 60 s) for a line on
    stdin, so a test can look at the connected sockets (`canal stat`) before any data
    moves."""
    if not getattr(args, "go_after_connect", False):
        return
    print("CONNECTED", flush=True)
    ready, _, _ = select.select([sys.stdin], [], [], 60.0)
    if not ready or not sys.stdin.readline():
        raise CheckFailed("no go line on stdin within 60 s after connecting")


def recv_exact(sock, n):
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise CheckFailed(f"connection closed after {got} of {n} echoed bytes")
        got += k
    return buf


# ---------------------------------------------------------------- servers


def _serve_tcp_conn(conn):
    with conn:
        try:
            while True:
                data = conn.recv(262144)
                if not data:
                    conn.shutdown(socket.SHUT_WR)
                    return
                conn.sendall(data)
        except OSError as e:
            print(f"echo server: connection error: {e}", file=sys.stderr)


def start_tcp_server(host, port):
    lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind((host, port))
    lsock.listen(128)

    def loop():
        while True:
            conn, _ = lsock.accept()
            threading.Thread(target=_serve_tcp_conn, args=(conn,), daemon=True).start()

    threading.Thread(target=loop, daemon=True).start()
    return lsock.getsockname()[1]


def start_udp_server(host, port):
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    sock.bind((host, port))

    def loop():
        while True:
            data, addr = sock.recvfrom(65536)
            sock.sendto(data, addr)

    threading.Thread(target=loop, daemon=True).start()
    return sock.getsockname()[1]


def cmd_serve(args):
    start = start_tcp_server if args.proto == "tcp" else start_udp_server
    port = start(args.host, args.port)
    print(f"READY {port}", flush=True)
    while True:
        time.sleep(3600)


# ---------------------------------------------------------------- clients


def random_sizes(rng, count, max_size):
    """1 and max_size first, then log-uniform sizes in [1, max_size]."""
    sizes = [1, max_size][:count]
    top = math.log(max_size + 1)
    while len(sizes) < count:
        sizes.append(min(max_size, max(1, int(math.exp(rng.uniform(0.0, top))))))
    return sizes


def payload(pool, rng, size, seq):
    """size bytes: a random slice of pool with the sequence number stamped in front, so two
    messages of the same size are never equal."""
    off = rng.randrange(0, len(pool) - size + 1)
    data = bytearray(pool[off : off + size])
    stamp = seq.to_bytes(8, "little")[: min(8, size)]
    data[: len(stamp)] = stamp
    return bytes(data)


def pick_seed(args):
    seed = args.seed if args.seed is not None else random.randrange(1 << 32)
    return seed, random.Random(seed)


def cmd_tcp_msgs(args):
    """One message at a time: message k is sent only after the echo of message k-1 was read
    and checked. The sending runs on its own thread so a message larger than the buffering
    between the two ends cannot deadlock the client (a plain send-all-then-read would need
    the whole message to fit in the socket buffers; that is a buffer-size property, not
    what this checks)."""
    seed, rng = pick_seed(args)
    pool = os.urandom(2 * args.max_size)
    sizes = random_sizes(rng, args.count, args.max_size)
    total = 0
    turn = threading.Semaphore(1)  # the writer may be one message ahead of the reader
    sent = deque()
    sent_ready = threading.Semaphore(0)
    writer_error = []
    stop = threading.Event()
    with socket.create_connection((args.host, args.port), timeout=IO_TIMEOUT) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        wait_go(args)
        t0 = time.monotonic()

        def writer():
            try:
                for seq, size in enumerate(sizes):
                    while not turn.acquire(timeout=1.0):
                        if stop.is_set():
                            return
                    msg = payload(pool, rng, size, seq)
                    sent.append(msg)
                    sent_ready.release()
                    s.sendall(msg)
            except OSError as e:
                writer_error.append(e)
                sent_ready.release()

        wt = threading.Thread(target=writer, daemon=True)
        wt.start()
        try:
            for seq, size in enumerate(sizes):
                if not sent_ready.acquire(timeout=IO_TIMEOUT):
                    raise CheckFailed(f"tcp message {seq}: the writer did not send it within {IO_TIMEOUT} s")
                if writer_error:
                    raise CheckFailed(f"tcp message {seq}: send failed: {writer_error[0]}")
                msg = sent.popleft()
                back = recv_exact(s, size)
                if back != msg:
                    bad = next(i for i in range(size) if back[i] != msg[i])
                    raise CheckFailed(
                        f"tcp message {seq} ({size} B, seed {seed}): echo differs from byte {bad} on"
                    )
                total += size
                turn.release()
        finally:
            stop.set()
        wt.join(IO_TIMEOUT)
        if writer_error:
            raise CheckFailed(f"send failed: {writer_error[0]}")
        s.shutdown(socket.SHUT_WR)
        s.settimeout(IO_TIMEOUT)
        rest = s.recv(1)
        if rest:
            raise CheckFailed(f"unexpected extra echoed data after the last message: {rest!r}")
    dt = time.monotonic() - t0
    print(f"OK tcp-msgs: {len(sizes)} messages, {total} bytes echoed in {dt:.2f} s (seed {seed})")


def cmd_udp_msgs(args):
    seed, rng = pick_seed(args)
    pool = os.urandom(2 * args.max_size)
    sizes = random_sizes(rng, args.count, args.max_size)
    budget = 96 * 1024
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    s.connect((args.host, args.port))
    wait_go(args)
    outstanding = deque()  # (seq, payload)
    out_bytes = 0
    nxt = 0
    total = 0
    t0 = time.monotonic()  # after the go
    try:
        while nxt < len(sizes) or outstanding:
            can_send = nxt < len(sizes) and (
                not outstanding
                or (len(outstanding) < args.window and out_bytes + sizes[nxt] <= budget)
            )
            if can_send:
                msg = payload(pool, rng, sizes[nxt], nxt)
                sent = s.send(msg)
                if sent != len(msg):
                    raise CheckFailed(f"udp datagram {nxt}: send returned {sent} of {len(msg)}")
                outstanding.append((nxt, msg))
                out_bytes += len(msg)
                nxt += 1
                continue
            s.settimeout(5.0)
            try:
                back = s.recv(65536)
            except socket.timeout:
                seq, msg = outstanding[0]
                raise CheckFailed(
                    f"udp datagram {seq} ({len(msg)} B, seed {seed}) never came back within 5 s "
                    f"({len(outstanding)} outstanding, {seq} echoed fine before it)"
                )
            seq, msg = outstanding.popleft()
            out_bytes -= len(msg)
            if back != msg:
                raise CheckFailed(
                    f"udp datagram {seq} (seed {seed}): sent {len(msg)} B, got back {len(back)} B "
                    f"{'with different contents' if len(back) == len(msg) else ''}"
                    " (lost, reordered, truncated or corrupted)"
                )
            total += len(msg)
    finally:
        s.close()
    dt = time.monotonic() - t0
    print(f"OK udp-msgs: {len(sizes)} datagrams, {total} bytes echoed in {dt:.2f} s")


def _bulk_one(s, nbytes, idx, results):
    h_sent = hashlib.sha256()
    h_recv = hashlib.sha256()
    received = [0]
    err = []

    def reader():
        try:
            while True:
                data = s.recv(262144)
                if not data:
                    return
                h_recv.update(data)
                received[0] += len(data)
        except OSError as e:
            err.append(f"recv: {e}")

    rt = threading.Thread(target=reader, daemon=True)
    rt.start()
    try:
        left = nbytes
        chunk = 1 << 20
        while left:
            data = os.urandom(min(chunk, left))
            h_sent.update(data)
            s.sendall(data)
            left -= len(data)
        s.shutdown(socket.SHUT_WR)
    except OSError as e:
        err.append(f"send: {e}")
    rt.join(IO_TIMEOUT * 4)
    s.close()
    if rt.is_alive():
        err.append("reader did not finish")
    if err:
        results[idx] = f"connection {idx}: " + "; ".join(err)
    elif received[0] != nbytes or h_recv.digest() != h_sent.digest():
        results[idx] = (
            f"connection {idx}: sent {nbytes} B sha256 {h_sent.hexdigest()[:16]}, "
            f"echoed {received[0]} B sha256 {h_recv.hexdigest()[:16]}"
        )
    else:
        results[idx] = None


def cmd_tcp_bulk(args):
    results = [f"connection {i}: did not finish" for i in range(args.conns)]
    socks = []
    for i in range(args.conns):
        try:
            socks.append(socket.create_connection((args.host, args.port), timeout=IO_TIMEOUT))
        except OSError as e:
            raise CheckFailed(f"connection {i}: connect failed: {e}")
    wait_go(args)
    t0 = time.monotonic()
    threads = [
        threading.Thread(target=_bulk_one, args=(socks[i], args.bytes, i, results))
        for i in range(args.conns)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    bad = [r for r in results if r]
    if bad:
        raise CheckFailed(f"{len(bad)} of {args.conns} connections failed:\n  " + "\n  ".join(bad))
    dt = time.monotonic() - t0
    print(
        f"OK tcp-bulk: {args.conns} connections x {args.bytes} bytes echoed, "
        f"sha256 equal, in {dt:.2f} s"
    )


def cmd_stream(args):
    s = socket.create_connection((args.host, args.port), timeout=IO_TIMEOUT)
    block = os.urandom(1 << 16)
    sent = 0
    announced = False
    while True:
        s.sendall(block)
        sent += len(block)
        if not announced and sent >= 1 << 20:
            print("STREAMING", flush=True)
            announced = True


def cmd_idle(args):
    s = socket.create_connection((args.host, args.port), timeout=IO_TIMEOUT)
    s.settimeout(None)
    print("CONNECTED", flush=True)
    data = s.recv(1)
    print(f"peer closed ({data!r})", flush=True)


def cmd_selftest(args):
    tport = start_tcp_server(HOST, 0)
    uport = start_udp_server(HOST, 0)
    base = dict(host=HOST, seed=1)
    cmd_tcp_msgs(argparse.Namespace(port=tport, count=args.count, max_size=262144, **base))
    cmd_udp_msgs(argparse.Namespace(port=uport, count=3000, max_size=65507, window=8, **base))
    cmd_tcp_bulk(argparse.Namespace(host=HOST, port=tport, conns=32, bytes=16 << 20))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    sp = sub.add_parser("serve")
    sp.add_argument("proto", choices=["tcp", "udp"])
    sp.add_argument("--host", default=HOST)
    sp.add_argument("--port", type=int, default=0)
    for name, count, max_size in (("tcp-msgs", 10000, 262144), ("udp-msgs", 3000, 65507)):
        c = sub.add_parser(name)
        c.add_argument("--host", default=HOST)
        c.add_argument("--port", type=int, required=True)
        c.add_argument("--count", type=int, default=count)
        c.add_argument("--max-size", type=int, default=max_size)
        c.add_argument("--seed", type=int, default=None)
        c.add_argument("--go-after-connect", action="store_true")
        if name == "udp-msgs":
            c.add_argument("--window", type=int, default=8)
    b = sub.add_parser("tcp-bulk")
    b.add_argument("--host", default=HOST)
    b.add_argument("--port", type=int, required=True)
    b.add_argument("--conns", type=int, default=32)
    b.add_argument("--bytes", type=int, default=16 << 20)
    b.add_argument("--go-after-connect", action="store_true")
    for name in ("stream", "idle"):
        c = sub.add_parser(name)
        c.add_argument("--host", default=HOST)
        c.add_argument("--port", type=int, required=True)
    st = sub.add_parser("selftest")
    st.add_argument("--count", type=int, default=10000)
    args = p.parse_args(argv)
    fn = {
        "serve": cmd_serve,
        "tcp-msgs": cmd_tcp_msgs,
        "udp-msgs": cmd_udp_msgs,
        "tcp-bulk": cmd_tcp_bulk,
        "stream": cmd_stream,
        "idle": cmd_idle,
        "selftest": cmd_selftest,
    }[args.cmd]
    try:
        fn(args)
    except CheckFailed as e:
        print(f"FAIL {args.cmd}: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"FAIL {args.cmd}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
