#!/bin/bash
# interleaved A/B of two full builds (dirs DIR_A, DIR_B) on 1-client connection rate:
# MODE gn (guest client, native server), ng, or iso (isolated guest client -> host server as 10.0.2.2)
S=/tmp/crd/a.sock
gen() { # sys clients round
  local sys=$1 cl=$2 PORT=$((20000 + RANDOM % 10000)) spre="" cpre="" addr=127.0.0.1
  pkill -x canald; sleep 0.2
  local B=/work/main/target/release
  if [ $sys != kernel ]; then
    B=$(eval echo \$DIR_$sys)
    $B/canald --socket $S > /dev/null 2>&1 & sleep 0.4
    case $MODE in
      gn) cpre="$B/canal run --socket $S --";;
      ng) spre="$B/canal run --socket $S --";;
      iso) cpre="$B/canal run --socket $S --isolate --"; addr=10.0.2.2;;
    esac
  fi
  $spre $B/canal-bench-gen server --net tcp --addr 127.0.0.1:$PORT --mode conn --size 1 --clients $cl > /dev/null &
  local SP=$!; sleep 0.4
  $cpre $B/canal-bench-gen client --net tcp --addr $addr:$PORT --mode conn --size 1 --clients $cl --duration ${DUR:-2} --warmup 0 2>/dev/null | sed -n 's/.*conns_per_s=\([0-9.]*\) p50_ns=\([0-9]*\).*/\1 \2/p' | while read r p; do echo "$MODE $3 $cl $sys $r $p"; done
  kill $SP 2>/dev/null; wait $SP 2>/dev/null
}
for round in $(seq 1 ${ROUNDS:-4}); do
  for cl in ${CLS:-1}; do
    for sys in kernel A B; do gen $sys $cl $round; done
  done
done
pkill -x canald
