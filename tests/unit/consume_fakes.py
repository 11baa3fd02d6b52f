"""Fakes of the network side of the consume services (send-back API, client instance), shared by the unit
tests of the orderly and the concurrent service."""

from __future__ import annotations

from typing import Any

from trimq.client.api import SendResult, SendStatus
from trimq.client.instance import TopicPublishInfo
from trimq.protocol.message_queue import MessageQueue


class FakeApi:
    def __init__(self) -> None:
        self.send_backs: list[dict[str, Any]] = []
        self.sends: list[dict[str, Any]] = []
        self.send_back_error: Exception | None = None
        self.send_error: Exception | None = None

    async def consumer_send_msg_back(self, addr: str, **kw: Any) -> None:
        self.send_backs.append({"addr": addr, **kw})
        if self.send_back_error is not None:
            raise self.send_back_error

    async def send_message(self, addr: str, broker_name: str, **kw: Any) -> SendResult:
        self.sends.append({"addr": addr, **kw})
        if self.send_error is not None:
            raise self.send_error
        return SendResult(SendStatus.SEND_OK, "id", MessageQueue(kw["topic"], broker_name, kw["queue_id"]), 0)


class FakeClient:
    def __init__(self) -> None:
        self.api = FakeApi()

    async def find_broker_addr(self, broker_name: str, topic: str | None = None) -> str | None:
        return "10.0.0.1:10911"

    async def get_publish_info(self, topic: str, **kw: Any) -> TopicPublishInfo | None:
        return TopicPublishInfo([MessageQueue(topic, "broker-a", 0)])


class FakeOffsets:
    def __init__(self) -> None:
        self.updates: list[tuple[MessageQueue, int, bool]] = []

    def update_offset(self, mq: MessageQueue, offset: int, increase_only: bool) -> None:
        self.updates.append((mq, offset, increase_only))
