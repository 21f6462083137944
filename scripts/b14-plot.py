#!/usr/bin/python3
"""B14's plot (embedded into `canal bench b14`; run as b14-plot.py DIR).

Reads DIR/b14.csv and writes DIR/b14.png: one panel per test, grouped by topology,
one bar per system (median; the whisker spans min..max). A system without a number
says why under its empty bar. Needs Debian's python3-matplotlib.
"""
import csv
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SYSTEMS = [
    ("native", "host (native)", "tab:gray"),
    ("canal-isolate", "canal --isolate", "tab:green"),
    ("pasta-splice", "pasta (splice)", "tab:blue"),
    ("pasta-tap", "pasta (tap)", "tab:cyan"),
    ("slirp4netns", "slirp4netns", "tab:orange"),
]
TESTS = [
    ("iperf3", "iperf3 → (Gbit/s)"),
    ("iperf3-reverse", "iperf3 ← -R (Gbit/s)"),
    ("rr-p50", "64 B RR p50 (µs, lower is better)"),
    ("conn-rate", "connections/s"),
    ("go-http-bulk", "Go net/http download (Gbit/s)"),
    ("go-http-req", "Go net/http 1 KiB GETs (req/s)"),
]
TOPOS = [("guest-host", "guest → host"), ("guest-guest", "guest ↔ guest")]


def main(out):
    rows = {}
    with open(os.path.join(out, "b14.csv"), newline="") as f:
        for r in csv.DictReader(f):
            rows[(r["topology"], r["test"], r["system"])] = r
    cols = 3
    rows_n = (len(TESTS) + cols - 1) // cols
    fig, grid = plt.subplots(rows_n, cols, figsize=(4.2 * cols, 4.2 * rows_n), squeeze=False)
    axes = [a for row in grid for a in row]
    width = 0.8 / len(SYSTEMS)
    for ax, (tid, tlabel) in zip(axes, TESTS):
        for i, (sid, slabel, color) in enumerate(SYSTEMS):
            for j, (pid, _) in enumerate(TOPOS):
                r = rows.get((pid, tid, sid))
                x = j + (i - len(SYSTEMS) / 2 + 0.5) * width
                if r and r["median"]:
                    m, lo, hi = float(r["median"]), float(r["min"]), float(r["max"])
                    ax.bar(x, m, width, color=color, label=slabel if j == 0 else None,
                           yerr=[[m - lo], [hi - m]], capsize=2)
                else:
                    ax.bar(x, 0, width, color=color, label=slabel if j == 0 else None)
                    ax.text(x, 0, "n/a", rotation=90, fontsize=6, ha="center", va="bottom")
        ax.set_xticks(range(len(TOPOS)))
        ax.set_xticklabels([t[1] for t in TOPOS])
        ax.set_title(tlabel, fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=7, loc="upper right")
    fig.suptitle("B14: isolated guests — canal --isolate vs pasta and slirp4netns (same run)")
    fig.tight_layout()
    path = os.path.join(out, "b14.png")
    fig.savefig(path, dpi=110)
    print("WROTE b14.png")


if __name__ == "__main__":
    main(sys.argv[1])
