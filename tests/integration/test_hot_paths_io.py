"""The request paths added for the peer benchmark, over real loopback sockets.

* RemotingServer: ``inline`` handlers, ``fast_path`` answers / fallbacks / DEFERRED answers, and a graceful
  stop that waits for deferred answers;
* held pulls without a task: a closed connection's held pull is dropped, past the per-connection bound a pull
  takes the task path and is still answered;
* ``Producer.send_batches`` (pipelined batches) and ``RemotingClient.invoke_many``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio

from trimq.client import Message, Producer, ProducerConfig
from trimq.client.errors import MQBrokerError
from trimq.protocol import RemotingCommand, RequestCode, ResponseCode
from trimq.protocol.message_queue import MessageQueue
from trimq.protocol.record import iter_records
from trimq.runtime.client import RemotingClient, RemotingTimeoutError
from trimq.runtime.server import DEFERRED, Connection, Deferred, RemotingServer

INLINE, FAST, LATER, SLOW = 1100, 1101, 1102, 1103


async def test_inline_fast_and_deferred_handlers() -> None:
    held: list[tuple[Connection, RemotingCommand]] = []
    ran_in_task: list[int] = []

    async def inline(cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        return RemotingCommand.response_to(cmd, body=b"inline:" + cmd.body)

    async def full(cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        ran_in_task.append(cmd.ext["n"])
        return RemotingCommand.response_to(cmd, body=b"task")

    def fast(cmd: RemotingCommand, conn: Connection) -> RemotingCommand | Deferred | None:
        n = cmd.ext["n"]
        if n == 0:
            return RemotingCommand.response_to(cmd, body=b"fast")
        if n == 1:
            return None  # the full handler answers
        if n == 2:
            raise ValueError("the full handler gives the proper error")
        conn.defer()
        held.append((conn, cmd))
        return DEFERRED

    async def slow(cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        await trio.sleep(0.2)
        return RemotingCommand.response_to(cmd, body=b"slow")

    server = RemotingServer(name="t")
    server.register(INLINE, inline, inline=True)
    server.register(FAST, full, fast_path=fast)
    server.register(SLOW, slow)
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve, "127.0.0.1", 0)
        async with RemotingClient() as rc:
            addr = server.address
            r = await rc.invoke(addr, RemotingCommand.request(INLINE, body=b"x"))
            assert r.body == b"inline:x"
            assert (await rc.invoke(addr, RemotingCommand.request(FAST, {"n": 0}))).body == b"fast"
            assert (await rc.invoke(addr, RemotingCommand.request(FAST, {"n": 1}))).body == b"task"
            assert (await rc.invoke(addr, RemotingCommand.request(FAST, {"n": 2}))).body == b"task"
            assert ran_in_task == [1, 2]
            # a slow task-path request does not hold up a later inline one on the same connection
            got: list[bytes] = []

            async def one(code: int) -> None:
                got.append((await rc.invoke(addr, RemotingCommand.request(code, body=b"y"))).body)

            async with trio.open_nursery() as n2:
                n2.start_soon(one, SLOW)
                await trio.sleep(0.05)
                n2.start_soon(one, INLINE)
            assert got == [b"inline:y", b"slow"]
            # DEFERRED: answered later, out of band
            result: dict[str, Any] = {}

            async def deferred() -> None:
                result["r"] = await rc.invoke(addr, RemotingCommand.request(FAST, {"n": 3}))

            async with trio.open_nursery() as n3:
                n3.start_soon(deferred)
                while not held:
                    await trio.sleep(0.01)
                conn, cmd = held.pop()
                assert conn.deferred == 1
                conn.answer_deferred(RemotingCommand.response_to(cmd, body=b"later"))
            assert result["r"].body == b"later" and conn.deferred == 0
            # a graceful stop waits for deferred answers (bounded by the grace period)
            async with trio.open_nursery() as n4:
                n4.start_soon(deferred)
                while not held:
                    await trio.sleep(0.01)
                conn, cmd = held.pop()
                server.shutdown()
                await trio.sleep(0.1)
                assert result["r"].body != b"stop"
                conn.answer_deferred(RemotingCommand.response_to(cmd, body=b"stop"))
            assert result["r"].body == b"stop"
        nursery.cancel_scope.cancel()


async def test_held_pulls_of_a_closed_connection_are_dropped(broker_factory: Callable[..., Any]) -> None:
    async with broker_factory(flush_interval_ms=60_000) as b, RemotingClient() as rc:
        ext = {"producerGroup": "p", "topic": "Held", "queueId": 0, "bornTimestamp": 0}
        assert (await rc.invoke(b.address, RemotingCommand.request(RequestCode.SEND_MESSAGE, ext, b"m0"))).ok
        pull = {"consumerGroup": "g", "topic": "Held", "queueId": 0, "queueOffset": 1, "maxMsgNums": 32,
                "sysFlag": 0x2, "suspendTimeoutMillis": 15_000, "subscription": "*"}
        lp = b.long_polling
        async with RemotingClient() as rc2, trio.open_nursery() as nursery:
            async def pull_on_rc2() -> None:
                await rc2.invoke(b.address, RemotingCommand.request(RequestCode.PULL_MESSAGE, pull), 30)

            nursery.start_soon(pull_on_rc2)
            while lp.held == 0:
                await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
        # the connection is gone: the next arrival drops its held pull instead of answering it
        await trio.sleep(0.05)
        assert (await rc.invoke(b.address, RemotingCommand.request(RequestCode.SEND_MESSAGE, ext, b"m1"))).ok
        assert lp.held == 0
        # a live held pull is answered by the arrival
        async with trio.open_nursery() as nursery:
            res: dict[str, Any] = {}

            async def pull2() -> None:
                res["r"] = await rc.invoke(b.address, RemotingCommand.request(
                    RequestCode.PULL_MESSAGE, {**pull, "queueOffset": 2}), 30)

            nursery.start_soon(pull2)
            while lp.held == 0:
                await trio.sleep(0.01)
            assert (await rc.invoke(b.address, RemotingCommand.request(RequestCode.SEND_MESSAGE, ext, b"m2"))).ok
        assert res["r"].code == ResponseCode.SUCCESS
        assert [m.body for m in iter_records(res["r"].body)] == [b"m2"]


async def test_pulls_past_the_connection_bound_take_the_task_path(broker_factory: Callable[..., Any]) -> None:
    async with broker_factory(flush_interval_ms=60_000) as b, RemotingClient() as rc:
        b.server.max_inflight_requests = 2  # two held without a task, the third in a task
        ext = {"producerGroup": "p", "topic": "Bound", "queueId": 0, "bornTimestamp": 0}
        assert (await rc.invoke(b.address, RemotingCommand.request(RequestCode.SEND_MESSAGE, ext, b"m0"))).ok
        pull = {"consumerGroup": "g", "topic": "Bound", "queueId": 0, "queueOffset": 1, "maxMsgNums": 32,
                "sysFlag": 0x2, "suspendTimeoutMillis": 15_000, "subscription": "*"}
        lp = b.long_polling
        answers: list[RemotingCommand] = []
        async with trio.open_nursery() as nursery:
            async def one() -> None:
                answers.append(await rc.invoke(b.address, RemotingCommand.request(RequestCode.PULL_MESSAGE, pull), 30))

            for _ in range(3):
                nursery.start_soon(one)
            while lp.held < 3:
                await trio.sleep(0.01)
            assert (await rc.invoke(b.address, RemotingCommand.request(RequestCode.SEND_MESSAGE, ext, b"m1"))).ok
        assert [a.code for a in answers] == [ResponseCode.SUCCESS] * 3


async def test_send_batches_pipelines_batches_in_order(broker_factory: Callable[..., Any]) -> None:
    async with broker_factory(embedded_namesrv=True, flush_interval_ms=60_000) as b:
        cfg = ProducerConfig(producer_group="pipe", namesrv_addr=b.address)
        async with Producer(cfg) as producer, RemotingClient() as rc:
            await producer.send(Message("Pipe", b"warm-up"))
            mqs = sorted(await producer.message_queues("Pipe"))
            window = [([Message("Pipe", f"{q}-{i}".encode()) for i in range(3)], mqs[q]) for q in range(len(mqs))]
            window.append(([Message("Pipe", b"again")], mqs[0]))  # a second batch for queue 0, after the first
            results = await producer.send_batches(window)
            assert [r.message_queue for r in results] == [mq for _, mq in window]
            assert results[-1].queue_offset == results[0].queue_offset + 3
            for r, (msgs, _) in zip(results, window, strict=True):
                assert len(r.msg_id.split(",")) == len(msgs)
            pull = {"consumerGroup": "g", "topic": "Pipe", "queueId": mqs[0].queue_id,
                    "queueOffset": results[0].queue_offset, "maxMsgNums": 32, "sysFlag": 0, "subscription": "*"}
            resp = await rc.invoke(b.address, RemotingCommand.request(RequestCode.PULL_MESSAGE, pull))
            assert [m.body for m in iter_records(resp.body)] == [b"0-0", b"0-1", b"0-2", b"again"]
            # a failing batch fails the call, after the others completed
            bad = MessageQueue("Pipe", mqs[0].broker_name, 99)
            try:
                await producer.send_batches([([Message("Pipe", b"ok")], mqs[1]), ([Message("Pipe", b"no")], bad)])
            except MQBrokerError as exc:
                assert exc.code == ResponseCode.SYSTEM_ERROR
            else:
                raise AssertionError("a batch to an invalid queue must fail the call")


async def test_invoke_many_reports_each_request() -> None:
    async def echo(cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        if cmd.ext.get("hang"):
            await trio.sleep(10)
        return RemotingCommand.response_to(cmd, body=cmd.body)

    server = RemotingServer(name="t")
    server.register(INLINE, echo)
    async with trio.open_nursery() as nursery:
        await nursery.start(server.serve, "127.0.0.1", 0)
        async with RemotingClient() as rc:
            cmds = [RemotingCommand.request(INLINE, {"hang": i == 1}, bytes([i])) for i in range(3)]
            out = await rc.invoke_many(server.address, cmds, 0.3)
            assert isinstance(out[1], RemotingTimeoutError)
            assert [o.body for o in (out[0], out[2]) if isinstance(o, RemotingCommand)] == [b"\x00", b"\x02"]
        nursery.cancel_scope.cancel()
