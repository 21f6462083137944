#!/usr/bin/python3
"""Plots for `canal bench` (embedded into the harness; run as bench-plot.py OUT_DIR).

Reads OUT_DIR/summary.csv, writes OUT_DIR/plots/*.png and prints "WROTE <name>" for
each. Every canal series that has no number says why on the plot itself, next to the
baselines measured in the same run. Needs Debian's python3-matplotlib (/usr/bin/python3).
"""
import csv
import math
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter, NullFormatter  # noqa: E402

PLAIN = FuncFormatter(lambda v, _: f"{v:g}")

SYSTEMS = [
    ("tcp", "kernel TCP", "tab:blue", "o"),
    ("uds", "UDS", "tab:orange", "s"),
    ("canal-gg", "canal guest↔guest", "tab:green", "^"),
    ("canal-gn", "canal guest→native", "tab:red", "v"),
    ("canal-ng", "canal native→guest", "tab:purple", "D"),
]
LABEL = {s[0]: s[1] for s in SYSTEMS}
COLOR = {s[0]: s[2] for s in SYSTEMS}
MARK = {s[0]: s[3] for s in SYSTEMS}


def load(out):
    rows = []
    with open(os.path.join(out, "summary.csv"), newline="") as f:
        for r in csv.DictReader(f):
            r["size"] = int(r["size_bytes"])
            r["pairs"] = int(r["pairs"])
            for k in ("median", "min", "max"):
                r[k] = float(r[k]) if r[k] not in ("", "nan") else None
            rows.append(r)
    return rows


def size_label(b):
    return f"{b // 1024} KiB" if b >= 1024 and b % 1024 == 0 else f"{b} B"


def short(reason, n=70):
    reason = " ".join(reason.split())
    return reason if len(reason) <= n else reason[: n - 1] + "…"


def select(rows, workload, metric, variant="default", pairs=None, system=None):
    out = []
    for r in rows:
        if r["workload"] != workload or r["variant"] != variant:
            continue
        if pairs is not None and r["pairs"] != pairs:
            continue
        if system is not None and r["system"] != system:
            continue
        if r["metric"] in (metric, ""):
            out.append(r)
    return out


def missing_notes(rows, systems):
    """One line per system that has rows but no number, with its reason."""
    notes = []
    for s in systems:
        rs = [r for r in rows if r["system"] == s]
        if rs and not any(r["median"] is not None for r in rs):
            notes.append(f"{LABEL.get(s, s)}: {rs[0]['status']} — {short(rs[0]['reason'])}")
    return notes


def annotate(ax, notes, y=-0.3):
    if notes:
        # Below the axes (x labels included), so it never hides data; savefig uses
        # bbox_inches="tight" to make room for it.
        ax.text(0.0, y, "no number for:\n" + "\n".join(notes), transform=ax.transAxes, fontsize=7,
                va="top", ha="left", color="darkred",
                bbox=dict(boxstyle="round", facecolor="lightyellow", alpha=0.9, edgecolor="darkred"))


def errbars(ok):
    lo = [r["median"] - r["min"] for r in ok]
    hi = [r["max"] - r["median"] for r in ok]
    return [lo, hi]


def sweep(ax, rows, workload, metric, xkey, ylabel, title, logy=True, variant="default", pairs=1, style="-"):
    data = select(rows, workload, metric, variant=variant, pairs=pairs if xkey == "size" else None)
    drew = False
    for s, label, color, mark in SYSTEMS:
        ok = sorted([r for r in data if r["system"] == s and r["median"] is not None and r["metric"] == metric],
                    key=lambda r: r[xkey])
        if not ok:
            continue
        xs = [r[xkey] for r in ok]
        ax.errorbar(xs, [r["median"] for r in ok], yerr=errbars(ok), label=label, color=color, marker=mark,
                    linestyle=style, capsize=3)
        drew = True
    if xkey == "size":
        ax.set_xscale("log", base=2)
        xs = sorted({r["size"] for r in data})
        if xs:
            # Neighbours closer than 1.5× (56 B and 64 B) would print over each other.
            labels, last = [], None
            for x in xs:
                ok = last is None or x / last >= 1.5
                labels.append(size_label(x) if ok else "")
                last = x if ok else last
            ax.set_xticks(xs)
            ax.set_xticklabels(labels, rotation=45, ha="right", fontsize=8)
        ax.set_xlabel("message size")
    else:
        ax.set_xlabel("concurrent client/server pairs")
        xs = sorted({r["pairs"] for r in data})
        if xs:
            ax.set_xticks(xs)
    if not logy:
        ax.set_ylim(bottom=0)
    if logy and drew:
        ax.set_yscale("log")
        # Plain numbers (20, 50, 100), not 2×10¹.
        ax.yaxis.set_major_formatter(PLAIN)
        ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    if drew:
        ax.legend(fontsize=8)
    annotate(ax, missing_notes(data, [s[0] for s in SYSTEMS]))
    return drew


def save(fig, out, name, footer):
    fig.tight_layout()
    fig.text(0.5, 1.0, footer, ha="center", va="bottom", fontsize=7, color="gray")
    path = os.path.join(out, "plots", name)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    print(f"WROTE {name}")


def bars(ax, entries, ylabel, title, baseline=None):
    """entries: list of (label, row-or-None-with-reason, color)."""
    labels, vals, errs, colors, notes, missing = [], [], [[], []], [], [], []
    for label, r, color in entries:
        labels.append(label)
        colors.append(color)
        missing.append(r is None or r["median"] is None)
        if r is not None and r["median"] is not None:
            vals.append(r["median"])
            errs[0].append(r["median"] - r["min"])
            errs[1].append(r["max"] - r["median"])
        else:
            vals.append(0.0)
            errs[0].append(0.0)
            errs[1].append(0.0)
            if r is not None:
                notes.append(f"{label}: {r['status']} — {short(r['reason'], 60)}")
    xs = range(len(labels))
    ax.bar(xs, vals, yerr=errs, color=colors, capsize=3)
    for x, v, miss in zip(xs, vals, missing):
        if miss:
            ax.text(x, 0, "n/a", ha="center", va="bottom", fontsize=8, color="darkred")
    if baseline is not None:
        ax.axhline(baseline[1], color="tab:blue", linestyle="--", label=baseline[0])
        ax.legend(fontsize=8)
    ax.set_xticks(list(xs))
    ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
    annotate(ax, notes, y=-0.45)


def one(rows, workload, metric, system, variant="default", size=None, pairs=1):
    cand = [r for r in rows if r["workload"] == workload and r["system"] == system and r["variant"] == variant
            and r["pairs"] == pairs and (size is None or r["size"] == size)]
    for r in cand:
        if r["metric"] == metric:
            return r
    for r in cand:
        if r["median"] is None:
            return r
    if cand:  # ran, but without this metric
        return dict(cand[0], median=None, status="no value", reason=f"no {metric}")
    return None


def variants(rows, workload, prefix):
    vs = []
    for r in rows:
        if r["workload"] == workload and r["variant"].startswith(prefix) and r["variant"] not in vs:
            vs.append(r["variant"])
    return vs


def main():
    out = sys.argv[1]
    os.makedirs(os.path.join(out, "plots"), exist_ok=True)
    rows = load(out)
    footer = ""
    try:
        with open(os.path.join(out, "machine.txt")) as f:
            kv = dict(line.rstrip("\n").split(": ", 1) for line in f if ": " in line)
        footer = f"{kv.get('machine', '')} — {kv.get('date', '')} — {kv.get('command', '')}"
    except OSError:
        pass
    has = lambda w: any(r["workload"] == w for r in rows)  # noqa: E731

    if has("stream"):
        fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.8))
        sweep(a, rows, "stream", "gbit_s", "size", "throughput (Gbit/s)", "B2 stream throughput vs message size")
        sweep(b, rows, "stream", "msgs_s", "size", "messages per second", "B2 message rate vs message size")
        save(fig, out, "throughput_vs_size.png", footer)
        fig, a = plt.subplots(figsize=(7, 4.8))
        sweep(a, rows, "stream", "cpu_ns_per_byte", "size", "CPU ns per byte (client+server+canald)",
              "B6 transfer cost vs message size (lower is better)")
        save(fig, out, "transfer_cost.png", footer)
    if has("rr"):
        fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.8))
        sweep(a, rows, "rr", "rtt_p50_us", "size", "round-trip time p50 (µs)", "B1 request-response p50 vs size")
        sweep(b, rows, "rr", "rtt_p99_us", "size", "round-trip time p99 (µs)", "B1 request-response p99 vs size")
        save(fig, out, "latency_vs_size.png", footer)
    if any(r["pairs"] > 1 and r["variant"] == "default" for r in rows):
        # Only the systems the scaling experiment ran (B1's guest→native cells share pairs=1).
        scaled = {r["system"] for r in rows if r["pairs"] > 1}
        srows = [r for r in rows if r["system"] in scaled]
        fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.8))
        sweep(a, [r for r in srows if r["size"] == 16384], "stream", "gbit_s", "pairs", "aggregate throughput (Gbit/s)",
              "B4 scaling: stream 16 KiB", logy=False)
        sweep(b, [r for r in srows if r["size"] == 64], "rr", "rtt_p50_us", "pairs", "mean RTT p50 (µs)",
              "B4 scaling: RR 64 B", logy=False)
        save(fig, out, "scaling.png", footer)
    nv = variants(rows, "rr", "notify=") + variants(rows, "idle", "notify=")
    if nv:
        modes = ["default", "notify=poll", "notify=sleep", "notify=hybrid"]
        fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.8))
        tcp = one(rows, "rr", "rtt_p50_us", "tcp", size=64)
        ent = [("kernel TCP", tcp, "tab:blue")] + [(f"canal {m}", one(rows, "rr", "rtt_p50_us", "canal-gg", m, 64), "tab:green") for m in modes]
        bars(a, ent, "RTT p50 (µs)", "B5 notification modes: RR 64 B latency")
        ent = [(f"canal {m}", one(rows, "idle", "daemon_cpu_pct", "canal-gg", m), "tab:green") for m in modes]
        bars(b, ent, "canald CPU (% of one core)", "B5 idle canald CPU (target ≤ 1%)")
        b.axhline(1.0, color="gray", linestyle=":")
        save(fig, out, "notification_modes.png", footer)
    # Mechanisms switched off, then those that are off by default switched on.
    av = variants(rows, "stream", "disable=") + variants(rows, "stream", "coalesce=") + variants(rows, "stream", "zones=")
    # Guest↔guest bars: only when the run had that system (a guest→native-only B8 has none).
    if av and one(rows, "stream", "gbit_s", "canal-gg", size=16384):
        fig, a = plt.subplots(figsize=(8, 4.8))
        tcp = one(rows, "stream", "gbit_s", "tcp", size=16384)
        ent = [(f"canal {m}", one(rows, "stream", "gbit_s", "canal-gg", m, 16384), "tab:green") for m in ["default"] + av]
        base = ("kernel TCP", tcp["median"]) if tcp and tcp["median"] is not None else None
        bars(a, ent, "throughput (Gbit/s)", "B8 ablation: stream 16 KiB, one mechanism off (or on)", baseline=base)
        save(fig, out, "ablation.png", footer)
    sv = variants(rows, "rr", "split=")
    if sv:
        # B9's own rows (B8 also runs disable=coalesce, at one pair): coalescing off
        # is the line every split is compared with.
        b9 = [r for r in rows if "B9" in r["experiments"].split()]
        if any(r["variant"] == "disable=coalesce" for r in b9):
            sv = sv + ["disable=coalesce"]
        # CPU per round trip where measured: a split that delays wake-ups also lowers
        # the round-trip rate, so cores busy alone flatters it.
        per_rt = any(r["metric"] == "cpu_per_rt_us" for r in b9)
        metric = "cpu_per_rt_us" if per_rt else "cpu_cores"
        fig, a = plt.subplots(figsize=(8, 4.8))
        notes = []
        for i, v in enumerate(sv):
            pts = [r for r in b9 if r["workload"] == "rr" and r["variant"] == v]
            cpu = {r["pairs"]: r["median"] for r in pts if r["metric"] == metric and r["median"] is not None}
            lat = {r["pairs"]: r["median"] for r in pts if r["metric"] == "rtt_max_us" and r["median"] is not None}
            ks = sorted(set(cpu) & set(lat))
            if ks:
                a.plot([lat[k] for k in ks], [cpu[k] for k in ks], marker="o", label=v)
                for k in ks:
                    a.annotate(f"n={k}", (lat[k], cpu[k]), fontsize=7)
            elif pts:
                notes.append(f"{v}: {pts[0]['status']} — {short(pts[0]['reason'], 60)}")
        a.set_xlabel("worst-case RTT (µs)")
        a.set_ylabel("CPU per round trip, all processes (µs)" if per_rt else "cores busy (all processes)")
        a.set_title("B9 coalescing splits: CPU vs worst-case wake latency", fontsize=10)
        a.grid(True, alpha=0.3)
        if a.lines:
            a.legend(fontsize=8)
        annotate(a, notes[:6])
        save(fig, out, "coalescing.png", footer)
    if has("redis-benchmark") or has("nginx-wrk") or has("memcached"):
        pg = has("pgbench")
        if pg:
            fig, (a, p) = plt.subplots(1, 2, figsize=(15, 4.8), gridspec_kw={"width_ratios": [2, 1]})
            pgbench_ratios(p, rows)
        else:
            fig, a = plt.subplots(figsize=(10, 4.8))
        groups = [("redis-benchmark", "set_rps", "redis SET"), ("redis-benchmark", "get_rps", "redis GET"),
                  ("nginx-wrk", "req_s", "nginx + wrk"), ("memcached", "ops_rps", "memcached + memaslap")]
        width = 0.2
        notes = []
        for j, (s, label, color, _) in enumerate(SYSTEMS):
            xs, ys = [], []
            for i, (w, m, _) in enumerate(groups):
                r = one(rows, w, m, s)
                if r is None:
                    continue
                if r["median"] is None:
                    note = f"{label} {w}: {r['status']} — {short(r['reason'], 55)}"
                    if note not in notes:
                        notes.append(note)
                    a.text(i + (j - 1.5) * width, 0, "n/a", ha="center", va="bottom", fontsize=7, color="darkred")
                    continue
                xs.append(i + (j - 1.5) * width)
                ys.append(r["median"])
            if xs:
                a.bar(xs, ys, width, label=label, color=color)
        a.set_xticks(range(len(groups)))
        a.set_xticklabels([g[2] for g in groups])
        a.set_xlim(-0.6, len(groups) - 0.4)
        a.set_ylabel("requests (operations) per second")
        a.set_title("B10 applications (higher is better)", fontsize=10)
        a.grid(True, axis="y", alpha=0.3)
        a.legend(fontsize=8)
        annotate(a, notes[:6])
        save(fig, out, "applications.png", footer)
    if has("syscalls-rr"):
        fig, a = plt.subplots(figsize=(8, 4.8))
        ent = []
        for w, lab in (("syscalls-rr", "RR 64 B / round trip"), ("syscalls-stream", "stream 1 KiB / send")):
            for s, label, color, _ in SYSTEMS:
                r = one(rows, w, "syscalls_per_msg", s)
                if r is not None:
                    ent.append((f"{label}\n{lab}", r, color))
        bars(a, ent, "client system calls per message", "B7 system calls per message (target 0 for canal)")
        save(fig, out, "syscalls.png", footer)

    if has("conn-rate") or has("hold"):
        connections(rows, out, footer)
    if has("udp-rr") or has("udp-stream"):
        udp(rows, out, footer)


def pgbench_ratios(a, rows):
    """B10's PostgreSQL cells: tps of each placement ÷ the kernel's, with the targets."""
    scripts = [("select_tps", "select-only"), ("tpcb_tps", "TPC-B-like")]
    placements = [s for s in SYSTEMS if s[0] in ("canal-gg", "canal-gn", "canal-ng")]
    width = 0.25
    for j, (s, label, color, _) in enumerate(placements):
        xs, ys = [], []
        for i, (m, _) in enumerate(scripts):
            k, r = one(rows, "pgbench", m, "tcp"), one(rows, "pgbench", m, s)
            if k is None or r is None or k["median"] in (None, 0) or r["median"] is None:
                continue
            xs.append(i + (j - 1) * width)
            ys.append(r["median"] / k["median"])
        if xs:
            a.bar(xs, ys, width, label=label, color=color)
    a.axhline(1.2, color="tab:green", linestyle="--", linewidth=1)
    a.axhline(0.95, color="tab:purple", linestyle="--", linewidth=1)
    a.axhline(1.0, color="black", linewidth=0.8)
    a.set_xticks(range(len(scripts)))
    a.set_xticklabels([x[1] for x in scripts])
    a.set_ylabel("tps ÷ kernel TCP (same run)")
    a.set_title("B10 PostgreSQL + pgbench (targets: both ends 1.2, server only 0.95)", fontsize=10)
    a.grid(True, axis="y", alpha=0.3)
    a.legend(fontsize=8)


def connections(rows, out, footer):
    """B12 and B13: connection rate, RR among idle connections, memory per connection
    (B12's panel only when B12 ran)."""
    ent = []
    for n in (1, 16):
        for s, label, color, _ in SYSTEMS:
            r = one(rows, "conn-rate", "conns_s", s, size=n)
            if r is not None:
                ent.append((f"{label}\n{n} client(s)", r, color))
    if ent:
        fig, (a, b, c) = plt.subplots(1, 3, figsize=(15, 4.8))
        bars(a, ent, "connections per second", "B12 connect + 1-byte echo + close (higher is better)")
    else:
        fig, (b, c) = plt.subplots(1, 2, figsize=(11, 4.8))
    for s, label, color, mark in SYSTEMS:
        ok = sorted([r for r in rows if r["workload"] == "hold" and r["system"] == s
                     and r["metric"] == "rtt_p50_us" and r["median"] is not None], key=lambda r: r["size"])
        if ok:
            b.errorbar([r["size"] for r in ok], [r["median"] for r in ok], yerr=errbars(ok), label=label,
                       color=color, marker=mark, capsize=3)
    b.set_yscale("log")
    b.yaxis.set_major_formatter(PLAIN)
    b.yaxis.set_minor_formatter(NullFormatter())
    b.set_xlabel("idle connections held")
    b.set_ylabel("RR p50 at 64 B (µs)")
    b.set_title("B13 latency among idle connections (flat is the target)", fontsize=10)
    b.grid(True, which="both", alpha=0.3)
    b.legend(fontsize=8)
    ent = []
    for n in sorted({r["size"] for r in rows if r["workload"] == "hold" and r["size"] > 0}):
        for s, label, color, _ in SYSTEMS:
            r = one(rows, "hold", "mem_per_conn_kib", s, size=n)
            if r is not None:
                ent.append((f"{label}\n{n} idle", r, color))
    bars(c, ent, "KiB per idle connection", "B13 memory per idle connection, all processes + kernel")
    save(fig, out, "connections.png", footer)


def udp(rows, out, footer):
    """B15: UDP request-response, stream (what arrived) and loss; the tcp system is kernel UDP."""
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.8))
    panels = (("udp-rr", "rtt_p50_us", "RR p50 (µs)", "B15 UDP request-response p50 (lower is better)", False),
              ("udp-stream", "gbit_s", "Gbit/s that arrived", "B15 UDP stream, what arrived (higher is better)", True),
              ("udp-stream", "lost_pct", "% of datagrams lost", "B15 UDP stream: datagrams lost", False))
    for ax, (w, metric, ylabel, title, logy) in zip(axes, panels):
        drew = False
        for s, label, color, mark in SYSTEMS:
            ok = sorted([r for r in rows if r["workload"] == w and r["system"] == s and r["metric"] == metric
                         and r["median"] is not None], key=lambda r: r["size"])
            if ok:
                ax.errorbar([r["size"] for r in ok], [r["median"] for r in ok], yerr=errbars(ok),
                            label=label.replace("kernel TCP", "kernel UDP"), color=color, marker=mark, capsize=3)
                drew = True
        ax.set_xscale("log", base=2)
        sizes = sorted({r["size"] for r in rows if r["workload"] == w})
        ax.set_xticks(sizes)
        ax.set_xticklabels([size_label(x) for x in sizes], fontsize=8)
        ax.set_xlabel("datagram size")
        if logy and drew:
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(PLAIN)
            ax.yaxis.set_minor_formatter(NullFormatter())
        else:
            ax.set_ylim(bottom=0)
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        if drew:
            ax.legend(fontsize=8)
    save(fig, out, "udp.png", footer)


if __name__ == "__main__":
    main()
