#!/bin/bash
# two isolated guests' connection rate: D = canald binary
S=/tmp/crd/a.sock; B=/work/main/target/release; D=${D:-$B/canald}
pkill -x canald; sleep 0.2
$D --socket $S > /dev/null 2>&1 & sleep 0.4
H=$((20000 + RANDOM % 10000))
$B/canal run --socket $S --isolate --publish $H:8080 -- $B/canal-bench-gen server --net tcp --addr 0.0.0.0:8080 --mode conn --size 1 --clients 1 > /dev/null 2>&1 &
SP=$!; sleep 0.8
$B/canal run --socket $S --isolate -- $B/canal-bench-gen client --net tcp --addr 10.0.2.2:$H --mode conn --size 1 --clients 1 --duration ${DUR:-2} --warmup 0 2>&1 | grep -o "conns_per_s=[0-9.]*\|p50_ns=[0-9]*" | tr '\n' ' '; echo " $1"
kill $SP 2>/dev/null; wait $SP 2>/dev/null; pkill -x canald
