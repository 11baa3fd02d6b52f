"""Key scope vs queue scope (issue 17 item 6): what per-key order with parallelism inside a queue buys.

    python -m bench.key_scope [--scale 1.0] [--rows NAME,...] [--results DIR]

The shared workload's shape (``../shared/bench/peers``: 8 queues, 1000 sharding keys, 256 B bodies, the harness's
payload with its send timestamp, per-key sequence numbers and recorder), two consumer processes in one group, and
a listener that does the work of one message:

* ``sleep10``: an I/O-bound service, 10 ms per message (``async def`` awaiting ``trio.sleep``; ``sync``: a plain
  ``def`` calling ``time.sleep`` in a worker thread);
* ``burn1``: 1 ms of CPU per message (a plain ``def`` spinning on its thread's CPU clock): bound by the GIL, about
  1000 msg/s per process whatever the scope.

Rows (each a fresh topic and group on one ``trimq-broker --embedded-namesrv``, ASYNC_FLUSH; consumers pull
``--pull-batch`` and hand one message per listener call):

* ``queue-sleep10``: ``order_scope="queue"`` (RocketMQ's orderly consumer): one message of a queue at a time,
  so 8 queues x 100 msg/s at best;
* ``key-sleep10-128``: ``order_scope="key"``, ``max_in_flight_keys=128`` per consumer (the issue's target: >= 20x
  queue scope); ``key-sleep10-128-backlog``: the same consumers draining what the producer stored before they
  started (no producer competing for the CPU; its latency is the backlog's); ``key-sleep10-default``: the default
  ``max_in_flight_keys`` (64); ``key-sleep10-sync``: a plain
  ``def`` listener with the defaults (``consume_thread_max`` 20 threads: at most ~5x);
* ``queue-burn1`` / ``key-burn1``: the CPU-bound listener in both scopes;
* ``redis-sleep10`` / ``redis-burn1``: Redis Streams (the harness's server and producer, AOF everysec) with the
  same listener: each consumer reads each of its 4 streams in its own asyncio task (XREADGROUP, the listener
  per message, XACK per batch) — per-stream order, Redis's equivalent of queue scope.

The producer sends flat out (live mode: consumers ready first, pulling from the moment the whole group holds its
queues), so the queue-scope rows build a backlog: their latency is mostly waiting in it. Reported per row: consume
msg/s (received / (last - first receive)), p50/p99
end-to-end latency (send timestamp to listener done), per-key order violations (must be 0), lost and duplicated
messages, and the ratio to ``queue-sleep10``. ``bench/results/key_scope.json``; the first printed line sums up.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import shutil
import subprocess
import sys
import time
from array import array
from typing import Any

from bench.harness import REPO, RESULTS, load_harness
from bench.own_redis import start_harness_redis
from bench.peer_trimq import broker_env, start_broker_on_own_port
from bench.stop_signals import kill_children, raise_on_stop_signals, start_recorded

common = load_harness()

HOST = "127.0.0.1"
QUEUES = 8
KEYS = 1000
CONSUMERS = 2

#: name -> (system, scope, listener, max_in_flight_keys or None for the default, messages at --scale 1, mode)
ROWS: dict[str, tuple[str, str, str, int | None, int, str]] = {
    "queue-sleep10": ("trimq", "queue", "sleep10", None, 6_000, "live"),
    "key-sleep10-128": ("trimq", "key", "sleep10", 128, 40_000, "live"),
    "key-sleep10-128-backlog": ("trimq", "key", "sleep10", 128, 40_000, "backlog"),
    "key-sleep10-default": ("trimq", "key", "sleep10", None, 30_000, "live"),
    "key-sleep10-sync": ("trimq", "key", "sleep10-sync", None, 20_000, "live"),
    "queue-burn1": ("trimq", "queue", "burn1", None, 6_000, "live"),
    "key-burn1": ("trimq", "key", "burn1", 128, 6_000, "live"),
    "redis-sleep10": ("redis", "stream", "sleep10", None, 6_000, "live"),
    "redis-burn1": ("redis", "stream", "burn1", None, 6_000, "live"),
}


def log(msg: str) -> None:
    print(f"-- {msg}", flush=True)


def burn_cpu(seconds: float) -> None:
    """Spin until this thread has used ``seconds`` of CPU."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def workload_args(args: argparse.Namespace, messages: int) -> argparse.Namespace:
    """The harness's workload flags for ``messages`` messages."""
    ns = argparse.Namespace(queues=QUEUES, keys=KEYS, messages=messages, body=256, consumers=CONSUMERS, batch=100,
                            seed=42, consumer_idle_s=15.0, deadline_s=args.deadline_s, rate=0.0,
                            redis_appendfsync="everysec")
    return ns


# ---------------------------------------------------------------------------------------------- trimq roles

def role_consume(args: argparse.Namespace) -> None:
    import trio

    with open(os.path.join(args.outdir, "per_queue.json")) as f:
        per_queue = {int(q): n for q, n in json.load(f).items()}
    rec = common.Recorder(0)
    info: dict[str, Any] = {}
    err = None
    try:
        prof_dir = os.environ.get("TRIMQ_BENCH_PROFILE")  # diagnostics: the consumer's CPU profile
        if prof_dir:
            import cProfile

            prof = cProfile.Profile(time.process_time)
            try:
                prof.runcall(trio.run, _consume_trio, args, rec, per_queue, info)
            finally:
                os.makedirs(prof_dir, exist_ok=True)
                prof.dump_stats(os.path.join(prof_dir, f"consume{args.cid}-{os.getpid()}.prof"))
        else:
            trio.run(_consume_trio, args, rec, per_queue, info)
    except Exception as exc:  # record what we have
        err = repr(exc)
    rec.write(args.outdir, args.cid, dict(error=err, cpu_s=common.cpu_self(), **info))


async def _consume_trio(args: argparse.Namespace, rec: Any, per_queue: dict[int, int], info: dict[str, Any]) -> None:
    import trio

    from trimq.client import ConsumeOrderlyStatus, PushConsumer, PushConsumerConfig
    from trimq.runtime.logs import configure_logging

    configure_logging("json", "warning")
    kw: dict[str, Any] = {}
    if args.max_in_flight_keys:
        kw["max_in_flight_keys"] = args.max_in_flight_keys
    cfg = PushConsumerConfig(consumer_group=args.group, namesrv_addr=args.namesrv, instance_name=f"c{args.cid}",
                             consume_from_where="CONSUME_FROM_FIRST_OFFSET", order_scope=args.scope,
                             pull_batch_size=args.pull_batch, consume_message_batch_max_size=1, **kw)
    consumer = PushConsumer(cfg)
    consumer.subscribe(args.topic, "*")
    on_message = rec.on_message

    ok = ConsumeOrderlyStatus.SUCCESS
    if args.listener == "sleep10":
        async def listener(msgs: list[Any], context: Any) -> Any:
            await trio.sleep(0.01)
            for m in msgs:
                on_message(m.body)
            return ok
        consumer.register_message_listener_orderly(listener)
    else:
        work = (lambda: time.sleep(0.01)) if args.listener == "sleep10-sync" else (lambda: burn_cpu(0.001))
        lock = __import__("threading").Lock()

        def sync_listener(msgs: list[Any], context: Any) -> Any:
            work()
            with lock:  # the recorder is not thread-safe
                for m in msgs:
                    on_message(m.body)
            return ok
        consumer.register_message_listener_orderly(sync_listener)

    def held() -> list[int]:
        return sorted(mq.queue_id for mq, pq in consumer.process_queue_table().items()
                      if mq.topic == args.topic and pq.locked)

    # Pull nothing before the whole group holds its queues (a backlog would otherwise go to the first member, then
    # move): started suspended, resumed by _consume_steady, as bench.peer_trimq does.
    consumer.suspend()
    async with consumer:
        await _consume_steady(args, consumer, rec, per_queue, info, held)


async def _consume_steady(args: argparse.Namespace, consumer: Any, rec: Any, per_queue: dict[int, int],
                          info: dict[str, Any], held: Any) -> None:
    import trio

    assert consumer.core is not None and consumer.instance is not None
    share = QUEUES // CONSUMERS
    with trio.move_on_after(60):
        while True:
            ids = await consumer.instance.find_consumer_id_list(args.topic, args.group) or []
            if len(ids) >= CONSUMERS and len(held()) == share:
                break
            await trio.sleep(0.02)
    queues = held()
    info["queues"] = queues
    rec.expected = sum(per_queue.get(q, 0) for q in queues)
    common.touch(os.path.join(args.outdir, f"c{args.cid}.ready"))
    until = time.monotonic() + 30
    while time.monotonic() < until and not all(
            os.path.exists(os.path.join(args.outdir, f"c{c}.ready")) for c in range(CONSUMERS)):
        await trio.sleep(0.005)
    consumer.resume()
    end = time.monotonic() + args.deadline_s
    while time.monotonic() < end and not rec.done:
        await trio.sleep(0.02)
        if rec.received and time.monotonic() - rec.last_activity > 15:
            info["stopped"] = "idle"
            break
    info["pull"] = dict(consumer.core.pull_service.stats)


def role_produce(args: argparse.Namespace) -> None:
    import trio

    wargs = workload_args(args, args.messages)
    work = common.gen_workload(wargs)
    maker = common.PayloadMaker(wargs)
    res = trio.run(_produce_trio, args, work, maker)
    common.write_json(os.path.join(args.outdir, "producer.json"), res)


async def _produce_trio(args: argparse.Namespace, work: list[tuple[int, str, int, int]], maker: Any) -> dict[str, Any]:
    from trimq.client import Message, Producer, ProducerConfig
    from trimq.protocol.message import MessageConst
    from trimq.runtime.logs import configure_logging

    configure_logging("json", "warning")
    async with Producer(ProducerConfig(producer_group="ks_bench_producer", namesrv_addr=args.namesrv)) as producer:
        mqs = {mq.queue_id: mq for mq in await producer.message_queues(args.topic)}
        t0 = time.perf_counter()
        for i in range(0, len(work), 100):  # the harness's window: 100 messages, then wait for every answer
            by_q: dict[int, list[Any]] = {}
            for gid, key, seq, q in work[i:i + 100]:
                # the sharding key property, on the harness's queue (crc32(key) % 8, as the Redis peer routes)
                by_q.setdefault(q, []).append(Message(args.topic, maker.make(gid, key, seq),
                                                      properties={MessageConst.SHARDING_KEY: key}))
            await producer.send_batches([(msgs, mqs[q]) for q, msgs in by_q.items()])
        return {"sent": len(work), "seconds": time.perf_counter() - t0}


# ---------------------------------------------------------------------------------------------- redis roles

def _redis_module(args: argparse.Namespace) -> Any:
    """The harness's peer_redis, on this run's own port (another benchmark may use its fixed one meanwhile)."""
    import peer_redis

    if args.redis_port:
        peer_redis.PORT = args.redis_port
    return peer_redis


def role_redis_consume(args: argparse.Namespace) -> None:
    queues = common.owned_queues(args.cid, CONSUMERS, QUEUES)
    wargs = workload_args(args, args.messages)
    rec = common.Recorder(common.expected_for(wargs, queues))
    err = None
    try:
        asyncio.run(_redis_consume(args, queues, rec))
    except Exception as exc:
        err = repr(exc)
    rec.write(args.outdir, args.cid, dict(error=err, cpu_s=common.cpu_self(), queues=queues))


async def _redis_consume(args: argparse.Namespace, queues: list[int], rec: Any) -> None:
    import redis.asyncio as aioredis

    peer_redis = _redis_module(args)
    r = aioredis.Redis(host=peer_redis.HOST, port=peer_redis.PORT, decode_responses=False)
    name = f"c{args.cid}"

    async def work() -> None:
        if args.listener == "sleep10":
            await asyncio.sleep(0.01)
        else:
            burn_cpu(0.001)

    async def one_stream(q: int) -> None:
        s = peer_redis.stream(q)
        while not rec.done and time.monotonic() < deadline:
            if rec.received and time.monotonic() - rec.last_activity > 15:
                return
            resp: Any = await r.xreadgroup(peer_redis.GROUP, name, {s: ">"}, count=100, block=1000)
            for _, entries in resp or ():
                ids = []
                for eid, fields in entries:
                    await work()
                    rec.on_message(fields[b"d"])
                    ids.append(eid)
                if ids:
                    await r.xack(s, peer_redis.GROUP, *ids)

    deadline = time.monotonic() + args.deadline_s
    common.touch(os.path.join(args.outdir, f"c{args.cid}.ready"))
    await asyncio.gather(*(one_stream(q) for q in queues))
    await r.aclose()


def role_redis_produce(args: argparse.Namespace) -> None:
    peer_redis = _redis_module(args)
    wargs = workload_args(args, args.messages)
    res = asyncio.run(peer_redis.produce(wargs, common.gen_workload(wargs), common.PayloadMaker(wargs)))
    common.write_json(os.path.join(args.outdir, "producer.json"), res)


# ---------------------------------------------------------------------------------------------- orchestration

def _spawn(args: argparse.Namespace, role: str, outdir: str, extra: list[str]) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "bench.key_scope", "--role", role, "--outdir", outdir,
           "--deadline-s", str(args.deadline_s), *extra]
    cid = extra[extra.index("--cid") + 1] if "--cid" in extra else ""
    out = open(os.path.join(outdir, f"{role}{cid}.log"), "ab")  # noqa: SIM115 - the child's, closed with it
    return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=str(REPO))


def _wait_ready(outdir: str, procs: list[subprocess.Popen[bytes]], timeout: float = 90) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if all(os.path.exists(os.path.join(outdir, f"c{c}.ready")) for c in range(CONSUMERS)):
            return True
        if any(p.poll() is not None for p in procs):
            return False
        time.sleep(0.05)
    return False


def _stop(p: subprocess.Popen[bytes], timeout: float) -> int | str:
    try:
        return p.wait(timeout)
    except subprocess.TimeoutExpired:
        p.kill()  # our own child, by PID
        p.wait(5)
        return "killed-timeout"


def _pct(vals: list[int], q: float) -> float | None:
    if not vals:
        return None
    return vals[min(len(vals) - 1, max(0, round(q * (len(vals) - 1))))] / 1e6


def collect(outdir: str, messages: int) -> dict[str, Any]:
    gids: array[int] = array("I")
    lats: array[int] = array("q")
    cons = []
    for c in range(CONSUMERS):
        try:
            with open(os.path.join(outdir, f"c{c}.json")) as f:
                cons.append(json.load(f))
            with open(os.path.join(outdir, f"c{c}.gids"), "rb") as f:
                gids.frombytes(f.read())
            with open(os.path.join(outdir, f"c{c}.lats"), "rb") as f:
                lats.frombytes(f.read())
        except OSError as exc:
            cons.append({"cid": c, "error": f"missing output: {exc}"})
    firsts = [c["first_ns"] for c in cons if c.get("first_ns")]
    lasts = [c["last_ns"] for c in cons if c.get("last_ns")]
    span = (max(lasts) - min(firsts)) / 1e9 if firsts and lasts else 0.0
    unique = len(set(gids))
    sl = sorted(lats)
    return {
        "messages": messages, "received": len(gids), "unique": unique, "lost": messages - unique,
        "dups": len(gids) - unique, "violations": sum(c.get("violations", 0) for c in cons),
        "consume_msgs_per_s": round(len(gids) / span, 1) if span > 0 else 0.0, "consume_span_s": round(span, 2),
        "p50_ms": _pct(sl, 0.5), "p99_ms": _pct(sl, 0.99),
        "consumers_cpu_s": round(sum(c.get("cpu_s", 0) for c in cons), 2),
        "consumers_cpu_us_per_msg": round(sum(c.get("cpu_s", 0) for c in cons) / max(1, len(gids)) * 1e6, 1),
        "errors": [c["error"] for c in cons if c.get("error")],
        "queues": [c.get("queues") for c in cons],
    }


def _trimq_setup(namesrv: str, topic: str) -> None:
    import trio

    async def go() -> None:
        from trimq.client.api import MQClientAPI
        from trimq.runtime.client import RemotingClient

        async with RemotingClient() as rc:
            api = MQClientAPI(rc)
            await api.create_topic(namesrv, topic, read_queue_nums=QUEUES, write_queue_nums=QUEUES)
            with trio.fail_after(30):
                while True:
                    try:
                        if len((await api.get_topic_route(namesrv, topic)).publish_queues(topic)) == QUEUES:
                            return
                    except Exception:
                        pass
                    await trio.sleep(0.05)

    trio.run(go)


def run_row(args: argparse.Namespace, name: str, workroot: str, broker: str | None) -> dict[str, Any]:
    system, scope, listener, mifk, base, mode = ROWS[name]
    messages = max(1000, int(base * args.scale))
    outdir = os.path.join(workroot, name)
    shutil.rmtree(outdir, ignore_errors=True)
    os.makedirs(outdir)
    row: dict[str, Any] = {"row": name, "system": system, "scope": scope, "listener": listener,
                           "max_in_flight_keys": mifk, "mode": mode}
    procs: list[subprocess.Popen[bytes]] = []  # the consumers
    producers: list[subprocess.Popen[bytes]] = []
    servers: list[Any] = []  # (server, port) of a Redis row
    try:
        if system == "redis":
            wargs = workload_args(args, messages)
            # on --redis-port, or on a free port checked to be served by it (bench.own_redis)
            peer_redis = _redis_module(args)
            _srv, port = start_recorded(servers, lambda: start_harness_redis(
                peer_redis, os.path.join(outdir, "redis"), wargs, args.redis_port))
            asyncio.run(peer_redis.setup(wargs))
            common_flags = ["--messages", str(messages), "--listener", listener, "--redis-port", str(port)]
            for c in range(CONSUMERS):
                start_recorded(procs, functools.partial(_spawn, args, "redis-consume", outdir,
                                                        ["--cid", str(c), *common_flags]))
            if not _wait_ready(outdir, procs):
                raise RuntimeError("redis consumers did not start")
            prod = start_recorded(producers, lambda: _spawn(args, "redis-produce", outdir, common_flags))
        else:
            assert broker is not None
            topic, group = f"KeyScope_{name.replace('-', '_')}", f"ks_{name.replace('-', '_')}"
            _trimq_setup(broker, topic)
            wargs = workload_args(args, messages)
            per_queue: dict[int, int] = {}
            for _g, _k, _s, q in common.gen_workload(wargs):
                per_queue[q] = per_queue.get(q, 0) + 1
            common.write_json(os.path.join(outdir, "per_queue.json"), {str(q): n for q, n in per_queue.items()})
            flags = ["--namesrv", broker, "--topic", topic, "--group", group, "--messages", str(messages)]
            cflags = [*flags, "--scope", scope, "--listener", listener, "--pull-batch", str(args.pull_batch)]
            if mifk:
                cflags += ["--max-in-flight-keys", str(mifk)]
            if mode == "backlog":  # everything stored first; the consumers start after the producer
                prod = start_recorded(producers, lambda: _spawn(args, "produce", outdir, flags))
                row["producer_rc"] = _stop(prod, args.deadline_s + 60)
            for c in range(CONSUMERS):
                start_recorded(procs, functools.partial(_spawn, args, "consume", outdir, ["--cid", str(c), *cflags]))
            if not _wait_ready(outdir, procs):
                raise RuntimeError("trimq consumers did not become ready")
            if mode != "backlog":
                prod = start_recorded(producers, lambda: _spawn(args, "produce", outdir, flags))
        if mode != "backlog":
            row["producer_rc"] = _stop(prod, args.deadline_s + 60)
        row["consumer_rc"] = [_stop(p, args.deadline_s + 60) for p in procs]
    except Exception as exc:
        row["error"] = repr(exc)
    finally:
        kill_children(procs + producers)
        for server, _port in servers:
            server.stop()
    row.update(collect(outdir, messages))
    try:
        with open(os.path.join(outdir, "producer.json")) as f:
            pr = json.load(f)
        row["produce_msgs_per_s"] = round(pr["sent"] / pr["seconds"], 1)
    except (OSError, KeyError, ZeroDivisionError):
        row["produce_msgs_per_s"] = None
    return row


def start_broker(workdir: str) -> tuple[Any, str]:
    """A broker with the bench's transfer settings on a port of its own; returns it and its address."""
    srv, port = start_broker_on_own_port(workdir, broker_env())
    return srv, f"{HOST}:{port}"


LABELS = {
    "queue-sleep10": "trimq, queue scope, async 10 ms",
    "key-sleep10-128": "trimq, key scope, async 10 ms, max_in_flight_keys 128",
    "key-sleep10-128-backlog": "trimq, key scope, async 10 ms, max_in_flight_keys 128, draining a backlog",
    "key-sleep10-default": "trimq, key scope, async 10 ms, defaults (64 keys)",
    "key-sleep10-sync": "trimq, key scope, def 10 ms, defaults (20 threads)",
    "queue-burn1": "trimq, queue scope, 1 ms CPU",
    "key-burn1": "trimq, key scope, 1 ms CPU, max_in_flight_keys 128",
    "redis-sleep10": "Redis Streams, a reader per stream, async 10 ms",
    "redis-burn1": "Redis Streams, a reader per stream, 1 ms CPU",
}


def report_lines(doc: dict[str, Any] | None) -> list[str]:
    """The REPORT.md section of ``key_scope.json`` (bench.run_all)."""
    if not doc or not doc.get("rows"):
        return []
    out = ["### Order per key: key scope vs queue scope (bench.key_scope; 8 queues, 1000 keys, 2 consumers, live)",
           "", "| row | messages | consume msg/s | vs queue scope | p50 / p99 ms | violations | lost | dups | "
           "consumer CPU µs/msg |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in doc["rows"]:
        def ms(v: Any) -> str:
            return "-" if v is None else f"{v:,.0f}"

        out.append(f"| {LABELS.get(r['row'], r['row'])} | {r.get('messages')} | {r.get('consume_msgs_per_s', 0):,.0f} "
                   f"| {r.get('vs_queue_sleep10')} | {ms(r.get('p50_ms'))} / {ms(r.get('p99_ms'))} | "
                   f"{r.get('violations')} | {r.get('lost')} | {r.get('dups')} | {r.get('consumers_cpu_us_per_msg')} |")
    out += ["", doc.get("summary", ""), ""]
    return out


def summary_line(rows: list[dict[str, Any]]) -> str:
    by = {r["row"]: r for r in rows}
    base = (by.get("queue-sleep10") or {}).get("consume_msgs_per_s")

    def ratio(name: str) -> str:
        v = (by.get(name) or {}).get("consume_msgs_per_s")
        return f"{v / base:.1f}x" if v and base else "-"

    return (f"key_scope: queue scope {base} msg/s with a 10 ms listener; key scope (max_in_flight_keys 128) "
            f"{ratio('key-sleep10-128')} (draining a backlog {ratio('key-sleep10-128-backlog')}), defaults "
            f"{ratio('key-sleep10-default')}, sync defaults "
            f"{ratio('key-sleep10-sync')}; violations {sum(r.get('violations', 0) for r in rows)}, lost "
            f"{sum(r.get('lost', 0) for r in rows)}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.key_scope", description=__doc__.split("\n\n")[0])
    p.add_argument("--role", choices=["consume", "produce", "redis-consume", "redis-produce"])
    p.add_argument("--outdir")
    p.add_argument("--cid", type=int, default=0)
    p.add_argument("--namesrv")
    p.add_argument("--topic")
    p.add_argument("--group")
    p.add_argument("--scope", default="queue")
    p.add_argument("--listener", default="sleep10")
    p.add_argument("--max-in-flight-keys", type=int, default=0)
    p.add_argument("--messages", type=int, default=6000)
    p.add_argument("--pull-batch", type=int, default=128, help="consumer pull_batch_size")
    p.add_argument("--redis-port", type=int, default=0, help="Redis rows: port (0: a free one)")
    p.add_argument("--deadline-s", type=float, default=180.0)
    p.add_argument("--scale", type=float, default=1.0, help="multiplies every row's message count")
    p.add_argument("--rows", default=",".join(ROWS), help="rows to run, comma-separated")
    p.add_argument("--workroot", default=f"/tmp/trimq-keyscope-bench-{os.getpid()}",
                   help="work directory (default: one per run, so two runs never share one)")
    p.add_argument("--results", default=str(RESULTS))
    args = p.parse_args(argv)
    roles = {"consume": role_consume, "produce": role_produce, "redis-consume": role_redis_consume,
             "redis-produce": role_redis_produce}
    if args.role:
        roles[args.role](args)
        return 0
    names = [n for n in args.rows.split(",") if n]
    unknown = [n for n in names if n not in ROWS]
    if unknown:
        p.error(f"unknown rows {unknown}; rows: {', '.join(ROWS)}")
    if any(ROWS[n][0] == "redis" for n in names) and not shutil.which("redis-server"):
        log("redis-server is not installed: the Redis rows are skipped (make bench installs it as root)")
        names = [n for n in names if ROWS[n][0] != "redis"]
    os.makedirs(args.workroot, exist_ok=True)
    rows: list[dict[str, Any]] = []
    servers: list[tuple[Any, str]] = []
    broker = None
    # a SIGTERM or hang-up ends the broker and the row's processes too (they lead no session of their own)
    with raise_on_stop_signals(SystemExit):
        try:
            if any(ROWS[n][0] == "trimq" for n in names):
                bdir = os.path.join(args.workroot, "broker")
                shutil.rmtree(bdir, ignore_errors=True)
                os.makedirs(bdir)
                _srv, broker = start_recorded(servers, lambda: start_broker(bdir))
            for name in names:
                t = time.monotonic()
                row = run_row(args, name, args.workroot, broker)
                row["wall_s"] = round(time.monotonic() - t, 1)
                rows.append(row)
                log(json.dumps({k: v for k, v in row.items() if k not in ("errors",)} | {"errors": row.get("errors")}))
        finally:
            for server, _addr in servers:
                server.stop()
    base = next((r.get("consume_msgs_per_s") for r in rows if r["row"] == "queue-sleep10"), None)
    for r in rows:
        v = r.get("consume_msgs_per_s")
        r["vs_queue_sleep10"] = round(v / base, 2) if v and base else None
    out = {"summary": summary_line(rows), "rows": rows, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
           "load_at_end": os.getloadavg()}
    os.makedirs(args.results, exist_ok=True)
    common.write_json(os.path.join(args.results, "key_scope.json"), out)
    print(out["summary"], flush=True)
    bad = [r["row"] for r in rows if r.get("violations") or r.get("lost") or r.get("error")]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
