#!/bin/bash
# interleaved A/B of canald builds on B12 g<->g; prints: round clients system rate p50
S=/tmp/crd/a.sock
B=/work/main/target/release
gen() { # sys clients
  local sys=$1 cl=$2 PORT=$((20000 + RANDOM % 10000)) pre=""
  pkill -x canald; sleep 0.2
  if [ $sys != kernel ]; then
    local D=$B/canald; [ $sys = old ] && D=${OLD_CANALD:?the build to compare with}
    $D --socket $S > /dev/null 2>&1 & sleep 0.4
    pre="$B/canal run --socket $S --"
  fi
  $pre $B/canal-bench-gen server --net tcp --addr 127.0.0.1:$PORT --mode conn --size 1 --clients $cl > /dev/null &
  local SP=$!; sleep 0.4
  $pre $B/canal-bench-gen client --net tcp --addr 127.0.0.1:$PORT --mode conn --size 1 --clients $cl --duration ${DUR:-2} --warmup 0 2>/dev/null | sed -n 's/.*conns_per_s=\([0-9.]*\) p50_ns=\([0-9]*\).*/\1 \2/p' | while read r p; do echo "$3 $cl $sys $r $p"; done
  kill $SP 2>/dev/null; wait $SP 2>/dev/null
}
for round in $(seq 1 ${ROUNDS:-4}); do
  for cl in 1 16; do
    for sys in kernel old new; do gen $sys $cl $round; done
  done
done
pkill -x canald
