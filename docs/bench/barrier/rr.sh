#!/bin/bash
# usage: rr.sh DIR SIZE [mode]  -> runs canal g<->g rr once with binaries from DIR, prints client output
D=$1; SIZE=${2:-64}; MODE=${3:-rr}; DUR=${DUR:-2}
S=/tmp/rr-$$.sock
$D/canald --socket $S >/dev/null 2>&1 &
CD=$!
sleep 0.3
PORT=$((20000 + RANDOM % 20000))
CANAL_SOCKET=$S $D/canal run --socket $S -- $D/canal-bench-gen server --net tcp --addr 127.0.0.1:$PORT --mode $MODE --size $SIZE --cpu 0 >/dev/null 2>&1 &
SV=$!
sleep 0.3
CANAL_SOCKET=$S $D/canal run --socket $S -- $D/canal-bench-gen client --net tcp --addr 127.0.0.1:$PORT --mode $MODE --size $SIZE --cpu 1 --duration $DUR --warmup 100 2>&1 | tail -1
kill $SV $CD 2>/dev/null; wait 2>/dev/null
