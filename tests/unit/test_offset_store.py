"""Offset stores: pure OffsetTable, the remote (broker) store against a fake broker API, the local file store."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio

from trimq.client.errors import MQBrokerError, MQClientError, NoPermissionError, OffsetNotFoundError
from trimq.client.offset_store import (
    MEMORY_FIRST_THEN_STORE,
    READ_FROM_MEMORY,
    READ_FROM_STORE,
    LocalFileOffsetStore,
    OffsetTable,
    RemoteBrokerOffsetStore,
    default_local_offset_dir,
)
from trimq.protocol.codes import ResponseCode
from trimq.protocol.message_queue import MessageQueue
from trimq.runtime.client import RemotingConnectError

G = "g1"


def mq(q: int, broker: str = "broker-a", topic: str = "T") -> MessageQueue:
    return MessageQueue(topic, broker, q)


def test_offset_table_increase_only() -> None:
    t = OffsetTable()
    assert t.update(mq(0), 10, True)
    assert not t.update(mq(0), 5, True)
    assert t.get(mq(0)) == 10
    assert t.update(mq(0), 5, False)
    assert t.get(mq(0)) == 5
    t.update(mq(1), 3, True)
    t.update(mq(0, topic="U"), 1, True)
    assert t.snapshot("T") == {mq(0): 5, mq(1): 3}
    t.remove(mq(1))
    assert mq(1) not in t and len(t) == 2
    with pytest.raises(TypeError):
        t.update(mq(0), "5", False)  # type: ignore[arg-type]


class FakeApi:
    """Stands in for the network side of MQClientAPI (broker offsets in a dict)."""

    def __init__(self) -> None:
        self.stored: dict[tuple[str, MessageQueue], int] = {}
        self.updates: list[tuple[str, MessageQueue, int, str | None]] = []
        self.fenced: set[MessageQueue] = set()
        self.down = False
        self.error_code: int | None = None
        self.master_epochs: list[int | None] = []  # what each update said its position's master epoch was
        self.epoch: int | None = None  # what queries say of the broker's log

    async def query_consumer_offset(self, addr: str, group: str, m: MessageQueue, *, timeout_ms: Any = None) -> int:
        if self.down:
            raise RemotingConnectError(f"cannot connect to {addr}")
        if self.error_code is not None:
            raise MQBrokerError(self.error_code, "boom", addr)
        try:
            return self.stored[(group, m)]
        except KeyError:
            raise OffsetNotFoundError(ResponseCode.QUERY_NOT_FOUND, "not found", addr) from None

    async def query_consumer_offset_state(self, addr: str, group: str, m: MessageQueue, *,
                                          timeout_ms: Any = None) -> tuple[int, int | None, int | None]:
        try:
            return await self.query_consumer_offset(addr, group, m, timeout_ms=timeout_ms), None, self.epoch
        except OffsetNotFoundError:
            return -1, None, self.epoch

    async def update_consumer_offset(self, addr: str, group: str, m: MessageQueue, offset: int,
                                     client_id: str | None = None, *, oneway: bool = False,
                                     timeout_ms: Any = None, lock_epoch: int | None = None,
                                     reset_generation: int | None = None, master_epoch: int | None = None) -> None:
        self.master_epochs.append(master_epoch)
        if self.down:
            raise RemotingConnectError(f"cannot connect to {addr}")
        if m in self.fenced:
            raise NoPermissionError(ResponseCode.NO_PERMISSION, "queue locked by another client", addr)
        self.updates.append((addr, m, offset, client_id))
        self.stored[(group, m)] = offset


class FakeBroker:
    client_id = "10.0.0.1@1"

    def __init__(self) -> None:
        self.api = FakeApi()
        self.addrs = {"broker-a": "127.0.0.1:1", "broker-b": "127.0.0.1:2"}

    async def find_broker_addr(self, broker_name: str, topic: str | None = None) -> str | None:
        return self.addrs.get(broker_name)


async def test_remote_read_offset_variants() -> None:
    b = FakeBroker()
    store = RemoteBrokerOffsetStore(G, b)  # type: ignore[arg-type]
    assert await store.read_offset(mq(0), READ_FROM_MEMORY) == -1
    assert await store.read_offset(mq(0), READ_FROM_STORE) == -1  # QUERY_NOT_FOUND: a new group
    b.api.stored[(G, mq(0))] = 42
    assert await store.read_offset(mq(0), MEMORY_FIRST_THEN_STORE) == 42
    assert await store.read_offset(mq(0), READ_FROM_MEMORY) == 42  # cached by the store read
    store.update_offset(mq(0), 50, True)
    assert await store.read_offset(mq(0), MEMORY_FIRST_THEN_STORE) == 50
    assert await store.read_offset(mq(0), READ_FROM_STORE) == 42  # the broker wins, memory follows
    assert await store.read_offset(mq(0), READ_FROM_MEMORY) == 42


async def test_remote_read_errors_are_not_mistaken_for_a_new_group() -> None:
    b = FakeBroker()
    store = RemoteBrokerOffsetStore(G, b)  # type: ignore[arg-type]
    b.api.down = True
    assert await store.read_offset(mq(0), READ_FROM_STORE) == -2
    b.api.down = False
    b.api.error_code = ResponseCode.SYSTEM_ERROR
    assert await store.read_offset(mq(0), READ_FROM_STORE) == -2  # RocketMQ 4.9.3 would say -1
    assert await store.read_offset(mq(0, broker="nowhere"), READ_FROM_STORE) == -2


async def test_remote_persist_all_sends_assigned_and_forgets_the_rest() -> None:
    b = FakeBroker()
    store = RemoteBrokerOffsetStore(G, b)  # type: ignore[arg-type]
    store.update_offset(mq(0), 5, True)
    store.update_offset(mq(1, "broker-b"), 7, True)
    store.update_offset(mq(2), 9, True)
    await store.persist_all({mq(0), mq(1, "broker-b")})
    assert sorted((a, m.queue_id, o) for a, m, o, _ in b.api.updates) == [
        ("127.0.0.1:1", 0, 5), ("127.0.0.1:2", 1, 7)]
    assert all(cid == FakeBroker.client_id for *_, cid in b.api.updates)
    assert await store.read_offset(mq(2), READ_FROM_MEMORY) == -1  # unused queue dropped from memory
    b.api.updates.clear()
    await store.persist_all(set())
    assert b.api.updates == []


async def test_remote_persist_one_remove_and_fencing() -> None:
    b = FakeBroker()
    store = RemoteBrokerOffsetStore(G, b)  # type: ignore[arg-type]
    store.update_offset(mq(0), 5, True)
    await store.persist(mq(0))
    assert b.api.stored[(G, mq(0))] == 5
    await store.persist(mq(3))  # nothing cached: nothing sent
    assert len(b.api.updates) == 1
    b.api.fenced.add(mq(0))
    store.update_offset(mq(0), 6, True)
    await store.persist(mq(0))  # refused by the broker: counted and logged, not raised
    assert store.fenced_updates == 1 and b.api.stored[(G, mq(0))] == 5
    b.api.down = True
    await store.persist_all({mq(0)})  # unreachable broker: logged, not raised
    store.remove_offset(mq(0))
    assert await store.read_offset(mq(0), READ_FROM_MEMORY) == -1
    assert store.clone_offset_table("T") == {}


async def test_local_store_round_trip_and_atomic_backup(tmp_path) -> None:
    d = tmp_path / "store"
    s1 = LocalFileOffsetStore(G, d)
    await s1.load()
    assert await s1.read_offset(mq(0), READ_FROM_STORE) == -1
    s1.update_offset(mq(0), 3, True)
    s1.update_offset(mq(1), 4, True)
    await s1.persist_all({mq(0), mq(1)})
    s1.update_offset(mq(0), 8, True)
    await s1.persist_all({mq(0), mq(1)})
    doc = json.loads((d / "offsets.json").read_text())
    assert {(e["queueId"], e["offset"]) for e in doc["offsetTable"]} == {(0, 8), (1, 4)}
    assert (d / "offsets.json.bak").exists() and not (d / "offsets.json.tmp").exists()

    s2 = LocalFileOffsetStore(G, d)
    await s2.load()
    assert await s2.read_offset(mq(0), READ_FROM_MEMORY) == 8
    assert await s2.read_offset(mq(1), MEMORY_FIRST_THEN_STORE) == 4
    # persist(mq) and remove_offset are no-ops for the local store, as in RocketMQ
    await s2.persist(mq(0))
    s2.remove_offset(mq(0))
    assert await s2.read_offset(mq(0), READ_FROM_MEMORY) == 8


async def test_local_store_recovers_from_a_torn_file(tmp_path) -> None:
    d = tmp_path / "store"
    s = LocalFileOffsetStore(G, d)
    s.update_offset(mq(0), 1, True)
    await s.persist_all({mq(0)})
    s.update_offset(mq(0), 2, True)
    await s.persist_all({mq(0)})
    (d / "offsets.json").write_text('{"offsetTable": [{"topic": "T"')  # torn write
    s2 = LocalFileOffsetStore(G, d)
    await s2.load()
    assert await s2.read_offset(mq(0), READ_FROM_MEMORY) == 1  # the previous version from .bak
    (d / "offsets.json.bak").write_text("garbage")
    s3 = LocalFileOffsetStore(G, d)
    with pytest.raises(MQClientError, match="not a valid offset table"):
        await s3.load()
    assert await s3.read_offset(mq(0), READ_FROM_STORE) == -2


def test_default_local_dir(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("TRIMQ_CLIENT_LOCAL_OFFSET_STORE_DIR", str(tmp_path))
    assert default_local_offset_dir("1.2.3.4@DEFAULT", "g") == tmp_path / "1.2.3.4@DEFAULT" / "g"
    assert default_local_offset_dir("x", "g", "/base") .as_posix() == "/base/x/g"


async def test_remote_persist_sends_the_current_offset_one_update_per_queue_at_a_time(autojump_clock: Any) -> None:
    # Found by the chaos suite: persist_all's snapshot of a queue's offset was sent after a newer persist of the
    # same queue (a rebalance giving it away), rewinding it for its next owner.
    b = FakeBroker()
    in_flight: dict[MessageQueue, int] = {}
    overlaps = []
    real_update = b.api.update_consumer_offset

    async def slow_update(addr: str, group: str, m: MessageQueue, offset: int, *args: Any, **kw: Any) -> None:
        in_flight[m] = in_flight.get(m, 0) + 1
        if in_flight[m] > 1:
            overlaps.append(m)
        await trio.sleep(0.1)
        in_flight[m] -= 1
        await real_update(addr, group, m, offset, *args, **kw)

    b.api.update_consumer_offset = slow_update  # type: ignore[method-assign]
    store = RemoteBrokerOffsetStore(G, b)  # type: ignore[arg-type]
    store.update_offset(mq(0), 5, True)
    store.update_offset(mq(1), 5, True)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(store.persist_all, {mq(0), mq(1)})  # snapshot {0: 5, 1: 5}, sends mq(0) first
        await trio.sleep(0.05)
        store.update_offset(mq(1), 9, True)
        nursery.start_soon(store.persist, mq(1))
        await trio.sleep(0.01)
        store.update_offset(mq(0), 7, True)
        nursery.start_soon(store.persist, mq(0))
    assert b.api.stored[(G, mq(1))] == 9 and b.api.stored[(G, mq(0))] == 7
    assert not overlaps


async def test_a_locked_queue_reads_its_start_offset_from_the_master() -> None:
    """Chaos seed 23: an orderly consumer that had just been granted a queue's lock by the master still avoided
    that master (an earlier broken connection) and read the queue's offset from the slave, whose copy lagged the
    previous holder's commits: it re-consumed ~200 messages. A queue held under a lock reads where the lock is."""

    class Routed(FakeBroker):
        def __init__(self) -> None:
            super().__init__()
            self.asked: list[str] = []
            query = self.api.query_consumer_offset

            async def recording(addr: str, group: str, m: MessageQueue, *, timeout_ms: Any = None) -> int:
                self.asked.append(addr)
                return await query(addr, group, m, timeout_ms=timeout_ms)

            self.api.query_consumer_offset = recording  # type: ignore[method-assign]

        async def find_broker_addr_for_offsets(self, broker_name: str, topic: str | None = None) -> str | None:
            return "127.0.0.1:9"  # the slave: the master is being avoided

    b = Routed()
    store = RemoteBrokerOffsetStore(G, b)  # type: ignore[arg-type]
    b.api.stored[(G, mq(0))] = 7
    await store.read_offset(mq(0), READ_FROM_STORE)  # no lock: where offsets go while the master is avoided
    store.set_lock_epoch(mq(0), 3)
    assert await store.read_offset(mq(0), READ_FROM_STORE) == 7
    assert b.asked == ["127.0.0.1:9", "127.0.0.1:1"]


async def test_commits_carry_the_master_epoch_their_position_was_reached_in() -> None:
    """Chaos long ASYNC seed 12: a position read from an ASYNC master's lost tail, committed to the promoted master,
    made the queue's next owner skip what the promoted master stored there. Commits say their position's epoch (set
    from the pull answers that kept it), so the broker can lower them; an offset read from the broker has none."""
    b = FakeBroker()
    store = RemoteBrokerOffsetStore(G, b)  # type: ignore[arg-type]
    store.update_offset(mq(0), 5, False)
    await store.persist(mq(0))
    store.set_master_epoch(mq(0), 2)
    store.update_offset(mq(0), 6, False)
    await store.persist(mq(0))
    b.api.stored[(G, mq(0))] = 9
    assert await store.read_offset(mq(0), READ_FROM_STORE) == 9  # a broker that does not say its log's epoch
    await store.persist(mq(0))
    b.api.epoch = 4  # one that says: the offset read stands in epoch 4's log (long ASYNC seed 24)
    assert await store.read_offset(mq(0), READ_FROM_STORE) == 9
    await store.persist(mq(0))
    store.remove_offset(mq(0))
    assert store.master_epoch(mq(0)) is None
    assert b.api.master_epochs == [None, 2, None, 4]
