"""The stdlib echo program (progs/echo.py) over canal: 10,000 TCP messages of 1 B..256 KiB,
UDP datagrams of 1 B..65,507 B, and 32 concurrent TCP connections of 16 MiB each, contents
or SHA-256 checked by the client.

Modes: "native" (server and client run directly: proves the program and the machine),
"canal-client" (native server, client under canal), "canal-both" (server and client each
under their own `canal run`)."""

import pytest

from canal_harness import runner

MODES = ["native", "canal-client", "canal-both"]


def _start_server(request, mode, python, progs, proto):
    run = runner(request, "canal" if mode == "canal-both" else "native")
    server = run.spawn([python, progs / "echo.py", "serve", proto], name=f"echo-server-{proto}")
    line = server.wait_line("READY", 30)
    return server, int(line.split()[1])


def _client(request, mode, python, progs, args, timeout):
    run = runner(request, "native" if mode == "native" else "canal")
    r = run.run([python, progs / "echo.py", *args], timeout=timeout, name=f"echo-{args[0]}")
    assert r.returncode == 0, r.describe()
    assert r.stdout.startswith("OK "), r.describe()
    print(r.stdout.strip())
    return r


@pytest.mark.parametrize("mode", MODES)
def test_echo_tcp_messages(request, mode, python, progs):
    server, port = _start_server(request, mode, python, progs, "tcp")
    _client(request, mode, python, progs, ["tcp-msgs", "--port", str(port), "--count", "10000", "--max-size", "262144"], 100)
    assert server.poll() is None, f"echo server died\n{server.describe()}"


@pytest.mark.parametrize("mode", MODES)
def test_echo_udp_datagrams(request, mode, python, progs):
    server, port = _start_server(request, mode, python, progs, "udp")
    _client(request, mode, python, progs, ["udp-msgs", "--port", str(port), "--count", "3000", "--max-size", "65507"], 60)
    assert server.poll() is None, f"echo server died\n{server.describe()}"


@pytest.mark.parametrize("mode", MODES)
def test_echo_tcp_32_connections(request, mode, python, progs):
    server, port = _start_server(request, mode, python, progs, "tcp")
    _client(request, mode, python, progs, ["tcp-bulk", "--port", str(port), "--conns", "32", "--bytes", str(16 << 20)], 100)
    assert server.poll() is None, f"echo server died\n{server.describe()}"
