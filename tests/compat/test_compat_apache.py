"""Apache httpd 2.4 with the event MPM, in the four modes: a multi-process,
multi-threaded server whose worker threads hand every kept-alive connection back to
the listener thread by adding it to the epoll set that thread sleeps on (the class of
tokio's and mio's runtimes too). Under canal that hand-over went unseen until the
library woke a set's sleepers on epoll_ctl (mux/kick.rs): each kept-alive request waited
for the listener's poll timeout — 7 requests a second, 147 ms each, where natively
thousands. `ab -k` must get every request over kept-alive connections within a bound
that such waits would break (1,000 requests one at a time: at 147 ms each, 147 s), and
downloads must be byte-exact."""

import hashlib
import os
import shutil
import tempfile

import pytest

import compat_util
import e2e_util
from canal_harness import need_tool
from compat_util import MODES

MODULES = "/usr/lib/apache2/modules"

CONF = """\
ServerRoot /etc/apache2
LoadModule mpm_event_module {modules}/mod_mpm_event.so
LoadModule authz_core_module {modules}/mod_authz_core.so
LoadModule dir_module {modules}/mod_dir.so
LoadModule mime_module {modules}/mod_mime.so
PidFile {run}/httpd.pid
Mutex file:{run} default
ErrorLog {run}/error.log
LogLevel warn
Listen 127.0.0.1:{port}
ServerName localhost
DocumentRoot {www}
{user}
StartServers 2
ServerLimit 4
ThreadsPerChild 25
MaxRequestWorkers 100
KeepAlive On
MaxKeepAliveRequests 0
<Directory {www}>
  Require all granted
</Directory>
TypesConfig /etc/mime.types
"""


def ab_numbers(out):
    """ab's summary lines as {name: value}."""
    fields = {}
    for line in out.splitlines():
        name, _, value = line.partition(":")
        if value.strip():
            fields[name.strip()] = value.split()[0]
    return fields


@pytest.mark.deadline(150)
@pytest.mark.parametrize("mode", MODES)
def test_apache_event_mpm_keepalive(request, mode, tmp_path):
    apache = need_tool("apache2")
    ab = need_tool("ab")
    curl = need_tool("curl")
    if not os.path.exists(f"{MODULES}/mod_mpm_event.so"):
        pytest.skip(f"no {MODULES}/mod_mpm_event.so (Debian's apache2 package)")
    server_run, client_run = compat_util.ends(request, mode)
    # The workers run as www-data when started as root: the pages must be theirs to read.
    www = tempfile.mkdtemp(prefix="canal-apache-", dir="/tmp")
    try:
        os.chmod(www, 0o755)
        big = os.urandom(3 << 20)
        for name, data in (("index.html", b"hello\n"), ("big.bin", big)):
            with open(os.path.join(www, name), "wb") as f:
                f.write(data)
            os.chmod(os.path.join(www, name), 0o644)
        port = e2e_util.free_port()
        user = "User www-data\nGroup www-data" if os.geteuid() == 0 else ""
        conf = tmp_path / "httpd.conf"
        conf.write_text(CONF.format(modules=MODULES, run=tmp_path, port=port, www=www, user=user))
        server = server_run.spawn([apache, "-f", str(conf), "-DFOREGROUND"], name="apache")
        compat_util.wait_listening(server, port, "apache")
        compat_util.assert_served_by_canal(request, mode, port, what="apache")
        url = f"http://127.0.0.1:{port}"
        with compat_util.CanalSampler(request, mode, interval=0.01) as sampler:
            for conc, n in ((1, 1000), (8, 8000)):
                r = client_run.run([ab, "-q", "-k", "-n", str(n), "-c", str(conc), f"{url}/index.html"],
                                   timeout=40, name=f"ab-c{conc}")
                got = ab_numbers(r.stdout)
                assert r.returncode == 0, r.describe()
                assert (got.get("Complete requests"), got.get("Failed requests")) == (str(n), "0"), \
                    f"{r.describe()}\n{server.describe()}"
                assert int(got.get("Keep-Alive requests", 0)) >= n - conc, r.describe()
                assert float(got["Time taken for tests"]) < 20, \
                    f"kept-alive requests waited: {r.describe()}"
            for i in range(3):
                r = client_run.run([curl, "-sS", "-o", str(tmp_path / "got"), f"{url}/big.bin"],
                                   timeout=30, name=f"curl-{i}")
                assert r.returncode == 0, r.describe()
                got = (tmp_path / "got").read_bytes()
                assert hashlib.sha256(got).digest() == hashlib.sha256(big).digest(), \
                    f"download {i}: {len(got)} bytes differ"
        sampler.require_peer_port(port, "ab", program=ab)
        assert server.poll() is None, server.describe()
    finally:
        shutil.rmtree(www, ignore_errors=True)
