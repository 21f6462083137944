"""sockperf ping-pong, server and client both multiplexing two sockets (a feed file with two
addresses) with select, poll and epoll (-F), over TCP and over UDP, with --data-integrity:
exit status 0, messages received, and no dropped, duplicated or out-of-order messages.

`--mps` is given because sockperf's default ("max") sizes its table of send times for at
most 600 K round trips a second and fails with "_seqN > m_maxSequenceNo" beyond that:
two short-circuited guests ping-pong at up to ~1.3 M/s here. MPS leaves 3× headroom
(sockperf then paces to at most MPS, far above any round-trip rate it reaches; its
table costs ~400 MB of the client's memory)."""

import re

import pytest

import compat_util
import e2e_util
from canal_harness import need_tool
from compat_util import MODES

MPS = 4_000_000


@pytest.mark.deadline(60)
@pytest.mark.parametrize("mux", ["select", "poll", "epoll"])
@pytest.mark.parametrize("proto", ["tcp", "udp"])
@pytest.mark.parametrize("mode", MODES)
def test_sockperf(request, mode, proto, mux, tmp_path):
    sockperf = need_tool("sockperf")
    server_run, client_run = compat_util.ends(request, mode)
    if proto == "tcp":
        ports = [e2e_util.free_port(), e2e_util.free_port()]
        while ports[1] == ports[0]:
            ports[1] = e2e_util.free_port()
    else:
        ports = [compat_util.free_udp_port(), compat_util.free_udp_port()]
        while ports[1] == ports[0]:
            ports[1] = compat_util.free_udp_port()
    feed = tmp_path / "feed.txt"
    feed.write_text("".join(f"{proto[0].upper()}:127.0.0.1:{p}\n" for p in ports))
    server = server_run.spawn([sockperf, "sr", "-f", feed, "-F", mux], name=f"sockperf-sr-{proto}-{mux}")
    for p in ports:
        if proto == "tcp":
            compat_util.wait_listening(server, p, "sockperf server")
        else:
            e2e_util.wait_for(lambda: server.poll() is not None or compat_util.udp_bound(p), 30,
                              what=f"sockperf server to bind UDP 127.0.0.1:{p}")
            assert server.poll() is None, f"sockperf server exited early\n{server.describe()}"
        compat_util.assert_served_by_canal(request, mode, p, proto, what="sockperf server")
    with compat_util.CanalSampler(request, mode) as sampler:
        r = client_run.run([sockperf, "pp", "-f", feed, "-F", mux, "-t", "1", "--data-integrity",
                            "--mps", MPS],
                           timeout=30, name=f"sockperf-pp-{proto}-{mux}")
    out = r.stdout + r.stderr
    assert r.returncode == 0, f"sockperf client failed\n{r.describe()}"
    if proto == "tcp":  # a UDP client's sockets are unconnected: nothing tells them from the server's
        for p in ports:
            sampler.require_peer_port(p, "sockperf client", program=sockperf)
    assert f"using {mux}()" in out, f"sockperf client did not use {mux}()\n{r.describe()}"
    m = re.search(r"\[Total Run\].*SentMessages=(\d+); ReceivedMessages=(\d+)", out)
    assert m, f"sockperf printed no [Total Run] line\n{r.describe()}"
    sent, received = int(m.group(1)), int(m.group(2))
    assert received > 0, f"no replies received (sent {sent})\n{r.describe()}"
    # ping-pong: at most the one message in flight when the timer ends is unanswered
    assert sent - received <= 1, f"sent {sent} but received {received}\n{r.describe()}"
    losses = re.findall(r"# dropped messages = (\d+); # duplicated messages = (\d+); # out-of-order messages = (\d+)", out)
    assert losses, f"sockperf printed no loss statistics\n{r.describe()}"
    assert all(l == ("0", "0", "0") for l in losses), f"dropped/duplicated/out-of-order messages: {losses}\n{r.describe()}"
    assert "integrity" not in out.lower() or "error" not in out.lower(), f"data integrity errors\n{r.describe()}"
    assert server.poll() is None, f"sockperf server exited\n{server.describe()}"
    sout = server.stdout() + server.stderr()
    assert f"using {mux}()" in sout, f"sockperf server did not use {mux}()\n{server.describe()}"
