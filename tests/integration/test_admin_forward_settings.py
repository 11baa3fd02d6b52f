"""The timeouts of the requests the broker forwards to a group's members for trimq-admin are broker settings
(admin_running_info_timeout_ms, admin_skip_message_timeout_ms, admin_reset_offset_timeout_ms; they were
constants of 5, 15 and 10 s). A real broker; a member that takes GET_CONSUMER_RUNNING_INFO and never answers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import trio

from trimq.protocol import RemotingCommand, RequestCode, ResponseCode
from trimq.runtime.client import RemotingClient


def heartbeat(client_id: str, group: str) -> dict[str, Any]:
    return {"clientID": client_id, "language": "PYTHON", "version": "0.1.0", "producerDataSet": [],
            "consumerDataSet": [{"groupName": group, "consumeType": "CONSUME_PASSIVELY",
                                 "messageModel": "CLUSTERING", "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
                                 "consumeOrderly": False, "subscriptionDataSet": []}]}


async def test_a_silent_member_is_given_up_after_the_configured_timeout(broker_factory: Callable[..., Any]) -> None:
    async with broker_factory(admin_running_info_timeout_ms=200, admin_skip_message_timeout_ms=300,
                              admin_reset_offset_timeout_ms=400) as broker:
        service = broker.admin_forward_service
        assert (service.running_info_timeout_s, service.skip_timeout_s, service.reset_timeout_s) == (0.2, 0.3, 0.4)
        asked = trio.Event()

        async def never_answers(cmd: RemotingCommand, addr: str) -> RemotingCommand | None:
            asked.set()
            await trio.sleep_forever()
            return None

        async with RemotingClient(default_timeout_s=10) as member, RemotingClient(default_timeout_s=10) as admin:
            member.register_handler(RequestCode.GET_CONSUMER_RUNNING_INFO, never_answers)
            resp = await member.invoke(broker.address, RemotingCommand.request(
                RequestCode.HEART_BEAT, {}, heartbeat("silent@1", "g1")), timeout_s=10)
            assert resp.code == ResponseCode.SUCCESS, resp.remark
            with trio.fail_after(10):
                resp = await admin.invoke(broker.address, RemotingCommand.request(
                    RequestCode.GET_CONSUMER_RUNNING_INFO, {"consumerGroup": "g1", "clientId": "silent@1"}),
                    timeout_s=10)
            assert asked.is_set()
            assert resp.code == ResponseCode.SYSTEM_ERROR
            assert "within 0.2 s" in (resp.remark or ""), resp.remark
