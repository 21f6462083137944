"""Servers that fork, exec, hand over descriptors and count on descriptor numbers
(issue 14), each in the four modes (native, both ends under canal, only the client,
only the server), with `canal stat` checked to list the sockets canal carried:

- bash: `exec 5>file`; `exec 3<>/dev/tcp/...` read directly and through a child's stdin
  (head reads with stdio: the socket crosses exec as a bridged kernel socket);
- sshd with its defaults (re-exec on, privilege separation, seccomp sandbox): 20 logins,
  scp of 20 MiB both ways with equal SHA-256;
- git daemon (an inetd-style child per connection, upload-pack on stdin/stdout): clone,
  content compared;
- systemd-socket-activate handing a listener on descriptor 3 to a server, several
  connections served;
- a statically linked program exec'd from a process under canal is reported on stderr.
"""

import hashlib
import os
import shutil
import subprocess
import textwrap

import pytest

import compat_util
import e2e_util
from canal_harness import clean_env, need_tool
from compat_util import MODES

HERE = os.path.dirname(os.path.abspath(__file__))


def peer_ports(request, server_run):
    """Start progs/peer (the edge tests' command server) under `server_run`."""
    cprogs = request.getfixturevalue("cprogs")
    peer = server_run.spawn([cprogs["peer"]], name="peer")
    line = peer.wait_line("READY", 30)
    return peer, dict(kv.split("=") for kv in line.split()[1:])


@pytest.mark.deadline(60)
@pytest.mark.parametrize("mode", MODES)
def test_bash_descriptors_and_dev_tcp(request, mode, tmp_path):
    bash = need_tool("bash")
    server_run, client_run = compat_util.ends(request, mode)
    peer, ports = peer_ports(request, server_run)
    port = int(ports["tcp4"])
    compat_util.assert_served_by_canal(request, mode, port, what="the peer")
    f = tmp_path / "five"
    script = textwrap.dedent(f"""\
        set -e
        exec 5>{f} && echo five >&5 && exec 5>&-
        exec 3<>/dev/tcp/127.0.0.1/{port}
        printf -- '- UPPER\\n' >&3
        printf 'direct\\n' >&3; read -r a <&3; echo "read:$a"
        printf 'child\\n' >&3; head -n 1 <&3
        exec 7>&3; printf 'seven\\n' >&7; read -r b <&3; echo "seven:$b"
        sleep 0.5
        exec 3<&- 7>&-
        echo done
        """)
    with compat_util.CanalSampler(request, mode) as sampler:
        r = client_run.run([bash, "-c", script], timeout=30, name="bash")
    assert r.returncode == 0, r.describe()
    assert r.stdout.split() == ["read:DIRECT", "CHILD", "seven:SEVEN", "done"], r.describe()
    assert f.read_text() == "five\n"
    sampler.require_peer_port(port, "bash /dev/tcp", program=bash)
    assert peer.poll() is None, peer.describe()


def sshd_setup(tmp_path, port):
    d = tmp_path / "ssh"
    d.mkdir(mode=0o700)
    for k in ("hostkey", "userkey"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / k)], check=True)
    shutil.copy(d / "userkey.pub", d / "authorized_keys")
    (d / "sshd_config").write_text(textwrap.dedent(f"""\
        Port {port}
        ListenAddress 127.0.0.1
        HostKey {d}/hostkey
        PidFile {d}/sshd.pid
        AuthorizedKeysFile {d}/authorized_keys
        StrictModes no
        UsePAM no
        PermitRootLogin yes
        PasswordAuthentication no
        KbdInteractiveAuthentication no
        Subsystem sftp /usr/lib/openssh/sftp-server
        """))
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    client = ["-i", str(d / "userkey"), "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
              "-o", "BatchMode=yes", "-o", "LogLevel=ERROR"]
    return d, client


@pytest.mark.deadline(240)
@pytest.mark.parametrize("mode", MODES)
def test_sshd_logins_and_scp(request, mode, tmp_path):
    sshd = need_tool("/usr/sbin/sshd")
    ssh, scp = need_tool("ssh"), need_tool("scp")
    server_run, client_run = compat_util.ends(request, mode)
    port = e2e_util.free_port()
    d, opts = sshd_setup(tmp_path, port)
    # Defaults: re-exec, privilege separation, the seccomp sandbox; -D -e keep it in the
    # foreground, logging to stderr.
    server = server_run.spawn([sshd, "-D", "-e", "-f", str(d / "sshd_config")], name="sshd")
    compat_util.wait_listening(server, port, "sshd")
    compat_util.assert_served_by_canal(request, mode, port, what="sshd")
    target = "root@127.0.0.1"
    for i in range(20):
        r = client_run.run([ssh, *opts, "-p", str(port), target, f"echo login {i}"], timeout=30, name=f"ssh-{i}")
        assert r.returncode == 0 and r.stdout.strip() == f"login {i}", f"login {i}\n{r.describe()}\n{server.describe()}"
    big = d / "big"
    big.write_bytes(os.urandom(20 << 20))
    want = hashlib.sha256(big.read_bytes()).hexdigest()
    with compat_util.CanalSampler(request, mode) as sampler:
        r = client_run.run([scp, "-q", *opts, "-P", str(port), str(big), f"{target}:{d}/up"], timeout=60, name="scp-up")
        assert r.returncode == 0, r.describe()
        r = client_run.run([scp, "-q", *opts, "-P", str(port), f"{target}:{d}/up", str(d / "down")], timeout=60,
                           name="scp-down")
        assert r.returncode == 0, r.describe()
    for name in ("up", "down"):
        assert hashlib.sha256((d / name).read_bytes()).hexdigest() == want, f"{name}: SHA-256 differs"
    sampler.require_peer_port(port, "ssh/scp", program=ssh)
    assert server.poll() is None, server.describe()


@pytest.mark.deadline(120)
@pytest.mark.parametrize("mode", MODES)
def test_git_daemon_clone(request, mode, tmp_path):
    git = need_tool("git")
    server_run, client_run = compat_util.ends(request, mode)
    env = clean_env({"GIT_CONFIG_NOSYSTEM": "1", "HOME": str(tmp_path)})
    srv, work = tmp_path / "srv", tmp_path / "work"
    srv.mkdir()
    subprocess.run([git, "init", "-q", "--bare", "-b", "main", str(srv / "repo.git")], check=True, env=env)
    subprocess.run([git, "init", "-q", "-b", "main", str(work)], check=True, env=env)
    files = {f"f{i}": os.urandom(2_000_000 * i) for i in (1, 2, 3)}
    for name, data in files.items():
        (work / name).write_bytes(data)
    for cmd in (["add", "."], ["-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "init"],
                ["push", "-q", str(srv / "repo.git"), "main"]):
        subprocess.run([git, "-C", str(work), *cmd], check=True, env=env)
    port = e2e_util.free_port()
    server = server_run.spawn([git, "daemon", "--reuseaddr", f"--base-path={srv}", "--export-all",
                               "--listen=127.0.0.1", f"--port={port}", str(srv)], name="git-daemon", env=env)
    compat_util.wait_listening(server, port, "git daemon")
    compat_util.assert_served_by_canal(request, mode, port, what="git daemon")
    with compat_util.CanalSampler(request, mode, interval=0.01) as sampler:
        for n in range(3):
            dest = tmp_path / f"clone{n}"
            r = client_run.run([git, "clone", "-q", f"git://127.0.0.1:{port}/repo.git", str(dest)], timeout=60,
                               name=f"clone-{n}", env=env)
            assert r.returncode == 0, f"{r.describe()}\n{server.describe()}"
            for name, data in files.items():
                assert (dest / name).read_bytes() == data, f"clone {n}: {name} differs"
    sampler.require_peer_port(port, "git clone", program=git)
    assert server.poll() is None, server.describe()


ACTIVATED = textwrap.dedent("""\
    import os, socket, sys
    assert os.environ.get("LISTEN_FDS") == "1", os.environ.get("LISTEN_FDS")
    assert int(os.environ["LISTEN_PID"]) == os.getpid()
    l = socket.socket(fileno=3)
    assert l.family == socket.AF_INET and l.type == socket.SOCK_STREAM, (l.family, l.type)
    print("READY", l.getsockname()[1], flush=True)
    for i in range(int(sys.argv[1])):
        c, _ = l.accept()
        c.sendall(b"hello %d " % i + c.recv(64))
        c.close()
    """)


@pytest.mark.deadline(90)
@pytest.mark.parametrize("mode", MODES)
def test_socket_activation_on_descriptor_3(request, mode, tmp_path, python):
    activate = need_tool("systemd-socket-activate")
    server_run, client_run = compat_util.ends(request, mode)
    prog = tmp_path / "activated.py"
    prog.write_text(ACTIVATED)
    port = e2e_util.free_port()
    n = 5
    server = server_run.spawn([activate, "-l", f"127.0.0.1:{port}", python, str(prog), str(n)], name="activate")
    compat_util.wait_listening(server, port, "systemd-socket-activate")
    compat_util.assert_served_by_canal(request, mode, port, what="the activated server")
    client = ("import socket,sys\n"
              "s=socket.create_connection(('127.0.0.1',int(sys.argv[1])))\n"
              "s.sendall(sys.argv[2].encode()); print(s.recv(100).decode())\n")
    for i in range(n):
        r = client_run.run([python, "-c", client, str(port), f"c{i}"], timeout=30, name=f"client-{i}")
        assert r.returncode == 0 and r.stdout.strip() == f"hello {i} c{i}", f"{r.describe()}\n{server.describe()}"
    r = server.finish(30)
    assert r.returncode == 0 and f"READY {port}" in r.stdout, r.describe()


@pytest.mark.deadline(60)
def test_exec_of_a_static_program_is_reported(request, tmp_path):
    gcc = need_tool("gcc")
    src = tmp_path / "s.c"
    src.write_text("int main(void){return 0;}\n")
    exe = tmp_path / "static-prog"
    cp = subprocess.run([gcc, "-static", "-o", str(exe), str(src)], capture_output=True, text=True)
    assert cp.returncode == 0, cp.stderr
    canald = request.getfixturevalue("canald")
    # Through a wrapper script, with a name looked up in PATH, and with env -i (which
    # drops LD_PRELOAD: the exec hook keeps it).
    script = f"PATH={tmp_path}:$PATH; static-prog; {exe}; env -i {exe}; echo ran"
    r = canald.run(["sh", "-c", script], timeout=30, name="wrapper")
    assert r.returncode == 0 and "ran" in r.stdout, r.describe()
    lines = [line for line in r.stderr.splitlines() if "is statically linked" in line]
    assert len(lines) == 3 and all(str(exe) in line for line in lines), r.describe()


STDIO_CLIENT = textwrap.dedent("""\
    import os, socket, subprocess, sys, time
    s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
    s.sendall(b"- UPPER\\nfirst line\\n")
    time.sleep(0.2)

    def run(argv, stdin=None, stdout=None):
        \"\"\"argv with the given descriptors as its stdin/stdout; its exit status.\"\"\"
        if sys.argv[2] == "subprocess":  # CPython spawns with vfork
            return subprocess.run(argv, stdin=stdin, stdout=stdout, timeout=20).returncode
        dups = [(fd, to) for fd, to in ((stdin, 0), (stdout, 1)) if fd is not None]
        fa = [(os.POSIX_SPAWN_DUP2, fd, to) for fd, to in dups]
        pid = os.posix_spawnp(argv[0], argv, os.environ, file_actions=fa)
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])

    # A child reading the socket as its stdin through stdio.
    r, w = os.pipe()
    st = run(["head", "-n", "1"], stdin=s.fileno(), stdout=w)
    os.close(w)
    print("head:", os.read(r, 100).decode().strip(), st)
    # A child writing to it as its stdout; the reply comes back to this process.
    run(["printf", "from the child\\n"], stdout=s.fileno())
    s.settimeout(10)
    got = b""
    while not got.endswith(b"\\n"):
        got += s.recv(100)
    print("reply:", got.decode().strip())
    time.sleep(0.5)  # still connected while `canal stat` is sampled
    """)


@pytest.mark.deadline(60)
@pytest.mark.parametrize("spawner", ["subprocess", "posix_spawn"])
@pytest.mark.parametrize("mode", MODES)
def test_spawned_children_with_socket_stdio(request, mode, spawner, tmp_path, python):
    """The socket handed to `head` as stdin and to `printf` as stdout by CPython's
    subprocess (vfork) and by os.posix_spawnp with DUP2 file actions (glibc's internal
    exec)."""
    server_run, client_run = compat_util.ends(request, mode)
    peer, ports = peer_ports(request, server_run)
    port = int(ports["tcp4"])
    prog = tmp_path / "client.py"
    prog.write_text(STDIO_CLIENT)
    with compat_util.CanalSampler(request, mode) as sampler:
        r = client_run.run([python, str(prog), str(port), spawner], timeout=40, name=f"{spawner}-client")
    assert r.returncode == 0, r.describe()
    assert r.stdout.splitlines() == ["head: FIRST LINE 0", "reply: FROM THE CHILD"], r.describe()
    sampler.require_peer_port(port, f"the {spawner} client", program=python)
    assert peer.poll() is None, peer.describe()
