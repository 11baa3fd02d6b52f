"""The client SDK core against a real in-process broker with its embedded name server.

Producer -> broker -> pull loops -> a minimal consume service (it records and commits; the real orderly and
concurrent services come with the push-consumer issue); several client instances in one group converging to
a disjoint cover of the topic's queues; a graceful leave taken over at once through
NOTIFY_CONSUMER_IDS_CHANGED (the periodic rebalance is set to 10 minutes, so only the notification can
explain a takeover); orderly mode locking queues on the broker before pulling them.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from structlog.testing import capture_logs

from trimq.broker.broker import Broker, open_broker
from trimq.broker.config import BrokerConfig
from trimq.client.api import SendStatus
from trimq.client.config import ClientConfig, ProducerConfig, PushConsumerConfig
from trimq.client.consumer_core import ConsumerCore
from trimq.client.errors import (
    EmptyBodyError,
    InvalidTopicError,
    MessageTooLargeError,
    NoRouteError,
    OffsetNotFoundError,
)
from trimq.client.instance import ClientInstance
from trimq.client.process_queue import ProcessQueue
from trimq.client.producer import Producer
from trimq.client.selectors import SelectMessageQueueByHash
from trimq.protocol.message import Message, MessageExt
from trimq.protocol.message_queue import MessageQueue

TOPIC = "E2ETopic"
GROUP = "e2e_group"
QUEUES = 8
NO_PERIODIC_REBALANCE_MS = 600_000
# Well under any timer that would also explain the move (periodic rebalance 10 min away, lock expiry), with room
# for a loaded machine: the suite runs two workers on two cores.
TAKEOVER_DEADLINE_S = 5.0


class RecordingConsumeService:
    """A minimal consume service for these tests: records each message and commits it at once."""

    def __init__(self) -> None:
        self.core: ConsumerCore | None = None
        self.received: list[tuple[MessageQueue, MessageExt]] = []

    def submit(self, process_queue: ProcessQueue, msgs: Sequence[MessageExt], dispatch_to_consume: bool,
               message_queue: MessageQueue) -> None:
        assert self.core is not None
        self.received.extend((message_queue, m) for m in msgs)
        offset = process_queue.remove_message(msgs, int(trio.current_time() * 1000))
        if offset >= 0 and not process_queue.dropped:
            self.core.offset_store.update_offset(message_queue, offset, True)

    def bodies(self) -> list[bytes]:
        return [m.body for _, m in self.received]


@asynccontextmanager
async def broker_with_topic(tmp_path: Path, queues: int = QUEUES) -> AsyncIterator[Broker]:
    config = BrokerConfig(listen="127.0.0.1:0", store_dir=str(tmp_path / "store"), embedded_namesrv=True)
    async with open_broker(config) as broker, ClientInstance(ClientConfig(namesrv_addr=broker.address)) as admin:
        await admin.api.create_topic(broker.address, TOPIC, read_queue_nums=queues, write_queue_nums=queues)
        # the broker re-registers its topics with the name server asynchronously after a change
        await wait_until(lambda: admin.update_topic_route_info_from_name_server(TOPIC), timeout=5)
        yield broker


async def wait_until(pred: Callable[[], Any], timeout: float, interval: float = 0.01) -> None:
    """Poll ``pred`` (sync or async) until it is true; fail after ``timeout`` seconds."""
    with trio.fail_after(timeout):
        while True:
            r = pred()
            if hasattr(r, "__await__"):
                r = await r
            if r:
                return
            await trio.sleep(interval)


def consumer_config(addr: str, **kw: Any) -> PushConsumerConfig:
    kw.setdefault("consume_from_where", "CONSUME_FROM_FIRST_OFFSET")
    return PushConsumerConfig(namesrv_addr=addr, consumer_group=GROUP, rebalance_interval=NO_PERIODIC_REBALANCE_MS,
                              **kw)


class Member:
    """One group member in its own task: its own client instance (distinct client id) and consumer core."""

    def __init__(self, addr: str, name: str, orderly: bool, cfg: dict[str, Any]) -> None:
        self.config = consumer_config(addr, instance_name=name, **cfg)
        self.orderly = orderly
        self.service = RecordingConsumeService()
        self.core: ConsumerCore
        self._leave = trio.Event()
        self._left = trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[Member] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with ClientInstance(self.config) as client:
                self.core = ConsumerCore(self.config, self.service, instance=client, consume_orderly=self.orderly)
                self.service.core = self.core
                self.core.subscribe(TOPIC, "*")
                async with self.core:
                    task_status.started(self)
                    await self._leave.wait()
        finally:
            self._left.set()

    @property
    def queues(self) -> set[MessageQueue]:
        table = self.core.rebalance.process_queue_table
        return {mq for mq, pq in table.items() if mq.topic == TOPIC and not pq.dropped}

    async def leave(self) -> None:
        """Graceful leave; returns when the member has unregistered and closed."""
        self._leave.set()
        await self._left.wait()


async def start_member(nursery: trio.Nursery, addr: str, name: str, *, orderly: bool = False,
                       **cfg: Any) -> Member:
    member: Member = await nursery.start(Member(addr, name, orderly, cfg).run)
    return member


def all_queues(broker_name: str) -> set[MessageQueue]:
    return {MessageQueue(TOPIC, broker_name, i) for i in range(QUEUES)}


def disjoint_cover(members: Sequence[Member], expected: set[MessageQueue]) -> bool:
    held = [m.queues for m in members]
    return sum(len(h) for h in held) == len(expected) and set().union(*held) == expected


async def test_send_and_receive_with_tag_filter_and_offsets(tmp_path: Path) -> None:
    async with broker_with_topic(tmp_path) as broker:
        addr = broker.address
        async with Producer(ProducerConfig(namesrv_addr=addr, producer_group="e2e_producer")) as producer:
            results = [await producer.send(Message(TOPIC, f"m{i}".encode(), tags="A" if i % 2 else "B"))
                       for i in range(20)]
            assert all(r.status is SendStatus.SEND_OK for r in results)
            assert len({r.message_queue for r in results}) == QUEUES  # round robin over every queue
            assert len({r.msg_id for r in results}) == 20
            batch = await producer.send_batch([Message(TOPIC, b"batch-1", tags="A"), Message(TOPIC, b"batch-2",
                                                                                             tags="A")])
            assert len(batch.msg_id.split(",")) == 2

            with pytest.raises(EmptyBodyError):
                await producer.send(Message(TOPIC, b""))
            with pytest.raises(InvalidTopicError, match="illegal characters"):
                await producer.send(Message("bad topic", b"x"))
            with pytest.raises(MessageTooLargeError):
                await producer.send(Message(TOPIC, b"x" * (4 * 1024 * 1024 + 1)))

        async with AsyncExitStack() as stack:
            config = consumer_config(addr, instance_name="tagged")
            client = await stack.enter_async_context(ClientInstance(config))
            service = RecordingConsumeService()
            core = ConsumerCore(config, service, instance=client)
            service.core = core
            core.subscribe(TOPIC, "A")
            await stack.enter_async_context(core)
            expected = {f"m{i}".encode() for i in range(20) if i % 2} | {b"batch-1", b"batch-2"}
            await wait_until(lambda: len(service.received) >= len(expected), timeout=10)
            await trio.sleep(0.2)
            assert sorted(service.bodies()) == sorted(expected)  # exactly the tag-A messages, once each
            assert all(msg.tags == "A" for _, msg in service.received)
            viewed = await client.api.view_message_by_id(results[1].offset_msg_id)
            assert (viewed.body, viewed.topic, viewed.unique_id) == (b"m1", TOPIC, results[1].msg_id)
            await core.persist_consumer_offset()
            # offsets went to the broker: every queue's stored offset is past its last message
            for mq in all_queues(results[0].message_queue.broker_name):
                stored = await client.api.query_consumer_offset(addr, GROUP, mq)
                assert stored == await client.max_offset(mq)


async def test_selector_keeps_a_key_on_one_queue_in_order(tmp_path: Path) -> None:
    async with broker_with_topic(tmp_path) as broker, Producer(
        ProducerConfig(namesrv_addr=broker.address, producer_group="e2e_producer")
    ) as producer:
        selector = SelectMessageQueueByHash()
        sent: dict[str, list[int]] = {}
        for i in range(30):
            key = f"order-{i % 3}"
            r = await producer.send(Message(TOPIC, f"{key}:{i}".encode()), selector=selector, arg=key)
            mqs = await producer.message_queues(TOPIC)
            assert r.message_queue == selector(mqs, None, key)
            sent.setdefault(key, []).append(r.queue_offset)
        for offsets in sent.values():
            assert offsets == sorted(offsets)
        async with trio.open_nursery() as nursery:
            member = await start_member(nursery, broker.address, "sel")
            await wait_until(lambda: len(member.service.received) >= 30, timeout=10)
            per_key: dict[str, list[int]] = {}
            for _, msg in member.service.received:
                key, _, seq = msg.body.decode().partition(":")
                per_key.setdefault(key, []).append(int(seq))
            assert all(v == sorted(v) for v in per_key.values())  # one queue per key: arrival order kept
            await member.leave()


async def test_three_members_converge_and_takeover_after_leave_is_immediate(tmp_path: Path) -> None:
    async with broker_with_topic(tmp_path) as broker:
        addr = broker.address
        expected = all_queues(broker.config.broker_name)
        async with trio.open_nursery() as nursery:
            members = [await start_member(nursery, addr, f"m{i}") for i in range(3)]
            # Converged: AVG over 8 queues and 3 members. A cover alone is not enough: right after the third
            # member starts (its rebalance runs in the background), the first two still hold 4 + 4.
            await wait_until(lambda: disjoint_cover(members, expected)
                             and sorted(len(m.queues) for m in members) == [2, 3, 3], timeout=10)
            ids = {m.core.instance.client_id for m in members}
            assert len(ids) == 3

            leaver, rest = members[0], members[1:]
            before = {id(m): m.core.instance.consumer_ids_changed_count for m in rest}
            await leaver.leave()
            start = trio.current_time()
            await wait_until(lambda: disjoint_cover(rest, expected), timeout=TAKEOVER_DEADLINE_S)
            took = trio.current_time() - start
            assert took < TAKEOVER_DEADLINE_S
            # the periodic rebalance is 10 minutes away: the broker's notification triggered these
            assert all(m.core.instance.consumer_ids_changed_count > before[id(m)] for m in rest)
            assert sorted(len(m.queues) for m in rest) == [4, 4]
            for m in rest:
                await m.leave()


async def test_orderly_locks_queues_before_pulling_and_marks_them_locked(tmp_path: Path) -> None:
    async with broker_with_topic(tmp_path) as broker:
        addr = broker.address
        expected = all_queues(broker.config.broker_name)
        async with Producer(ProducerConfig(namesrv_addr=addr, producer_group="e2e_producer")) as producer:
            for i in range(16):
                await producer.send(Message(TOPIC, f"o{i}".encode()))

        async with trio.open_nursery() as nursery:
            first = await start_member(nursery, addr, "o1", orderly=True)
            await wait_until(lambda: first.queues == expected, timeout=10)
            # locked at once (RocketMQ #2621), long before the first periodic lockAll (1 s after start)
            assert all(pq.locked for pq in first.core.rebalance.process_queue_table.values())
            table = await first.core.instance.api.get_lock_table(addr, GROUP)
            owners = {MessageQueue.from_wire(e["mq"]): e["clientId"] for e in table["lockTable"]}
            assert {mq: owners.get(mq) for mq in expected} == dict.fromkeys(expected, first.core.instance.client_id)
            await wait_until(lambda: len(first.service.received) >= 16, timeout=10)

            second = await start_member(nursery, addr, "o2", orderly=True)
            members = [first, second]
            # the first member is notified and gives up half of its queues (empty: unlocked at once); the
            # second, whose first lock attempt found them still held, retries within a second and locks them
            start = trio.current_time()
            await wait_until(lambda: disjoint_cover(members, expected) and len(second.queues) == 4,
                             timeout=TAKEOVER_DEADLINE_S)
            assert trio.current_time() - start < TAKEOVER_DEADLINE_S
            assert len(first.queues) == 4
            table = await first.core.instance.api.get_lock_table(addr, GROUP)
            owners = {MessageQueue.from_wire(e["mq"]): e["clientId"] for e in table["lockTable"]}
            for m in members:
                for mq in m.queues:
                    assert owners[mq] == m.core.instance.client_id
                    assert m.core.rebalance.process_queue_table[mq].locked
            await second.leave()
            # the second member released its locks when it left; the first takes its queues back at once
            await wait_until(lambda: first.queues == expected, timeout=TAKEOVER_DEADLINE_S)
            await first.leave()
        async with ClientInstance(ClientConfig(namesrv_addr=addr)) as admin:
            table = await admin.api.get_lock_table(addr, GROUP)
            assert table["lockTable"] == []  # a graceful leave releases every lock


async def test_no_stored_offset_before_commit(tmp_path: Path) -> None:
    async with broker_with_topic(tmp_path) as broker, ClientInstance(
        ClientConfig(namesrv_addr=broker.address)
    ) as client:
        with pytest.raises(OffsetNotFoundError):
            await client.api.query_consumer_offset(broker.address, GROUP, MessageQueue(TOPIC, "broker-a", 0))


async def test_send_retries_on_another_broker_when_one_is_down(tmp_path: Path) -> None:
    cfg_a = BrokerConfig(listen="127.0.0.1:0", store_dir=str(tmp_path / "a"), embedded_namesrv=True,
                         broker_name="broker-a")
    async with open_broker(cfg_a) as a, trio.open_nursery() as nursery:
        ns = a.address
        stop_b, b_stopped = trio.Event(), trio.Event()

        async def run_b(*, task_status: trio.TaskStatus[Broker] = trio.TASK_STATUS_IGNORED) -> None:
            cfg_b = BrokerConfig(listen="127.0.0.1:0", store_dir=str(tmp_path / "b"), broker_name="broker-b",
                                 namesrv_addr=ns)
            try:
                async with open_broker(cfg_b) as b:
                    task_status.started(b)
                    await stop_b.wait()
            finally:
                b_stopped.set()

        b: Broker = await nursery.start(run_b)
        async with ClientInstance(ClientConfig(namesrv_addr=ns)) as client:
            for broker in (a, b):
                await client.api.create_topic(broker.address, TOPIC, read_queue_nums=2, write_queue_nums=2)

            async def both_brokers_routed() -> bool:
                await client.update_topic_route_info_from_name_server(TOPIC)
                route = client.topic_route_table.get(TOPIC)
                return route is not None and len(route.queue_datas) == 2

            await wait_until(both_brokers_routed, timeout=5)
            async with Producer(ProducerConfig(producer_group="e2e_producer"), instance=client) as producer:
                first = [await producer.send(Message(TOPIC, f"x{i}".encode())) for i in range(4)]
                assert {r.message_queue.broker_name for r in first} == {"broker-a", "broker-b"}
                stop_b.set()
                await b_stopped.wait()
                # sends that pick one of broker-b's queues before the client's route forgets it (refreshed at once
                # when its connection closed, issue 15) fail to connect and are retried on broker-a
                with capture_logs() as logs:
                    later = [await producer.send(Message(TOPIC, f"y{i}".encode())) for i in range(6)]
                assert {r.message_queue.broker_name for r in later} == {"broker-a"}
                retries = [e for e in logs if e["event"] == "send.retry"]
                assert all("broker-b" in e["mq"] for e in retries)
                await wait_until(lambda: "broker-b" not in client.broker_addr_table, timeout=5)
                assert client.route_refreshes >= 1  # not the 30 s poll
                assert all(r.status is SendStatus.SEND_OK for r in later)


async def test_broadcasting_members_each_consume_everything(tmp_path: Path) -> None:
    async with broker_with_topic(tmp_path) as broker:
        addr = broker.address
        async with Producer(ProducerConfig(namesrv_addr=addr, producer_group="e2e_producer")) as producer:
            for i in range(12):
                await producer.send(Message(TOPIC, f"b{i}".encode()))
        offsets_dir = tmp_path / "offsets"
        expected = all_queues(broker.config.broker_name)
        async with trio.open_nursery() as nursery:
            members = [await start_member(nursery, addr, f"bc{i}", message_model="BROADCASTING",
                                          local_offset_store_dir=str(offsets_dir)) for i in range(2)]
            def done(m: Member) -> bool:
                return m.queues == expected and len(m.service.received) >= 12

            await wait_until(lambda: all(done(m) for m in members), timeout=10)
            for m in members:
                assert sorted(m.service.bodies()) == sorted(f"b{i}".encode() for i in range(12))
            for m in members:
                await m.leave()
        files = sorted(offsets_dir.rglob("offsets.json"))
        assert len(files) == 2  # one local offset file per member (broadcasting keeps offsets locally)
        for f in files:
            table = json.loads(f.read_text())["offsetTable"]
            assert sum(e["offset"] for e in table) == 12


async def test_delayed_message_arrives_after_its_delay_level(tmp_path: Path) -> None:
    async with broker_with_topic(tmp_path) as broker:
        addr = broker.address
        async with trio.open_nursery() as nursery:
            member = await start_member(nursery, addr, "delay", consume_from_where="CONSUME_FROM_LAST_OFFSET")
            await wait_until(lambda: member.queues == all_queues(broker.config.broker_name), timeout=5)
            async with Producer(ProducerConfig(namesrv_addr=addr, producer_group="e2e_producer")) as producer:
                await producer.send(Message(TOPIC, b"later", delay_time_level=1))  # level 1 = 1 s
            await wait_until(lambda: len(member.service.received) >= 1, timeout=10)
            _, msg = member.service.received[0]
            assert msg.body == b"later" and msg.topic == TOPIC
            assert msg.get_property("REAL_TOPIC") == TOPIC  # it went through the schedule topic
            assert msg.store_timestamp - msg.born_timestamp >= 900  # it waited for its delay level
            await member.leave()


async def test_a_send_without_a_route_says_whether_the_name_server_answered(tmp_path: Path) -> None:
    """Unreachable is not unknown: a name server that cannot be reached was reported as one that "does not know"
    the topic (found by hand, trimq-producer --namesrv at a closed port)."""
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]
    closed = f"127.0.0.1:{listener.socket.getsockname()[1]}"
    await listener.aclose()
    async with Producer(ProducerConfig(namesrv_addr=closed, producer_group="e2e_producer")) as producer:
        with pytest.raises(NoRouteError) as raised:
            await producer.send(Message(TOPIC, b"x"))
    assert str(raised.value) == (f"no route info of topic {TOPIC!r}: its route could not be fetched from the name "
                                 f"server ({closed}): cannot connect to {closed}: Connection refused")

    config = BrokerConfig(listen="127.0.0.1:0", store_dir=str(tmp_path / "store"), embedded_namesrv=True)
    async with open_broker(config) as broker:
        no_auto_create = ProducerConfig(namesrv_addr=broker.address, producer_group="e2e_producer", create_topic_key="")
        async with Producer(no_auto_create) as producer:
            with pytest.raises(NoRouteError) as raised:
                await producer.send(Message(TOPIC, b"x"))
            assert "the name server does not know it" in str(raised.value)
            assert producer._client().route_fetch_errors == {}


async def test_a_silent_name_server_holds_a_send_no_longer_than_its_timeout(autojump_clock: Any) -> None:
    """A name server that accepts and never answers (a paused process) held a send of an unknown topic for three
    route requests of 3 s each, 9 s for a send of timeout 3 s (found by hand). The lookup is inside the timeout
    now, as in RocketMQ (beginTimestampFirst); virtual time (autojump) measures it."""
    silent: list[trio.SocketStream] = []

    async def never_answers(stream: trio.SocketStream) -> None:
        silent.append(stream)
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(trio.serve_tcp, never_answers, 0)
        addr = f"127.0.0.1:{listeners[0].socket.getsockname()[1]}"
        async with Producer(ProducerConfig(namesrv_addr=addr, producer_group="e2e_producer")) as producer:
            for sharding_key in (None, "k"):  # round robin with retries, and a selected queue
                began = trio.current_time()
                with pytest.raises(NoRouteError) as raised:
                    await producer.send(Message(TOPIC, b"x"), timeout_ms=2000, sharding_key=sharding_key)
                assert 2.0 <= trio.current_time() - began < 2.5, sharding_key
                assert str(raised.value) == (f"no route info of topic {TOPIC!r}: no name server ({addr}) answered "
                                             "within the send's timeout of 2000 ms")
        assert silent  # (the requests did reach it)
        nursery.cancel_scope.cancel()
