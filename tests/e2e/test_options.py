"""Kept options on a stream whose bytes go through canald (protocol §3.4 `options`):
TCP_NODELAY, SO_KEEPALIVE and the keepalive timers are set without a request, and
canald applies them to its host socket when it next services the socket — here
with no byte moving at all, seen from the kernel's side with `ss` (the keepalive timer
of the host socket canald holds). The short-circuit's side of the same word is in
test_shortcut.py (test_kept_options_cost_no_request)."""

import re
import socket
import subprocess

import pytest

import e2e_util
from canal_harness import need_tool

CLIENT = (
    "import socket,sys\n"
    "s=socket.create_connection(('127.0.0.1',{port}))\n"
    "print('CONNECTED',flush=True)\n"
    "sys.stdin.readline()\n"
    "for i in range(200):\n"
    "    s.setsockopt(socket.IPPROTO_TCP,socket.TCP_NODELAY,i&1)\n"
    "s.setsockopt(socket.SOL_SOCKET,socket.SO_KEEPALIVE,1)\n"
    "s.setsockopt(socket.IPPROTO_TCP,socket.TCP_KEEPIDLE,{idle})\n"
    "print('SET',s.getsockopt(socket.SOL_SOCKET,socket.SO_KEEPALIVE),"
    "s.getsockopt(socket.IPPROTO_TCP,socket.TCP_KEEPIDLE),"
    "s.getsockopt(socket.IPPROTO_TCP,socket.TCP_NODELAY),flush=True)\n"
    "import time; time.sleep(30)\n"
)

SERVER = (
    "import socket,time\n"
    "l=socket.socket(); l.bind(('127.0.0.1',0)); l.listen(1)\n"
    "print('READY',l.getsockname()[1],flush=True)\n"
    "c,_=l.accept(); time.sleep(30)\n"
)


LISTENER = (
    "import socket,sys\n"
    "l=socket.socket()\n"
    "l.setsockopt(socket.SOL_SOCKET,socket.SO_KEEPALIVE,1)\n"
    "l.setsockopt(socket.IPPROTO_TCP,socket.TCP_KEEPIDLE,{idle})\n"
    "l.bind(('127.0.0.1',0)); l.listen(4)\n"
    "print('READY',l.getsockname()[1],flush=True)\n"
    "c,_=l.accept()\n"
    "print('ACCEPTED',c.getsockopt(socket.SOL_SOCKET,socket.SO_KEEPALIVE),"
    "c.getsockopt(socket.IPPROTO_TCP,socket.TCP_KEEPIDLE),flush=True)\n"
    "sys.stdin.readline()\n"
)


def _keepalive_timer(port, end="dport"):
    """Seconds left on the keepalive timer of the established socket whose `end`
    (dport: remote, sport: local) is `port` — the host socket canald holds for the
    guest — or None without one."""
    ss = need_tool("ss")
    out = subprocess.run([ss, "-tno", "state", "established", f"( {end} = :{port} )"],
                         capture_output=True, text=True, timeout=10).stdout
    # ss prints "72min", "1min16sec" or "9.5sec".
    m = re.search(r"timer:\(keepalive,(?:(\d+)min)?(?:([\d.]+)sec)?,", out)
    if not m or not (m.group(1) or m.group(2)):
        return None
    return int(m.group(1) or 0) * 60 + float(m.group(2) or 0)


@pytest.mark.relay
def test_keepalive_reaches_the_host_socket_without_requests(canald, procs, python):
    """A guest connected to a native server sets TCP_NODELAY 200 times, then
    SO_KEEPALIVE and TCP_KEEPIDLE 4321: the calls read back at once, cost (nearly) no
    requests, and canald's host socket carries a keepalive timer of about 4321 s
    although the guest never sends a byte (its attention bit is what moves canald)."""
    server = procs.spawn([python, "-c", SERVER], name="native-server")
    port = int(server.wait_line("READY", 30).split()[1])
    client = canald.spawn([python, "-c", CLIENT.format(port=port, idle=4321)], name="options",
                          stdin=subprocess.PIPE)
    client.wait_line("CONNECTED", 30)
    canald.wait_served(client, kind="tcp", peer_port=port, state="connected")
    assert _keepalive_timer(port) is None, "a keepalive timer before the program asked"
    before = canald.guest(client)["requests"]
    client.send_line("go")
    assert client.wait_line("SET", 30) == "SET 1 4321 1", client.describe()
    spent = canald.guest(client)["requests"] - before
    assert spent < 20, f"{spent} requests for 202 option calls\n{client.describe()}"
    e2e_util.wait_for(lambda: (_keepalive_timer(port) or 0) > 4000, 10,
                      what="canald's host socket to carry the guest's keepalive")


def test_options_set_before_listen_are_inherited_by_accepted_connections(canald, procs, python):
    """SO_KEEPALIVE and TCP_KEEPIDLE set on a guest's socket before listen() (kept in
    its entry, no request) are the listener's: a native client's connection, accepted
    by canald's host listener, inherits them in the kernel (`ss` shows the accepted
    host socket's keepalive timer), and the guest's accepted socket reads them back."""
    server = canald.spawn([python, "-c", LISTENER.format(idle=4321)], name="listener",
                          stdin=subprocess.PIPE)
    port = int(server.wait_line("READY", 30).split()[1])
    c = socket.create_connection(("127.0.0.1", port), timeout=10)
    try:
        assert server.wait_line("ACCEPTED", 30) == "ACCEPTED 1 4321", server.describe()
        e2e_util.wait_for(lambda: (_keepalive_timer(port, "sport") or 0) > 4000, 10,
                          what="the accepted host socket to inherit the listener's keepalive")
    finally:
        c.close()
        server.send_line("")
