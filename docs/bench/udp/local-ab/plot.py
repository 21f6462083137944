#!/usr/bin/python3
"""The before/after plot of datagrams between canal guests (README.md in ..).

Reads before1, after1, before2, after2 /summary.csv next to this file (two interleaved pairs of
`canal bench B15 --reps 2 --duration 2`) and writes ab.png: each guest-to-guest cell
as a ratio to kernel UDP in the same run, before and after, one dot per run. Needs
Debian's python3-matplotlib (/usr/bin/python3)."""
import csv
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
CELLS = [
    ("udp-rr", "64", "rtt_p50_us", "RR p50 64 B\n(lower is better)"),
    ("udp-rr", "1024", "rtt_p50_us", "RR p50 1 KiB\n(lower is better)"),
    ("udp-stream", "64", "gbit_s", "stream 64 B"),
    ("udp-stream", "1024", "gbit_s", "stream 1 KiB"),
    ("udp-stream", "8192", "gbit_s", "stream 8 KiB"),
]


def load(run):
    d = {}
    with open(os.path.join(HERE, run, "summary.csv")) as f:
        for row in csv.DictReader(f):
            if row["experiments"] == "B15":
                d[(row["workload"], row["size_bytes"], row["system"], row["metric"])] = float(
                    row["median"]
                )
    return d


def ratios(run):
    d = load(run)
    return [
        d[(w, s, "canal-gg", m)] / d[(w, s, "tcp", m)] for w, s, m, _ in CELLS
    ]


fig, ax = plt.subplots(figsize=(8, 4.2))
for k, (runs, color, label) in enumerate(
    [(("before1", "before2"), "#999999", "before (5963280)"), (("after1", "after2"), "#1f77b4", "after")]
):
    for j, run in enumerate(runs):
        xs = [i + (k - 0.5) * 0.3 for i in range(len(CELLS))]
        ax.scatter(xs, ratios(run), color=color, label=label if j == 0 else None, zorder=3)
ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
ax.text(len(CELLS) - 0.5, 1.05, "kernel UDP", ha="right", va="bottom", fontsize=8)
ax.set_yscale("log")
ax.set_xticks(range(len(CELLS)))
ax.set_xticklabels([c[3] for c in CELLS], fontsize=8)
ax.set_ylabel("canal guest↔guest ÷ kernel UDP (same run)")
ax.set_title("B15: datagrams between canal guests, before and after ring-to-ring delivery")
ax.legend(fontsize=8)
ax.grid(axis="y", which="both", alpha=0.3)
fig.tight_layout()
fig.savefig(os.path.join(HERE, "ab.png"), dpi=110)
print("WROTE ab.png")
