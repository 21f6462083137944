"""The `canal` front door: stat's JSON, exit-status pass-through, the private daemon."""

import os
import shutil
import signal
import subprocess

import pytest

import e2e_util
from canal_harness import canal_stat, clean_env, guest_pids, short_tmpdir


def test_stat_json_shape(canald):
    st = canald.stat()
    assert isinstance(st.get("daemon"), dict), st
    assert st["daemon"]["socket"] == canald.socket, st
    assert e2e_util.pid_alive(st["daemon"]["pid"]), f"daemon.pid {st['daemon']['pid']} is not a live process"
    assert isinstance(st.get("guests"), list), st
    assert st["guests"] == [], f"a fresh daemon lists guests: {st['guests']}"
    # the human-readable form answers too
    r = canald.procs.run([canald.canal_bin, "stat", "--socket", canald.socket], timeout=10, name="canal-stat")
    assert r.returncode == 0, r.describe()


def test_run_passes_exit_status(canald):
    r = canald.run(["sh", "-c", "exit 7"], timeout=60)
    assert r.returncode == 7, r.describe()
    r = canald.run(["true"], timeout=60)
    assert r.returncode == 0, r.describe()
    r = canald.run(["sh", "-c", "kill -KILL $$"], timeout=60)
    # `canal run` execs the program (same pid, same signals), so a signal that kills
    # the program kills `canal run` the same way; a shell shows 128+N.
    assert r.returncode == -signal.SIGKILL, r.describe()


def test_run_keeps_closed_standard_descriptors_closed(canald):
    """`canal run -- PROG >&-`: PROG finds stdout closed, as natively (a runtime that
    reopened it on /dev/null would turn a write error into silent success)."""
    probe = "if [ -e /proc/$$/fd/{r} ]; then echo open >&2; else echo closed >&2; fi"
    cases = (("1>&-", "1", "closed"), ("0<&-", "0", "closed"), ("", "1", "open"))
    for close, use, want in cases:
        script = f'exec "$@" {close}'
        argv = ["sh", "-c", script, "sh", str(canald.canal_bin), "run", "--socket", str(canald.socket), "--",
                "sh", "-c", probe.format(r=use)]
        cp = subprocess.run(argv, env=clean_env(), capture_output=True, text=True, timeout=60)
        assert cp.stderr.strip().endswith(want), (close, cp.returncode, cp.stderr)


@pytest.mark.relay
def test_guest_listed_in_stat(canald, python, progs):
    with e2e_util.HoldServer() as hold:
        p = canald.spawn([python, progs / "echo.py", "idle", "--port", hold.port])
        p.wait_line("CONNECTED", 30)

        def listed():
            g = canald.guest(p)
            if not g:
                return None
            for s in g.get("sockets", []):
                if s.get("kind") == "tcp" and s.get("state") == "connected" and s.get("peer") == f"127.0.0.1:{hold.port}":
                    return g
            return None

        g = e2e_util.wait_for(listed, 10, what=f"stat to list the guest's connection to 127.0.0.1:{hold.port}")
        assert g["pid"] in guest_pids(p)
        assert isinstance(g.get("id"), int) and isinstance(g.get("comm"), str), g
        sock = next(s for s in g["sockets"] if s.get("state") == "connected")
        for key in ("handle", "kind", "state", "local", "peer", "tx_bytes", "rx_bytes"):
            assert key in sock, f"socket entry lacks {key!r}: {sock}"
        assert sock["local"].startswith("127.0.0.1:"), sock
    r = p.finish(30)
    assert r.returncode == 0, r.describe()
    e2e_util.wait_for(lambda: canald.guest(g["pid"]) is None, 10, what="the guest to leave stat after it exited")


@pytest.mark.deadline(200)
def test_run_autostarts_private_daemon(canal_bin, procs, python, progs):
    sockdir = short_tmpdir()
    sock = os.path.join(sockdir, "canald.sock")
    env = clean_env({"CANAL_SOCKET": sock})
    daemon_pids = set()
    try:
        # exit status passes through with a private daemon, too
        r = procs.run([canal_bin, "run", "--", "sh", "-c", "exit 7"], timeout=60, env=env)
        assert r.returncode == 7, r.describe()

        # a guest with a live connection: a canald must answer on $CANAL_SOCKET
        with e2e_util.HoldServer() as hold:
            p = procs.spawn([canal_bin, "run", "--", python, progs / "echo.py", "idle", "--port", hold.port], env=env)
            p.wait_line("CONNECTED", 30)
            st = canal_stat(canal_bin, None, env=env)  # no --socket: $CANAL_SOCKET names it
            daemon_pids.add(st["daemon"]["pid"])
            assert st["daemon"]["socket"] == sock, st
            pids = guest_pids(p)
            assert any(g.get("pid") in pids for g in st.get("guests", [])), (
                f"the guest (pids {pids}) is not listed by the private daemon: {st}"
            )
        r = p.finish(30)
        assert r.returncode == 0, r.describe()

        # the private daemon leaves by itself a few seconds after its last guest
        for pid in daemon_pids:
            e2e_util.wait_for(lambda: not e2e_util.pid_alive(pid), 30, interval=0.1,
                              what=f"the private canald (pid {pid}) to exit after its last guest left")
    finally:
        for pid in daemon_pids:
            if e2e_util.pid_alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        shutil.rmtree(sockdir, ignore_errors=True)



def test_vm_region_for_your_own_vm(canald):
    """`canal vm region`: canald creates a VM's region file (mode 0600, a valid header
    without the PORT_EVENTFD feature), lists the VM guest, and removes the file when the
    command ends. No QEMU needed: the file is what a hypervisor would map."""
    import struct

    name = f"t-{os.getpid()}"
    path = f"/dev/shm/canal-{name}"
    p = canald.procs.spawn(
        [canald.canal_bin, "vm", "region", "--name", name, "--size", "2", "--publish", "18081:80"],
        name="vm-region",
        env=clean_env({"CANAL_SOCKET": canald.socket}),
    )
    try:
        p.wait_line("# serving", 10)
        assert f"mem-path={path},size=2097152" in p.stdout(), p.describe()
        assert f"<shmem name='canal-{name}'>" in p.stdout(), p.describe()
        st = os.stat(path)
        assert st.st_size == 2 << 20 and st.st_mode & 0o777 == 0o600, st
        with open(path, "rb") as f:
            head = f.read(32)
        assert head[:8] == b"CANALRGN"
        features = struct.unpack_from("<Q", head, 16)[0]
        assert features & 0b11 == 0b11 and features & 0b100 == 0, hex(features)
        g = [x for x in canald.stat()["guests"] if x["comm"] == f"vm:{name}"]
        assert len(g) == 1, canald.stat()
        # The same name twice is refused (the file is created exclusively).
        r = canald.procs.run(
            [canald.canal_bin, "vm", "region", "--name", name],
            timeout=10,
            env=clean_env({"CANAL_SOCKET": canald.socket}),
        )
        assert r.returncode == 1 and "exists" in r.stderr, r.describe()
    finally:
        os.kill(p.pid, signal.SIGTERM)
    r = p.finish(timeout=10)
    assert r.returncode == 128 + signal.SIGTERM, r.describe()
    e2e_util.wait_for(lambda: not os.path.exists(path), timeout=2, what="canald to remove the region file")
    e2e_util.wait_for(
        lambda: not [x for x in canald.stat()["guests"] if x["comm"] == f"vm:{name}"],
        timeout=2,
        what="the VM guest to go",
    )
