"""Sockets used before their first address, the ways programs do (argv: native TCP echo
port, native UDP echo port, canal TCP echo port, canal UDP echo port; natively all four
are native servers). Each case prints what the program sees; under canal with the
direct path (a socket starts as the guest's own kernel socket and becomes canal's at
its first address if that is a canal port) the lines must be the native ones: a
socket copied before its first address (fork, spawn, dup, an epoll set) stays one socket,
options and flags set before it survive becoming canal's, UDP goes either way."""
import fcntl
import os
import select
import socket
import sys

NT, NU, CT, CU = (int(a) for a in sys.argv[1:5])
LO = "127.0.0.1"


def echo(s, what=b"ping"):
    s.sendall(what)
    got = b""
    while len(got) < len(what):
        got += s.recv(len(what) - len(got))
    return got


def case(name, f):
    try:
        print(name, "->", f(), flush=True)
    except OSError as e:
        print(name, "->", type(e).__name__, e.errno, flush=True)


def fork_before_connect(port):
    s = socket.socket()
    pid = os.fork()
    if pid == 0:
        s.connect((LO, port))
        os._exit(0 if echo(s) == b"ping" else 1)
    _, st = os.waitpid(pid, 0)
    s.close()
    t = socket.create_connection((LO, port))
    return (os.waitstatus_to_exitcode(st), echo(t, b"after"))


def spawn_before_connect(port):
    """posix_spawn and vfork (subprocess) leave the child a copy: one socket still, so
    the child sees the parent's connection."""
    import subprocess
    s = socket.socket()
    os.set_inheritable(s.fileno(), True)
    peek = ("import socket, sys; sys.stdin.readline(); "
            f"c = socket.socket(fileno={s.fileno()}); print(c.getpeername()[1] == {port}, flush=True)")
    child = subprocess.Popen([sys.executable, "-c", peek], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             close_fds=False, text=True)
    s.connect((LO, port))
    r = echo(s)
    child.stdin.write("go\n")
    child.stdin.close()
    seen = child.stdout.read().strip()
    child.wait()
    return (r, seen, child.returncode)


def dup_before_connect(port):
    s = socket.socket()
    d = s.dup()
    s.connect((LO, port))
    r = echo(d)
    s.close()
    return (r, d.getpeername()[1] == port)


def epoll_before_connect(port):
    s = socket.socket()
    s.setblocking(False)
    ep = select.epoll()
    ep.register(s.fileno(), select.EPOLLOUT)
    err = s.connect_ex((LO, port))
    ready = ep.poll(5)
    s.setblocking(True)
    return (err in (0, 115), bool(ready), s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR), echo(s))


def options_before_connect(port):
    s = socket.socket()
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 321)
    s.connect((LO, port))
    return (s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0,
            s.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) != 0,
            s.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE), echo(s))


def flags_before_connect(port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC)
    err = s.connect_ex((LO, port))
    select.select([], [s], [], 5)
    fl = fcntl.fcntl(s.fileno(), fcntl.F_GETFL)
    fd = fcntl.fcntl(s.fileno(), fcntl.F_GETFD)
    s.setblocking(True)
    return (err in (0, 115), bool(fl & os.O_NONBLOCK), bool(fd & fcntl.FD_CLOEXEC), echo(s))


def timeout_before_connect(port):
    s = socket.socket()
    s.settimeout(0.3)
    s.connect((LO, port))
    s.sendall(b"x")
    s.recv(1)
    try:
        s.recv(1)  # nothing more comes: the timeout set before connect holds
        return "no timeout"
    except socket.timeout:
        return "timed out"


def udp_unbound(port):
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.settimeout(5)
    u.sendto(b"dgram", (LO, port))
    data, src = u.recvfrom(100)
    return (data, src[1] == port, u.getsockname()[1] != 0)


def udp_connected(port):
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.settimeout(5)
    u.connect((LO, port))
    u.send(b"conn")
    return (u.recv(100), u.getpeername()[1] == port)


for label, tcp, udp in (("native", NT, NU), ("canal", CT, CU)):
    case(f"{label} fork before connect", lambda: fork_before_connect(tcp))
    case(f"{label} dup before connect", lambda: dup_before_connect(tcp))
    case(f"{label} spawn before connect", lambda: spawn_before_connect(tcp))
    case(f"{label} epoll before connect", lambda: epoll_before_connect(tcp))
    case(f"{label} options before connect", lambda: options_before_connect(tcp))
    case(f"{label} flags before connect", lambda: flags_before_connect(tcp))
    case(f"{label} timeout before connect", lambda: timeout_before_connect(tcp))
    case(f"{label} udp unbound", lambda: udp_unbound(udp))
    case(f"{label} udp connected", lambda: udp_connected(udp))
print("done", flush=True)
