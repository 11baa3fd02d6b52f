"""Broker-side queue locks for orderly consumption: RocketMQ 4.9.3's RebalanceLockManager as leases, plus extras.

A consumer group's orderly consumers lock the message queues they were allocated (LOCK_BATCH_MQ) and renew the
locks; a lock is a **lease** of ``max_live_ms``: its holder may start work under it until ``max_live_ms`` after
it *sent* the renewal, and another client of the group may take it over only once it is older than
``takeover_after_ms`` = ``max_live_ms`` + ``takeover_margin_ms`` (the margin covers clock-rate drift between the
holder's clock and the broker's, and the holder's scheduling delay: docs/PROTOCOL.md "Queue-lock leases").
With a zero margin and ``max_live_ms`` 60 000 this is RocketMQ exactly (ROCKETMQ_FACTS.md §3):

* a lock is *expired* (may be taken over) when ``now - last_update_timestamp`` is **strictly greater** than
  ``takeover_after_ms``;
* checking a lock the caller owns renews it (the side effect of RocketMQ's private ``isLocked``);
* a lock held by another client is taken over ("stolen") only once it has expired;
* ``unlock_batch`` removes an entry only when the caller owns it, **whether or not it has expired**.

trimq adds, each documented where it is defined:

* a **fencing epoch** per grant (DESIGN.md §6.9): ``(broker_epoch << 32) | counter``, where ``counter`` grows,
  per (group, queue), with every grant to a holder that did not hold the lock continuously (a free queue
  locked, an expired lock taken over) and ``broker_epoch`` grows with every broker start, so no later grant
  compares lower than an earlier one; renewals keep the epoch. ``current_epoch`` is what offset commits are
  fenced against;
* ``release_client_after``: a client whose connection closed loses its locks after a short grace, unless it
  renews them (over a new connection) in time;
* a **restart grace** (``begin_restart_grace``): a restarted broker, whose table is empty, grants a queue to
  nobody but its *claimant* (the client that says it still holds a lease on it, with the epoch it holds)
  until the longest lease it could have granted before the restart has run out;
* a read-only table view for the admin CLI, HEAD's ``is_lock_all_expired``, ``live_owner`` / ``offset_owner`` /
  ``is_fenced`` for owner-based fencing of commits that carry no epoch (DESIGN.md §6.2),
  ``unlock_all_for_client`` for graceful leaves (DESIGN.md §6.1), counters for the metrics layer, and
  detailed results so the broker can log ``lock.acquired`` / ``lock.stolen`` events.

This is a pure core: no I/O, no trio, time comes from the injected ``now_ms`` clock. RocketMQ guards the
table with one global ReentrantLock; here every method runs to completion without awaiting, so a single
trio thread gets the same atomicity for free. The class is not meant to be shared between OS threads.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field

from trimq.protocol.message_queue import MessageQueue

__all__ = [
    "DEFAULT_LOCK_MAX_LIVE_MS",
    "EPOCH_COUNTER_BITS",
    "RESTART_GRACE_OWNER",
    "LockBatchResult",
    "LockInfo",
    "LockOutcome",
    "LockStats",
    "RebalanceLockManager",
    "UnlockBatchResult",
    "make_epoch",
    "split_epoch",
    "wall_clock_ms",
]

#: RocketMQ's ``rocketmq.broker.rebalance.lockMaxLiveTime`` default.
DEFAULT_LOCK_MAX_LIVE_MS = 60_000
#: Low bits of a fencing epoch holding the per-(group, queue) grant counter; the broker epoch is above them.
EPOCH_COUNTER_BITS = 32
_COUNTER_MASK = (1 << EPOCH_COUNTER_BITS) - 1
#: The owner reported for a queue refused because of the restart grace (nobody holds it yet).
RESTART_GRACE_OWNER = "(restart grace)"


def make_epoch(broker_epoch: int, counter: int) -> int:
    """The fencing epoch ``(broker_epoch << 32) | counter`` (an int64 while broker_epoch < 2**31)."""
    if broker_epoch < 0 or not 0 <= counter <= _COUNTER_MASK:
        raise ValueError(f"epoch parts out of range: broker_epoch={broker_epoch}, counter={counter}")
    return (broker_epoch << EPOCH_COUNTER_BITS) | counter


def split_epoch(epoch: int) -> tuple[int, int]:
    """``(broker_epoch, counter)`` of a fencing epoch (for logs and the admin CLI)."""
    return epoch >> EPOCH_COUNTER_BITS, epoch & _COUNTER_MASK


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
    #: Another client holds a live lock (or the restart grace keeps the queue for its claimant): nothing changed.
    REFUSED = "refused"

    @property
    def locked(self) -> bool:
        """Whether the caller holds the lock after this attempt."""
        return self is not LockOutcome.REFUSED


@dataclass(slots=True)
class _LockEntry:
    # RocketMQ's LockEntry: the owner and when it last locked or renewed; trimq adds the grant's fencing epoch
    # and ``release_at``, the broker time after which the entry counts as expired because its owner's
    # connection closed (release_client_after); any lock or renewal by the owner clears it.
    client_id: str
    last_update_timestamp: int
    epoch: int = 0
    release_at: int | None = None


@dataclass(frozen=True, slots=True)
class LockInfo:
    """One row of the lock table as the admin CLI shows it (a snapshot, not a live view)."""

    mq: MessageQueue
    client_id: str
    last_update_timestamp: int
    age_ms: int
    expired: bool
    epoch: int = 0
    releasing: bool = False  # its owner's connection closed: released at the end of the grace unless renewed


@dataclass(slots=True)
class LockStats:
    """Monotonic counters for the metrics layer; one increment per message queue, not per request."""

    acquired: int = 0  # free queue (or own expired lock) locked
    renewed: int = 0  # live lock re-locked or checked by its owner
    stolen: int = 0  # another client's expired lock taken over
    refused: int = 0  # lock attempt on a queue held live by another client (or kept by the restart grace)
    unlocked: int = 0  # entry removed by its owner (unlock_batch or unlock_all_for_client)
    unlock_refused: int = 0  # unlock attempt on a queue owned by another client
    unlock_not_locked: int = 0  # unlock attempt on a queue (or group) with no entry
    claimed: int = 0  # queue granted to its claimant during the restart grace
    released_on_disconnect: int = 0  # lock set to be released because its owner's connection closed

    def as_dict(self) -> dict[str, int]:
        """The counters by name, e.g. for a metrics exporter or a JSON admin answer."""
        return asdict(self)


@dataclass(slots=True)
class LockBatchResult:
    """Everything one ``try_lock_batch_detailed`` call did, so the broker can log and count it.

    ``stolen`` maps each taken-over queue to the client that held it; ``refused`` maps each refused queue to
    the client holding it live (``RESTART_GRACE_OWNER`` when the restart grace kept it); ``epochs`` gives the
    fencing epoch of every locked queue.
    """

    locked: set[MessageQueue] = field(default_factory=set)
    acquired: list[MessageQueue] = field(default_factory=list)
    renewed: list[MessageQueue] = field(default_factory=list)
    stolen: dict[MessageQueue, str] = field(default_factory=dict)
    refused: dict[MessageQueue, str] = field(default_factory=dict)
    #: Locked queues whose entry already belonged to the caller (renewed, or its own lapsed entry re-locked),
    #: or that were granted to it as their claimant during the restart grace: nobody else held them since the
    #: caller's previous lock, so nobody else consumed them meanwhile.
    kept: set[MessageQueue] = field(default_factory=set)
    epochs: dict[MessageQueue, int] = field(default_factory=dict)
    claimed: list[MessageQueue] = field(default_factory=list)


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


def _check_ms(what: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{what} must be a non-negative integer (milliseconds), got {value!r}")
    return value


def _unique_mqs(mqs: Iterable[MessageQueue]) -> list[MessageQueue]:
    # RocketMQ receives a Set; keep the caller's order (deterministic logs) but drop duplicates.
    return list(dict.fromkeys(_check_mq(mq) for mq in mqs))


class RebalanceLockManager:
    """The broker's table of queue locks: group -> message queue -> (owner, last update time, epoch).

    ``max_live_ms`` is the lease a holder is granted (RocketMQ's ``lockMaxLiveTime``, default 60 000 ms;
    trimq's broker passes ``lease_ms``); ``takeover_margin_ms`` is added before another client may take an
    unrenewed lock over (0: RocketMQ); ``broker_epoch`` is the high half of every fencing epoch this manager
    grants; ``now_ms`` returns the current time in milliseconds (wall clock by default; tests inject a fake).
    """

    def __init__(self, max_live_ms: int = DEFAULT_LOCK_MAX_LIVE_MS, now_ms: Callable[[], int] = wall_clock_ms, *,
                 takeover_margin_ms: int = 0, broker_epoch: int = 0) -> None:
        self._max_live_ms = _check_ms("max_live_ms", max_live_ms)
        self._margin_ms = _check_ms("takeover_margin_ms", takeover_margin_ms)
        if isinstance(broker_epoch, bool) or not isinstance(broker_epoch, int) or not 0 <= broker_epoch < 2**31:
            raise ValueError(f"broker_epoch must be an integer in [0, 2**31), got {broker_epoch!r}")
        self._broker_epoch = broker_epoch
        self._now_ms = now_ms
        self._table: dict[str, dict[MessageQueue, _LockEntry]] = {}
        # The last client each queue was locked by, kept after unlocks and expiries (offset_owner).
        self._last_holder: dict[str, dict[MessageQueue, str]] = {}
        # The epoch of the latest grant of each queue in this broker lifetime, kept after unlocks and expiries.
        self._last_epoch: dict[str, dict[MessageQueue, int]] = {}
        self._grace_until: int | None = None
        self.stats = LockStats()

    @property
    def max_live_ms(self) -> int:
        """The lease: how long a holder may rely on a lock after it sent the request that renewed it."""
        return self._max_live_ms

    @property
    def takeover_after_ms(self) -> int:
        """How old an unrenewed lock must be (strictly) before another client may take it over."""
        return self._max_live_ms + self._margin_ms

    @property
    def broker_epoch(self) -> int:
        """The high half of every epoch granted by this manager (grows with every broker start)."""
        return self._broker_epoch

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
        outcome, _, _ = self._lock_one(group, _check_mq(mq), client_id, self._now_ms(), None)
        return outcome

    def try_lock_batch(self, group: str, mqs: Iterable[MessageQueue], client_id: str) -> set[MessageQueue]:
        """Lock every queue it can for ``client_id``; returns the queues the client now holds (``tryLockBatch``).

        Queues held live by other clients are skipped; the others are locked, renewed or taken over exactly
        as in ``try_lock``.
        """
        return self.try_lock_batch_detailed(group, mqs, client_id).locked

    def try_lock_batch_detailed(self, group: str, mqs: Iterable[MessageQueue], client_id: str,
                                claims: Mapping[MessageQueue, int] | None = None) -> LockBatchResult:
        """Like ``try_lock_batch`` but reports per queue what happened, for event logs (``lock.stolen``...).

        ``claims`` (trimq) maps queues to the epoch the caller says it still holds them under: during the
        restart grace a free queue is granted only to a claimant (``claimed``, counted as ``kept``); outside
        it, claims change nothing.
        """
        _check_name("group", group)
        _check_name("client_id", client_id)
        queues = _unique_mqs(mqs)
        now = self._now_ms()
        result = LockBatchResult()
        for mq in queues:
            prior = self._table.get(group, {}).get(mq)
            prior_owner = prior.client_id if prior is not None else None  # before _lock_one changes the entry
            claim = claims.get(mq) if claims else None
            outcome, other, claimed = self._lock_one(group, mq, client_id, now, claim)
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
            if claimed:
                result.claimed.append(mq)
            if claimed or prior_owner == client_id:
                result.kept.add(mq)  # its own entry (renewed or re-locked), or its own lease across a restart
            result.locked.add(mq)
            result.epochs[mq] = self._table[group][mq].epoch
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
        entry.release_at = None
        self.stats.renewed += 1
        return True

    # ------------------------------------------------------------------ trimq's additions

    def start_lifetime(self, broker_epoch: int, restart_grace_ms: int) -> None:
        """Begin a broker lifetime: grant epochs above ``broker_epoch`` from now on (broker/store/epoch.py) and,
        when ``restart_grace_ms`` > 0, keep free queues for their claimants that long (``begin_restart_grace``)."""
        if isinstance(broker_epoch, bool) or not isinstance(broker_epoch, int) or not 0 <= broker_epoch < 2**31:
            raise ValueError(f"broker_epoch must be an integer in [0, 2**31), got {broker_epoch!r}")
        self._broker_epoch = broker_epoch
        if restart_grace_ms > 0:
            self.begin_restart_grace(restart_grace_ms)

    def begin_restart_grace(self, grace_ms: int) -> None:
        """Keep free queues for their claimants for ``grace_ms`` from now (call when the broker starts serving).

        ``grace_ms`` should be the longest ``takeover_after_ms`` the previous broker lifetime could have granted:
        until then a client may still be working under a lease from before the restart, and only it may
        lock the queue again (NFS-style lease recovery).
        """
        self._grace_until = self._now_ms() + _check_ms("grace_ms", grace_ms)

    def in_restart_grace(self) -> bool:
        """True while the restart grace lasts."""
        return self._grace_until is not None and self._now_ms() <= self._grace_until

    def restart_grace_remaining_ms(self) -> int:
        """Milliseconds until the restart grace is over (0 when it is)."""
        if self._grace_until is None:
            return 0
        return max(0, self._grace_until - self._now_ms() + 1)  # strictly after grace_until

    def current_epoch(self, group: str, mq: MessageQueue) -> int | None:
        """The epoch of the latest grant of ``mq`` in ``group`` since this broker started (live, released or
        expired), None if it was never locked since. Offset commits carrying an older epoch are refused."""
        return self._last_epoch.get(group, {}).get(_check_mq(mq))

    def release_client_after(self, client_id: str, grace_ms: int) -> list[tuple[str, MessageQueue]]:
        """Make every lock ``client_id`` holds expire ``grace_ms`` from now (never later than already set);
        returns the (group, queue) pairs affected. Called when the client's connection closed: a process
        that died releases its queues after the grace instead of after the lease. A renewal by the client
        within the grace (over a new connection) keeps them.

        Safe because a client stops starting new batches on a broker's queues the moment its connection to
        that broker drops (client.rebalance.impl), and the grace covers the closing of that connection reaching
        both ends.
        """
        _check_name("client_id", client_id)
        release_at = self._now_ms() + _check_ms("grace_ms", grace_ms)
        affected = []
        for group, entries in self._table.items():
            for mq, entry in entries.items():
                if entry.client_id != client_id:
                    continue
                if entry.release_at is None:
                    self.stats.released_on_disconnect += 1
                entry.release_at = release_at if entry.release_at is None else min(entry.release_at, release_at)
                affected.append((group, mq))
        return affected

    def drop_released(self) -> list[tuple[str, MessageQueue, str]]:
        """Remove the entries whose disconnect grace has passed; returns (group, queue, former owner).

        Optional tidying (such entries already count as expired): keeps the admin table free of dead clients.
        """
        now = self._now_ms()
        out = []
        for group, entries in list(self._table.items()):
            for mq, entry in list(entries.items()):
                if entry.release_at is not None and now > entry.release_at:
                    del entries[mq]
                    out.append((group, mq, entry.client_id))
            self._drop_if_empty(group)
        return out

    def is_lock_all_expired(self, group: str) -> bool:
        """True if the group has no locks or every one of them has expired (RocketMQ HEAD's isLockAllExpired)."""
        entries = self._table.get(group)
        if not entries:
            return True
        now = self._now_ms()
        return all(self._expired(entry, now) for entry in entries.values())

    def live_owner(self, group: str, mq: MessageQueue) -> str | None:
        """The client holding a live lock on ``mq`` in ``group``, or None; never renews (trimq, for fencing).

        The broker refuses offset updates that carry no epoch for a queue from any client other than its live
        owner (DESIGN.md §6.2), so a paused ex-holder cannot rewind a queue another client now consumes.
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

    def unlock_all_for_client(self, group: str, client_id: str) -> list[MessageQueue]:
        """Release every lock ``client_id`` owns in ``group``, live or expired; returns them sorted.

        trimq's addition (RocketMQ has nothing like it): the broker calls it when a client unregisters, so a
        gracefully leaving consumer frees its queues at once instead of making the next owner wait out the
        lease (DESIGN.md §6.1).
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

    def client_queues(self, group: str, client_id: str) -> list[MessageQueue]:
        """The queues whose entry (live or not) belongs to ``client_id`` in ``group``, sorted."""
        return sorted(mq for mq, e in self._table.get(group, {}).items() if e.client_id == client_id)

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
                epoch=entry.epoch,
                releasing=entry.release_at is not None,
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
        # Strictly greater: a lock exactly takeover_after_ms old is still live, as in RocketMQ's LockEntry.isExpired.
        if entry.release_at is not None and now > entry.release_at:
            return True
        return now - entry.last_update_timestamp > self._max_live_ms + self._margin_ms

    def _new_epoch(self, group: str, mq: MessageQueue) -> int:
        epochs = self._last_epoch.setdefault(group, {})
        previous = epochs.get(mq)
        counter = 1 if previous is None else (previous & _COUNTER_MASK) + 1
        epoch = make_epoch(self._broker_epoch, min(counter, _COUNTER_MASK))
        epochs[mq] = epoch
        return epoch

    def _lock_one(self, group: str, mq: MessageQueue, client_id: str, now: int,
                  claim: int | None) -> tuple[LockOutcome, str | None, bool]:
        """One queue's lock attempt: (outcome, the other client when stolen or refused, granted as a claim)."""
        entries = self._table.setdefault(group, {})
        entry = entries.get(mq)
        if entry is None:
            claimed = False
            if self._grace_until is not None and now <= self._grace_until:
                if claim is None:
                    # Restart grace: a client may still work under a lease granted before the restart; only it
                    # (its claim) may have the queue until that lease has surely run out.
                    self.stats.refused += 1
                    self._drop_if_empty(group)
                    return LockOutcome.REFUSED, RESTART_GRACE_OWNER, False
                claimed = True
                self.stats.claimed += 1
            self._last_holder.setdefault(group, {})[mq] = client_id  # the caller holds it (offset_owner)
            entries[mq] = _LockEntry(client_id, now, self._new_epoch(group, mq))
            self.stats.acquired += 1
            return LockOutcome.ACQUIRED, None, claimed
        if not self._expired(entry, now):
            if entry.client_id == client_id:
                entry.last_update_timestamp = now
                entry.release_at = None
                self.stats.renewed += 1
                return LockOutcome.RENEWED, None, False
            self.stats.refused += 1
            return LockOutcome.REFUSED, entry.client_id, False
        previous = entry.client_id
        self._last_holder.setdefault(group, {})[mq] = client_id
        entry.client_id = client_id
        entry.last_update_timestamp = now
        entry.release_at = None
        if previous == client_id:
            # Re-locking one's own lapsed lock is a fresh acquisition, not a theft from another client; nobody
            # held it in between, so the grant continues (same epoch).
            self.stats.acquired += 1
            return LockOutcome.ACQUIRED, None, False
        entry.epoch = self._new_epoch(group, mq)
        self.stats.stolen += 1
        return LockOutcome.STOLEN, previous, False

    def _drop_if_empty(self, group: str) -> None:
        # RocketMQ keeps empty group maps forever; dropping them keeps groups() meaningful and changes no answer.
        if group in self._table and not self._table[group]:
            del self._table[group]
