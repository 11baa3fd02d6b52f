"""Allocation strategies: RocketMQ 4.9.3's peer scenarios, each quirk of ROCKETMQ_FACTS.md §2, properties."""

from __future__ import annotations

import hashlib
import math
import random
from collections import Counter
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trimq.client.rebalance.strategies import (
    STRATEGY_NAMES,
    AllocateMachineRoomNearby,
    AllocateMessageQueueAveragely,
    AllocateMessageQueueByConfig,
    AllocateMessageQueueByMachineRoom,
    AllocateMessageQueueConsistentHash,
    AllocateMessageQueueConsistentHashBounded,
    AllocateStrategy,
    ConsistentHashRouter,
    SplitRoomResolver,
    allocate_all,
    count_moved,
    get_strategy,
    md5_hash,
    movement_benchmark,
    simulate,
    sorted_inputs,
)
from trimq.protocol.message_queue import MessageQueue

GROUP = "testConsumerGroup"


def mqs(n: int, topic: str = "topic_test", broker: str = "brokerName") -> list[MessageQueue]:
    return [MessageQueue(topic, broker, i) for i in range(n)]


def cids(n: int, prefix: str = "CID-") -> list[str]:
    return [f"{prefix}{i}" for i in range(n)]


def ids(queues: Sequence[MessageQueue]) -> list[int]:
    return [mq.queue_id for mq in queues]


def run_all(
    strategy: AllocateStrategy, mq_all: list[MessageQueue], cid_all: list[str]
) -> dict[str, list[MessageQueue]]:
    """Every member on the same (unsorted, as given) inputs, like the RocketMQ tests do."""
    return {cid: strategy.allocate(GROUP, cid, mq_all, cid_all) for cid in cid_all}


def owner_map(result: dict[str, list[MessageQueue]]) -> dict[MessageQueue, str]:
    owners: dict[MessageQueue, str] = {}
    for cid, queues in result.items():
        for mq in queues:
            assert mq not in owners, f"{mq} given to both {owners[mq]} and {cid}"
            owners[mq] = cid
    return owners


def assert_full_exact_cover(result: dict[str, list[MessageQueue]], mq_all: list[MessageQueue]) -> None:
    flat = [mq for queues in result.values() for mq in queues]
    assert Counter(flat) == Counter(mq_all)


# ---------------------------------------------------------------------------------------------------
# Names and the registry


@pytest.mark.parametrize(
    ("name", "params", "expected"),
    [
        ("AVG", {}, "AVG"),
        ("AVG_BY_CIRCLE", {}, "AVG_BY_CIRCLE"),
        ("CONFIG", {}, "CONFIG"),
        ("MACHINE_ROOM", {"consumer_idcs": {"room1"}}, "MACHINE_ROOM"),
        (
            "MACHINE_ROOM_NEARBY",
            {"inner": AllocateMessageQueueAveragely(), "resolver": SplitRoomResolver()},
            "MACHINE_ROOM_NEARBY-AVG",
        ),
        (
            "MACHINE_ROOM_NEARBY",
            {"inner": "AVG_BY_CIRCLE", "resolver": SplitRoomResolver()},
            "MACHINE_ROOM_NEARBY-AVG_BY_CIRCLE",
        ),
        (
            "MACHINE_ROOM_NEARBY-CONSISTENT_HASH",
            {"resolver": SplitRoomResolver()},
            "MACHINE_ROOM_NEARBY-CONSISTENT_HASH",
        ),
        ("CONSISTENT_HASH", {}, "CONSISTENT_HASH"),
        ("consistent_hash_bounded", {"epsilon": 0.5}, "CONSISTENT_HASH_BOUNDED"),
    ],
)
def test_get_strategy_names(name: str, params: dict[str, Any], expected: str) -> None:
    strategy = get_strategy(name, **params)
    assert strategy.name == expected
    assert isinstance(strategy, AllocateStrategy)


def test_unknown_strategy_lists_valid_names() -> None:
    with pytest.raises(ValueError, match="unknown allocation strategy 'NOPE'") as info:
        get_strategy("NOPE")
    for name in STRATEGY_NAMES:
        assert name in str(info.value)


def test_unknown_parameter_is_named() -> None:
    with pytest.raises(ValueError, match="AVG does not take epsilon"):
        get_strategy("AVG", epsilon=0.1)
    with pytest.raises(ValueError, match="CONSISTENT_HASH does not take epsilon"):
        get_strategy("CONSISTENT_HASH", epsilon=0.1)


# ---------------------------------------------------------------------------------------------------
# Common validation (AVG, AVG_BY_CIRCLE, CONSISTENT_HASH, MACHINE_ROOM_NEARBY, and the bounded one)

COMMON = [
    AllocateMessageQueueAveragely(),
    get_strategy("AVG_BY_CIRCLE"),
    AllocateMessageQueueConsistentHash(),
    AllocateMachineRoomNearby(AllocateMessageQueueAveragely(), SplitRoomResolver()),
    AllocateMessageQueueConsistentHashBounded(),
]


@pytest.mark.parametrize("strategy", COMMON, ids=lambda s: s.name)
def test_common_validation_messages_and_order(strategy: AllocateStrategy) -> None:
    good_mqs, good_cids = mqs(6), cids(2)
    for bad_cid in (None, ""):
        with pytest.raises(ValueError, match=r"^currentCID is empty$"):
            strategy.allocate(GROUP, bad_cid, good_mqs, good_cids)  # type: ignore[arg-type]
    bad_mqs: list[MessageQueue] | None
    for bad_mqs in (None, []):
        with pytest.raises(ValueError, match=r"^mqAll is null or mqAll empty$"):
            strategy.allocate(GROUP, "CID-0", bad_mqs, good_cids)  # type: ignore[arg-type]
    bad_cids: list[str] | None
    for bad_cids in (None, []):
        with pytest.raises(ValueError, match=r"^cidAll is null or cidAll empty$"):
            strategy.allocate(GROUP, "CID-0", good_mqs, bad_cids)  # type: ignore[arg-type]
    # Order of checks: the current id first, then mqAll, then cidAll; membership is checked last, so an
    # empty mqAll throws even for an outsider.
    with pytest.raises(ValueError, match="currentCID is empty"):
        strategy.allocate(GROUP, "", [], [])
    with pytest.raises(ValueError, match="mqAll is null"):
        strategy.allocate(GROUP, "outsider", [], [])
    with pytest.raises(ValueError, match="cidAll is null"):
        strategy.allocate(GROUP, "outsider", good_mqs, [])


@pytest.mark.parametrize("strategy", COMMON, ids=lambda s: s.name)
def test_outsider_and_blank_id_get_nothing(strategy: AllocateStrategy) -> None:
    assert strategy.allocate(GROUP, str(2**31 - 1), mqs(6), cids(2)) == []
    # A whitespace-only id is not rejected by these (only MACHINE_ROOM uses isBlank).
    assert strategy.allocate(GROUP, " ", mqs(6), cids(2)) == []


def test_non_string_current_cid_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="currentCID must be a str"):
        AllocateMessageQueueAveragely().allocate(GROUP, 7, mqs(2), cids(2))  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------------
# AVG


def test_avg_peer_10_queues_4_consumers() -> None:
    result = run_all(AllocateMessageQueueAveragely(), mqs(10), cids(4, "CID_PREFIX"))
    assert [len(v) for v in result.values()] == [3, 3, 2, 2]
    assert [ids(v) for v in result.values()] == [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]


def test_avg_first_mod_consumers_get_one_extra_contiguous() -> None:
    result = run_all(AllocateMessageQueueAveragely(), mqs(5), cids(2))
    assert [ids(v) for v in result.values()] == [[0, 1, 2], [3, 4]]
    result = run_all(AllocateMessageQueueAveragely(), mqs(7), cids(3))
    assert [ids(v) for v in result.values()] == [[0, 1, 2], [3, 4], [5, 6]]


def test_avg_fewer_queues_than_consumers_late_consumers_get_nothing() -> None:
    result = run_all(AllocateMessageQueueAveragely(), mqs(3), cids(5))
    assert [ids(v) for v in result.values()] == [[0], [1], [2], [], []]


def test_avg_uses_first_occurrence_of_a_duplicated_id() -> None:
    # indexOf semantics: both copies of "a" compute index 0.
    strategy = AllocateMessageQueueAveragely()
    assert ids(strategy.allocate(GROUP, "a", mqs(6), ["a", "b", "a"])) == [0, 1]
    assert ids(strategy.allocate(GROUP, "b", mqs(6), ["a", "b", "a"])) == [2, 3]


# ---------------------------------------------------------------------------------------------------
# AVG_BY_CIRCLE


def test_avg_by_circle_peer_10_queues_4_consumers() -> None:
    result = run_all(get_strategy("AVG_BY_CIRCLE"), mqs(10), cids(4))
    assert [ids(v) for v in result.values()] == [[0, 4, 8], [1, 5, 9], [2, 6], [3, 7]]


def test_avg_by_circle_outsider_and_more_consumers_than_queues() -> None:
    strategy = get_strategy("AVG_BY_CIRCLE")
    assert strategy.allocate(GROUP, "CID-9", mqs(10), cids(4)) == []
    result = run_all(strategy, mqs(2), cids(4))
    assert [ids(v) for v in result.values()] == [[0], [1], [], []]


# ---------------------------------------------------------------------------------------------------
# CONFIG


def test_config_peer_every_consumer_gets_the_configured_list() -> None:
    configured = mqs(4)
    strategy = get_strategy("CONFIG", message_queues=configured)
    result = run_all(strategy, mqs(10), cids(2))
    assert [ids(v) for v in result.values()] == [[0, 1, 2, 3], [0, 1, 2, 3]]


def test_config_returns_the_same_object_regardless_of_arguments() -> None:
    configured = mqs(4)
    strategy = AllocateMessageQueueByConfig(configured)
    assert strategy.allocate(GROUP, "CID-0", mqs(2), cids(1)) is configured
    # No validation at all, and outsiders also get it.
    assert strategy.allocate(GROUP, "", [], []) is configured
    assert strategy.allocate(GROUP, "stranger", mqs(1), cids(3)) is configured
    assert strategy.allocate(None, None, None, None) is configured  # type: ignore[arg-type]


def test_config_unset_gives_nothing() -> None:
    assert AllocateMessageQueueByConfig().allocate(GROUP, "CID-0", mqs(3), cids(1)) == []


# ---------------------------------------------------------------------------------------------------
# MACHINE_ROOM


def machine_room_queues() -> list[MessageQueue]:
    return [MessageQueue("topic", "room1@broker-a", i) for i in range(5)] + [
        MessageQueue("topic", "room2@broker-b", i) for i in range(5, 10)
    ]


def test_machine_room_peer_remainder_from_the_tail() -> None:
    strategy = get_strategy("MACHINE_ROOM", consumer_idcs={"room1"})
    result = run_all(strategy, machine_room_queues(), cids(2))
    assert [ids(v) for v in result.values()] == [[0, 1, 4], [2, 3]]


def test_machine_room_empty_mq_all_message() -> None:
    strategy = get_strategy("MACHINE_ROOM", consumer_idcs={"room1"})
    with pytest.raises(ValueError, match=r"^mqAll is null or mqAll empty$"):
        strategy.allocate(GROUP, "CID-0", [], cids(2))
    with pytest.raises(ValueError, match=r"^cidAll is null or cidAll empty$"):
        strategy.allocate(GROUP, "CID-0", machine_room_queues(), [])


def test_machine_room_rejects_blank_current_cid() -> None:
    strategy = get_strategy("MACHINE_ROOM", consumer_idcs={"room1"})
    for blank in (None, "", " ", "\t "):
        with pytest.raises(ValueError, match=r"^currentCID is empty$"):
            strategy.allocate(GROUP, blank, machine_room_queues(), cids(2))  # type: ignore[arg-type]


def test_machine_room_outsider_gets_nothing() -> None:
    strategy = get_strategy("MACHINE_ROOM", consumer_idcs={"room1"})
    assert strategy.allocate(GROUP, "CID-7", machine_room_queues(), cids(2)) == []


def test_machine_room_needs_exactly_two_parts_like_java_split() -> None:
    queues = [
        MessageQueue("t", "room1@a@b", 0),  # three parts: ineligible
        MessageQueue("t", "room1", 1),  # one part
        MessageQueue("t", "room1@", 2),  # Java drops the trailing empty part -> one part
        MessageQueue("t", "room1@b@", 3),  # "room1", "b" (trailing empty dropped) -> two parts: eligible
        MessageQueue("t", "room1@b", 4),  # eligible
        MessageQueue("t", "@b", 5),  # "", "b": two parts, room "" not configured
        MessageQueue("t", "room2@b", 6),  # other room
    ]
    strategy = AllocateMessageQueueByMachineRoom({"room1"})
    assert ids(strategy.allocate(GROUP, "c", queues, ["c"])) == [3, 4]
    assert ids(AllocateMessageQueueByMachineRoom({""}).allocate(GROUP, "c", queues, ["c"])) == [5]


def test_machine_room_more_consumers_than_eligible_queues() -> None:
    strategy = AllocateMessageQueueByMachineRoom({"room1"})
    result = run_all(strategy, machine_room_queues(), cids(7))
    assert [ids(v) for v in result.values()] == [[0], [1], [2], [3], [4], [], []]


def test_machine_room_none_idcs_fails_only_on_an_eligible_broker_name() -> None:
    strategy = get_strategy("MACHINE_ROOM")  # consumer_idcs left unset, like an unset Java field
    assert strategy.allocate(GROUP, "c", mqs(3, broker="plain-broker"), ["c"]) == []
    with pytest.raises(TypeError, match="consumer_idcs"):
        strategy.allocate(GROUP, "c", machine_room_queues(), ["c"])


# ---------------------------------------------------------------------------------------------------
# MACHINE_ROOM_NEARBY (resolver splits on "-" like AllocateMachineRoomNearByTest)

NEARBY = AllocateMachineRoomNearby(AllocateMessageQueueAveragely(), SplitRoomResolver("-"))
RESOLVER = SplitRoomResolver("-")


def prepare_mq(broker_idc_size: int, queue_size: int) -> list[MessageQueue]:
    return [
        MessageQueue("topic_test", f"IDC{i}-brokerName", q)
        for i in range(1, broker_idc_size + 1)
        for q in range(queue_size)
    ]


def prepare_consumer(idc_size: int, consumer_size: int) -> list[str]:
    return [f"IDC{i}-CID-{k}" for i in range(1, idc_size + 1) for k in range(consumer_size)]


def check_when_idc_size_equals(idc_size: int, queue_size: int, consumer_size: int) -> None:
    cid_all, mq_all = prepare_consumer(idc_size, consumer_size), prepare_mq(idc_size, queue_size)
    result = run_all(NEARBY, mq_all, cid_all)
    for cid, queues in result.items():
        for mq in queues:
            assert RESOLVER.broker_deploy_in(mq) == RESOLVER.consumer_deploy_in(cid)
    if cid_all:
        assert_full_exact_cover(result, mq_all)


def check_when_consumer_idc_is_more(broker_idc: int, more: int, queue_size: int, consumer_size: int) -> None:
    cid_all, mq_all = prepare_consumer(broker_idc + more, consumer_size), prepare_mq(broker_idc, queue_size)
    broker_rooms = {RESOLVER.broker_deploy_in(mq) for mq in mq_all}
    result = run_all(NEARBY, mq_all, cid_all)
    for cid, queues in result.items():
        for mq in queues:
            if RESOLVER.broker_deploy_in(mq) in broker_rooms:
                assert RESOLVER.broker_deploy_in(mq) == RESOLVER.consumer_deploy_in(cid)
    if cid_all:
        assert_full_exact_cover(result, mq_all)


def check_when_consumer_idc_is_less(broker_idc: int, less: int, queue_size: int, consumer_size: int) -> None:
    cid_all, mq_all = prepare_consumer(broker_idc - less, consumer_size), prepare_mq(broker_idc, queue_size)
    result = run_all(NEARBY, mq_all, cid_all)
    by_room: dict[str, list[MessageQueue]] = {}
    for cid, queues in result.items():
        by_room.setdefault(RESOLVER.consumer_deploy_in(cid), []).extend(queues)
    for room in {RESOLVER.consumer_deploy_in(c) for c in cid_all}:
        own = [mq for mq in mq_all if RESOLVER.broker_deploy_in(mq) == room]
        assert set(own) <= set(by_room[room])
    if cid_all:
        assert_full_exact_cover(result, mq_all)


@pytest.mark.parametrize("consumers", [10, 20, 30, 0])
def test_nearby_peer_equal_room_sets(consumers: int) -> None:
    check_when_idc_size_equals(5, 20, consumers)


@pytest.mark.parametrize("consumers", [10, 5, 20, 0])
def test_nearby_peer_more_consumer_rooms(consumers: int) -> None:
    check_when_consumer_idc_is_more(5, 1, 10, consumers)


@pytest.mark.parametrize("consumers", [10, 5, 20, 0])
def test_nearby_peer_fewer_consumer_rooms(consumers: int) -> None:
    check_when_consumer_idc_is_less(5, 2, 10, consumers)


def test_nearby_peer_random_shapes() -> None:
    rng = random.Random(4242)
    for _ in range(10):
        consumer_size, queue_size = rng.randint(1, 60), rng.randint(1, 100)
        broker_idc, consumer_idc = rng.randint(1, 10), rng.randint(1, 10)
        if broker_idc == consumer_idc:
            check_when_idc_size_equals(broker_idc, queue_size, consumer_size)
        elif broker_idc > consumer_idc:
            check_when_consumer_idc_is_less(broker_idc, broker_idc - consumer_idc, queue_size, consumer_size)
        else:
            check_when_consumer_idc_is_more(broker_idc, consumer_idc - broker_idc, queue_size, consumer_size)


def test_nearby_order_own_room_first_then_orphan_rooms_by_name() -> None:
    # Facts §2 example: consumers all in IDC4; queues in IDC1 (2), IDC2 (1), IDC4 (2).
    resolver = SplitRoomResolver("@")
    strategy = AllocateMachineRoomNearby(AllocateMessageQueueAveragely(), resolver)
    mq_all = sorted(
        [MessageQueue("t", "IDC1@broker-a", q) for q in range(2)]
        + [MessageQueue("t", "IDC2@broker-b", 0)]
        + [MessageQueue("t", "IDC4@broker-10", q) for q in range(2)]
    )
    cid_all = ["IDC4@cid-0", "IDC4@cid-1"]
    first = strategy.allocate(GROUP, cid_all[0], mq_all, cid_all)
    assert [str(mq) for mq in first] == [
        "MessageQueue [topic=t, brokerName=IDC4@broker-10, queueId=0]",
        "MessageQueue [topic=t, brokerName=IDC1@broker-a, queueId=0]",
        "MessageQueue [topic=t, brokerName=IDC2@broker-b, queueId=0]",
    ]
    second = strategy.allocate(GROUP, cid_all[1], mq_all, cid_all)
    assert [(mq.broker_name, mq.queue_id) for mq in second] == [("IDC4@broker-10", 1), ("IDC1@broker-a", 1)]


def test_nearby_orphan_rooms_use_the_full_cid_all_and_occupied_rooms_stay_home() -> None:
    calls: list[tuple[str, list[int], list[str]]] = []

    class Recorder:
        name = "REC"

        def allocate(
            self, group: str, cid: str, mq_all: Sequence[MessageQueue], cid_all: Sequence[str]
        ) -> list[MessageQueue]:
            calls.append((RESOLVER.broker_deploy_in(mq_all[0]), ids(mq_all), list(cid_all)))
            return []

    strategy = AllocateMachineRoomNearby(Recorder(), RESOLVER)
    mq_all = prepare_mq(3, 2)  # IDC1, IDC2, IDC3
    cid_all = ["IDC1-CID-0", "IDC2-CID-0", "IDC2-CID-1"]  # IDC3 has nobody
    strategy.allocate(GROUP, "IDC2-CID-1", mq_all, cid_all)
    # Own room with own room's consumers; IDC1 (occupied by someone else) skipped; IDC3 with everyone.
    assert calls == [("IDC2", [0, 1], ["IDC2-CID-0", "IDC2-CID-1"]), ("IDC3", [0, 1], cid_all)]
    assert strategy.name == "MACHINE_ROOM_NEARBY-REC"


def test_nearby_room_null_messages() -> None:
    class Blank:
        def __init__(self, broker: str, consumer: str) -> None:
            self.broker, self.consumer = broker, consumer

        def broker_deploy_in(self, mq: MessageQueue) -> str:
            return self.broker

        def consumer_deploy_in(self, client_id: str) -> str:
            return self.consumer

    mq_all = mqs(2)
    with pytest.raises(
        ValueError,
        match=r"^Machine room is null for mq MessageQueue \[topic=topic_test, "
        r"brokerName=brokerName, queueId=0\]$",
    ):
        AllocateMachineRoomNearby(AllocateMessageQueueAveragely(), Blank("", "r")).allocate(GROUP, "c", mq_all, ["c"])
    with pytest.raises(ValueError, match=r"^Machine room is null for consumer id c$"):
        AllocateMachineRoomNearby(AllocateMessageQueueAveragely(), Blank("r", "")).allocate(GROUP, "c", mq_all, ["c"])
    resolver_none = Blank("r", None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="Machine room is null for consumer id c"):
        AllocateMachineRoomNearby(AllocateMessageQueueAveragely(), resolver_none).allocate(GROUP, "c", mq_all, ["c"])


def test_nearby_needs_inner_and_resolver() -> None:
    with pytest.raises(TypeError, match="allocateMessageQueueStrategy is null"):
        AllocateMachineRoomNearby(None, SplitRoomResolver())
    with pytest.raises(TypeError, match="machineRoomResolver is null"):
        AllocateMachineRoomNearby(AllocateMessageQueueAveragely(), None)
    with pytest.raises(TypeError, match="allocateMessageQueueStrategy is null"):
        get_strategy("MACHINE_ROOM_NEARBY", resolver=SplitRoomResolver())
    with pytest.raises(TypeError, match="machineRoomResolver is null"):
        get_strategy("MACHINE_ROOM_NEARBY-AVG")
    with pytest.raises(TypeError, match="broker_deploy_in"):
        AllocateMachineRoomNearby(AllocateMessageQueueAveragely(), object())  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------------
# CONSISTENT_HASH


def test_md5_check_values() -> None:
    assert md5_hash("") == 3558706393
    assert md5_hash("a") == 214005177
    assert md5_hash("abc") == 2416005272
    # First four digest bytes, big-endian, unsigned; the rest ignored.
    digest = hashlib.md5(b"MessageQueue [topic=T, brokerName=b, queueId=0]").digest()
    assert md5_hash("MessageQueue [topic=T, brokerName=b, queueId=0]") == int.from_bytes(digest[:4], "big")


def oracle_consistent_hash(mq_all: list[MessageQueue], cid_all: list[str], vnodes: int) -> dict[MessageQueue, str]:
    """An independent transcription: later vnodes overwrite equal hashes, then ceiling with wrap."""
    ring: dict[int, str] = {}
    for cid in cid_all:
        for i in range(vnodes):
            ring[md5_hash(f"{cid}-{i}")] = cid
    points = sorted(ring)
    out = {}
    for mq in mq_all:
        h = md5_hash(str(mq))
        at_or_after = [p for p in points if p >= h]
        out[mq] = ring[at_or_after[0] if at_or_after else points[0]]
    return out


def consistent_hash_peer_check(queue_size: int, consumer_size: int) -> None:
    strategy = AllocateMessageQueueConsistentHash(3)
    mq_all, cid_all = mqs(queue_size), cids(consumer_size)
    origin = owner_map(run_all(strategy, mq_all, cid_all))
    assert set(origin) == set(mq_all)
    assert origin == oracle_consistent_hash(mq_all, cid_all, 3)

    removed, after_remove_cids = cid_all[0], cid_all[1:]
    if after_remove_cids:
        after_remove = owner_map(run_all(strategy, mq_all, after_remove_cids))
        assert set(after_remove) == set(mq_all)
        for mq, owner in origin.items():
            if owner != removed:
                assert after_remove[mq] == owner  # only the removed consumer's queues move
    else:
        after_remove = {}

    new_cids = [*after_remove_cids, "CID-NEW"]
    after_add = owner_map(run_all(strategy, mq_all, new_cids))
    assert set(after_add) == set(mq_all)
    for mq, owner in after_add.items():
        if owner != "CID-NEW" and after_remove:
            assert after_remove[mq] == owner  # only queues that go to the newcomer move


@pytest.mark.parametrize(("queues", "consumers"), [(20, 10), (10, 20)])
def test_consistent_hash_peer_allocate(queues: int, consumers: int) -> None:
    consistent_hash_peer_check(queues, consumers)


def test_consistent_hash_peer_random_sizes() -> None:
    rng = random.Random(100)
    for _ in range(10):
        consistent_hash_peer_check(rng.randint(1, 20), rng.randint(1, 20))


def test_consistent_hash_outsider_and_validation() -> None:
    strategy = AllocateMessageQueueConsistentHash()
    assert strategy.allocate("", str(2**31 - 1), mqs(6), cids(2)) == []
    with pytest.raises(ValueError):
        strategy.allocate("", "", mqs(6), cids(2))
    with pytest.raises(ValueError):
        strategy.allocate("", "0", None, cids(2))  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        strategy.allocate("", "0", mqs(6), None)  # type: ignore[arg-type]


def test_consistent_hash_negative_virtual_nodes() -> None:
    with pytest.raises(ValueError, match=r"^illegal virtualNodeCnt :-1$"):
        AllocateMessageQueueConsistentHash(-1)
    with pytest.raises(ValueError, match=r"^illegal virtual node counts :-2$"):
        ConsistentHashRouter(["a"], 1).add_node("b", -2)
    with pytest.raises(TypeError, match="virtual_node_count must be an int"):
        AllocateMessageQueueConsistentHash("3")  # type: ignore[arg-type]


def test_consistent_hash_zero_virtual_nodes_assigns_nothing() -> None:
    strategy = get_strategy("CONSISTENT_HASH", virtual_node_count=0)
    result = run_all(strategy, mqs(8), cids(3))
    assert all(v == [] for v in result.values())
    assert ConsistentHashRouter(cids(3), 0).route_node("anything") is None


def test_consistent_hash_keys_are_cid_dash_index_and_mq_to_string() -> None:
    seen: list[str] = []

    def recording(key: str) -> int:
        seen.append(key)
        return md5_hash(key)

    strategy = AllocateMessageQueueConsistentHash(2, hash_function=recording)
    mq_all = [MessageQueue("TopicTest", "broker-a", 0)]
    strategy.allocate(GROUP, "c1", mq_all, ["c1", "c2"])
    assert seen == ["c1-0", "c1-1", "c2-0", "c2-1", "MessageQueue [topic=TopicTest, brokerName=broker-a, queueId=0]"]


def test_consistent_hash_equal_hash_later_vnode_overwrites() -> None:
    strategy = AllocateMessageQueueConsistentHash(3, hash_function=lambda key: 7)
    result = run_all(strategy, mqs(4), ["a", "b", "c"])
    assert result == {"a": [], "b": [], "c": mqs(4)}  # "c-2" was inserted last and won the single slot


def test_consistent_hash_ceiling_is_inclusive_and_wraps() -> None:
    table = {"a-0": 100, "b-0": 200, "k100": 100, "k150": 150, "k200": 200, "k201": 201, "k0": 0}
    router = ConsistentHashRouter(["a", "b"], 1, hash_function=table.__getitem__)
    assert router.route_node("k100") == "a"  # equality counts (tail map from the key, inclusive)
    assert router.route_node("k150") == "b"
    assert router.route_node("k200") == "b"
    assert router.route_node("k201") == "a"  # past the largest: wrap to the smallest
    assert router.route_node("k0") == "a"


def test_router_replicas_continue_numbering_and_remove() -> None:
    seen: list[str] = []

    def recording(key: str) -> int:
        seen.append(key)
        return md5_hash(key)

    router = ConsistentHashRouter(["a"], 2, hash_function=recording)
    router.add_node("a", 2)
    assert seen == ["a-0", "a-1", "a-2", "a-3"]
    assert router.existing_replicas("a") == 4
    router.remove_node("a")
    assert len(router) == 0
    assert router.route_node("x") is None


def test_custom_hash_function_must_return_int() -> None:
    strategy = AllocateMessageQueueConsistentHash(1, hash_function=lambda key: "nope")  # type: ignore[arg-type,return-value]
    with pytest.raises(TypeError, match="hash_function must return an int"):
        strategy.allocate(GROUP, "a", mqs(1), ["a"])


# ---------------------------------------------------------------------------------------------------
# CONSISTENT_HASH_BOUNDED


def test_bounded_validation() -> None:
    for eps in (0, -0.5, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="epsilon must be a finite number > 0"):
            AllocateMessageQueueConsistentHashBounded(epsilon=eps)
    with pytest.raises(ValueError, match="virtual_node_count must be >= 1"):
        AllocateMessageQueueConsistentHashBounded(virtual_node_count=0)
    with pytest.raises(TypeError, match="epsilon must be a number"):
        AllocateMessageQueueConsistentHashBounded(epsilon="0.2")  # type: ignore[arg-type]


def test_bounded_max_load_is_exact() -> None:
    strategy = AllocateMessageQueueConsistentHashBounded(epsilon=0.25)
    assert strategy.max_load(16, 4) == 5  # 4 * 1.25 = 5 exactly, not 6
    assert strategy.max_load(10, 4) == 4  # ceil(3.125)
    assert strategy.max_load(1, 10) == 1


def test_bounded_respects_cap_on_a_skewed_ring() -> None:
    # Every queue key hashes to the same point: unbounded, one consumer would get everything.
    def skewed(key: str) -> int:
        return 0 if key.startswith("MessageQueue [") else md5_hash(key)

    strategy = AllocateMessageQueueConsistentHashBounded(epsilon=0.25, virtual_node_count=2, hash_function=skewed)
    result = allocate_all(strategy, GROUP, mqs(12), cids(3))
    assert_full_exact_cover(result, mqs(12))
    assert max(len(v) for v in result.values()) <= strategy.max_load(12, 3)


def test_bounded_ignores_input_order_and_duplicates() -> None:
    strategy = AllocateMessageQueueConsistentHashBounded()
    mq_all, cid_all = mqs(17), cids(5)
    reference = {cid: strategy.allocate(GROUP, cid, mq_all, cid_all) for cid in cid_all}
    shuffled_mqs, shuffled_cids = list(reversed(mq_all)) + mq_all[:3], [*reversed(cid_all), cid_all[0]]
    for cid in cid_all:
        assert strategy.allocate(GROUP, cid, shuffled_mqs, shuffled_cids) == reference[cid]


@settings(max_examples=60, deadline=None)
@given(
    queues=st.integers(1, 80),
    consumers=st.integers(1, 20),
    epsilon=st.sampled_from([0.05, 0.1, 0.25, 0.5, 1.0, 3.0]),
    vnodes=st.integers(1, 30),
)
def test_bounded_property_cover_and_bound(queues: int, consumers: int, epsilon: float, vnodes: int) -> None:
    strategy = AllocateMessageQueueConsistentHashBounded(epsilon=epsilon, virtual_node_count=vnodes)
    mq_all = mqs(queues)
    result = allocate_all(strategy, GROUP, mq_all, cids(consumers))
    assert_full_exact_cover(result, mq_all)
    cap = math.ceil(Fraction(queues) * (1 + Fraction(epsilon)) / consumers)  # ceil(n / c * (1 + eps))
    assert strategy.max_load(queues, consumers) == cap
    assert max(len(v) for v in result.values()) <= cap


def test_bounded_moves_less_than_avg_on_joins_and_leaves() -> None:
    numbers = movement_numbers()
    print(
        f"\nqueues moved over {numbers['scenarios']} seeded join/leave scenarios (seed {numbers['seed']}):",
        numbers["moved"],
    )
    moved = numbers["moved"]
    assert moved["CONSISTENT_HASH_BOUNDED"] < moved["AVG"]


def movement_numbers() -> dict[str, Any]:
    """The figures for the closing note: total moved queues per strategy (see strategies.movement_benchmark)."""
    return movement_benchmark(("AVG", "AVG_BY_CIRCLE", "CONSISTENT_HASH", "CONSISTENT_HASH_BOUNDED"), scenarios=60)


def test_movement_benchmark_is_deterministic() -> None:
    a = movement_benchmark(("AVG",), scenarios=5, seed=1)
    b = movement_benchmark(("AVG",), scenarios=5, seed=1)
    assert a == b
    assert a["moved"]["AVG"] == sum(row["AVG"] for row in a["per_scenario"])


# ---------------------------------------------------------------------------------------------------
# Properties over every strategy

room_brokers = st.sampled_from(["room1@broker-a", "room2@broker-b", "IDC1-broker", "IDC2-broker", "plain", "a@b@c"])
queue_lists = st.lists(
    st.builds(MessageQueue, st.sampled_from(["T1", "T2"]), room_brokers, st.integers(0, 7)),
    min_size=1,
    max_size=30,
    unique=True,
)
client_lists = st.lists(
    st.text(alphabet="IDC12-ab@", min_size=1, max_size=6),
    min_size=1,
    max_size=8,
    unique=True,
)


class ByBrokerPrefix:
    def broker_deploy_in(self, mq: MessageQueue) -> str:
        return mq.broker_name[:1]

    def consumer_deploy_in(self, client_id: str) -> str:
        return client_id[:1]


def all_non_config_strategies() -> list[AllocateStrategy]:
    return [
        get_strategy("AVG"),
        get_strategy("AVG_BY_CIRCLE"),
        get_strategy("MACHINE_ROOM", consumer_idcs={"room1", "IDC1"}),
        get_strategy("MACHINE_ROOM_NEARBY", inner="AVG", resolver=ByBrokerPrefix()),
        get_strategy("MACHINE_ROOM_NEARBY", inner="CONSISTENT_HASH", resolver=ByBrokerPrefix()),
        get_strategy("CONSISTENT_HASH", virtual_node_count=3),
        get_strategy("CONSISTENT_HASH_BOUNDED"),
    ]


@settings(max_examples=80, deadline=None)
@given(mq_all=queue_lists, cid_all=client_lists)
def test_every_strategy_assigns_a_queue_to_at_most_one_consumer(mq_all: list[MessageQueue], cid_all: list[str]) -> None:
    for strategy in all_non_config_strategies():
        result = allocate_all(strategy, GROUP, mq_all, cid_all)
        owner_map(result)  # asserts no queue has two owners
        flat = [mq for queues in result.values() for mq in queues]
        assert set(flat) <= set(mq_all)
        if strategy.name in ("AVG", "AVG_BY_CIRCLE", "CONSISTENT_HASH_BOUNDED", "MACHINE_ROOM_NEARBY-AVG"):
            assert_full_exact_cover(result, mq_all)


@settings(max_examples=40, deadline=None)
@given(mq_all=queue_lists, cid_all=client_lists)
def test_avg_matches_the_rocketmq_formula(mq_all: list[MessageQueue], cid_all: list[str]) -> None:
    mq_sorted, cid_sorted = sorted_inputs(mq_all, cid_all)
    n, c = len(mq_sorted), len(cid_sorted)
    offset = 0
    for i, cid in enumerate(cid_sorted):
        expected_size = max(0, min(n - offset, n // c + (1 if i < n % c else 0)))
        got = AllocateMessageQueueAveragely().allocate(GROUP, cid, mq_sorted, cid_sorted)
        assert got == mq_sorted[offset : offset + expected_size]
        offset += expected_size


# ---------------------------------------------------------------------------------------------------
# Simulation helpers


def test_sorted_inputs_use_java_order() -> None:
    queues, clients = sorted_inputs([MessageQueue("t", "b", 10), MessageQueue("t", "b", 2)], ["b", "B", "a"])
    assert ids(queues) == [2, 10]
    assert clients == ["B", "a", "b"]


def test_count_moved() -> None:
    q = mqs(4)
    assert count_moved({"a": q[:2], "b": q[2:]}, {"a": q[:2], "b": q[2:]}) == 0
    assert count_moved({"a": q[:2], "b": q[2:]}, {"a": q[:1], "b": q[1:]}) == 1
    assert count_moved({"a": q[:2]}, {"a": q[:2], "b": q[2:]}) == 2  # unassigned -> assigned
    assert count_moved({"a": q}, {"a": q[:3]}) == 1  # assigned -> unassigned
    assert count_moved({"a": q, "b": q}, {"a": q}) == 4  # owner sets changed (CONFIG-style sharing)


def test_allocate_all_sorts_inputs() -> None:
    result = allocate_all(get_strategy("AVG"), GROUP, list(reversed(mqs(4))), ["z", "a"])
    assert list(result) == ["a", "z"]
    assert ids(result["a"]) == [0, 1]


def test_simulate_join_and_leave() -> None:
    report = simulate("AVG", queues=8, consumers=4, join=1, leave=1)
    assert report["strategy"] == "AVG"
    assert report["consumers_before"] == ["CID-0000", "CID-0001", "CID-0002", "CID-0003"]
    assert report["consumers_after"] == ["CID-0001", "CID-0002", "CID-0003", "CID-0004"]
    assert report["moved"] == 8  # every block shifts by one owner
    assert report["unassigned_before"] == report["unassigned_after"] == 0
    assert report["max_load_before"] == 2

    bounded = simulate("CONSISTENT_HASH_BOUNDED", queues=16, consumers=4, join=1, brokers=("broker-a", "broker-b"))
    assert len(bounded["queues"]) == 32
    assert bounded["max_load_after"] <= get_strategy("CONSISTENT_HASH_BOUNDED").max_load(32, 5)  # type: ignore[attr-defined]

    zero = simulate("CONSISTENT_HASH", 4, 2, virtual_node_count=0)
    assert zero["unassigned_before"] == 4


def test_simulate_rejects_bad_numbers() -> None:
    with pytest.raises(ValueError, match="queues must be an integer >= 1"):
        simulate("AVG", 0, 2)
    with pytest.raises(ValueError, match="leave"):
        simulate("AVG", 4, 2, leave=2)
    with pytest.raises(ValueError, match="unknown allocation strategy"):
        simulate("BOGUS", 4, 2)


def test_bounded_custom_hash_functions() -> None:
    class Unhashable:
        __hash__ = None  # type: ignore[assignment]

        def __call__(self, key: str) -> int:
            return md5_hash(key)

    plain = allocate_all(AllocateMessageQueueConsistentHashBounded(), GROUP, mqs(9), cids(3))
    custom = allocate_all(AllocateMessageQueueConsistentHashBounded(hash_function=Unhashable()), GROUP, mqs(9), cids(3))
    assert custom == plain
    bad = AllocateMessageQueueConsistentHashBounded(hash_function=lambda key: 1.5)  # type: ignore[arg-type,return-value]
    with pytest.raises(TypeError, match="hash_function must return an int"):
        bad.allocate(GROUP, "CID-0", mqs(2), cids(2))
