"""Compares `canal bench --quick` summaries: runs before/after, interleaved. For each
headline metric of each canal cell: median over runs of the cell medians, after/before,
and the same ratio for the native baseline in the same runs (noise reference)."""
import csv, glob, statistics as st
KEYS = ['rtt_p50_us', 'gbit_s', 'msgs_s', 'get_rps', 'set_rps', 'req_s', 'syscalls_per_msg', 'cpu_ns_per_byte', 'daemon_cpu_pct']
def load(d):
    out = {}
    for r in csv.DictReader(open(d + '/summary.csv')):
        if r['metric'] not in KEYS or r['status'] != 'ok':
            continue
        try:
            v = float(r['median'])
        except ValueError:
            continue
        out[(r['experiments'], r['system'], r['variant'], r['workload'], r['size_bytes'], r['pairs'], r['metric'])] = v
    return out
B = [load(d) for d in sorted(glob.glob('$OUT/before-[0-9]'))]
A = [load(d) for d in sorted(glob.glob('$OUT/after-[0-9]'))]
keys = sorted(set.intersection(*[set(x) for x in B + A]))
print('| experiment | system | variant | workload | size | metric | before | after | after/before |')
print('|---|---|---|---|---|---|---|---|---|')
ratios = {}
for k in keys:
    b = st.median(x[k] for x in B); a = st.median(x[k] for x in A)
    if b == 0: continue
    r = a / b
    ratios.setdefault(k[1], []).append(r if k[6] not in ('rtt_p50_us', 'syscalls_per_msg', 'cpu_ns_per_byte', 'daemon_cpu_pct') else b / a if a else float('nan'))
    print(f'| {k[0]} | {k[1]} | {k[2]} | {k[3]} | {k[4]} | {k[6]} | {b:.4g} | {a:.4g} | {r:.3f} |')
print()
for s, rs in sorted(ratios.items()):
    rs = [x for x in rs if x == x]
    print(f'{s}: {len(rs)} metrics, median "better" ratio {st.median(rs):.3f} (>1 = after better), range {min(rs):.2f}–{max(rs):.2f}')
