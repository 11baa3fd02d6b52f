"""Broker-side queue locks for orderly consumption: RocketMQ 4.9.3's RebalanceLockManager, plus trimq's extras.

A consumer group's orderly consumers lock the message queues they were allocated (LOCK_BATCH_MQ) and renew
the locks every ``lock_interval_ms``; a lock nobody renews for more than ``max_live_ms`` may be taken over by
another client of the group. RocketMQ semantics kept exactly (ROCKETMQ_FACTS.md §3):

* a lock is *expired* when ``now - last_update_timestamp`` is **strictly greater** than ``max_live_ms``;
* checking a lock the caller owns renews it (the side effect of RocketMQ's private ``isLocked``);
* a lock held by another client is taken over ("stolen") only once it has expired;
* ``unlock_batch`` removes an entry only when the caller owns it, **whether or not it has expired**.

trimq adds, each documented where it is defined: a read-only table view for the admin CLI, HEAD's
``is_lock_all_expired``, ``live_owner`` / ``is_fenced`` for offset fencing (DESIGN.md §6.2),
``unlock_all_for_client`` for graceful leaves (DESIGN.md §6.1), counters for the metrics layer, and
detailed results so the broker can log ``lock.acquired`` / ``lock.stolen`` events.

This is a pure core: no I/O, no trio, time comes from the injected ``now_ms`` clock. RocketMQ guards the
table with one global ReentrantLock; here every method runs to completion without awaiting, so a single
trio thread gets the same atomicity for free. The class is not meant to be shared between OS threads.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field

from trimq.protocol.message_queue import MessageQueue

__all__ = [
    "DEFAULT_LOCK_MAX_LIVE_MS",
    "LockBatchResult",
    "LockInfo",
    "LockOutcome",
    "LockStats",
    "RebalanceLockManager",
    "UnlockBatchResult",
    "wall_clock_ms",
]

#: RocketMQ's ``rocketmq.broker.rebalance.lockMaxLiveTime`` default.
DEFAULT_LOCK_MAX_LIVE_MS = 60_000


def wall_clock_ms() -> int:
    """Milliseconds since the epoch, like Java's ``System.currentTimeMillis()`` (RocketMQ uses wall time)."""
    return time.time_ns() // 1_000_000


class LockOutcome(enum.Enum):
    """What one lock attempt did."""

    #: The queue was free (no entry), or its entry was the caller's own expired one: now held by the caller.
    ACQUIRED = "acquired"
    #: The caller already held a live lock: its timestamp was refreshed.
    RENEWED = "renewed"
    #: Another client's lock had expired and the caller took it over.
    STOLEN = "stolen"
    #: Another client holds a live lock: nothing changed.
    REFUSED = "refused"

    @property
    def locked(self) -> bool:
        """Whether the caller holds the lock after this attempt."""
        return self is not LockOutcome.REFUSED


@dataclass(slots=True)
class _LockEntry:
    # RocketMQ's LockEntry: the owner and when it last locked or renewed. ``max_live_ms`` (trimq) shortens
    # this entry's lifetime after its owner's connection closed (orphan_client); any lock or renewal clears it.
    client_id: str
    last_update_timestamp: int
    max_live_ms: int | None = None


@dataclass(frozen=True, slots=True)
class LockInfo:
    """One row of the lock table as the admin CLI shows it (a snapshot, not a live view)."""

    mq: MessageQueue
    client_id: str
    last_update_timestamp: int
    age_ms: int
    expired: bool


@dataclass(slots=True)
class LockStats:
    """Monotonic counters for the metrics layer; one increment per message queue, not per request."""

    acquired: int = 0  # free queue (or own expired lock) locked
    renewed: int = 0  # live lock re-locked or checked by its owner
    stolen: int = 0  # another client's expired lock taken over
    refused: int = 0  # lock attempt on a queue held live by another client
    unlocked: int = 0  # entry removed by its owner (unlock_batch or unlock_all_for_client)
    unlock_refused: int = 0  # unlock attempt on a queue owned by another client
    unlock_not_locked: int = 0  # unlock attempt on a queue (or group) with no entry

    def as_dict(self) -> dict[str, int]:
        """The counters by name, e.g. for a metrics exporter or a JSON admin answer."""
        return asdict(self)


@dataclass(slots=True)
class LockBatchResult:
    """Everything one ``try_lock_batch_detailed`` call did, so the broker can log and count it.

    ``stolen`` maps each taken-over queue to the client that held it; ``refused`` maps each refused queue to
    the client holding it live.
    """

    locked: set[MessageQueue] = field(default_factory=set)
    acquired: list[MessageQueue] = field(default_factory=list)
    renewed: list[MessageQueue] = field(default_factory=list)
    stolen: dict[MessageQueue, str] = field(default_factory=dict)
    refused: dict[MessageQueue, str] = field(default_factory=dict)
    #: Locked queues whose entry already belonged to the caller (renewed, or its own lapsed entry re-locked):
    #: nobody else held them since the caller's previous lock, so nobody else consumed them meanwhile.
    kept: set[MessageQueue] = field(default_factory=set)


@dataclass(slots=True)
class UnlockBatchResult:
    """Everything one ``unlock_batch_detailed`` call did.

    ``refused`` maps each queue the caller does not own to its actual owner; ``not_locked`` lists queues that
    had no entry (including every queue when the group is unknown).
    """

    unlocked: list[MessageQueue] = field(default_factory=list)
    refused: dict[MessageQueue, str] = field(default_factory=dict)
    not_locked: list[MessageQueue] = field(default_factory=list)


def _check_name(what: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty string, got {value!r}")
    return value


def _check_mq(value: object) -> MessageQueue:
    if not isinstance(value, MessageQueue):
        raise TypeError(f"expected a MessageQueue, got {type(value).__name__}: {value!r}")
    return value


def _unique_mqs(mqs: Iterable[MessageQueue]) -> list[MessageQueue]:
    # RocketMQ receives a Set; keep the caller's order (deterministic logs) but drop duplicates.
    return list(dict.fromkeys(_check_mq(mq) for mq in mqs))


class RebalanceLockManager:
    """The broker's table of queue locks: group -> message queue -> (owner client id, last update time).

    ``max_live_ms`` is RocketMQ's ``lockMaxLiveTime`` (default 60 000 ms); ``now_ms`` returns the current time
    in milliseconds (wall clock by default; tests inject a fake).
    """

    def __init__(self, max_live_ms: int = DEFAULT_LOCK_MAX_LIVE_MS, now_ms: Callable[[], int] = wall_clock_ms):
        if isinstance(max_live_ms, bool) or not isinstance(max_live_ms, int) or max_live_ms < 0:
            raise ValueError(f"max_live_ms must be a non-negative integer (milliseconds), got {max_live_ms!r}")
        self._max_live_ms = max_live_ms
        self._now_ms = now_ms
        self._table: dict[str, dict[MessageQueue, _LockEntry]] = {}
        # The last client each queue was locked by, kept after unlocks and expiries (offset_owner).
        self._last_holder: dict[str, dict[MessageQueue, str]] = {}
        self.stats = LockStats()

    @property
    def max_live_ms(self) -> int:
        """How long a lock stays live without renewal, in milliseconds."""
        return self._max_live_ms

    # ------------------------------------------------------------------ RocketMQ's operations

    def try_lock(self, group: str, mq: MessageQueue, client_id: str) -> bool:
        """Lock one queue for ``client_id``; True if the client holds it afterwards (RocketMQ ``tryLock``).

        Free queue -> locked; own live lock -> renewed; another client's expired lock -> taken over;
        another client's live lock -> False, nothing changes.
        """
        return self.try_lock_detailed(group, mq, client_id).locked

    def try_lock_detailed(self, group: str, mq: MessageQueue, client_id: str) -> LockOutcome:
        """Like ``try_lock`` but says what happened (acquired, renewed, stolen or refused)."""
        _check_name("group", group)
        _check_name("client_id", client_id)
        outcome, _ = self._lock_one(group, _check_mq(mq), client_id, self._now_ms())
        return outcome

    def try_lock_batch(self, group: str, mqs: Iterable[MessageQueue], client_id: str) -> set[MessageQueue]:
        """Lock every queue it can for ``client_id``; returns the queues the client now holds (``tryLockBatch``).

        Queues held live by other clients are skipped; the others are locked, renewed or taken over exactly
        as in ``try_lock``.
        """
        return self.try_lock_batch_detailed(group, mqs, client_id).locked

    def try_lock_batch_detailed(self, group: str, mqs: Iterable[MessageQueue], client_id: str) -> LockBatchResult:
        """Like ``try_lock_batch`` but reports per queue what happened, for event logs (``lock.stolen``...)."""
        _check_name("group", group)
        _check_name("client_id", client_id)
        queues = _unique_mqs(mqs)
        now = self._now_ms()
        result = LockBatchResult()
        for mq in queues:
            prior = self._table.get(group, {}).get(mq)
            if prior is not None and prior.client_id == client_id:
                result.kept.add(mq)  # its own entry: renewed or re-locked, never refused
            outcome, other = self._lock_one(group, mq, client_id, now)
            if outcome is LockOutcome.ACQUIRED:
                result.acquired.append(mq)
            elif outcome is LockOutcome.RENEWED:
                result.renewed.append(mq)
            elif outcome is LockOutcome.STOLEN:
                assert other is not None
                result.stolen[mq] = other
            else:
                assert other is not None
                result.refused[mq] = other
                continue
            result.locked.add(mq)
        return result

    def unlock_batch(self, group: str, mqs: Iterable[MessageQueue], client_id: str) -> None:
        """Release the queues ``client_id`` owns (RocketMQ ``unlockBatch``).

        An entry is removed only if its owner is ``client_id``; expiry is not considered, so an owner can
        still release a lock that has lapsed. Queues owned by others, unlocked queues and unknown groups are
        ignored (RocketMQ only logs a warning; see ``unlock_batch_detailed`` to learn which).
        """
        self.unlock_batch_detailed(group, mqs, client_id)

    def unlock_batch_detailed(self, group: str, mqs: Iterable[MessageQueue], client_id: str) -> UnlockBatchResult:
        """Like ``unlock_batch`` but reports what was unlocked, refused (with the owner) and not locked."""
        _check_name("group", group)
        _check_name("client_id", client_id)
        queues = _unique_mqs(mqs)
        result = UnlockBatchResult()
        entries = self._table.get(group)
        for mq in queues:
            entry = entries.get(mq) if entries is not None else None
            if entry is None:
                result.not_locked.append(mq)
                self.stats.unlock_not_locked += 1
            elif entry.client_id == client_id:
                assert entries is not None
                del entries[mq]
                result.unlocked.append(mq)
                self.stats.unlocked += 1
            else:
                result.refused[mq] = entry.client_id
                self.stats.unlock_refused += 1
        self._drop_if_empty(group)
        return result

    def is_locked(self, group: str, mq: MessageQueue, client_id: str) -> bool:
        """True if ``client_id`` holds a live lock on ``mq``, **and renews it** (RocketMQ's private isLocked).

        The renewal is RocketMQ's behaviour: asking on the owner's behalf counts as the owner's heartbeat.
        Use ``live_owner`` to look without touching the lock.
        """
        _check_name("group", group)
        _check_name("client_id", client_id)
        entry = self._table.get(group, {}).get(_check_mq(mq))
        now = self._now_ms()
        if entry is None or entry.client_id != client_id or self._expired(entry, now):
            return False
        entry.last_update_timestamp = now
        entry.max_live_ms = None
        self.stats.renewed += 1
        return True

    # ------------------------------------------------------------------ trimq's additions

    def is_lock_all_expired(self, group: str) -> bool:
        """True if the group has no locks or every one of them has expired (RocketMQ HEAD's isLockAllExpired)."""
        entries = self._table.get(group)
        if not entries:
            return True
        now = self._now_ms()
        return all(self._expired(entry, now) for entry in entries.values())

    def live_owner(self, group: str, mq: MessageQueue) -> str | None:
        """The client holding a live lock on ``mq`` in ``group``, or None; never renews (trimq, for fencing).

        The broker refuses offset updates for a queue from any client other than its live owner
        (DESIGN.md §6.2), so a paused ex-holder cannot rewind a queue another client now consumes.
        """
        entry = self._table.get(group, {}).get(_check_mq(mq))
        if entry is None or self._expired(entry, self._now_ms()):
            return None
        return entry.client_id

    def offset_owner(self, group: str, mq: MessageQueue) -> str | None:
        """The client that may move ``mq``'s consumer offset in ``group`` (trimq, for fencing): the holder of its
        live lock, else the last client that held it, else None (never locked since the broker started: anyone).

        The last holder matters between two owners: when one releases a queue and before the next locks it,
        a paused ex-owner waking up must not slip its stale offset in (found by the chaos suite). A new owner
        always locks before it commits. Never renews.
        """
        live = self.live_owner(group, mq)
        if live is not None:
            return live
        return self._last_holder.get(group, {}).get(mq)

    def is_fenced(self, group: str, mq: MessageQueue, client_id: str) -> bool:
        """True if another client holds a live lock on ``mq``, so ``client_id`` must not move its offset.

        A queue with no live lock is not fenced (concurrent consumers never lock). Never renews.
        """
        owner = self.live_owner(group, mq)
        return owner is not None and owner != client_id

    def orphan_client(self, client_id: str, max_live_ms: int) -> list[tuple[str, MessageQueue]]:
        """Shorten the life of every lock ``client_id`` holds to ``max_live_ms`` after its last renewal (never
        lengthen it); returns the (group, queue) pairs affected. trimq's addition, called when the client's
        connection closes (e.g. the process was SIGKILLed): RocketMQ keeps such locks the full 60 s.

        Safe when ``max_live_ms`` exceeds the client's own lock lifetime (30 s by default) plus network delay:
        a client stops consuming a queue once its lock is that old counted from when it *sent* the renewal,
        which is before the broker's ``last_update_timestamp``. A renewal over a new connection clears it.
        """
        _check_name("client_id", client_id)
        if isinstance(max_live_ms, bool) or not isinstance(max_live_ms, int) or max_live_ms < 0:
            raise ValueError(f"max_live_ms must be a non-negative integer (milliseconds), got {max_live_ms!r}")
        affected = []
        for group, entries in self._table.items():
            for mq, entry in entries.items():
                if entry.client_id != client_id:
                    continue
                current = self._max_live_ms if entry.max_live_ms is None else entry.max_live_ms
                entry.max_live_ms = min(current, max_live_ms)
                affected.append((group, mq))
        return affected

    def unlock_all_for_client(self, group: str, client_id: str) -> list[MessageQueue]:
        """Release every lock ``client_id`` owns in ``group``, live or expired; returns them sorted.

        trimq's addition (RocketMQ has nothing like it): the broker calls it when a client unregisters or its
        connection closes, so a gracefully leaving consumer frees its queues at once instead of making the
        next owner wait out ``max_live_ms`` (DESIGN.md §6.1).
        """
        _check_name("group", group)
        _check_name("client_id", client_id)
        entries = self._table.get(group)
        if not entries:
            return []
        released = sorted(mq for mq, entry in entries.items() if entry.client_id == client_id)
        for mq in released:
            del entries[mq]
        self.stats.unlocked += len(released)
        self._drop_if_empty(group)
        return released

    def groups(self) -> list[str]:
        """Groups that have at least one lock entry (live or expired), sorted."""
        return sorted(self._table)

    def lock_table(self, group: str) -> list[LockInfo]:
        """A snapshot of the group's lock entries, sorted by queue, with age and expiry at this instant."""
        entries = self._table.get(group)
        if not entries:
            return []
        now = self._now_ms()
        return [
            LockInfo(
                mq=mq,
                client_id=entry.client_id,
                last_update_timestamp=entry.last_update_timestamp,
                age_ms=now - entry.last_update_timestamp,
                expired=self._expired(entry, now),
            )
            for mq, entry in sorted(entries.items())
        ]

    def live_lock_count(self, group: str | None = None) -> int:
        """How many live locks there are, in one group or in all (the "locks held" gauge)."""
        now = self._now_ms()
        tables = [self._table.get(group, {})] if group is not None else list(self._table.values())
        return sum(1 for entries in tables for entry in entries.values() if not self._expired(entry, now))

    # ------------------------------------------------------------------ internals

    def _expired(self, entry: _LockEntry, now: int) -> bool:
        # Strictly greater: a lock exactly max_live_ms old is still live, as in RocketMQ's LockEntry.isExpired.
        limit = self._max_live_ms if entry.max_live_ms is None else entry.max_live_ms
        return now - entry.last_update_timestamp > limit

    def _lock_one(self, group: str, mq: MessageQueue, client_id: str, now: int) -> tuple[LockOutcome, str | None]:
        """One queue's lock attempt; returns the outcome and, when stolen or refused, the other client."""
        entries = self._table.setdefault(group, {})
        entry = entries.get(mq)
        if entry is None or entry.client_id == client_id or self._expired(entry, now):
            self._last_holder.setdefault(group, {})[mq] = client_id  # the caller holds it below (offset_owner)
        if entry is None:
            entries[mq] = _LockEntry(client_id, now)
            self.stats.acquired += 1
            return LockOutcome.ACQUIRED, None
        if not self._expired(entry, now):
            if entry.client_id == client_id:
                entry.last_update_timestamp = now
                entry.max_live_ms = None
                self.stats.renewed += 1
                return LockOutcome.RENEWED, None
            self.stats.refused += 1
            return LockOutcome.REFUSED, entry.client_id
        previous = entry.client_id
        entry.client_id = client_id
        entry.last_update_timestamp = now
        entry.max_live_ms = None
        if previous == client_id:
            # Re-locking one's own lapsed lock is a fresh acquisition, not a theft from another client.
            self.stats.acquired += 1
            return LockOutcome.ACQUIRED, None
        self.stats.stolen += 1
        return LockOutcome.STOLEN, previous

    def _drop_if_empty(self, group: str) -> None:
        # RocketMQ keeps empty group maps forever; dropping them keeps groups() meaningful and changes no answer.
        if group in self._table and not self._table[group]:
            del self._table[group]
