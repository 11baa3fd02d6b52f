"""The trimq client SDK: producers and push consumers with RocketMQ 4.9.3's semantics, on trio.

::

    from client import PushConsumer, PushConsumerConfig, ConsumeOrderlyStatus

    consumer = PushConsumer(PushConsumerConfig(consumer_group="g", namesrv_addr="127.0.0.1:9876"))
    consumer.subscribe("Orders", "*")
    consumer.register_message_listener_orderly(lambda msgs, ctx: ConsumeOrderlyStatus.SUCCESS)
    async with consumer:
        ...

Programs that do not run trio embed the SDK through ``client.runner.TrioRunner`` (also importable from here).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from client.api import SendResult, SendStatus
    from client.config import ClientConfig, ConfigError, ProducerConfig, PushConsumerConfig
    from client.consume.common import (
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
    from client.errors import (
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
    from client.instance import ClientInstance
    from client.metrics import ConsumerMetrics
    from client.producer import Producer
    from client.push_consumer import PushConsumer
    from client.runner import RunnerClosedError, TrioRunner
    from client.selectors import (
        MessageQueueSelector,
        SelectMessageQueueByHash,
        select_by_hash,
        select_by_java_hash,
        select_random,
    )
    from protocol.message import Message, MessageConst, MessageExt
    from protocol.message_queue import MessageQueue

# Names are imported on first use, so that importing a pure core (client.process_queue,
# client.rebalance.strategies, ...) does not pull in trio and the whole SDK.
_EXPORTS: dict[str, str] = {
    "BrokerNotFoundError": "client.errors",
    "CMResult": "client.consume.common",
    "ClientClosedError": "client.errors",
    "ClientConfig": "client.config",
    "ClientIdConflictError": "client.errors",
    "ClientInstance": "client.instance",
    "ConfigError": "client.config",
    "ConsumeConcurrentlyContext": "client.consume.common",
    "ConsumeConcurrentlyStatus": "client.consume.common",
    "ConsumeFromWhere": "client.consume.common",
    "ConsumeMessageDirectlyResult": "client.consume.common",
    "ConsumeOrderlyContext": "client.consume.common",
    "ConsumeOrderlyStatus": "client.consume.common",
    "ConsumeReturnType": "client.consume.common",
    "ConsumerMetrics": "client.metrics",
    "EmptyBodyError": "client.errors",
    "ForbiddenTopicError": "client.errors",
    "InvalidMessageError": "client.errors",
    "InvalidTopicError": "client.errors",
    "MQBrokerError": "client.errors",
    "MQClientError": "client.errors",
    "Message": "protocol.message",
    "MessageConst": "protocol.message",
    "MessageExt": "protocol.message",
    "MessageModel": "client.consume.common",
    "MessageQueue": "protocol.message_queue",
    "MessageQueueSelector": "client.selectors",
    "MessageTooLargeError": "client.errors",
    "NoNameServerError": "client.errors",
    "NoPermissionError": "client.errors",
    "NoRouteError": "client.errors",
    "OffsetNotFoundError": "client.errors",
    "OffsetUnavailableError": "client.errors",
    "Producer": "client.producer",
    "ProducerConfig": "client.config",
    "PushConsumer": "client.push_consumer",
    "PushConsumerConfig": "client.config",
    "RemotingClosedError": "client.errors",
    "RemotingConnectError": "client.errors",
    "RemotingError": "client.errors",
    "RemotingTimeoutError": "client.errors",
    "RunnerClosedError": "client.runner",
    "SelectMessageQueueByHash": "client.selectors",
    "SelectorError": "client.errors",
    "SendFailedError": "client.errors",
    "SendResult": "client.api",
    "SendStatus": "client.api",
    "SubscriptionGroupNotExistError": "client.errors",
    "TopicNotExistError": "client.errors",
    "TrimqClientError": "client.errors",
    "TrioRunner": "client.runner",
    "select_by_hash": "client.selectors",
    "select_by_java_hash": "client.selectors",
    "select_random": "client.selectors",
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
