"""A guest that sends bytes and closes, for the close-time delivery tests.

  closer.py send --port P --bytes N [--stay] [--linger SECS]
      connects to 127.0.0.1:P, sends N bytes of a fixed pattern (sendall), prints
      "SENT <n> <sha256>", closes (SO_LINGER {1, SECS} first when given) and exits at
      once, or with --stay prints "CLOSED" and waits for a line on stdin before exiting.
  closer.py rr --port P --seconds S
      connects, prints "CONNECTED", waits for a line on stdin, then one-byte round
      trips (1 ms apart) for S seconds; prints "RR <count> <worst_ms> <p50_ms>".
"""

import argparse
import hashlib
import socket
import struct
import sys
import time


def pattern(n):
    block = hashlib.sha256(b"canal close-time delivery").digest() * 2048  # 64 KiB
    out = bytearray()
    while len(out) < n:
        out += block
    return bytes(out[:n])


def send(a):
    data = pattern(a.bytes)
    s = socket.create_connection(("127.0.0.1", a.port))
    print("CONNECTED", flush=True)
    s.sendall(data)
    print(f"SENT {len(data)} {hashlib.sha256(data).hexdigest()}", flush=True)
    if a.linger is not None:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, a.linger))
    t0 = time.monotonic()
    s.close()
    print(f"CLOSED {time.monotonic() - t0:.3f}", flush=True)
    if a.stay:
        sys.stdin.readline()


def rr(a):
    s = socket.create_connection(("127.0.0.1", a.port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(b"ECHO\n")  # e2e_util.PeerServer's command
    print("CONNECTED", flush=True)
    sys.stdin.readline()
    times = []
    end = time.monotonic() + a.seconds
    while time.monotonic() < end:
        t0 = time.monotonic()
        s.sendall(b"x")
        if s.recv(1) != b"x":
            print("RR-ERROR short reply", flush=True)
            return 1
        times.append(time.monotonic() - t0)
        time.sleep(0.001)
    times.sort()
    print(f"RR {len(times)} {times[-1] * 1000:.3f} {times[len(times) // 2] * 1000:.3f}", flush=True)
    return 0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("cmd", choices=["send", "rr"])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--bytes", type=int, default=0)
    p.add_argument("--stay", action="store_true")
    p.add_argument("--linger", type=int)
    p.add_argument("--seconds", type=float, default=1.0)
    a = p.parse_args()
    return send(a) if a.cmd == "send" else rr(a)


if __name__ == "__main__":
    sys.exit(main() or 0)
