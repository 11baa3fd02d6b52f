"""An online offset reset must not be undone by an offset commit already on the wire (issue 19 item 2).

The race: a member commits its progress oneway (UPDATE_CONSUMER_OFFSET, as RocketMQ's clients do when they
give a queue away) just before an admin resets the group's offsets; the commit reaches the broker after the
reset and writes the old position back over it. A pull's commit offset sent before the reset does the same.
The fix: a reset generation per group and topic (broker/store/offsets.py), carried by commits and refused
when older; then its wire details, persistence, the dry run, and real consumers — one told of the reset, one
whose notification failed and that resyncs when its first commit is refused.
"""

from __future__ import annotations

from typing import Any

import trio

from trimq.client import ConsumeConcurrentlyStatus, PushConsumer
from trimq.client.admin import PartialFailure
from trimq.protocol.codes import RequestCode, ResponseCode
from trimq.protocol.command import RemotingCommand
from trimq.protocol.message import encode_properties
from trimq.runtime.client import RemotingClient
from trimq.testing import open_broker

T = "RgTopic"
G = "rg_group"


async def _setup(rc: RemotingClient, call: Any, addr: str, messages: int = 10) -> None:
    r = await call(rc, addr, RequestCode.UPDATE_AND_CREATE_TOPIC,
                   {"topic": T, "readQueueNums": 1, "writeQueueNums": 1, "perm": 6})
    assert r.code == ResponseCode.SUCCESS
    for i in range(messages):
        r = await call(rc, addr, RequestCode.SEND_MESSAGE, {"producerGroup": "p", "topic": T, "queueId": 0,
                                                            "sysFlag": 0, "bornTimestamp": 0, "flag": 0,
                                                            "properties": encode_properties({})}, b"m%d" % i)
        assert r.code == ResponseCode.SUCCESS


async def _offset(rc: RemotingClient, call: Any, addr: str) -> int:
    r = await call(rc, addr, RequestCode.QUERY_CONSUMER_OFFSET, {"consumerGroup": G, "topic": T, "queueId": 0})
    assert r.code == ResponseCode.SUCCESS, r.remark
    return int(r.ext["offset"])


async def test_a_commit_sent_before_a_reset_does_not_undo_it(broker_factory: Any, call: Any) -> None:
    async with broker_factory() as broker, RemotingClient() as rc:
        a = broker.address
        await _setup(rc, call, a)
        commit = {"consumerGroup": G, "topic": T, "queueId": 0, "commitOffset": 8, "clientId": "member-1"}
        assert (await call(rc, a, RequestCode.UPDATE_CONSUMER_OFFSET, commit)).code == ResponseCode.SUCCESS
        # What the member knew when it made its next commit (none reset yet: generation 0)
        r = await call(rc, a, RequestCode.QUERY_CONSUMER_OFFSET, {"consumerGroup": G, "topic": T, "queueId": 0})
        known = int(r.ext.get("resetGeneration", 0))
        # The admin resets the group to the start, the group being offline (no member to tell) ...
        r = await call(rc, a, RequestCode.INVOKE_BROKER_TO_RESET_OFFSET,
                       {"topic": T, "group": G, "timestamp": 0, "isForce": True})
        assert r.code == ResponseCode.SUCCESS and await _offset(rc, call, a) == 0
        # ... and only now does the member's oneway commit of offset 9, sent before the reset, arrive.
        late = {**commit, "commitOffset": 9, "resetGeneration": known}
        await rc.invoke_oneway(a, _request(RequestCode.UPDATE_CONSUMER_OFFSET, late))
        # A pull sent before the reset carries the member's progress as its commit offset too.
        pull = {"consumerGroup": G, "topic": T, "queueId": 0, "queueOffset": 9, "maxMsgNums": 1, "sysFlag": 1,
                "commitOffset": 9, "resetGeneration": known}
        assert (await call(rc, a, RequestCode.PULL_MESSAGE, pull)).code == ResponseCode.SUCCESS
        with trio.move_on_after(0.2):
            while await _offset(rc, call, a) == 0:
                await trio.sleep(0.01)
        assert await _offset(rc, call, a) == 0  # the reset stands


def _request(code: int, ext: dict[str, Any]) -> RemotingCommand:
    return RemotingCommand.request(code, ext)


async def test_generation_on_the_wire_persisted_and_per_topic(broker_factory: Any, call: Any, tmp_path: Any) -> None:
    store = str(tmp_path / "rg")
    async with broker_factory(store_dir=store) as broker, RemotingClient() as rc:
        a = broker.address
        await _setup(rc, call, a)
        q = {"consumerGroup": G, "topic": T, "queueId": 0}
        r = await call(rc, a, RequestCode.QUERY_CONSUMER_OFFSET, q)
        assert (r.code, r.ext["resetGeneration"]) == (ResponseCode.QUERY_NOT_FOUND, 0)
        commit = {**q, "commitOffset": 7, "resetGeneration": 0}
        assert (await call(rc, a, RequestCode.UPDATE_CONSUMER_OFFSET, commit)).code == ResponseCode.SUCCESS
        # The plan only: nothing written, no new generation.
        reset = {"topic": T, "group": G, "timestamp": 0, "isForce": True}
        plan = await call(rc, a, RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, {**reset, "dryRun": True})
        assert plan.body["dryRun"] is True and plan.body["resetGeneration"] == 0
        assert [(e["previousOffset"], e["offset"]) for e in plan.body["offsetTable"]] == [(7, 0)]
        assert await _offset(rc, call, a) == 7
        done = await call(rc, a, RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, reset)
        assert done.body["resetGeneration"] == 1 and await _offset(rc, call, a) == 0
        r = await call(rc, a, RequestCode.UPDATE_CONSUMER_OFFSET, commit)  # made under generation 0
        assert r.code == ResponseCode.NO_PERMISSION and r.ext == {"resetGeneration": 1}
        assert "were reset" in (r.remark or "")
        r = await call(rc, a, RequestCode.QUERY_CONSUMER_OFFSET, q)
        assert (r.ext["offset"], r.ext["resetGeneration"]) == (0, 1)
        assert (await call(rc, a, RequestCode.UPDATE_CONSUMER_OFFSET, {**commit, "commitOffset": 3,
                                                                      "resetGeneration": 1})).code == 0
        # Another topic of the group was not reset: its commits under generation 0 stand.
        other = {"consumerGroup": G, "topic": "RgOther", "queueId": 0, "commitOffset": 1, "resetGeneration": 0}
        assert (await call(rc, a, RequestCode.UPDATE_CONSUMER_OFFSET, other)).code == ResponseCode.SUCCESS
        # RocketMQ's clients send no generation: judged as before.
        no_gen = {**q, "commitOffset": 4}
        assert (await call(rc, a, RequestCode.UPDATE_CONSUMER_OFFSET, no_gen)).code == ResponseCode.SUCCESS
        assert broker.offset_manager.stale_generation_updates[G] == 1
    async with broker_factory(store_dir=store) as broker, RemotingClient() as rc:
        a = broker.address
        r = await call(rc, a, RequestCode.UPDATE_CONSUMER_OFFSET, commit)
        assert r.code == ResponseCode.NO_PERMISSION  # the generation survived the restart
        assert await _offset(rc, call, a) == 4


async def _consume(cluster: Any, seen: list[bytes]) -> PushConsumer:
    async def listener(msgs: list[Any], context: Any) -> ConsumeConcurrentlyStatus:
        seen.extend(m.body for m in msgs)
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    consumer = PushConsumer(cluster.consumer_config(G, persist_consumer_offset_interval=50))
    consumer.subscribe(T, "*")
    consumer.register_message_listener_concurrently(listener)
    return consumer


async def _wait(pred: Any, timeout: float = 10) -> None:
    with trio.fail_after(timeout):
        while not pred():
            await trio.sleep(0.01)


async def test_members_told_and_not_told_of_a_reset() -> None:
    async with open_broker() as cluster, RemotingClient() as rc:
        a = cluster.namesrv_addr
        await cluster.create_topic(T, queues=1)
        for i in range(5):
            r = await rc.invoke(a, RemotingCommand.request(RequestCode.SEND_MESSAGE, {
                "producerGroup": "p", "topic": T, "queueId": 0, "sysFlag": 0, "bornTimestamp": 0, "flag": 0,
                "properties": ""}, b"m%d" % i))
            assert r.code == ResponseCode.SUCCESS
        offsets = cluster.brokers["broker-a"].offset_manager
        seen: list[bytes] = []
        consumer = await _consume(cluster, seen)
        async with consumer:
            await _wait(lambda: offsets.query_offset(G, T, 0) == 5)
            # Told: the member restarts the queue from the reset offset and commits under the new generation.
            result = await cluster.admin.reset_offset(G, T, 0)
            assert [c.ok for c in result.clients] == [True]
            await _wait(lambda: len(seen) == 10 and offsets.query_offset(G, T, 0) == 5)
            assert offsets.reset_generation(G, T) == 1 and offsets.stale_generation_updates[G] == 0

            # Not told (its answer failed): its next commit, made under generation 1, is refused; it resyncs.
            async def fail(cmd: RemotingCommand, addr: str) -> RemotingCommand:
                return RemotingCommand.response_to(cmd, ResponseCode.SYSTEM_ERROR, "simulated: not applied")

            assert consumer.instance is not None
            consumer.instance.remoting.register_handler(RequestCode.RESET_CONSUMER_CLIENT_OFFSET, fail)
            try:
                await cluster.admin.reset_offset(G, T, 0)
            except PartialFailure as exc:
                assert "did not confirm" in str(exc)
            else:
                raise AssertionError("the member did not fail to confirm")
            assert offsets.query_offset(G, T, 0) == 0
            await _wait(lambda: len(seen) == 15)  # every message a third time, from the reset offset
            await _wait(lambda: offsets.query_offset(G, T, 0) == 5)
            assert offsets.stale_generation_updates[G] >= 1
            assert sorted(seen) == sorted([b"m%d" % i for i in range(5)] * 3)
