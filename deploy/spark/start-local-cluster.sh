#!/bin/sh
# Start a Spark standalone master and one worker on loopback, from the spark-class shipped inside the
# pyspark package (no separate Spark download). For trying `trimq-audit --master spark://...` on one
# machine, and for the cluster test; a real cluster runs the same two classes on its own hosts.
#
#   deploy/spark/start-local-cluster.sh            # master spark://127.0.0.1:7077, a worker with 2 cores, 2g
#   SPARK_MASTER_PORT=17077 WORKER_CORES=1 deploy/spark/start-local-cluster.sh
#   SPARK_MASTER_PORT=0 deploy/spark/start-local-cluster.sh  # any free port, bound by the master itself
#   deploy/spark/stop-local-cluster.sh             # stops both (by the PIDs recorded below)
#
# Settings (environment):
#   PYTHON             the Python whose pyspark to use      (default: .venv/bin/python, else python3)
#   SPARK_MASTER_PORT  master RPC port; 0 = any free one    (default 7077)
#   WORKER_CORES       cores the worker offers              (default 2)
#   WORKER_MEMORY      memory the worker offers             (default 2g)
#   STATE_DIR          pid files, logs and the worker dir   (default ${TMPDIR:-/tmp}/trimq-spark-cluster)
#   START_TIMEOUT_S    seconds each daemon gets to come up  (default 60)
# It prints the master URL on success; exits 1 if either process does not come up in time.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
if [ -z "${PYTHON:-}" ]; then
    if [ -x "$repo/.venv/bin/python" ]; then PYTHON="$repo/.venv/bin/python"; else PYTHON=python3; fi
fi
PORT=${SPARK_MASTER_PORT:-7077}
CORES=${WORKER_CORES:-2}
MEMORY=${WORKER_MEMORY:-2g}
STATE=${STATE_DIR:-${TMPDIR:-/tmp}/trimq-spark-cluster}
# Digits only, leading zeros dropped ("08" is not octal here; "0" and "00" leave nothing, so are refused).
TIMEOUT=$(printf '%s' "${START_TIMEOUT_S:-60}" | sed -n 's/^0*\([1-9][0-9]*\)$/\1/p')
if [ -z "$TIMEOUT" ]; then
    echo "START_TIMEOUT_S must be a whole number of seconds > 0, got '${START_TIMEOUT_S}'" >&2
    exit 2
fi

# The pip-installed Spark: a stale SPARK_HOME would win over it, so set it to the package directory.
SPARK_HOME=$("$PYTHON" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')
export SPARK_HOME
export SPARK_LOCAL_IP=127.0.0.1           # loopback only, no reverse DNS
export SPARK_LOG_DIR="$STATE/logs"
export SPARK_WORKER_DIR="$STATE/work"
export PYSPARK_PYTHON="${PYSPARK_PYTHON:-$PYTHON}"
mkdir -p "$STATE/logs" "$STATE/work" "$STATE/conf"
if [ -z "${SPARK_CONF_DIR:-}" ]; then
    # Errors only, except the daemons' own lifecycle lines (what this script waits for).
    cat >"$STATE/conf/log4j2.properties" <<'CONF'
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{yy/MM/dd HH:mm:ss} %p %c{1}: %m%n%ex
logger.deploy.name = org.apache.spark.deploy
logger.deploy.level = info
CONF
    export SPARK_CONF_DIR="$STATE/conf"
fi

for name in master worker; do
    if [ -f "$STATE/$name.pid" ] && kill -0 "$(cat "$STATE/$name.pid")" 2>/dev/null; then
        echo "a $name is already running (pid $(cat "$STATE/$name.pid")); run stop-local-cluster.sh first" >&2
        exit 1
    fi
done

wait_for() {  # wait_for LOGFILE PATTERN PID
    i=0
    while [ $i -lt $((TIMEOUT * 10)) ]; do
        if grep -q "$2" "$1" 2>/dev/null; then return 0; fi
        if ! kill -0 "$3" 2>/dev/null; then echo "process $3 exited; see $1" >&2; return 1; fi
        sleep 0.1
        i=$((i + 1))
    done
    echo "timed out after ${TIMEOUT} s waiting for '$2' in $1" >&2
    return 1
}

"$SPARK_HOME/bin/spark-class" org.apache.spark.deploy.master.Master \
    --host 127.0.0.1 --port "$PORT" --webui-port 0 >"$STATE/logs/master.log" 2>&1 &
echo $! >"$STATE/master.pid"
trap 'echo "start-local-cluster: failed; stopping what started" >&2; STATE_DIR="$STATE" "$here/stop-local-cluster.sh"' EXIT
wait_for "$STATE/logs/master.log" "I have been elected leader" "$(cat "$STATE/master.pid")"
# The port the master bound (the one asked for, or the kernel's pick for 0), from its own start line.
PORT=$(sed -n 's|.*Starting Spark master at spark://127\.0\.0\.1:\([0-9][0-9]*\).*|\1|p' "$STATE/logs/master.log" | head -n 1)
if [ -z "$PORT" ]; then
    echo "no 'Starting Spark master at' line in $STATE/logs/master.log" >&2
    exit 1
fi

"$SPARK_HOME/bin/spark-class" org.apache.spark.deploy.worker.Worker \
    --host 127.0.0.1 --cores "$CORES" --memory "$MEMORY" --webui-port 0 --work-dir "$STATE/work" \
    "spark://127.0.0.1:$PORT" >"$STATE/logs/worker.log" 2>&1 &
echo $! >"$STATE/worker.pid"
wait_for "$STATE/logs/worker.log" "Successfully registered with master" "$(cat "$STATE/worker.pid")"

trap - EXIT
echo "spark://127.0.0.1:$PORT"
