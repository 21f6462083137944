#!/bin/bash
# Alternates B10 guest->native with coalescing on (default) and off (--no-coalesce).
cd /work/main
for i in 1 2 3 4; do
  for v in on off; do
    if [ $v = off ]; then B=/tmp/co/canal-nocoal; else B=target/release/canal; fi
    CANAL_BIN=$B target/release/canal bench B10 --systems canal-gn --reps 1 --no-plots --out /tmp/co/b10-$v-$i >/dev/null 2>&1
    python3 - "$v" "$i" <<'PY'
import csv,sys
r={x['metric']:x['median'] for x in csv.DictReader(open(f"/tmp/co/b10-{sys.argv[1]}-{sys.argv[2]}/summary.csv"))}
print(sys.argv[1], sys.argv[2], {k:r.get(k) for k in ('set_rps','get_rps','req_s','p99_ms','set_p99_ms','get_p99_ms')})
PY
  done
done
