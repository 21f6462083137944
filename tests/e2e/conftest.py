"""Fixtures for canal's end-to-end tests.

Nothing is built here: scripts/test runs `cargo build --release` first. The binaries are
found in $CANAL_BIN_DIR, else $CARGO_TARGET_DIR/release, else <repo>/target/release.

Fixtures other test files may use:
  canal_bin, canald_bin, libcanal_so   paths (session scope); fail if not built
  procs                                 spawns native processes, killed at teardown
  canald                                a private `canal daemon --socket <tmp>/canald.sock`
      .socket                           its control socket path
      .run(argv, timeout=120, **kw)     `canal run --socket S -- argv` to completion -> Result
      .spawn(argv, name=None, **kw)     same, in the background -> Proc
      .stat()                           `canal stat --socket S --json`, parsed
      .guest(pid_or_proc)               the stat entry of that guest (or None)
      .wait_served(proc, kind, peer_port=None, count=1, state=None)
                                        wait until stat lists those sockets for proc's
                                        program: proof canal serves it, not the kernel
      .pid                              canald's pid, as `canal stat` reports it
  canal_harness.runner(request, mode)   "native" -> procs, else -> canald (same methods)
  Proc (from spawn): .wait_line(prefix, t), .send_line(), .finish(t) -> Result, .describe()
  python                                the real interpreter (not a pyenv shim)
  progs                                 Path of tests/e2e/progs

Every test has a time limit (default 150 s; `@pytest.mark.deadline(N)` changes it); a test
past it fails with a message instead of hanging. Every process a test starts gets its own
process group, and the whole group is killed at teardown.
"""

import signal
import sys

import pytest

from canal_harness import PROGS, Procs, bin_path, serving_canald

DEFAULT_DEADLINE = 150


def pytest_configure(config):
    config.addinivalue_line("markers", "deadline(seconds): time limit for one test (default 150)")
    config.addinivalue_line(
        "markers",
        "relay: the canald fixture runs with --direct off: the guest's sockets to native "
        "peers go through canald (the path of VMs, isolated guests, guests under a policy)",
    )


class DeadlineExceeded(Exception):
    pass


@pytest.fixture(autouse=True)
def _deadline(request):
    marker = request.node.get_closest_marker("deadline")
    seconds = int(marker.args[0]) if marker else DEFAULT_DEADLINE

    def on_alarm(signum, frame):
        raise DeadlineExceeded(f"test exceeded its time limit of {seconds} s")

    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


@pytest.fixture(scope="session")
def canal_bin():
    return bin_path("canal")


@pytest.fixture(scope="session")
def canald_bin():
    return bin_path("canald")


@pytest.fixture(scope="session")
def libcanal_so():
    return bin_path("libcanal.so")


@pytest.fixture(scope="session")
def python():
    # sys.executable is the real interpreter; `python3` on PATH may be a shell-script shim
    # (pyenv), which would put a shell and pyenv itself under canal too.
    return sys.executable


@pytest.fixture(scope="session")
def progs():
    return PROGS


@pytest.fixture
def procs(tmp_path):
    ps = Procs(tmp_path)
    yield ps
    ps.cleanup()


@pytest.fixture
def canald(request, canal_bin, libcanal_so, canald_bin, procs):
    # A test of canald's relay of a guest's native peers (the path of VMs, isolated
    # guests and guests under a policy) turns the direct path off.
    args = ["--direct", "off"] if request.node.get_closest_marker("relay") else []
    with serving_canald(canal_bin, procs, args=args) as d:
        yield d
