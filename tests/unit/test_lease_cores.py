"""Queue-lock leases (issue 14), the pure parts: membership that follows the lease, the broker epoch file, offset
commits fenced by epoch, and the client's lease bookkeeping (counted from the send, stopped when the
connection drops, claimed back after a broker restart).

Broker-side time is an injected clock; the client side runs on trio's MockClock (``autojump_clock``) with a
fake of the network (the lock answers), as tests/unit/test_chaos_regressions.py does. The same rules over a
real broker are in tests/integration/test_leases.py (this file: the cores).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest
import trio

from trimq.broker.consumers import ConsumerManager, parse_heartbeat
from trimq.broker.locks import RebalanceLockManager, make_epoch
from trimq.broker.store.epoch import BrokerEpochError, BrokerEpochStore, epoch_file_path, promotion_floor
from trimq.broker.store.offsets import ConsumerOffsetManager
from trimq.client.api import LockBatchAnswer
from trimq.client.config import PushConsumerConfig
from trimq.client.offset_store import ReadOffsetType
from trimq.client.rebalance.impl import RebalanceImpl
from trimq.client.rebalance.strategies import get_strategy
from trimq.client.subscription import build_subscription_data
from trimq.protocol.message_queue import MessageQueue

G = "lease_group"
T = "Orders"


def mq(qid: int, broker: str = "broker-a") -> MessageQueue:
    return MessageQueue(T, broker, qid)


class Clock:
    def __init__(self, now: int = 1_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


class StubConn:
    def __init__(self, remote: str = "127.0.0.1:40000") -> None:
        self.remote = remote
        self.attributes: dict[str, Any] = {}
        self.closed = False


def stub_conn(remote: str = "127.0.0.1:40000") -> Any:
    """A StubConn where the manager takes a Connection (it reads only these attributes)."""
    return StubConn(remote)


def heartbeat(client_id: str, *, orderly: bool) -> Any:
    return parse_heartbeat({"clientID": client_id, "consumerDataSet": [{
        "groupName": G, "consumeOrderly": orderly, "subscriptionDataSet": [{"topic": T, "subString": "*"}]}]})


# ---------------------------------------------------------------------------------------------- membership


def test_orderly_members_leave_with_their_lease_and_renewals_keep_them() -> None:
    clock = Clock()
    cm = ConsumerManager(now_ms=clock, lease_expiry_ms=2_400, disconnect_grace_ms=300)
    for cid, orderly in (("paused", True), ("renewing", True), ("concurrent", False)):
        cm.heartbeat(stub_conn(), heartbeat(cid, orderly=orderly))
    cm.take_dirty_groups()
    conn = cm.find_channel(G, "renewing")
    assert conn is not None
    for _ in range(3):  # "renewing" renews its locks every 800 ms (LOCK_BATCH_MQ), never heartbeats again
        clock.now += 800
        assert cm.touch(G, "renewing", conn)
    assert cm.scan_leases() == []  # "paused" is exactly 2.4 s silent: still a member (strictly after)
    clock.now += 1
    assert cm.scan_leases() == [(G, "paused", "lease_expired")]
    assert cm.take_dirty_groups() == [G]  # the survivors are notified
    clock.now += 100_000
    cm.touch(G, "renewing", conn)
    assert cm.scan_leases() == []  # a non-orderly member heartbeats every 30 s: RocketMQ's 120 s rule for it
    assert cm.get_consumer_ids(G) == ["concurrent", "renewing"]
    assert not cm.touch(G, "paused", stub_conn())  # a renewal does not make a member: its next heartbeat does
    cm.heartbeat(stub_conn(), heartbeat("paused", orderly=True))
    assert cm.get_consumer_ids(G) == ["concurrent", "paused", "renewing"]
    assert cm.stats["lease_expired"] == 1


def test_a_closed_orderly_members_membership_waits_out_the_grace_and_a_reconnect_keeps_it() -> None:
    clock = Clock()
    cm = ConsumerManager(now_ms=clock, lease_expiry_ms=2_400, disconnect_grace_ms=300)
    old_a, old_b, conc = stub_conn("a:1"), stub_conn("b:1"), stub_conn("c:1")
    cm.heartbeat(old_a, heartbeat("a", orderly=True))
    cm.heartbeat(old_b, heartbeat("b", orderly=True))
    cm.heartbeat(conc, heartbeat("c", orderly=False))
    cm.take_dirty_groups()
    for conn in (old_a, old_b, conc):
        conn.closed = True
        assert cm.connection_closed(conn) == ([(G, "c")] if conn is conc else [])  # non-orderly: at once
    assert cm.get_consumer_ids(G) == ["a", "b"]
    clock.now += 200
    new_b = stub_conn("b:2")
    assert cm.touch(G, "b", new_b)  # b reconnected and renewed within the grace
    assert cm.find_channel(G, "b") is new_b and not cm.has_open_connection("a")
    assert cm.has_open_connection("b", other_than=old_b)
    clock.now += 100
    assert cm.scan_leases() == []  # exactly 300 ms after a's close
    assert cm.next_lease_deadline() == clock.now + 1  # the broker's lease loop sleeps until exactly then
    clock.now += 1
    assert cm.scan_leases() == [(G, "a", "connection_closed")]
    assert cm.get_consumer_ids(G) == ["b"]
    assert cm.next_lease_deadline() == clock.now - 101 + 2_400 + 1  # "b"'s renewal 101 ms ago + the lease


def test_without_lease_rules_membership_is_rocketmqs() -> None:
    clock = Clock()
    cm = ConsumerManager(now_ms=clock)  # the rocketmq lock profile
    conn = stub_conn()
    cm.heartbeat(conn, heartbeat("a", orderly=True))
    clock.now += 60_000
    assert cm.scan_leases() == []
    conn.closed = True
    assert cm.connection_closed(conn) == [(G, "a")]


# ---------------------------------------------------------------------------------------------- broker epoch


def test_the_broker_epoch_grows_with_every_start_and_the_grace_covers_the_longest_lease(tmp_path: Path) -> None:
    path = epoch_file_path(str(tmp_path))
    first = BrokerEpochStore(path).begin(2_400)
    assert (first.broker_epoch, first.restart_grace_ms, first.first_start) == (1, 0, True)  # nothing to wait for
    second = BrokerEpochStore(path).begin(60_000)  # restarted with the rocketmq profile
    assert (second.broker_epoch, second.restart_grace_ms) == (2, 2_400)
    store = BrokerEpochStore(path)
    third = store.begin(2_400)
    assert (third.broker_epoch, third.restart_grace_ms) == (3, 60_000)  # it may have granted 60 s locks
    assert store.bump() == 4  # a promotion (HA issue)
    assert json.loads(Path(path).read_text()) == {"brokerEpoch": 4, "maxTakeoverMs": 60_000}
    Path(path).write_text('{"brokerEpoch": "x"}')
    with pytest.raises(BrokerEpochError, match="brokerEpoch"):
        BrokerEpochStore(path).begin(2_400)
    assert BrokerEpochStore(None).begin(2_400).broker_epoch == 1  # memory only


def test_a_slave_keeps_its_masters_broker_epoch_and_promotes_above_it(tmp_path: Path) -> None:
    # long ASYNC chaos seed 56: the master had started 3 times, its slave twice; promoted after a restart (no
    # handshake since), the slave took epoch 3 and its grants collided with the old master's
    path = epoch_file_path(str(tmp_path))
    slave = BrokerEpochStore(path)
    assert slave.begin(2_400).broker_epoch == 1
    assert slave.raise_to(3)  # handshake with the master's third lifetime
    assert not slave.raise_to(2)  # never lowered
    assert json.loads(Path(path).read_text())["brokerEpoch"] == 3
    restarted = BrokerEpochStore(path)
    assert restarted.begin(2_400).broker_epoch == 4
    assert restarted.bump() == 5  # promoted: above the old master's lifetimes
    assert restarted.bump(above=9) == 10  # a synced commit of a lifetime never heard of
    assert json.loads(Path(path).read_text())["brokerEpoch"] == 10
    for bad in (-1, True, "3", 2**31):
        with pytest.raises(BrokerEpochError, match="brokerEpoch must be"):
            restarted.raise_to(bad)  # type: ignore[arg-type]


def test_handshakes_and_promotions_racing_in_threads_never_leave_the_file_below_the_epoch(tmp_path: Path) -> None:
    # raise_to runs in a thread at every handshake and bump in another at a promotion: each changes the epoch and
    # writes the file, and the write (fsync, rename) lets the other thread in between
    path = epoch_file_path(str(tmp_path))
    store = BrokerEpochStore(path)
    store.begin(2_400)
    bumped: list[int] = []
    start = threading.Barrier(4)

    def promotions() -> None:
        start.wait()
        for _ in range(40):
            bumped.append(store.bump())

    def handshakes(offset: int) -> None:
        start.wait()
        for i in range(40):
            store.raise_to(2 * i + offset)

    threads = [threading.Thread(target=promotions), threading.Thread(target=promotions),
               threading.Thread(target=handshakes, args=(0,)), threading.Thread(target=handshakes, args=(1,))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(bumped)) == len(bumped) == 80  # no promotion reused an epoch
    assert json.loads(Path(path).read_text())["brokerEpoch"] == store.broker_epoch >= max(bumped)


def test_each_master_epoch_promotes_into_a_band_of_its_own() -> None:
    assert [promotion_floor(e) for e in (1, 2, 3)] == [1 << 16, 2 << 16, 3 << 16]
    assert promotion_floor(2**15 - 1) == (2**15 - 1) << 16 <= 2**31 - 1  # the last band that fits
    assert promotion_floor(2**15) == 0 and promotion_floor(0) == 0  # past it only the known epochs count


# ---------------------------------------------------------------------------------------------- offset fencing


def test_an_offset_commit_from_an_older_lock_epoch_is_refused_and_counted() -> None:
    clock = Clock(0)
    locks = RebalanceLockManager(max_live_ms=2_000, now_ms=clock, takeover_margin_ms=400, broker_epoch=3)
    om = ConsumerOffsetManager(None, broker_name="broker-a", lock_manager=locks, is_orderly=lambda g: True)
    e1 = locks.try_lock_batch_detailed(G, [mq(0)], "paused").epochs[mq(0)]
    assert om.commit_offset(G, T, 0, 10, "paused", source="update", lock_epoch=e1)
    clock.now += 2_401  # the paused holder's lease ran out; "survivor" takes the queue over
    e2 = locks.try_lock_batch_detailed(G, [mq(0)], "survivor").epochs[mq(0)]
    assert e2 > e1
    assert om.commit_offset(G, T, 0, 20, "survivor", source="update", lock_epoch=e2)
    assert not om.commit_offset(G, T, 0, 15, "paused", source="update", lock_epoch=e1)  # its late commit
    assert om.query_offset(G, T, 0) == 20 and om.fenced_updates[G] == 1
    locks.unlock_batch(G, [mq(0)], "survivor")
    assert not om.commit_offset(G, T, 0, 15, "paused", source="update", lock_epoch=e1)  # fenced after the unlock
    assert om.commit_offset(G, T, 1, 5, "anyone", source="update", lock_epoch=e1)  # never locked: nothing newer
    assert om.stale_epoch(G, T, 0, e1) == e2 and om.stale_epoch(G, T, 0, None) is None
    # Without an epoch (a pull's commit offset) the owner rule still applies; a new broker lifetime's grants
    # compare higher than every epoch of the previous one.
    assert not om.commit_offset(G, T, 0, 15, "paused", source="pull")
    assert make_epoch(4, 1) > e2


# ---------------------------------------------------------------------------------------------- the client


class LeaseApi:
    """The broker's lock answers, scripted: a lease of 2 s, one epoch per queue, optional refusals."""

    def __init__(self) -> None:
        self.epochs: dict[MessageQueue, int] = {}
        self.refuse: set[MessageQueue] = set()
        self.not_kept: set[MessageQueue] = set()
        self.member = True
        self.down = False
        self.requests: list[tuple[str, list[MessageQueue], dict[MessageQueue, int]]] = []

    async def lock_batch_mq_lease(self, addr: str, group: str, cid: str, mqs: Iterable[MessageQueue], *,
                                  claims: Mapping[MessageQueue, int] | None = None,
                                  timeout_ms: Any = None) -> LockBatchAnswer:
        from trimq.runtime.client import RemotingConnectError

        mqs = list(mqs)
        self.requests.append((addr, mqs, dict(claims or {})))
        await trio.sleep(0.01)  # 10 ms on the wire
        if self.down:
            raise RemotingConnectError("connection refused")
        held = {m for m in mqs if m not in self.refuse}
        return LockBatchAnswer(held, held - self.not_kept, {m: self.epochs.setdefault(m, make_epoch(1, 1))
                                                            for m in held}, 2_000, self.member)

    async def unlock_batch_mq(self, *args: Any, **kw: Any) -> None: ...


class Client:
    client_id = "me"

    def __init__(self) -> None:
        self.api = LeaseApi()

    async def find_broker_addr(self, broker_name: str, topic: str | None = None) -> str | None:
        return "10.0.0.1:10911"

    async def find_consumer_id_list(self, topic: str, group: str) -> list[str] | None:
        return ["me"]

    async def max_offset(self, m: MessageQueue) -> int:
        return 0

    async def search_offset(self, m: MessageQueue, ts: int) -> int:
        return 0

    async def send_heartbeat_to_all_brokers(self) -> None: ...


class Offsets:
    def __init__(self) -> None:
        self.epochs: dict[MessageQueue, int | None] = {}

    async def load(self) -> None: ...

    def update_offset(self, m: MessageQueue, offset: int, increase_only: bool) -> None: ...

    async def read_offset(self, m: MessageQueue, type: ReadOffsetType) -> int:
        return 0

    async def persist_all(self, mqs: Iterable[MessageQueue]) -> None: ...

    async def persist(self, m: MessageQueue) -> None: ...

    def remove_offset(self, m: MessageQueue) -> None:
        self.epochs.pop(m, None)

    def clone_offset_table(self, topic: str) -> dict[MessageQueue, int]:
        return {}

    def set_lock_epoch(self, m: MessageQueue, epoch: int | None) -> None:
        self.epochs[m] = epoch


class Pulls:
    def start(self, request: Any) -> None: ...

    def cancel(self, process_queue: Any) -> None: ...


def make(**config: Any) -> tuple[RebalanceImpl, Client, Offsets, list[MessageQueue]]:
    client, offsets = Client(), Offsets()
    fake: Any = client
    rb = RebalanceImpl(consumer_group=G, config=PushConsumerConfig(consumer_group=G, **config),
                       strategy=get_strategy("AVG"), client=fake, offset_store=offsets, consume_orderly=True,
                       pull_service=Pulls())
    rb.subscription_inner[T] = build_subscription_data(T, "*")
    relocked: list[MessageQueue] = []
    rb.on_relocked = lambda m, pq: relocked.append(m)
    return rb, client, offsets, relocked


def now_ms() -> int:
    return int(trio.current_time() * 1000)


async def test_the_client_counts_its_lease_from_the_send_and_stops_at_its_own_deadline(autojump_clock: Any) -> None:
    rb, client, offsets, _ = make()
    sent = now_ms()
    await rb.update_process_queue_table_in_rebalance(T, {mq(0)}, True)
    pq = rb.process_queue_table[mq(0)]
    assert pq.locked and pq.last_lock_timestamp == sent  # not the answer's time, 10 ms later
    assert pq.lock_max_live_time_ms == 2_000 == rb.lease_ms("broker-a")  # the broker's lease (below the 30 s cap)
    assert rb.lock_epoch(mq(0)) == offsets.epochs[mq(0)] == make_epoch(1, 1)  # commits carry it
    await trio.sleep((sent + 2_000 - now_ms()) / 1000)
    assert not pq.is_lock_expired(now_ms())  # the deadline itself is still inside the lease
    await trio.sleep(0.001)
    assert pq.is_lock_expired(now_ms())  # from here on the consume services start nothing (orderly._usable)
    client.api.down = True
    assert await rb.renew_leases("10.0.0.1:10911", ["broker-a"]) is None  # the broker cannot be reached
    assert pq.is_lock_expired(now_ms())
    client.api.down = False
    sent = now_ms()
    answer = await rb.renew_leases("10.0.0.1:10911", ["broker-a"])
    assert answer is not None and answer.held == {mq(0)}
    assert pq.last_lock_timestamp == sent and not pq.is_lock_expired(now_ms())  # renewed, kept, same epoch
    # The rocketmq profile's client never believes a lock longer than rebalance_lock_max_live_time either.
    rb2, _, _, _ = make(lock_profile="rocketmq", rebalance_lock_max_live_time=1_000)
    await rb2.update_process_queue_table_in_rebalance(T, {mq(0)}, True)
    assert rb2.process_queue_table[mq(0)].lock_max_live_time_ms == 1_000


async def test_a_dropped_connection_stops_the_brokers_queues_until_they_are_claimed_back(autojump_clock: Any) -> None:
    rb, client, offsets, relocked = make()
    await rb.update_process_queue_table_in_rebalance(T, {mq(0), mq(1), mq(0, "broker-b")}, True)
    pqs = rb.process_queue_table
    assert rb.broker_connection_lost(["broker-a"]) == [mq(0), mq(1)]
    assert not pqs[mq(0)].locked and not pqs[mq(1)].locked and pqs[mq(0, "broker-b")].locked
    # The broker restarted: its new grants carry a higher epoch; the client claims what its clock still holds.
    client.api.epochs = {mq(0): make_epoch(2, 1), mq(1): make_epoch(2, 1)}
    await trio.sleep(0.5)
    await rb.renew_leases("10.0.0.1:10911", ["broker-a"])
    _, sent_mqs, claims = client.api.requests[-1]
    assert sent_mqs == [mq(0), mq(1)] and claims == {mq(0): make_epoch(1, 1), mq(1): make_epoch(1, 1)}
    assert pqs[mq(0)].locked and pqs[mq(1)].locked and relocked == [mq(0), mq(1)]  # consumption resumes at once
    assert rb.lock_epoch(mq(0)) == offsets.epochs[mq(0)] == make_epoch(2, 1)  # continuous, under the new grant
    # A queue whose own lease ran out before the connection came back is not claimed.
    rb.broker_connection_lost(["broker-b"])
    await trio.sleep(2.1)
    client.api.not_kept = {mq(0, "broker-b")}
    await rb.renew_leases("10.0.0.2:10911", ["broker-b"])
    assert client.api.requests[-1][2] == {}
    assert mq(0, "broker-b") not in pqs  # someone may have consumed it meanwhile: re-created from the commit


async def test_the_rocketmq_profile_keeps_consuming_when_a_connection_drops(autojump_clock: Any) -> None:
    rb, _, _, _ = make(lock_profile="rocketmq")
    await rb.update_process_queue_table_in_rebalance(T, {mq(0)}, True)
    assert rb.broker_connection_lost(["broker-a"]) == []
    assert rb.process_queue_table[mq(0)].locked


def test_broadcasting_orderly_members_keep_rocketmqs_membership_rules() -> None:
    # They lock nothing, so they never renew: a lease-length silence says nothing about them.
    clock = Clock()
    cm = ConsumerManager(now_ms=clock, lease_expiry_ms=2_400, disconnect_grace_ms=300)
    body = {"clientID": "b", "consumerDataSet": [{
        "groupName": G, "consumeOrderly": True, "messageModel": "BROADCASTING",
        "subscriptionDataSet": [{"topic": T, "subString": "*"}]}]}
    cm.heartbeat(stub_conn(), parse_heartbeat(body))
    clock.now += 60_000
    assert cm.scan_leases() == [] and cm.get_consumer_ids(G) == ["b"]


def test_a_bad_epoch_file_stops_the_start_and_a_bad_masters_epoch_does_not_read_as_one(tmp_path: Path) -> None:
    """The file's error is a StateFileError (trimq-broker: ``cannot start: FILE: ...``); a master's epoch out of range
    met at a handshake is not about this broker's files."""
    from trimq.broker.store.atomic import StateFileError

    path = epoch_file_path(str(tmp_path))
    Path(path).parent.mkdir(parents=True)
    Path(path).write_text('{"brokerEpoch": -1}')
    with pytest.raises(StateFileError, match="brokerEpoch must be a non-negative integer"):
        BrokerEpochStore(path).begin(2_400)
    store = BrokerEpochStore(epoch_file_path(str(tmp_path / "other")))
    store.begin(2_400)
    with pytest.raises(BrokerEpochError) as raised:
        store.raise_to(2**31)
    assert not isinstance(raised.value, StateFileError)
