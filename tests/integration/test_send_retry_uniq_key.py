"""A send retried after a failed attempt keeps its unique key (RocketMQ sets UNIQ_KEY once per send, before
sendKernelImpl): when an attempt's answer is lost after the broker stored the message, the retry's copy must
carry the same id so that the duplicate can be told for what it is."""

from __future__ import annotations

from typing import Any

from trimq.client import Message, Producer
from trimq.client.admin import open_admin
from trimq.protocol.message import MessageConst
from trimq.runtime.client import RemotingTimeoutError
from trimq.testing import open_broker


class AnswerLostOnFirstAttempt(Producer):
    """A real producer whose first attempt reaches the broker but whose answer is 'lost' (a timeout after the
    broker stored the message), as a network cut between store and answer would do."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.attempt_ids: list[str] = []

    async def _send_kernel(self, client: Any, msg: Message, mq: Any, timeout: int, uniq: str) -> Any:
        self.attempt_ids.append(uniq)
        result = await super()._send_kernel(client, msg, mq, timeout, uniq)
        if len(self.attempt_ids) == 1:
            raise RemotingTimeoutError("answer lost (injected after the broker stored the message)")
        return result


async def test_a_retried_send_keeps_its_unique_key() -> None:
    async with open_broker() as cluster:
        await cluster.create_topic("UniqRetry", queues=2)
        async with AnswerLostOnFirstAttempt(cluster.producer_config()) as producer:
            result = await producer.send(Message("UniqRetry", b"once"))
        assert len(producer.attempt_ids) == 2
        assert producer.attempt_ids[0] == producer.attempt_ids[1] == result.msg_id
        async with open_admin(cluster.namesrv_addr) as admin:
            found = await admin.message_query(result.msg_id, "UniqRetry", unique_key=True)
        stored = [m.message.properties.get(MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX) for m in found.messages]
        assert stored == [result.msg_id, result.msg_id]  # both copies, one id
