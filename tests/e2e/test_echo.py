"""The stdlib echo program (progs/echo.py) over canal: 10,000 TCP messages of 1 B..256 KiB,
UDP datagrams of 1 B..65,507 B, and 32 concurrent TCP connections of 16 MiB each, contents
or SHA-256 checked by the client.

Modes: "native" (server and client run directly: proves the program and the machine),
"canal-client" (native server, client under canal), "canal-both" (server and client each
under their own `canal run`; their TCP connections are short-circuited guest to
guest). Under canal, the client connects, then waits until `canal stat` lists its sockets (so a program the library failed to intercept cannot pass
natively), then moves the data."""

import subprocess

import pytest

from canal_harness import runner

MODES = ["native", "canal-client", "canal-both"]


def _start_server(request, mode, python, progs, proto):
    under_canal = mode == "canal-both"
    run = runner(request, "canal" if under_canal else "native")
    server = run.spawn([python, progs / "echo.py", "serve", proto], name=f"echo-server-{proto}")
    port = int(server.wait_line("READY", 30).split()[1])
    if under_canal:
        run.wait_served(server, kind="tcp-listener" if proto == "tcp" else "udp")
    return server, port


def _client(request, mode, python, progs, args, timeout, kind, conns):
    under_canal = mode != "native"
    run = runner(request, "canal" if under_canal else "native")
    client = run.spawn([python, progs / "echo.py", *args, "--go-after-connect"], name=f"echo-{args[0]}",
                       stdin=subprocess.PIPE)
    client.wait_line("CONNECTED", 30)
    if under_canal:
        port = int(args[args.index("--port") + 1])
        if kind == "tcp" and mode == "canal-both" and run.stat()["daemon"]["config"]["shortcut"]:
            # Both ends are canal guests: canald short-circuits the connection (no
            # kernel TCP; protocol §8), and canal stat says so.
            kind = "tcp-shortcut"
        run.wait_served(client, kind=kind, peer_port=port if kind.startswith("tcp") else None, count=conns)
    client.send_line("go")
    r = client.finish(timeout)
    assert r.returncode == 0, r.describe()
    assert any(l.startswith("OK ") for l in r.stdout.splitlines()), r.describe()
    print(r.stdout.strip().splitlines()[-1])
    return r


@pytest.mark.relay
@pytest.mark.parametrize("mode", MODES)
def test_echo_tcp_messages(request, mode, python, progs):
    server, port = _start_server(request, mode, python, progs, "tcp")
    _client(request, mode, python, progs,
            ["tcp-msgs", "--port", str(port), "--count", "10000", "--max-size", "262144"], 100, "tcp", 1)
    assert server.poll() is None, f"echo server died\n{server.describe()}"


@pytest.mark.relay
@pytest.mark.parametrize("mode", MODES)
def test_echo_udp_datagrams(request, mode, python, progs):
    server, port = _start_server(request, mode, python, progs, "udp")
    _client(request, mode, python, progs,
            ["udp-msgs", "--port", str(port), "--count", "3000", "--max-size", "65507"], 60, "udp", 1)
    assert server.poll() is None, f"echo server died\n{server.describe()}"


@pytest.mark.relay
@pytest.mark.parametrize("mode", MODES)
def test_echo_tcp_32_connections(request, mode, python, progs):
    server, port = _start_server(request, mode, python, progs, "tcp")
    _client(request, mode, python, progs,
            ["tcp-bulk", "--port", str(port), "--conns", "32", "--bytes", str(16 << 20)], 100, "tcp", 32)
    assert server.poll() is None, f"echo server died\n{server.describe()}"


@pytest.mark.parametrize("mode", ["native", "canal-client"])
def test_udp_burst_to_two_receivers(request, mode, python, progs):
    """3,000 datagrams sent back to back from one socket, every third to a second
    receiver: canald relays what it finds queued in batches (one sendmmsg for up to 32
    datagrams), and each datagram must still reach its own destination, intact and in
    order, none lost (4 MiB receive buffers on loopback)."""
    recv = runner(request, "native").spawn([python, progs / "udpburst.py", "recv", "--count", "3000"],
                                           name="udpburst-recv")
    ports = recv.wait_line("READY", 30).split()[1:]
    run = runner(request, "canal" if mode != "native" else "native")
    r = run.spawn([python, progs / "udpburst.py", "send", "--ports", *ports, "--count", "3000"],
                  name="udpburst-send").finish(60)
    assert r.returncode == 0, r.describe()
    got = recv.finish(60)
    assert got.returncode == 0 and "OK 3000" in got.stdout, got.describe()
