"""Message queue selectors for ``Producer.send(msg, selector=..., arg=...)``.

A selector is any callable ``(mqs, msg, arg) -> MessageQueue`` that picks one of ``mqs`` (the topic's
writable queues, sorted by broker name and queue id). Messages that must stay in order (one order id,
one account) go to the same queue when the selector is a pure function of ``arg``.

* :func:`select_by_hash` — CRC-32 of the key's UTF-8 bytes, modulo the queue count. Stable across
  processes and Python versions (unlike ``hash()``, which is salted per process).
* :class:`SelectMessageQueueByHash` — RocketMQ's selector: Java ``arg.hashCode() % size``, absolute value
  if negative. A Java producer and a trimq producer send the same key to the same queue.
* :func:`select_random` — any queue.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable, Sequence
from typing import Any

from trimq.protocol.message_queue import MessageQueue

__all__ = [
    "MessageQueueSelector",
    "SelectMessageQueueByHash",
    "java_hash_code",
    "java_string_hash",
    "select_by_hash",
    "select_by_java_hash",
    "select_random",
]

MessageQueueSelector = Callable[[Sequence[MessageQueue], Any, Any], MessageQueue]


def _to_int32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - 0x1_0000_0000 if v & 0x8000_0000 else v


def java_string_hash(s: str) -> int:
    """Java's ``String.hashCode()``: ``s[0]*31^(n-1) + ... + s[n-1]`` over UTF-16 code units, as int32."""
    data = s.encode("utf-16-be", "surrogatepass")
    h = 0
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return _to_int32(h)


def java_hash_code(arg: Any) -> int:
    """What Java's ``arg.hashCode()`` returns for the boxed equivalent of ``arg``.

    ``str`` -> String.hashCode; ``bool`` -> Boolean (1231 / 1237); ``int`` in the int32 range ->
    Integer (the value), otherwise in the int64 range -> Long (``(int)(v ^ (v >>> 32))``); anything
    else -> String.hashCode of ``str(arg)``.
    """
    if isinstance(arg, str):
        return java_string_hash(arg)
    if isinstance(arg, bool):
        return 1231 if arg else 1237
    if isinstance(arg, int):
        if -(2**31) <= arg < 2**31:
            return arg
        if -(2**63) <= arg < 2**63:
            u = arg & 0xFFFF_FFFF_FFFF_FFFF
            return _to_int32(u ^ (u >> 32))
    return java_string_hash(str(arg))


def _java_rem(a: int, b: int) -> int:
    """Java's ``a % b`` for ints: the remainder takes the sign of the dividend."""
    r = abs(a) % abs(b)
    return -r if a < 0 else r


def _check_mqs(mqs: Sequence[MessageQueue]) -> None:
    if not mqs:
        raise ValueError("there are no message queues to select from")


class SelectMessageQueueByHash:
    """RocketMQ's ``SelectMessageQueueByHash``: ``abs(arg.hashCode() % len(mqs))`` with Java arithmetic.

    ``arg`` is hashed as Java would hash its boxed equivalent (:func:`java_hash_code`): pass the same
    string (or integer) a Java producer passes and both pick the same queue index.
    """

    def __call__(self, mqs: Sequence[MessageQueue], msg: Any, arg: Any) -> MessageQueue:
        _check_mqs(mqs)
        value = _java_rem(java_hash_code(arg), len(mqs))
        if value < 0:
            value = abs(value)
        return mqs[value]

    def __repr__(self) -> str:
        return "SelectMessageQueueByHash()"


select_by_java_hash = SelectMessageQueueByHash()
"""A ready instance of :class:`SelectMessageQueueByHash`."""


def select_by_hash(mqs: Sequence[MessageQueue], msg: Any, arg: Any) -> MessageQueue:
    """CRC-32 of the key modulo the queue count: stable across processes, machines and restarts.

    ``arg`` may be ``bytes`` (hashed as is) or anything else (hashed as the UTF-8 of ``str(arg)``).
    """
    _check_mqs(mqs)
    data = arg if isinstance(arg, bytes | bytearray) else str(arg).encode("utf-8", "surrogatepass")
    return mqs[zlib.crc32(data) % len(mqs)]


def select_random(mqs: Sequence[MessageQueue], msg: Any, arg: Any) -> MessageQueue:
    """Any queue, uniformly at random (RocketMQ's SelectMessageQueueByRandom)."""
    _check_mqs(mqs)
    return mqs[random.randrange(len(mqs))]
