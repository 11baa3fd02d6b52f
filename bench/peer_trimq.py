"""trimq as a peer of the shared ordered-workload benchmark (``../shared/bench/peers``).

Same interface as the harness's ``peer_redis.py`` (``add_args``, ``version``, ``start_server``, ``setup``,
``produce``, ``consume``; ``setup``/``produce``/``consume`` are asyncio coroutines that run the trio SDK in a
worker thread), so the same workload runs on trimq and on Redis Streams in one run (``bench.peer_bench``).

* Server: ``trimq-broker --embedded-namesrv`` on 127.0.0.1, ASYNC_FLUSH (fsync at least every 500 ms: the
  durability class of Redis ``appendfsync everysec``), a fresh store per run, stopped by PID.
* Topic ``Orders`` with ``--queues`` queues, created by UPDATE_AND_CREATE_TOPIC before the run.
* Producer: a real :class:`client.Producer`. Each window of ``--batch`` messages (the harness's "send 100,
  wait for 100 replies" barrier) is split by queue (``crc32(key) % queues``, order kept within each queue)
  and sent as one SEND_BATCH_MESSAGE per queue with ``Producer.send_batches`` (pipelined: all requests in
  one write, like the Redis peer's pipeline of XADDs); the next window starts when every batch of this one
  is acknowledged. Per-key order holds: a key always maps to one queue, and a window
  never starts before the previous one is stored.
* Consumers: real :class:`client.PushConsumer` processes in one group with an ``async def`` orderly
  listener. The group's rebalance (AVG strategy) splits the queues and the broker's queue locks keep one
  owner per queue; each consumer records which queues it got. A consumer starts with pulling paused and
  calls ``ready`` once the group has all its members and its share of queues is locked, then resumes —
  the steady-state benchmark measures consumption, not the first rebalance (``bench.takeover`` measures
  takeovers). The pull loops resume when every member is ready (the ``c*.ready`` files of the run).
* Diagnostics: ``TRIMQ_BENCH_SAMPLE=dir`` samples every process's CPU by stack (bench/sampler.py),
  ``TRIMQ_BENCH_PROFILE=dir`` runs them under cProfile (CPU time), ``TRIMQ_BENCH_GC=dir`` records their garbage
  collections (bench/gcstats.py), ``TRIMQ_BENCH_STEPS=dir`` counts their trio task steps and the CPU in each task
  (bench/taskstats.py), ``--trimq-stages 1`` records each message's
  per-stage timestamps (``stage_breakdown``).
* Pacing: the harness's ``--rate N`` (``common.Pacer``, as the Redis peer applies it): window ``i`` is due at
  ``t0 + i / rate`` and its messages carry that *scheduled* time, so a producer that falls behind shows as latency
  (no coordinated omission); the producer reports its ``pace_lag_s``.

Settings (ordinary user settings, not benchmark-only switches; see bench/RESULTS.md):
``pull_batch_size`` / ``consume_message_batch_max_size`` (``--trimq-pull-batch``, ``--trimq-consume-batch``)
and the broker's ``max_transfer_count_on_message_in_memory`` (``--trimq-max-transfer``, RocketMQ's
``maxTransferCountOnMessageInMemory``) which caps what one pull returns; ``--trimq-pull-interval`` sets
``pull_interval``.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import time
from typing import Any

HOST = "127.0.0.1"
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOPIC = "Orders"
GROUP = "bench_orderly"
PRODUCER_GROUP = "bench_producer"
# What one pull answer may carry (the broker's max_transfer_*_on_message_in_memory) in every benchmark by default.
MAX_TRANSFER = 256
MAX_TRANSFER_KIB = 1024


def add_args(p: Any) -> None:
    g = p.add_argument_group("trimq")
    g.add_argument("--trimq-port", type=int, default=0, help="broker port (0: the broker binds a free one)")
    g.add_argument("--trimq-flush", default="async", choices=["async", "sync"], help="broker flush mode")
    g.add_argument("--trimq-pull-batch", type=int, default=256, help="consumer pull_batch_size")
    g.add_argument("--trimq-consume-batch", type=int, default=64,
                   help="consumer consume_message_batch_max_size (messages per listener call)")
    g.add_argument("--trimq-pull-interval", type=int, default=0,
                   help="consumer pull_interval, ms (pause between two pulls of a queue: bigger batches, more latency)")
    g.add_argument("--trimq-max-transfer", type=int, default=MAX_TRANSFER,
                   help="broker max_transfer_count_on_message_in_memory (most messages one pull returns)")
    g.add_argument("--trimq-max-transfer-kib", type=int, default=MAX_TRANSFER_KIB,
                   help="broker max_transfer_bytes_on_message_in_memory, KiB")
    g.add_argument("--trimq-stages", type=int, default=0,
                   help="1: consumers record per-stage timestamps of every message (scheduled, born, stored, "
                        "pull answer decoded, listener start) in c<N>.stages (a diagnostic: a little CPU)")
    g.add_argument("--trimq-pause-until-ready", type=int, default=1,
                   help="1: consumers pull only once the whole group holds its queues (steady state)")


def version() -> str:
    try:
        from importlib.metadata import version as v

        return f"trimq {v('trimq')} (Python {sys.version.split()[0]})"
    except Exception:
        return "trimq (dev)"


def fresh_address_file(store: str) -> str:
    """``STORE/broker.addr``, where a broker writes the address it listens on; a file an earlier run left
    there is removed first, so it cannot be read as this run's."""
    from trimq.testing import processes  # (here, not at the top: the client processes need none of the broker)

    return str(processes.fresh_address_file(store))


def listened_port(address_file: str, proc: Any, timeout_s: float) -> int:
    """The port a broker listens on, from the ``broker.addr`` it writes once it listens, so the port accepts
    connections when this returns; 0 if the process exits or does not write it within ``timeout_s``, or the
    file does not end in a port number."""
    from trimq.testing import processes

    try:
        address = processes.listened_address(address_file, proc, timeout_s)
    except processes.DaemonNotReadyError:
        return 0
    port = address.rpartition(":")[2]
    return int(port) if port.isdigit() else 0  # not HOST:PORT: not a broker we can reach


def broker_exe() -> list[str]:
    """The command that runs ``trimq-broker``: the venv's script, else the module through this Python."""
    exe = shutil.which("trimq-broker", path=os.path.dirname(sys.executable))
    if exe:
        return [exe]
    return [sys.executable, "-c", "from trimq.tools.broker import main; main()"]


def broker_addr(args: Any) -> str:
    return f"{HOST}:{args.trimq_port}"


def broker_env(max_transfer: int = MAX_TRANSFER, max_transfer_kib: int = MAX_TRANSFER_KIB) -> dict[str, str]:
    """This process's environment with the broker's ``max_transfer_*_on_message_in_memory`` (by default the
    bench's: :data:`MAX_TRANSFER` messages, :data:`MAX_TRANSFER_KIB` KiB per pull answer)."""
    env = dict(os.environ)
    env["TRIMQ_BROKER_MAX_TRANSFER_COUNT_ON_MESSAGE_IN_MEMORY"] = str(max_transfer)
    env["TRIMQ_BROKER_MAX_TRANSFER_BYTES_ON_MESSAGE_IN_MEMORY"] = str(max_transfer_kib * 1024)
    return env


def args_broker_env(args: Any) -> dict[str, str]:
    """:func:`broker_env` with the run's ``--trimq-max-transfer`` and ``--trimq-max-transfer-kib``."""
    return broker_env(args.trimq_max_transfer, args.trimq_max_transfer_kib)


def broker_flags(listen: str, store: str, flush: str = "async") -> list[str]:
    """``trimq-broker``'s flags in every benchmark: one broker with an embedded name server, warnings only, as JSON."""
    return ["--listen", listen, "--store", store, "--embedded-namesrv", "--flush", flush, "--log-level", "warning",
            "--log-format", "json"]


def launch_broker(cmd: list[str], env: dict[str, str], log: str, address_file: str, port: int = 0) -> tuple[Any, int]:
    """Run a broker command as a harness Server; returns it and the port it listens on, read from the
    ``address_file`` it writes once it listens (on the fixed ``port`` when one is given, else on the port it bound).
    Stops it and raises RuntimeError when it does not listen within 30 s, or at once when it exits first."""
    from bench.harness import load_harness  # the harness's Server (shared/bench/peers/common.py), put on sys.path

    srv = load_harness().Server("trimq", cmd, env=env, log=log, cwd=str(_REPO))
    # The address file for a fixed port too: the harness's wait_port would wait out its 30 s for a broker that
    # had already exited (its port taken, a bad flag).
    listened = listened_port(address_file, srv.proc, 30)
    if not listened or (port and listened != port):
        srv.stop()
        raise RuntimeError(f"trimq-broker did not start (see {log})")
    return srv, listened


def start_broker_on_own_port(workdir: str, env: dict[str, str]) -> tuple[Any, int]:
    """A broker with the benchmarks' flags (:func:`broker_flags`), its store and ``broker.log`` under ``workdir``,
    on a port it binds itself (port 0, read back from STORE/broker.addr: a port picked here first could be taken
    by another process before the broker binds it); returns the harness Server and the port."""
    address_file = fresh_address_file(os.path.join(workdir, "store"))
    cmd = [*broker_exe(), *broker_flags(f"{HOST}:0", os.path.dirname(address_file))]
    return launch_broker(cmd, env, os.path.join(workdir, "broker.log"), address_file)


def start_server(workdir: str, args: Any) -> Any:
    """Start ``trimq-broker --embedded-namesrv`` on loopback with a fresh store; returns a harness Server."""
    os.makedirs(workdir, exist_ok=True)
    if not getattr(args, "trimq_port_fixed", args.trimq_port):
        # A fresh port for every run (the child processes get it through args), bound by the broker itself
        # (port 0) and read back from STORE/broker.addr: a port picked here beforehand could be taken by another
        # process before the broker binds it ("Address already in use", seen in bench.takeover).
        args.trimq_port_fixed = 0
        args.trimq_port = 0
    else:
        args.trimq_port_fixed = args.trimq_port
    address_file = fresh_address_file(os.path.join(workdir, "store"))
    flags = broker_flags(broker_addr(args), os.path.dirname(address_file), args.trimq_flush)
    cmd = [*broker_exe(), *flags]
    prof_dir = os.environ.get("TRIMQ_BENCH_PROFILE")
    sample_dir = os.environ.get("TRIMQ_BENCH_SAMPLE")
    from bench.recorders import recorder_asked

    recorder = recorder_asked()
    instrumented = [sys.executable, "-m", "bench.instrumented_broker"]
    if sample_dir:
        cmd = [*instrumented, "sample", os.path.join(sample_dir, "broker.txt"), *flags]
    elif recorder:
        cmd = [*instrumented, recorder, "broker", *flags]
    elif prof_dir:
        cmd = [*instrumented, "profile", os.path.join(prof_dir, "broker.prof"), *flags]
    srv, args.trimq_port = launch_broker(cmd, args_broker_env(args), os.path.join(workdir, "server.log"),
                                         address_file, args.trimq_port_fixed)
    return srv


def _quiet_logs() -> None:
    from trimq.runtime.logs import configure_logging

    configure_logging("json", "warning")


# ---------------------------------------------------------------------------------------------- setup

async def setup(args: Any) -> None:
    await asyncio.to_thread(_run_trio, _setup_trio, args)


def _run_trio(fn: Any, *a: Any) -> Any:
    import trio

    from bench.recorders import recorder_asked, recording

    recorder = recorder_asked()
    if recorder:
        with recording(recorder, fn.__name__):
            return trio.run(fn, *a)

    prof_dir = os.environ.get("TRIMQ_BENCH_PROFILE")
    if not prof_dir:
        return trio.run(fn, *a)
    # cProfile sees only the thread it runs in: profile the trio thread itself
    import cProfile

    prof = cProfile.Profile(time.thread_time)  # CPU time: wall time would count waiting for a core
    try:
        return prof.runcall(trio.run, fn, *a)
    finally:
        os.makedirs(prof_dir, exist_ok=True)
        prof.dump_stats(os.path.join(prof_dir, f"{fn.__name__}-{os.getpid()}.prof"))


async def _setup_trio(args: Any) -> None:
    import trio

    from trimq.client.api import MQClientAPI
    from trimq.runtime.client import RemotingClient

    _quiet_logs()
    addr = broker_addr(args)
    async with RemotingClient() as rc:
        api = MQClientAPI(rc)
        await api.create_topic(addr, TOPIC, read_queue_nums=args.queues, write_queue_nums=args.queues)
        # the broker registers the new topic with its (embedded) name server: wait until the route shows it
        with trio.fail_after(30):
            while True:
                try:
                    route = await api.get_topic_route(addr, TOPIC)
                    if len(route.publish_queues(TOPIC)) == args.queues:
                        return
                except Exception:
                    pass
                await trio.sleep(0.05)


# ---------------------------------------------------------------------------------------------- producer

async def produce(args: Any, work: list[tuple[int, str, int, int]], maker: Any) -> dict[str, Any]:
    from bench.sampler import sampled_if_asked  # on use: the harness loads this module as a peer

    # Sampled, trio runs in the main thread, where Python runs signal handlers, so a sample lands on whatever Python
    # code holds the CPU (a sampler in another thread would only ever see the GIL released).
    with sampled_if_asked("produce") as inline:
        if inline:
            return _run_trio(_produce_trio, args, work, maker)
        return await asyncio.to_thread(_run_trio, _produce_trio, args, work, maker)


async def _produce_trio(args: Any, work: list[tuple[int, str, int, int]], maker: Any) -> dict[str, Any]:
    import trio

    from trimq.client import Message, Producer, ProducerConfig

    _quiet_logs()
    cfg = ProducerConfig(producer_group=PRODUCER_GROUP, namesrv_addr=broker_addr(args))
    per_queue: dict[int, int] = {}
    batches = 0
    async with Producer(cfg) as producer:
        mqs = {mq.queue_id: mq for mq in await producer.message_queues(TOPIC)}
        make = maker.make
        send_batches = producer.send_batches

        from common import Pacer  # the harness's: the same pacing as the Redis peer

        t0 = time.perf_counter()
        step = args.batch
        pacer = Pacer(args.rate)
        for i in range(0, len(work), step):
            d = pacer.delay(i)
            if d:
                await trio.sleep(d)
            stamp = pacer.stamp_ns(i)
            by_q: dict[int, list[Any]] = {}
            for gid, key, seq, q in work[i:i + step]:
                lst = by_q.get(q)
                if lst is None:
                    lst = by_q[q] = []
                lst.append(Message(TOPIC, make(gid, key, seq, stamp)))
            await send_batches([(msgs, mqs[q]) for q, msgs in by_q.items()])
            for q, msgs in by_q.items():
                per_queue[q] = per_queue.get(q, 0) + len(msgs)
            batches += len(by_q)
        t1 = time.perf_counter()
    n = sum(per_queue.values())
    # the consumers read ``per_queue`` (in producer.json) to know when every queue they hold is consumed
    return dict(sent=n, seconds=t1 - t0, requests=batches, pace_lag_s=pacer.max_lag_s,
                per_queue={str(q): c for q, c in sorted(per_queue.items())})


# ---------------------------------------------------------------------------------------------- consumers

def consumer_config(args: Any, cid: int) -> Any:
    from trimq.client import PushConsumerConfig

    return PushConsumerConfig(
        consumer_group=GROUP, namesrv_addr=broker_addr(args), instance_name=f"c{cid}-{os.getpid()}",
        consume_from_where="CONSUME_FROM_FIRST_OFFSET",
        pull_batch_size=args.trimq_pull_batch,
        consume_message_batch_max_size=args.trimq_consume_batch,
        pull_interval=args.trimq_pull_interval,
    )


def _produced_per_queue(args: Any) -> dict[int, int] | None:
    """Messages per queue as the producer reports them (``producer.json`` of the run), once it finished."""
    outdir = getattr(args, "outdir", None)
    if not outdir:
        return None
    try:
        with open(os.path.join(outdir, "producer.json")) as f:
            per_queue = json.load(f).get("per_queue")
    except (OSError, ValueError):
        return None
    return {int(q): int(c) for q, c in per_queue.items()} if per_queue else None


def expected_per_queue(args: Any) -> dict[int, int]:
    """Messages per queue of the harness's workload (``common.gen_workload``: one ``randrange(keys)`` per
    message, routed by key), without building the whole workload."""
    import random

    from common import key_name, route

    rng = random.Random(args.seed)
    per_key = [0] * args.keys
    draw = rng.randrange
    for _ in range(args.messages):
        per_key[draw(args.keys)] += 1
    out: dict[int, int] = {}
    for k, n in enumerate(per_key):
        if n:
            q = route(key_name(k), args.queues)
            out[q] = out.get(q, 0) + n
    return out


async def consume(args: Any, cid: int, queues: Any, rec: Any, ready: Any) -> None:
    """Consume as one member of the group until every queue it holds is consumed to the end of the workload
    (or ``--consumer-idle-s`` without a message, or the deadline). ``queues`` (the harness's static split) is
    ignored: the rebalance decides; ``rec.expected`` is set from the queues actually held."""
    from bench.sampler import sampled_if_asked

    with sampled_if_asked(f"consume{cid}") as inline:  # sampled: in the main thread, as produce() says
        if inline:
            _run_trio(_consume_trio, args, cid, rec, ready)
        else:
            await asyncio.to_thread(_run_trio, _consume_trio, args, cid, rec, ready)


async def _consume_trio(args: Any, cid: int, rec: Any, ready: Any) -> None:
    import trio

    from trimq.client import ConsumeOrderlyStatus, PushConsumer

    _quiet_logs()
    # Messages per queue, to know when the queues held are consumed: from the producer's report when the run
    # has one (it appears when the producer is done), else computed from the workload.
    per_queue: dict[int, int] | None = None if getattr(args, "outdir", None) else expected_per_queue(args)
    consumer = PushConsumer(consumer_config(args, cid))
    consumer.subscribe(TOPIC, "*")
    on_message = rec.on_message
    success = ConsumeOrderlyStatus.SUCCESS
    stages = StageRecorder() if getattr(args, "trimq_stages", 0) else None

    async def listener(msgs: list[Any], context: Any) -> Any:
        if stages is not None:
            stages.listener_called(msgs)
        for m in msgs:
            on_message(m.body)
        return success

    consumer.register_message_listener_orderly(listener)
    info: dict[str, Any] = {"assignments": [], "client_id": None}
    rec.peer_info = info
    pause = bool(args.trimq_pause_until_ready)
    n_members_goal = args.consumers

    def held() -> list[int]:
        return sorted(mq.queue_id for mq, pq in consumer.process_queue_table().items()
                      if mq.topic == TOPIC and (pq.locked or not consumer.consume_orderly))

    if pause:
        consumer.suspend()  # started paused: no pull before the whole group holds its queues
    async with consumer:
        info["client_id"] = consumer.client_id
        assert consumer.core is not None
        if stages is not None:
            stages.attach(consumer.core.pull_service)
        instance = consumer.instance
        assert instance is not None
        share_lo = args.queues // n_members_goal
        share_hi = share_lo + (1 if args.queues % n_members_goal else 0)
        # wait for the steady assignment: all members present, our share held and locked
        deadline = trio.current_time() + 60
        last: list[int] = []
        while trio.current_time() < deadline:
            ids = await instance.find_consumer_id_list(TOPIC, GROUP) or []
            last = held()
            if len(ids) >= n_members_goal and share_lo <= len(last) <= share_hi:
                break
            await trio.sleep(0.02)
        info["assignments"].append({"t_ns": time.time_ns(), "queues": last})
        info["steady_queues"] = last
        ready()
        if pause:
            # every member of the group starts pulling at once, as the harness's static consumers do
            outdir = getattr(args, "outdir", None)
            until = time.monotonic() + 10
            while outdir and time.monotonic() < until and not all(
                    os.path.exists(os.path.join(outdir, f"c{c}.ready")) for c in range(args.consumers)):
                await trio.sleep(0.005)
            consumer.resume()
        end = time.monotonic() + args.deadline_s
        checked = 0.0
        while time.monotonic() < end:
            await trio.sleep(0.02)
            now_held = held()
            if now_held != last:
                last = now_held
                info["assignments"].append({"t_ns": time.time_ns(), "queues": last})
            if rec.received and time.monotonic() - rec.last_activity > args.consumer_idle_s:
                info["stopped"] = "idle"
                break
            if per_queue is None and time.monotonic() - checked > 0.1:
                checked = time.monotonic()
                per_queue = _produced_per_queue(args)
            if per_queue is not None:
                rec.expected = sum(per_queue.get(q, 0) for q in last)
                if last and _all_consumed(consumer, last, per_queue):
                    info["stopped"] = "done"
                    break
        info["final_queues"] = last
        info["pull"] = dict(consumer.core.pull_service.stats)
        if stages is not None and getattr(args, "outdir", None):
            stages.write(os.path.join(args.outdir, f"c{cid}.stages"))


class StageRecorder:
    """Per-message timestamps of the stages a message goes through (``--trimq-stages 1``): the harness's
    scheduled send time (header, ns), the producer's born timestamp and the broker's store timestamp (ms, from
    the record), when the pull answer carrying it was decoded in this consumer and when the listener was called
    with it (ns). Same host, same wall clock. Written as ``STAGE_FIELDS`` int64 per message."""

    def __init__(self) -> None:
        from array import array

        self.rows = array("q")
        self._pulled: dict[int, int] = {}

    def attach(self, pull_service: Any) -> None:
        """Stamp every batch as the pull loop hands it to the consume service (right after the decode)."""
        service = pull_service.consume_service
        submit = service.submit
        pulled = self._pulled

        def stamped_submit(process_queue: Any, msgs: Any, dispatch: bool, message_queue: Any) -> None:
            now = time.time_ns()
            for m in msgs:
                pulled[id(m)] = now
            submit(process_queue, msgs, dispatch, message_queue=message_queue)

        service.submit = stamped_submit

    def listener_called(self, msgs: list[Any]) -> None:
        from common import HDR

        now = time.time_ns()
        pulled = self._pulled
        rows = self.rows
        unpack = HDR.unpack_from
        for m in msgs:
            rows.extend((unpack(m.body, 0)[0], m.born_timestamp, m.store_timestamp, pulled.pop(id(m), 0), now))

    def write(self, path: str) -> None:
        with open(path, "wb") as f:
            self.rows.tofile(f)


STAGE_FIELDS = ("scheduled_ns", "born_ms", "stored_ms", "pulled_ns", "listener_ns")


def stage_breakdown(rows: Any) -> dict[str, Any]:
    """Percentiles (ms) of each stage over ``rows`` (the int64 arrays of :class:`StageRecorder`, concatenated):
    scheduled -> born (the producer), born -> stored (send + append), stored -> pulled (the pull's answer:
    notification, response, transfer, decode), pulled -> listener (the consume service), and the total
    scheduled -> listener. Born and stored are whole milliseconds, so the two stages around them are +-1 ms."""
    n = len(rows) // len(STAGE_FIELDS)
    stages: dict[str, list[float]] = {"scheduled->born": [], "born->stored": [], "stored->pulled": [],
                                      "pulled->listener": [], "scheduled->listener": []}
    for i in range(n):
        sched, born, stored, pulled, called = rows[i * 5:i * 5 + 5]
        if not pulled:
            continue
        stages["scheduled->born"].append(born - sched / 1e6)
        stages["born->stored"].append(float(stored - born))
        stages["stored->pulled"].append(pulled / 1e6 - stored)
        stages["pulled->listener"].append((called - pulled) / 1e6)
        stages["scheduled->listener"].append((called - sched) / 1e6)
    out: dict[str, Any] = {"messages": n}
    for name, vals in stages.items():
        vals.sort()
        if vals:
            out[name] = {q: round(vals[min(len(vals) - 1, round(f * (len(vals) - 1)))], 3)
                         for q, f in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99), ("p999", 0.999))}
            out[name]["mean"] = round(sum(vals) / len(vals), 3)
    return out


def _all_consumed(consumer: Any, queues: list[int], per_queue: dict[int, int]) -> bool:
    """Every queue held has its committed offset at the end of the workload (consumed here or before)."""
    assert consumer.core is not None
    table = consumer.core.offset_store.clone_offset_table(TOPIC)
    got = {mq.queue_id: off for mq, off in table.items()}
    return all(got.get(q, -1) >= per_queue.get(q, 0) for q in queues)
