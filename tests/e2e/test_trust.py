"""Who a guest trusts (issue 12): another local user who pre-creates canal's control
directory, plants symlinks there or runs a daemon of their own gets nothing of root's."""

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import threading
import time

import pytest

from canal_harness import clean_env

ATTACKER = "canal-attacker"


def _attacker():
    if os.geteuid() != 0:
        pytest.skip("needs root: the test creates a second local user")
    try:
        return pwd.getpwnam(ATTACKER)
    except KeyError:
        pass
    if not shutil.which("useradd"):
        pytest.skip("useradd is not installed")
    subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", ATTACKER],
                   check=True, capture_output=True)
    return pwd.getpwnam(ATTACKER)


class FakeDaemon:
    """A SOCK_SEQPACKET listener on `path` whose socket belongs to `uid` (listen() is
    called after switching to it, so SO_PEERCRED names that user); records every byte
    a client sends."""

    def __init__(self, path, uid, gid):
        r, w = os.pipe()
        self.path = path
        self.pid = os.fork()
        if self.pid == 0:  # child: bind, become the attacker, listen, record
            os.close(r)
            try:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                s.bind(path)
                os.chmod(path, 0o777)
                os.setgroups([])
                os.setresgid(gid, gid, gid)
                os.setresuid(uid, uid, uid)
                s.listen(8)
                os.write(w, b"L")
                while True:
                    c, _ = s.accept()
                    c.settimeout(2)
                    try:
                        data = c.recv(4096)
                        if data:
                            os.write(w, b"D")
                    except OSError:
                        pass
            finally:
                os._exit(0)
        os.close(w)
        self.r = r
        assert os.read(r, 1) == b"L"
        os.set_blocking(r, False)

    def got_data(self):
        try:
            return b"D" in os.read(self.r, 64)
        except BlockingIOError:
            return False

    def stop(self):
        os.kill(self.pid, 9)
        os.waitpid(self.pid, 0)


def _planted_base(att):
    """XDG_RUNTIME_DIR-like base (sticky, world-writable, like /tmp) in which the attacker
    made canal's directory first, mode 0777, with symlinks at the log and lock names
    pointing into a root-only directory."""
    base = tempfile.mkdtemp(prefix="canal-trust-", dir="/tmp")
    os.chmod(base, 0o1777)
    victim = tempfile.mkdtemp(prefix="canal-victim-", dir="/tmp")
    d = os.path.join(base, "canal")
    os.mkdir(d)
    os.chown(d, att.pw_uid, att.pw_gid)
    os.chmod(d, 0o777)
    for name in ("canald.sock.log", "canald.sock.lock"):
        os.symlink(os.path.join(victim, name), os.path.join(d, name))
        os.lchown(os.path.join(d, name), att.pw_uid, att.pw_gid)
    return base, d, victim


def test_planted_directory_is_refused(canal_bin, libcanal_so, python):
    att = _attacker()
    base, d, victim = _planted_base(att)
    fake = FakeDaemon(os.path.join(d, "canald.sock"), att.pw_uid, att.pw_gid)
    try:
        env = clean_env({"XDG_RUNTIME_DIR": base})
        cp = subprocess.run([canal_bin, "run", "--", python, "-c", "print('ran')"], env=env,
                            capture_output=True, timeout=30)
        err = cp.stderr.decode()
        assert cp.returncode != 0 and b"ran" not in cp.stdout, f"canal run used a planted directory: {err}"
        assert "belongs to uid" in err and d in err, f"canal run does not say why it refused: {err!r}"
        time.sleep(0.3)
        assert not fake.got_data(), "root's canal run sent bytes to the impostor"
        assert os.listdir(victim) == [], f"symlinks were followed: {os.listdir(victim)}"
        # `--socket` into that directory and the guest library on its own refuse too.
        sock = os.path.join(d, "canald.sock")
        cp = subprocess.run([canal_bin, "run", "--socket", sock, "--", "true"], env=clean_env(),
                            capture_output=True, timeout=30)
        assert cp.returncode != 0 and "belongs to uid" in cp.stderr.decode(), cp.stderr
        code = "import socket; socket.socket().close(); print('ok')"
        cp = subprocess.run([python, "-c", code], env=clean_env({"LD_PRELOAD": str(libcanal_so), "CANAL_SOCKET": sock}),
                            capture_output=True, timeout=30)
        assert b"another user" in cp.stderr, f"the library did not refuse the planted directory: {cp.stderr!r}"
        time.sleep(0.3)
        assert not fake.got_data(), "the guest library sent bytes to the impostor"
        assert os.listdir(victim) == []
    finally:
        fake.stop()
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(victim, ignore_errors=True)


def test_daemon_of_another_user_is_refused(canal_bin, libcanal_so, python):
    """A socket in root's own 0700 directory, but served by another uid (SO_PEERCRED):
    neither canal run nor the guest library sends it anything."""
    att = _attacker()
    d = tempfile.mkdtemp(prefix="canal-peer-", dir="/tmp")
    sock = os.path.join(d, "canald.sock")
    fake = FakeDaemon(sock, att.pw_uid, att.pw_gid)
    try:
        cp = subprocess.run([canal_bin, "run", "--socket", sock, "--", "true"], env=clean_env(),
                            capture_output=True, timeout=30)
        err = cp.stderr.decode()
        assert cp.returncode != 0 and f"runs as uid {att.pw_uid}" in err, f"canal run did not refuse: {err!r}"
        cp = subprocess.run([python, "-c", "import socket; socket.socket().close(); print('ok')"],
                            env=clean_env({"LD_PRELOAD": str(libcanal_so), "CANAL_SOCKET": sock}),
                            capture_output=True, timeout=30)
        assert b"another user" in cp.stderr, f"the library did not refuse the daemon: {cp.stderr!r}"
        time.sleep(0.3)
        assert not fake.got_data(), "bytes were sent to another user's daemon"
    finally:
        fake.stop()
        shutil.rmtree(d, ignore_errors=True)


def test_socket_path_outside_a_private_directory(canal_bin):
    """`--socket /etc/hostname` creates nothing next to it and says why."""
    before = set(os.listdir("/etc"))
    cp = subprocess.run([canal_bin, "run", "--socket", "/etc/hostname", "--", "true"], env=clean_env(),
                        capture_output=True, timeout=30)
    assert cp.returncode != 0
    assert "/etc" in cp.stderr.decode() and "0700" in cp.stderr.decode(), cp.stderr
    assert set(os.listdir("/etc")) == before, f"created {set(os.listdir('/etc')) - before}"


def test_default_directory_is_private(canal_bin, python):
    """The default directory canal run creates is 0700, owned by the caller."""
    base = tempfile.mkdtemp(prefix="canal-xdg-", dir="/tmp")
    try:
        env = clean_env({"XDG_RUNTIME_DIR": base})
        cp = subprocess.run([canal_bin, "run", "--", python, "-c", "print('ran')"], env=env,
                            capture_output=True, timeout=60)
        assert cp.returncode == 0 and b"ran" in cp.stdout, cp.stderr
        st = os.lstat(os.path.join(base, "canal"))
        assert st.st_mode & 0o7777 == 0o700 and st.st_uid == os.getuid(), oct(st.st_mode)
    finally:
        subprocess.run(["pkill", "-f", f"--socket {base}/canal/canald.sock"], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


def test_another_users_socket_is_named_as_the_cause(canal_bin):
    """Another user runs `canal run` against root's daemon (root's 0755 directory): the
    error names the real cause — permission denied on root's socket — and points at no
    log that does not exist; with nobody answering there, it says the directory is not
    writable instead of starting a daemon that could only fail (issue 14)."""
    att = _attacker()
    d = tempfile.mkdtemp(prefix="canal-sys-", dir="/tmp")
    os.chmod(d, 0o755)
    sock = os.path.join(d, "canald.sock")
    proc = subprocess.Popen([str(canal_bin), "daemon", "--socket", sock], env=clean_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 10
        while not os.path.exists(sock) and time.time() < deadline:
            time.sleep(0.05)
        as_att = ["runuser", "-u", ATTACKER, "--", str(canal_bin), "run", "--socket"]
        cp = subprocess.run(as_att + [sock, "--", "true"], env=clean_env(), capture_output=True, timeout=30,
                            cwd="/tmp")
        err = cp.stderr.decode()
        assert cp.returncode != 0 and "permission denied on " + sock in err and ".log" not in err, err
        other = os.path.join(d, "other.sock")
        cp = subprocess.run(as_att + [other, "--", "true"], env=clean_env(), capture_output=True, timeout=30,
                            cwd="/tmp")
        err = cp.stderr.decode()
        assert cp.returncode != 0 and f"{d} is not writable by this user" in err and ".log" not in err, err
        assert not os.path.exists(other + ".log")
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(d, ignore_errors=True)
