"""``trimq-producer --orderly --sharding-key`` keeps each key on the queue its hash gave at the start: a send that
hashed again over the route of the moment moved a key to another broker's queue while its own broker was down (the
route had lost its queues), breaking per-key order (found by the chaos suite, seed 11)."""

from __future__ import annotations

from typing import Any

from trimq.client.api import SendResult, SendStatus
from trimq.client.selectors import select_by_java_hash
from trimq.protocol.message import MessageConst
from trimq.protocol.message_queue import MessageQueue
from trimq.tools.producer import LoadProducer, ProducerOptions

T = "Orders"
ALL = [MessageQueue(T, b, q) for b in ("broker-a", "broker-b") for q in range(4)]


class RouteLosingProducer:
    """A producer whose route loses broker-b after the first sends (as the name server's does when it dies)."""

    def __init__(self) -> None:
        self.sends: list[tuple[str, MessageQueue]] = []
        self.down = False

    async def message_queues(self, topic: str) -> list[MessageQueue]:
        return list(ALL)

    async def send(self, msg: Any, *, message_queue: MessageQueue | None = None,
                   sharding_key: str | None = None) -> SendResult:
        key = msg.properties[MessageConst.SHARDING_KEY]
        if message_queue is None:  # hashed over the route of the moment
            live = [mq for mq in ALL if not (self.down and mq.broker_name == "broker-b")]
            message_queue = select_by_java_hash(live, msg, key)
        self.sends.append((key, message_queue))
        self.down = len(self.sends) > 10
        return SendResult(SendStatus.SEND_OK, f"id{len(self.sends)}", message_queue, len(self.sends))


async def test_orderly_sharding_key_sends_stay_on_the_keys_queue() -> None:
    producer = RouteLosingProducer()
    summary = await LoadProducer(producer, ProducerOptions(topic=T, count=60, keys=6, orderly=True,
                                                           sharding_key=True)).run()
    assert summary.sent == 60
    for key, mq in producer.sends:
        assert mq == select_by_java_hash(ALL, None, key), (key, mq)
