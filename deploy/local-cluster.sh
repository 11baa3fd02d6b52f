#!/usr/bin/env bash
# A trimq cluster on loopback for development: a name server, two brokers (broker-a, broker-b), each with a
# slave when TRIMQ_CLUSTER_SLAVES=1 (master/slave pairs, docs/OPERATIONS.md "High availability"), and N
# consumers of one group (trimq-consumer), on free ports, with everything under a state directory.
#
#   deploy/local-cluster.sh up [N]    start them (N consumers, default 2); prints the addresses
#   deploy/local-cluster.sh status    which of the recorded processes still run, and where
#   deploy/local-cluster.sh down      stop exactly the recorded processes (SIGTERM, then SIGKILL)
#
# The PIDs are recorded in STATE/pids with each process's start time, and `down` signals a PID only if it
# still is that process (a PID reused by something else is left alone). Nothing is ever killed by name.
#
# Environment (all optional):
#   TRIMQ_CLUSTER_DIR           state directory (default: .local-cluster in the repository)
#   TRIMQ_BIN                   directory of the trimq-* tools (default: the repository's .venv/bin, else PATH)
#   TRIMQ_CLUSTER_TOPIC         topic the consumers subscribe to (default ClusterTopic)
#   TRIMQ_CLUSTER_GROUP         their consumer group (default cluster_group)
#   TRIMQ_CLUSTER_QUEUES        create the topic with this many queues per broker first (default 4; 0 = don't)
#   TRIMQ_CLUSTER_ORDERLY       1 = orderly consumers (queue locks)
#   TRIMQ_CLUSTER_SLAVES        1 = a slave for each broker (broker-a-s, broker-b-s: brokerId 1, same broker name,
#                               learning its master from the name server)
#   TRIMQ_CLUSTER_MASTER_ROLE   async_master (default) or sync_master: the masters' role when there are slaves
#   TRIMQ_CLUSTER_START_TIMEOUT seconds to wait for each daemon to serve (default 30)
#   TRIMQ_CLUSTER_STOP_TIMEOUT  seconds to wait for each process after SIGTERM before SIGKILL (default 30)
#   TRIMQ_BROKER_*, TRIMQ_NAMESRV_*, TRIMQ_CLIENT_*  any setting (docs/CONFIGURATION.md) of the brokers, the
#                               name server, the consumers, e.g. TRIMQ_BROKER_FLUSH_DISK_TYPE=SYNC_FLUSH
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
STATE=${TRIMQ_CLUSTER_DIR:-$ROOT/.local-cluster}
if [[ -n "${TRIMQ_BIN:-}" ]]; then
    BIN=$TRIMQ_BIN
elif [[ -x "$ROOT/.venv/bin/trimq-broker" ]]; then
    BIN=$ROOT/.venv/bin
else
    BIN=$(dirname "$(command -v trimq-broker)")
fi
PY=$BIN/python
[[ -x "$PY" ]] || PY=$(command -v python3)
TOPIC=${TRIMQ_CLUSTER_TOPIC:-ClusterTopic}
GROUP=${TRIMQ_CLUSTER_GROUP:-cluster_group}
QUEUES=${TRIMQ_CLUSTER_QUEUES:-4}
START_TIMEOUT=${TRIMQ_CLUSTER_START_TIMEOUT:-30}
STOP_TIMEOUT=${TRIMQ_CLUSTER_STOP_TIMEOUT:-30}
PIDS=$STATE/pids
ADDRS=$STATE/addresses
# Small commit-log segments unless asked otherwise: a development cluster needs no 1 GiB files.
export TRIMQ_BROKER_MAPPED_FILE_SIZE_COMMIT_LOG=${TRIMQ_BROKER_MAPPED_FILE_SIZE_COMMIT_LOG:-67108864}

die() { echo "local-cluster: $*" >&2; exit 1; }
say() { echo "local-cluster: $*"; }

# Start time of a process in clock ticks since boot (field 22 of /proc/PID/stat, counted after the
# command name, which may hold spaces); empty when there is no such process.
start_time() {
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
    stat=${stat##*) }
    # shellcheck disable=SC2086
    set -- $stat
    echo "${20}"
}

# Is PID running (not gone, not a zombie waiting to be reaped)?
running() {
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    stat=${stat##*) }
    [[ "${stat:0:1}" != "Z" ]]
}

# Is PID the recorded process, still running (a zombie has finished: it only waits to be reaped)?
alive() {
    [[ "$(start_time "$1")" == "$2" ]] && running "$1"
}

# A free TCP port on 127.0.0.1 (for the metrics endpoints, which need a fixed port: 0 means off).
free_port() {
    "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

record() { # name pid
    echo "$1 $2 $(start_time "$2")" >> "$PIDS"
}

launch() { # name logfile command...
    local name=$1 logfile=$2
    shift 2
    nohup "$@" > "$logfile" 2>&1 < /dev/null &
    local pid=$!
    record "$name" "$pid"
    echo "$pid"
}

wait_for() { # what pid test-command...
    local what=$1 pid=$2
    shift 2
    local deadline=$((SECONDS + START_TIMEOUT))
    until "$@"; do
        running "$pid" || die "$what exited during start-up; see its log in $STATE/logs"
        ((SECONDS < deadline)) || die "$what did not start within ${START_TIMEOUT}s; see $STATE/logs"
        sleep 0.1
    done
}

namesrv_address() { # log file -> the address of the namesrv.started event
    "$PY" - "$1" <<'EOF'
import json, sys
for line in open(sys.argv[1], errors="replace"):
    try:
        event = json.loads(line)
    except ValueError:
        continue
    if event.get("event") == "namesrv.started":
        print(event["address"])
        break
EOF
}

running_count() {
    local n=0 name pid started
    [[ -f "$PIDS" ]] || { echo 0; return; }
    while read -r name pid started; do
        if alive "$pid" "$started"; then n=$((n + 1)); fi
    done < "$PIDS"
    echo "$n"
}

cmd_up() {
    local consumers=${1:-2}
    [[ "$consumers" =~ ^[0-9]+$ ]] || die "N must be a number of consumers, got '$consumers'"
    [[ -x "$BIN/trimq-broker" ]] || die "no trimq-broker in $BIN (set TRIMQ_BIN)"
    if [[ -f "$PIDS" ]]; then
        if [[ $(running_count) -gt 0 ]]; then
            die "already up ($(running_count) processes recorded in $PIDS); run '$0 down' first"
        fi
        rm -f "$PIDS"
    fi
    mkdir -p "$STATE/logs"
    : > "$PIDS"
    : > "$ADDRS"
    # If anything below fails (or the script is interrupted), stop what was started so far.
    trap 'rc=$?; trap - EXIT; if ((rc)); then echo "local-cluster: start-up failed, stopping what was started" >&2; cmd_down >&2 || true; fi; exit $rc' EXIT
    trap 'exit 130' INT TERM

    local ns_metrics pid ns_log ns_addr
    ns_metrics=$(free_port)
    ns_log=$STATE/logs/namesrv.log
    pid=$(launch namesrv "$ns_log" "$BIN/trimq-namesrv" --listen 127.0.0.1:0 --metrics-port "$ns_metrics" \
        --log-format json --log-level info)
    wait_for "the name server" "$pid" grep -q '"namesrv.started"' "$ns_log"
    ns_addr=$(namesrv_address "$ns_log")
    echo "namesrv $ns_addr metrics=127.0.0.1:$ns_metrics" >> "$ADDRS"

    local b store metrics
    for b in a b; do
        store=$STATE/broker-$b
        mkdir -p "$store"
        rm -f "$store/broker.addr"
        metrics=$(free_port)
        pid=$(launch "broker-$b" "$STATE/logs/broker-$b.log" "$BIN/trimq-broker" --listen 127.0.0.1:0 \
            --store "$store" --broker-name "broker-$b" --namesrv "$ns_addr" --metrics-port "$metrics" \
            --role "${TRIMQ_CLUSTER_MASTER_ROLE:-async_master}" --log-format json --log-level info)
        wait_for "broker-$b" "$pid" test -s "$store/broker.addr"
        echo "broker-$b $(cat "$store/broker.addr") metrics=127.0.0.1:$metrics store=$store" >> "$ADDRS"
        if [[ "${TRIMQ_CLUSTER_SLAVES:-0}" == 1 ]]; then
            # Its slave: same broker name, brokerId 1; it learns its master's HA address from the name server.
            store=$STATE/broker-$b-s
            mkdir -p "$store"
            rm -f "$store/broker.addr"
            metrics=$(free_port)
            pid=$(launch "broker-$b-s" "$STATE/logs/broker-$b-s.log" "$BIN/trimq-broker" --listen 127.0.0.1:0 \
                --store "$store" --broker-name "broker-$b" --namesrv "$ns_addr" --role slave --broker-id 1 \
                --metrics-port "$metrics" --log-format json --log-level info)
            wait_for "broker-$b-s" "$pid" test -s "$store/broker.addr"
            echo "broker-$b-s $(cat "$store/broker.addr") metrics=127.0.0.1:$metrics store=$store slave-of=broker-$b" \
                >> "$ADDRS"
        fi
    done

    if [[ "$QUEUES" != 0 && -x "$BIN/trimq-producer" ]]; then
        # Create the topic on both brokers (and wait for the route) so the consumers find it at once.
        if ! "$BIN/trimq-producer" --namesrv "$ns_addr" --topic "$TOPIC" --count 0 --queues "$QUEUES" \
            --log-format json --log-level error > "$STATE/logs/create-topic.log" 2>&1 < /dev/null; then
            say "warning: could not create topic $TOPIC (see $STATE/logs/create-topic.log); the consumers wait for it"
        fi
    fi

    local i args
    for ((i = 1; i <= consumers; i++)); do
        args=(--namesrv "$ns_addr" --group "$GROUP" --topic "$TOPIC" --instance-name "c$i" --from first --quiet
              --log-format json --log-level info)
        [[ "${TRIMQ_CLUSTER_ORDERLY:-0}" == 1 ]] && args+=(--orderly)
        pid=$(launch "consumer-$i" "$STATE/logs/consumer-$i.log" "$BIN/trimq-consumer" "${args[@]}")
        echo "consumer-$i group=$GROUP topic=$TOPIC" >> "$ADDRS"
    done
    # They start in parallel; wait until each one has joined its group.
    local name started
    while read -r name pid started; do
        [[ "$name" == consumer-* ]] || continue
        wait_for "$name" "$pid" grep -qE '"(consumer.cli_started|push_consumer.started)"' "$STATE/logs/$name.log"
    done < "$PIDS"
    trap - EXIT INT TERM
    local pairs=""
    [[ "${TRIMQ_CLUSTER_SLAVES:-0}" == 1 ]] && pairs=" with a slave each"
    say "up: name server, 2 brokers$pairs, $consumers consumers (state in $STATE)"
    cat "$ADDRS"
    say "send messages: $BIN/trimq-producer --namesrv $ns_addr --topic $TOPIC --count 1000"
}

cmd_down() {
    if [[ ! -f "$PIDS" ]]; then
        say "nothing to stop ($PIDS does not exist)"
        return 0
    fi
    local -a names=() pids=() starts=()
    local name pid started i
    while read -r name pid started; do
        [[ -n "$pid" ]] || continue
        names+=("$name"); pids+=("$pid"); starts+=("$started")
    done < "$PIDS"
    # Consumers first (they commit offsets and unlock), then the brokers, the name server last.
    for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
        if alive "${pids[i]}" "${starts[i]}"; then
            kill -TERM "${pids[i]}" 2>/dev/null || true
            local deadline=$((SECONDS + STOP_TIMEOUT))
            while alive "${pids[i]}" "${starts[i]}" && ((SECONDS < deadline)); do sleep 0.1; done
            if alive "${pids[i]}" "${starts[i]}"; then
                say "${names[i]} (pid ${pids[i]}) did not stop within ${STOP_TIMEOUT}s: SIGKILL"
                kill -KILL "${pids[i]}" 2>/dev/null || true
                deadline=$((SECONDS + 10))
                while alive "${pids[i]}" "${starts[i]}" && ((SECONDS < deadline)); do sleep 0.1; done
            fi
            say "stopped ${names[i]} (pid ${pids[i]})"
        fi
    done
    local left=0
    for ((i = 0; i < ${#pids[@]}; i++)); do
        if alive "${pids[i]}" "${starts[i]}"; then
            say "still running: ${names[i]} (pid ${pids[i]})"
            left=$((left + 1))
        fi
    done
    if ((left)); then
        return 1
    fi
    rm -f "$PIDS"
    say "down (logs and stores kept in $STATE)"
}

cmd_status() {
    if [[ ! -f "$PIDS" ]]; then
        say "not up ($PIDS does not exist)"
        return 3
    fi
    local name pid started running=0 total=0 where
    while read -r name pid started; do
        [[ -n "$pid" ]] || continue
        total=$((total + 1))
        where=$(grep "^$name " "$ADDRS" 2>/dev/null | cut -d' ' -f2- || true)
        if alive "$pid" "$started"; then
            running=$((running + 1))
            printf '%-12s pid %-8s running  %s\n' "$name" "$pid" "$where"
        else
            printf '%-12s pid %-8s stopped  %s\n' "$name" "$pid" "$where"
        fi
    done < "$PIDS"
    say "$running of $total running"
    ((running == total))
}

case "${1:-}" in
    up) shift; cmd_up "$@" ;;
    down) cmd_down ;;
    status) cmd_status ;;
    *) echo "usage: $0 up [N consumers] | down | status" >&2; exit 2 ;;
esac
