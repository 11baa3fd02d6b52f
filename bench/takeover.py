"""Takeover and failover of an orderly consumer group's queues (issue 10 item 5, issue 14 item 5), and what the
lease renewals cost the broker (issue 14 item 6).

    python -m bench.takeover --scenario graceful        # SIGTERM one consumer: graceful leave
    python -m bench.takeover --scenario sigkill         # kill -9 one consumer
    python -m bench.takeover --scenario sigstop         # SIGSTOP one consumer for 10 s, then SIGCONT
    python -m bench.takeover --scenario partition       # blackhole one consumer's TCP relay for 10 s
    python -m bench.takeover --scenario broker-restart  # kill -9 the broker, start it again on its store
    python -m bench.takeover --scenario cost            # 1000 client ids x 8 queues renewing leases

A broker (``trimq-broker --embedded-namesrv``, default lock settings: 2 s leases), two consumer processes (real
PushConsumers, one group, orderly listeners, default settings) and a paced producer (``--rate`` msgs/s over 8
queues and 1000 keys, the shared workload's keys and per-key sequence numbers; a failed send is retried until
it is acknowledged) run as subprocesses. In ``partition`` the victim (consumer 1) reaches the broker, name
server included, only through a loopback TCP relay this process runs; the relay stops forwarding for
``--pause-s`` without closing either side (what a network partition looks like: no FIN, no RST). After a
steady phase the event happens at T0 and the records tell:

* **takeover** per queue the victim held: T0 -> the survivor's first message of that queue (``broker-restart``:
  the moment the restarted broker listens -> the first message of each queue, its recovery time reported
  separately);
* **lost**: acknowledged messages nobody consumed (must be 0); **replays**: messages consumed again;
* **order violations**: a key's message received for the first time after a later one of the same key (must
  be 0);
* **started after lease**: listener calls the victim (every consumer for ``broker-restart``) *started* after
  its lease had surely run out — more than ``--lease-ms`` after T0, under a lock grant it held before T0
  (each record carries ``context.lock_epoch``) — must be 0; and calls started under a grant older than one
  another consumer had already started under (``superseded``, must be 0 too);
* **stale commits refused**: the broker's fenced offset updates (GET_LOCK_TABLE ``fencedUpdates``).

``cost``: one load process opens ``--connections`` (50) connections and plays ``--clients`` (1000) client ids
of orderly groups holding 8 queues each, every one sending one LOCK_BATCH_MQ (its 8 queues) every third of the
lease, as the client instance's renewal task does; the broker's CPU seconds per second and the renewals per
second are measured over ``--cost-s``, beside the idle broker's CPU.

Results go to ``bench/results/takeover-<scenario>.json``; the first printed line is the summary.
"""

from __future__ import annotations

import argparse
import bisect
import functools
import json
import os
import selectors
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
from typing import Any

from bench.harness import REPO, RESULTS, load_harness
from bench.stop_signals import kill_children, raise_on_stop_signals, start_recorded

common = load_harness()

import peer_trimq  # noqa: E402  (bench/ is on sys.path once the harness is loaded)

REC = struct.Struct("<qiiIq")  # listener start ns, queue id, per-key seq, global id, lock epoch
SCENARIOS = ("graceful", "sigkill", "sigstop", "partition", "broker-restart")
#: Targets of issue 14 (seconds): the takeover median per scenario.
TARGETS = {"graceful": 0.2, "sigkill": 1.0, "sigstop": 3.0, "partition": 3.0}


# ---------------------------------------------------------------------------------------------- consumer role

def role_consume(args: argparse.Namespace) -> None:
    import trio

    trio.run(_consume, args)


def _relay_instance(cfg: Any, broker: str, relay: str) -> Any:
    """A client instance that reaches ``broker`` at ``relay`` (the partition scenario's victim): every broker
    address a route names is rewritten after each route update."""
    from trimq.client.instance import ClientInstance

    class RelayInstance(ClientInstance):
        def _apply_route(self, topic: str, route: Any, *, from_default: bool = False) -> None:
            super()._apply_route(topic, route, from_default=from_default)
            for addrs in self.broker_addr_table.values():
                for bid, addr in list(addrs.items()):
                    if addr == broker:
                        addrs[bid] = relay

    return RelayInstance(cfg)


async def _consume(args: argparse.Namespace) -> None:
    import trio

    from trimq.client import ConsumeOrderlyStatus, PushConsumer, PushConsumerConfig

    peer_trimq._quiet_logs()
    outdir = args.outdir
    fd = os.open(os.path.join(outdir, f"c{args.cid}.rec"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    assign_f = open(os.path.join(outdir, f"c{args.cid}.assign"), "a")  # noqa: SIM115
    broker = peer_trimq.broker_addr(args)
    cfg = PushConsumerConfig(consumer_group=peer_trimq.GROUP, namesrv_addr=args.relay or broker,
                             instance_name=f"c{args.cid}-{os.getpid()}",
                             consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                             pull_batch_size=args.trimq_pull_batch,
                             consume_message_batch_max_size=args.trimq_consume_batch)
    instance = _relay_instance(cfg, broker, args.relay) if args.relay else None
    hdr = common.HDR
    pack = REC.pack

    async def listener(msgs: list[Any], context: Any) -> Any:
        now = time.time_ns()  # the start of the listener call: what "started after its lease" is about
        q = context.message_queue.queue_id
        epoch = context.lock_epoch or 0
        out = bytearray()
        for m in msgs:
            _ts, seq, gid, _kl = hdr.unpack_from(m.body, 0)
            out += pack(now, q, seq, gid, epoch)
        os.write(fd, out)  # at once: a SIGKILLed consumer leaves what it received
        return ConsumeOrderlyStatus.SUCCESS

    async def run(consumer: Any) -> None:
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
        assign_f.write(json.dumps({"t_ns": t_left, "queues": [], "stop_signal_ns": stop_at,
                                   "leave_start_ns": t_leave, "left_ns": t_left}) + "\n")

    consumer = PushConsumer(cfg, instance=instance)
    consumer.subscribe(peer_trimq.TOPIC, "*")
    consumer.register_message_listener_orderly(listener)
    if instance is not None:
        async with instance:
            await run(consumer)
    else:
        await run(consumer)
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
    cfg = ProducerConfig(producer_group=peer_trimq.PRODUCER_GROUP, namesrv_addr=peer_trimq.broker_addr(args),
                         send_msg_timeout=1000, retry_times_when_send_failed=0)
    async with Producer(cfg) as producer:
        mqs = {mq.queue_id: mq for mq in await producer.message_queues(peer_trimq.TOPIC)}

        async def send(q: int, msgs: list[Any]) -> None:
            # Retried until acknowledged (the broker-restart scenario): per-key order holds because the next
            # window waits for this one; a send that failed after storing shows up as a replay.
            nonlocal errors
            while True:
                try:
                    await producer.send_batch(msgs, message_queue=mqs[q])
                    return
                except Exception:
                    errors += 1
                    await trio.sleep(0.05)

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
            next_t = max(next_t + 0.01, trio.current_time() - 0.1)  # no catch-up burst after an outage
            await trio.sleep_until(next_t)
    common.write_json(os.path.join(args.outdir, "producer.json"), {"sent": min(sent, len(work)), "errors": errors})


# ---------------------------------------------------------------------------------------------- the relay

class Relay:
    """A loopback TCP relay (threads): ``blackhole()`` stops forwarding in both directions without closing
    anything — bytes wait in the socket buffers, as in a partition that heals — and ``heal()`` resumes."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self._open = threading.Event()
        self._open.set()
        self._stop = False
        self._socks: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def blackhole(self) -> None:
        self._open.clear()

    def heal(self) -> None:
        self._open.set()

    def close(self) -> None:
        self._stop = True
        self._open.set()
        for s in [self.listener, *self._socks]:
            try:
                s.close()
            except OSError:
                pass

    def _accept(self) -> None:
        while not self._stop:
            try:
                client, _ = self.listener.accept()
                server = socket.create_connection(self.target)
            except OSError:
                return
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._socks += [client, server]
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        sel = selectors.DefaultSelector()
        sel.register(src, selectors.EVENT_READ)
        try:
            while not self._stop:
                self._open.wait()
                if not sel.select(timeout=0.05):
                    continue
                if not self._open.is_set():
                    continue  # blackholed between the select and the read: leave the bytes where they are
                data = src.recv(65536)
                if not data:
                    break
                self._open.wait()
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


# ---------------------------------------------------------------------------------------------- orchestration

def spawn(args: argparse.Namespace, role: str, outdir: str, cid: int = 0, relay: str = "") -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "bench.takeover", "--role", role, "--cid", str(cid), "--outdir", outdir,
           "--trimq-port", str(args.trimq_port), "--rate", str(args.rate), "--messages", str(args.messages),
           "--queues", str(args.queues), "--keys", str(args.keys), "--deadline-s", str(args.deadline_s),
           "--trimq-pull-batch", str(args.trimq_pull_batch), "--trimq-consume-batch", str(args.trimq_consume_batch),
           "--clients", str(args.clients), "--connections", str(args.connections), "--cost-s", str(args.cost_s)]
    if relay:
        cmd += ["--relay", relay]
    log = open(os.path.join(outdir, f"{role}{cid}.log"), "wb")  # noqa: SIM115
    # A session of its own: the sigstop scenario stops a consumer for 10 s, and were it in the job of a shell that
    # exits meanwhile (`make bench &`), the kernel would hang it up on its SIGCONT (an orphaned group holding a stopped
    # process, POSIX; chaos seed 42 lost a consumer so). run_scenario ends them all itself (bench.stop_signals).
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=str(REPO),
                            start_new_session=True)


def read_records(path: str) -> list[tuple[int, int, int, int, int]]:
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


def _broker_cmd(workdir: str, args: argparse.Namespace) -> list[str]:
    return [*peer_trimq.broker_exe(), *peer_trimq.broker_flags(peer_trimq.broker_addr(args),
                                                                os.path.join(workdir, "store"), args.trimq_flush)]


def _restart_broker(workdir: str, args: argparse.Namespace, servers: list[Any]) -> tuple[Any, int, int]:
    """Start the broker again on its store, recorded in ``servers``; returns (server, spawn ns, listening ns) —
    the port is polled every 5 ms, so ``listening`` is the moment it accepts connections to within that."""
    t_spawn = time.time_ns()
    srv = start_recorded(servers, lambda: common.Server("trimq", _broker_cmd(workdir, args),
                                                        env=peer_trimq.args_broker_env(args),
                                                        log=os.path.join(workdir, "server.log"), cwd=str(REPO)))
    end = time.monotonic() + 60
    while time.monotonic() < end:
        try:
            with socket.create_connection((peer_trimq.HOST, args.trimq_port), timeout=0.5):
                return srv, t_spawn, time.time_ns()
        except OSError:
            time.sleep(0.005)
    raise RuntimeError(f"the restarted broker did not listen within 60 s (see {workdir}/server.log)")


def _fenced_updates(args: argparse.Namespace) -> int | None:
    import trio

    async def ask() -> int:
        from trimq.client.api import MQClientAPI
        from trimq.runtime.client import RemotingClient

        async with RemotingClient() as rc:
            body = await MQClientAPI(rc).get_lock_table(peer_trimq.broker_addr(args), peer_trimq.GROUP,
                                                        timeout_ms=3000)
        return int(sum((body.get("fencedUpdates") or {}).values()))

    try:
        return trio.run(ask)
    except Exception:
        return None


def run_scenario(args: argparse.Namespace) -> dict[str, Any]:
    workdir = os.path.join(args.workroot, f"takeover-{args.scenario}")
    shutil.rmtree(workdir, ignore_errors=True)
    outdir = os.path.join(workdir, "out")
    os.makedirs(outdir)
    servers: list[Any] = []  # the broker, and its restart: the finally stops the ones running
    procs: list[subprocess.Popen[bytes]] = []
    relay: Relay | None = None
    res: dict[str, Any] = {"scenario": args.scenario, "rate": args.rate, "lease_ms": args.lease_ms}
    try:
        import asyncio

        # (a stop signal waits until the broker listens, at most launch_broker's 30 s)
        srv = start_recorded(servers, lambda: peer_trimq.start_server(os.path.join(workdir, "server"), args))
        asyncio.run(asyncio.wait_for(peer_trimq.setup(args), 60))
        if args.scenario == "partition":
            relay = Relay((peer_trimq.HOST, args.trimq_port))
        consumers = [start_recorded(procs, functools.partial(spawn, args, "consume", outdir, c,
                                                             relay.address if relay and c == 1 else ""))
                     for c in range(2)]
        end = time.monotonic() + 60
        while time.monotonic() < end and not all(os.path.exists(os.path.join(outdir, f"c{c}.ready"))
                                                  for c in range(2)):
            time.sleep(0.05)
        prod = start_recorded(procs, lambda: spawn(args, "produce", outdir))
        time.sleep(args.steady_s)
        victim, survivor = consumers[1], consumers[0]
        victim_queues = (read_assign(os.path.join(outdir, "c1.assign")) or [{"queues": []}])[-1]["queues"]
        t0 = time.time_ns()
        res["t0_ns"] = t0
        res["victim_queues"] = victim_queues
        scenario = args.scenario
        if scenario in ("graceful", "sigkill", "sigstop"):
            sig = {"graceful": signal.SIGTERM, "sigkill": signal.SIGKILL, "sigstop": signal.SIGSTOP}[scenario]
            os.kill(victim.pid, sig)
        elif scenario == "partition":
            assert relay is not None
            relay.blackhole()
        else:
            os.kill(srv.pid, signal.SIGKILL)
            srv.proc.wait(10)
            time.sleep(args.broker_down_s)
            srv, t_spawn, t_listen = _restart_broker(os.path.join(workdir, "server"), args, servers)
            res["broker_down_s"] = round((t_spawn - t0) / 1e9, 3)
            res["broker_recovery_s"] = round((t_listen - t_spawn) / 1e9, 3)
            res["t_listen_ns"] = t_listen
        if scenario in ("sigstop", "partition"):
            time.sleep(args.pause_s)
            if scenario == "sigstop":
                os.kill(victim.pid, signal.SIGCONT)
            else:
                assert relay is not None
                relay.heal()
            res["resumed_ns"] = time.time_ns()
        # wait until the survivor (broker-restart: anyone) consumed a message of every queue concerned
        moving = list(range(args.queues)) if scenario == "broker-restart" else victim_queues
        since = res.get("t_listen_ns", t0)
        end = time.monotonic() + args.max_wait_s
        done = False
        while time.monotonic() < end:
            recs = read_records(os.path.join(outdir, "c0.rec"))
            if scenario == "broker-restart":
                recs += read_records(os.path.join(outdir, "c1.rec"))
            if set(moving) <= {q for (ns, q, _s, _g, _e) in recs if ns > since}:
                done = True
                break
            time.sleep(0.1)
        res["taken_over"] = done
        time.sleep(args.tail_s)
        common.touch(os.path.join(outdir, "stop-producer"))
        res["producer_rc"] = _wait(prod, 60)
        time.sleep(3.0)  # let the consumers drain
        res["stale_commits_refused"] = _fenced_updates(args)
        for c in (victim, survivor):
            if c.poll() is None:
                os.kill(c.pid, signal.SIGTERM)
        res["survivor_rc"] = _wait(survivor, 30)
        res["victim_rc"] = _wait(victim, 30)
    finally:
        kill_children(procs)
        if relay is not None:
            relay.close()
        for server in servers:
            if server.proc.poll() is None:  # (the broker-restart scenario's first one was killed and reaped)
                server.stop()
    res.update(analyse(outdir, res, args))
    return res


def _wait(p: subprocess.Popen[bytes], timeout: float) -> int | str:
    try:
        return p.wait(timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait(5)
        return "killed-timeout"


def started_after_lease(records: dict[int, list[tuple[int, int, int, int, int]]], cids: list[int], t0: int,
                        lease_ms: int) -> tuple[int, int]:
    """(started after lease, started under a superseded grant) of the consumers ``cids`` (module documentation).

    A listener call of consumer c on queue q starting more than ``lease_ms`` after T0 under an epoch not newer
    than the newest c had started under on q before T0 began after the lease it relied on ran out (every renewal
    c sent was sent before T0, and a lease runs from the send). A call under an epoch older than one another
    consumer had already started under on q ran beside its successor."""
    after = superseded = 0
    limit = t0 + lease_ms * 1_000_000
    for c in cids:
        before: dict[int, int] = {}
        for ns, q, _s, _g, e in records.get(c, []):
            if ns < t0:
                before[q] = max(before.get(q, 0), e)
        calls = sorted({(ns, q, e) for ns, q, _s, _g, e in records.get(c, [])})
        # per queue: the other consumers' call starts in time order with the newest epoch seen so far
        starts: dict[int, list[int]] = {}
        newest: dict[int, list[int]] = {}
        for ns, q, e in sorted({(ns, q, e) for o, recs in records.items() if o != c for ns, q, _s, _g, e in recs}):
            starts.setdefault(q, []).append(ns)
            prev = newest.setdefault(q, [])
            prev.append(max(e, prev[-1]) if prev else e)
        for ns, q, e in calls:
            if ns > limit and q in before and e <= before[q]:
                after += 1
            i = bisect.bisect_right(starts.get(q, []), ns)
            if e and i and newest[q][i - 1] > e:
                superseded += 1
    return after, superseded


def analyse(outdir: str, res: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    t0 = res["t0_ns"]
    scenario = res["scenario"]
    victim_q = res["victim_queues"]
    recs = {c: read_records(os.path.join(outdir, f"c{c}.rec")) for c in range(2)}
    a0 = read_assign(os.path.join(outdir, "c0.assign"))
    a1 = read_assign(os.path.join(outdir, "c1.assign"))
    out: dict[str, Any] = {}
    per_q: dict[str, Any] = {}
    if scenario == "broker-restart":
        listen = res["t_listen_ns"]
        merged_all = recs[0] + recs[1]
        for q in range(args.queues):
            first = min((ns for ns, qq, _s, _g, _e in merged_all if qq == q and ns > listen), default=None)
            per_q[str(q)] = {"resume_s": round((first - listen) / 1e9, 3) if first else None}
        vals = [v["resume_s"] for v in per_q.values() if v["resume_s"] is not None]
    else:
        for q in victim_q:
            first_s = min((ns for ns, qq, _s, _g, _e in recs[0] if qq == q and ns > t0), default=None)
            last_v = max((ns for ns, qq, _s, _g, _e in recs[1] if qq == q and ns <= t0), default=None)
            lock_t = next((a["t_ns"] for a in a0 if a["t_ns"] > t0 and q in a.get("queues", [])), None)
            per_q[str(q)] = {
                "takeover_s": round((first_s - t0) / 1e9, 3) if first_s else None,
                "lock_s": round((lock_t - t0) / 1e9, 3) if lock_t else None,
                "gap_s": round((first_s - last_v) / 1e9, 3) if first_s and last_v else None,
            }
        vals = [v["takeover_s"] for v in per_q.values() if v["takeover_s"] is not None]
    out["per_queue"] = per_q
    complete = bool(vals) and len(vals) == len(per_q)
    out["takeover_s_median"] = round(statistics.median(vals), 3) if vals else None
    out["takeover_s_max"] = max(vals) if complete else None
    out["takeover_s_min"] = min(vals) if vals else None
    leave = next((a for a in a1 if "left_ns" in a), None)
    if leave and leave.get("stop_signal_ns") and scenario == "graceful":
        out["victim_leave_s"] = round((leave["left_ns"] - leave["stop_signal_ns"]) / 1e9, 3)
    cids = [0, 1] if scenario == "broker-restart" else [1]
    out["started_after_lease"], out["started_superseded"] = started_after_lease(recs, cids, t0, args.lease_ms)
    # delivery checks over both consumers, in receive order
    merged = sorted(recs[0] + recs[1])
    try:
        with open(os.path.join(outdir, "producer.json")) as f:
            sent = json.load(f)["sent"]
    except (OSError, ValueError, KeyError):
        sent = None
    gids = [g for (_ns, _q, _s, g, _e) in merged]
    unique = set(gids)
    out["sent"] = sent
    out["received"] = len(gids)
    out["unique"] = len(unique)
    out["lost"] = (sent - len(unique & set(range(sent)))) if sent is not None else None
    key_of: dict[int, int] = {}
    wargs = argparse.Namespace(seed=42, keys=args.keys, messages=max(unique) + 1 if unique else 0,
                               queues=args.queues)
    for gid, key, _seq, _q in common.gen_workload(wargs):
        key_of[gid] = int(key[4:])
    max_seq: dict[int, int] = {}
    seen: set[int] = set()
    violations = replays = 0
    for _ns, _q, seq, gid, _e in merged:
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
    target = TARGETS.get(scenario)
    if scenario == "broker-restart":
        target = (args.lease_ms + 1000) / 1000
    med = out["takeover_s_median"] if scenario != "broker-restart" else out["takeover_s_max"]
    out["target_s"] = target
    out["target_met"] = bool(
        med is not None and target is not None and med <= target and out["lost"] == 0
        and out["order_violations"] == 0 and out["started_after_lease"] == 0 and out["started_superseded"] == 0)
    return out


# ---------------------------------------------------------------------------------------------- cost of renewals

def role_renew_load(args: argparse.Namespace) -> None:
    import trio

    trio.run(_renew_load, args)


async def _renew_load(args: argparse.Namespace) -> None:
    """``--clients`` client ids (8 per orderly group, each holding 8 queues of its group's 64) over
    ``--connections`` connections: one HEART_BEAT each, then one LOCK_BATCH_MQ each every third of the lease."""
    import trio

    from trimq.client.api import ConsumerData, HeartbeatData, MQClientAPI
    from trimq.protocol.message_queue import MessageQueue
    from trimq.runtime.client import RemotingClient

    peer_trimq._quiet_logs()
    addr = peer_trimq.broker_addr(args)
    stats = {"renewals": 0, "errors": 0, "held": 0}
    latencies: list[float] = []
    stop_at = trio.current_time() + args.warmup_s + args.cost_s
    measure_from = trio.current_time() + args.warmup_s
    interval = args.lease_ms / 3 / 1000

    async def one_connection(ids: list[int]) -> None:
        async with RemotingClient(default_timeout_s=5) as rc:
            api = MQClientAPI(rc)
            for i in ids:
                group = f"cost_group_{i // 8}"
                sub = {"topic": "CostTopic", "subString": "*", "tagsSet": [], "codeSet": [], "subVersion": 1}
                await api.heartbeat(addr, HeartbeatData(f"cost-client-{i}", [], [ConsumerData(
                    group_name=group, consume_type="CONSUME_PASSIVELY", message_model="CLUSTERING",
                    consume_from_where="CONSUME_FROM_LAST_OFFSET", consume_orderly=True,
                    subscription_data_set=[sub])]))

            async def client(i: int) -> None:
                group = f"cost_group_{i // 8}"
                mqs = [MessageQueue("CostTopic", "broker-a", (i % 8) * 8 + k) for k in range(8)]
                await trio.sleep(interval * (i % 97) / 97)  # spread the clients over the interval
                while trio.current_time() < stop_at:
                    t = trio.current_time()
                    try:
                        answer = await api.lock_batch_mq_lease(addr, group, f"cost-client-{i}", mqs, timeout_ms=5000)
                        if t >= measure_from:
                            stats["renewals"] += 1
                            latencies.append(trio.current_time() - t)
                            stats["held"] = max(stats["held"], len(answer.held))
                    except Exception:
                        stats["errors"] += 1
                    await trio.sleep_until(t + interval)

            async with trio.open_nursery() as nursery:
                for i in ids:
                    nursery.start_soon(client, i)

    per_conn = [list(range(c, args.clients, args.connections)) for c in range(args.connections)]
    async with trio.open_nursery() as nursery:
        for ids in per_conn:
            nursery.start_soon(one_connection, ids)
    lat = sorted(latencies)
    common.write_json(os.path.join(args.outdir, "load.json"), {
        "renewals": stats["renewals"], "errors": stats["errors"], "held_per_renewal": stats["held"],
        "renewals_per_s": round(stats["renewals"] / args.cost_s, 1),
        "p50_ms": round(lat[len(lat) // 2] * 1000, 2) if lat else None,
        "p99_ms": round(lat[int(len(lat) * 0.99)] * 1000, 2) if lat else None,
    })


def _cpu_s(pid: int) -> float:
    import psutil

    t = psutil.Process(pid).cpu_times()
    return float(t.user + t.system)


def run_cost(args: argparse.Namespace) -> dict[str, Any]:
    workdir = os.path.join(args.workroot, "takeover-cost")
    shutil.rmtree(workdir, ignore_errors=True)
    outdir = os.path.join(workdir, "out")
    os.makedirs(outdir)
    servers: list[Any] = []
    res: dict[str, Any] = {"scenario": "cost", "clients": args.clients, "queues_per_client": 8,
                           "connections": args.connections, "lease_ms": args.lease_ms}
    loads: list[subprocess.Popen[bytes]] = []
    try:
        srv = start_recorded(servers, lambda: peer_trimq.start_server(os.path.join(workdir, "server"), args))
        time.sleep(1.0)
        c0, w0 = _cpu_s(srv.pid), time.monotonic()
        time.sleep(args.cost_s / 2)
        res["idle_broker_cpu_s_per_s"] = round((_cpu_s(srv.pid) - c0) / (time.monotonic() - w0), 4)
        load = start_recorded(loads, lambda: spawn(args, "renewload", outdir))
        time.sleep(args.warmup_s)
        c0, w0 = _cpu_s(srv.pid), time.monotonic()
        time.sleep(args.cost_s)
        res["broker_cpu_s_per_s"] = round((_cpu_s(srv.pid) - c0) / (time.monotonic() - w0), 4)
        res["load_rc"] = _wait(load, 60)
        try:
            with open(os.path.join(outdir, "load.json")) as f:
                res.update(json.load(f))
        except (OSError, ValueError):
            pass
        if res.get("renewals_per_s"):
            res["broker_cpu_us_per_renewal"] = round(
                (res["broker_cpu_s_per_s"] - res["idle_broker_cpu_s_per_s"]) / res["renewals_per_s"] * 1e6, 1)
    finally:
        kill_children(loads)
        for server in servers:
            server.stop()
    return res


# ---------------------------------------------------------------------------------------------- main

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.takeover")
    p.add_argument("--scenario", choices=[*SCENARIOS, "cost"], default="graceful")
    p.add_argument("--role", choices=["consume", "produce", "renewload"])
    p.add_argument("--cid", type=int, default=0)
    p.add_argument("--outdir")
    p.add_argument("--relay", default="", help="(consumer role) reach the broker through this relay address")
    p.add_argument("--rate", type=int, default=2000, help="producer msgs/s (paced, windows every 10 ms)")
    p.add_argument("--steady-s", type=float, default=3.0, help="steady phase before the event")
    p.add_argument("--pause-s", type=float, default=10.0, help="sigstop / partition: how long the victim is cut off")
    p.add_argument("--tail-s", type=float, default=2.0, help="traffic after the takeover (and the victim's return)")
    p.add_argument("--max-wait-s", type=float, default=150.0, help="longest wait for the takeover")
    p.add_argument("--lease-ms", type=int, default=2000, help="the broker's lease (its lease_ms setting)")
    p.add_argument("--broker-down-s", type=float, default=0.0,
                   help="broker-restart: wait this long before starting it again (longer than a lease: no claims)")
    p.add_argument("--workroot", default="/tmp/trimq-peerbench")
    p.add_argument("--results", default=str(RESULTS))
    p.add_argument("--messages", type=int, default=400_000, help="workload size (the producer stops earlier)")
    p.add_argument("--queues", type=int, default=8)
    p.add_argument("--keys", type=int, default=1000)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--body", type=int, default=256)
    p.add_argument("--deadline-s", type=float, default=400.0)
    p.add_argument("--clients", type=int, default=1000, help="cost: simulated client ids")
    p.add_argument("--connections", type=int, default=50, help="cost: connections they share")
    p.add_argument("--cost-s", type=float, default=20.0, help="cost: measured seconds")
    p.add_argument("--warmup-s", type=float, default=5.0, help="cost: seconds before measuring")
    peer_trimq.add_args(p)
    return p


def summary_line(res: dict[str, Any]) -> str:
    if res["scenario"] == "cost":
        return (f"cost: {res['clients']} client ids x 8 queues over {res['connections']} connections: "
                f"{res.get('renewals_per_s')} renewals/s, broker {res.get('broker_cpu_s_per_s')} CPU-s/s "
                f"(idle {res.get('idle_broker_cpu_s_per_s')}), {res.get('broker_cpu_us_per_renewal')} us/renewal, "
                f"renewal p99 {res.get('p99_ms')} ms, errors {res.get('errors')}")
    what = "resume after listening" if res["scenario"] == "broker-restart" else "takeover"
    extra = (f", broker down {res.get('broker_down_s')} s, recovery {res.get('broker_recovery_s')} s"
             if res["scenario"] == "broker-restart" else "")
    return (f"{res['scenario']}: {what} median {res.get('takeover_s_median')} s, max {res.get('takeover_s_max')} s "
            f"over {len(res.get('per_queue', {}))} queues{extra}; lost {res.get('lost')}, "
            f"replays {res.get('replays')}, "
            f"order violations {res.get('order_violations')}, started after lease {res.get('started_after_lease')} "
            f"(superseded {res.get('started_superseded')}), stale commits refused {res.get('stale_commits_refused')}; "
            f"target {res.get('target_s')} s {'met' if res.get('target_met') else 'NOT met'}")


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    args = build_parser().parse_args(argv)
    if args.role == "consume":
        role_consume(args)
        return None
    if args.role == "produce":
        role_produce(args)
        return None
    if args.role == "renewload":
        role_renew_load(args)
        return None
    t = time.monotonic()
    with raise_on_stop_signals(SystemExit):  # so that the run's finally ends its broker and clients
        res = run_cost(args) if args.scenario == "cost" else run_scenario(args)
    res["wall_s"] = round(time.monotonic() - t, 1)
    os.makedirs(args.results, exist_ok=True)
    common.write_json(os.path.join(args.results, f"takeover-{args.scenario}.json"), res)
    print(summary_line(res), flush=True)
    print(json.dumps({k: v for k, v in res.items() if k != "per_queue"}), flush=True)
    if res.get("per_queue"):
        print(json.dumps(res["per_queue"]), flush=True)
    return res


if __name__ == "__main__":
    main()
