"""A socket side shared by threads or processes (the biased side locks, protocol §3.4
minor 4). The first thread to send (or receive) on a socket owns its side and enters
it without a locked instruction; another thread or a forked child revokes that. These
tests make the revocation race with the owner's calls: a guest whose main thread sent
first, then W writers — threads, or the parent and forked children — sending 64-byte
records at once (every record must arrive whole and in each writer's order), and a
guest with two threads receiving on one socket (every byte once: count and sum). Each
runs guest↔guest (short-circuited) and guest↔native (through canald); canal stat
proves the socket is canal's."""

import importlib.util
import subprocess

import pytest

WRITERS = 3
RECORDS = 30000


def _sharedside(progs):
    spec = importlib.util.spec_from_file_location("sharedside", progs / "sharedside.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _kind(placement):
    """The stat kind of the guest's socket: short-circuited only between two guests."""
    return "tcp-shortcut" if placement == "guest-guest" else "tcp"


@pytest.mark.relay
@pytest.mark.parametrize("placement", ["guest-guest", "guest-native"])
@pytest.mark.parametrize("how", ["threads", "fork"])
def test_concurrent_senders_keep_every_record(canald, procs, python, progs, placement, how):
    serve = [python, progs / "sharedside.py", "serve"]
    server = canald.spawn(serve, name="side-server") if placement == "guest-guest" \
        else procs.spawn(serve, name="side-server")
    port = int(server.wait_line("READY", 30).split()[1])
    argv = [python, progs / "sharedside.py", "send", "--port", port, "--writers", WRITERS,
            "--records", RECORDS] + (["--fork"] if how == "fork" else [])
    client = canald.spawn(argv, name="side-send", stdin=subprocess.PIPE)
    client.wait_line("CONNECTED", 30)
    canald.wait_served(client, kind=_kind(placement), peer_port=port)
    client.send_line("go")
    r = client.finish(120)
    assert r.returncode == 0 and "OK sent" in r.stdout, r.describe()
    line = server.wait_line("OK", 60)
    assert line == f"OK {1 + WRITERS * RECORDS}", server.describe()


# The native client relayed by canald (`--direct off`): a canal socket read by two threads.
@pytest.mark.parametrize("placement", ["guest-guest", pytest.param("native-guest", marks=pytest.mark.relay)])
def test_concurrent_receivers_take_every_byte_once(canald, procs, python, progs, placement):
    server = canald.spawn([python, progs / "sharedside.py", "serve", "--readers", "2"],
                          name="side-recv2")
    port = int(server.wait_line("READY", 30).split()[1])
    argv = [python, progs / "sharedside.py", "send", "--port", port, "--writers", "1",
            "--records", 2 * RECORDS]
    client = (canald.spawn if placement == "guest-guest" else procs.spawn)(
        argv, name="side-send", stdin=subprocess.PIPE)
    client.wait_line("CONNECTED", 30)
    canald.wait_served(server, kind=_kind(placement), state="connected")
    client.send_line("go")
    r = client.finish(120)
    assert r.returncode == 0 and "OK sent" in r.stdout, r.describe()
    line = server.wait_line("OK", 60)
    n = 1 + 2 * RECORDS
    want = f"OK {n * 64} {_sharedside(progs).expected_sum(1, 2 * RECORDS)}"
    assert line == want, server.describe()
