"""An online offset reset must not be undone by an offset commit already on the wire (issue 19 item 2).

The race: a member commits its progress oneway (UPDATE_CONSUMER_OFFSET, as RocketMQ's clients do when they
give a queue away) just before an admin resets the group's offsets; the commit reaches the broker after the
reset and writes the old position back over it. A pull's commit offset sent before the reset does the same.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

from trimq.protocol.codes import RequestCode, ResponseCode
from trimq.protocol.message import encode_properties
from trimq.runtime.client import RemotingClient

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


@pytest.mark.xfail(strict=True, reason="issue 19: no reset generation yet, the late commit undoes the reset")
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


def _request(code: int, ext: dict[str, Any]) -> Any:
    from trimq.protocol.command import RemotingCommand

    return RemotingCommand.request(code, ext)
