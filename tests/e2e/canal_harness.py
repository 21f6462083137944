"""Process and daemon handling for canal's end-to-end tests (used by conftest.py's
fixtures and by tests directly)."""

import json
import os
import shlex
import shutil
import subprocess
import signal
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

import e2e_util

ROOT = Path(__file__).resolve().parents[2]
PROGS = Path(__file__).resolve().parent / "progs"


def _bin_dir():
    if os.environ.get("CANAL_BIN_DIR"):
        return Path(os.environ["CANAL_BIN_DIR"])
    target = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
    if not target.is_absolute():
        target = ROOT / target
    return target / "release"


def bin_path(name):
    p = _bin_dir() / name
    if not p.exists():
        pytest.fail(f"{p} does not exist: build canal first (`cargo build --release`; scripts/test does)")
    return p


def need_tool(name):
    path = shutil.which(name)
    if not path:
        pytest.skip(f"{name} is not installed (scripts/install-deps installs it)")
    return path


def clean_env(extra=None):
    """The environment for programs the tests start: without CANAL_SOCKET or LD_PRELOAD
    from the caller's environment, so only what a test passes explicitly applies."""
    env = {k: v for k, v in os.environ.items() if k not in ("CANAL_SOCKET", "LD_PRELOAD")}
    env["PYTHONUNBUFFERED"] = "1"
    if extra:
        env.update(extra)
    return env




class Result:
    def __init__(self, argv, returncode, stdout, stderr, elapsed):
        self.argv = argv
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr
        self.elapsed = elapsed

    def describe(self):
        return (
            f"command: {' '.join(map(str, self.argv))}\n"
            f"exit status: {self.returncode} after {self.elapsed:.2f} s\n"
            f"--- stdout (tail) ---\n{_tail(self.stdout)}\n--- stderr (tail) ---\n{_tail(self.stderr)}"
        )


def _tail(text, n=40):
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    lines = text.splitlines()
    return "\n".join(lines[-n:])


class Proc:
    """A process in its own process group, stdout and stderr going to files (never pipes,
    so nothing it leaves behind can block a reader)."""

    def __init__(self, argv, logdir, name, env=None, cwd=None, stdin=subprocess.DEVNULL):
        self.argv = [str(a) for a in argv]
        self.name = name
        self.out_path = Path(logdir) / f"{name}.out"
        self.err_path = Path(logdir) / f"{name}.err"
        self._out = open(self.out_path, "wb")
        self._err = open(self.err_path, "wb")
        self.started = time.monotonic()
        self.popen = subprocess.Popen(
            self.argv,
            stdin=stdin,
            stdout=self._out,
            stderr=self._err,
            env=env if env is not None else clean_env(),
            cwd=cwd,
            start_new_session=True,
        )
        self.pid = self.popen.pid

    def stdout(self):
        return self.out_path.read_bytes().decode(errors="replace")

    def stderr(self):
        return self.err_path.read_bytes().decode(errors="replace")

    def poll(self):
        return self.popen.poll()

    def describe(self):
        rc = self.popen.poll()
        status = "still running" if rc is None else f"exit status {rc}"
        return (
            f"command: {' '.join(self.argv)}\n{status}\n"
            f"--- stdout (tail) ---\n{_tail(self.stdout())}\n--- stderr (tail) ---\n{_tail(self.stderr())}"
        )

    def wait_line(self, prefix, timeout):
        """Wait until a stdout line starts with prefix; returns that line. Fails if the
        process exits first or timeout seconds pass."""
        deadline = time.monotonic() + timeout
        while True:
            # Whole lines only: the program may be half-way through writing the last.
            for line in self.stdout().split("\n")[:-1]:
                if line.startswith(prefix):
                    return line
            if self.popen.poll() is not None:
                # one last look: the line may have been written just before exiting
                for line in self.stdout().splitlines():
                    if line.startswith(prefix):
                        return line
                raise AssertionError(f"{self.name} exited before printing {prefix!r}\n{self.describe()}")
            if time.monotonic() >= deadline:
                raise AssertionError(f"{self.name} did not print {prefix!r} within {timeout} s\n{self.describe()}")
            time.sleep(0.01)

    def finish(self, timeout):
        """Wait for exit (at most timeout s, then kill the group and fail); returns Result."""
        try:
            rc = self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{self.name} did not finish within {timeout} s (killed)\n{self.describe()}")
        return Result(self.argv, rc, self.stdout(), self.stderr(), time.monotonic() - self.started)

    def send_line(self, text="go"):
        """Write one line to the process's stdin (spawned with stdin=subprocess.PIPE)
        and close it."""
        self.popen.stdin.write((text + "\n").encode())
        self.popen.stdin.flush()
        self.popen.stdin.close()

    def signal_group(self, sig):
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def kill(self):
        self.signal_group(signal.SIGKILL)
        try:
            self.popen.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass

    def stop(self, grace=5.0):
        """SIGTERM the group, SIGKILL it after grace seconds."""
        if self.popen.poll() is None:
            self.signal_group(signal.SIGTERM)
            try:
                self.popen.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        self.kill()  # also whatever is left of the group
        self._out.close()
        self._err.close()


class Procs:
    def __init__(self, logdir):
        self.logdir = Path(logdir)
        self.all = []
        self._n = 0

    def spawn(self, argv, name=None, **kw):
        self._n += 1
        base = name or Path(str(argv[0])).name
        p = Proc(argv, self.logdir, f"{self._n:02d}-{base}", **kw)
        self.all.append(p)
        return p

    def run(self, argv, timeout=120, name=None, **kw):
        """Run to completion; never hangs past timeout (the group is killed, then fail)."""
        return self.spawn(argv, name=name, **kw).finish(timeout)

    def cleanup(self):
        for p in reversed(self.all):
            p.stop(grace=2.0)


def short_tmpdir():
    """A directory with a short path: Unix socket paths are limited to 107 bytes and
    pytest's tmp_path can be longer."""
    return tempfile.mkdtemp(prefix="canal-e2e-", dir="/tmp")


def canal_stat(canal_bin, socket_path=None, env=None, timeout=10):
    """`canal stat [--socket S] --json`, parsed; AssertionError with details on failure."""
    argv = [str(canal_bin), "stat"]
    if socket_path:
        argv += ["--socket", str(socket_path)]
    argv.append("--json")
    try:
        cp = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
            env=env if env is not None else clean_env(),
        )
    except subprocess.TimeoutExpired:
        raise AssertionError(f"`{' '.join(argv)}` did not answer within {timeout} s")
    if cp.returncode != 0:
        raise AssertionError(
            f"`{' '.join(argv)}` failed with exit status {cp.returncode}: {cp.stderr.decode(errors='replace')}"
        )
    try:
        return json.loads(cp.stdout)
    except ValueError as e:
        raise AssertionError(f"`{' '.join(argv)}` printed invalid JSON ({e}): {cp.stdout[:500]!r}")


def guest_pids(proc):
    """The pids that may be the guest program of a `canal run` process: canal run itself
    (if it execs the program) and its direct children."""
    return {proc.pid} | e2e_util.children_of(proc.pid)


class Canald:
    def __init__(self, canal_bin, procs, args=(), prefix=()):
        """`prefix`: a command the daemon runs under (e.g. `prlimit --nofile=...`)."""
        self.canal_bin = canal_bin
        self.procs = procs
        self.args = [str(a) for a in args]
        self.prefix = [str(a) for a in prefix]
        self.dir = short_tmpdir()
        self.socket = os.path.join(self.dir, "canald.sock")
        self.proc = None
        self.pid = None

    def start(self, timeout=15, args=None):
        """Starts canald with the environment's CANAL_TEST_DAEMON_ARGS (shell words, e.g.
        "--workers 2": scripts/test's "modes" stage reruns tests under each notification
        mode this way), then the constructor's `args`, then `args` given here: later
        switches win."""
        extra = shlex.split(os.environ.get("CANAL_TEST_DAEMON_ARGS", ""))
        argv = [*self.prefix, self.canal_bin, "daemon", "--socket", self.socket, *extra, *self.args]
        argv += [str(a) for a in (args or [])]
        self.proc = self.procs.spawn(argv, name="canald")
        deadline = time.monotonic() + timeout
        last = None
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"canal daemon exited during start-up\n{self.proc.describe()}")
            try:
                st = canal_stat(self.canal_bin, self.socket, timeout=5)
                break
            except AssertionError as e:
                last = e
            if time.monotonic() >= deadline:
                raise AssertionError(
                    f"canal daemon did not answer `canal stat` within {timeout} s; last error: {last}\n"
                    f"{self.proc.describe()}"
                )
            time.sleep(0.02)
        d = st.get("daemon")
        assert isinstance(d, dict) and isinstance(d.get("pid"), int), f"stat JSON lacks daemon.pid: {st}"
        self.pid = d["pid"]
        return self

    def stat(self):
        return canal_stat(self.canal_bin, self.socket)

    def guest(self, who, st=None):
        """The stat entry of the guest whose pid is `who` (an int) or the program of the
        `canal run` Proc `who`; None if not listed."""
        pids = {who} if isinstance(who, int) else guest_pids(who)
        st = st or self.stat()
        for g in st.get("guests", []):
            if g.get("pid") in pids:
                return g
        return None

    def wait_served(self, proc, kind="tcp", peer_port=None, count=1, timeout=10, state=None):
        """Wait until `canal stat` lists at least `count` sockets of `kind` (and `state`, and
        peer 127.0.0.1:peer_port, when given) for the guest program of `proc`: proof that
        canal, not the kernel directly, serves them. Returns those socket entries."""
        last = [None]

        def check():
            st = self.stat()
            last[0] = st
            g = self.guest(proc, st)
            if not g:
                return None
            socks = [
                s
                for s in g.get("sockets", [])
                if s.get("kind") == kind
                and (state is None or s.get("state") == state)
                and (peer_port is None or s.get("peer") == f"127.0.0.1:{peer_port}")
            ]
            return socks if len(socks) >= count else None

        want = f"{count} {kind} socket(s)" + (f" to 127.0.0.1:{peer_port}" if peer_port else "")
        want += f" in state {state}" if state else ""
        try:
            return e2e_util.wait_for(check, timeout, interval=0.02, what=f"canal stat to list {want} for {proc.name}")
        except AssertionError as e:
            raise AssertionError(
                f"{e}: canal does not serve this program's sockets\nlast stat: {last[0]}\n{proc.describe()}"
            ) from None

    def argv(self, argv):
        return [self.canal_bin, "run", "--socket", self.socket, "--"] + [str(a) for a in argv]

    def spawn(self, argv, name=None, **kw):
        return self.procs.spawn(self.argv(argv), name=name or f"canal-{Path(str(argv[0])).name}", **kw)

    def run(self, argv, timeout=120, name=None, **kw):
        return self.spawn(argv, name=name, **kw).finish(timeout)

    def log(self):
        return self.proc.describe() if self.proc else "(canald not started)"

    def stop(self):
        crashed = None
        if self.proc is not None:
            rc = self.proc.poll()
            if rc is not None:
                crashed = f"canald exited during the test with status {rc}\n{self.proc.describe()}"
            self.proc.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
        return crashed


def runner(request, mode):
    """The object that starts programs for `mode`: "native" -> the procs fixture (programs
    run directly), anything else -> the canald fixture (programs run under `canal run`).
    Both offer .spawn(argv, name=None, **kw) -> Proc and .run(argv, timeout, ...) -> Result.
    The daemon is only started for the canal modes."""
    if mode == "native":
        return request.getfixturevalue("procs")
    return request.getfixturevalue("canald")


@contextmanager
def serving_canald(canal_bin, procs, args=()):
    """A private canald (extra switches `args`) for the body of the `with`; afterwards
    the test's other processes stop first, so the daemon sees its guests leave, then the
    daemon, and the test fails if the daemon crashed. The body of every canald fixture."""
    d = Canald(canal_bin, procs, args=list(args))
    try:
        d.start()
        yield d
    finally:
        for p in reversed(procs.all):
            if p is not d.proc:
                p.stop(grace=2.0)
        crashed = d.stop()
    if crashed:
        pytest.fail(crashed)
