#!/bin/sh
# Stop the master and worker started by start-local-cluster.sh (by their recorded PIDs; nothing else).
# Settings: STATE_DIR as for start-local-cluster.sh.
set -u
STATE=${STATE_DIR:-${TMPDIR:-/tmp}/trimq-spark-cluster}
status=0
for name in worker master; do
    pidfile="$STATE/$name.pid"
    [ -f "$pidfile" ] || continue
    pid=$(cat "$pidfile")
    if kill -0 "$pid" 2>/dev/null; then
        kill "$pid"
        i=0
        while kill -0 "$pid" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
        if kill -0 "$pid" 2>/dev/null; then kill -9 "$pid" 2>/dev/null || status=1; fi
    fi
    rm -f "$pidfile"
done
exit $status
