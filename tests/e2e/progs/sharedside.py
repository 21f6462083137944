"""One socket side used by several threads or processes at once (the biased side locks,
protocol §3.4): every record must arrive whole, in each writer's order, none lost.

  sharedside.py serve [--readers 1|2]      prints "READY <port>", accepts one
      connection and reads to EOF. One reader parses 64-byte records: each intact,
      each writer's sequence numbers consecutive; prints "OK <records>". Two readers
      (threads on the one socket) cannot keep record bounds, so they check the byte
      count and the byte sum: "OK <bytes>".
  sharedside.py send --port P --writers W --records N [--fork]
      connects, sends one record from the main thread (so it takes the side first),
      prints "CONNECTED", waits for a line on stdin, then W writers (threads, or with
      --fork the parent and W-1 forked children) each send N records concurrently."""

import os
import socket
import sys
import threading

REC = 64


def record(writer, seq):
    head = b"%c%09d" % (ord("a") + writer, seq)
    body = bytes((writer * 31 + seq + i) & 0xFF for i in range(REC - len(head)))
    return head + body


# Sent by the main thread before the writers start (writer "z").
HELLO = record(25, 0)


def expected_sum(writers, records):
    total = sum(HELLO)
    for w in range(writers):
        for s in range(records):
            total += sum(record(w, s))
    return total


def fail(msg):
    print("FAIL", msg, flush=True)
    sys.exit(1)


def serve(readers):
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(1)
    print("READY", ls.getsockname()[1], flush=True)
    c, _ = ls.accept()
    if readers == 1:
        buf = bytearray()
        nxt = {}
        count = 0
        while True:
            b = c.recv(65536)
            if not b:
                break
            buf += b
            whole = len(buf) // REC * REC
            for off in range(0, whole, REC):
                r = bytes(buf[off:off + REC])
                w, seq = r[0] - ord("a"), int(r[1:10])
                if not 0 <= w < 26 or r != record(w, seq):
                    fail(f"record {count} garbled: {r!r}")
                want = nxt.get(w, 0)
                if seq != want:
                    fail(f"writer {w}: record {seq} where {want} was due")
                nxt[w] = seq + 1
                count += 1
            del buf[:whole]
        if buf:
            fail(f"{len(buf)} bytes of a partial record at the end")
        print("OK", count, flush=True)
        return
    got = [0] * readers
    sums = [0] * readers

    def read(i):
        while True:
            b = c.recv(4096)
            if not b:
                return
            got[i] += len(b)
            sums[i] += sum(b)

    ts = [threading.Thread(target=read, args=(i,)) for i in range(readers)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    print("OK", sum(got), sum(sums), flush=True)


def send(port, writers, records, use_fork):
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(HELLO)
    print("CONNECTED", flush=True)
    sys.stdin.readline()

    def write(w):
        for seq in range(records):
            s.sendall(record(w, seq))

    if use_fork:
        kids = []
        for w in range(1, writers):
            pid = os.fork()
            if pid == 0:
                try:
                    write(w)
                finally:
                    os._exit(0)
            kids.append(pid)
        write(0)
        for pid in kids:
            _, status = os.waitpid(pid, 0)
            if status != 0:
                fail(f"writer process {pid} ended with status {status}")
    else:
        ts = [threading.Thread(target=write, args=(w,)) for w in range(writers)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    s.close()
    print("OK sent", flush=True)


if __name__ == "__main__":
    a = sys.argv

    def opt(name, default=None):
        return int(a[a.index(name) + 1]) if name in a else default

    if a[1] == "serve":
        serve(opt("--readers", 1))
    else:
        send(opt("--port"), opt("--writers"), opt("--records"), "--fork" in a)
