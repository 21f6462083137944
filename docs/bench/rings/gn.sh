#!/bin/bash
# usage: gn.sh BINDIR [canald args...] -> one g->n RR run: p50 + canald stats
D=$1; shift
S=/tmp/rr/gn-$$.sock
$D/canald --socket $S "$@" >/dev/null 2>&1 &
CD=$!
sleep 0.3
PORT=$((20000 + RANDOM % 20000))
$D/canal-bench-gen server --net tcp --addr 127.0.0.1:$PORT --mode ${MODE:-rr} --size ${SIZE:-64} --cpu 0 >/dev/null 2>&1 &
SV=$!
sleep 0.2
( sleep 1.5; $D/canal stat --socket $S --json > /tmp/rr/stat-$$.json ) &
CANAL_SOCKET=$S $D/canal run --socket $S -- $D/canal-bench-gen client --net tcp --addr 127.0.0.1:$PORT --mode ${MODE:-rr} --size ${SIZE:-64} --cpu 1 --duration ${DUR:-2} --warmup 100 2>&1 | tail -1 | grep -o "p50_ns=[0-9]*\|bytes_per_s=[0-9]*\|cpu_s=[0-9.]*" | tr '\n' ' '
wait %3 2>/dev/null
python3 -c "
import json,sys
d=json.load(open('/tmp/rr/stat-$$.json'))
w=d['daemon']['workers'][0]; g=d['guests'][0] if d['guests'] else {}
print('host spin_us',w['spin_ns']//1000,'sleeps',w['sleeps'],'wakes',w['wakes'],'kicks',w['kicks'],'rounds',w['rounds'])
"
kill $SV $CD 2>/dev/null; wait 2>/dev/null; rm -f /tmp/rr/stat-$$.json
