"""ProcessQueue: the client's per-queue cache of pulled messages, RocketMQ 4.9.3's bookkeeping (FACTS §4).

A pure class: no trio, no I/O, time passed in as milliseconds. The pull loop puts messages in; a
consume service takes them out (orderly: ``take_messages`` / ``commit`` / ``rollback``; concurrently:
``remove_message``; orderly with ``order_scope="key"``: :meth:`ProcessQueue.enable_key_scope`, the
:class:`client.key_backlog.KeyBacklog` it returns, then :meth:`ProcessQueue.complete`), and the rebalance reads the
flags and timestamps.

**Key scope** (issue 17): messages stay cached, as in concurrent mode, until they are completed, whether they wait
or are in the listener; so the smallest cached offset is where the contiguous completed prefix ends
(:meth:`ProcessQueue.completed_prefix`), which is the only offset a key-scope consumer commits: a takeover replays
from the first incomplete message, never past it. ``msg_count``, ``msg_size`` and ``max_span`` count every
uncompleted message, so a stuck key holds the pull back (flow control) instead of growing the cache.

The consume lock RocketMQ keeps inside ProcessQueue is *not* here: the trio layer holds one beside each instance
(client.consume_lock.ConsumeLock).

Counts follow RocketMQ 4.9.3 exactly, drift included: ``msg_count``/``msg_size`` count messages as they
are first cached and are reduced by ``commit`` and ``remove_message`` only; replacing a message at an
offset already cached keeps the old size; ``remove_message`` subtracts the *argument's* body length.
(HEAD forces ``msg_size`` to 0 when the count reaches 0; 4.9.3 does not, and neither do we.) A ``None``
body counts as 0 bytes (4.9.3 would throw).

Differences from RocketMQ, all deliberate:

* ``commit()`` with nothing in flight returns ``-1`` and changes nothing; 4.9.3 throws
  NoSuchElementException there, which makes its own ``-1`` fallback unreachable.
* ``clean_expired_msg`` does not call a consumer: it *returns* the expired head messages; the caller
  sends each back (delay level :data:`ProcessQueue.SEND_BACK_DELAY_LEVEL`) and then calls
  :meth:`ProcessQueue.remove_if_first` (RocketMQ's "still the first key?" check + removeMessage).
* An unparseable ``MAX_OFFSET`` or ``CONSUME_START_TIME`` property is ignored (RocketMQ throws
  NumberFormatException out of putMessage / cleanExpiredMsg).
"""

from __future__ import annotations

import re
from bisect import bisect_left, insort
from collections.abc import Iterable, Iterator, Sequence
from itertools import islice
from typing import Any, ClassVar

from trimq.client.key_backlog import KeyBacklog
from trimq.protocol.message import MessageConst, MessageExt

__all__ = ["ProcessQueue"]

_JAVA_LONG = re.compile(r"[+-]?[0-9]+")
_MIB = 1024 * 1024


def _parse_java_long(text: str | None) -> int | None:
    """``Long.parseLong`` for well-formed input; None for absent, empty or malformed text."""
    if not text or not _JAVA_LONG.fullmatch(text):
        return None
    return int(text)


def _body_len(msg: MessageExt) -> int:
    return len(msg.body) if msg.body is not None else 0


class _OffsetMap:
    """offset -> message, kept in offset order; cheap for the common pattern (pulls append larger offsets,
    consumption takes the smallest) and correct for any other order.

    ``_keys[_head:]`` is exactly the sorted list of the dict's keys: the head index makes taking the smallest
    O(1) (the list is compacted now and then), an append of a larger offset is O(1), anything else bisects.
    """

    __slots__ = ("_d", "_head", "_keys")

    def __init__(self) -> None:
        self._d: dict[int, MessageExt] = {}
        self._keys: list[int] = []
        self._head = 0

    def __len__(self) -> int:
        return len(self._d)

    def __bool__(self) -> bool:
        return bool(self._d)

    def __contains__(self, offset: object) -> bool:
        return offset in self._d

    def get(self, offset: int) -> MessageExt | None:
        return self._d.get(offset)

    def set(self, offset: int, msg: MessageExt) -> bool:
        """Store ``msg`` at ``offset``; True when the offset was not there before."""
        d = self._d
        if offset in d:
            d[offset] = msg
            return False
        d[offset] = msg
        keys = self._keys
        if len(d) == 1:
            keys.clear()
            self._head = 0
            keys.append(offset)
        elif offset > keys[-1]:
            keys.append(offset)
        else:
            insort(keys, offset, self._head)
        return True

    def extend_ascending(self, offsets: list[int], msgs: Sequence[MessageExt]) -> bool:
        """Add messages whose offsets are strictly ascending and all above the current last one, in one go;
        False (nothing done) when they are not (the caller then adds them one by one)."""
        if not offsets or (self._d and offsets[0] <= self._keys[-1]):
            return False
        if len(offsets) > 1 and (offsets[-1] - offsets[0] < len(offsets) - 1 or sorted(set(offsets)) != offsets):
            return False
        if not self._d:
            self._keys.clear()
            self._head = 0
        self._d.update(zip(offsets, msgs, strict=True))
        self._keys.extend(offsets)
        return True

    def take_first(self, n: int) -> list[MessageExt]:
        """Remove and return the ``n`` (at most) smallest-offset messages, in offset order."""
        keys = self._keys
        head = self._head
        taken = keys[head:head + n]
        pop = self._d.pop
        msgs = [pop(k) for k in taken]
        self._head = head + len(taken)
        if not self._d:
            keys.clear()
            self._head = 0
        elif self._head >= 1024 and self._head * 2 >= len(keys):
            del keys[: self._head]
            self._head = 0
        return msgs

    def first(self) -> int:
        return self._keys[self._head]

    def last(self) -> int:
        return self._keys[-1]

    def _advance(self) -> None:
        self._head += 1
        if self._head >= 1024 and self._head * 2 >= len(self._keys):
            del self._keys[: self._head]  # compact: the consumed prefix never outgrows the live keys
            self._head = 0

    def pop_first(self) -> tuple[int, MessageExt]:
        offset = self._keys[self._head]
        self._advance()
        return offset, self._d.pop(offset)

    def pop(self, offset: int) -> MessageExt | None:
        msg = self._d.pop(offset, None)
        if msg is None:
            return None
        keys = self._keys
        if not self._d:
            keys.clear()
            self._head = 0
        elif keys[self._head] == offset:
            self._advance()
        elif keys[-1] == offset:
            keys.pop()
        else:
            del keys[bisect_left(keys, offset, self._head)]
        return msg

    def offsets(self) -> list[int]:
        return self._keys[self._head:]

    def values(self) -> list[MessageExt]:
        d = self._d
        return [d[k] for k in islice(self._keys, self._head, None)]

    def items(self) -> Iterator[tuple[int, MessageExt]]:
        d = self._d
        return ((k, d[k]) for k in self._keys[self._head:])

    def head_values(self, n: int) -> list[MessageExt]:
        d = self._d
        return [d[k] for k in islice(self._keys, self._head, self._head + n)]

    def clear(self) -> None:
        self._d.clear()
        self._keys.clear()
        self._head = 0


class ProcessQueue:
    """RocketMQ's ProcessQueue: cached messages by queue offset, plus the orderly "in flight" subset.

    ``now_ms`` is the creation time; the last lock, pull and consume timestamps start there.
    Thresholds are class constants (RocketMQ's system-property defaults) that an instance may override.
    """

    REBALANCE_LOCK_MAX_LIVE_TIME_MS: ClassVar[int] = 30_000
    """A client lock older than this is expired (strict >). ``rocketmq.client.rebalance.lockMaxLiveTime``."""
    REBALANCE_LOCK_INTERVAL_MS: ClassVar[int] = 20_000
    """Period of the orderly lock-renewal task. RocketMQ ``rocketmq.client.rebalance.lockInterval``."""
    PULL_MAX_IDLE_TIME_MS: ClassVar[int] = 120_000
    """A queue not pulled for longer than this (strict >) is pull-expired. ``rocketmq.client.pull.pullMaxIdleTime``."""
    CLEAN_EXPIRED_MAX_ITERATIONS: ClassVar[int] = 16
    """cleanExpiredMsg looks at most this many head messages per run."""
    SEND_BACK_DELAY_LEVEL: ClassVar[int] = 3
    """Delay level RocketMQ uses when it sends an expired message back."""

    def __init__(
        self,
        now_ms: int,
        *,
        lock_max_live_time_ms: int | None = None,
        pull_max_idle_time_ms: int | None = None,
    ) -> None:
        if isinstance(now_ms, bool) or not isinstance(now_ms, int):
            raise TypeError(f"now_ms must be an int (milliseconds), got {now_ms!r}")
        self.lock_max_live_time_ms: int = (
            self.REBALANCE_LOCK_MAX_LIVE_TIME_MS if lock_max_live_time_ms is None else lock_max_live_time_ms
        )
        self.pull_max_idle_time_ms: int = (
            self.PULL_MAX_IDLE_TIME_MS if pull_max_idle_time_ms is None else pull_max_idle_time_ms
        )
        self._msg_tree = _OffsetMap()  # offset -> MessageExt (msgTreeMap)
        self._consuming = _OffsetMap()  # offset -> MessageExt (consumingMsgOrderlyTreeMap)
        self._msg_count = 0
        self._msg_size = 0
        self._queue_offset_max = 0
        self._msg_acc_cnt = 0
        self.dropped = False
        self.locked = False
        self.consuming = False
        self.last_pull_timestamp = now_ms
        self.last_consume_timestamp = now_ms
        self.last_lock_timestamp = now_ms
        self.try_unlock_times = 0
        self.key_backlog: KeyBacklog | None = None
        """Key scope: the uncompleted messages by key (:meth:`enable_key_scope`); None otherwise."""

    # ------------------------------------------------------------------------------------------
    # Read-only bookkeeping

    @property
    def msg_count(self) -> int:
        """Messages cached and not yet committed/removed (RocketMQ's msgCount)."""
        return self._msg_count

    @property
    def msg_size(self) -> int:
        """Sum of body bytes of those messages (RocketMQ's msgSize, same drift)."""
        return self._msg_size

    @property
    def queue_offset_max(self) -> int:
        """Offset of the last *new* message put, in list order (not a max); 0 initially."""
        return self._queue_offset_max

    @property
    def msg_acc_cnt(self) -> int:
        """Messages still on the broker behind the last pulled one (from its MAX_OFFSET property)."""
        return self._msg_acc_cnt

    @msg_acc_cnt.setter
    def msg_acc_cnt(self, value: int) -> None:
        self._msg_acc_cnt = value

    @property
    def max_span(self) -> int:
        """Largest minus smallest cached offset (not counting the in-flight ones); 0 when empty."""
        if not self._msg_tree:
            return 0
        return self._msg_tree.last() - self._msg_tree.first()

    def has_temp_message(self) -> bool:
        """True while messages wait to be consumed (in-flight orderly messages do not count)."""
        return bool(self._msg_tree)

    def is_lock_expired(self, now_ms: int) -> bool:
        """More than the lock live time (30 s) since the lock was last confirmed by the broker."""
        return now_ms - self.last_lock_timestamp > self.lock_max_live_time_ms

    def is_pull_expired(self, now_ms: int) -> bool:
        """More than the pull idle time (120 s) since the last pull."""
        return now_ms - self.last_pull_timestamp > self.pull_max_idle_time_ms

    def inc_try_unlock_times(self) -> None:
        """Count one more failed attempt to unlock this queue on the broker."""
        self.try_unlock_times += 1

    def first_offset(self) -> int | None:
        """Smallest cached offset (what a concurrent consumer may commit up to), None when empty."""
        return self._msg_tree.first() if self._msg_tree else None

    def last_offset(self) -> int | None:
        """Largest cached offset, None when empty."""
        return self._msg_tree.last() if self._msg_tree else None

    def messages(self) -> list[MessageExt]:
        """The cached messages waiting to be consumed, in offset order (a copy)."""
        return list(self._msg_tree.values())

    def consuming_messages(self) -> list[MessageExt]:
        """The orderly in-flight messages (taken, not yet committed or rolled back), in offset order."""
        return list(self._consuming.values())

    def contains_message(self, msg: MessageExt) -> bool:
        """Whether ``msg``'s offset is cached, waiting or in flight (RocketMQ HEAD's containsMessage)."""
        return msg.queue_offset in self._msg_tree or msg.queue_offset in self._consuming

    # ------------------------------------------------------------------------------------------
    # Mutations

    def put_message(self, msgs: Sequence[MessageExt]) -> bool:
        """Cache pulled messages; True when the caller should dispatch a consume request.

        Each message is stored by queue offset, replacing any cached one at that offset; only offsets
        that were not cached count toward ``msg_count``/``msg_size`` and set ``queue_offset_max``. The
        result is True (and ``consuming`` becomes True) when something is cached and nobody is consuming.
        The last message's MAX_OFFSET property updates ``msg_acc_cnt`` when it is ahead of that message.
        """
        tree = self._msg_tree
        offsets = [m.queue_offset for m in msgs]
        if tree.extend_ascending(offsets, msgs):
            # the common case: a pull's messages follow what is cached, all new
            self._queue_offset_max = offsets[-1]
            self._msg_size += sum([len(m.body) if m.body is not None else 0 for m in msgs])
            self._msg_count += len(msgs)
            if self.key_backlog is not None:
                self.key_backlog.add(msgs)
        else:
            valid = 0
            size = 0
            tree_set = tree.set
            fresh = []
            for msg in msgs:
                offset = msg.queue_offset
                if tree_set(offset, msg):
                    valid += 1
                    self._queue_offset_max = offset
                    size += len(msg.body) if msg.body is not None else 0
                    fresh.append(msg)
            self._msg_size += size
            self._msg_count += valid
            if self.key_backlog is not None:
                self.key_backlog.add(fresh)  # a replaced message keeps its place in its key's line

        dispatch = False
        if self._msg_tree and not self.consuming:
            dispatch = True
            self.consuming = True

        if msgs:
            last = msgs[-1]
            max_offset = _parse_java_long(last.properties.get(MessageConst.MAX_OFFSET))
            if max_offset is not None:
                acc_total = max_offset - last.queue_offset
                if acc_total > 0:
                    self._msg_acc_cnt = acc_total
        return dispatch

    def take_messages(self, n: int, now_ms: int) -> list[MessageExt]:
        """Orderly: move up to ``n`` smallest-offset messages in flight and return them in offset order.

        Updates ``last_consume_timestamp``. When nothing was taken, ``consuming`` becomes False (the
        consume loop ends). Counts are unchanged until :meth:`commit`.
        """
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"batch size must be an int, got {n!r}")
        if n < 0:
            raise ValueError(f"batch size must be >= 0, got {n}")
        self.last_consume_timestamp = now_ms
        result = self._msg_tree.take_first(n) if n else []
        if result and not self._consuming.extend_ascending([m.queue_offset for m in result], result):
            consuming_set = self._consuming.set
            for msg in result:
                consuming_set(msg.queue_offset, msg)
        if not result:
            self.consuming = False
        return result

    def commit(self) -> int:
        """Orderly: forget the in-flight messages; return the offset to store (largest in flight + 1).

        Returns -1 and changes nothing when nothing is in flight (RocketMQ 4.9.3 throws there).
        """
        if not self._consuming:
            return -1
        largest = self._consuming.last()
        self._msg_count -= len(self._consuming)
        self._msg_size -= sum(_body_len(msg) for msg in self._consuming.values())
        self._consuming.clear()
        return largest + 1

    def rollback(self) -> None:
        """Orderly: put every in-flight message back to be consumed again (counts unchanged)."""
        for offset, msg in self._consuming.items():
            self._msg_tree.set(offset, msg)
        self._consuming.clear()

    def make_message_to_consume_again(self, msgs: Iterable[MessageExt]) -> None:
        """Orderly: put these messages back to be consumed again (counts unchanged).

        As in RocketMQ, each message is (re)cached even if it was not in flight.
        """
        for msg in msgs:
            self._consuming.pop(msg.queue_offset)
            self._msg_tree.set(msg.queue_offset, msg)

    def remove_message(self, msgs: Iterable[MessageExt], now_ms: int) -> int:
        """Concurrently: drop consumed messages; return the offset that is safe to commit.

        Updates ``last_consume_timestamp``. With nothing cached, returns -1 and changes nothing.
        Otherwise returns the smallest offset still cached, or ``queue_offset_max + 1`` when the cache
        is now empty. Each actual removal subtracts one message and the *argument's* body length.
        """
        self.last_consume_timestamp = now_ms
        if not self._msg_tree:
            return -1
        result = self._queue_offset_max + 1
        removed = 0
        for msg in msgs:
            if self._msg_tree.pop(msg.queue_offset) is not None:
                removed += 1
                self._msg_size -= _body_len(msg)
        self._msg_count -= removed
        if self._msg_tree:
            result = self._msg_tree.first()
        return result

    # ------------------------------------------------------------------------------------------
    # Key scope (module documentation)

    def enable_key_scope(self) -> KeyBacklog:
        """Keep a :class:`KeyBacklog` of the uncompleted messages from now on (the messages cached so far are put
        in it); returns it. Idempotent."""
        if self.key_backlog is None:
            self.key_backlog = KeyBacklog()
            self.key_backlog.add(self._msg_tree.values())
        return self.key_backlog

    def completed_prefix(self) -> int | None:
        """Key scope: the first uncompleted message (waiting or in the listener), where the contiguous completed
        prefix ends; None when every cached message is completed."""
        return self._msg_tree.first() if self._msg_tree else None

    def complete(self, msgs: Iterable[MessageExt], now_ms: int) -> int:
        """Key scope: these messages are done (consumed, dead-lettered or skipped) and leave the cache; returns the
        offset to commit, :meth:`completed_prefix` (-1 when nothing was cached, e.g. after :meth:`clear`: a reset
        dropped the queue, and nothing of it may be committed); with nothing left, one past the last message put.
        The key backlog is the caller's to update."""
        return self.remove_message(msgs, now_ms)

    def clean_expired_msg(
        self, now_ms: int, consume_timeout_minutes: int, *, orderly: bool = False
    ) -> list[MessageExt]:
        """The head messages whose consumption started more than ``consume_timeout_minutes`` ago.

        RocketMQ looks at most ``min(16, cached)`` times at the *first* cached message and, while its
        CONSUME_START_TIME property is older than the timeout, sends it back with delay level 3 and
        removes it if it is still first. This pure version returns those messages in offset order
        (the first up to 16 consecutive expired ones from the head, stopping at the first that is not
        expired or has no start time); it changes nothing. The caller, for each in order, sends it back
        and on success calls :meth:`remove_if_first`; on a failed send it should stop (RocketMQ would
        retry the same head message on its next iteration). Orderly consumers never clean (``[]``).
        """
        if orderly:
            return []
        timeout_ms = consume_timeout_minutes * 60 * 1000
        expired: list[MessageExt] = []
        for msg in self._msg_tree.head_values(self.CLEAN_EXPIRED_MAX_ITERATIONS):
            start = _parse_java_long(msg.properties.get(MessageConst.CONSUME_START_TIME))
            if start is None or now_ms - start <= timeout_ms:
                break
            expired.append(msg)
        return expired

    def remove_if_first(self, msg: MessageExt, now_ms: int) -> bool:
        """Remove ``msg`` (via :meth:`remove_message`) only if its offset is still the first cached one.

        Returns whether it was removed. This is cleanExpiredMsg's check after the send-back.
        """
        if not self._msg_tree or self._msg_tree.first() != msg.queue_offset:
            return False
        self.remove_message([msg], now_ms)
        return True

    def clear(self) -> None:
        """Forget every message: both maps emptied, ``msg_count``, ``msg_size``, ``queue_offset_max`` zeroed."""
        self._msg_tree.clear()
        self._consuming.clear()
        self._msg_count = 0
        self._msg_size = 0
        self._queue_offset_max = 0
        if self.key_backlog is not None:
            self.key_backlog.clear()

    # ------------------------------------------------------------------------------------------
    # Diagnostics

    def info(self, now_ms: int) -> dict[str, Any]:
        """A snapshot for admin tools, RocketMQ's fillProcessQueueInfo plus a few trimq extras.

        As in RocketMQ, the ``cached_*`` and ``transaction_*`` fields are 0 when their map is empty, and
        ``cached_msg_size_in_mib`` is ``msg_size`` in whole MiB (rounded down). ``cached_msg_count`` is
        the number of cached entries (not ``msg_count``, which also counts the in-flight ones).
        """
        cached = bool(self._msg_tree)
        in_flight = bool(self._consuming)
        out = {
            "cached_msg_min_offset": self._msg_tree.first() if cached else 0,
            "cached_msg_max_offset": self._msg_tree.last() if cached else 0,
            "cached_msg_count": len(self._msg_tree),
            "cached_msg_size_in_mib": self._msg_size // _MIB if cached else 0,
            "transaction_msg_min_offset": self._consuming.first() if in_flight else 0,
            "transaction_msg_max_offset": self._consuming.last() if in_flight else 0,
            "transaction_msg_count": len(self._consuming),
            "locked": self.locked,
            "try_unlock_times": self.try_unlock_times,
            "last_lock_timestamp": self.last_lock_timestamp,
            "dropped": self.dropped,
            "last_pull_timestamp": self.last_pull_timestamp,
            "last_consume_timestamp": self.last_consume_timestamp,
            # trimq extras
            "msg_count": self._msg_count,
            "msg_size": self._msg_size,
            "max_span": self.max_span,
            "queue_offset_max": self._queue_offset_max,
            "msg_acc_cnt": self._msg_acc_cnt,
            "consuming": self.consuming,
            "lock_expired": self.is_lock_expired(now_ms),
            "pull_expired": self.is_pull_expired(now_ms),
        }
        keys = self.key_backlog
        if keys is not None:
            # key scope: "transaction" = the batches taken by their keys (in the listener or suspended), still cached
            taken = sorted(m.queue_offset for m in keys.in_turns())
            out.update(transaction_msg_min_offset=taken[0] if taken else 0,
                       transaction_msg_max_offset=taken[-1] if taken else 0, transaction_msg_count=len(taken),
                       key_turns=keys.turns)
        return out

    def __repr__(self) -> str:
        return (
            f"ProcessQueue(msg_count={self._msg_count}, msg_size={self._msg_size}, "
            f"cached={len(self._msg_tree)}, in_flight={len(self._consuming)}, locked={self.locked}, "
            f"dropped={self.dropped}, consuming={self.consuming})"
        )
