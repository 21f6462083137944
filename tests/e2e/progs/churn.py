#!/usr/bin/env python3
"""Short connections to an echo server (progs/echo.py serve tcp), checked byte for byte,
and what shared memory the process has mapped for them meanwhile.

  churn.py --port P [--serial N] [--held H] [--size B]

N connections one after another, then H open at once; each sends B random bytes,
half-closes and reads the echo to EOF, comparing it. While the H connections are open
the process counts its mappings of canal's shared files in /proc/self/maps (distinct
files named canal-arena and canal-segment) and prints one JSON line:
{"arenas": A, "segments": S, "connections": N + H}. Exit status 0 when every echo
matched; a message on stderr and 1 otherwise. Natively both counts are 0.
"""

import argparse
import json
import os
import socket
import sys


def echo(port, payload):
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(payload)
    s.shutdown(socket.SHUT_WR)
    got = bytearray()
    while True:
        b = s.recv(65536)
        if not b:
            break
        got += b
    return s, bytes(got)


def mapped_files():
    files = {"canal-arena": set(), "canal-segment": set()}
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 6:
                for name in files:
                    if name in parts[5]:
                        files[name].add(parts[4])  # the inode
    return len(files["canal-arena"]), len(files["canal-segment"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--serial", type=int, default=200)
    ap.add_argument("--held", type=int, default=40)
    ap.add_argument("--size", type=int, default=3000)
    a = ap.parse_args()
    done = 0
    for i in range(a.serial):
        payload = os.urandom(a.size)
        s, got = echo(a.port, payload)
        s.close()
        if got != payload:
            sys.exit(f"churn: connection {i}: echo differs ({len(got)} of {len(payload)} bytes)")
        done += 1
    held = []
    for i in range(a.held):
        payload = os.urandom(a.size)
        s, got = echo(a.port, payload)
        if got != payload:
            sys.exit(f"churn: held connection {i}: echo differs")
        held.append(s)
        done += 1
    arenas, segments = mapped_files()
    print(json.dumps({"arenas": arenas, "segments": segments, "connections": done}), flush=True)
    for s in held:
        s.close()


if __name__ == "__main__":
    main()
