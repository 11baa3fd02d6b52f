"""Takeover and failover times of an orderly consumer group (issue 10 item 5).

    python -m bench.takeover --scenario graceful     # SIGTERM one consumer: graceful leave, the other takes over
    python -m bench.takeover --scenario sigkill      # kill -9 one consumer: the other takes over when it can

A broker (``trimq-broker --embedded-namesrv``), two consumer processes (real PushConsumers, one group, orderly
listeners, default lock settings) and a paced producer (``--rate`` msgs/s over 8 queues and 1000 keys, the
shared workload's keys and per-key sequence numbers) run as subprocesses. After a steady phase the victim
(consumer 1) is stopped at T0 and the survivor's records tell, for each queue the victim held:

* ``takeover_s``: T0 -> the survivor's first message of that queue;
* ``lock_s``: T0 -> the survivor holds the queue (its process queue is locked);
* ``gap_s``: the victim's last message of the queue -> the survivor's first (how long the queue stood still).

Plus, over the whole run: messages sent / received / lost, duplicates (a message received twice: a replay
after the failover), and order violations (a key's message received for the first time after a later one
of the same key — never expected). Replays go back at most to the last offset the victim committed: orderly
consumers commit in memory after each batch and persist every ``persist_consumer_offset_interval`` (5 s) and
with each pull.

What bounds the SIGKILL case: the broker forgets the dead consumer's membership as soon as its connection
closes (so the survivor rebalances at once and is assigned the queues), but the dead client's queue locks stay
until they expire (``rebalance_lock_max_live_time_ms``, 60 s after the victim's last renewal; renewals come
every ``rebalance_lock_interval``, 20 s): a process whose connection merely broke could still be consuming,
and only the lock expiry proves it is not. The survivor retries the lock at its next rebalance (every
``rebalance_interval``, 20 s) or lock renewal. Results go to ``bench/results/takeover-<scenario>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
from typing import Any

from bench.harness import REPO, RESULTS, load_harness

common = load_harness()

import peer_trimq  # noqa: E402  (bench/ is on sys.path once the harness is loaded)

REC = struct.Struct("<qiiI")  # receive ns, queue id, per-key seq, global id


# ---------------------------------------------------------------------------------------------- consumer role

def role_consume(args: argparse.Namespace) -> None:
    import trio

    trio.run(_consume, args)


async def _consume(args: argparse.Namespace) -> None:
    import trio

    from trimq.client import ConsumeOrderlyStatus, PushConsumer, PushConsumerConfig

    peer_trimq._quiet_logs()
    outdir = args.outdir
    fd = os.open(os.path.join(outdir, f"c{args.cid}.rec"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    assign_f = open(os.path.join(outdir, f"c{args.cid}.assign"), "a")  # noqa: SIM115
    cfg = PushConsumerConfig(consumer_group=peer_trimq.GROUP, namesrv_addr=peer_trimq.broker_addr(args),
                             instance_name=f"c{args.cid}-{os.getpid()}",
                             consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                             pull_batch_size=args.trimq_pull_batch,
                             consume_message_batch_max_size=args.trimq_consume_batch)
    consumer = PushConsumer(cfg)
    consumer.subscribe(peer_trimq.TOPIC, "*")
    hdr = common.HDR
    pack = REC.pack

    async def listener(msgs: list[Any], context: Any) -> Any:
        now = time.time_ns()
        q = context.message_queue.queue_id
        out = bytearray()
        for m in msgs:
            _ts, seq, gid, _kl = hdr.unpack_from(m.body, 0)
            out += pack(now, q, seq, gid)
        os.write(fd, out)  # at once: a SIGKILLed consumer leaves what it received
        return ConsumeOrderlyStatus.SUCCESS

    consumer.register_message_listener_orderly(listener)

    def held() -> list[int]:
        return sorted(mq.queue_id for mq, pq in consumer.process_queue_table().items()
                      if mq.topic == peer_trimq.TOPIC and pq.locked)

    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with consumer:
            last: list[int] = []
            ready = False
            stop_at: int | None = None
            deadline = time.monotonic() + args.deadline_s
            async with trio.open_nursery() as nursery:
                async def watch_signals() -> None:
                    nonlocal stop_at
                    async for _ in signals:
                        stop_at = time.time_ns()
                        return

                nursery.start_soon(watch_signals)
                while stop_at is None and time.monotonic() < deadline:
                    now_held = held()
                    if now_held != last:
                        last = now_held
                        assign_f.write(json.dumps({"t_ns": time.time_ns(), "queues": last}) + "\n")
                        assign_f.flush()
                    if not ready and len(last) == args.queues // 2:
                        ready = True
                        common.touch(os.path.join(outdir, f"c{args.cid}.ready"))
                    await trio.sleep(0.01)
                nursery.cancel_scope.cancel()
            t_leave = time.time_ns()
        t_left = time.time_ns()  # leaving the block = graceful shutdown (unlock, unregister) is done
    assign_f.write(json.dumps({"t_ns": t_left, "queues": [], "stop_signal_ns": stop_at, "leave_start_ns": t_leave,
                               "left_ns": t_left}) + "\n")
    assign_f.close()
    os.close(fd)


# ---------------------------------------------------------------------------------------------- producer role

def role_produce(args: argparse.Namespace) -> None:
    import trio

    trio.run(_produce, args)


async def _produce(args: argparse.Namespace) -> None:
    import trio

    from trimq.client import Message, Producer, ProducerConfig

    peer_trimq._quiet_logs()
    work = common.gen_workload(args)
    maker = common.PayloadMaker(args)
    stop_file = os.path.join(args.outdir, "stop-producer")
    per_window = max(1, args.rate // 100)  # a window every 10 ms
    sent = 0
    errors = 0
    cfg = ProducerConfig(producer_group=peer_trimq.PRODUCER_GROUP, namesrv_addr=peer_trimq.broker_addr(args))
    async with Producer(cfg) as producer:
        mqs = {mq.queue_id: mq for mq in await producer.message_queues(peer_trimq.TOPIC)}

        async def send(q: int, msgs: list[Any]) -> None:
            nonlocal errors
            try:
                await producer.send_batch(msgs, message_queue=mqs[q])
            except Exception:
                errors += 1  # reported; the messages then count as lost

        next_t = trio.current_time()
        i = 0
        while i < len(work) and not os.path.exists(stop_file):
            by_q: dict[int, list[Any]] = {}
            for gid, key, seq, q in work[i:i + per_window]:
                by_q.setdefault(q, []).append(Message(peer_trimq.TOPIC, maker.make(gid, key, seq)))
            async with trio.open_nursery() as nursery:
                for q, msgs in by_q.items():
                    nursery.start_soon(send, q, msgs)
            i += per_window
            sent = i
            next_t += 0.01
            await trio.sleep_until(next_t)
    common.write_json(os.path.join(args.outdir, "producer.json"), {"sent": min(sent, len(work)), "errors": errors})


# ---------------------------------------------------------------------------------------------- orchestration

def spawn(args: argparse.Namespace, role: str, outdir: str, cid: int = 0) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "bench.takeover", "--role", role, "--cid", str(cid), "--outdir", outdir,
           "--trimq-port", str(args.trimq_port), "--rate", str(args.rate), "--messages", str(args.messages),
           "--queues", str(args.queues), "--keys", str(args.keys), "--deadline-s", str(args.deadline_s),
           "--trimq-pull-batch", str(args.trimq_pull_batch), "--trimq-consume-batch", str(args.trimq_consume_batch)]
    log = open(os.path.join(outdir, f"{role}{cid}.log"), "wb")  # noqa: SIM115
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=str(REPO))


def read_records(path: str) -> list[tuple[int, int, int, int]]:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return []
    n = len(data) // REC.size
    return [REC.unpack_from(data, i * REC.size) for i in range(n)]


def read_assign(path: str) -> list[dict[str, Any]]:
    out = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
    except OSError:
        pass
    return out


def run_scenario(args: argparse.Namespace) -> dict[str, Any]:
    workdir = os.path.join(args.workroot, f"takeover-{args.scenario}")
    shutil.rmtree(workdir, ignore_errors=True)
    outdir = os.path.join(workdir, "out")
    os.makedirs(outdir)
    srv = peer_trimq.start_server(os.path.join(workdir, "server"), args)
    procs: list[subprocess.Popen[bytes]] = []
    res: dict[str, Any] = {"scenario": args.scenario, "rate": args.rate}
    try:
        import asyncio

        asyncio.run(asyncio.wait_for(peer_trimq.setup(args), 60))
        consumers = [spawn(args, "consume", outdir, c) for c in range(2)]
        procs += consumers
        end = time.monotonic() + 60
        while time.monotonic() < end and not all(os.path.exists(os.path.join(outdir, f"c{c}.ready"))
                                                  for c in range(2)):
            time.sleep(0.05)
        prod = spawn(args, "produce", outdir)
        procs.append(prod)
        time.sleep(args.steady_s)
        victim, survivor = consumers[1], consumers[0]
        victim_queues = (read_assign(os.path.join(outdir, "c1.assign")) or [{"queues": []}])[-1]["queues"]
        t0 = time.time_ns()
        os.kill(victim.pid, signal.SIGTERM if args.scenario == "graceful" else signal.SIGKILL)
        res["t0_ns"] = t0
        res["victim_queues"] = victim_queues
        # wait until the survivor consumed a message of every queue the victim held
        end = time.monotonic() + args.max_wait_s
        done = False
        while time.monotonic() < end:
            recs = read_records(os.path.join(outdir, "c0.rec"))
            after = {q for (ns, q, _s, _g) in recs if ns > t0}
            if set(victim_queues) <= after:
                done = True
                break
            time.sleep(0.1)
        res["taken_over"] = done
        time.sleep(1.0)
        common.touch(os.path.join(outdir, "stop-producer"))
        res["producer_rc"] = _wait(prod, 30)
        time.sleep(2.0)  # let the survivor drain
        _wait(victim, 30)
        os.kill(survivor.pid, signal.SIGTERM)
        res["survivor_rc"] = _wait(survivor, 30)
        res["victim_rc"] = victim.returncode
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(5)
        srv.stop()
    res.update(analyse(outdir, res))
    return res


def _wait(p: subprocess.Popen[bytes], timeout: float) -> int | str:
    try:
        return p.wait(timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait(5)
        return "killed-timeout"


def analyse(outdir: str, res: dict[str, Any]) -> dict[str, Any]:
    t0 = res["t0_ns"]
    victim_q = res["victim_queues"]
    r0 = read_records(os.path.join(outdir, "c0.rec"))
    r1 = read_records(os.path.join(outdir, "c1.rec"))
    a0 = read_assign(os.path.join(outdir, "c0.assign"))
    a1 = read_assign(os.path.join(outdir, "c1.assign"))
    out: dict[str, Any] = {}
    per_q: dict[str, Any] = {}
    for q in victim_q:
        first_s = min((ns for ns, qq, _s, _g in r0 if qq == q and ns > t0), default=None)
        last_v = max((ns for ns, qq, _s, _g in r1 if qq == q), default=None)
        lock_t = next((a["t_ns"] for a in a0 if a["t_ns"] > t0 and q in a.get("queues", [])), None)
        per_q[str(q)] = {
            "takeover_s": round((first_s - t0) / 1e9, 3) if first_s else None,
            "lock_s": round((lock_t - t0) / 1e9, 3) if lock_t else None,
            "gap_s": round((first_s - last_v) / 1e9, 3) if first_s and last_v else None,
        }
    out["per_queue"] = per_q
    vals = [v["takeover_s"] for v in per_q.values() if v["takeover_s"] is not None]
    out["takeover_s_max"] = max(vals) if vals and len(vals) == len(victim_q) else None
    out["takeover_s_min"] = min(vals) if vals else None
    leave = next((a for a in a1 if "left_ns" in a), None)
    if leave and leave.get("stop_signal_ns"):
        out["victim_leave_s"] = round((leave["left_ns"] - leave["stop_signal_ns"]) / 1e9, 3)
    # delivery checks over both consumers, in receive order
    merged = sorted(r0 + r1)
    try:
        with open(os.path.join(outdir, "producer.json")) as f:
            sent = json.load(f)["sent"]
    except (OSError, ValueError, KeyError):
        sent = None
    gids = [g for (_ns, _q, _s, g) in merged]
    unique = set(gids)
    out["sent"] = sent
    out["received"] = len(gids)
    out["unique"] = len(unique)
    out["duplicates"] = len(gids) - len(unique)
    out["lost"] = (sent - len(unique)) if sent is not None else None
    # per key: first-time deliveries must follow send order (gids are in send order per key via seq)
    key_of: dict[int, int] = {}
    args = argparse.Namespace(seed=42, keys=1000, messages=max(unique) + 1 if unique else 0, queues=8)
    for gid, key, _seq, _q in common.gen_workload(args):
        key_of[gid] = int(key[4:])
    max_seq: dict[int, int] = {}
    seen: set[int] = set()
    violations = replays = 0
    for _ns, _q, seq, gid in merged:
        k = key_of.get(gid, -1)
        if gid in seen:
            replays += 1
            continue
        seen.add(gid)
        if seq <= max_seq.get(k, 0):
            violations += 1
        else:
            max_seq[k] = seq
    out["replays"] = replays
    out["order_violations"] = violations
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.takeover")
    p.add_argument("--scenario", choices=["graceful", "sigkill"], default="graceful")
    p.add_argument("--role", choices=["consume", "produce"])
    p.add_argument("--cid", type=int, default=0)
    p.add_argument("--outdir")
    p.add_argument("--rate", type=int, default=2000, help="producer msgs/s (paced, windows every 10 ms)")
    p.add_argument("--steady-s", type=float, default=3.0, help="steady phase before the victim is stopped")
    p.add_argument("--max-wait-s", type=float, default=150.0, help="longest wait for the takeover")
    p.add_argument("--workroot", default="/tmp/trimq-peerbench")
    p.add_argument("--results", default=str(RESULTS))
    p.add_argument("--messages", type=int, default=400_000, help="workload size (the producer stops earlier)")
    p.add_argument("--queues", type=int, default=8)
    p.add_argument("--keys", type=int, default=1000)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--body", type=int, default=256)
    p.add_argument("--deadline-s", type=float, default=400.0)
    peer_trimq.add_args(p)
    return p


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    args = build_parser().parse_args(argv)
    if args.role == "consume":
        role_consume(args)
        return None
    if args.role == "produce":
        role_produce(args)
        return None
    t = time.monotonic()
    res = run_scenario(args)
    res["wall_s"] = round(time.monotonic() - t, 1)
    os.makedirs(args.results, exist_ok=True)
    common.write_json(os.path.join(args.results, f"takeover-{args.scenario}.json"), res)
    print(json.dumps({k: v for k, v in res.items() if k != "per_queue"}), flush=True)
    print(json.dumps(res.get("per_queue")), flush=True)
    return res


if __name__ == "__main__":
    main()
