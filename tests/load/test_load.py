"""Load: a thousand connections at once, hundreds of held long polls, and the memory a peer that never reads
its socket may cost the broker (flow control, docs/PROTOCOL.md §2).

Clients here are raw connections (frames straight onto TCP streams), so a test controls exactly what is
pipelined and what is never read. The first two tests run the broker in this process (both ends of a
thousand connections: the soft file-descriptor limit is raised to the hard one, or the test is skipped);
the memory test runs it as a subprocess (``trimq-broker``) and watches its RSS with psutil.
"""

from __future__ import annotations

import itertools
import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest
import trio

from trimq.broker.broker import open_broker
from trimq.broker.config import BrokerConfig
from trimq.protocol.codes import RequestCode as RC
from trimq.protocol.codes import ResponseCode
from trimq.protocol.command import RemotingCommand
from trimq.protocol.frame import FrameDecoder, encode_frame
from trimq.protocol.message import encode_properties
from trimq.testing.processes import ADDRESS_FILE_NAME, listened_address

SUSPEND = 0x2
MIB = 1024 * 1024


class RawConn:
    """One client connection speaking frames directly: pipeline requests, read responses (or never)."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.decoder = FrameDecoder()
        self.opaques = itertools.count(1)
        self.ready: list[RemotingCommand] = []

    @classmethod
    async def open(cls, addr: str) -> RawConn:
        host, port = addr.rsplit(":", 1)
        return cls(await trio.open_tcp_stream(host, int(port)))

    def frame(self, code: int, ext: dict[str, Any], body: Any = None) -> tuple[int, bytes]:
        cmd = RemotingCommand.request(code, ext, body)
        cmd.opaque = next(self.opaques)
        return cmd.opaque, encode_frame(cmd)

    async def send(self, code: int, ext: dict[str, Any], body: Any = None) -> int:
        opaque, data = self.frame(code, ext, body)
        await self.stream.send_all(data)
        return opaque

    async def receive(self) -> RemotingCommand:
        while not self.ready:
            data = await self.stream.receive_some(256 * 1024)
            if not data:
                raise EOFError("the broker closed the connection")
            self.ready.extend(self.decoder.feed(data))
        return self.ready.pop(0)

    async def call(self, code: int, ext: dict[str, Any], body: Any = None) -> RemotingCommand:
        opaque = await self.send(code, ext, body)
        resp = await self.receive()
        assert resp.opaque == opaque, (resp.opaque, opaque)
        return resp

    async def aclose(self) -> None:
        await trio.aclose_forcefully(self.stream)


def send_ext(topic: str, queue_id: int) -> dict[str, Any]:
    return {"producerGroup": "load_pg", "topic": topic, "queueId": queue_id, "sysFlag": 0,
            "bornTimestamp": int(time.time() * 1000), "flag": 0, "properties": encode_properties({})}


def pull_ext(topic: str, queue_id: int, offset: int, *, suspend_ms: int = 0, max_nums: int = 32) -> dict[str, Any]:
    return {"consumerGroup": "load_cg", "topic": topic, "queueId": queue_id, "queueOffset": offset,
            "maxMsgNums": max_nums, "sysFlag": SUSPEND if suspend_ms else 0, "commitOffset": 0,
            "suspendTimeoutMillis": suspend_ms, "subscription": "*", "subVersion": 0}


def ensure_fds(needed: int) -> None:
    """Raise the soft open-files limit towards the hard one; skip when even the hard one is too low."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= needed:
        return
    if hard != resource.RLIM_INFINITY and hard < needed:
        pytest.skip(f"needs {needed} open files, the hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed if hard == resource.RLIM_INFINITY else hard, hard))


def config(tmp_path: Path, **kw: Any) -> BrokerConfig:
    return BrokerConfig(listen="127.0.0.1:0", store_dir=str(tmp_path / "store"), **kw)


# ---------------------------------------------------------------------------------------------- 1000 connections


async def test_a_thousand_connections_held_open_while_traffic_flows(tmp_path: Path) -> None:
    n_conns, n_msgs, queues, topic = 1000, 2000, 8, "LoadConns"
    ensure_fds(2 * n_conns + 200)  # both ends live in this process
    async with open_broker(config(tmp_path)) as broker:
        broker.topic_config_manager.ensure_topic(topic, queues)
        addr = broker.address
        conns: list[RawConn] = []
        limiter = trio.CapacityLimiter(64)  # the listen backlog is finite: connect a few at a time

        async def connect() -> None:
            async with limiter:
                c = await RawConn.open(addr)
                conns.append(c)
                r = await c.call(RC.GET_MAX_OFFSET, {"topic": topic, "queueId": len(conns) % queues})
                assert r.code == ResponseCode.SUCCESS, r

        t0 = trio.current_time()
        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for _ in range(n_conns):
                    nursery.start_soon(connect)
            assert len(broker.server.connections) >= n_conns
            connected_s = trio.current_time() - t0
            answered = 0
            sent: list[int] = []
            pulled = 0

            async def idle_client(c: RawConn, i: int) -> None:
                # Each of the thousand keeps asking while the traffic flows.
                nonlocal answered
                for _ in range(3):
                    await trio.sleep((i % 100) / 100)
                    r = await c.call(RC.GET_MAX_OFFSET, {"topic": topic, "queueId": i % queues})
                    assert r.code == ResponseCode.SUCCESS, r
                    answered += 1

            async def producer() -> None:
                p = await RawConn.open(addr)
                try:
                    window = 32  # pipelined sends, answers read as they come
                    for start in range(0, n_msgs, window):
                        batch = range(start, min(start + window, n_msgs))
                        for i in batch:
                            await p.send(RC.SEND_MESSAGE, send_ext(topic, i % queues), b"m%06d" % i)
                        for _ in batch:
                            r = await p.receive()
                            assert r.code == ResponseCode.SUCCESS, r
                            sent.append(r.opaque)
                finally:
                    await p.aclose()

            async def consumer() -> None:
                nonlocal pulled
                c = await RawConn.open(addr)
                offsets = [0] * queues
                try:
                    while pulled < n_msgs:
                        for q in range(queues):
                            r = await c.call(RC.PULL_MESSAGE, pull_ext(topic, q, offsets[q], suspend_ms=200))
                            if r.code == ResponseCode.SUCCESS:
                                got = int(r.ext["nextBeginOffset"]) - offsets[q]
                                pulled += got
                                offsets[q] += got
                finally:
                    await c.aclose()

            t1 = trio.current_time()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(producer)
                nursery.start_soon(consumer)
                for i, c in enumerate(conns):
                    nursery.start_soon(idle_client, c, i)
            traffic_s = trio.current_time() - t1
            assert len(sent) == n_msgs and pulled == n_msgs and answered == 3 * n_conns
            assert broker.server.refused_connections == 0
            # every connection is still open and answering
            async with trio.open_nursery() as nursery:
                for c in conns:
                    nursery.start_soon(c.call, RC.GET_MAX_OFFSET, {"topic": topic, "queueId": 0})
        print(f"\n{n_conns} connections in {connected_s:.1f} s; with them open, {n_msgs} messages sent and pulled "
              f"and {answered} requests of the idle connections answered in {traffic_s:.1f} s")
        for c in conns:
            await c.aclose()


# ---------------------------------------------------------------------------------------------- held long polls


async def test_hundreds_of_held_long_polls_answered_on_arrival(tmp_path: Path) -> None:
    n, topic = 300, "LoadHeld"
    ensure_fds(2 * n + 200)
    async with open_broker(config(tmp_path)) as broker:
        broker.topic_config_manager.ensure_topic(topic, n)
        long_polling = broker.long_polling
        addr = broker.address
        with trio.fail_after(60):
            conns = []
            for _ in range(n):
                conns.append(await RawConn.open(addr))
            for q, c in enumerate(conns):  # one consumer per (empty) queue, each pull held up to 15 s
                await c.send(RC.PULL_MESSAGE, pull_ext(topic, q, 0, suspend_ms=15_000))
            while long_polling.held < n:
                await trio.sleep(0.01)
            assert long_polling.held == n
            await trio.sleep(0.3)
            assert all(not c.ready for c in conns)  # nothing answered yet: they are held
            latencies: list[float] = []

            async def await_answer(q: int, c: RawConn, sent_at: list[float]) -> None:
                r = await c.receive()
                latencies.append(trio.current_time() - sent_at[0])
                assert r.code == ResponseCode.SUCCESS, r
                assert int(r.ext["nextBeginOffset"]) == 1

            p = await RawConn.open(addr)
            sent_at = [0.0]
            async with trio.open_nursery() as nursery:
                for q, c in enumerate(conns):
                    nursery.start_soon(await_answer, q, c, sent_at)
                sent_at[0] = trio.current_time()
                for q in range(n):
                    await p.send(RC.SEND_MESSAGE, send_ext(topic, q), b"wake up")
                for _ in range(n):
                    assert (await p.receive()).code == ResponseCode.SUCCESS
            await p.aclose()
            assert long_polling.held == 0 and len(latencies) == n
        print(f"\n{n} held long polls on {n} queues; a send to each queue (pipelined) answered them all within "
              f"{max(latencies) * 1000:.0f} ms of the first send")
        for c in conns:
            await c.aclose()


# ---------------------------------------------------------------------------------------------- slow readers


BIG_BODY = 120 * 1024  # two of them fill a pull's 256 KiB
FLOW_ENV = {
    "TRIMQ_BROKER_MAX_PENDING_WRITE_BYTES": str(4 * MIB),
    "TRIMQ_BROKER_MAX_TOTAL_PENDING_WRITE_BYTES": str(16 * MIB),
}


@pytest.fixture
def broker_proc(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str, Path]]:
    with broker_process(tmp_path, FLOW_ENV) as started:
        yield started


@contextmanager
def broker_process(tmp_path: Path, settings: dict[str, str], argv: list[str] | None = None,
                   log_level: str = "warning") -> Iterator[tuple[subprocess.Popen[bytes], str, Path]]:
    """``trimq-broker`` (or ``argv``) as a subprocess with ``settings`` (TRIMQ_BROKER_* variables) and nothing else
    from the environment's TRIMQ_*; yields the process, its address and its (JSON) log file."""
    store = tmp_path / "store"
    log = tmp_path / "broker.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIMQ_")} | settings
    command = argv or [str(Path(sys.executable).parent / "trimq-broker")]
    with open(log, "wb") as out:
        proc = subprocess.Popen([*command, "--listen", "127.0.0.1:0",
                                 "--store", str(store), "--log-format", "json", "--log-level", log_level],
                                stdout=out, stderr=out, env=env)
    try:
        yield proc, listened_address(store / ADDRESS_FILE_NAME, proc, 30, log=log), log
    finally:
        proc.kill()
        proc.wait(10)


async def test_peers_that_never_read_cannot_grow_the_broker_without_bound(
        broker_proc: tuple[subprocess.Popen[bytes], str, Path]) -> None:
    """Four peers pipeline 1500 pulls of 256 KiB each and never read (1.5 GB of answers); a fifth holds 1000
    long polls on an empty queue, never reads, and then the queue gets big messages (1000 answers of 240 KiB).
    The broker's RSS stays within the configured flow-control bounds (4 MiB per connection, 16 MiB in all)
    plus slack, the excess answers become SYSTEM_BUSY, and a peer that reads is served throughout."""
    proc, addr, log = broker_proc
    ps = psutil.Process(proc.pid)
    ensure_fds(200)
    with trio.fail_after(60):
        producer = await RawConn.open(addr)
        for i in range(16):  # ~2 MiB of big messages on BigPulls/0; HeldBig/0 exists, empty
            r = await producer.call(RC.SEND_MESSAGE, send_ext("BigPulls", 0), bytes([65 + i % 26]) * BIG_BODY)
            assert r.code == ResponseCode.SUCCESS, r
        r = await producer.call(RC.SEND_MESSAGE, send_ext("HeldBig", 0), b"first")
        assert r.code == ResponseCode.SUCCESS, r
        healthy = await RawConn.open(addr)
        assert (await healthy.call(RC.PULL_MESSAGE, pull_ext("BigPulls", 0, 0))).code == ResponseCode.SUCCESS
        await trio.sleep(0.5)
        baseline = ps.memory_info().rss
        peak = baseline
        served: list[float] = []
        stop = trio.Event()

        async def watch_rss() -> None:
            nonlocal peak
            while not stop.is_set():
                peak = max(peak, ps.memory_info().rss)
                await trio.sleep(0.05)

        async def flood(n: int) -> None:
            c = await RawConn.open(addr)
            data = b"".join(c.frame(RC.PULL_MESSAGE, pull_ext("BigPulls", 0, 0))[1] for _ in range(n))
            with trio.move_on_after(8):  # the broker stops reading us once we are behind: TCP pushes back
                await c.stream.send_all(data)
            await stop.wait()  # never read; keep the connection open until the end
            await c.aclose()

        async def held_then_burst(n: int) -> None:
            c = await RawConn.open(addr)
            data = b"".join(c.frame(RC.PULL_MESSAGE, pull_ext("HeldBig", 0, 1, suspend_ms=15_000))[1]
                            for _ in range(n))
            await c.stream.send_all(data)
            await trio.sleep(1.0)  # all held by now
            p = await RawConn.open(addr)
            for _ in range(2):
                assert (await p.call(RC.SEND_MESSAGE, send_ext("HeldBig", 0), b"Z" * 250 * 1024)).code == 0
            await p.aclose()
            await stop.wait()
            await c.aclose()

        async def reader() -> None:
            # A well-behaved peer: small requests and big pulls, answers read, each within a bound.
            i = 0
            while not stop.is_set():
                t = trio.current_time()
                r = await healthy.call(RC.GET_MAX_OFFSET, {"topic": "BigPulls", "queueId": 0})
                assert r.code == ResponseCode.SUCCESS, r
                r = await healthy.call(RC.PULL_MESSAGE, pull_ext("BigPulls", 0, i % 16))
                assert r.code == ResponseCode.SUCCESS, r
                served.append(trio.current_time() - t)
                i += 1
                await trio.sleep(0.05)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch_rss)
            nursery.start_soon(reader)
            for _ in range(4):
                nursery.start_soon(flood, 1500)
            nursery.start_soon(held_then_burst, 1000)
            await trio.sleep(8)
            stop.set()
        growth = peak - baseline
    text = log.read_text()
    rejections = max((json.loads(line).get("rejections", 0) for line in text.splitlines()
                      if '"connection.flow_control"' in line), default=0)
    print(f"\nbroker RSS: baseline {baseline / MIB:.0f} MiB, peak {peak / MIB:.0f} MiB (+{growth / MIB:.0f} MiB) while "
          f"peers that never read asked for ~{(4 * 1500 * 240 * 1024 + 1000 * 240 * 1024) / MIB:.0f} MiB of answers; "
          f"healthy peer: {len(served)} rounds, slowest {max(served) * 1000:.0f} ms; "
          f"SYSTEM_BUSY answers (last logged count): {rejections}")
    assert proc.poll() is None, "the broker died"
    assert growth < 96 * MIB, f"the broker grew by {growth / MIB:.0f} MiB"
    assert served and max(served) < 5.0, served
    assert "connection.flow_control" in text


async def test_flow_control_bounds_unsent_bytes_and_answers_system_busy() -> None:
    """The server alone: a handler answering 64 KiB bodies to a peer that pipelines 400 requests and never
    reads. Unsent bytes stay within the connection's bound plus one frame, the excess answers are SYSTEM_BUSY
    (read them all at the end: every request got an answer, none was lost), and the counts return to zero."""
    from trimq.runtime.server import RemotingServer

    server = RemotingServer(max_pending_write_bytes=512 * 1024, max_total_pending_write_bytes=4 * MIB,
                            busy_body_bytes=16 * 1024)
    body = b"x" * 64 * 1024

    async def big(cmd: RemotingCommand, conn: Any) -> RemotingCommand:
        return RemotingCommand.response_to(cmd, body=body)

    server.register(9999, big)
    async with trio.open_nursery() as nursery:
        addrs = await nursery.start(server.serve, "127.0.0.1", 0)
        c = await RawConn.open(f"127.0.0.1:{addrs[0][1]}")
        await c.stream.send_all(b"".join(c.frame(9999, {})[1] for _ in range(400)))
        worst = 0
        for _ in range(40):
            await trio.sleep(0.01)
            worst = max(worst, server.pending_write_bytes)
        assert worst <= 512 * 1024 + 70 * 1024, worst
        codes = [(await c.receive()).code for _ in range(400)]
        assert codes.count(ResponseCode.SUCCESS) + codes.count(ResponseCode.SYSTEM_BUSY) == 400
        assert codes.count(ResponseCode.SYSTEM_BUSY) == server.flow_control_rejections > 0
        await c.aclose()
        while server.connections:
            await trio.sleep(0.01)
        assert server.pending_write_bytes == 0
        server.shutdown()


# ------------------------------------------------------------------------ many peers that never read, small answers

SMALL_BODY = 3 * 1024  # four of them make a pull answer of ~12.5 KiB: under busy_body_bytes, so never SYSTEM_BUSY
N_SILENT = 16
SILENT_PULLS = 1000  # per peer: ~12 MiB of answers asked for, 200 MiB in all
SILENT_ENV = {
    "TRIMQ_BROKER_MAX_PENDING_WRITE_BYTES": str(4 * MIB),
    "TRIMQ_BROKER_MAX_TOTAL_PENDING_WRITE_BYTES": str(8 * MIB),
    "TRIMQ_BROKER_MAX_WRITE_STALL_MS": "3000",
}
#: RSS growth allowed while they are paused: the 8 MiB budget plus a frame, 16 KiB and a 16 KiB slice of decoded
#: requests per peer, and the allocator's slack. Without the one budget each peer held its own 4 MiB (64 MiB).
SILENT_RSS_BOUND = 40 * MIB


def metrics_port_from_log(log: Path) -> int:
    """The port a broker started with ``metrics_port`` 0 bound, from its ``metrics.started`` log line (written
    before the broker address file, so it is there once the broker is up)."""
    for line in log.read_text().splitlines():
        if '"metrics.started"' in line:
            return int(json.loads(line)["address"].rsplit(":", 1)[1])
    raise AssertionError(f"no metrics.started line in the broker's log:\n{log.read_text()}")


async def scrape(port: int, name: str) -> float:
    """One sample of the broker's metrics endpoint (the sum over labels of ``name``)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        await stream.send_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        data = b""
        while chunk := await stream.receive_some(65536):
            data += chunk
    total = 0.0
    for line in data.decode().splitlines():
        if line.startswith(name):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def flood_and_measure(tmp_path: Path, settings: dict[str, str], argv: list[str] | None = None,
                            until_closed: bool = True) -> dict[str, Any]:
    """16 peers pipeline pulls with small answers and never read while a 17th reads; returns the broker's RSS
    growth, what the reader saw, and how many peers the broker closed (when ``until_closed``, after waiting for
    all of them to be closed, else after a fixed 6 s)."""
    # Port 0, not a port found free beforehand: nothing else can take it between the check and the bind.
    metrics_env = {"TRIMQ_BROKER_METRICS_PORT": "0"}
    with broker_process(tmp_path, settings | metrics_env, argv, log_level="info") as (proc, addr, log):
        metrics_port = metrics_port_from_log(log)
        ps = psutil.Process(proc.pid)
        ensure_fds(200)
        with trio.fail_after(60):
            producer = await RawConn.open(addr)
            for i in range(8):
                r = await producer.call(RC.SEND_MESSAGE, send_ext("SmallPulls", 0), bytes([65 + i]) * SMALL_BODY)
                assert r.code == ResponseCode.SUCCESS, r
            await producer.aclose()
            healthy = await RawConn.open(addr)
            r = await healthy.call(RC.PULL_MESSAGE, pull_ext("SmallPulls", 0, 0, max_nums=4))
            assert r.code == ResponseCode.SUCCESS and 10 * 1024 < len(r.body) < 16 * 1024, r
            await trio.sleep(0.5)
            baseline = peak = ps.memory_info().rss
            served: list[int] = []
            closed_peers = 0
            stop = trio.Event()

            async def watch_rss() -> None:
                nonlocal peak
                while not stop.is_set():
                    peak = max(peak, ps.memory_info().rss)
                    await trio.sleep(0.02)

            async def silent_peer() -> None:
                nonlocal closed_peers
                c = await RawConn.open(addr)
                data = b"".join(c.frame(RC.PULL_MESSAGE, pull_ext("SmallPulls", 0, i % 4, max_nums=4))[1]
                                for i in range(SILENT_PULLS))
                try:
                    with trio.move_on_after(5):  # the broker stops reading a paused peer: TCP pushes back
                        await c.stream.send_all(data)
                    await stop.wait()  # never read until the end
                    with trio.move_on_after(5):
                        while await c.stream.receive_some(1024 * 1024):
                            pass  # what the kernel still holds, then EOF: the broker closed us
                        closed_peers += 1
                except trio.BrokenResourceError:
                    closed_peers += 1  # reset by the broker
                finally:
                    await c.aclose()

            async def reader() -> None:
                i = 0
                while not stop.is_set():
                    r = await healthy.call(RC.GET_MAX_OFFSET, {"topic": "SmallPulls", "queueId": 0})
                    assert r.code == ResponseCode.SUCCESS, r
                    r = await healthy.call(RC.PULL_MESSAGE, pull_ext("SmallPulls", 0, i % 4, max_nums=4))
                    assert r.code == ResponseCode.SUCCESS, r
                    served.append(i)
                    i += 1
                    await trio.sleep(0.02)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch_rss)
                nursery.start_soon(reader)
                for _ in range(N_SILENT):
                    nursery.start_soon(silent_peer)
                if until_closed:
                    stalled = 'trimq_connections_closed_total{reason="write_stalled"}'
                    while await scrape(metrics_port, stalled) < N_SILENT:
                        await trio.sleep(0.2)
                else:
                    await trio.sleep(6)
                paused_rounds = len(served)
                stop.set()
            pending_after = await scrape(metrics_port, "trimq_pending_write_bytes")
        alive = proc.poll() is None
    return {"baseline": baseline, "growth": peak - baseline, "served": len(served), "paused_rounds": paused_rounds,
            "closed_peers": closed_peers, "pending_after": pending_after, "alive": alive,
            "log": log.read_text() if log.exists() else ""}


async def test_sixteen_peers_that_never_read_small_answers_stay_within_one_budget(tmp_path: Path) -> None:
    """Small answers (pulls of ~12.5 KiB, under busy_body_bytes) count against the one answer budget: 16 peers
    that pipeline 1000 pulls each and never read are paused once the broker holds 8 MiB unsent, so its RSS grows
    by less than SILENT_RSS_BOUND (docs/OPERATIONS.md "Memory"); a peer that reads is served meanwhile; the
    paused peers are closed after max_write_stall_ms (3 s here) and their answers freed."""
    got = await flood_and_measure(tmp_path, SILENT_ENV)
    print(f"\n{N_SILENT} peers that never read, small answers: broker RSS baseline {got['baseline'] / MIB:.0f} MiB, "
          f"growth {got['growth'] / MIB:.1f} MiB (bound {SILENT_RSS_BOUND / MIB:.0f} MiB); reader served "
          f"{got['served']} rounds; {got['closed_peers']} peers closed by the broker")
    assert got["alive"], "the broker died"
    assert got["growth"] < SILENT_RSS_BOUND, f"the broker grew by {got['growth'] / MIB:.0f} MiB"
    assert got["paused_rounds"] > 0 and got["served"] > 0
    assert got["closed_peers"] == N_SILENT
    assert got["pending_after"] == 0
    assert "connection.write_stalled" in got["log"]
