"""Python's standard library under canal: an asyncio echo server and an asyncio client with
200 concurrent connections (all connected before any sends), every echo compared with what
was sent (progs/aio.py); and `python3 -m http.server` serving files fetched by curl, hashes
compared. The interpreter is the real one (sys.executable), not a pyenv shim."""

import pytest

import compat_util
import e2e_util
from canal_harness import need_tool
from compat_util import MODES

CONNS = 200
MAXBYTES = 256 * 1024


@pytest.mark.deadline(120)
@pytest.mark.parametrize("mode", MODES)
def test_asyncio_200_connections(request, mode, python, compat_progs):
    server_run, client_run = compat_util.ends(request, mode)
    server = server_run.spawn([python, compat_progs / "aio.py", "serve"], name="aio-server")
    port = int(server.wait_line("READY", 30).split()[1])
    compat_util.assert_served_by_canal(request, mode, port, what="asyncio server")
    with compat_util.CanalSampler(request, mode) as sampler:
        r = client_run.run([python, compat_progs / "aio.py", "client", port, CONNS, MAXBYTES], timeout=90,
                           name="aio-client")
    assert r.returncode == 0 and r.stdout.startswith("OK "), f"asyncio client failed\n{r.describe()}"
    sampler.require_peer_port(port, "asyncio client", program=python)
    assert f"conns={CONNS}" in r.stdout, r.describe()
    print(r.stdout.strip())
    assert server.poll() is None, f"asyncio server died\n{server.describe()}"
    assert "error" not in server.stderr().lower(), f"asyncio server reported errors\n{server.describe()}"


@pytest.mark.deadline(90)
@pytest.mark.parametrize("mode", MODES)
def test_http_server_module(request, mode, python, tmp_path):
    curl = need_tool("curl")
    server_run, client_run = compat_util.ends(request, mode)
    root = tmp_path / "www"
    hashes = compat_util.make_files(root, [0, 1, 4096, 100_000, (2 << 20) + 5])
    port = e2e_util.free_port()
    server = server_run.spawn([python, "-m", "http.server", "--bind", "127.0.0.1", "--directory", root, port],
                              name="http.server")
    compat_util.wait_listening(server, port, "python3 -m http.server")
    compat_util.assert_served_by_canal(request, mode, port, what="http.server")
    dl = tmp_path / "dl"
    dl.mkdir()
    argv = [curl, "-sS", "--fail", "--max-time", "30"]
    for name in hashes:
        argv += ["-o", dl / name, f"http://127.0.0.1:{port}/{name}"]
    r = client_run.run(argv, timeout=60, name="curl")
    assert r.returncode == 0, f"curl failed\n{r.describe()}"
    for name, want in hashes.items():
        assert (dl / name).exists(), f"{name} was not downloaded\n{r.describe()}"
        got = e2e_util.sha256_file(dl / name)
        assert got == want, f"{name}: downloaded SHA-256 {got} != served {want}"
    # a directory listing and a 404 through the same server
    r = client_run.run([curl, "-sS", "--max-time", "10", "-w", "%{http_code}",
                        "-o", "/dev/null",
                        f"http://127.0.0.1:{port}/", "-o", "/dev/null", f"http://127.0.0.1:{port}/missing"], timeout=30, name="curl-codes")
    assert r.returncode == 0 and r.stdout == "200404", f"want 200 for / then 404 for /missing, got {r.stdout!r}\n{r.describe()}"
    assert server.poll() is None, f"http.server died\n{server.describe()}"
