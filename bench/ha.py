"""High availability under load and under a master's SIGKILL (issue 15), every broker and the name server a real
process on loopback; the clients (SDK) run in this process.

    python -m bench.ha [--messages 20000] [--concurrency 32] [--failover-s 6] [--rate 1000] [--results DIR]

1. **Send throughput and latency**, in one run: a single broker (ASYNC_MASTER, no slave), an ASYNC_MASTER with
   its slave and a SYNC_MASTER with its slave; ``--messages`` sends of 256 B from ``--concurrency`` concurrent
   senders of one producer. Reported: msgs/s, p50/p99 of a send, the ratios to the single broker, and the
   **replication lag under load** (the master's ``lagBytes`` / ``lagSeconds`` sampled every 100 ms: max, p99).
2. **Failover**, once with broker-a an ASYNC_MASTER and once a SYNC_MASTER: a stand-alone name server, broker-a's
   master and slave, broker-b (a master without slave); an unordered producer sends ``--rate`` msgs/s (4 senders,
   send_latency_fault_enable) to a topic on both, two concurrent consumers of one group consume it (their
   ``pull_interval`` 200 ms keeps a backlog on every queue, so there is something to read from the slave).
   After a steady phase broker-a's master is SIGKILLed (T0); the producer runs ``--failover-s`` more seconds, then
   everything acknowledged is awaited. Reported:

   * **acknowledged lost**: SEND_OK messages nobody consumed (must be 0 under SYNC_MASTER), and messages stored
     with a weaker status (FLUSH_SLAVE_TIMEOUT / SLAVE_NOT_AVAILABLE) not consumed;
   * **first pull to the slave**: T0 -> a consumer's first pull sent to broker-a's slave;
   * **consumption from the slave**: T0 -> the first broker-a message consumed after T0 (read from the slave);
   * **sends on another broker**: T0 -> the first acknowledged send started after T0 (it goes to broker-b);
     the longest send call around T0; failed sends;
   * **duplicates**: messages consumed more than once, and of those the **redelivered** ones (one stored message
     delivered twice); the others were stored twice, by a send retried on another broker after the dead master had
     stored it but its answer was lost (at-least-once produce, as RocketMQ's).

   Targets (issue 15, with a stand-alone name server): each time <= 2 s; 0 acknowledged lost under SYNC_MASTER.

Results: ``bench/results/ha.json``; the first printed line is the summary.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from bench.harness import RESULTS
from bench.stop_signals import STOP_SIGNALS, end_child
from trimq.client.api import SendStatus
from trimq.client.config import ClientConfig, ProducerConfig, PushConsumerConfig
from trimq.client.consume.common import ConsumeConcurrentlyStatus
from trimq.client.instance import ClientInstance
from trimq.client.producer import Producer
from trimq.client.push_consumer import PushConsumer
from trimq.protocol.codes import RequestCode
from trimq.protocol.command import RemotingCommand
from trimq.protocol.message import Message
from trimq.runtime.client import RemotingClient
from trimq.testing.processes import fresh_address_file, listened_address, logged_event

BIN = Path(sys.executable).parent
TOPIC = "HaBench"
TARGET_S = 2.0
BODY = b"x" * 256


# ---------------------------------------------------------------------------------------------- processes

@dataclass
class Daemon:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    address: str = ""

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
        self.popen.wait(10)

    def stop(self) -> None:
        end_child(self.popen, 20)


class Cluster:
    """The daemons of one scenario, each stopped (by its PID) when the block ends."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.daemons: list[Daemon] = []
        self.namesrv = ""

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        for d in reversed(self.daemons):
            d.stop()

    def _start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Daemon:
        log = self.workdir / f"{name}.log"
        with open(log, "ab") as out:
            popen = subprocess.Popen(argv, stdout=out, stderr=out, env=env or dict(os.environ), cwd=self.workdir)
        d = Daemon(name, popen, log)
        self.daemons.append(d)
        return d

    def start_namesrv(self) -> None:
        d = self._start("namesrv", [str(BIN / "trimq-namesrv"), "--listen", "127.0.0.1:0", "--log-format", "json",
                                    "--log-level", "info"])
        self.namesrv = d.address = str(logged_event(d.log, d.popen, "namesrv.started", 20)["address"])

    def start_broker(self, name: str, broker_name: str, *args: str) -> Daemon:
        store = self.workdir / name
        store.mkdir(parents=True, exist_ok=True)
        addr_file = fresh_address_file(store)
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRIMQ_")}
        env["TRIMQ_BROKER_MAPPED_FILE_SIZE_COMMIT_LOG"] = str(64 * 1024 * 1024)
        d = self._start(name, [str(BIN / "trimq-broker"), "--namesrv", self.namesrv, "--listen", "127.0.0.1:0",
                               "--store", str(store), "--broker-name", broker_name, "--log-format", "json",
                               "--log-level", "warning", *args], env)
        d.address = listened_address(addr_file, d.popen, 30, log=d.log, name=name)
        return d


async def runtime_ha(rc: RemotingClient, addr: str) -> dict[str, Any]:
    r = await rc.invoke(addr, RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO, {}), 5)
    return dict(r.body["ha"])


async def wait_following(rc: RemotingClient, master: str, slaves: int = 1, timeout: float = 20) -> None:
    with trio.fail_after(timeout):
        while (await runtime_ha(rc, master)).get("slaves", 0) < slaves:
            await trio.sleep(0.05)


async def create_topic(client: ClientInstance, masters: list[str], queues: int) -> None:
    for addr in masters:
        await client.api.create_topic(addr, TOPIC, read_queue_nums=queues, write_queue_nums=queues)
    with trio.fail_after(20):
        while True:
            await client.update_topic_route_info_from_name_server(TOPIC)
            route = client.topic_route_table.get(TOPIC)
            if route is not None and len(route.queue_datas) == len(masters):
                return
            await trio.sleep(0.05)


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


# ---------------------------------------------------------------------------------------------- 1. throughput

async def throughput(mode: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    with Cluster(workdir / mode) as cluster:
        cluster.start_namesrv()
        role = {"single": "async_master", "async": "async_master", "sync": "sync_master"}[mode]
        master = cluster.start_broker("master", "broker-a", "--role", role)
        if mode != "single":
            cluster.start_broker("slave", "broker-a", "--role", "slave", "--broker-id", "1")
        async with RemotingClient() as rc, ClientInstance(ClientConfig(namesrv_addr=cluster.namesrv)) as client:
            if mode != "single":
                await wait_following(rc, master.address)
            await create_topic(client, [master.address], 8)
            lat: list[float] = []
            statuses: dict[str, int] = {}
            lag_bytes: list[int] = []
            lag_s: list[float] = []
            done = trio.Event()

            async def sample() -> None:
                while not done.is_set():
                    ha = await runtime_ha(rc, master.address)
                    if "lagBytes" in ha and mode != "single":
                        lag_bytes.append(int(ha["lagBytes"]))
                        lag_s.append(float(ha["lagSeconds"]))
                    with trio.move_on_after(0.1):
                        await done.wait()

            async with Producer(ProducerConfig(producer_group="ha_bench", send_msg_timeout=10_000),
                                instance=client) as producer:
                for _ in range(200):  # warm-up: connections, routes
                    await producer.send(Message(TOPIC, BODY))
                left = [args.messages]

                async def sender() -> None:
                    while left[0] > 0:
                        left[0] -= 1
                        t = trio.current_time()
                        r = await producer.send(Message(TOPIC, BODY))
                        lat.append(trio.current_time() - t)
                        statuses[r.status.value] = statuses.get(r.status.value, 0) + 1

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(sample)
                    t0 = trio.current_time()
                    async with trio.open_nursery() as senders:
                        for _ in range(args.concurrency):
                            senders.start_soon(sender)
                    elapsed = trio.current_time() - t0
                    done.set()
    return {"mode": mode, "messages": args.messages, "concurrency": args.concurrency,
            "msgs_s": round(args.messages / elapsed, 1), "p50_ms": round(1000 * (pct(lat, 0.5) or 0), 2),
            "p99_ms": round(1000 * (pct(lat, 0.99) or 0), 2), "statuses": statuses,
            "lag_bytes_max": max(lag_bytes, default=None), "lag_bytes_p99": pct([float(x) for x in lag_bytes], 0.99),
            "lag_s_max": max(lag_s, default=None), "lag_s_p99": pct(lag_s, 0.99), "lag_samples": len(lag_bytes)}


# ---------------------------------------------------------------------------------------------- 2. failover

async def failover(role: str, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    with Cluster(workdir / f"failover-{role}") as cluster:
        cluster.start_namesrv()
        master_a = cluster.start_broker("a-master", "broker-a", "--role", role)
        cluster.start_broker("a-slave", "broker-a", "--role", "slave", "--broker-id", "1")
        master_b = cluster.start_broker("b-master", "broker-b")
        ns = cluster.namesrv
        async with RemotingClient() as rc, ClientInstance(ClientConfig(namesrv_addr=ns)) as client:
            await wait_following(rc, master_a.address)
            await create_topic(client, [master_a.address, master_b.address], 4)
            sends: list[tuple[str, float, float, str, str]] = []  # (id, started, answered, broker, status)
            failed: list[tuple[float, str]] = []
            consumed: list[tuple[str, float, str, int, int]] = []  # (id, when, broker, queue id, queue offset)
            t_kill = [0.0]
            first_slave_pull = [0.0]
            stop_sending = trio.Event()

            async def listener(msgs: list[Any], context: Any) -> ConsumeConcurrentlyStatus:
                now = trio.current_time()
                broker = context.message_queue.broker_name
                for m in msgs:
                    consumed.append((m.body.decode(), now, broker, m.queue_id, m.queue_offset))
                return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

            consumers = []
            for i in range(2):
                c = PushConsumer(PushConsumerConfig(
                    namesrv_addr=ns, consumer_group="ha_bench_group", instance_name=f"c{i}",
                    consume_from_where="CONSUME_FROM_FIRST_OFFSET", pull_interval=200,
                    persist_consumer_offset_interval=1000))
                c.subscribe(TOPIC)
                c.register_message_listener_concurrently(listener)
                consumers.append(c)
            pcfg = ProducerConfig(namesrv_addr=ns, producer_group="ha_bench_failover", send_latency_fault_enable=True)
            async with Producer(pcfg) as producer, consumers[0], consumers[1]:
                seq = [0]

                async def sender(k: int) -> None:
                    interval = 4 / args.rate
                    nxt = trio.current_time()
                    while not stop_sending.is_set():
                        nxt += interval
                        body = f"{k}-{seq[0]}"
                        seq[0] += 1
                        t = trio.current_time()
                        try:
                            r = await producer.send(Message(TOPIC, body.encode()))
                            sends.append((body, t, trio.current_time(), r.message_queue.broker_name, r.status.value))
                        except Exception as exc:  # counted: a failed send is not acknowledged
                            failed.append((t, type(exc).__name__))
                        await trio.sleep_until(max(nxt, trio.current_time()))

                async def watch_slave_pulls() -> None:
                    while not t_kill[0]:
                        await trio.sleep(0.005)
                    while not first_slave_pull[0]:
                        if any(c.core is not None and c.core.pull_service.stats["from_slave"] for c in consumers):
                            first_slave_pull[0] = trio.current_time()
                            return
                        await trio.sleep(0.002)

                await trio.sleep(1.5)  # the group settles on its two members before the first message
                async with trio.open_nursery() as nursery:
                    for k in range(4):
                        nursery.start_soon(sender, k)
                    nursery.start_soon(watch_slave_pulls)
                    await trio.sleep(args.steady_s)
                    t_kill[0] = trio.current_time()
                    master_a.kill()
                    await trio.sleep(args.failover_s)
                    stop_sending.set()
                    with trio.move_on_after(5):
                        while not first_slave_pull[0]:
                            await trio.sleep(0.05)
                    nursery.cancel_scope.cancel()
                acked = {s[0] for s in sends if s[4] == SendStatus.SEND_OK.value}
                stored = {s[0] for s in sends}
                with trio.move_on_after(30):
                    while not stored <= {c[0] for c in consumed}:
                        await trio.sleep(0.1)
    t0 = t_kill[0]
    got = [c[0] for c in consumed]
    seen = set(got)
    after_a = [c[1] for c in consumed if c[1] > t0 and c[2] == "broker-a"]
    sends_after = [s for s in sends if s[1] >= t0 and s[4] == SendStatus.SEND_OK.value]
    around = [s[2] - s[1] for s in sends if s[1] <= t0 + 1 and s[2] >= t0]
    res = {
        "role": role.upper(), "rate": args.rate, "steady_s": args.steady_s, "failover_s": args.failover_s,
        "sent_stored": len(stored), "acknowledged": len(acked), "failed_sends": len(failed),
        "weaker_status": len(stored - acked),
        "acknowledged_lost": len(acked - seen), "stored_not_consumed": len(stored - seen),
        "duplicates": len(got) - len(seen),
        # the same stored message delivered twice (a redelivery), vs. a send retried after its answer was lost
        # (stored twice: at-least-once produce, RocketMQ's too)
        "redelivered": len(got) - len({(c[2], c[3], c[4]) for c in consumed}),
        "redelivered_examples": _redelivered(consumed, t0)[:8],
        "first_pull_to_slave_s": round(first_slave_pull[0] - t0, 3) if first_slave_pull[0] else None,
        "consumption_from_slave_s": round(min(after_a) - t0, 3) if after_a else None,
        "consumed_from_slave": len(after_a),
        "sends_on_other_broker_s": round(min(s[2] for s in sends_after) - t0, 3) if sends_after else None,
        "longest_send_around_kill_s": round(max(around), 3) if around else None,
        "sent_to_broker_a_after_kill": sum(1 for s in sends if s[1] > t0 + 0.5 and s[3] == "broker-a"),
    }
    times = [res["first_pull_to_slave_s"], res["consumption_from_slave_s"], res["sends_on_other_broker_s"]]
    res["target_met"] = all(t is not None and t <= TARGET_S for t in times) and (
        role != "sync_master" or res["acknowledged_lost"] == 0)
    return res


def _redelivered(consumed: list[tuple[str, float, str, int, int]], t0: float) -> list[dict[str, Any]]:
    """The messages delivered more than once: where, and when (s after the kill) each delivery came."""
    by: dict[tuple[str, int, int], list[float]] = {}
    for _, when, broker, qid, offset in consumed:
        by.setdefault((broker, qid, offset), []).append(round(when - t0, 3))
    return [{"broker": b, "queue_id": q, "offset": o, "delivered_at_s": ts}
            for (b, q, o), ts in sorted(by.items()) if len(ts) > 1]


# ---------------------------------------------------------------------------------------------- main

async def run(args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="trimq-ha-bench-"))
    out: dict[str, Any] = {"throughput": [], "failover": [], "workdir": str(workdir)}
    try:
        for mode in ("single", "async", "sync"):
            out["throughput"].append(await throughput(mode, args, workdir))
        base = out["throughput"][0]["msgs_s"]
        for row in out["throughput"]:
            row["ratio_to_single"] = round(row["msgs_s"] / base, 3) if base else None
        for role in ("async_master", "sync_master"):
            out["failover"].append(await failover(role, args, workdir))
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    return out


async def run_until_stopped(args: argparse.Namespace) -> dict[str, Any]:
    """:func:`run`, which a SIGTERM or hang-up stops as a ^C does: cancelled, so that each cluster's block ends its
    daemons, then ``SystemExit`` naming the signal (bench.stop_signals does the same for the harnesses outside
    trio; trio's own receiver keeps the exception out of its run loop)."""
    stopped: list[str] = []
    result: dict[str, Any] = {}

    async def watch(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        with trio.open_signal_receiver(*STOP_SIGNALS) as signals:
            task_status.started()
            async for signum in signals:
                stopped.append(signal.Signals(signum).name)
                nursery.cancel_scope.cancel()
                return

    async with trio.open_nursery() as nursery:
        await nursery.start(watch)
        result = await run(args)
        nursery.cancel_scope.cancel()
    if stopped:
        raise SystemExit(f"{stopped[0]}: the harness was told to stop, or its terminal closed")
    return result


def summary_line(res: dict[str, Any]) -> str:
    tp = {r["mode"]: r for r in res["throughput"]}
    parts = [f"sends: single {tp['single']['msgs_s']:.0f}/s p99 {tp['single']['p99_ms']} ms, "
             f"ASYNC_MASTER x{tp['async']['ratio_to_single']} p99 {tp['async']['p99_ms']} ms, "
             f"SYNC_MASTER x{tp['sync']['ratio_to_single']} p99 {tp['sync']['p99_ms']} ms"]
    for f in res["failover"]:
        parts.append(f"{f['role']} kill: lost {f['acknowledged_lost']}, slave pull {f['first_pull_to_slave_s']} s, "
                     f"slave consumption {f['consumption_from_slave_s']} s, sends {f['sends_on_other_broker_s']} s, "
                     f"dup {f['duplicates']} (redelivered {f['redelivered']})")
    return "; ".join(parts)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="python -m bench.ha", description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=int, default=20_000, help="sends per throughput mode")
    p.add_argument("--concurrency", type=int, default=32, help="concurrent senders of the throughput runs")
    p.add_argument("--rate", type=int, default=1000, help="failover: the producer's msgs/s")
    p.add_argument("--steady-s", type=float, default=3.0, help="failover: seconds before the SIGKILL")
    p.add_argument("--failover-s", type=float, default=6.0, help="failover: seconds of sending after it")
    p.add_argument("--results", default=str(RESULTS))
    p.add_argument("--keep", action="store_true", help="keep the stores and logs (their directory is printed)")
    args = p.parse_args(argv)
    res = trio.run(run_until_stopped, args)
    print(summary_line(res), flush=True)
    if args.keep:
        print(f"stores and logs kept in {res.get('workdir')}")
    out = Path(args.results)
    out.mkdir(parents=True, exist_ok=True)
    (out / "ha.json").write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))
    return res


if __name__ == "__main__":
    main()
