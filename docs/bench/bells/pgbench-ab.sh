#!/bin/bash
# The PostgreSQL A/B of docs/bench/bells/README.md: one pgbench run in one mode.
#   pgbench-ab.sh native|both|srv|cli   (CANALD_ARGS="--bells off", SECS=5, PGARGS="-S"; PGARGS=" " for TPC-B)
# Needs postgresql (the `postgres` user), run as root; state in /tmp/pgx.
set -e
mkdir -p /tmp/pgx/c && chown postgres /tmp/pgx /tmp/pgx/c && chmod 700 /tmp/pgx/c
B=${CANAL:-$(cd "$(dirname "$0")/../../.." && pwd)/target/release/canal}
P=/usr/lib/postgresql/15/bin
AS="setpriv --reuid=postgres --regid=postgres --clear-groups"
D=/tmp/pgx/data
if [ ! -d $D ]; then chown postgres /tmp/pgx; $AS $P/initdb -D $D -A trust -U postgres --no-sync >/dev/null; fi
export CANAL_SOCKET=/tmp/pgx/c/canald.sock
mode=$1
pre_s=""; pre_c=""
if [ $mode != native ]; then
  $AS $B daemon --socket $CANAL_SOCKET ${CANALD_ARGS} > /tmp/pgx/canald.log 2>&1 & DPID=$!
  sleep 0.5
  [ $mode = both -o $mode = srv ] && pre_s="$B run --socket $CANAL_SOCKET --"
  [ $mode = both -o $mode = cli ] && pre_c="$B run --socket $CANAL_SOCKET --"
fi
$AS $pre_s $P/postgres -D $D -p 55432 -k /tmp/pgx -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=40 > /tmp/pgx/pg.log 2>&1 & SPID=$!
for i in $(seq 50); do $AS $P/psql -h 127.0.0.1 -p 55432 -U postgres -d postgres -Atc 'select 1' >/dev/null 2>&1 && break; sleep 0.2; done
[ -f /tmp/pgx/inited ] || { $AS $P/pgbench -h 127.0.0.1 -p 55432 -U postgres -i -s 1 -q postgres >/dev/null 2>&1; touch /tmp/pgx/inited; }
if [ "$2" = perf ]; then perf record -a -g -o /tmp/pgx/perf.data -- sleep 5 >/dev/null 2>&1 & PP=$!; fi
$AS $pre_c $P/pgbench -h 127.0.0.1 -p 55432 -U postgres -c 8 -j 2 -T ${SECS:-5} ${PGARGS--S} postgres 2>&1 | grep -E "^tps" | sed "s/^/$mode /"
[ -n "$PP" ] && wait $PP
kill -INT $SPID; wait $SPID 2>/dev/null || true
[ -n "$DPID" ] && { kill $DPID; wait $DPID 2>/dev/null || true; }
