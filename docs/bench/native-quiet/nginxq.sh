#!/bin/bash
# nginx (epoll; WORKERS workers, EPOLLEXCLUSIVE listeners when more than one) under canal
# (B=build dir) or natively (B=kernel); native clients with ab, a connection per request.
# Prints: system requests/s, canald wakes/request.
B=$1; WORKERS=${WORKERS:-1}; N=${N:-3000}; S=/tmp/crd/a.sock; PORT=$((30000 + RANDOM % 5000))
D=$(mktemp -d); cat > $D/nginx.conf <<CONF
daemon off; worker_processes $WORKERS; pid $D/pid; error_log $D/err crit;
events { worker_connections 1024; }
http { access_log off; client_body_temp_path $D; proxy_temp_path $D; fastcgi_temp_path $D; uwsgi_temp_path $D; scgi_temp_path $D;
 server { listen 127.0.0.1:$PORT; root /tmp/www; } }
CONF
pkill -x canald; sleep 0.2
if [ "$B" = kernel ]; then
  nginx -c $D/nginx.conf -p $D & NG=$!
else
  $B/canald --socket $S >/dev/null 2>&1 & CD=$!; sleep 0.4
  $B/canal run --socket $S -- nginx -c $D/nginx.conf -p $D & NG=$!
fi
sleep 1.5
curl -s -o /dev/null http://127.0.0.1:$PORT/index.html
vcs() { [ -z "$CD" ] && { echo 0; return; }; cat /proc/$CD/task/*/status | awk '/^voluntary/ {n+=$2} END {print n}'; }
v0=$(vcs)
rps=$(ab -q -n $N -c 1 http://127.0.0.1:$PORT/index.html 2>/dev/null | awk '/Requests per second/ {print $4}')
v1=$(vcs)
echo "$B workers=$WORKERS rps $rps canald-wakes/req $(python3 -c "print(round(($v1-$v0)/$N,2))")"
kill $NG 2>/dev/null; sleep 0.3; pkill -f "nginx -c $D" ; pkill -x canald; rm -rf $D
