"""Delay levels: RocketMQ's ``messageDelayLevel`` table (ROCKETMQ_FACTS.md §6), a pure core.

A delayed or retried message carries a delay level (1-based). The store parks it in ``SCHEDULE_TOPIC_XXXX``
queue ``level - 1`` and the schedule service delivers it to its real topic once ``store time + delay`` has
passed. The spec is a space-separated list of ``<positive integer><unit>`` tokens, one per level; units are
RocketMQ's ``s m h d`` plus ``ms`` (trimq's addition, so tests can use ``"100ms 200ms 300ms"``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

__all__ = ["DEFAULT", "MAX_DELAY_MS", "UNITS_MS", "DelayLevelTable"]

#: RocketMQ's default ``messageDelayLevel``: 18 levels, 1 s ... 2 h.
DEFAULT = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"

#: Milliseconds per unit, largest first (the order ``spec`` uses to pick the most readable unit).
UNITS_MS: dict[str, int] = {"d": 86_400_000, "h": 3_600_000, "m": 60_000, "s": 1_000, "ms": 1}

#: Upper bound for one level (36 500 days): keeps ``store timestamp + delay`` well inside a signed 64-bit
#: value, which is what the consume queue's tags-code field holds.
MAX_DELAY_MS = 36_500 * UNITS_MS["d"]

# ASCII digits only: int() would accept other Unicode digits, which no config file means.
_TOKEN = re.compile(r"([0-9]+)(ms|s|m|h|d)")
_FORM = "a space-separated list of <positive integer><unit> tokens with unit ms, s, m, h or d, e.g. '1s 5s 2m'"


def _check_int(what: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{what} must be an integer, got {value!r}")
    return value


class DelayLevelTable:
    """Immutable table of delays in milliseconds, level 1 first.

    Build it with ``DelayLevelTable.parse(spec)`` or directly from the delays. Two tables are equal when their
    delays are; ``spec`` gives back a canonical spec string (``parse(t.spec) == t``).
    """

    __slots__ = ("_delays",)

    def __init__(self, delays_ms: Iterable[int]):
        delays = tuple(delays_ms)
        if not delays:
            raise ValueError("a delay-level table needs at least one level")
        for level, delay in enumerate(delays, start=1):
            _check_int(f"delay of level {level}", delay)
            if not 0 < delay <= MAX_DELAY_MS:
                raise ValueError(f"delay of level {level} must be in 1..{MAX_DELAY_MS} ms, got {delay}")
        self._delays = delays

    @classmethod
    def parse(cls, spec: str = DEFAULT) -> DelayLevelTable:
        """Parse a ``messageDelayLevel`` spec such as ``"1s 5s 10s 30s 1m"``.

        Tokens are separated by whitespace. A bad token raises ValueError naming it, its level and the
        allowed form. Unlike RocketMQ, a zero delay is rejected (a level that does not delay is a mistake).
        """
        if not isinstance(spec, str):
            raise TypeError(f"a delay-level spec must be a string, got {type(spec).__name__}")
        tokens = spec.split()
        if not tokens:
            raise ValueError(f"empty delay-level spec {spec!r}: expected {_FORM}")
        delays = []
        for level, token in enumerate(tokens, start=1):
            match = _TOKEN.fullmatch(token)
            if match is None:
                raise ValueError(f"bad delay-level token {token!r} (level {level}) in {spec!r}: expected {_FORM}")
            delay = int(match.group(1)) * UNITS_MS[match.group(2)]
            if not 0 < delay <= MAX_DELAY_MS:
                raise ValueError(
                    f"bad delay-level token {token!r} (level {level}) in {spec!r}: the delay must be positive "
                    f"and at most {MAX_DELAY_MS // UNITS_MS['d']}d"
                )
            delays.append(delay)
        return cls(delays)

    @property
    def spec(self) -> str:
        """The canonical spec: each delay in the largest unit that divides it exactly (60s -> 1m)."""
        return " ".join(_format_delay(delay) for delay in self._delays)

    @property
    def max_level(self) -> int:
        """The highest level (RocketMQ ``maxDelayLevel``): the number of levels."""
        return len(self._delays)

    @property
    def delays_ms(self) -> tuple[int, ...]:
        """The delays in milliseconds, level 1 first."""
        return self._delays

    def delay_ms(self, level: int) -> int:
        """The delay of ``level`` (1-based) in milliseconds; ValueError outside 1..max_level."""
        return self._delays[self._check_level(level) - 1]

    def clamp(self, level: int) -> int:
        """A level above ``max_level`` becomes ``max_level``, as RocketMQ's CommitLog does when storing.

        Only positive levels mean "delay" (0 or less means none, and the caller must not schedule the
        message), so a level below 1 raises ValueError.
        """
        _check_int("delay level", level)
        if level < 1:
            raise ValueError(f"delay level must be >= 1 to be scheduled, got {level}")
        return min(level, self.max_level)

    def due_time(self, level: int, store_timestamp_ms: int) -> int:
        """When a message stored at ``store_timestamp_ms`` with ``level`` is due: store time + the delay."""
        return _check_int("store timestamp", store_timestamp_ms) + self.delay_ms(level)

    def compute_deliver_timestamp(self, level: int, store_timestamp_ms: int) -> int:
        """RocketMQ's ``computeDeliverTimestamp``: ``due_time``, but an unknown level gives store time + 1 s.

        The lenient fallback is for records already on disk (e.g. dispatched after the spec was shortened),
        where refusing would stall the schedule queue; new messages are clamped before they are stored.
        """
        _check_int("store timestamp", store_timestamp_ms)
        if _check_int("delay level", level) < 1 or level > self.max_level:
            return store_timestamp_ms + 1_000
        return store_timestamp_ms + self._delays[level - 1]

    def correct_deliver_timestamp(self, now_ms: int, deliver_ts: int, level: int) -> int:
        """RocketMQ's ``ScheduleMessageService.correctDeliverTimestamp``: distrust a due time too far ahead.

        A message of ``level`` can never be due more than one delay after now; if ``deliver_ts`` is later than
        ``now_ms + delay_ms(level)`` (the clock went back, or the stored value is bad), RocketMQ 4.9.3 returns
        ``now_ms``, i.e. delivers at once rather than parking the message for an unbounded time. Otherwise
        ``deliver_ts`` is returned unchanged.
        """
        _check_int("now", now_ms)
        _check_int("deliver timestamp", deliver_ts)
        if deliver_ts > now_ms + self.delay_ms(level):
            return now_ms
        return deliver_ts

    def queue_id_for(self, level: int) -> int:
        """The ``SCHEDULE_TOPIC_XXXX`` queue id holding ``level`` (RocketMQ ``delayLevel2QueueId``): level - 1."""
        return self._check_level(level) - 1

    def level_for_queue(self, queue_id: int) -> int:
        """The level a ``SCHEDULE_TOPIC_XXXX`` queue holds (RocketMQ ``queueId2DelayLevel``): queue id + 1."""
        _check_int("schedule queue id", queue_id)
        if not 0 <= queue_id < self.max_level:
            raise ValueError(f"schedule queue id must be in 0..{self.max_level - 1}, got {queue_id}")
        return queue_id + 1

    def levels(self) -> range:
        """All levels, ``1..max_level``."""
        return range(1, self.max_level + 1)

    def items(self) -> Iterator[tuple[int, int]]:
        """``(level, delay_ms)`` pairs, level 1 first."""
        return enumerate(self._delays, start=1)

    def __len__(self) -> int:
        return len(self._delays)

    def __iter__(self) -> Iterator[int]:
        """The delays in milliseconds, level 1 first (use ``items()`` for the levels too)."""
        return iter(self._delays)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DelayLevelTable):
            return NotImplemented
        return self._delays == other._delays

    def __hash__(self) -> int:
        return hash(self._delays)

    def __repr__(self) -> str:
        return f"DelayLevelTable.parse({self.spec!r})"

    def _check_level(self, level: int) -> int:
        _check_int("delay level", level)
        if not 1 <= level <= self.max_level:
            raise ValueError(f"delay level must be in 1..{self.max_level}, got {level}")
        return level


def _format_delay(delay_ms: int) -> str:
    for unit, size in UNITS_MS.items():
        if delay_ms % size == 0:
            return f"{delay_ms // size}{unit}"
    raise AssertionError("unreachable: every delay is a whole number of ms")
