"""Edge cases of unmodified programs, as small C programs (progs/edge.c against
progs/peer.c): fork/vfork/posix_spawn/exec with sockets, dup/dup2/dup3/F_DUPFD_CLOEXEC and
the last close, close or shutdown while another thread is blocked in recv, EINTR, epoll
(level, edge, EPOLLONESHOT, EPOLLRDHUP/HUP/ERR, mixed with pipe/eventfd/timerfd, two sets,
nested, epoll_pwait), ppoll/pselect, SOCK_NONBLOCK/SOCK_CLOEXEC/accept4, sendfile,
MSG_PEEK/WAITALL/DONTWAIT/TRUNC, socket options, IPv6 and a dual-stack listener, connected
UDP. docs/compat-tests.md lists what each check asserts.

Each check is one run of `edge CHECK <peer ports>`; it prints "ok CHECK: ..." or
"FAIL CHECK: ..." per sub-check (errno names included) and exits non-zero on failure. The
check's role says which end the edge program is: "client" checks connect to the peer,
"server" checks listen and have the peer connect to them. So in canal-client mode a client
check runs edge under canal and the peer natively, and a server check the other way round.

The peer uses only threads and blocking calls, so under canal it needs basic sockets only."""

import subprocess

import pytest

import compat_util
from canal_harness import clean_env
from compat_util import MODES

# name -> role of the edge program; must match `edge --list` (checked when compiling)
CHECKS = {
    "close_while_recv_blocked": "client",
    "shutdown_wakes_blocked_recv": "client",
    "eintr_recv": "client",
    "threads_share_socket": "client",
    "et_epoll_drain": "client",
    "nonblocking_connect_epoll": "client",
    "epoll_mixed_level": "client",
    "epoll_edge_mixed": "client",
    "epoll_oneshot": "client",
    "epoll_rdhup": "client",
    "epoll_hup_err": "client",
    "epoll_two_sets": "client",
    "epoll_nested": "client",
    "epoll_pwait_timeout_eintr": "client",
    "ppoll_pselect": "client",
    "dup_family_last_close": "client",
    "dup2_over_socket": "client",
    "sock_nonblock_cloexec": "client",
    "fork_shared_connection": "client",
    "fork_then_killed": "client",
    "vfork_exec": "client",
    "posix_spawn": "client",
    "exec_inherits_socket": "client",
    "exec_closes_cloexec": "client",
    "sendfile": "client",
    "msg_flags": "client",
    "outq": "client",
    "atmark": "client",
    "udp_msg_trunc": "client",
    "sockopts": "client",
    "ipv6_client": "client",
    "udp_connected": "client",
    "fork_shared_listener": "server",
    "accept4_flags": "server",
    "dualstack_listener": "server",
    "reuseaddr_reuseport": "server",
    "lowest_free_numbering": "client",
    "dup2_low_numbers": "client",
    "dup2_onto_library_fds": "client",
    "close_range_then_sockets": "client",
    "scm_rights_pass": "client",
    "stdio_on_inherited_socket": "client",
    "fdopen_stream": "client",
}


@pytest.fixture(scope="session")
def edge_progs(cprogs):
    cp = subprocess.run([str(cprogs["edge"]), "--list"], capture_output=True, text=True, timeout=10)
    listed = dict(line.split() for line in cp.stdout.splitlines())
    assert listed == CHECKS, f"progs/edge.c's checks differ from CHECKS in {__file__}: {listed} vs {CHECKS}"
    return cprogs


@pytest.mark.deadline(60)
@pytest.mark.parametrize("check", list(CHECKS))
@pytest.mark.parametrize("mode", MODES)
def test_edge(request, mode, check, edge_progs):
    server_run, client_run = compat_util.ends(request, mode)
    if CHECKS[check] == "client":
        edge_run, peer_run = client_run, server_run
    else:
        edge_run, peer_run = server_run, client_run
    peer = peer_run.spawn([edge_progs["peer"]], name="peer")
    line = peer.wait_line("READY", 30)
    ports = dict(kv.split("=") for kv in line.split()[1:])
    if peer_run is not request.getfixturevalue("procs"):
        compat_util.assert_listed_by_canal(peer_run, ports["tcp4"], what="the peer")
    procs = request.getfixturevalue("procs")
    edge_under_canal = edge_run is not procs
    argv = [edge_progs["edge"], check, ports["tcp4"], ports["tcp6"], ports["udp4"], ports["udp6"]]
    if not edge_under_canal:
        r = edge_run.run(argv, timeout=45, name=f"edge-{check}")
    else:
        # EDGE_WITNESS: after the check, edge opens one more socket of the check's kind and
        # waits (stdin open) while `canal stat` must list it: the sockets are canal's
        p = edge_run.spawn(argv, name=f"edge-{check}", stdin=subprocess.PIPE,
                           env=clean_env({"EDGE_WITNESS": "1"}))
        witness_error = None
        try:
            wline = p.wait_line("WITNESS", 45)
        except AssertionError as e:
            wline, witness_error = None, f"edge printed no WITNESS line: {str(e).splitlines()[0]}"
        if wline:
            _, kind, wport = wline.split()
            try:
                compat_util.assert_socket_listed(edge_run, int(wport), kind, f"edge ({check})")
            except AssertionError as e:
                witness_error = str(e)
        p.popen.stdin.close()
        r = p.finish(30)
    lines = r.stdout.splitlines()
    fails = [l for l in lines if l.startswith("FAIL ")]
    oks = [l for l in lines if l.startswith("ok ")]
    print("\n".join(lines))
    assert r.returncode == 0 and not fails and oks and f"done {check}: 0 failure(s)" in lines, (
        f"{check} ({mode}, edge program is the {CHECKS[check]}): {len(fails)} sub-check(s) failed:\n  "
        + "\n  ".join(fails) + f"\n{r.describe()}"
    )
    assert peer.poll() is None, f"the peer died\n{peer.describe()}"
    if edge_under_canal:
        assert witness_error is None, witness_error
