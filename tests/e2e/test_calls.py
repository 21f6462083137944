"""Socket calls beyond the suite's programs whose answers must be the kernel's
(progs/calls.py): TCP Fast Open's sendto/sendmsg with MSG_FASTOPEN, which canal
refused with EPIPE; splice(2) between canal sockets and pipes, which read
end-of-file from a canal socket and lost what it wrote into one. The same lines
natively and under canal, short-circuited and through canald."""

import pytest

from canal_harness import serving_canald


@pytest.mark.parametrize("mode", ["shortcut", "no-shortcut"])
def test_calls_answer_as_the_kernel(canal_bin, procs, python, progs, mode):
    argv = [python, progs / "calls.py"]
    native = procs.run(argv, timeout=60, name="calls-native")
    assert native.returncode == 0 and native.stdout.endswith("done\n"), native.describe()
    assert "fastopen sendto -> 15" in native.stdout, native.describe()
    with serving_canald(canal_bin, procs, args=["--no-shortcut"] if mode == "no-shortcut" else []) as d:
        r = d.run(argv, timeout=60, name="calls-canal")
        assert r.returncode == 0, r.describe()
        assert r.stdout == native.stdout, f"natively:\n{native.stdout}\nunder canal ({mode}):\n{r.stdout}"


PASS_UNBRIDGEABLE = r"""
import array, errno, socket, sys
a, b = socket.socketpair()
l = socket.create_server(("127.0.0.1", 0))
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(("127.0.0.1", 0))
for what, s in (("listener", l), ("udp", u)):
    try:
        a.sendmsg([b"x"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [s.fileno()]))])
        print(what, "sent", flush=True)
    except OSError as e:
        print(what, "EOPNOTSUPP" if e.errno == errno.EOPNOTSUPP else errno.errorcode[e.errno], flush=True)
b.setblocking(False)
try:
    b.recv(10); print("something was sent")
except BlockingIOError:
    print("nothing sent")
# The sender's own sockets still work.
c = socket.create_connection(l.getsockname(), timeout=5); s2, _ = l.accept(); c.sendall(b"ok"); print("tcp", s2.recv(10).decode())
v = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); v.sendto(b"ok", u.getsockname()); u.settimeout(5); print("udp", u.recv(10).decode())
"""


def test_passing_a_listener_or_datagram_socket_is_refused_clearly(canald, python):
    """SCM_RIGHTS can carry only connected canal TCP sockets (bridged, test_compat_edge
    scm_rights_pass): a receiver of a canal listener or datagram socket would get its
    dummy descriptor (accept failed with EINVAL, clients were reset). The sendmsg is
    refused with EOPNOTSUPP and a message naming the descriptor, before anything is
    sent, and the sender's sockets go on working."""
    r = canald.run([python, "-c", PASS_UNBRIDGEABLE], timeout=30, name="pass")
    assert r.returncode == 0, r.describe()
    assert r.stdout.splitlines() == ["listener EOPNOTSUPP", "udp EOPNOTSUPP", "nothing sent", "tcp ok", "udp ok"], \
        r.describe()
    assert "is a listening canal socket, which cannot be passed with SCM_RIGHTS" in r.stderr, r.describe()
    assert "is a datagram canal socket" in r.stderr, r.describe()
