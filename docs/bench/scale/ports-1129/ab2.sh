#!/bin/bash
# interleaved A/B of two full builds (dirs A and B) on B12: MODE gg or ng; prints round clients sys rate p50
S=/tmp/crd/a.sock
gen() { # sys clients round
  local sys=$1 cl=$2 PORT=$((20000 + RANDOM % 10000)) pre="" spre="" cpre=""
  pkill -x canald; sleep 0.2
  local B=/work/main/target/release
  if [ $sys != kernel ]; then
    B=$(eval echo \$DIR_$sys)
    $B/canald --socket $S > /dev/null 2>&1 & sleep 0.4
    pre="$B/canal run --socket $S --"
  fi
  spre=$pre; cpre=$pre; [ "$MODE" = ng ] && cpre=""; [ "$MODE" = gn ] && spre=""
  $spre $B/canal-bench-gen server --net tcp --addr 127.0.0.1:$PORT --mode conn --size 1 --clients $cl > /dev/null &
  local SP=$!; sleep 0.4
  $cpre $B/canal-bench-gen client --net tcp --addr 127.0.0.1:$PORT --mode conn --size 1 --clients $cl --duration ${DUR:-2} --warmup 0 2>/dev/null | sed -n 's/.*conns_per_s=\([0-9.]*\) p50_ns=\([0-9]*\).*/\1 \2/p' | while read r p; do echo "$3 $cl $sys $r $p"; done
  kill $SP 2>/dev/null; wait $SP 2>/dev/null
}
for round in $(seq 1 ${ROUNDS:-4}); do
  for cl in ${CLS:-1 16}; do
    for sys in kernel A B; do gen $sys $cl $round; done
  done
done
pkill -x canald
