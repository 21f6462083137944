"""memcached (two worker threads, libevent) with memaslap, Debian's memcached load
generator (`memcaslap`: two threads, 16 connections, 9:1 get:set, every get read back
and compared): every operation completes — the server's own `stats` counters (read over
a native socket by the test) agree with what memaslap counted, no get missed or read a
wrong value — then a 512 KiB value stored with `memccp` and read back with `memccat`,
compared byte for byte (memccat adds a newline)."""

import os
import random
import re
import socket

import pytest

import compat_util
import e2e_util
from canal_harness import need_tool
from compat_util import MODES

OPS = 60000


def _stats(port):
    """The server's counters (`stats`), over a native connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"stats\r\n")
        buf = b""
        while not buf.endswith(b"END\r\n"):
            chunk = s.recv(65536)
            assert chunk, "memcached closed the stats connection"
            buf += chunk
    return {k.decode(): int(v) for k, v in re.findall(rb"STAT (\w+) (\d+)\r\n", buf)}


def _counted(out, key):
    m = re.search(rf"^{key}: (\d+)$", out, re.M)
    assert m, f"memaslap printed no {key}:\n{out}"
    return int(m.group(1))


@pytest.mark.deadline(150)
@pytest.mark.parametrize("mode", MODES)
def test_memcached(request, mode, tmp_path):
    server_bin = need_tool("memcached")
    slap = need_tool("memcaslap")
    cp, cat = need_tool("memccp"), need_tool("memccat")
    server_run, client_run = compat_util.ends(request, mode)
    port = e2e_util.free_port()
    argv = [server_bin, "-p", port, "-l", "127.0.0.1", "-t", "2", "-U", "0", "-I", "2m"]
    # memcached refuses to run as root unless told which user to be.
    server = server_run.spawn(argv + (["-u", "root"] if os.geteuid() == 0 else []), name="memcached")
    compat_util.wait_listening(server, port, "memcached")
    compat_util.assert_served_by_canal(request, mode, port, what="memcached")
    base = _stats(port)

    with compat_util.CanalSampler(request, mode) as sampler:
        r = client_run.run([slap, "-s", f"127.0.0.1:{port}", "-T", "2", "-c", "16", "-x", OPS, "-v", "1.0"],
                           timeout=90, name="memaslap")
    assert r.returncode == 0, f"memaslap failed\n{r.describe()}"
    sampler.require_peer_port(port, "memaslap", program=slap)
    print(r.stdout)
    gets, sets = _counted(r.stdout, "cmd_get"), _counted(r.stdout, "cmd_set")
    assert gets + sets == OPS, f"memaslap ran {gets} gets and {sets} sets, not {OPS} operations\n{r.describe()}"
    for bad in ("get_misses", "verify_misses", "verify_failed"):
        assert _counted(r.stdout, bad) == 0, f"memaslap: {bad} is not 0\n{r.describe()}"
    st = _stats(port)
    got = {k: st[k] - base.get(k, 0) for k in ("cmd_get", "cmd_set", "get_hits")}
    assert got == {"cmd_get": gets, "cmd_set": sets, "get_hits": gets}, (
        f"the server's counters {got} do not match memaslap's ({gets} gets, {sets} sets)")

    # A 512 KiB value through libmemcached's own tools, byte for byte.
    value = random.Random(5).randbytes(512 << 10)
    src = tmp_path / "big.bin"
    src.write_bytes(value)
    r = client_run.run([cp, f"--servers=127.0.0.1:{port}", src], timeout=30, name="memccp", cwd=tmp_path)
    assert r.returncode == 0, f"memccp failed\n{r.describe()}"
    p = client_run.spawn([cat, f"--servers=127.0.0.1:{port}", "big.bin"], name="memccat")
    r = p.finish(30)
    assert r.returncode == 0, f"memccat failed\n{r.describe()}"
    out = p.out_path.read_bytes()
    assert out == value + b"\n", f"memccat printed {len(out)} bytes that are not the 512 KiB stored + newline"
    assert server.poll() is None, f"memcached exited\n{server.describe()}"
