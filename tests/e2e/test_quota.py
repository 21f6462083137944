"""Quotas and policy per guest (issue 17): a connection rate, a request rate, allowed
and denied destinations, per-guest sizes — set in a configuration file by guest name
and by uid, seen in `canal stat --json` and canald's log."""

import os
import subprocess

import pytest

from canal_harness import Canald, clean_env

LOG_WAIT = 10


def _config(tmp_path, text):
    f = tmp_path / "canald.toml"
    f.write_text(text)
    f.chmod(0o644)
    return f


def _named(tmp_path, python, name):
    """`python` under another name: the guest's comm (its name for the quota table)."""
    link = tmp_path / name
    os.symlink(python, link)
    return str(link)


@pytest.fixture
def server(procs, python, progs):
    """A native echo server (the kernel's, not canal's: the load under test is the
    guests')."""
    p = procs.spawn([python, progs / "quota.py", "serve"], name="quota-server")
    return int(p.wait_line("READY", 20).split()[1])


def test_connection_rate_holds_and_spares_the_neighbour(canal_bin, procs, python, progs, server, tmp_path):
    """A guest over its connection rate is slowed to it, and another guest's request/
    response p99 stays under 10 ms meanwhile."""
    rate, secs = 200, 4.0
    conf = _config(tmp_path, f'[quota.guest.stormer]\nconnect-rate = {rate}\n')
    d = Canald(canal_bin, procs, args=["--config", conf, "-v"]).start()
    stormer = _named(tmp_path, python, "stormer")
    storm = procs.spawn(d.argv([stormer, progs / "quota.py", "storm", server, secs, 8]), name="storm")
    rr = procs.spawn(d.argv([python, progs / "quota.py", "rr", server, secs - 1]), name="rr")
    rr_line = rr.wait_line("RR", 60).split()
    storm_line = storm.wait_line("CONNECTS", 60).split()
    n, took = int(storm_line[1]), float(storm_line[2])
    # One second's worth at once, then the rate: never much more.
    assert n <= rate * took + rate + 20, f"{n} connects in {took:.2f} s with a rate of {rate}/s"
    assert n >= rate * (took - 1) * 0.5, f"only {n} connects in {took:.2f} s: the rate starves it"
    count, p50, p99 = int(rr_line[1]), float(rr_line[2]), float(rr_line[3])
    assert count > 100, rr_line
    assert p99 < 10.0, f"the neighbour's p99 is {p99:.2f} ms (p50 {p50:.3f} ms) while a guest storms connects"
    assert storm.finish(30).returncode == 0 and rr.finish(30).returncode == 0
    # The hit is counted and logged once (not once per connect).
    log = d.proc.stderr()
    lines = [l for l in log.splitlines() if "over its connection rate" in l]
    assert 1 <= len(lines) <= 2, lines
    assert "stormer" in lines[0] and "WARN" in lines[0], lines


def test_connection_rate_shows_in_stat(canal_bin, procs, python, progs, server, tmp_path):
    conf = _config(tmp_path, '[quota.default]\nconnect-rate = 20\n')
    d = Canald(canal_bin, procs, args=["--config", conf]).start()
    p = procs.spawn(d.argv([python, "-c", f"""
import socket, sys, time
t = time.monotonic()
for i in range(60):
    s = socket.socket(); s.connect(("127.0.0.1", {server})); s.close()
print("TOOK %.2f" % (time.monotonic() - t), flush=True)
sys.stdin.read()
"""]), stdin=subprocess.PIPE, name="slow-connects")
    took = float(p.wait_line("TOOK", 60).split()[1])
    # 20 at once, 40 more at 20/s: at least ~2 s.
    assert took >= 1.8, f"60 connects at 20/s took only {took:.2f} s"
    g = d.guest(p)
    assert g["quota"]["connect_waits"] >= 30, g["quota"]
    assert g["requests"] >= 60 and g["quota"]["denied"] == 0, g
    p.send_line()
    assert p.finish(30).returncode == 0


def test_request_rate(canal_bin, procs, python, progs, tmp_path):
    rate = 200
    conf = _config(tmp_path, f'[quota.default]\nrequest-rate = {rate}\n')
    d = Canald(canal_bin, procs, args=["--config", conf]).start()
    p = procs.spawn(d.argv([python, progs / "quota.py", "sockets", 300]), stdin=subprocess.PIPE, name="binds")
    took = float(p.wait_line("SOCKETS", 60).split()[2])
    n = d.guest(p)["requests"]
    # Requests beyond the first second's worth come at the rate.
    assert n >= 300, f"only {n} requests for 300 socket+bind+close"
    assert took >= (n - rate) / rate * 0.9, f"{n} requests at {rate}/s took only {took:.2f} s"
    assert d.guest(p)["quota"]["request_waits"] > 0
    assert "over its request rate" in d.proc.stderr()
    p.send_line()
    assert p.finish(30).returncode == 0


def test_destinations_allowed_and_denied(canal_bin, procs, python, progs, server, tmp_path):
    conf = _config(tmp_path, f"""
[quota.default]
allow = ["127.0.0.0/8", "[::1]"]
deny = ["127.0.0.1:{server}"]
""")
    d = Canald(canal_bin, procs, args=["--config", conf]).start()
    quota = progs / "quota.py"
    out = lambda *a: procs.run(d.argv([python, quota, "connect", *a]), timeout=30).stdout.strip()  # noqa: E731
    # Denied wins over allowed: the kernel's errno for a destination netfilter refuses.
    assert out("127.0.0.1", server) == "ERR EPERM Operation not permitted"
    # Outside allow: refused the same way, before any packet leaves.
    assert out("192.0.2.1", 80) == "ERR EPERM Operation not permitted"
    # Allowed: what the kernel answers (nobody listens on 127.0.0.2:1).
    assert out("127.0.0.2", 1) == "ERR ECONNREFUSED Connection refused"
    assert "destination refused by its policy" in d.proc.stderr()
    # UDP sendto is judged the same way; sendto returns before canald sees the
    # datagram, so the socket's next call reports EPERM (as an ICMP error is).
    r = procs.run(d.argv([python, "-c", """
import socket, errno, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.sendto(b"x", ("192.0.2.1", 53))
for i in range(50):
    try:
        s.sendto(b"x", ("127.0.0.1", 9)); time.sleep(0.02)
    except OSError as e:
        print(errno.errorcode[e.errno]); break
else:
    print("NO ERROR")
"""]), timeout=30)
    assert r.stdout.strip() == "EPERM", r.describe()


def test_sockets_quota_by_uid(canal_bin, procs, python, tmp_path):
    """[quota.uid.N] sizes the guest's socket table: socket() beyond it fails with
    EMFILE, as at the process's descriptor limit."""
    conf = _config(tmp_path, f"[quota.uid.{os.getuid()}]\nsockets = 20\n")
    d = Canald(canal_bin, procs, args=["--config", conf]).start()
    r = procs.run(d.argv([python, "-c", """
import socket, errno
held = []
try:
    while len(held) < 100:
        held.append(socket.socket())
except OSError as e:
    print("STOP", len(held), errno.errorcode[e.errno])
"""]), timeout=30)
    words = r.stdout.split()
    assert words[0] == "STOP" and words[2] == "EMFILE", r.describe()
    assert int(words[1]) <= 20, r.describe()


def test_quota_by_cgroup(canal_bin, procs, python, progs, server, tmp_path):
    """[quota.cgroup."PATH"] applies to a guest in PATH or below it: "/" holds every
    process, so its deny list applies whatever cgroup the test runs in; a cgroup the
    guest is not in does not apply."""
    conf = _config(tmp_path, f"""
[quota.cgroup."/"]
deny = ["127.0.0.1:{server}"]
[quota.cgroup."/no-such-slice/none.service"]
deny = ["127.0.0.2"]
""")
    d = Canald(canal_bin, procs, args=["--config", conf]).start()
    out = lambda *a: procs.run(d.argv([python, progs / "quota.py", "connect", *a]), timeout=30).stdout.strip()  # noqa: E731
    assert out("127.0.0.1", server) == "ERR EPERM Operation not permitted"
    assert out("127.0.0.2", 1) == "ERR ECONNREFUSED Connection refused"


def test_invalid_quota_fails_at_start(canald_bin, tmp_path):
    for text, why in (('[quota.default]\nconect-rate = 5\n', "unknown field `conect-rate`"),
                      ('[quota.default]\nallow = ["10.0.0.0/99"]\n', "prefix"),
                      ('[quota.uid.no-such-user-x]\nsockets = 3\n', "no such user")):
        conf = _config(tmp_path, text)
        r = subprocess.run([canald_bin, "--config", conf, "--print-config"], capture_output=True, text=True,
                           timeout=30, env=clean_env({}))
        assert r.returncode == 2 and why in r.stderr, (text, r.stderr)
        assert str(conf) in r.stderr, r.stderr
