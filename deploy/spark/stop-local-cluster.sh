#!/bin/sh
# Stop the master and worker started by start-local-cluster.sh (by their recorded PIDs; nothing else).
# Settings: STATE_DIR as for start-local-cluster.sh.
# Both get SIGTERM at once and are waited for together (each JVM takes ~2 s to run its shutdown hooks);
# whichever is still there after 10 s gets SIGKILL.
set -u
STATE=${STATE_DIR:-${TMPDIR:-/tmp}/trimq-spark-cluster}
status=0
pids=""
for name in worker master; do
    pidfile="$STATE/$name.pid"
    [ -f "$pidfile" ] || continue
    pid=$(cat "$pidfile")
    if kill -0 "$pid" 2>/dev/null && kill "$pid" 2>/dev/null; then pids="$pids $pid"; fi
done
i=0
while [ $i -lt 100 ]; do
    alive=""
    for pid in $pids; do
        if kill -0 "$pid" 2>/dev/null; then alive="$alive $pid"; fi
    done
    pids=$alive
    [ -z "$pids" ] && break
    sleep 0.1
    i=$((i + 1))
done
for pid in $pids; do
    kill -9 "$pid" 2>/dev/null || status=1
done
for name in worker master; do rm -f "$STATE/$name.pid"; done
exit $status
