"""PostgreSQL 15 with pgbench: a multi-process server (a postmaster forking a backend per
connection) and its benchmark client, each end natively or under canal. pgbench
initialises a scale-1 database over TCP, then runs the select-only script and the
default TPC-B-like script with 8 clients; every transaction must complete (no failed
transactions, the counts pgbench reports match what the server counted in
pg_stat_database).

PostgreSQL refuses to run as root, so the server, pgbench and the canald serving them run
as the `postgres` user (canald's control directory is theirs; `canal stat` is asked as
root, which canald answers)."""

import glob
import os
import re
import shutil
import tempfile
from pathlib import Path

import pytest

import compat_util
import e2e_util
from canal_harness import Canald, need_tool
from compat_util import MODES

USER = "postgres"
CLIENTS = 8
SECONDS = 4


def _bin(name):
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if not found:
        pytest.skip(f"PostgreSQL's {name} is not installed (scripts/install-deps installs postgresql)")
    return found[-1]


def _as_user():
    try:
        import pwd
        pw = pwd.getpwnam(USER)
    except KeyError:
        pytest.skip(f"no '{USER}' user (the postgresql package creates it)")
    return pw.pw_uid, pw.pw_gid


def _user_canald(canal_bin, procs, uid, gid, top, mode):
    """A private canald for the user: `canal` (daemon, run, stat) through a wrapper that
    drops to the user, since canal refuses a daemon of another uid (even for root)."""
    wrapper = top / "canal-as-user"
    wrapper.write_text(f"#!/bin/sh\nexec setpriv --reuid={uid} --regid={gid} --clear-groups {canal_bin} \"$@\"\n")
    wrapper.chmod(0o755)
    # -v: see compat_util.CanalSampler
    d = Canald(str(wrapper), procs, args=["-v", *compat_util.daemon_args(mode)])
    os.chown(d.dir, uid, gid)
    return d.start()


class _UserNative:
    def __init__(self, procs, uid, gid):
        self.procs = procs
        self.prefix = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups"]

    def spawn(self, argv, name=None, **kw):
        return self.procs.spawn([*self.prefix, *[str(a) for a in argv]], name=name, **kw)

    def run(self, argv, timeout=120, name=None, **kw):
        return self.spawn(argv, name=name, **kw).finish(timeout)


def _pgbench_ok(r, what):
    assert r.returncode == 0, f"pgbench {what} failed\n{r.describe()}"
    out = r.stdout + r.stderr
    failed = re.search(r"number of failed transactions: (\d+)", out)
    assert failed and failed.group(1) == "0", f"pgbench {what}: failed transactions\n{r.describe()}"
    done = re.search(r"number of transactions actually processed: (\d+)", out)
    tps = re.search(r"tps = ([\d.]+)", out)
    assert done and int(done.group(1)) > 0 and tps, f"pgbench {what} processed nothing\n{r.describe()}"
    return int(done.group(1)), float(tps.group(1))


@pytest.mark.deadline(240)
@pytest.mark.parametrize("mode", MODES)
def test_postgres_pgbench(request, mode, procs, canal_bin):
    postgres, initdb = _bin("postgres"), _bin("initdb")
    pgbench, psql = need_tool("pgbench"), need_tool("psql")
    uid, gid = _as_user()
    # pytest's own temporary directories are root's (0700): the user gets its own.
    top = Path(tempfile.mkdtemp(prefix="canal-pg-"))
    data = top / "pgdata"
    sockdir = top / "pgsock"
    sockdir.mkdir()
    for d in (top, sockdir):
        os.chown(d, uid, gid)
    native = _UserNative(procs, uid, gid)
    r = native.run([initdb, "-D", data, "-A", "trust", "-U", USER, "--no-sync"], timeout=120, name="initdb")
    assert r.returncode == 0, f"initdb failed\n{r.describe()}"
    canald = None
    if mode != "native":
        canald = _user_canald(canal_bin, procs, uid, gid, top, mode)
    srv = canald if compat_util.server_under_canal(mode) else native
    cli = canald if compat_util.client_under_canal(mode) else native
    port = e2e_util.free_port()
    server = srv.spawn([postgres, "-D", data, "-p", port, "-k", sockdir, "-c", "listen_addresses=127.0.0.1",
                        "-c", "fsync=off", "-c", "max_connections=40"], name="postgres")
    try:
        compat_util.wait_listening(server, port, "postgres")
        if compat_util.server_under_canal(mode):
            compat_util.assert_listed_by_canal(canald, port, "tcp", f"postgres ({mode})")
        e2e_util.wait_for(
            lambda: native.run([psql, "-h", "127.0.0.1", "-p", port, "-U", USER, "-d", "postgres", "-Atc", "select 1"],
                               timeout=20, name="psql-ready").stdout.strip() == "1",
            30, interval=0.2, what="postgres to answer")
        r = cli.run([pgbench, "-h", "127.0.0.1", "-p", port, "-U", USER, "-i", "-s", "1", "-q", "postgres"],
                    timeout=120, name="pgbench-init")
        assert r.returncode == 0, f"pgbench -i failed ({mode})\n{r.describe()}"
        total = 0
        for label, extra in (("select-only", ["-S"]), ("tpc-b", [])):
            with compat_util.CanalSampler(request, mode, canald=canald) as sampler:
                r = cli.run([pgbench, "-h", "127.0.0.1", "-p", port, "-U", USER, "-c", CLIENTS, "-j", 2,
                             "-T", SECONDS, *extra, "postgres"], timeout=90, name=f"pgbench-{label}")
            sampler.require_peer_port(port, f"pgbench {label}", program=pgbench)
            n, tps = _pgbench_ok(r, f"{label} ({mode})")
            print(f"{mode} {label}: {n} transactions, {tps:.0f} tps")
            total += n
        # The server counted them too (pgbench's own connections' commits).
        q = native.run([psql, "-h", "127.0.0.1", "-p", port, "-U", USER, "-d", "postgres", "-Atc",
                        "select xact_commit from pg_stat_database where datname = 'postgres'"],
                       timeout=20, name="psql-count")
        assert q.returncode == 0 and int(q.stdout.strip() or 0) >= total, (
            f"the server committed {q.stdout.strip()} transactions, pgbench reported {total}\n{q.describe()}")
    finally:
        server.stop(grace=10)
        if canald is not None:
            crashed = canald.stop()
            assert crashed is None, crashed
        shutil.rmtree(top, ignore_errors=True)
