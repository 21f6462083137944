"""iperf3 with 4 parallel streams, forward and reverse (-R): the sender sent the bytes
asked for (-n), every stream carried data, and the receiver's count agrees with the
sender's up to what the socket buffers between them can hold when the test ends.

Why a slack at all: iperf3 stops the receiver's count when TEST_END arrives on the control
connection, so bytes still in flight are not counted, natively too (see
tests/e2e/test_iperf3.py). The slack is per stream: tcp_wmem max + tcp_rmem max + 16 MiB
for canal's rings, times 4 streams. The server's own report must equal the one the client
fetched (--get-server-output)."""

import json

import pytest

import compat_util
import e2e_util
from canal_harness import need_tool
from compat_util import MODES

NBYTES = 2 << 30
# guest↔guest (short-circuited) moves 2 GiB in well under 100 ms, too short for the
# sampler (a `canal stat` every ~50 ms) to be sure to see the connections live.
NBYTES_BOTH = 16 << 30
STREAMS = 4


def _json(result, who):
    try:
        return json.loads(result.stdout)
    except ValueError as e:
        raise AssertionError(f"{who} printed no valid JSON ({e})\n{result.describe()}")


@pytest.mark.deadline(120)
@pytest.mark.parametrize("direction", ["forward", "reverse"])
@pytest.mark.parametrize("mode", MODES)
def test_iperf3_parallel(request, mode, direction):
    iperf3 = need_tool("iperf3")
    server_run, client_run = compat_util.ends(request, mode)
    port = e2e_util.free_port()
    server = server_run.spawn([iperf3, "-s", "-1", "-B", "127.0.0.1", "-p", port, "-J"], name="iperf3-server")
    compat_util.wait_listening(server, port, "iperf3 server")
    compat_util.assert_served_by_canal(request, mode, port, what="iperf3 server")
    nbytes = NBYTES_BOTH if mode == "canal-both" else NBYTES
    argv = [iperf3, "-c", "127.0.0.1", "-p", port, "-P", STREAMS, "-n", nbytes, "-J",
            "--get-server-output", "--connect-timeout", "10000"]
    if direction == "reverse":
        argv.append("-R")
    with compat_util.CanalSampler(request, mode) as sampler:
        client = client_run.run(argv, timeout=90, name="iperf3-client")
    srv = server.finish(30)
    assert client.returncode == 0, client.describe()
    sampler.require_peer_port(port, "iperf3 client", program=iperf3)
    assert srv.returncode == 0, srv.describe()
    cj = _json(client, "iperf3 client")
    sj = _json(srv, "iperf3 server")
    assert "error" not in cj, f"client reports an error: {cj['error']}"
    assert "error" not in sj, f"server reports an error: {sj['error']}"

    # Whoever sends, the client's report has sum_sent and sum_received for the whole test.
    sent = cj["end"]["sum_sent"]["bytes"]
    received = cj["end"]["sum_received"]["bytes"]
    fetched = cj.get("server_output_json")
    assert fetched, "client JSON lacks server_output_json (--get-server-output)"
    # The server's own JSON and the copy the client fetched must say the same.
    s_sent, s_recv = sj["end"]["sum_sent"]["bytes"], sj["end"]["sum_received"]["bytes"]
    f_sent, f_recv = fetched["end"]["sum_sent"]["bytes"], fetched["end"]["sum_received"]["bytes"]
    streams = cj["end"]["streams"]
    per_stream = [s["sender"]["bytes"] if "sender" in s else None for s in streams]
    slack = STREAMS * e2e_util.iperf3_slack()
    counts = (f"{direction}: client sum_sent {sent} sum_received {received}; server sum_sent {s_sent} "
              f"sum_received {s_recv} (fetched: {f_sent}/{f_recv}); per-stream sender bytes {per_stream}; slack {slack}")
    print(f"iperf3 {mode} {counts}")
    assert len(streams) == STREAMS, f"{len(streams)} streams in the report, want {STREAMS}: {counts}"
    assert all(b and b > 0 for b in per_stream), f"a stream carried no data: {counts}"
    assert (s_sent, s_recv) == (f_sent, f_recv), f"server's own report and the fetched one disagree: {counts}"
    assert sent >= nbytes, f"sender sent less than the {nbytes} bytes asked for: {counts}"
    assert sent <= nbytes + STREAMS * (1 << 20), f"sender sent far more than asked for: {counts}"
    assert received <= sent, f"receiver counted more than was sent: {counts}"
    assert received >= sent - slack, f"receiver counted less than the sender minus buffered bytes: {counts}"
    # the sending end's own count equals what the client reports as sent
    if direction == "forward":
        assert s_recv == received, f"server's received count differs from the client's view of it: {counts}"
    else:
        assert s_sent == sent, f"server's sent count differs from the client's view of it: {counts}"
