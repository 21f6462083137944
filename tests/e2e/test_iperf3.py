"""iperf3 through canal: native server + client under canal, then server under canal +
native client. Byte counts of both ends (iperf3 -J, the client fetching the server's report
with --get-server-output) are compared.

iperf3 (3.12 here) stops the server's count when the client's TEST_END arrives on the
control connection, so data still in flight is not counted: the receiver may report up to
the bytes that fit in the socket buffers between the two less than the sender, natively
too (measured here: up to 7 MB short of 256 MiB). The check is therefore: the sender sent
exactly the -n bytes asked for; the receiver got no more than that and no less than that
minus the buffer capacity (tcp_wmem max + tcp_rmem max + 16 MiB for canal's rings); the
server's own report equals the one the client fetched.

Whichever end runs under canal must show up in `canal stat` (the server's listener before
the client starts; the client's connection while it runs, which -b 4G makes last at least
about 2 s), so an iperf3 the library failed to intercept cannot pass."""

import json

import pytest

import e2e_util
from canal_harness import need_tool, runner

NBYTES = 1 << 30


def _json(result, who):
    try:
        return json.loads(result.stdout)
    except ValueError as e:
        raise AssertionError(f"{who} printed no valid JSON ({e})\n{result.describe()}")


@pytest.mark.relay
@pytest.mark.parametrize("mode", ["native", "canal-client", "canal-server"])
def test_iperf3(request, mode):
    iperf3 = need_tool("iperf3")
    procs = request.getfixturevalue("procs")
    server_run = runner(request, "canal" if mode == "canal-server" else "native")
    client_run = runner(request, "canal" if mode == "canal-client" else "native")
    port = e2e_util.free_port()

    server = server_run.spawn([iperf3, "-s", "-1", "-B", "127.0.0.1", "-p", port, "-J"], name="iperf3-server")
    # canal's listener is a host socket on the same port, so /proc/net/tcp shows it either way
    e2e_util.wait_for(lambda: e2e_util.tcp_listening(port) or server.poll() is not None, 30,
                      what=f"iperf3 server to listen on 127.0.0.1:{port}")
    assert server.poll() is None, f"iperf3 server exited early\n{server.describe()}"
    if mode == "canal-server":
        server_run.wait_served(server, kind="tcp-listener")

    client_proc = client_run.spawn(
        [iperf3, "-c", "127.0.0.1", "-p", port, "-n", NBYTES, "-b", "4G", "-J", "--get-server-output",
         "--connect-timeout", "10000"],
        name="iperf3-client",
    )
    if mode == "canal-client":
        client_run.wait_served(client_proc, kind="tcp", peer_port=port, timeout=20)
    client = client_proc.finish(60)
    srv = server.finish(30)
    assert client.returncode == 0, client.describe()
    assert srv.returncode == 0, srv.describe()
    cj = _json(client, "iperf3 client")
    sj = _json(srv, "iperf3 server")
    assert "error" not in cj, f"client reports an error: {cj['error']}"
    assert "error" not in sj, f"server reports an error: {sj['error']}"

    sent = cj["end"]["sum_sent"]["bytes"]
    received_seen_by_client = cj["end"]["sum_received"]["bytes"]
    fetched = cj.get("server_output_json")
    assert fetched, "client JSON lacks server_output_json (--get-server-output)"
    received_fetched = fetched["end"]["sum_received"]["bytes"]
    received = sj["end"]["sum_received"]["bytes"]
    slack = e2e_util.iperf3_slack()
    counts = (
        f"client sum_sent {sent}, server sum_received {received} (as fetched by the client: "
        f"{received_fetched}; client's sum_received {received_seen_by_client}), slack {slack}"
    )
    print(f"iperf3 {mode}: {counts}")
    assert sent == NBYTES, f"sender did not send the {NBYTES} bytes asked for: {counts}"
    assert received == received_fetched == received_seen_by_client, f"the two ends' reports disagree: {counts}"
    assert received <= sent, f"receiver counted more than was sent: {counts}"
    assert received >= sent - slack, f"receiver counted less than the sender minus buffered bytes: {counts}"
