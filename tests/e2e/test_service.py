"""canald as a service (issue 17): scripts/install, the systemd units, socket
activation (with systemd-socket-activate, as systemd itself cannot run here), and
`canal run` finding a running service before it starts a private daemon."""

import json
import os
import shutil
import subprocess

import pytest

import e2e_util
from canal_harness import canal_stat, clean_env, guest_pids, short_tmpdir

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """canal installed by scripts/install into a staging directory (--destdir)."""
    dest = tmp_path_factory.mktemp("destdir")
    r = subprocess.run(["bash", os.path.join(ROOT, "scripts", "install"), "--no-build",
                        f"--destdir={dest}", "--prefix", "/usr/local"],
                       capture_output=True, text=True, timeout=120, env=clean_env({}))
    assert r.returncode == 0, r.stdout + r.stderr
    return dest


def test_install_lays_out_every_file(installed):
    p = lambda rel: installed / rel.lstrip("/")  # noqa: E731
    for f in ("usr/local/bin/canal", "usr/local/bin/canald", "usr/local/lib/canal/libcanal.so",
              "usr/local/share/man/man1/canal.1", "usr/local/share/man/man1/canal-run.1",
              "usr/local/share/man/man8/canald.8",
              "usr/local/share/bash-completion/completions/canal",
              "usr/local/share/zsh/vendor-completions/_canal",
              "usr/local/share/fish/vendor_completions.d/canal.fish",
              "etc/canal/canald.toml.example", "usr/local/share/doc/canal/operations.md"):
        assert p(f).exists(), f
    assert os.access(p("usr/local/bin/canald"), os.X_OK)
    for kind in ("system", "user"):
        svc = p(f"usr/local/lib/systemd/{kind}/canald.service").read_text()
        assert "ExecStart=/usr/local/bin/canald" in svc, svc
        sock = p(f"usr/local/lib/systemd/{kind}/canald.socket").read_text()
        assert "ListenSequentialPacket=" in sock, sock
    # The example configuration is a valid file for canald (every line commented).
    canald = p("usr/local/bin/canald")
    r = subprocess.run([canald, "--config", p("etc/canal/canald.toml.example"), "--print-config"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr


def test_units_pass_systemd_analyze(installed, tmp_path):
    if not shutil.which("systemd-analyze"):
        pytest.skip("systemd-analyze is not installed")
    units = tmp_path / "units"
    units.mkdir()
    bindir = installed / "usr/local/bin"
    for u in ("canald.socket", "canald.service"):
        text = (installed / "usr/local/lib/systemd/system" / u).read_text()
        (units / u).write_text(text.replace("/usr/local/bin", str(bindir)))
    r = subprocess.run(["systemd-analyze", "verify", "--man=no", units / "canald.socket", units / "canald.service"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def _activated_canald(procs, installed, sock, extra=()):
    if not shutil.which("systemd-socket-activate"):
        pytest.skip("systemd-socket-activate is not installed (package systemd)")
    return procs.spawn(["systemd-socket-activate", "--seqpacket", "-l", sock,
                        installed / "usr/local/bin/canald", "-v", *extra],
                       env=clean_env({}), name="socket-activate")


def test_socket_activated_service_serves_canal_run(installed, procs, python, progs):
    """The service socket exists before canald runs; the first `canal run` starts it,
    and canal run (installed, no --socket, no CANAL_SOCKET) finds it instead of
    starting a private daemon."""
    sysdir = short_tmpdir()
    sock = os.path.join(sysdir, "canald.sock")
    userdir = short_tmpdir()
    act = _activated_canald(procs, installed, sock)
    e2e_util.wait_for(lambda: os.path.exists(sock), 20, what="systemd-socket-activate to listen")
    env = clean_env({"CANAL_SERVICE_SOCKET": sock, "XDG_RUNTIME_DIR": userdir})
    canal = str(installed / "usr/local/bin/canal")
    with e2e_util.HoldServer() as hold:
        p = procs.spawn([canal, "run", "--", python, progs / "echo.py", "idle", "--port", hold.port], env=env)
        p.wait_line("CONNECTED", 30)
        st = canal_stat(canal, sock)
        pids = guest_pids(p)
        assert any(g.get("pid") in pids for g in st.get("guests", [])), st
        assert "socket activation" in act.stderr(), act.stderr()
    assert p.finish(30).returncode == 0
    assert not os.path.exists(os.path.join(userdir, "canal", "canald.sock")), \
        "canal run started a private daemon although the service answered"
    act.stop()
    shutil.rmtree(sysdir, ignore_errors=True)
    shutil.rmtree(userdir, ignore_errors=True)


def test_no_service_falls_back_to_a_private_daemon(installed, procs):
    userdir = short_tmpdir()
    env = clean_env({"CANAL_SERVICE_SOCKET": os.path.join(userdir, "none", "canald.sock"),
                     "XDG_RUNTIME_DIR": userdir})
    canal = str(installed / "usr/local/bin/canal")
    r = procs.run([canal, "run", "--", "true"], env=env, timeout=60)
    assert r.returncode == 0, r.describe()
    private = os.path.join(userdir, "canal", "canald.sock")
    assert os.path.exists(private), "no private daemon was started at the per-user path"
    st = canal_stat(canal, private)
    e2e_util.wait_for(lambda: not e2e_util.pid_alive(st["daemon"]["pid"]), 30,
                      what="the private daemon to exit after its idle time")
    shutil.rmtree(userdir, ignore_errors=True)


def test_activated_socket_of_the_wrong_kind_is_refused(installed, procs):
    """A socket unit with ListenStream= instead of ListenSequentialPacket=: canald says
    what is wrong instead of serving a socket guests cannot use."""
    d = short_tmpdir()
    sock = os.path.join(d, "canald.sock")
    p = procs.spawn(["systemd-socket-activate", "-l", sock, installed / "usr/local/bin/canald"],
                    env=clean_env({}), name="socket-activate-stream")
    e2e_util.wait_for(lambda: os.path.exists(sock), 20, what="systemd-socket-activate to listen")
    import socket as pysock
    s = pysock.socket(pysock.AF_UNIX, pysock.SOCK_STREAM)
    s.connect(sock)
    r = p.finish(30)
    s.close()
    assert r.returncode != 0, r.describe()
    assert "ListenSequentialPacket" in r.stderr, r.describe()
    shutil.rmtree(d, ignore_errors=True)


def test_host_wide_service_serves_each_user_as_that_user(canal_bin, procs, progs):
    """`canald --serve-users` (the system unit's): another user's `canal run` finds the
    host-wide service, whose connection goes to a canald of that user's own — so the
    host sockets are that user's (the kernel refuses port 80 as natively), that user's
    `canal stat` lists the guest and root's does not."""
    if os.geteuid() != 0 or not shutil.which("runuser"):
        pytest.skip("needs root and runuser (the test runs a program as nobody)")
    if not shutil.which("systemd-socket-activate"):
        pytest.skip("systemd-socket-activate is not installed (package systemd)")
    import pwd
    nobody = pwd.getpwnam("nobody")
    sysdir = short_tmpdir()
    os.chmod(sysdir, 0o755)
    sock = os.path.join(sysdir, "canald.sock")
    act = procs.spawn(["systemd-socket-activate", "--seqpacket", "-l", sock, canal_bin.parent / "canald",
                       "--serve-users", "-v"], env=clean_env({}), name="service-all-users")
    e2e_util.wait_for(lambda: os.path.exists(sock), 20, what="systemd-socket-activate to listen")
    # As the unit's SocketMode=0666 (systemd-socket-activate has no such option).
    os.chmod(sock, 0o666)
    userdir = short_tmpdir()
    os.chown(userdir, nobody.pw_uid, nobody.pw_gid)
    as_nobody = ["runuser", "-u", "nobody", "--", "env", "-i", "PATH=/usr/bin:/bin",
                 f"XDG_RUNTIME_DIR={userdir}", f"CANAL_SERVICE_SOCKET={sock}"]
    prog = """
import errno, socket, sys
s = socket.socket()
try:
    s.bind(("127.0.0.1", 80)); print("PORT80 bound", flush=True)
except OSError as e:
    print("PORT80", errno.errorcode[e.errno], flush=True)
l = socket.socket(); l.bind(("127.0.0.1", 0)); l.listen()
print("LISTEN", l.getsockname()[1], flush=True)
sys.stdin.read()
"""
    g = procs.spawn([*as_nobody, str(canal_bin), "run", "--", "/usr/bin/python3", "-c", prog],
                    stdin=subprocess.PIPE, name="nobody-guest")
    port = int(g.wait_line("LISTEN", 30).split()[1])
    unpriv = int(open("/proc/sys/net/ipv4/ip_unprivileged_port_start").read())
    assert g.wait_line("PORT80", 5) == ("PORT80 EACCES" if unpriv > 80 else "PORT80 bound"), g.describe()
    # The listening host socket was made with nobody's credentials.
    owners = [int(line.split()[7]) for line in open("/proc/net/tcp").read().splitlines()[1:]
              if line.split()[1].endswith(":%04X" % port) and line.split()[3] == "0A"]
    assert owners == [nobody.pw_uid], (port, owners)
    # ... by a canald running as nobody, started by the host-wide one.
    users = [p for p in os.listdir("/proc") if p.isdigit() and _cmdline(p).startswith(str(canal_bin.parent / "canald"))
             and f"--user-channel 3 --idle-exit 30 --socket {sock}" in _cmdline(p)]
    assert users and all(os.stat(f"/proc/{p}").st_uid == nobody.pw_uid for p in users), users
    # nobody's canal stat (through the same socket) lists the guest; root's does not.
    r = subprocess.run([*as_nobody, f"CANAL_SOCKET={sock}", str(canal_bin), "stat", "--json"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    st = json.loads(r.stdout)
    assert any(s["local"] == f"127.0.0.1:{port}" for gs in st["guests"] for s in gs["sockets"]), st
    assert canal_stat(str(canal_bin), sock)["guests"] == []
    assert not os.path.exists(os.path.join(userdir, "canal", "canald.sock")), "a private daemon was started"
    g.send_line()
    assert g.finish(30).returncode == 0
    act.stop()
    shutil.rmtree(sysdir, ignore_errors=True)
    shutil.rmtree(userdir, ignore_errors=True)


def _cmdline(pid):
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
