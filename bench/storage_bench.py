"""Storage benchmark: append and pull throughput of a real ``trimq-broker`` through the real client transport.

    python -m bench.storage_bench [--messages 200000] [--batch 64] [--window 8] [--no-redis] [--no-profile]

What runs (the broker is a subprocess, so broker and client each get a core of this 2-core machine):

* ``append batch``: SEND_BATCH_MESSAGE, ``--batch`` messages per request, ``--window`` requests in flight,
  over 4 queues, ASYNC_FLUSH; for 256-byte and 4 KiB bodies.
* ``pull``: PULL_MESSAGE of everything just written, one puller per queue, 32 messages per pull (the
  broker's cap), records returned raw.
* ``append single``: SEND_MESSAGE, one message per request, 64 in flight (what a non-batching producer sees).
* ``append batch sync``: as ``append batch`` under SYNC_FLUSH (group commit: one fsync per round of
  waiting sends).
* Redis Streams (when ``redis-server`` is installed; ``apt-get install -y redis-server``), measured in
  the same run with the same shape: pipelines of ``--batch`` XADDs, ``--window`` in flight, AOF
  ``appendfsync everysec`` (``always`` for the sync row); reads by XRANGE of 32 entries per call.
* A cProfile summary of the broker process during a shorter append + pull run: where broker time goes.

Numbers move by up to ~1.8x between runs on this shared machine (shared/bench/peers/NOTES.md): compare
the ratios measured side by side in one run, not absolute figures across runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pstats
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import trio

from bench.own_redis import HOST, start_own_redis, stop_redis_process
from bench.stop_signals import end_child, raise_on_stop_signals, start_recorded
from trimq.protocol.codes import RequestCode, ResponseCode
from trimq.protocol.command import RemotingCommand
from trimq.runtime.client import RemotingClient
from trimq.testing.processes import ADDRESS_FILE_NAME, listened_address

QUEUES = 4
TOPIC = "Bench"


@dataclass
class Row:
    system: str
    case: str
    body: int
    messages: int
    seconds: float
    server_cpu_s: float = 0.0  # CPU seconds the broker (or redis-server) used during the case
    client_cpu_s: float = 0.0  # CPU seconds of this benchmark process (the client side)

    @property
    def rate(self) -> float:
        return self.messages / self.seconds if self.seconds else 0.0

    @property
    def mb_s(self) -> float:
        return self.rate * self.body / 1e6

    @property
    def server_us(self) -> float:
        return 1e6 * self.server_cpu_s / self.messages if self.messages else 0.0

    @property
    def client_us(self) -> float:
        return 1e6 * self.client_cpu_s / self.messages if self.messages else 0.0


class CpuMeter:
    """CPU seconds used by a server process and by this process between ``start`` and ``stop``."""

    def __init__(self, pid: int) -> None:
        import psutil

        self.proc = psutil.Process(pid)

    def _server(self) -> float:
        t = self.proc.cpu_times()
        return float(t.user + t.system)

    def measure(self, fn: Any, *args: Any) -> tuple[Any, float, float]:
        s0, c0 = self._server(), time.process_time()
        result = fn(*args)
        return result, self._server() - s0, time.process_time() - c0


# ---------------------------------------------------------------------------------------------- broker
class BrokerProc:
    def __init__(self, store: Path, flush: str, profile: Path | None = None) -> None:
        self.store = store
        args = ["--listen", "127.0.0.1:0", "--store", str(store), "--flush", flush, "--log-level", "warning"]
        if profile is not None:
            cmd = [sys.executable, "-m", "bench.storage_bench", "_profiled_broker", str(profile), *args]
        else:
            cmd = [str(Path(sys.executable).parent / "trimq-broker"), *args]
        self.log = open(store.parent / f"{store.name}.log", "wb")  # noqa: SIM115
        started: list[subprocess.Popen[bytes]] = []
        try:
            self.proc = start_recorded(started, lambda: subprocess.Popen(cmd, stdout=self.log, stderr=self.log))
            self.address = listened_address(store / ADDRESS_FILE_NAME, self.proc, 30,
                                            log=store.parent / f"{store.name}.log")
        except BaseException:  # not started, or this run told to stop meanwhile: nobody else would end it
            if started:
                self.proc = started[0]
                self.stop()  # (closes the log too)
            else:
                self.log.close()
            raise

    def stop(self) -> None:
        end_child(self.proc, 60)
        self.log.close()


def _profiled_broker(out: str, args: list[str]) -> None:
    """Run ``trimq-broker ARGS`` under cProfile, writing the stats to ``out`` at a graceful stop."""
    import cProfile

    from trimq.tools.broker import main

    prof = cProfile.Profile(time.process_time)
    prof.enable()
    try:
        main.main(args=args, standalone_mode=False)
    finally:
        prof.disable()
        prof.dump_stats(out)


async def _invoke(rc: RemotingClient, addr: str, code: int, ext: dict[str, Any], body: Any = None
                  ) -> RemotingCommand:
    return await rc.invoke(addr, RemotingCommand.request(code, ext, body), timeout_s=60)


async def append_batch(addr: str, messages: int, body_size: int, batch: int, window: int) -> float:
    """Seconds to append ``messages`` in batches, ``window`` requests in flight."""
    payload = [{"body": os.urandom(body_size), "properties": "TAGS\x01bench\x02", "flag": 0} for _ in range(batch)]
    requests = messages // batch
    async with RemotingClient(default_timeout_s=60) as rc:
        for q in range(QUEUES):  # create the topic and connect before timing
            await _invoke(rc, addr, RequestCode.SEND_MESSAGE,
                          {"producerGroup": "b", "topic": TOPIC, "queueId": q, "bornTimestamp": 0}, b"warm")
        next_req = 0
        t0 = time.perf_counter()

        async def worker(w: int) -> None:
            nonlocal next_req
            while next_req < requests:
                n = next_req
                next_req += 1
                ext = {"producerGroup": "b", "topic": TOPIC, "queueId": n % QUEUES, "sysFlag": 0,
                       "bornTimestamp": int(time.time() * 1000), "flag": 0}
                r = await _invoke(rc, addr, RequestCode.SEND_BATCH_MESSAGE, ext, payload)
                if r.code != ResponseCode.SUCCESS:
                    raise RuntimeError(f"batch send failed: {r.code} {r.remark}")

        async with trio.open_nursery() as nursery:
            for w in range(window):
                nursery.start_soon(worker, w)
        return time.perf_counter() - t0


async def append_single(addr: str, messages: int, body_size: int, window: int) -> float:
    body = os.urandom(body_size)
    async with RemotingClient(default_timeout_s=60) as rc:
        await _invoke(rc, addr, RequestCode.SEND_MESSAGE,
                      {"producerGroup": "b", "topic": "Single", "queueId": 0, "bornTimestamp": 0}, b"warm")
        left = messages
        t0 = time.perf_counter()

        async def worker(w: int) -> None:
            nonlocal left
            while left > 0:
                left -= 1
                ext = {"producerGroup": "b", "topic": "Single", "queueId": w % QUEUES, "sysFlag": 0,
                       "bornTimestamp": 0, "flag": 0, "properties": "TAGS\x01bench\x02"}
                r = await _invoke(rc, addr, RequestCode.SEND_MESSAGE, ext, body)
                if r.code != ResponseCode.SUCCESS:
                    raise RuntimeError(f"send failed: {r.code} {r.remark}")

        async with trio.open_nursery() as nursery:
            for w in range(window):
                nursery.start_soon(worker, w)
        return time.perf_counter() - t0


async def pull_all(addr: str, expected: int) -> float:
    """Seconds to pull every message of the bench topic back (one puller per queue)."""
    got = 0
    async with RemotingClient(default_timeout_s=60) as rc:
        await _invoke(rc, addr, RequestCode.GET_MAX_OFFSET, {"topic": TOPIC, "queueId": 0})
        t0 = time.perf_counter()

        async def puller(q: int) -> None:
            nonlocal got
            offset = 1  # skip the warm-up message
            while True:
                r = await _invoke(rc, addr, RequestCode.PULL_MESSAGE,
                                  {"consumerGroup": "bench", "topic": TOPIC, "queueId": q, "queueOffset": offset,
                                   "maxMsgNums": 32, "sysFlag": 0})
                if r.code != ResponseCode.SUCCESS:
                    return
                got += _count_records(r.body)
                offset = r.ext["nextBeginOffset"]

        async with trio.open_nursery() as nursery:
            for q in range(QUEUES):
                nursery.start_soon(puller, q)
        elapsed = time.perf_counter() - t0
    if got != expected:
        raise RuntimeError(f"pulled {got} messages, expected {expected}")
    return elapsed


def _count_records(body: bytes) -> int:
    """Walk the record sizes (what a consumer does before decoding) without decoding."""
    n = pos = 0
    while pos < len(body):
        pos += int.from_bytes(body[pos : pos + 4], "big")
        n += 1
    return n


def run_trimq(args: argparse.Namespace, work: Path) -> list[Row]:
    rows: list[Row] = []
    for body, n, batch in ((256, args.messages, args.batch), (4096, args.messages // 5, max(1, args.batch // 4))):
        n -= n % (batch * QUEUES)
        store = work / f"trimq-{body}"
        b = BrokerProc(store, "async")
        cpu = CpuMeter(b.proc.pid)
        try:
            secs, sc, cc = cpu.measure(trio.run, append_batch, b.address, n, body, batch, args.window)
            rows.append(Row("trimq", f"append batch {batch} async", body, n, secs, sc, cc))
            secs, sc, cc = cpu.measure(trio.run, pull_all, b.address, n)
            rows.append(Row("trimq", "pull 32/req", body, n, secs, sc, cc))
            if body == 256:
                single = args.messages // 5
                secs, sc, cc = cpu.measure(trio.run, append_single, b.address, single, body, 64)
                rows.append(Row("trimq", "append single async", body, single, secs, sc, cc))
        finally:
            b.stop()
            shutil.rmtree(store, ignore_errors=True)
    n = args.messages // 4
    n -= n % (args.batch * QUEUES)
    store = work / "trimq-sync"
    b = BrokerProc(store, "sync")
    cpu = CpuMeter(b.proc.pid)
    try:
        secs, sc, cc = cpu.measure(trio.run, append_batch, b.address, n, 256, args.batch, args.window)
        rows.append(Row("trimq", f"append batch {args.batch} sync", 256, n, secs, sc, cc))
    finally:
        b.stop()
        shutil.rmtree(store, ignore_errors=True)
    return rows


# ---------------------------------------------------------------------------------------------- redis
async def _redis_case(port: int, n: int, body_size: int, batch: int, window: int
                      ) -> tuple[float, float, float]:
    import redis.asyncio as aioredis

    r = aioredis.Redis(host="127.0.0.1", port=port)
    body = os.urandom(body_size)
    streams = [f"bench{body_size}:{q}" for q in range(QUEUES)]
    for s in streams:
        await r.delete(s)
    requests = n // batch
    next_req = 0

    async def writer() -> None:
        nonlocal next_req
        while next_req < requests:
            k = next_req
            next_req += 1
            pipe = r.pipeline(transaction=False)
            for _ in range(batch):
                pipe.xadd(streams[k % QUEUES], {"b": body, "t": b"bench"})
            await pipe.execute()

    t0 = time.perf_counter()
    await asyncio.gather(*(writer() for _ in range(window)))
    append_s = time.perf_counter() - t0
    got = 0

    async def reader(s: str) -> None:
        nonlocal got
        low = "-"
        while True:
            entries = await r.xrange(s, min=low, max="+", count=32)
            if not entries:
                return
            got += len(entries)
            last = entries[-1][0]
            low = "(" + (last.decode() if isinstance(last, bytes) else str(last))  # exclusive: after it

    t0 = time.perf_counter()
    await asyncio.gather(*(reader(s) for s in streams))
    read_s = time.perf_counter() - t0
    await r.aclose()
    if got != requests * batch:
        raise RuntimeError(f"redis read {got}, expected {requests * batch}")
    return append_s, read_s, append_s / (append_s + read_s)


def run_redis(args: argparse.Namespace, work: Path) -> list[Row]:
    exe = shutil.which("redis-server")
    if exe is None:
        print("redis-server not installed: skipping Redis Streams (apt-get install -y redis-server)")
        return []
    rows: list[Row] = []
    for fsync in ("everysec", "always"):
        d = work / f"redis-{fsync}"
        d.mkdir()

        def start(port: int, d: Path = d, fsync: str = fsync
                  ) -> tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]:
            proc = subprocess.Popen([exe, "--bind", HOST, "--port", str(port), "--dir", str(d), "--save", "",
                                     "--appendonly", "yes", "--appendfsync", fsync, "--io-threads", "1",
                                     "--logfile", str(d / "redis.log")], stdout=subprocess.DEVNULL)
            return proc, proc

        proc, port = start_own_redis(start, stop_redis_process, timeout=20)
        try:
            cases: tuple[tuple[int, int, int], ...] = (
                (256, args.messages, args.batch), (4096, args.messages // 5, max(1, args.batch // 4)))
            if fsync == "always":
                cases = ((256, args.messages // 4, args.batch),)
            for body, n, batch in cases:
                n -= n % (batch * QUEUES)
                cpu = CpuMeter(proc.pid)
                (a, rd, split), sc, cc = cpu.measure(asyncio.run, _redis_case(port, n, body, batch, args.window))
                tag = "async" if fsync == "everysec" else "sync"
                # The server/client CPU of the case is split between append and read by elapsed time.
                rows.append(Row("redis", f"append batch {batch} {tag}", body, n, a, sc * split, cc * split))
                if fsync == "everysec":
                    rows.append(Row("redis", "pull 32/req", body, n, rd, sc * (1 - split), cc * (1 - split)))
        finally:
            stop_redis_process(proc)
    return rows


# ---------------------------------------------------------------------------------------------- profile
def run_profile(args: argparse.Namespace, work: Path) -> str:
    store = work / "trimq-profile"
    out = work / "broker.prof"
    b = BrokerProc(store, "async", profile=out)
    n = args.messages // 2
    n -= n % (args.batch * QUEUES)
    try:
        trio.run(append_batch, b.address, n, 256, args.batch, args.window)
        trio.run(pull_all, b.address, n)
    finally:
        b.stop()
    stats = pstats.Stats(str(out))
    total = stats.total_tt  # type: ignore[attr-defined]
    rows = []
    for (file, line, func), (_cc, nc, tt, ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        rows.append((tt, ct, nc, f"{Path(file).name}:{line}({func})"))
    rows.sort(reverse=True)
    lines = [f"broker CPU profile ({n} x 256 B appended in batches of {args.batch}, then pulled; "
             f"{total:.2f} CPU s profiled): top functions by own CPU time",
             f"{'own s':>7} {'own %':>6} {'cum s':>7} {'calls':>9}  function"]
    for tt, ct, nc, name in rows[:args.top]:
        lines.append(f"{tt:7.3f} {100 * tt / total:5.1f}% {ct:7.3f} {nc:9d}  {name}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- main
def print_table(rows: list[Row]) -> None:
    print(f"{'system':<7} {'case':<26} {'body':>5} {'messages':>9} {'msgs/s':>10} {'MB/s':>8} "
          f"{'server us/msg':>14} {'client us/msg':>14}")
    for r in rows:
        print(f"{r.system:<7} {r.case:<26} {r.body:>5} {r.messages:>9} {r.rate:>10,.0f} {r.mb_s:>8.1f} "
              f"{r.server_us:>14.2f} {r.client_us:>14.2f}")
    by = {(r.system, r.case.replace(" async", "").replace(" sync", "-sync"), r.body): r for r in rows}
    ratios = []
    for (system, case, body), r in sorted(by.items()):
        other = by.get(("redis", case, body))
        if system == "trimq" and other is not None and other.rate:
            ratios.append(f"  {case} {body} B: trimq/redis = {r.rate / other.rate:.2f}")
    if ratios:
        print("ratios (same run):")
        print("\n".join(ratios))


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "_profiled_broker":
        _profiled_broker(sys.argv[2], sys.argv[3:])
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=int, default=200_000, help="256-byte messages per append case")
    p.add_argument("--batch", type=int, default=64, help="messages per batch request (4 KiB: a quarter)")
    p.add_argument("--window", type=int, default=8, help="requests in flight")
    p.add_argument("--no-redis", action="store_true")
    p.add_argument("--no-profile", action="store_true")
    p.add_argument("--top", type=int, default=20, help="profile lines")
    p.add_argument("--json", help="also write the rows to this file")
    args = p.parse_args()
    with raise_on_stop_signals(SystemExit):  # a SIGTERM or hang-up stops the brokers as a ^C does
        _run(args)


def _run(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="trimq-bench-"))
    try:
        rows = run_trimq(args, work)
        if not args.no_redis:
            rows += run_redis(args, work)
        print_table(rows)
        if args.json:
            Path(args.json).write_text(json.dumps(
                [{**asdict(r), "msgs_s": r.rate, "mb_s": r.mb_s, "server_us_per_msg": r.server_us,
                  "client_us_per_msg": r.client_us} for r in rows], indent=2))
        if not args.no_profile:
            print()
            print(run_profile(args, work))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
