"""Buffer zones on the co-resident short-circuit (protocol §10.4, `canald --zones on`):
sends larger than the ring's free space go by (zone, offset) descriptors. The stream's
semantics must not change: the short-circuit tests run again with zones on, and the
tests below make sure zone buffers are really in flight (canal stat's `zone_sends`)
while a message is read in small pieces, checked by hash, and while either end dies.

Rings of 64 KiB (the smallest) make a 3 MiB send overflow into the zone at once."""

import hashlib
import signal

import pytest

import test_shortcut
from canal_harness import serving_canald

ZONE_ARGS = ["--zones", "on", "--shortcut-ring-kib", "64"]
MSG = 3 << 20


@pytest.fixture
def zcanald(canal_bin, libcanal_so, canald_bin, procs):
    with serving_canald(canal_bin, procs, ZONE_ARGS) as d:
        yield d


# The receiving end: accepts one connection, waits for a line on stdin, then reads
# in pieces of `piece` bytes (peeking first) and prints the SHA-256 and byte count.
SERVER = """
import hashlib, socket, sys
l = socket.socket(); l.bind(('127.0.0.1', 0)); l.listen(1)
print('READY', l.getsockname()[1], flush=True)
c, _ = l.accept()
print('ACCEPTED', flush=True)
if sys.stdin.readline().strip() == 'die':
    sys.exit(0)
piece = int(sys.argv[1])
first = c.recv(100, socket.MSG_PEEK)
h = hashlib.sha256(); n = 0
while True:
    try:
        b = c.recv(piece)
    except ConnectionResetError:
        print('RESET', n, flush=True); sys.exit(0)
    if not b:
        break
    if n == 0:
        assert b[:len(first)] == first[:len(b)], 'peek and read disagree'
    h.update(b); n += len(b)
print('GOT', n, h.hexdigest(), flush=True)
"""

# The sending end: one sendall of MSG pseudo-random bytes, its hash, then waits for a
# line on stdin before closing (or is killed).
CLIENT = """
import hashlib, os, socket, sys
port, size = int(sys.argv[1]), int(sys.argv[2])
data = (hashlib.sha256(b'canal').digest() * (size // 32 + 1))[:size]
data = bytes(b ^ (i * 131 & 0xff) for i, b in enumerate(data[:65536])) + data[65536:]
s = socket.create_connection(('127.0.0.1', port))
print('CONNECTED', flush=True)
s.sendall(data)
print('SENT', hashlib.sha256(data).hexdigest(), flush=True)
sys.stdin.readline()
s.close()
print('CLOSED', flush=True)
"""


def _pair(d, python, piece):
    import subprocess
    srv = d.spawn([python, "-c", SERVER, str(piece)], name="zone-recv", stdin=subprocess.PIPE)
    port = int(srv.wait_line("READY", 30).split()[1])
    cli = d.spawn([python, "-c", CLIENT, str(port), str(MSG)], name="zone-send", stdin=subprocess.PIPE)
    cli.wait_line("CONNECTED", 30)
    srv.wait_line("ACCEPTED", 30)
    return srv, cli, port


def _zone_sends(d, cli):
    socks = d.wait_served(cli, kind="tcp-shortcut")
    return max(s.get("zone_sends", 0) for s in socks)


def test_config_echoes_zones(zcanald):
    assert zcanald.stat()["daemon"]["config"]["zones"] is True


def test_zone_message_read_in_pieces_with_hash(zcanald, python):
    """A 3 MiB sendall overflows the 64 KiB ring into zone buffers before the receiver
    reads anything; the receiver reads it in odd pieces (so zone buffers are consumed
    partially), and the hashes agree."""
    srv, cli, port = _pair(zcanald, python, 1000)
    # The sender blocks only when ring and zone are full: some zone buffers are posted.
    import e2e_util
    e2e_util.wait_for(lambda: _zone_sends(zcanald, cli) > 0, 10, what="zone sends")
    srv.send_line("go")
    sent = cli.wait_line("SENT", 30).split()[1]
    cli.send_line("close")
    got = srv.wait_line("GOT", 30).split()
    assert got[1:] == [str(MSG), sent], f"{got} vs sent {sent}\n{srv.describe()}"
    assert cli.finish(10).returncode == 0, cli.describe()


def test_sender_dies_with_buffers_in_flight(zcanald, python):
    """The sending guest is killed while its zone buffers wait for the receiver: the
    receiver still reads every byte (they were sent), then EOF — as with the kernel,
    where sent data outlives the sender."""
    srv, cli, port = _pair(zcanald, python, 65536 + 7)
    import e2e_util
    e2e_util.wait_for(lambda: _zone_sends(zcanald, cli) > 0, 10, what="zone sends")
    srv.send_line("go")
    sent = cli.wait_line("SENT", 30).split()[1]
    cli.signal_group(signal.SIGKILL)
    got = srv.wait_line("GOT", 30).split()
    assert got[1:] == [str(MSG), sent], srv.describe()


def test_receiver_dies_with_buffers_in_flight_is_reset(zcanald, python):
    """The receiving guest exits without reading zone-sent bytes: unread data, so the
    sender's connection is reset (the kernel's rule for close), never a hang."""
    srv, cli, port = _pair(zcanald, python, 4096)
    import e2e_util
    e2e_util.wait_for(lambda: _zone_sends(zcanald, cli) > 0, 10, what="zone sends")
    srv.send_line("die")
    assert srv.finish(10).returncode == 0, srv.describe()
    r = cli.finish(20)
    # 3 MiB exceed ring and zone (320 KiB): sendall was still blocked, and fails.
    assert r.returncode != 0, r.describe()
    assert "ConnectionResetError" in r.stderr or "BrokenPipeError" in r.stderr, r.describe()


@pytest.mark.deadline(120)
def test_shortcut_semantics_with_zones(zcanald, python, progs):
    test_shortcut.test_semantics(zcanald, python, progs)


def test_shortcut_bulk_echo_with_zones(zcanald, python, progs):
    test_shortcut.test_bulk_echo_and_proof(zcanald, python, progs)


def test_shortcut_peer_death_with_zones(zcanald, python, progs):
    test_shortcut.test_peer_death_is_eof(zcanald, python, progs)


def test_shortcut_unread_reset_with_zones(zcanald, python, progs):
    test_shortcut.test_peer_death_with_unread_data_is_reset(zcanald, python, progs)
