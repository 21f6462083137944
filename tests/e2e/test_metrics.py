"""Observability (issue 17): `canal stat --prometheus`, `canald --metrics ADDR` parsed
with Prometheus's own parser (python3-prometheus-client), counters that move with
traffic, and `canal top`."""

import socket
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from canal_harness import Canald, clean_env

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:  # a python3 other than Debian's (the package installs there)
    sys.path.append("/usr/lib/python3/dist-packages")
    from prometheus_client.parser import text_string_to_metric_families


def _free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _samples(text):
    """{(name, frozenset(labels)): value} and {family: type}, through the real parser."""
    values, types = {}, {}
    for fam in text_string_to_metric_families(text):
        types[fam.name] = fam.type
        for s in fam.samples:
            values[(s.name, frozenset(s.labels.items()))] = s.value
    return values, types


def _guest_value(values, name, pid_set):
    got = [v for (n, labels), v in values.items() if n == name and int(dict(labels)["pid"]) in pid_set]
    assert got, f"no {name} for pids {pid_set}"
    return sum(got)


def _scrape(port, path="/metrics"):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
        assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4"), r.headers
        return r.read().decode()


def test_metrics_endpoint_parses_and_moves_with_traffic(canal_bin, procs, python, progs):
    port = _free_port()
    # The traffic counted is canald's relay of a native peer's bytes.
    d = Canald(canal_bin, procs, args=["--metrics", f"127.0.0.1:{port}", "--direct", "off"]).start()
    values, types = _samples(_scrape(port))
    for fam, kind in (("canal_info", "gauge"), ("canal_guests", "gauge"),
                      ("canal_worker_rounds", "counter"), ("canal_worker_spin_seconds", "counter"),
                      ("canal_guest_requests", "counter"), ("canal_guest_sent_bytes", "counter"),
                      ("canal_guest_quota_denied", "counter"), ("canal_worker_sockets", "gauge")):
        assert types.get(fam) == kind, (fam, types.get(fam))
    assert values[("canal_guests", frozenset())] == 0
    rounds0 = values[("canal_worker_rounds_total", frozenset({("worker", "0"), ("notify", d.stat()["daemon"]["config"]["notify"])}))]

    server = procs.spawn([python, progs / "echo.py", "serve", "tcp", "--port", "0"], name="echo-server")
    eport = server.wait_line("READY", 20).split()[1]
    # A guest that moves bytes, then stays (its counters must still be listed).
    g = procs.spawn(d.argv([python, "-c", f"""
import socket, sys
s = socket.create_connection(("127.0.0.1", {eport}))
for i in range(200):
    s.sendall(b"x" * 1000)
    n = 0
    while n < 1000:
        n += len(s.recv(65536))
s.close()
t = socket.create_connection(("127.0.0.1", {eport}))
print("DONE", flush=True)
sys.stdin.read()
"""]), stdin=subprocess.PIPE, name="metrics-guest")
    g.wait_line("DONE", 60)
    pids = {x["pid"] for x in d.stat()["guests"]}
    values, _ = _samples(_scrape(port))
    assert values[("canal_guests", frozenset())] == 1
    # Bytes of the closed connection are still counted (counters never go down).
    assert _guest_value(values, "canal_guest_sent_bytes_total", pids) >= 200_000
    assert _guest_value(values, "canal_guest_received_bytes_total", pids) >= 200_000
    assert _guest_value(values, "canal_guest_requests_total", pids) >= 2  # the two connects
    assert _guest_value(values, "canal_guest_sockets", pids) == 1
    rounds1 = sum(v for (n, _), v in values.items() if n == "canal_worker_rounds_total")
    assert rounds1 > rounds0
    # The workers' own counters saw the same traffic.
    assert sum(v for (n, _), v in values.items() if n == "canal_worker_bytes_total") >= 400_000
    assert sum(v for (n, _), v in values.items() if n == "canal_worker_requests_total") >= 2

    # canal stat --prometheus is the same exposition.
    r = subprocess.run([canal_bin, "stat", "--prometheus", "--socket", d.socket],
                       capture_output=True, text=True, timeout=30, env=clean_env({}))
    assert r.returncode == 0, r.stderr
    v2, _ = _samples(r.stdout)
    assert _guest_value(v2, "canal_guest_sent_bytes_total", pids) >= 200_000

    # canal top: one refresh, the guest with its rates.
    r = subprocess.run([canal_bin, "top", "--socket", d.socket, "-n", "1", "-d", "0.2", "--sockets"],
                       capture_output=True, text=True, timeout=30, env=clean_env({}))
    assert r.returncode == 0, r.stderr
    assert "GUEST" in r.stdout and "REQ/s" in r.stdout and "python" in r.stdout, r.stdout
    assert "connected" in r.stdout, r.stdout
    assert "\x1b[" not in r.stdout, "terminal escapes written to a pipe"

    # Anything but /metrics: 404; not GET: 405.
    with pytest.raises(urllib.error.HTTPError) as e:
        _scrape(port, "/nothing")
    assert e.value.code == 404
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", data=b"x", method="POST")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=10)
    assert e.value.code == 405
    g.send_line()
    assert g.finish(30).returncode == 0


def test_metrics_address_in_use_fails_at_start(canal_bin, canald_bin, procs):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    port = busy.getsockname()[1]
    d = Canald(canal_bin, procs, args=["--metrics", str(port)])
    with pytest.raises(AssertionError) as e:
        d.start(timeout=10)
    assert "Address already in use" in str(e.value) and f"--metrics 127.0.0.1:{port}" in str(e.value)
    busy.close()
    r = subprocess.run([canald_bin, "--metrics", "localhost:80", "--print-config"], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 2 and "is not PORT, IP:PORT or [IPv6]:PORT" in r.stderr, r.stderr
