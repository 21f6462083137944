"""`canal bench`: the quick mode runs in the suite and its outputs are checked.

These tests check the harness and that its numbers are sane; they assert no performance
target (docs/bench/README.md). Canal cells may fail while canal does not work: then each
must say why, never carry a number.
"""

import csv
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from canal_harness import bin_path, clean_env

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
STATUSES = {"ok", "failed", "not available", "skipped"}


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def run_bench(canal, args, env=None, timeout=170):
    start = time.monotonic()
    p = subprocess.run([str(canal), "bench", *args], capture_output=True, text=True, timeout=timeout,
                       env=clean_env(env), stdin=subprocess.DEVNULL)
    return p, time.monotonic() - start


def median(summary, system, workload, size, metric, pairs=1, variant="default"):
    for r in summary:
        if (r["system"], r["workload"], int(r["size_bytes"]), int(r["pairs"]), r["variant"], r["metric"]) == (
                system, workload, size, pairs, variant, metric):
            return float(r["median"])
    raise AssertionError(f"no {metric} for {system} {workload} {size} B pairs={pairs} {variant}")


@pytest.mark.deadline(200)
def test_quick_mode_outputs_and_sane_numbers(tmp_path):
    canal = bin_path("canal")
    out = tmp_path / "quick"
    p, elapsed = run_bench(canal, ["--quick", "--out", str(out)])
    assert p.returncode == 0, f"canal bench --quick exit {p.returncode}\n{p.stderr[-4000:]}"
    # The budget for the quick mode.
    assert elapsed < 120, f"quick mode took {elapsed:.0f} s (budget 120 s)"

    for name in ("results.csv", "summary.csv", "results.md", "machine.txt", "bench-plot.py", "readme-snippet.md"):
        assert (out / name).stat().st_size > 0, name

    # Every row records the machine, the placement and the command that reproduces it.
    rows = read_csv(out / "results.csv")
    assert rows
    for r in rows:
        assert r["status"] in STATUSES, r
        assert r["machine"] and "cores" in r["machine"], r
        assert r["command"].split()[1:2] == ["bench"], r
        assert r["placement"], r
        if r["status"] == "ok":
            assert r["metric"] and r["value"] and r["raw_command"], r
        else:
            # No number without a run; every missing number says why.
            assert r["value"] == "" and r["reason"].strip(), r

    summary = read_csv(out / "summary.csv")
    # Native baselines must all have run.
    for r in summary:
        if r["system"] in ("tcp", "uds"):
            assert r["status"] == "ok", r
    # Canal cells: a number, or a reason.
    canal_rows = [r for r in summary if r["system"].startswith("canal")]
    assert canal_rows
    for r in canal_rows:
        assert r["status"] == "ok" or r["reason"].strip(), r

    for system in ("tcp", "uds"):
        for size in (64, 1024, 16384):
            p50 = median(summary, system, "rr", size, "rtt_p50_us")
            p99 = median(summary, system, "rr", size, "rtt_p99_us")
            assert 0.5 < p50 < 100_000, (system, size, p50)
            assert p99 >= p50 * 0.999, (system, size, p50, p99)
        for size in (64, 1024, 65536):
            gbit = median(summary, system, "stream", size, "gbit_s")
            msgs = median(summary, system, "stream", size, "msgs_s")
            assert 0.001 < gbit < 2000, (system, size, gbit)
            # Message rate and throughput describe the same transfer.
            assert msgs * size * 8 / 1e9 == pytest.approx(gbit, rel=0.05), (system, size, msgs, gbit)
            # Moving bytes costs CPU, and less than a second per byte.
            assert 0 < median(summary, system, "stream", size, "cpu_ns_per_byte") < 1e9
        # Blocking kernel sockets: one send + one recv per round trip, one send per send.
        assert 1.9 <= median(summary, system, "syscalls-rr", 64, "syscalls_per_msg") <= 2.5
        assert 0.9 <= median(summary, system, "syscalls-stream", 1024, "syscalls_per_msg") <= 1.5
    assert median(summary, "tcp", "stream", 16384, "gbit_s", pairs=2) > 0

    md = (out / "results.md").read_text()
    for needle in ("Command:", "Machine:", "Kernel:", "## At a glance", "### B1", "### B2", "### B11", "| 64 B |",
                   "kernel TCP", "UDS"):
        assert needle in md, needle
    snippet = (out / "readme-snippet.md").read_text()
    assert "RR round trip p50, 64 B" in snippet and f"{out}/plots/throughput_vs_size.png" in snippet

    pngs = sorted((out / "plots").glob("*.png"))
    names = {p.name for p in pngs}
    for must in ("throughput_vs_size.png", "latency_vs_size.png", "scaling.png", "transfer_cost.png"):
        assert must in names, names
    for png in pngs:
        data = png.read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 10_000, png
        assert f"plots/{png.name}" in md, png.name


FAKE_CANAL = '''#!{python}
"""Test double for `canal`: guests run natively (exec), so only the harness's canal code
path is exercised (daemon start, stat, switch confirmation, wrapping, CPU accounting)."""
import json, os, signal, socket, sys, time
a = sys.argv[1:]
def opt(name):
    return a[a.index(name) + 1] if name in a else None
if a[0] == "daemon":
    path = opt("--socket")
    s = socket.socket(socket.AF_UNIX); s.bind(path); s.listen(1)
    # Like canald, echo the --notify flag in force (and nothing about batching).
    cfg = {{"notify": opt("--notify")}} if opt("--notify") else {{}}
    with open(path + ".json", "w") as f:
        json.dump({{"pid": os.getpid(), "socket": path, "config": cfg}}, f)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        time.sleep(1)
elif a[0] == "stat":
    with open(opt("--socket") + ".json") as f:
        print(json.dumps({{"daemon": json.load(f), "guests": []}}))
elif a[0] == "run":
    prog = a[a.index("--") + 1:]
    os.execvp(prog[0], prog)
else:
    sys.exit(2)
'''


@pytest.mark.deadline(120)
def test_canal_code_path_with_a_test_double(tmp_path, python):
    """The canal modes go through `canal daemon`, `canal stat --json` and `canal run`; a
    switch counts only when canald echoes it under daemon.config."""
    fake = tmp_path / "fake-canal"
    fake.write_text(FAKE_CANAL.format(python=python))
    fake.chmod(0o755)
    gen = bin_path("canal-bench-gen")
    out = tmp_path / "fake"
    p, _ = run_bench(bin_path("canal"), ["--quick", "B5", "B8", "--reps", "1", "--no-plots", "--out", str(out)],
                     env={"CANAL_BIN": str(fake), "CANAL_BENCH_GEN": str(gen)})
    assert p.returncode == 0, p.stderr[-4000:]
    summary = read_csv(out / "summary.csv")
    # Confirmed switch (the double echoes --notify): it ran, and canald's CPU was read.
    assert median(summary, "canal-gg", "rr", 64, "rtt_p50_us", variant="notify=poll") > 0
    assert median(summary, "canal-gg", "rr", 64, "cpu_daemon_s", variant="notify=poll") >= 0
    # Unconfirmed switch: not available, with the switch named, and no number.
    r = [r for r in summary if r["variant"] == "disable=batch"]
    assert r and all(x["status"] == "not available" and "--no-batch" in x["reason"]
                     and "daemon.config.batch=false" in x["reason"] and x["median"] == "" for x in r), r
    # Zero copy is the buffer-zone switch (`--zones off`); the double does not echo it.
    r = [r for r in summary if r["variant"] == "disable=zerocopy"]
    assert r and all(x["status"] == "not available" and "--zones" in x["reason"]
                     and "daemon.config.zones=false" in x["reason"] and x["median"] == "" for x in r), r
    rows = read_csv(out / "results.csv")
    guest = [r for r in rows if r["system"] == "canal-gg" and r["status"] == "ok"]
    assert guest and all(f"{fake} run --socket" in r["raw_command"] for r in guest)


def test_generator_rejects_bad_arguments():
    gen = bin_path("canal-bench-gen")
    for args in (["client", "--addr", "127.0.0.1:1"], ["server", "--addr", "x", "--size", "0"], ["nope"]):
        p = subprocess.run([str(gen), *args], capture_output=True, text=True, timeout=10)
        assert p.returncode == 2 and p.stderr.strip(), (args, p.returncode, p.stderr)


def test_bench_rejects_bad_usage():
    p = subprocess.run([str(bin_path("canal")), "bench", "--systems", "quic"], capture_output=True, text=True,
                       timeout=10)
    assert p.returncode == 2 and "quic" in p.stderr
    p = subprocess.run([str(bin_path("canal")), "bench", "--list"], capture_output=True, text=True, timeout=10)
    assert p.returncode == 0 and "B11" in p.stdout


@pytest.mark.deadline(300)
def test_b14_quick_isolated_guests_beside_pasta_and_slirp(tmp_path):
    """`canal bench b14 --quick`: every cell of canal --isolate and of the host has a
    number (the static Go net/http cells too, where Go is installed); pasta's and
    slirp4netns's have one too, or say why (not installed); the report states the
    targets as ratios, and the plot is a PNG."""
    out = tmp_path / "b14"
    p, _ = run_bench(bin_path("canal"), ["b14", "--quick", "--out", str(out)], timeout=280)
    assert p.returncode == 0, f"b14 exit {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    rows = read_csv(out / "b14.csv")
    tests = {"iperf3", "iperf3-reverse", "rr-p50", "conn-rate", "go-http-bulk", "go-http-req"}
    # The Go cells need Go (the suite installs golang-go); without it they say so.
    need_number = {"native", "canal-isolate"}
    for topo in ("guest-host", "guest-guest"):
        for sys_ in ("native", "canal-isolate", "pasta-splice", "pasta-tap", "slirp4netns"):
            for t in tests:
                r = [x for x in rows if (x["topology"], x["system"], x["test"]) == (topo, sys_, t)]
                assert len(r) == 1, f"no row {topo} {sys_} {t}"
                r = r[0]
                if t.startswith("go-") and not shutil.which("go"):
                    assert not r["median"] and "go is not installed" in r["note"], r
                elif sys_ in need_number:
                    assert r["median"] and float(r["median"]) > 0, f"{topo} {sys_} {t}: {r}"
                else:
                    assert (r["median"] and float(r["median"]) > 0) or r["note"], f"{topo} {sys_} {t}: {r}"
    md = (out / "b14.md").read_text()
    assert "## Targets" in md and "two isolated guests ≥ 10× two pasta containers" in md
    assert "static Go net/http inside --isolate ≥ 0.9× the host's" in md
    assert (out / "b14.png").read_bytes()[:8] == PNG_MAGIC
