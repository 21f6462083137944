"""Socket calls a program makes by number, through libc's `syscall()` (progs/bynumber.c):
libuv 1.44 sends and receives datagrams with `syscall(__NR_sendmmsg)` (Debian's `dig`,
`host`, `named`), libseccomp installs filters with `syscall(__NR_seccomp)`. Each call
must reach the hook of its name (docs/compat.md "calls by number"). The program runs
natively first, to prove the expectations are this kernel's; then under canal, where it
pauses with a connection open until `canal stat` lists it. Before the `syscall` hook,
`dig` under canal timed out on every UDP query (its sendmmsg reached the dummy
descriptor: ENOTCONN), and the seccomp check was killed by its own filter (the library
slept in ppoll, which the filter forbids)."""

import subprocess

import pytest

from canal_harness import need_tool

CHECKS = ["tcp", "nonblock", "poll", "udp", "dup", "seccomp"]


@pytest.fixture(scope="module")
def bynumber_bin(tmp_path_factory, progs):
    gcc = need_tool("gcc")
    out = tmp_path_factory.mktemp("bynumber") / "bynumber"
    cp = subprocess.run([gcc, "-O1", "-Wall", "-Werror", "-o", str(out), str(progs / "bynumber.c")],
                        capture_output=True, text=True, timeout=120)
    assert cp.returncode == 0, f"compiling bynumber.c failed:\n{cp.stderr}"
    return out


def _check(result, label):
    lines = result.stdout.splitlines()
    oks = [l[3:] for l in lines if l.startswith("ok ")]
    fails = [l for l in lines if l.startswith("FAIL ")]
    assert result.returncode == 0 and not fails and oks == CHECKS, (
        f"{label}: {len(fails)} check(s) failed:\n  " + "\n  ".join(fails) + f"\n{result.describe()}")


def test_socket_calls_by_number(request, bynumber_bin, procs):
    native = procs.spawn([bynumber_bin, "pause"], name="bynumber-native", stdin=subprocess.PIPE)
    native.wait_line("PAUSE", 30)
    native.send_line()
    _check(native.finish(60), "natively (the test itself is wrong if this fails)")

    canald = request.getfixturevalue("canald")
    under = canald.spawn([bynumber_bin, "pause"], name="bynumber-canal", stdin=subprocess.PIPE)
    port = int(under.wait_line("PAUSE", 30).split()[1])
    try:
        canald.wait_served(under, kind="tcp-shortcut", peer_port=port, state="connected")
    finally:
        under.send_line()
    _check(under.finish(60), "under canal")
