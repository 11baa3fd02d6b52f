"""Range checks of numeric wire fields: each one against the range of the Java type RocketMQ gives it.

RocketMQ decodes every header into a ``*RequestHeader`` class whose numbers are Java ``int`` (queueId,
sysFlag, reconsumeTimes, delayLevel, ...) or ``long`` (offsets, timestamps); a value outside that range
never reaches its processors. msgpack carries integers up to 2^64-1, so without this check a trimq broker
would take, say, a consumer offset of 2^63 that RocketMQ (and the audit, and trimq's own record fields)
cannot represent. :data:`FIELD_TYPES` is derived from the fields docs/PROTOCOL.md §4 documents for each
code (their Java types from RocketMQ 4.9.3's header and body classes); :func:`check_field_ranges` checks a
request against it, once, before its handler runs (runtime/server.py). Pure: no I/O.

Handlers read their header fields with :func:`int_field` and :func:`str_field`, which refuse a missing or
mistyped field with a RequestError (SYSTEM_ERROR) naming it.

Only the range is checked here. A field of the wrong type (a list where a number belongs, a string that is
no number) is left to the handler, which refuses it with its own remark; a decimal string (RocketMQ's
headers are strings, and handlers accept them) is range-checked like the number it spells.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from trimq.protocol.codes import RequestCode as RC
from trimq.protocol.codes import ResponseCode
from trimq.protocol.errors import RequestError

__all__ = ["BODY_FIELD_TYPES", "FIELD_TYPES", "JAVA_INT", "JAVA_INT_MAX", "JAVA_LONG", "JAVA_LONG_MAX", "JAVA_RANGES",
           "check_field_ranges", "flag_field", "int_field", "str_field"]

JAVA_INT = "int"
JAVA_LONG = "long"
#: Java type -> (lowest, highest) value.
JAVA_RANGES: dict[str, tuple[int, int]] = {
    JAVA_INT: (-(2**31), 2**31 - 1),
    JAVA_LONG: (-(2**63), 2**63 - 1),
}
JAVA_INT_MAX = JAVA_RANGES[JAVA_INT][1]
JAVA_LONG_MAX = JAVA_RANGES[JAVA_LONG][1]
_BITS = {JAVA_INT: 32, JAVA_LONG: 64}

INT, LONG = JAVA_INT, JAVA_LONG  # short names for the tables below

_SEND = {"queueId": INT, "sysFlag": INT, "bornTimestamp": LONG, "flag": INT, "reconsumeTimes": INT,
         "maxReconsumeTimes": INT, "defaultTopicQueueNums": INT}
_QUEUE = {"queueId": INT}
_RESET = {"timestamp": LONG}
_BROKER = {"brokerId": LONG}

#: request code -> {ext field: Java type}: the numeric header fields of every code (docs/PROTOCOL.md §4;
#: RocketMQ's SendMessageRequestHeader, PullMessageRequestHeader, ... for the codes RocketMQ has).
FIELD_TYPES: dict[int, dict[str, str]] = {
    RC.SEND_MESSAGE: _SEND,
    RC.SEND_MESSAGE_V2: _SEND,
    RC.SEND_BATCH_MESSAGE: _SEND,
    RC.PULL_MESSAGE: {"queueId": INT, "queueOffset": LONG, "maxMsgNums": INT, "sysFlag": INT, "commitOffset": LONG,
                      "suspendTimeoutMillis": LONG, "subVersion": LONG, "resetGeneration": LONG, "masterEpoch": INT},
    RC.QUERY_MESSAGE: {"maxNum": INT, "beginTimestamp": LONG, "endTimestamp": LONG},
    RC.QUERY_CONSUMER_OFFSET: _QUEUE,
    RC.UPDATE_CONSUMER_OFFSET: {"queueId": INT, "commitOffset": LONG, "resetGeneration": LONG, "masterEpoch": INT},
    RC.UPDATE_AND_CREATE_TOPIC: {"readQueueNums": INT, "writeQueueNums": INT, "perm": INT, "topicSysFlag": INT},
    RC.SEARCH_OFFSET_BY_TIMESTAMP: {"queueId": INT, "timestamp": LONG},
    RC.GET_MAX_OFFSET: _QUEUE,
    RC.GET_MIN_OFFSET: _QUEUE,
    RC.GET_EARLIEST_MSG_STORETIME: _QUEUE,
    RC.VIEW_MESSAGE_BY_ID: {"offset": LONG},
    RC.CONSUMER_SEND_MSG_BACK: {"offset": LONG, "delayLevel": INT, "maxReconsumeTimes": INT, "reconsumeTimes": INT},
    RC.END_TRANSACTION: {"tranStateTableOffset": LONG, "commitLogOffset": LONG, "commitOrRollback": INT},
    RC.CHECK_TRANSACTION_STATE: {"tranStateTableOffset": LONG, "commitLogOffset": LONG},
    RC.REGISTER_BROKER: {**_BROKER, "bodyCrc32": INT, "masterEpoch": INT},
    RC.UNREGISTER_BROKER: _BROKER,
    RC.RESET_CONSUMER_CLIENT_OFFSET: {**_RESET, "resetGeneration": LONG},
    RC.INVOKE_BROKER_TO_RESET_OFFSET: _RESET,
    RC.QUERY_DLQ_MESSAGES: {"offset": LONG, "maxNums": INT},
    RC.SKIP_MESSAGE: {"queueId": INT, "queueOffset": LONG},
    RC.PROMOTE_BROKER: _BROKER,
}

#: request code -> [(path into the body, Java type)]: numbers inside structured bodies. A path step is a map
#: key, or "*" for every element of a list (or every value of a map).
BODY_FIELD_TYPES: dict[int, list[tuple[tuple[str, ...], str]]] = {
    RC.HEART_BEAT: [(("consumerDataSet", "*", "subscriptionDataSet", "*", "subVersion"), LONG),
                    (("consumerDataSet", "*", "subscriptionDataSet", "*", "codeSet", "*"), INT)],
    RC.LOCK_BATCH_MQ: [(("mqSet", "*", "queueId"), INT)],
    RC.UNLOCK_BATCH_MQ: [(("mqSet", "*", "queueId"), INT)],
    RC.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: [(("retryQueueNums",), INT), (("retryMaxTimes",), INT),
                                             (("brokerId",), LONG), (("whichBrokerWhenConsumeSlowly",), LONG)],
    RC.REGISTER_BROKER: [(("topicConfigTable", "*", name), INT)
                         for name in ("readQueueNums", "writeQueueNums", "perm", "topicSysFlag")]
                        + [(("dataVersion", "timestamp"), LONG), (("dataVersion", "counter"), LONG)],
    RC.RESET_CONSUMER_CLIENT_OFFSET: [(("offsetTable", "*", "offset"), LONG),
                                      (("offsetTable", "*", "mq", "queueId"), INT)],
}

# The tables flattened for the per-request check: code -> ((field, lowest, highest, Java type), ...).
_EXT_CHECKS: dict[int, tuple[tuple[str, int, int, str], ...]] = {
    code: tuple((name, *JAVA_RANGES[java], java) for name, java in fields.items())
    for code, fields in FIELD_TYPES.items()
}

_SHOWN_DIGITS = 40  # a remark shows at most this many characters of an offending value


def _show(value: Any) -> str:
    text = str(value)
    if len(text) <= _SHOWN_DIGITS:
        return text
    return f"{text[:_SHOWN_DIGITS]}... ({len(text)} characters)"


def _as_int(value: Any) -> int | None:
    """The integer ``value`` holds (an int, or a decimal string), else None (not a number: not ours to judge)."""
    if type(value) is int:
        return value
    if type(value) is str:
        try:
            return int(value.strip())  # a string over 4300 digits raises ValueError (int_max_str_digits)
        except ValueError:
            return None
    return None


def _out_of_range(kind: str, where: str, value: int, java: str) -> str:
    lo, hi = JAVA_RANGES[java]
    return (f"{kind} field {where!r} = {_show(value)} is outside the range of a Java {java} "
            f"(int{_BITS[java]}): [{lo}, {hi}]")


def _walk(node: Any, path: tuple[str, ...], where: str) -> Iterator[tuple[str, Any]]:
    """Every ``(location, value)`` that ``path`` reaches inside ``node`` (missing steps reach nothing)."""
    if not path:
        yield where, node
        return
    step, rest = path[0], path[1:]
    if step == "*":
        if isinstance(node, list):
            for i, item in enumerate(node):
                yield from _walk(item, rest, f"{where}[{i}]")
        elif isinstance(node, dict):
            for key, item in node.items():
                yield from _walk(item, rest, f"{where}[{_show(key)}]")
    elif isinstance(node, dict) and step in node:
        yield from _walk(node[step], rest, f"{where}.{step}" if where else step)


def check_field_ranges(code: int, ext: dict[str, Any], body: Any = None) -> str | None:
    """None when every numeric field of a ``code`` request is within its Java type's range; otherwise the
    remark naming the first field that is not, its value and the range (e.g. ``header field 'commitOffset' =
    9223372036854775808 is outside the range of a Java long (int64): [-9223372036854775808,
    9223372036854775807]``). Codes without numeric fields cost one dict lookup."""
    checks = _EXT_CHECKS.get(code)
    if checks is not None and ext:
        get = ext.get
        for name, lo, hi, java in checks:
            raw = get(name)
            if raw is None:
                continue
            if type(raw) is not int:
                raw = _as_int(raw)
                if raw is None:
                    continue
            if not lo <= raw <= hi:
                return _out_of_range("header", name, raw, java)
    paths = BODY_FIELD_TYPES.get(code)
    if paths is not None and isinstance(body, dict):
        for path, java in paths:
            lo, hi = JAVA_RANGES[java]
            for where, raw in _walk(body, path, ""):
                if type(raw) is int and not lo <= raw <= hi:
                    return _out_of_range("body", where, raw, java)
    return None


# -- reading header fields in handlers ---------------------------------------------------------------------

_JAVA_OF_BITS = {32: JAVA_INT, 64: JAVA_LONG}


def flag_field(ext: dict[str, Any], name: str) -> bool:
    """A boolean header field as RocketMQ's ``Boolean.parseBoolean`` reads it: true for ``True`` or the string
    "true" in any case (extFields are strings), false for anything else, a missing field included."""
    v = ext.get(name)
    return v is True or (isinstance(v, str) and v.lower() == "true")


def int_field(ext: dict[str, Any], name: str, default: int | None = None, *, bits: int = 64) -> int:
    """An int header field within the signed ``bits``-bit range of the record field it fills (32: a Java int,
    64: a Java long).

    RequestError(SYSTEM_ERROR) naming the field when it is missing, not an int, or out of range (a value that
    does not fit would otherwise fail deep in the store's struct packing).
    """
    v = ext.get(name, default)
    if v is None:
        raise RequestError(ResponseCode.SYSTEM_ERROR, f"header field {name!r} is missing")
    if type(v) is not int:
        if isinstance(v, str):
            try:
                v = int(v)  # RocketMQ's extFields are strings; accept them from such clients
            except ValueError:
                raise RequestError(ResponseCode.SYSTEM_ERROR,
                                   f"header field {name!r} must be an integer, got {_show(repr(v))}") from None
        else:
            raise RequestError(ResponseCode.SYSTEM_ERROR,
                               f"header field {name!r} must be an integer, got {_show(repr(v))}")
    java = _JAVA_OF_BITS[bits]
    lo, hi = JAVA_RANGES[java]
    if not lo <= v <= hi:
        raise RequestError(ResponseCode.SYSTEM_ERROR, _out_of_range("header", name, v, java))
    return v


def str_field(ext: dict[str, Any], name: str, default: str | None = None) -> str:
    """A str header field; RequestError(SYSTEM_ERROR) naming the field when it is missing or not a str."""
    v = ext.get(name, default)
    if v is None:
        raise RequestError(ResponseCode.SYSTEM_ERROR, f"header field {name!r} is missing")
    if not isinstance(v, str):
        raise RequestError(ResponseCode.SYSTEM_ERROR, f"header field {name!r} must be a string, got {_show(repr(v))}")
    return v
