"""The SDK on asyncio against the SDK on trio: the consumer process's CPU per message (issue 18 item 5).

    python -m bench.sdk_loops [--rate 20000] [--seconds 6] [--runs 3] [--profiles peer,defaults]

One broker (``trimq-broker --embedded-namesrv``, ASYNC_FLUSH) and, per run, a fresh topic of 8 queues, one
consumer process and one paced producer process (``--rate`` msgs/s for ``--seconds``: a window of 100 messages
every 5 ms at 20k msg/s, split by queue and sent with ``Producer.send_batches``). Live mode: the consumer holds
its queues before the producer starts. The consumer is a real :class:`~trimq.client.PushConsumer` with an
``async def`` listener that counts; the two paths run the same code:

* ``trio``: ``trio.run``, the listener a trio task (awaited inline by the consume service);
* ``asyncio``: ``asyncio.run``, ``async with consumer`` in the asyncio loop (a trio guest run, client.aio), the
  listener an asyncio task of the host loop, bridged back to trio.

CPU is the consumer process's (all threads, ``time.process_time``) from its first message to its last, divided
by the messages in between. Profiles:

* ``peer``: the shared peer workload's consumer (bench.peer_trimq): orderly, ``pull_batch_size`` 256,
  ``consume_message_batch_max_size`` 64;
* ``defaults``: the SDK's defaults: concurrently, ``pull_batch_size`` 32, one message per listener call (the
  bridge's cost per call counts most here).

Runs alternate trio and asyncio; medians per profile and loop go to ``bench/results/sdk-loops.json`` with the
ratio asyncio / trio (issue 18's target: at most 1.2).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from bench.harness import REPO, RESULTS
from bench.peer_trimq import start_broker_on_own_port
from bench.sampler import sampled_if_asked
from bench.stop_signals import kill_children, raise_on_stop_signals, start_recorded

HOST = "127.0.0.1"
QUEUES = 8
WINDOW = 100
PROFILES: dict[str, dict[str, Any]] = {
    "peer": {"orderly": True, "pull_batch_size": 256, "consume_message_batch_max_size": 64},
    "defaults": {"orderly": False},
}
TARGET_RATIO = 1.2


def _quiet() -> None:
    from trimq.runtime.logs import configure_logging

    configure_logging("json", "warning")


# ---------------------------------------------------------------------------------------------- consumer

def role_consume(args: argparse.Namespace) -> None:
    """One consumer; writes ``consumer.json`` (messages, CPU seconds and wall seconds first -> last message)."""
    _quiet()
    rec: dict[str, Any] = {"loop": args.loop, "profile": args.profile}
    with sampled_if_asked(f"{args.profile}-{args.loop}"):  # diagnostics: where the consumer's CPU goes
        if args.loop == "trio":
            import trio

            trio.run(_consume, args, rec)
        else:
            import asyncio

            asyncio.run(_consume(args, rec))
    with open(os.path.join(args.outdir, "consumer.json"), "w") as f:
        json.dump(rec, f)


async def _sleep(seconds: float) -> None:
    import trio

    if trio.lowlevel.in_trio_task():
        await trio.sleep(seconds)
    else:
        import asyncio

        await asyncio.sleep(seconds)


async def _consume(args: argparse.Namespace, rec: dict[str, Any]) -> None:
    from trimq.client import ConsumeConcurrentlyStatus, ConsumeOrderlyStatus, PushConsumer, PushConsumerConfig

    profile = dict(PROFILES[args.profile])
    orderly = profile.pop("orderly")
    cfg = PushConsumerConfig(namesrv_addr=args.namesrv, consumer_group=f"loops_{args.topic}",
                             consume_from_where="CONSUME_FROM_FIRST_OFFSET", **profile)
    consumer = PushConsumer(cfg)
    consumer.subscribe(args.topic, "*")
    expected = args.messages
    state = {"n": 0, "cpu0": 0.0, "t0": 0.0, "cpu1": 0.0, "t1": 0.0}
    ok: Any = ConsumeOrderlyStatus.SUCCESS if orderly else ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    # the same coroutine function on both loops: under asyncio it is asyncio code (a task of the host loop)
    async def listener(msgs: list[Any], context: Any) -> Any:
        n = state["n"]
        if n == 0:
            state["cpu0"], state["t0"] = time.process_time(), time.perf_counter()
        n += len(msgs)
        state["n"] = n
        if n >= expected:
            state["cpu1"], state["t1"] = time.process_time(), time.perf_counter()
        return ok

    if args.loop == "asyncio" and os.environ.get("TRIMQ_LOOPS_TRIO_LISTENER"):
        from trimq.client.aio import trio_native

        listener = trio_native(listener)  # diagnostics: the guest run's cost without the listener bridge
    if orderly:
        consumer.register_message_listener_orderly(listener)
    else:
        consumer.register_message_listener_concurrently(listener)
    async with consumer:
        deadline = time.monotonic() + 60
        while len(consumer.process_queue_table()) < QUEUES and time.monotonic() < deadline:
            await _sleep(0.02)
        open(os.path.join(args.outdir, "ready"), "w").close()
        deadline = time.monotonic() + args.timeout
        while state["n"] < expected and time.monotonic() < deadline:
            await _sleep(0.02)
    n = int(state["n"])
    rec.update(messages=n, complete=n >= expected)
    if n >= expected and n > 1:
        rec["cpu_s"] = state["cpu1"] - state["cpu0"]
        rec["wall_s"] = state["t1"] - state["t0"]
        rec["cpu_us_per_msg"] = rec["cpu_s"] / (n - 1) * 1e6
        rec["msgs_per_s"] = (n - 1) / rec["wall_s"] if rec["wall_s"] > 0 else None


# ---------------------------------------------------------------------------------------------- producer

def role_produce(args: argparse.Namespace) -> None:
    import trio

    _quiet()
    trio.run(_produce, args)


async def _produce(args: argparse.Namespace) -> None:
    import trio

    from trimq.client import Message, Producer, ProducerConfig

    body = b"x" * 256
    async with Producer(ProducerConfig(namesrv_addr=args.namesrv, producer_group="loops_producer")) as producer:
        mqs = await producer.message_queues(args.topic)
        pace = WINDOW / args.rate
        next_t = trio.current_time()
        sent = 0
        while sent < args.messages:
            next_t += pace
            await trio.sleep_until(next_t)
            n = min(WINDOW, args.messages - sent)
            by_q: dict[int, list[Message]] = {}
            for i in range(n):
                by_q.setdefault((sent + i) % len(mqs), []).append(Message(args.topic, body))
            await producer.send_batches([(msgs, mqs[q]) for q, msgs in by_q.items()])
            sent += n


# ---------------------------------------------------------------------------------------------- orchestration

def _role_cmd(args: argparse.Namespace, role: str, **extra: Any) -> list[str]:
    cmd = [sys.executable, "-m", "bench.sdk_loops", "--role", role, "--namesrv", args.namesrv,
           "--rate", str(args.rate), "--seconds", str(args.seconds)]
    for k, v in extra.items():
        cmd += [f"--{k.replace('_', '-')}", str(v)]
    return cmd


def _create_topic(namesrv: str, topic: str) -> None:
    import trio

    from trimq.client.admin import open_admin

    async def go() -> None:
        async with open_admin(namesrv) as admin:
            await admin.ensure_topic(topic, QUEUES)

    trio.run(go)


def one_run(args: argparse.Namespace, workdir: str, profile: str, loop: str, index: int) -> dict[str, Any]:
    topic = f"Loops{index}"
    _create_topic(args.namesrv, topic)
    outdir = os.path.join(workdir, f"run{index}")
    os.makedirs(outdir)
    messages = int(args.rate * args.seconds)
    common = {"topic": topic, "outdir": outdir, "messages": messages}
    with open(os.path.join(outdir, "consumer.log"), "wb") as clog:
        cmd = _role_cmd(args, "consume", loop=loop, profile=profile, timeout=args.seconds * 4 + 20, **common)
        consumers: list[subprocess.Popen[bytes]] = []
        try:
            consumer = start_recorded(consumers, lambda: subprocess.Popen(cmd, cwd=str(REPO), stdout=clog,
                                                                          stderr=subprocess.STDOUT))
            end = time.monotonic() + 60
            while not os.path.exists(os.path.join(outdir, "ready")) and time.monotonic() < end:
                if consumer.poll() is not None:
                    break
                time.sleep(0.02)
            producer = subprocess.run(_role_cmd(args, "produce", **common), cwd=str(REPO), capture_output=True,
                                      timeout=args.seconds * 4 + 60, check=False)
            if producer.returncode != 0:
                sys.stderr.write(producer.stderr.decode(errors="replace"))
            consumer.wait(timeout=args.seconds * 4 + 60)
        finally:
            kill_children(consumers)
    try:
        with open(os.path.join(outdir, "consumer.json")) as f:
            rec: dict[str, Any] = json.load(f)
    except (OSError, ValueError):
        rec = {"loop": loop, "profile": profile, "error": "no result (see consumer.log)"}
    print(f"  {profile:9s} {loop:8s} {rec.get('messages', 0):>7} msgs  "
          f"{rec.get('cpu_us_per_msg', float('nan')):6.2f} µs CPU/msg  "
          f"{rec.get('msgs_per_s') or 0:9,.0f} msg/s", flush=True)
    return rec


def orchestrate(args: argparse.Namespace) -> int:
    workdir = tempfile.mkdtemp(prefix="trimq-sdk-loops-")
    brokers: list[tuple[Any, int]] = []
    runs: list[dict[str, Any]] = []
    try:
        try:
            # the broker's own defaults (no bench transfer settings): the SDK as a user runs it
            _broker, port = start_recorded(brokers, lambda: start_broker_on_own_port(workdir, dict(os.environ)))
        except RuntimeError as exc:
            print(f"sdk_loops: {exc}", file=sys.stderr)
            return 1
        args.namesrv = f"{HOST}:{port}"
        index = 0
        for profile in args.profiles.split(","):
            for r in range(args.runs):
                # alternate which loop goes first, so drift (other load, warm caches) hits both alike
                for loop in (("trio", "asyncio") if r % 2 == 0 else ("asyncio", "trio")):
                    runs.append(one_run(args, workdir, profile, loop, index))
                    index += 1
    finally:
        for broker, _port in brokers:
            broker.stop()
    result: dict[str, Any] = {"rate": args.rate, "seconds": args.seconds, "runs_per_loop": args.runs,
                              "target_ratio": TARGET_RATIO, "profiles": {}, "runs": runs}
    for profile in args.profiles.split(","):
        med = {}
        for loop in ("trio", "asyncio"):
            vals = [r["cpu_us_per_msg"] for r in runs if r.get("profile") == profile and r.get("loop") == loop
                    and r.get("cpu_us_per_msg") is not None]
            rates = [r["msgs_per_s"] for r in runs if r.get("profile") == profile and r.get("loop") == loop
                     and r.get("msgs_per_s")]
            med[loop] = {"cpu_us_per_msg": round(statistics.median(vals), 2) if vals else None,
                         "msgs_per_s": round(statistics.median(rates)) if rates else None, "n": len(vals)}
        t, a = med["trio"]["cpu_us_per_msg"], med["asyncio"]["cpu_us_per_msg"]
        ratio = round(a / t, 3) if a and t else None
        result["profiles"][profile] = {**med, "ratio": ratio, "target_met": ratio is not None and ratio <= TARGET_RATIO}
        print(f"{profile}: trio {t} µs/msg, asyncio {a} µs/msg, asyncio/trio {ratio} (target <= {TARGET_RATIO})")
    os.makedirs(args.results, exist_ok=True)
    with open(os.path.join(args.results, "sdk-loops.json"), "w") as f:
        json.dump(result, f, indent=1)
    shutil.rmtree(workdir, ignore_errors=True)
    return 0 if all(p["ratio"] is not None for p in result["profiles"].values()) else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.sdk_loops", description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=int, default=20_000, help="producer pace, msgs/s")
    p.add_argument("--seconds", type=float, default=6.0, help="seconds of production per run")
    p.add_argument("--runs", type=int, default=3, help="runs per profile and loop (medians; with 2, a median is a "
                   "mean and one disturbed run moves it)")
    p.add_argument("--profiles", default="peer,defaults", help=f"comma-separated: {', '.join(PROFILES)}")
    p.add_argument("--results", default=str(RESULTS))
    p.add_argument("--role", choices=["consume", "produce"], help=argparse.SUPPRESS)
    p.add_argument("--namesrv", help=argparse.SUPPRESS)
    p.add_argument("--loop", choices=["trio", "asyncio"], help=argparse.SUPPRESS)
    p.add_argument("--profile", choices=list(PROFILES), help=argparse.SUPPRESS)
    p.add_argument("--topic", help=argparse.SUPPRESS)
    p.add_argument("--outdir", help=argparse.SUPPRESS)
    p.add_argument("--messages", type=int, help=argparse.SUPPRESS)
    p.add_argument("--timeout", type=float, default=60.0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.role == "consume":
        role_consume(args)
        return 0
    if args.role == "produce":
        role_produce(args)
        return 0
    with raise_on_stop_signals(SystemExit):  # a SIGTERM or hang-up ends the broker and the consumer too
        return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
