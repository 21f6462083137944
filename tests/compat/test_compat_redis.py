"""redis-server with redis-benchmark (SET, GET, LPUSH; then the same pipelined, -P 16):
every request completes, checked by the server's own per-command call counts (INFO
commandstats) and by LLEN of the benchmark's list; then a redis-cli round trip of a 1 MiB
binary value (SET -x from stdin, GET --raw) compared byte for byte.

redis-server runs with --port P --bind 127.0.0.1 --save '' --appendonly no in a temp dir.
The checks that read the server's counters use a native socket from the test itself."""

import random
import re
import socket

import pytest

import compat_util
import e2e_util
from canal_harness import need_tool
from compat_util import MODES

N_PLAIN = 20000
N_PIPELINED = 100000


def _redis(port, *args, timeout=10):
    """One command over a native connection (RESP); returns the reply as bytes/int/str."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        req = b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in (x.encode() if isinstance(x, str) else x for x in args))
        s.sendall(req)
        f = s.makefile("rb")
        line = f.readline()
        kind, rest = line[:1], line[1:-2]
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else f.read(n + 2)[:-2]
        if kind == b":":
            return int(rest)
        if kind in (b"+", b"-"):
            return rest.decode()
        raise AssertionError(f"unexpected redis reply {line!r}")


def _calls(port):
    info = _redis(port, "INFO", "commandstats").decode()
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^cmdstat_(\w+):calls=(\d+)", info, re.M)}


@pytest.mark.deadline(150)
@pytest.mark.parametrize("mode", MODES)
def test_redis(request, mode, tmp_path):
    server_bin = need_tool("redis-server")
    bench = need_tool("redis-benchmark")
    cli = need_tool("redis-cli")
    server_run, client_run = compat_util.ends(request, mode)
    port = e2e_util.free_port()
    server = server_run.spawn(
        [server_bin, "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", tmp_path, "--logfile", "", "--protected-mode", "no"],
        name="redis-server",
    )
    compat_util.wait_listening(server, port, "redis-server")
    compat_util.assert_served_by_canal(request, mode, port, what="redis-server")
    e2e_util.wait_for(lambda: _try_ping(port), 10, what="redis-server to answer PING")

    base = _calls(port)
    runs = [("plain", N_PLAIN, []), ("pipelined", N_PIPELINED, ["-P", "16"])]
    for label, n, extra in runs:
        with compat_util.CanalSampler(request, mode) as sampler:
            r = client_run.run([bench, "-h", "127.0.0.1", "-p", port, "-t", "set,get,lpush", "-n", n, "-c", "20",
                                "--csv", *extra], timeout=60, name=f"redis-benchmark-{label}")
        assert r.returncode == 0, f"redis-benchmark ({label}) failed\n{r.describe()}"
        sampler.require_peer_port(port, f"redis-benchmark ({label})", program=bench)
        print(r.stdout)
        for cmd in ("SET", "GET", "LPUSH"):
            assert re.search(rf'^"{cmd}",', r.stdout, re.M), f"redis-benchmark ({label}) printed no {cmd} result\n{r.describe()}"
        assert "error" not in (r.stdout + r.stderr).lower(), f"redis-benchmark ({label}) reported an error\n{r.describe()}"
    calls = _calls(port)
    total = N_PLAIN + N_PIPELINED
    got = {c: calls.get(c, 0) - base.get(c, 0) for c in ("set", "get", "lpush")}
    assert got == {"set": total, "get": total, "lpush": total}, (
        f"the server did not execute every benchmark request (calls per command, want {total} each): {got}")
    llen = _redis(port, "LLEN", "mylist")
    assert llen == total, f"LLEN mylist is {llen}, want {total} (one per LPUSH)"

    # redis-cli round trip of a 1 MiB binary value
    value = random.Random(3).randbytes(1 << 20)
    src = tmp_path / "value.bin"
    src.write_bytes(value)
    with open(src, "rb") as stdin, compat_util.CanalSampler(request, mode) as sampler:
        r = client_run.run([cli, "-h", "127.0.0.1", "-p", port, "-x", "SET", "big"], timeout=30, name="redis-cli-set", stdin=stdin)
    assert r.returncode == 0 and r.stdout.strip() == "OK", f"redis-cli SET failed\n{r.describe()}"
    sampler.require_peer_port(port, "redis-cli", program=cli)
    stored = _redis(port, "GET", "big")
    assert stored == value, f"the server stored {len(stored or b'')} bytes, not the 1 MiB sent (or different bytes)"
    p = client_run.spawn([cli, "-h", "127.0.0.1", "-p", port, "--raw", "GET", "big"], name="redis-cli-get")
    r = p.finish(30)
    assert r.returncode == 0, f"redis-cli GET failed\n{r.describe()}"
    out = p.out_path.read_bytes()
    assert out == value + b"\n", (
        f"redis-cli GET printed {len(out)} bytes that are not the 1 MiB value + newline "
        f"(first difference at {next((i for i, (a, b) in enumerate(zip(out, value)) if a != b), min(len(out), len(value)))})")
    assert server.poll() is None, f"redis-server exited\n{server.describe()}"


def _try_ping(port):
    try:
        return _redis(port, "PING", timeout=2) == "PONG"
    except OSError:
        return False
