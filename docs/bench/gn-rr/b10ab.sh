#!/bin/bash
# Alternates `canal bench B10 --systems canal-gn` (and the tcp baseline once per pair)
# between two builds: before = $1/canal, after = $2/canal.
cd /work/main
for i in 1 2 3 4; do
  for v in before after; do
    if [ $v = before ]; then B=$1/canal; else B=$2/canal; fi
    CANAL_BIN=$B target/release/canal bench B10 --systems tcp,canal-gn --reps 1 --no-plots --out /tmp/rr/b10-$v-$i >/dev/null 2>&1
    python3 - "$v" "$i" <<'PY'
import csv,sys
rows=list(csv.DictReader(open(f"/tmp/rr/b10-{sys.argv[1]}-{sys.argv[2]}/summary.csv")))
def g(sys_,m):
    for x in rows:
        if x['system']==sys_ and x['metric']==m: return float(x['median'])
out=[]
for m in ('set_rps','get_rps','req_s'):
    n,c=g('tcp',m),g('canal-gn',m)
    out.append(f"{m} native {n:.0f} canal {c:.0f} ratio {c/n:.3f}" if n and c else f"{m} -")
print(sys.argv[1], sys.argv[2], ' | '.join(out))
PY
  done
done
