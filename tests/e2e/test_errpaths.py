"""Socket error paths whose errno values must be the kernel's (progs/errpaths.c): refused
connect, EPIPE and SIGPIPE with and without MSG_NOSIGNAL, non-blocking connect (success
and refusal through poll + SO_ERROR), EAGAIN, half-close, select() over a pipe and a
socket. The program runs natively first, in the same test, to prove the expectations
match this kernel; then under canal, where it pauses with a connection open until
`canal stat` lists it (so a program the library failed to intercept cannot pass)."""

import subprocess

import pytest

import e2e_util
from canal_harness import need_tool

CHECKS = [
    "connect_refused_blocking",
    "epipe_sigpipe",
    "epipe_msg_nosignal",
    "nonblocking_connect",
    "nonblocking_connect_refused",
    "nonblocking_recv_eagain",
    "half_close",
    "select_pipe_and_socket",
    "listener_fionread",
]


@pytest.fixture(scope="module")
def errpaths_bin(tmp_path_factory, progs):
    gcc = need_tool("gcc")
    out = tmp_path_factory.mktemp("errpaths") / "errpaths"
    cp = subprocess.run(
        [gcc, "-O1", "-Wall", "-Werror", "-o", str(out), str(progs / "errpaths.c")],
        capture_output=True, text=True, timeout=120,
    )
    assert cp.returncode == 0, f"compiling errpaths.c failed:\n{cp.stderr}"
    return out


def _check(result, peer, runs_so_far, label):
    oks = [l[3:] for l in result.stdout.splitlines() if l.startswith("ok ")]
    fails = [l for l in result.stdout.splitlines() if l.startswith("FAIL ")]
    assert result.returncode == 0 and not fails and oks == CHECKS, (
        f"{label}: {len(fails)} check(s) failed:\n  " + "\n  ".join(fails) + f"\n{result.describe()}"
    )
    e2e_util.wait_for(lambda: len(peer.half_records) >= runs_so_far, 5,
                      what=f"{label}: the peer to record the half-close payload")
    got = peer.half_records[runs_so_far - 1]
    assert got == b"ping-after-half-close\n", f"{label}: after half-close the peer received {got!r}"


@pytest.mark.relay
def test_error_paths(request, errpaths_bin, procs):
    with e2e_util.PeerServer() as peer:
        closed = e2e_util.closed_port()
        native = procs.spawn([errpaths_bin, peer.port, closed, "pause"], name="errpaths-native", stdin=subprocess.PIPE)
        native.wait_line("PAUSE", 30)
        native.send_line()
        _check(native.finish(45), peer, 1, "natively (the test itself is wrong if this fails)")

        canald = request.getfixturevalue("canald")
        under = canald.spawn([errpaths_bin, peer.port, closed, "pause"], name="errpaths-canal", stdin=subprocess.PIPE)
        under.wait_line("PAUSE", 30)
        try:
            canald.wait_served(under, kind="tcp", peer_port=peer.port, state="connected")
        finally:
            under.send_line()
        _check(under.finish(45), peer, 2, "under canal")
