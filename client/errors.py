"""Errors the client SDK raises.

Two families, as in RocketMQ: :class:`MQClientError` for problems found on this side (bad input, no route,
every retry failed) and :class:`MQBrokerError` for a broker or name server that answered with an error
code. Both derive from :class:`TrimqClientError`. Transport failures (connect, timeout) are the
``trimq.runtime.client`` errors (:class:`RemotingError` and its subclasses), re-exported here.

Every error says what failed in words; broker errors also carry the response ``code``, its ``remark`` and
the ``addr`` that answered.
"""

from __future__ import annotations

from trimq.protocol.codes import ResponseCode, code_name
from trimq.runtime.client import RemotingClosedError, RemotingConnectError, RemotingError, RemotingTimeoutError

__all__ = [
    "BrokerNotAvailableError",
    "BrokerNotFoundError",
    "ClientClosedError",
    "ClientIdConflictError",
    "EmptyBodyError",
    "ForbiddenTopicError",
    "InvalidMessageError",
    "InvalidTopicError",
    "MQBrokerError",
    "MQClientError",
    "MessageTooLargeError",
    "NoNameServerError",
    "NoPermissionError",
    "NoRouteError",
    "OffsetNotFoundError",
    "OffsetUnavailableError",
    "RemotingClosedError",
    "RemotingConnectError",
    "RemotingError",
    "RemotingTimeoutError",
    "SelectorError",
    "SendFailedError",
    "SubscriptionGroupNotExistError",
    "TopicNotExistError",
    "TrimqClientError",
    "broker_error",
]


class TrimqClientError(Exception):
    """Base class of the SDK's own errors (transport errors are :class:`RemotingError`)."""


class MQClientError(TrimqClientError):
    """A problem found on the client side: invalid input, missing route, exhausted retries..."""


class MQBrokerError(TrimqClientError):
    """A broker or name server answered a request with an error response code."""

    def __init__(self, code: int, remark: str | None, addr: str | None = None, request: str | None = None) -> None:
        self.code = int(code)
        self.remark = remark or ""
        self.addr = addr
        self.request = request
        where = f" from {addr}" if addr else ""
        what = f"{request} failed{where}: " if request else f"broker error{where}: "
        super().__init__(f"{what}{code_name(self.code, response=True)} ({self.code}) {self.remark}".rstrip())


class TopicNotExistError(MQBrokerError):
    """TOPIC_NOT_EXIST: the name server or broker does not know the topic."""


class OffsetNotFoundError(MQBrokerError):
    """QUERY_NOT_FOUND: the broker stores no consumer offset for that group and queue."""


class NoPermissionError(MQBrokerError):
    """NO_PERMISSION: e.g. a fenced offset update (another client holds the queue's lock) or a read-only broker."""


class StaleResetGenerationError(NoPermissionError):
    """NO_PERMISSION for an offset commit made before a reset of the group's offsets it did not see (issue 19):
    ``reset_generation`` is the broker's current one. The committer must read the queue's offset again."""

    def __init__(self, code: int, remark: str | None, addr: str | None = None, request: str | None = None, *,
                 reset_generation: int = 0) -> None:
        super().__init__(code, remark, addr, request)
        self.reset_generation = reset_generation


class SubscriptionGroupNotExistError(MQBrokerError):
    """SUBSCRIPTION_GROUP_NOT_EXIST."""


_BY_CODE: dict[int, type[MQBrokerError]] = {
    ResponseCode.TOPIC_NOT_EXIST: TopicNotExistError,
    ResponseCode.QUERY_NOT_FOUND: OffsetNotFoundError,
    ResponseCode.NO_PERMISSION: NoPermissionError,
    ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST: SubscriptionGroupNotExistError,
}


def broker_error(code: int, remark: str | None, addr: str | None = None, request: str | None = None) -> MQBrokerError:
    """The most specific :class:`MQBrokerError` subclass for ``code``."""
    return _BY_CODE.get(int(code), MQBrokerError)(code, remark, addr, request)


class NoNameServerError(MQClientError):
    """No name server address is configured."""


class NoRouteError(MQClientError):
    """No route for a topic could be found (the topic does not exist and cannot be auto-created)."""

    def __init__(self, topic: str, detail: str = "") -> None:
        self.topic = topic
        super().__init__(f"no route info of topic {topic!r}{': ' + detail if detail else ''}")


class BrokerNotFoundError(MQClientError):
    """No address is known for a broker name (the route does not list its master)."""

    def __init__(self, broker_name: str) -> None:
        self.broker_name = broker_name
        super().__init__(f"broker {broker_name!r} is not in any known route (no master address)")


class BrokerNotAvailableError(BrokerNotFoundError):
    """The route lists the broker, but its master is down (only a slave is listed, or the master could not be reached
    a moment ago): a send to one of its queues fails fast (issue 15). An ordered send is not moved to another
    broker, which would break the order of its key: retry when the master is back or a slave was promoted."""

    def __init__(self, broker_name: str, why: str) -> None:
        self.why = why
        MQClientError.__init__(self, f"broker {broker_name!r} is not available for sends: {why}")
        self.broker_name = broker_name


class InvalidMessageError(MQClientError, ValueError):
    """A message failed validation before sending (RocketMQ's Validators.checkMessage)."""


class InvalidTopicError(InvalidMessageError):
    """The topic name breaks the naming rules."""


class EmptyBodyError(InvalidMessageError):
    """The message body is missing or empty."""


class MessageTooLargeError(InvalidMessageError):
    """The message body is larger than ``max_message_size``."""

    def __init__(self, size: int, limit: int) -> None:
        self.size = size
        self.limit = limit
        super().__init__(f"the message body is {size} bytes; the maximum is {limit} (max_message_size)")


class ForbiddenTopicError(InvalidMessageError):
    """Sending to a system topic (e.g. SCHEDULE_TOPIC_XXXX) is not allowed."""


class SelectorError(MQClientError):
    """A message queue selector failed, returned nothing, or returned a queue not in the list."""


class SendFailedError(MQClientError):
    """Every attempt of a send failed; ``attempts`` lists (queue, error) per try, ``__cause__`` is the last."""

    def __init__(self, message: str, attempts: list[tuple[object, BaseException]]) -> None:
        self.attempts = attempts
        super().__init__(message)


class OffsetUnavailableError(MQClientError):
    """The start offset of a queue could not be determined (broker unreachable or answered an error)."""


class ClientClosedError(MQClientError):
    """The client instance, producer or consumer is not running."""


class ClientIdConflictError(MQClientError):
    """Two client instances in one process would have the same client id."""
