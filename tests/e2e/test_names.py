"""getsockname and getpeername of connected streams answer without a canald round
trip (protocol §4 Names): an accepted end takes its names from the ACCEPT record, a
connecting end keeps them from its first call. Servers ask for them on every
connection (Python's socket objects, Go's net package, PostgreSQL's postmaster, sshd),
and each was two wake-ups. The names must stay the kernel's in every state: after a
reset, an orderly close and both directions shut, the same program natively and under
canal answers the same."""

import socket
import struct

import pytest

from canal_harness import serving_canald


def drive(spawn, argv, tmp_path, guest_requests=None):
    """Runs progs/names.py against this process's native peers. Returns its lines
    by tag, the names the peers saw, and the guest's requests while it called each
    name 400 times on four sockets (None natively)."""
    srv = socket.create_server(("127.0.0.1", 0))
    port = srv.getsockname()[1]
    p = spawn(argv + [port, tmp_path], name="names")
    lport = int(p.wait_line("listen", 30).split()[1])
    c = socket.create_connection(("127.0.0.1", lport), timeout=10)
    srv.settimeout(30)
    b, _ = srv.accept()
    p.wait_line("ready", 30)
    before = guest_requests(p) if guest_requests else None
    (tmp_path / "go").touch()
    p.wait_line("counted", 30)
    used = guest_requests(p) - before if guest_requests else None
    seen = {"client": c.getsockname()[1], "server": b.getpeername()[1]}
    c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    c.close()
    (tmp_path / "reset").touch()
    b.settimeout(10)
    assert b.recv(1) == b"", "the program's shutdown did not arrive"
    b.close()
    srv.close()
    r = p.finish(60)
    assert r.returncode == 0 and r.stdout.endswith("done\n"), p.describe()
    lines = {}
    for line in r.stdout.splitlines():
        tag, _, rest = line.partition(" ")
        lines[tag] = rest
    later = r.stdout.split("counted\n", 1)[1]
    return lines, later, lport, port, seen, used


def check_names(lines, lport, port, seen):
    assert lines["accepted"] == f"127.0.0.1:{lport} 127.0.0.1:{seen['client']}", lines
    assert lines["client"] == f"127.0.0.1:{seen['server']} 127.0.0.1:{port}", lines
    c_local, c_peer = lines["pair-connector"].split()
    a_local, a_peer = lines["pair-acceptor"].split()
    assert c_peer == a_local == f"127.0.0.1:{lport}", lines
    assert c_local == a_peer and c_local.startswith("127.0.0.1:"), lines


@pytest.mark.parametrize("mode", ["shortcut", "no-shortcut"])
def test_names_of_connected_streams_need_no_round_trip(canal_bin, procs, python, progs, tmp_path, mode):
    argv = [python, progs / "names.py"]
    (tmp_path / "native").mkdir()
    native, native_later, nl, np_, nseen, _ = drive(procs.spawn, argv, tmp_path / "native")
    check_names(native, nl, np_, nseen)
    assert native["after-reset"] == "ok ENOTCONN", native
    (tmp_path / "canal").mkdir()
    # no-shortcut: both ends through canald (--direct off: the client too).
    args = ["--no-shortcut", "--direct", "off"] if mode == "no-shortcut" else []
    with serving_canald(canal_bin, procs, args=args) as d:
        lines, later, lport, port, seen, used = drive(
            d.spawn, argv, tmp_path / "canal", guest_requests=lambda p: d.guest(p)["requests"]
        )
    check_names(lines, lport, port, seen)
    # 1,600 calls and no request: the accepted ends' names came in their ACCEPT
    # records, the connecting ends' with the answer to their CONNECT (a loopback
    # connect has settled, a short-circuit was paired, when canald answers it).
    assert used == 0, f"{used} requests for 1,600 getsockname/getpeername calls on 4 connected sockets"
    # After a reset, an orderly close and both directions shut: the kernel's answers
    # (a host socket in CLOSE says ENOTCONN; one in CLOSE_WAIT still has its peer).
    assert later == native_later, f"natively:\n{native_later}\nunder canal ({mode}):\n{later}"
