"""nginx (master + 2 workers, sendfile and tcp_nopush on, as Debian's default config has
them) serving static files, with one listening socket the master opens and both workers
share through fork (the default: nginx 1.22 waits on it with EPOLLEXCLUSIVE), and with
`listen ... reuseport` (the master opens one SO_REUSEPORT listener per worker): wrk for 10 s (zero socket errors, zero non-2xx), curl of every
file (SHA-256 matches), ab with keep-alive (zero failed requests, every request kept
alive). nginx runs with a generated nginx.conf in a temp dir, on a free port of 127.0.0.1."""

import os
import re
import shutil

import pytest

import compat_util
import e2e_util
from canal_harness import need_tool
from compat_util import MODES

SIZES = [0, 1, 1000, 16384, 65536, (1 << 20) + 17, (8 << 20) + 3]
WRK_FILES = ["f1000", "f16384", "f65536", f"f{(1 << 20) + 17}"]
AB_FILE = "f16384"
AB_REQUESTS = 20000

CONF = """\
daemon off;
master_process on;
worker_processes 2;
{user}
pid {tmp}/nginx.pid;
error_log {tmp}/error.log notice;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/client_body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    sendfile on;
    tcp_nopush on;
    tcp_nodelay on;
    keepalive_timeout 65;
    keepalive_requests 100000;
    default_type application/octet-stream;
    server {{
        listen 127.0.0.1:{port}{listen_opts} backlog=1024;
        root {root};
        location / {{ }}
    }}
}}
"""

WRK_LUA = """\
local paths = {%s}
local i = 0
request = function()
    i = i %% #paths + 1
    return wrk.format("GET", paths[i])
end
"""


def _nginx_path():
    # Debian installs nginx in /usr/sbin, which is not on every user's PATH
    if os.access("/usr/sbin/nginx", os.X_OK) and not shutil.which("nginx"):
        return "/usr/sbin/nginx"
    return need_tool("nginx")


def _start_nginx(server_run, tmp, port, listener):
    nginx = _nginx_path()
    root = tmp / "www"
    hashes = compat_util.make_files(root, SIZES)
    user = "user root root;" if os.geteuid() == 0 else ""
    conf = tmp / "nginx.conf"
    opts = " reuseport" if listener == "reuseport" else ""
    conf.write_text(CONF.format(user=user, tmp=tmp, port=port, root=root, listen_opts=opts))
    os.chmod(tmp, 0o755)
    proc = server_run.spawn([nginx, "-p", str(tmp), "-c", str(conf), "-e", str(tmp / "error.log")], name="nginx")
    compat_util.wait_listening(proc, port, "nginx")
    # master + 2 workers: the master's pid is in the pid file, the workers are its children
    pidfile = tmp / "nginx.pid"
    e2e_util.wait_for(lambda: pidfile.exists() and pidfile.read_text().strip(), 10, what="nginx.pid")
    master = int(pidfile.read_text())
    workers = e2e_util.wait_for(
        lambda: (lambda c: c if len(c) == 2 else None)(e2e_util.children_of(master)), 10,
        what=f"nginx master {master} to have 2 worker processes (has {e2e_util.children_of(master)})",
    )
    return proc, hashes, master, workers


def _error_log_problems(tmp):
    p = tmp / "error.log"
    if not p.exists():
        return []
    return [l for l in p.read_text(errors="replace").splitlines()
            if re.search(r"\[(alert|crit|emerg|error)\]", l)]


@pytest.mark.deadline(120)
@pytest.mark.parametrize("listener", ["shared", "reuseport"])
@pytest.mark.parametrize("mode", MODES)
def test_nginx_static(request, mode, listener, tmp_path):
    wrk = need_tool("wrk")
    ab = need_tool("ab")
    curl = need_tool("curl")
    _nginx_path()
    server_run, client_run = compat_util.ends(request, mode)
    tmp = tmp_path / "nginx"
    tmp.mkdir()
    port = e2e_util.free_port()
    proc, hashes, master, workers = _start_nginx(server_run, tmp, port, listener)
    compat_util.assert_served_by_canal(request, mode, port, what="nginx")
    base = f"http://127.0.0.1:{port}"

    # 1. curl every file (one curl process, one connection kept alive); hashes compared.
    dl = tmp_path / "dl"
    dl.mkdir()
    argv = [curl, "-sS", "--fail", "--max-time", "30"]
    for name in hashes:
        argv += ["-o", str(dl / name), f"{base}/{name}"]
    with compat_util.CanalSampler(request, mode) as sampler:
        r = client_run.run(argv, timeout=60, name="curl")
    assert r.returncode == 0, f"curl failed\n{r.describe()}"
    sampler.require_peer_port(port, "curl", program=curl)
    bad = {n: (e2e_util.sha256_file(dl / n) if (dl / n).exists() else "missing", h)
           for n, h in hashes.items() if not (dl / n).exists() or e2e_util.sha256_file(dl / n) != h}
    assert not bad, f"downloaded files differ from the served ones (got, want): {bad}"

    # 2. wrk for 10 s over a mix of files.
    lua = tmp_path / "paths.lua"
    lua.write_text(WRK_LUA % ", ".join(f'"/{f}"' for f in WRK_FILES))
    with compat_util.CanalSampler(request, mode) as sampler:
        r = client_run.run([wrk, "-t", "2", "-c", "32", "-d", "10s", "--timeout", "5s", "-s", lua, f"{base}/"],
                           timeout=40, name="wrk")
    assert r.returncode == 0, f"wrk failed\n{r.describe()}"
    sampler.require_peer_port(port, "wrk", program=wrk)
    print(r.stdout)
    m = re.search(r"(\d+) requests in", r.stdout)
    assert m and int(m.group(1)) > 0, f"wrk completed no requests\n{r.describe()}"
    assert "Socket errors" not in r.stdout, f"wrk saw socket errors\n{r.describe()}"
    assert "Non-2xx" not in r.stdout, f"wrk saw non-2xx responses\n{r.describe()}"

    # 3. ab with keep-alive.
    with compat_util.CanalSampler(request, mode) as sampler:
        r = client_run.run([ab, "-k", "-q", "-n", AB_REQUESTS, "-c", "8", "-s", "10", f"{base}/{AB_FILE}"],
                           timeout=60, name="ab")
    assert r.returncode == 0, f"ab failed\n{r.describe()}"
    sampler.require_peer_port(port, "ab", program=ab)

    def field(name):
        m = re.search(rf"^{name}:\s+(\d+)", r.stdout, re.M)
        assert m, f"ab output lacks {name!r}\n{r.describe()}"
        return int(m.group(1))

    assert field("Complete requests") == AB_REQUESTS, r.describe()
    assert field("Failed requests") == 0, f"ab had failed requests\n{r.describe()}"
    assert field("Keep-Alive requests") == AB_REQUESTS, f"not every ab request was kept alive\n{r.describe()}"
    assert "Non-2xx responses" not in r.stdout, f"ab saw non-2xx responses\n{r.describe()}"
    assert field("Document Length") == 16384, r.describe()
    assert field("HTML transferred") == 16384 * AB_REQUESTS, f"ab received a wrong number of body bytes\n{r.describe()}"

    # nginx is still the same master with its 2 workers, and logged nothing alarming
    assert proc.poll() is None, f"nginx exited\n{proc.describe()}"
    now = e2e_util.children_of(master)
    assert now == workers, f"nginx workers changed during the test (crashed and respawned?): {workers} -> {now}"
    problems = _error_log_problems(tmp)
    assert not problems, "nginx error.log has errors:\n" + "\n".join(problems[:20])
