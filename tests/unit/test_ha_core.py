"""The HA cores without a network: the replication stream codec (chunking-invariant), the truncation rule of the
epoch history, and the SYNC_MASTER wait (one acknowledgement releases every send it covers; the timeout and the
missing slave) on trio's MockClock."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from trimq.broker.config import BrokerConfig
from trimq.broker.ha.slave_sync import SlaveSynchronize
from trimq.broker.store.ha.codec import (
    HAProtocolError,
    Hello,
    HelloAck,
    StreamBuffer,
    encode_hello,
    encode_hello_ack,
    encode_offset_report,
    encode_transfer_header,
)
from trimq.broker.store.ha.history import HAState, truncation_point
from trimq.broker.store.ha.master import HAConnection, HAService
from trimq.broker.store.read import ReadGate
from trimq.broker.store.store_base import PutMessageStatus
from trimq.runtime.settings import ConfigError


def test_wire_bytes_are_the_documented_ones() -> None:
    assert encode_offset_report(0x0102) == bytes(6) + b"\x01\x02"
    assert encode_transfer_header(7, 3) == bytes(7) + b"\x07" + bytes(3) + b"\x03"
    assert encode_hello(Hello(2, 5)) == b"TQHA" + bytes(3) + b"\x01" + bytes(7) + b"\x02" + bytes(7) + b"\x05"


@given(st.lists(st.integers(1, 50), min_size=1, max_size=20))
def test_decoding_does_not_depend_on_how_the_bytes_are_split(cuts: list[int]) -> None:
    ack = HelloAck(3, 9, 4096, "127.0.0.1:10911", "", ((1, 0), (3, 2048)))
    stream = (encode_hello_ack(ack) + encode_transfer_header(4096, 5) + b"abcde" + encode_transfer_header(4101, 0))
    buf = StreamBuffer()
    got: list[object] = []
    pos = 0
    for n in itertools.cycle(cuts):
        buf.feed(stream[pos : pos + n])
        pos += n
        if not got:
            a = buf.next_hello_ack()
            if a is not None:
                got.append(a)
        while got and (frame := buf.next_transfer()) is not None:
            got.append(frame)
        if pos >= len(stream):
            break
    assert got == [ack, (4096, b"abcde"), (4101, b"")]


def test_malformed_streams_are_refused() -> None:
    buf = StreamBuffer()
    buf.feed(b"HTTP" + bytes(20))
    with pytest.raises(HAProtocolError, match="not a trimq replication stream"):
        buf.next_hello()
    buf = StreamBuffer()
    buf.feed(encode_transfer_header(0, 2**30))
    with pytest.raises(HAProtocolError):
        buf.next_transfer()
    # a broker epoch no broker could have (the slave would keep it, and promote above it)
    for master_epoch, broker_epoch in ((1, -1), (1, 2**31), (-2, 3)):
        buf = StreamBuffer()
        buf.feed(encode_hello_ack(HelloAck(master_epoch, broker_epoch, 0, "127.0.0.1:10911", "", ())))
        with pytest.raises(HAProtocolError, match="hello answer with master epoch"):
            buf.next_hello_ack()


def test_truncation_point() -> None:
    history = [(1, 0), (2, 5000), (4, 9000)]
    # same epoch: keep what both have
    assert truncation_point(history, 4, 9500, 12000) == 9500
    assert truncation_point(history, 4, 13000, 12000) == 12000
    # from epoch 1: everything past the start of epoch 2 was written by a master that was superseded
    assert truncation_point(history, 1, 7000, 12000) == 5000
    assert truncation_point(history, 1, 4000, 12000) == 4000
    assert truncation_point(history, 2, 9999, 12000) == 9000  # epoch 3 never wrote: epoch 4 starts at 9000
    assert truncation_point(history, 0, 0, 12000) == 0
    # no epoch known (a store from before HA): trusted up to what the master has, as RocketMQ does
    assert truncation_point(history, 0, 7000, 12000) == 7000


def test_ha_state_file_round_trip(tmp_path: object) -> None:
    path = str(tmp_path) + "/haState.json"  # type: ignore[operator]
    state = HAState(path)
    state.begin_epoch(1, 0)
    state.begin_epoch(2, 777)
    state.broker_role, state.broker_id = "SYNC_MASTER", 0
    state.save()
    again = HAState(path).load()
    assert again.history == [(1, 0), (2, 777)] and again.master_epoch == 2 and again.broker_role == "SYNC_MASTER"
    with pytest.raises(ValueError):
        again.begin_epoch(2, 900)


class _Store:
    """What the wait reads of a store: nothing but the arrival hook and the read gate it releases."""

    def __init__(self) -> None:
        self.arrival_listeners: list[object] = []
        self.read_gate = ReadGate(lambda: 0)


def _service(**kw: int) -> HAService:
    return HAService(_Store(), HAState(None, history=[(1, 0)]), **kw)  # type: ignore[arg-type]


async def test_sync_master_wait_one_ack_releases_every_covered_send() -> None:
    svc = _service(slave_timeout_ms=3_000)
    results: dict[int, PutMessageStatus] = {}

    async def send(end: int) -> None:
        results[end] = await svc.wait_for_slave(end)

    assert await svc.wait_for_slave(10) is PutMessageStatus.SLAVE_NOT_AVAILABLE  # no slave connected
    svc.connections.append(HAConnection("slave"))
    async with trio.open_nursery() as nursery:
        for end in (100, 200, 300):
            nursery.start_soon(send, end)
        await trio.testing.wait_all_tasks_blocked()
        assert not results and len(svc._waiters) == 3
        svc.push_slave_max_offset = 250  # one report covering the first two sends
        svc._release_waiters()
        await trio.testing.wait_all_tasks_blocked()
        assert results == {100: PutMessageStatus.PUT_OK, 200: PutMessageStatus.PUT_OK}
        svc.push_slave_max_offset = 300
        svc._release_waiters()
    assert results[300] is PutMessageStatus.PUT_OK and svc.sync_ok == 3


async def test_sync_master_wait_times_out_after_slave_timeout(autojump_clock: trio.testing.MockClock) -> None:
    svc = _service(slave_timeout_ms=3_000)
    svc.connections.append(HAConnection("slave"))
    t0 = trio.current_time()
    assert await svc.wait_for_slave(100) is PutMessageStatus.FLUSH_SLAVE_TIMEOUT
    assert trio.current_time() - t0 == pytest.approx(3.0)
    assert svc.sync_timeouts == 1 and not svc._waiters
    # a slave too far behind is not waited for
    svc.fallbehind_max = 50
    assert await svc.wait_for_slave(100) is PutMessageStatus.SLAVE_NOT_AVAILABLE


async def test_a_slave_that_disconnects_releases_the_waits_as_slave_not_available() -> None:
    svc = _service(slave_timeout_ms=3_000)
    conn = HAConnection("slave")
    svc.connections.append(conn)
    out: list[PutMessageStatus] = []

    async def send() -> None:
        out.append(await svc.wait_for_slave(100))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(send)
        await trio.testing.wait_all_tasks_blocked()
        svc.connections.remove(conn)
        svc._release_waiters()
    assert out == [PutMessageStatus.SLAVE_NOT_AVAILABLE]


def test_the_lost_tail_boundary_of_a_position_from_an_older_epoch() -> None:
    """Pulls and commits share it (docs/PROTOCOL.md §7): a position reached under an older epoch, past the queue
    offset where the first newer epoch began in this log, was read from records this log does not have."""
    state = HAState(None, history=[(1, 0), (2, 500), (4, 900)])
    at = {500: 7, 900: 12}.__getitem__  # commit-log offset -> the queue's offset there
    assert state.lost_tail_boundary(1, 9, at) == 7  # epoch 2 began at 500, queue offset 7
    assert state.lost_tail_boundary(1, 7, at) is None  # at the boundary: the position stands
    assert state.lost_tail_boundary(2, 13, at) == 12  # epoch 3 never wrote here: the next newer one is 4
    assert state.lost_tail_boundary(3, 13, at) == 12
    assert state.lost_tail_boundary(4, 99, at) is None  # the newest: nothing lost
    assert state.lost_tail_boundary(5, 99, at) is None
    assert state.lost_tail_boundary(-1, 99, at) is None  # not said


class _RecordedSync(SlaveSynchronize):
    """The slave's sync schedule alone: each round records its time instead of asking a master."""

    def __init__(self, *, interval_ms: int, offset_interval_ms: int, round_s: float = 0) -> None:
        nothing: Any = None
        super().__init__(master_addr=lambda: "127.0.0.1:10911", topics=nothing, groups=nothing, offsets=nothing,
                         schedule=None, interval_ms=interval_ms, offset_interval_ms=offset_interval_ms)
        self.rounds: list[tuple[str, float]] = []
        self.round_s = round_s  # how long a round takes

    async def sync_all(self, rc: Any) -> bool:
        self.rounds.append(("all", trio.current_time()))
        await trio.sleep(self.round_s)
        return True

    async def sync_offsets(self, rc: Any) -> bool:
        self.rounds.append(("offsets", trio.current_time()))
        await trio.sleep(self.round_s)
        return True


async def _schedule(sync: _RecordedSync) -> list[tuple[str, float]]:
    t0 = trio.current_time()
    no_client: Any = None  # the recorded rounds never ask a master
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sync.run, no_client)
        await trio.sleep(15.5)
        sync.wake()  # a handshake: everything at once
        await trio.sleep(0.25)
        nursery.cancel_scope.cancel()
    return [(kind, round(t - t0, 6)) for kind, t in sync.rounds]


async def test_a_slave_merges_offsets_every_second_between_its_full_syncs(autojump_clock: trio.abc.Clock) -> None:
    rounds = await _schedule(_RecordedSync(interval_ms=10_000, offset_interval_ms=1_000))
    assert rounds == ([("all", 3.0)] + [("offsets", float(t)) for t in range(4, 13)] + [("all", 13.0)]
                      + [("offsets", 14.0), ("offsets", 15.0), ("all", 15.5)])


async def test_without_the_offset_interval_a_slave_syncs_as_rocketmq_does(autojump_clock: trio.abc.Clock) -> None:
    rounds = await _schedule(_RecordedSync(interval_ms=10_000, offset_interval_ms=0))
    assert rounds == [("all", 3.0), ("all", 13.0), ("all", 15.5)]


async def test_a_wake_during_a_round_starts_a_full_sync_right_after_it(autojump_clock: trio.abc.Clock) -> None:
    sync = _RecordedSync(interval_ms=10_000, offset_interval_ms=1_000, round_s=0.5)
    t0 = trio.current_time()
    no_client: Any = None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sync.run, no_client)
        await trio.sleep(4.75)  # inside the offset round of 4.5-5.0 (a second after the full one ended)
        sync.wake()
        await trio.sleep(0.75)
        nursery.cancel_scope.cancel()
    assert [(kind, round(t - t0, 6)) for kind, t in sync.rounds] == [("all", 3.0), ("offsets", 4.5), ("all", 5.0)]


def test_the_offset_interval_is_zero_or_at_least_100_ms() -> None:
    assert BrokerConfig(slave_offset_sync_interval_ms=0).validate().slave_offset_sync_interval_ms == 0
    assert BrokerConfig(slave_offset_sync_interval_ms=100).validate().slave_offset_sync_interval_ms == 100
    with pytest.raises(ConfigError, match="slave_offset_sync_interval_ms"):
        BrokerConfig(slave_offset_sync_interval_ms=50).validate()
