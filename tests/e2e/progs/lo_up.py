"""Brings the loopback interface up (a fresh network namespace has it down), then
runs the rest of the command line: `unshare -n python3 lo_up.py PROG ARGS...` is PROG
natively in a namespace of its own, to compare with PROG under `canal run --isolate`."""
import fcntl
import os
import socket
import struct
import sys

SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1

with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
    req = struct.pack("16sH14x", b"lo", 0)
    flags = struct.unpack("16sH", fcntl.ioctl(s, SIOCGIFFLAGS, req)[:18])[1]
    fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))
os.execvp(sys.argv[1], sys.argv[1:])
