#!/usr/bin/python3
"""Plots herd.py's rounds (the rounds*.txt files next to this script) into plots/:
wake-ups and connection rate per server shape, median of the rounds with their range.
rounds.txt and rounds-sleep.txt: 8bb2b56 (before) against 03cbfb6 (after);
rounds-2*.txt: a626fb6 (before) against the pin and spin changes (after).
Needs Debian's python3-matplotlib (/usr/bin/python3)."""
import collections
import os
import re
import statistics

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
LINE = re.compile(r"(\w+=\d+) round=\d+ (\w+) rate=(\d+)/s switches/conn=([\d.]+)")
SYSTEMS = [("kernel", "kernel", "tab:blue"), ("before", "canal before", "tab:red"),
           ("after", "canal after", "tab:green")]



def plot(rounds, png, mode, builds="8bb2b56 → 03cbfb6"):
    data = collections.defaultdict(lambda: collections.defaultdict(list))
    with open(os.path.join(HERE, rounds)) as f:
        for line in f:
            m = LINE.match(line.strip())
            if m:
                shape, system, rate, per = m.groups()
                data[shape][system].append((float(rate), float(per)))
    shapes = list(data)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, which, title in ((axes[0], 1, "server wake-ups per connection (log)"),
                             (axes[1], 0, "connections/s")):
        width = 0.26
        for k, (key, label, color) in enumerate(SYSTEMS):
            xs, meds, lo, hi = [], [], [], []
            for i, shape in enumerate(shapes):
                vals = [v[which] for v in data[shape][key]]
                med = statistics.median(vals)
                xs.append(i + (k - 1) * width)
                meds.append(med)
                lo.append(med - min(vals))
                hi.append(max(vals) - med)
            ax.bar(xs, meds, width, yerr=[lo, hi], color=color, label=label, capsize=3)
            for x, m in zip(xs, meds):
                ax.annotate(f"{m:.1f}" if which else f"{m / 1000:.1f}K", (x, m), ha="center",
                            va="bottom", fontsize=7, xytext=(0, 2), textcoords="offset points")
        ax.set_xticks(range(len(shapes)))
        ax.set_xticklabels([s.replace("=", " ") for s in shapes])
        ax.set_title(title)
        if which:
            ax.set_yscale("log")
    axes[0].legend(loc="upper left", fontsize=8)
    fig.suptitle(f"Blocked in accept(), native clients one after another; canal {builds}: {mode}")
    fig.tight_layout()
    os.makedirs(os.path.join(HERE, "plots"), exist_ok=True)
    fig.savefig(os.path.join(HERE, "plots", png), dpi=110)
    plt.close(fig)
    print("WROTE plots/" + png)


plot("rounds.txt", "herd.png", "default waits (spin, then sleep)")
plot("rounds-sleep.txt", "herd-sleep.png", "CANAL_NOTIFY=sleep")
plot("rounds-2.txt", "herd-2.png", "default waits", "a626fb6 → cda6043")
plot("rounds-2-sleep.txt", "herd-2-sleep.png", "CANAL_NOTIFY=sleep", "a626fb6 → cda6043")
