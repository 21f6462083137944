"""Fixtures for the compatibility tests (issue 3: unmodified applications under canal).

The e2e harness is reused as is: tests/e2e/conftest.py is loaded under another module name
and its fixtures (canald, procs, canal_bin, libcanal_so, python, the per-test deadline) are
re-exported here, so tests/compat behaves exactly like tests/e2e without duplicating it.

Added here:
  canald                      the e2e fixture's daemon, with -v (its log of freed guests)
  MODES                       native, canal-both, canal-client, canal-server
  ends(request, mode)         (server_runner, client_runner) for a mode; see compat_util
  cprogs                      session fixture: the C programs in progs/, compiled with gcc
"""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
E2E = HERE.parent / "e2e"
for p in (str(E2E), str(HERE)):
    if p not in sys.path:
        sys.path.insert(0, p)

_spec = importlib.util.spec_from_file_location("canal_e2e_conftest", E2E / "conftest.py")
_e2e = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_e2e)

# Re-exported fixtures (pytest registers fixtures found in a conftest's namespace).
_deadline = _e2e._deadline
canal_bin = _e2e.canal_bin
canald_bin = _e2e.canald_bin
libcanal_so = _e2e.libcanal_so
python = _e2e.python
procs = _e2e.procs
pytest_configure = _e2e.pytest_configure

from canal_harness import need_tool, serving_canald  # noqa: E402
import compat_util  # noqa: E402


@pytest.fixture
def canald(request, canal_bin, libcanal_so, canald_bin, procs):
    """The e2e fixture's private canald, logging each guest's attach, departure and life
    totals (-v): CanalSampler.require_peer_port reads them for clients quicker than
    `canal stat`; with the switches of the test's mode (compat_util.daemon_args)."""
    callspec = getattr(request.node, "callspec", None)
    mode = callspec.params.get("mode") if callspec is not None else None
    args = ["-v", *compat_util.daemon_args(mode)]
    with serving_canald(canal_bin, procs, args=args) as d:
        yield d

PROGS = HERE / "progs"
C_PROGRAMS = ["peer", "edge", "sockopts"]


@pytest.fixture(scope="session")
def cprogs(tmp_path_factory):
    """{name: Path} of the C programs in progs/, compiled once per session with
    -Wall -Werror. A compile error fails every test that needs them, with gcc's message."""
    gcc = need_tool("gcc")
    out = tmp_path_factory.mktemp("compat-progs")
    built = {}
    for name in C_PROGRAMS:
        exe = out / name
        cp = subprocess.run(
            [gcc, "-O1", "-g", "-Wall", "-Wextra", "-Werror", "-D_GNU_SOURCE", "-pthread",
             "-o", str(exe), str(PROGS / f"{name}.c")],
            capture_output=True, text=True, timeout=180,
        )
        if cp.returncode != 0:
            pytest.fail(f"compiling progs/{name}.c failed:\n{cp.stderr}")
        built[name] = exe
    return built


@pytest.fixture(scope="session")
def compat_progs():
    return PROGS
