"""Long polling on a real broker over TCP, timed with trio's MockClock (no real waiting)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import trio
import trio.testing

from trimq.protocol.codes import RequestCode, ResponseCode
from trimq.protocol.command import RemotingCommand
from trimq.protocol.message import encode_properties
from trimq.protocol.record import iter_records
from trimq.runtime.client import RemotingClient

SUSPEND = 0x2


@pytest.fixture
def mock_clock() -> trio.testing.MockClock:
    """Autojump, but only after 20 ms of real idleness: on a loaded machine the kernel may deliver a loopback
    packet a little late, and a jump meanwhile would fire the wrong timeout."""
    return trio.testing.MockClock(autojump_threshold=0.02)
QUIET = {"flush_interval_ms": 60_000, "register_broker_interval_ms": 600_000}


async def call(rc: RemotingClient, addr: str, code: int, ext: dict[str, Any], body: Any = None,
               timeout_s: float = 60) -> RemotingCommand:
    return await rc.invoke(addr, RemotingCommand.request(code, ext, body), timeout_s=timeout_s)


async def send(rc: RemotingClient, addr: str, topic: str, body: bytes, tags: str | None = None) -> RemotingCommand:
    props = encode_properties({"TAGS": tags}) if tags else ""
    r = await call(rc, addr, RequestCode.SEND_MESSAGE, {"producerGroup": "p", "topic": topic, "queueId": 0,
                                                        "bornTimestamp": 0, "properties": props}, body)
    assert r.code == ResponseCode.SUCCESS, r.remark
    return r


def held_pull(topic: str, offset: int, suspend_ms: int = 15_000, subscription: str = "*") -> dict[str, Any]:
    return {"consumerGroup": "g", "topic": topic, "queueId": 0, "queueOffset": offset, "maxMsgNums": 32,
            "sysFlag": SUSPEND, "suspendTimeoutMillis": suspend_ms, "subscription": subscription}


async def test_held_pull_is_answered_as_soon_as_a_message_arrives(
    broker_factory: Callable[..., Any], rclient: RemotingClient, mock_clock: trio.testing.MockClock
) -> None:
    async with broker_factory(**QUIET) as b:
        await send(rclient, b.address, "LP", b"warm-up")  # creates the topic (and the first segment)
        await trio.sleep(1)
        result: dict[str, Any] = {}

        async def puller() -> None:
            t0 = trio.current_time()
            result["resp"] = await call(rclient, b.address, RequestCode.PULL_MESSAGE, held_pull("LP", 1))
            result["elapsed"] = trio.current_time() - t0

        async with trio.open_nursery() as nursery:
            nursery.start_soon(puller)
            await trio.sleep(3)  # the pull is held meanwhile
            assert b.long_polling.held == 1
            await send(rclient, b.address, "LP", b"news")
        resp = result["resp"]
        assert resp.code == ResponseCode.SUCCESS
        assert [m.body for m in iter_records(resp.body)] == [b"news"]
        assert 3 <= result["elapsed"] < 3.01  # answered at once, not after the 15 s hold


async def test_held_pull_times_out_empty_after_the_suspend_timeout(
    broker_factory: Callable[..., Any], rclient: RemotingClient, mock_clock: trio.testing.MockClock
) -> None:
    async with broker_factory(suspend_timeout_ms=15_000, **QUIET) as b:
        await send(rclient, b.address, "Empty", b"only")
        for asked, expected in ((15_000, 15), (4_000, 4), (60_000, 15)):  # min(asked, the broker's limit)
            t0 = trio.current_time()
            r = await call(rclient, b.address, RequestCode.PULL_MESSAGE, held_pull("Empty", 1, asked))
            elapsed = trio.current_time() - t0
            assert r.code == ResponseCode.PULL_NOT_FOUND and r.ext["nextBeginOffset"] == 1
            assert expected <= elapsed < expected + 0.01
        # Without the suspend flag nothing is held.
        t0 = trio.current_time()
        r = await call(rclient, b.address, RequestCode.PULL_MESSAGE, {**held_pull("Empty", 1), "sysFlag": 0})
        assert r.code == ResponseCode.PULL_NOT_FOUND and trio.current_time() - t0 < 0.01


async def test_messages_of_other_tags_keep_the_pull_held(
    broker_factory: Callable[..., Any], rclient: RemotingClient, mock_clock: trio.testing.MockClock
) -> None:
    async with broker_factory(**QUIET) as b:
        await send(rclient, b.address, "Filter", b"x", tags="A")
        result: dict[str, Any] = {}

        async def puller() -> None:
            t0 = trio.current_time()
            result["resp"] = await call(rclient, b.address, RequestCode.PULL_MESSAGE,
                                        held_pull("Filter", 1, subscription="B"))
            result["elapsed"] = trio.current_time() - t0

        async with trio.open_nursery() as nursery:
            nursery.start_soon(puller)
            await trio.sleep(1)
            await send(rclient, b.address, "Filter", b"a1", tags="A")
            await trio.sleep(1)
            await send(rclient, b.address, "Filter", b"b1", tags="B")
        r = result["resp"]
        assert r.code == ResponseCode.SUCCESS and [m.body for m in iter_records(r.body)] == [b"b1"]
        assert r.ext["nextBeginOffset"] == 3 and 2 <= result["elapsed"] < 2.01
        # Only other tags until the timeout: NOT_FOUND, but the offset moved past them.
        t0 = trio.current_time()
        async with trio.open_nursery() as nursery:
            async def sender() -> None:
                await trio.sleep(1)
                await send(rclient, b.address, "Filter", b"a2", tags="A")

            nursery.start_soon(sender)
            r = await call(rclient, b.address, RequestCode.PULL_MESSAGE, held_pull("Filter", 3, 5_000, "B"))
        assert r.code == ResponseCode.PULL_NOT_FOUND and r.ext["nextBeginOffset"] == 4
        assert 5 <= trio.current_time() - t0 < 5.01


async def test_short_polling_when_long_polling_is_off(
    broker_factory: Callable[..., Any], rclient: RemotingClient, mock_clock: trio.testing.MockClock
) -> None:
    async with broker_factory(long_polling_enable=False, short_polling_time_ms=1_000, **QUIET) as b:
        await send(rclient, b.address, "Short", b"x")
        t0 = trio.current_time()
        r = await call(rclient, b.address, RequestCode.PULL_MESSAGE, held_pull("Short", 1))
        assert r.code == ResponseCode.PULL_NOT_FOUND and 1 <= trio.current_time() - t0 < 1.01


async def test_shutdown_answers_held_pulls_at_once(broker_factory: Callable[..., Any], rclient: RemotingClient,
                                                   mock_clock: trio.testing.MockClock) -> None:
    answers: list[tuple[int, float]] = []
    async with broker_factory(**QUIET) as b:
        await send(rclient, b.address, "Drain", b"x")

        async def puller() -> None:
            r = await call(rclient, b.address, RequestCode.PULL_MESSAGE, held_pull("Drain", 1))
            answers.append((r.code, trio.current_time()))

        async with trio.open_nursery() as nursery:
            for _ in range(5):
                nursery.start_soon(puller)
            await trio.sleep(2)
            assert b.long_polling.held == 5
            stop_at = trio.current_time()
            b.shutdown()
    assert [code for code, _ in answers] == [ResponseCode.PULL_NOT_FOUND] * 5
    assert all(t - stop_at < 0.01 for _, t in answers)


@pytest.mark.parametrize("field,value", [("commitOffset", "soon"), ("resetGeneration", [1]), ("lockEpoch", "x")])
async def test_a_malformed_commit_field_is_an_error_answer_and_holds_nothing(
    broker_factory: Callable[..., Any], rclient: RemotingClient, mock_clock: trio.testing.MockClock,
    field: str, value: Any
) -> None:
    """The commit fields were read after the pull was held: the request failed, but its hold stayed (a second
    answer later, and the connection's held count one too high). They are checked before anything is read."""
    async with broker_factory(**QUIET) as b:
        await send(rclient, b.address, "LP", b"warm-up")
        ext = {**held_pull("LP", 1), "sysFlag": SUSPEND | 0x1, "commitOffset": 1, field: value}
        resp = await call(rclient, b.address, RequestCode.PULL_MESSAGE, ext)
        assert resp.code == ResponseCode.SYSTEM_ERROR and repr(field) in (resp.remark or ""), resp.remark
        assert b.long_polling.held == 0
        assert b.offset_manager.query_offset("g", "LP", 0) == -1  # nothing committed either
