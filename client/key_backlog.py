"""KeyBacklog: what an orderly consumer with ``order_scope="key"`` has left to consume of one queue, by key.

A pure class (no trio, no I/O), kept by the queue's :class:`client.process_queue.ProcessQueue` once key scope is
enabled on it. Every message cached and not yet completed is here exactly once, either **waiting** in its key's
line (queue order) or in its key's **turn**: the batch a consume task has taken and not finished (in the listener,
or suspended after a failure and waiting to be retried). A key has at most one turn at a time, so no two messages
of one key are ever in the listener at once, and a key's messages are taken in queue order.

The key of a message (:func:`message_key`) is its ``__SHARDINGKEY`` property (RocketMQ 5's sharding key, set by
``Producer.send(msg, sharding_key=...)``), else its KEYS property (the whole string), else ``""``: messages with
neither are one key, consumed one after the other as in queue scope.

Among the keys ready to run (a waiting message, no turn), :meth:`KeyBacklog.take` gives the one whose next
message is the oldest in the queue, so a key never waits behind keys whose messages came later.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left
from collections import deque
from collections.abc import Iterable, Iterator

from trimq.protocol.message import MessageConst, MessageExt

__all__ = ["KeyBacklog", "KeyTurn", "message_key"]


def message_key(msg: MessageExt) -> str:
    """The key a key-scope consumer keeps in order: the sharding key, else KEYS, else ``""``."""
    props = msg.properties
    return props.get(MessageConst.SHARDING_KEY) or props.get(MessageConst.KEYS) or ""


class KeyTurn:
    """One key's batch taken for consumption: ``msgs`` (queue order) until :meth:`KeyBacklog.finish` or
    :meth:`KeyBacklog.release`. The object identifies the turn: after a suspension the consume task checks that it
    is still the key's current turn (an operator may have skipped its messages meanwhile)."""

    __slots__ = ("key", "msgs")

    def __init__(self, key: str, msgs: list[MessageExt]) -> None:
        self.key = key
        self.msgs = msgs

    def __repr__(self) -> str:
        return f"KeyTurn({self.key!r}, offsets={[m.queue_offset for m in self.msgs]})"


class KeyBacklog:
    """Per-key lines of one queue's uncompleted messages (see the module documentation)."""

    __slots__ = ("_known", "_lines", "_ready", "_turns")

    def __init__(self) -> None:
        self._lines: dict[str, deque[MessageExt]] = {}  # key -> waiting messages, queue order
        self._turns: dict[str, KeyTurn] = {}  # key -> its batch taken
        self._ready: list[tuple[int, str]] = []  # heap of (offset of the next message, key): keys with no turn
        self._known: set[int] = set()  # offsets waiting or in a turn

    # --- reading ---------------------------------------------------------------------------------------

    def __len__(self) -> int:
        """Messages waiting or in a turn."""
        return len(self._known)

    def __contains__(self, offset: object) -> bool:
        return offset in self._known

    def has_ready(self) -> bool:
        """Whether some key has a waiting message and no turn."""
        return bool(self._ready)

    @property
    def turns(self) -> int:
        """Keys with a batch taken (in the listener or suspended)."""
        return len(self._turns)

    def turn(self, key: str) -> KeyTurn | None:
        """The key's current turn, None when it has none."""
        return self._turns.get(key)

    def in_turns(self) -> Iterator[MessageExt]:
        """The messages of every turn."""
        for t in self._turns.values():
            yield from t.msgs

    def waiting(self, key: str) -> list[MessageExt]:
        """The key's waiting messages, queue order (a copy)."""
        return list(self._lines.get(key, ()))

    def locate(self, offset: int) -> tuple[str, KeyTurn | None, MessageExt] | None:
        """(key, its turn if the message is in it, the message) for a known offset; None when unknown."""
        if offset not in self._known:
            return None
        for t in self._turns.values():
            for m in t.msgs:
                if m.queue_offset == offset:
                    return t.key, t, m
        for key, line in self._lines.items():
            for m in line:
                if m.queue_offset == offset:
                    return key, None, m
        return None  # pragma: no cover - _known and the lines agree

    # --- changes ---------------------------------------------------------------------------------------

    def add(self, msgs: Iterable[MessageExt]) -> int:
        """Put pulled messages in their keys' lines (offsets already known are ignored); returns how many were
        added. A message older than its line's last one (the broker re-sent a range) is put in its place."""
        added = 0
        known = self._known
        lines = self._lines
        for m in msgs:
            off = m.queue_offset
            if off in known:
                continue
            known.add(off)
            added += 1
            key = message_key(m)
            line = lines.get(key)
            if line is None:
                line = lines[key] = deque()
            if not line or line[-1].queue_offset < off:
                line.append(m)
                if len(line) == 1 and key not in self._turns:
                    heapq.heappush(self._ready, (off, key))
            else:
                was_head = line[0].queue_offset
                line.insert(bisect_left([x.queue_offset for x in line], off), m)
                if key not in self._turns and off < was_head:
                    # the key is in the heap under its old head: push it again under the new one (the old entry is
                    # skipped when popped, see take)
                    heapq.heappush(self._ready, (off, key))
        return added

    def take(self, max_batch: int = 1) -> KeyTurn | None:
        """The ready key whose next message is the oldest: up to ``max_batch`` of its waiting messages become its
        turn. None when no key is ready."""
        ready = self._ready
        lines = self._lines
        while ready:
            off, key = heapq.heappop(ready)
            line = lines.get(key)
            if not line or key in self._turns or line[0].queue_offset != off:
                continue  # an outdated entry
            n = min(max_batch, len(line))
            msgs = [line.popleft() for _ in range(n)]
            if not line:
                del lines[key]
            turn = self._turns[key] = KeyTurn(key, msgs)
            return turn
        return None

    def _ready_again(self, key: str) -> None:
        line = self._lines.get(key)
        if line:
            heapq.heappush(self._ready, (line[0].queue_offset, key))

    def finish(self, turn: KeyTurn) -> bool:
        """The turn is over: its messages are completed (consumed, dead-lettered or skipped) and forgotten; the key
        may run again. False (nothing changed) when ``turn`` is no longer its key's turn."""
        if self._turns.get(turn.key) is not turn:
            return False
        del self._turns[turn.key]
        for m in turn.msgs:
            self._known.discard(m.queue_offset)
        turn.msgs = []
        self._ready_again(turn.key)
        return True

    def drop(self, turn: KeyTurn, msgs: Iterable[MessageExt]) -> None:
        """Some messages of a turn are completed (dead-lettered) while the others stay in it to be retried."""
        gone = {m.queue_offset for m in msgs}
        turn.msgs = [m for m in turn.msgs if m.queue_offset not in gone]
        self._known.difference_update(gone)

    def release(self, turn: KeyTurn) -> bool:
        """The turn's messages were not consumed (the lease lapsed, the queue was dropped, shutdown): they go back
        to the head of their key's line, to be taken again. False when ``turn`` is no longer its key's turn."""
        if self._turns.get(turn.key) is not turn:
            return False
        del self._turns[turn.key]
        if turn.msgs:
            line = self._lines.get(turn.key)
            if line is None:
                line = self._lines[turn.key] = deque()
            line.extendleft(reversed(turn.msgs))
        turn.msgs = []
        self._ready_again(turn.key)
        return True

    def discard(self, offset: int) -> tuple[str, KeyTurn | None, MessageExt] | None:
        """Forget one message (an operator skipped it): out of its line, or out of its key's turn (a turn left
        empty is finished). Returns what :meth:`locate` returned, None when the offset is unknown."""
        found = self.locate(offset)
        if found is None:
            return None
        key, turn, msg = found
        self._known.discard(offset)
        if turn is not None:
            turn.msgs = [m for m in turn.msgs if m.queue_offset != offset]
            if not turn.msgs:
                del self._turns[key]  # nothing left to retry: the key may run again
                self._ready_again(key)
            return found
        line = self._lines[key]
        was_head = line[0].queue_offset == offset
        line.remove(msg)
        if not line:
            del self._lines[key]
        elif was_head and key not in self._turns:
            self._ready_again(key)
        return found

    def clear(self) -> None:
        """Forget everything (the process queue was cleared)."""
        self._lines.clear()
        self._turns.clear()
        self._ready.clear()
        self._known.clear()

    def __repr__(self) -> str:
        return f"KeyBacklog(messages={len(self._known)}, keys={len(self._lines)}, turns={len(self._turns)})"
