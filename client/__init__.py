"""The trimq client SDK: producers and push consumers with RocketMQ 4.9.3's semantics, native on trio and asyncio.

::

    from trimq.client import PushConsumer, PushConsumerConfig, ConsumeOrderlyStatus

    consumer = PushConsumer(PushConsumerConfig(consumer_group="g", namesrv_addr="127.0.0.1:9876"))
    consumer.subscribe("Orders", "*")
    consumer.register_message_listener_orderly(lambda msgs, ctx: ConsumeOrderlyStatus.SUCCESS)
    async with consumer:
        ...

The same classes work with ``async with`` inside a running asyncio loop (client.aio: a trio guest run on that
loop; ``async def`` listeners are then asyncio code). Programs without an event loop (threads, scripts) embed the
SDK through ``client.runner.TrioRunner`` (also importable from here). docs/EMBEDDING.md has the whole picture.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trimq.client.api import SendResult, SendStatus
    from trimq.client.config import ClientConfig, ConfigError, ProducerConfig, PushConsumerConfig
    from trimq.client.consume.common import (
        CMResult,
        ConsumeConcurrentlyContext,
        ConsumeConcurrentlyStatus,
        ConsumeFromWhere,
        ConsumeMessageDirectlyResult,
        ConsumeOrderlyContext,
        ConsumeOrderlyStatus,
        ConsumeReturnType,
        MessageModel,
    )
    from trimq.client.errors import (
        BrokerNotFoundError,
        ClientClosedError,
        ClientIdConflictError,
        EmptyBodyError,
        ForbiddenTopicError,
        InvalidMessageError,
        InvalidTopicError,
        MessageTooLargeError,
        MQBrokerError,
        MQClientError,
        NoNameServerError,
        NoPermissionError,
        NoRouteError,
        OffsetNotFoundError,
        OffsetUnavailableError,
        RemotingClosedError,
        RemotingConnectError,
        RemotingError,
        RemotingTimeoutError,
        SelectorError,
        SendFailedError,
        SubscriptionGroupNotExistError,
        TopicNotExistError,
        TrimqClientError,
    )
    from trimq.client.instance import ClientInstance
    from trimq.client.metrics import ConsumerMetrics
    from trimq.client.producer import Producer
    from trimq.client.push_consumer import PushConsumer
    from trimq.client.runner import RunnerClosedError, TrioRunner
    from trimq.client.selectors import (
        MessageQueueSelector,
        SelectMessageQueueByHash,
        select_by_hash,
        select_by_java_hash,
        select_random,
    )
    from trimq.client.stream import MessageStream, ReceivedMessage
    from trimq.protocol.message import Message, MessageConst, MessageExt
    from trimq.protocol.message_queue import MessageQueue

# Names are imported on first use, so that importing a pure core (client.process_queue,
# client.rebalance.strategies, ...) does not pull in trio and the whole SDK.
_EXPORTS: dict[str, str] = {
    "BrokerNotFoundError": "trimq.client.errors",
    "CMResult": "trimq.client.consume.common",
    "ClientClosedError": "trimq.client.errors",
    "ClientConfig": "trimq.client.config",
    "ClientIdConflictError": "trimq.client.errors",
    "ClientInstance": "trimq.client.instance",
    "ConfigError": "trimq.client.config",
    "ConsumeConcurrentlyContext": "trimq.client.consume.common",
    "ConsumeConcurrentlyStatus": "trimq.client.consume.common",
    "ConsumeFromWhere": "trimq.client.consume.common",
    "ConsumeMessageDirectlyResult": "trimq.client.consume.common",
    "ConsumeOrderlyContext": "trimq.client.consume.common",
    "ConsumeOrderlyStatus": "trimq.client.consume.common",
    "ConsumeReturnType": "trimq.client.consume.common",
    "ConsumerMetrics": "trimq.client.metrics",
    "EmptyBodyError": "trimq.client.errors",
    "ForbiddenTopicError": "trimq.client.errors",
    "InvalidMessageError": "trimq.client.errors",
    "InvalidTopicError": "trimq.client.errors",
    "MQBrokerError": "trimq.client.errors",
    "MQClientError": "trimq.client.errors",
    "Message": "trimq.protocol.message",
    "MessageConst": "trimq.protocol.message",
    "MessageExt": "trimq.protocol.message",
    "MessageModel": "trimq.client.consume.common",
    "MessageQueue": "trimq.protocol.message_queue",
    "MessageQueueSelector": "trimq.client.selectors",
    "MessageStream": "trimq.client.stream",
    "MessageTooLargeError": "trimq.client.errors",
    "NoNameServerError": "trimq.client.errors",
    "NoPermissionError": "trimq.client.errors",
    "NoRouteError": "trimq.client.errors",
    "OffsetNotFoundError": "trimq.client.errors",
    "OffsetUnavailableError": "trimq.client.errors",
    "Producer": "trimq.client.producer",
    "ProducerConfig": "trimq.client.config",
    "PushConsumer": "trimq.client.push_consumer",
    "PushConsumerConfig": "trimq.client.config",
    "ReceivedMessage": "trimq.client.stream",
    "RemotingClosedError": "trimq.client.errors",
    "RemotingConnectError": "trimq.client.errors",
    "RemotingError": "trimq.client.errors",
    "RemotingTimeoutError": "trimq.client.errors",
    "RunnerClosedError": "trimq.client.runner",
    "SelectMessageQueueByHash": "trimq.client.selectors",
    "SelectorError": "trimq.client.errors",
    "SendFailedError": "trimq.client.errors",
    "SendResult": "trimq.client.api",
    "SendStatus": "trimq.client.api",
    "SubscriptionGroupNotExistError": "trimq.client.errors",
    "TopicNotExistError": "trimq.client.errors",
    "TrimqClientError": "trimq.client.errors",
    "TrioRunner": "trimq.client.runner",
    "select_by_hash": "trimq.client.selectors",
    "select_by_java_hash": "trimq.client.selectors",
    "select_random": "trimq.client.selectors",
}

__all__ = [
    "BrokerNotFoundError",
    "CMResult",
    "ClientClosedError",
    "ClientConfig",
    "ClientIdConflictError",
    "ClientInstance",
    "ConfigError",
    "ConsumeConcurrentlyContext",
    "ConsumeConcurrentlyStatus",
    "ConsumeFromWhere",
    "ConsumeMessageDirectlyResult",
    "ConsumeOrderlyContext",
    "ConsumeOrderlyStatus",
    "ConsumeReturnType",
    "ConsumerMetrics",
    "EmptyBodyError",
    "ForbiddenTopicError",
    "InvalidMessageError",
    "InvalidTopicError",
    "MQBrokerError",
    "MQClientError",
    "Message",
    "MessageConst",
    "MessageExt",
    "MessageModel",
    "MessageQueue",
    "MessageQueueSelector",
    "MessageStream",
    "MessageTooLargeError",
    "NoNameServerError",
    "NoPermissionError",
    "NoRouteError",
    "OffsetNotFoundError",
    "OffsetUnavailableError",
    "Producer",
    "ProducerConfig",
    "PushConsumer",
    "PushConsumerConfig",
    "ReceivedMessage",
    "RemotingClosedError",
    "RemotingConnectError",
    "RemotingError",
    "RemotingTimeoutError",
    "RunnerClosedError",
    "SelectMessageQueueByHash",
    "SelectorError",
    "SendFailedError",
    "SendResult",
    "SendStatus",
    "SubscriptionGroupNotExistError",
    "TopicNotExistError",
    "TrimqClientError",
    "TrioRunner",
    "select_by_hash",
    "select_by_java_hash",
    "select_random",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'client' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
