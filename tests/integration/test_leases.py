"""Queue-lock leases over the wire (issue 14): a real broker in-process, time on trio's MockClock.

* the broker lets another member take a lock over only after the lease plus its margin, and the silent member
  leaves its group at the same time (the others are notified); its renewal then says it is no member, its
  late commit is refused by epoch, and a heartbeat brings it back;
* a closed connection releases its locks and orderly membership after the short grace; a client that
  reconnects and renews within the grace keeps both;
* a restarted broker keeps free queues for their claimant until the longest earlier lease has passed;
* a consumer cut off from the broker (a relay that stops forwarding, closing nothing) starts no batch after its
  own lease deadline, its queues move to the other consumer under higher epochs, and its late offset commit
  is refused by epoch.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from tests.integration.relay import Relay
from trimq.broker.broker import Broker
from trimq.client import ConsumeOrderlyStatus, Message, Producer, ProducerConfig, PushConsumer, PushConsumerConfig
from trimq.client.api import ConsumerData, HeartbeatData, MQClientAPI
from trimq.client.errors import NoPermissionError
from trimq.client.instance import ClientInstance
from trimq.client.selectors import select_by_hash
from trimq.protocol.codes import RequestCode
from trimq.protocol.command import RemotingCommand
from trimq.protocol.message_queue import MessageQueue
from trimq.runtime.client import RemotingClient

G = "lease_group"
T = "LeaseOrders"
LEASE_S = 2.0
TAKEOVER_S = 2.4  # lease 2 000 ms + 10 % drift + 200 ms margin


def mq(qid: int) -> MessageQueue:
    return MessageQueue(T, "broker-a", qid)


class Member:
    """A client as the broker sees it: its own connection, a client id, the notifications it was sent."""

    def __init__(self, client_id: str) -> None:
        self.client_id = client_id
        self.rc = RemotingClient(default_timeout_s=10)
        self.api = MQClientAPI(self.rc, timeout_ms=10_000)
        self.notifications = 0

    async def _on_notify(self, cmd: RemotingCommand, addr: str) -> None:
        self.notifications += 1

    async def __aenter__(self) -> Member:
        await self.rc.__aenter__()
        self.rc.register_handler(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, self._on_notify)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.rc.__aexit__(*exc)

    async def heartbeat(self, addr: str) -> None:
        sub = {"topic": T, "subString": "*", "tagsSet": [], "codeSet": [], "subVersion": 1}
        await self.api.heartbeat(addr, HeartbeatData(self.client_id, [], [ConsumerData(
            G, "CONSUME_PASSIVELY", "CLUSTERING", "CONSUME_FROM_FIRST_OFFSET", True, [sub])]))

    async def lock(self, addr: str, qids: list[int], claims: dict[int, int] | None = None) -> Any:
        return await self.api.lock_batch_mq_lease(addr, G, self.client_id, [mq(q) for q in qids],
                                                  claims={mq(q): e for q, e in (claims or {}).items()})


@asynccontextmanager
async def members(*names: str) -> AsyncIterator[list[Member]]:
    async with AsyncExitStack() as stack:
        yield [await stack.enter_async_context(Member(n)) for n in names]


async def test_takeover_after_lease_plus_margin_and_membership_follows_the_lease(
        broker_factory: Callable[..., Any], autojump_clock: trio.testing.MockClock) -> None:
    async with broker_factory() as broker, members("paused", "survivor") as (paused, survivor):
        addr = broker.address
        await paused.heartbeat(addr)
        await survivor.heartbeat(addr)
        first = await paused.lock(addr, [0, 1])
        assert first.held == {mq(0), mq(1)} and first.lease_ms == 2000 and first.member is True
        e1 = first.epochs[mq(0)]
        await paused.api.update_consumer_offset(addr, G, mq(0), 5, "paused", lock_epoch=e1)
        t0 = trio.current_time()
        notified = survivor.notifications
        # "paused" stops renewing; the survivor keeps renewing its (empty) lease every third of a lease.
        while trio.current_time() - t0 < TAKEOVER_S - 0.1:
            answer = await survivor.lock(addr, [0])
            assert answer.held == set() and answer.member
            await trio.sleep(0.2)
        assert await survivor.api.get_consumer_id_list_by_group(addr, G) == ["paused", "survivor"]
        await trio.sleep(TAKEOVER_S + 0.3 - (trio.current_time() - t0))  # past lease + margin (+ a scan)
        assert await survivor.api.get_consumer_id_list_by_group(addr, G) == ["survivor"]
        assert survivor.notifications > notified  # told at once: its allocation stops giving "paused" queues
        taken = await survivor.lock(addr, [0, 1])
        assert taken.held == {mq(0), mq(1)} and taken.epochs[mq(0)] > e1
        await survivor.api.update_consumer_offset(addr, G, mq(0), 9, "survivor", lock_epoch=taken.epochs[mq(0)])
        # "paused" wakes up: no lock, no membership, its late commit refused by epoch; a heartbeat rejoins it.
        late = await paused.lock(addr, [0, 1])
        assert late.held == set() and late.member is False
        with pytest.raises(NoPermissionError, match="epoch"):
            await paused.api.update_consumer_offset(addr, G, mq(0), 6, "paused", lock_epoch=e1)
        assert await paused.api.query_consumer_offset(addr, G, mq(0)) == 9
        table = await paused.api.get_lock_table(addr, G)
        assert table["fencedUpdates"] == {G: 1} and table["leaseMs"] == 2000 and table["takeoverAfterMs"] == 2400
        await paused.heartbeat(addr)
        assert await survivor.api.get_consumer_id_list_by_group(addr, G) == ["paused", "survivor"]


async def test_a_closed_connection_releases_after_the_grace_and_a_reconnect_keeps_its_locks(
        broker_factory: Callable[..., Any], autojump_clock: trio.testing.MockClock) -> None:
    async with broker_factory() as broker, members("dead", "back", "other") as (dead, back, other):
        addr = broker.address
        for m in (dead, back, other):
            await m.heartbeat(addr)
        assert (await dead.lock(addr, [0])).held == {mq(0)}
        assert (await back.lock(addr, [1])).held == {mq(1)}
        dead.rc.close_address(addr)
        back.rc.close_address(addr)
        await trio.sleep(0.2)
        assert (await back.lock(addr, [1])).held == {mq(1)}  # reconnected and renewed within the grace
        assert (await other.lock(addr, [0])).held == set()  # still within "dead"'s grace
        await trio.sleep(0.2)  # past 300 ms since the close, and a lease scan
        assert await other.api.get_consumer_id_list_by_group(addr, G) == ["back", "other"]
        assert (await other.lock(addr, [0, 1])).held == {mq(0)}  # "back" kept its lock


async def test_a_restarted_broker_keeps_free_queues_for_their_claimant_during_the_grace(
        broker_factory: Callable[..., Any], tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    store = str(tmp_path / "restarted")
    async with members("holder", "other") as (holder, other):
        async with broker_factory(store_dir=store) as broker:
            await holder.heartbeat(broker.address)
            before = await holder.lock(broker.address, [0, 1])
            assert (await holder.api.get_lock_table(broker.address))["brokerEpoch"] == 1
        async with broker_factory(store_dir=store) as broker:  # locks live in memory: the table is empty
            addr = broker.address
            t0 = trio.current_time()
            await holder.heartbeat(addr)
            await other.heartbeat(addr)
            table = await other.api.get_lock_table(addr)
            assert table["brokerEpoch"] == 2 and table["restartGrace"] is True
            refused = await other.lock(addr, [0, 1])
            assert refused.held == set()  # "holder" may still work under its leases
            assert refused.grace_ms is not None and 0 < refused.grace_ms <= 2401  # when to ask again
            claimed = await holder.lock(addr, [0], claims={0: before.epochs[mq(0)]})
            assert claimed.held == claimed.kept == {mq(0)}  # back at once, continuous: its cache stays valid
            assert claimed.epochs[mq(0)] > before.epochs[mq(0)]  # a new broker epoch: still growing
            await trio.sleep(LEASE_S - 0.5 - (trio.current_time() - t0))
            assert (await holder.lock(addr, [0])).held == {mq(0)}  # the holder renews as usual
            assert (await other.lock(addr, [])).member  # and so does the other (its membership)
            await trio.sleep(TAKEOVER_S + 0.01 - (trio.current_time() - t0))
            assert not (await other.api.get_lock_table(addr))["restartGrace"]
            assert (await other.lock(addr, [0, 1])).held == {mq(1)}  # after the grace: the unclaimed queue


# ---------------------------------------------------------------------------------------------- real consumers


def relay_instance(cfg: PushConsumerConfig, broker: str, relay: str) -> ClientInstance:
    class RelayInstance(ClientInstance):
        def _apply_route(self, topic: str, route: Any, *, from_default: bool = False) -> None:
            super()._apply_route(topic, route, from_default=from_default)
            for addrs in self.broker_addr_table.values():
                for bid, a in list(addrs.items()):
                    if a == broker:
                        addrs[bid] = relay

    return RelayInstance(cfg)


async def test_a_cut_off_consumer_starts_nothing_after_its_lease_and_its_late_commit_is_refused(
        broker_factory: Callable[..., Any]) -> None:
    # Real time (the broker's store works in threads, which a MockClock would outrun); the bound checked is the
    # client's own deadline on its own clock, not a performance figure.
    calls: list[tuple[str, float, int, int]] = []  # (consumer, start time, queue, epoch)

    def listener(name: str) -> Any:
        async def on_msgs(msgs: list[Any], context: Any) -> ConsumeOrderlyStatus:
            calls.append((name, trio.current_time(), context.message_queue.queue_id, context.lock_epoch))
            return ConsumeOrderlyStatus.SUCCESS
        return on_msgs

    async with broker_factory(embedded_namesrv=True) as broker, trio.open_nursery() as nursery:
        broker_: Broker = broker
        addr = broker_.address
        relay = Relay(addr)
        await nursery.start(relay.serve)
        async with Producer(ProducerConfig(namesrv_addr=addr)) as producer:
            assert producer.instance is not None
            await producer.instance.api.create_topic(addr, T, read_queue_nums=4, write_queue_nums=4)
            with trio.fail_after(5):
                while not await producer.instance.update_topic_route_info_from_name_server(T):
                    await trio.sleep(0.05)
            keys = iter(range(1_000_000))

            async def send(n: int) -> None:
                for _ in range(n):
                    key = f"k{next(keys)}"
                    await producer.send(Message(T, b"x", keys=key), selector=select_by_hash, arg=key)

            async def until(pred: Callable[[], bool], what: str) -> None:
                with trio.fail_after(30):
                    while not pred():
                        await send(8)
                        await trio.sleep(0.1)

            settings: dict[str, Any] = {"consumer_group": G, "consume_from_where": "CONSUME_FROM_FIRST_OFFSET"}
            kept = PushConsumer(PushConsumerConfig(namesrv_addr=addr, instance_name="kept", **settings))
            cut_cfg = PushConsumerConfig(namesrv_addr=relay.address, instance_name="cut", **settings)
            cut_instance = relay_instance(cut_cfg, addr, relay.address)
            cut = PushConsumer(cut_cfg, instance=cut_instance)
            for c, name in ((kept, "kept"), (cut, "cut")):
                c.subscribe(T, "*")
                c.register_message_listener_orderly(listener(name))
            async with cut_instance, kept, cut:
                await until(lambda: {q for n, _, q, _ in calls if n == "cut"} != set()
                            and {q for n, _, q, _ in calls if n == "kept"} != set(), "both to consume")
                cut_queues = {mq.queue_id for mq, pq in cut.process_queue_table().items()
                              if pq.locked and mq.topic == T}  # not the group's %RETRY% queue
                assert cut_queues and len(cut_queues) < 4
                cut_epochs = {q: e for n, _, q, e in calls if n == "cut"}
                t_cut = trio.current_time()
                relay.blackhole()
                # the other consumer takes the cut-off one's queues over (after its lease + margin)
                await until(lambda: {q for n, t, q, _ in calls if n == "kept" and t > t_cut} >= cut_queues,
                            "the takeover")
                await send(16)
                await trio.sleep(0.5)
                # "cut" relied on leases renewed before t_cut at the latest: it started nothing after t_cut + 2 s
                assert not [c for c in calls if c[0] == "cut" and c[1] > t_cut + LEASE_S]
                taken = [(q, e) for n, t, q, e in calls if n == "kept" and t > t_cut and q in cut_queues]
                assert all(e > cut_epochs[q] for q, e in taken if q in cut_epochs)  # under higher epochs
                # What "cut" consumed under its old epochs is still in its offset store: committed now (what a
                # late persist sends once the network heals), it is refused by epoch.
                store: Any = cut.core.offset_store if cut.core is not None else None
                q = sorted(q for q in cut_queues if q in cut_epochs)[0]
                assert store.lock_epoch(mq(q)) == cut_epochs[q] and store.table.get(mq(q)) is not None
                relay.heal()
                before = store.fenced_updates
                await store.persist(mq(q))
                assert store.fenced_updates == before + 1
                table = await MQClientAPI(cut_instance.remoting).get_lock_table(addr, G)
                assert table["fencedUpdates"].get(G, 0) >= 1
        nursery.cancel_scope.cancel()  # the relay


async def test_an_orderly_consumer_locks_its_queues_as_a_restarted_brokers_grace_ends(
        broker_factory: Callable[..., Any], tmp_path: Path) -> None:
    # Chaos seed 56: a consumer refused by a broker's restart grace retried on its backoff (0.1 s doubling), 2.4 s
    # after the grace had ended, so the paused owner of those queues resumed first and took them back. The broker
    # says when its grace ends (graceMs); the consumer asks again right then. Real time (the store's threads).
    store = str(tmp_path / "restarted")
    async with members("holder") as (holder,):
        async with broker_factory(store_dir=store, embedded_namesrv=True) as broker:
            async with Producer(ProducerConfig(namesrv_addr=broker.address)) as producer:
                assert producer.instance is not None
                await producer.instance.api.create_topic(broker.address, T, read_queue_nums=4, write_queue_nums=4)
            await holder.heartbeat(broker.address)
            assert (await holder.lock(broker.address, [0, 1, 2, 3])).held == {mq(q) for q in range(4)}
        async with broker_factory(store_dir=store, embedded_namesrv=True) as broker:
            grace_end = trio.current_time() + broker.lock_manager.restart_grace_remaining_ms() / 1000
            assert grace_end - trio.current_time() > 2.0  # the holder's lease may still run: nobody else gets them
            consumer = PushConsumer(PushConsumerConfig(namesrv_addr=broker.address, consumer_group=G))
            consumer.subscribe(T, "*")
            consumer.register_message_listener_orderly(lambda msgs, ctx: ConsumeOrderlyStatus.SUCCESS)
            async with consumer:
                with trio.fail_after(10):
                    while len([pq for pq in consumer.process_queue_table().values() if pq.locked]) < 4:
                        await trio.sleep(0.01)
                locked_at = trio.current_time()
            assert grace_end - 0.05 <= locked_at <= grace_end + 0.4, locked_at - grace_end
