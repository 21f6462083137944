#!/bin/bash
# python3 -m http.server (socketserver: poll) under canal, native clients, one connection
# per request: canald's voluntary context switches and CPU per request; requests/s.
B=${B:-target/release}; S=/tmp/crd/a.sock; PORT=$((30000 + RANDOM % 5000))
pkill -x canald; sleep 0.2
$B/canald --socket $S >/dev/null 2>&1 & CD=$!; sleep 0.4
$B/canal run --socket $S -- python3 -m http.server --directory /tmp/www --bind 127.0.0.1 $PORT >/dev/null 2>&1 & sleep 2
python3 - $PORT $CD <<'PY'
import http.client, sys, time
port, cd = int(sys.argv[1]), int(sys.argv[2])
def vcs():
    import os
    n=0
    for t in os.listdir(f"/proc/{cd}/task"):
        for l in open(f"/proc/{cd}/task/{t}/status"):
            if l.startswith("voluntary"): n+=int(l.split()[1])
    return n
def cpu():
    f=open(f"/proc/{cd}/stat").read().split(")")[1].split()
    return int(f[11])+int(f[12])
def get():
    c=http.client.HTTPConnection("127.0.0.1",port,timeout=10); c.request("GET","/"); r=c.getresponse(); r.read(); c.close()
get()
v0,c0,t0=vcs(),cpu(),time.monotonic()
N=2000
for _ in range(N): get()
t=time.monotonic()-t0
print(f"requests/s {N/t:.0f} canald wakes/request {(vcs()-v0)/N:.2f} canald cpu ticks {cpu()-c0}")
PY
pkill -f "http.server --bind 127.0.0.1 $PORT"; pkill -x canald
