"""Consumer offsets: where each consumer group is in each queue (RocketMQ's ConsumerOffsetManager), with fencing.

The table is ``"topic@group" -> queue id -> offset`` (the next offset the group will consume), persisted to
``<store>/config/consumerOffset.json`` in RocketMQ's layout ``{"offsetTable": {"topic@group": {"0": 12}}}``;
the coordination service writes it atomically every ``flush_consumer_offset_interval_ms`` and at shutdown.

Two deliberate differences from RocketMQ:

* **Deterministic start** (DESIGN.md §6.3): a queue with no stored offset answers -1 (QUERY_NOT_FOUND on the
  wire) always, so the client's ``consume_from_where`` decides. RocketMQ answers 0 instead when the queue's
  min offset is 0 and its first message is still in memory, which makes new groups replay old messages.
* **Fencing by epoch** (DESIGN.md §6.9, issue 14): an update carrying a lock epoch (the fencing token of the
  lock grant its sender consumed under, broker/locks.py) is refused when that epoch is older than the
  queue's latest grant: a paused or cut-off ex-holder cannot rewind a queue whose lock has been granted to
  someone since, whatever the lock table says now. Refusals are logged (rate-limited) and counted in
  ``fenced_updates``.
* **Reset generation** (issue 19): every offset reset of a group's topic (INVOKE_BROKER_TO_RESET_OFFSET) bumps
  that ``topic@group``'s generation; members learn it from QUERY_CONSUMER_OFFSET and from the reset
  notification, and their commits (UPDATE_CONSUMER_OFFSET, a pull's commit offset) carry the generation their
  offset was read under (``resetGeneration``). A commit carrying an older generation was made before a reset
  it did not see — a oneway commit on the wire, a member whose notification failed — and is refused, so it
  cannot write the old position back over the reset. Locks play no part: it works for concurrent groups too.
  Commits without the field (RocketMQ's clients) are judged as before. The table is persisted with the
  offsets (``resetGenerationTable``, which RocketMQ ignores) and never goes back.
* **Commit versions** (issue 15, HA): every change of a queue's offset stamps it with a commit version ``(reset
  generation, lock epoch, sequence)``. The lock epoch is the newest fencing epoch any commit of the queue carried (a
  high-water mark: a commit without one keeps it); the sequence is a hybrid logical clock, ``max(previous + 1, wall
  ms)``, so it grows with every change of the queue on one broker and orders changes made on a master and on its
  slave (while the master was away) by when they were made. A commit made under a newer lock grant therefore wins
  over one made later under an older grant (chaos seed 87: a paused ex-holder's commit to the slave, handed to the
  returning master, rewound the queue its successor had consumed). A slave's metadata sync merges its master's table
  with its own by these versions (broker/store/offset_merge.py), never by the larger offset, and hands the master
  the offsets committed on the slave that are newer (``local_changes``). Persisted as ``commitVersionTable`` and
  ``commitLockEpochTable``. The same high-water mark fences commits: an epoch older than the queue's latest commit
  is refused even where no lock was granted since (a slave, a restarted master).
* **Fencing by owner** (DESIGN.md §6.2), for updates without an epoch (pull commit offsets, older clients):
  for a group consuming orderly, an update for a queue whose *live* broker lock belongs to another client is
  refused the same way. A queue nobody holds live accepts them from anyone (RocketMQ compatibility:
  concurrent consumers never lock).

Pure bookkeeping apart from ``load`` / ``persist`` (blocking file I/O, which the service runs in a thread):
no trio import, time injected.
"""

from __future__ import annotations

import os
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from trimq.broker.store.atomic import StateFileError, read_json, write_json_atomic
from trimq.broker.store.offset_merge import (
    CommitVersion,
    decode_removed,
    decode_versions,
    encode_removed,
    encode_versions,
)
from trimq.protocol.message_queue import MessageQueue
from trimq.runtime.logs import RateLimiter, get_logger, log_rate_limited

log = get_logger("trimq.broker.offsets")

__all__ = ["ConsumerOffsetManager", "OffsetStoreError", "QueueProgress", "offset_file_path"]

TOPIC_GROUP_SEPARATOR = "@"

#: Removed queues remembered (with the version of their removal) for slaves that have not synced since: kept in the
#: offset file, so a restarted master still tells a returning slave; past this many, the oldest are forgotten (a
#: slave that missed one keeps that queue's offset, as RocketMQ's slaves keep every offset).
REMOVED_OFFSETS_KEPT = 10_000


class OffsetStoreError(StateFileError):
    """The consumer offset file exists but is not a RocketMQ-style offset table."""


class _LockView(Protocol):
    def live_owner(self, group: str, mq: MessageQueue) -> str | None: ...

    def offset_owner(self, group: str, mq: MessageQueue) -> str | None: ...

    def current_epoch(self, group: str, mq: MessageQueue) -> int | None: ...


class _StoreView(Protocol):
    def get_max_offset_in_queue(self, topic: str, queue_id: int) -> int: ...


def offset_file_path(store_dir: str) -> str:
    """``<store>/config/consumerOffset.json``, RocketMQ's place for it."""
    return os.path.join(store_dir, "config", "consumerOffset.json")


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True, slots=True)
class QueueProgress:
    """One queue's consume progress for one group (a row of GET_CONSUME_STATS).

    ``consumer_offset`` is -1 when nothing is stored; ``broker_offset`` and ``lag`` are -1 when the broker has
    no store to ask. ``last_timestamp`` is RocketMQ's lastTimestamp (store time of the last consumed message,
    0 when unknown); ``last_update_timestamp`` is when the group last committed this offset (0: not since
    this broker started).
    """

    topic: str
    queue_id: int
    broker_offset: int
    consumer_offset: int
    lag: int
    last_timestamp: int
    last_update_timestamp: int


class ConsumerOffsetManager:
    """Consumer offsets of every group on this broker.

    ``path`` is the JSON file (None: memory only, for tests). ``lock_manager`` provides ``live_owner`` for
    fencing and ``is_orderly(group)`` says whether a group consumes orderly; without a lock manager nothing is
    fenced. ``broker_name`` builds the MessageQueue looked up in the lock table. ``now_ms`` is the wall clock
    (update stamps and log rate limiting).
    """

    def __init__(
        self,
        path: str | None = None,
        *,
        broker_name: str = "broker-a",
        lock_manager: _LockView | None = None,
        is_orderly: Callable[[str], bool] = lambda group: False,
        now_ms: Callable[[], int] = _wall_ms,
        fenced_log_interval_ms: int = 10_000,
    ) -> None:
        self.path = path
        self.broker_name = broker_name
        self.lock_manager = lock_manager
        self.is_orderly = is_orderly
        self._now_ms = now_ms
        self._table: dict[str, dict[int, int]] = {}
        self._updated_at: dict[tuple[str, int], int] = {}
        self._version = 0
        self._persisted_version = 0
        self._fenced_log = RateLimiter(fenced_log_interval_ms)
        #: Refused (fenced) updates per group, for metrics and the admin CLI.
        self.fenced_updates: Counter[str] = Counter()
        #: Applied updates in total.
        self.applied_updates = 0
        #: Pull commit offsets ignored because the stored offset was already further (see commit_offset).
        self.stale_pull_commits = 0
        self._reset_generations: dict[str, int] = {}  # "topic@group" -> generation (0: never reset)
        #: ("topic@group", queue id) -> commit version (reset generation, lock epoch, sequence) of the queue's offset.
        self._commit_versions: dict[tuple[str, int], CommitVersion] = {}
        #: Queues whose offset changed here (a commit or a reset) rather than by a merge from another broker: what
        #: a slave hands its master (broker/store/offset_merge.py); cleared once the master has them.
        self.local_changes: set[tuple[str, int]] = set()
        #: Commits refused per group because they were made before a reset (an older reset generation).
        self.stale_generation_updates: Counter[str] = Counter()
        #: Names this table's change serials (new at every start), so a slave that asks for the changes since a serial
        #: of another lifetime gets the whole table (GET_ALL_CONSUMER_OFFSET's incremental form).
        self.table_id = uuid.uuid4().hex
        #: Counts every change of an offset, a commit version or a reset generation in this lifetime; each queue and
        #: key remembers the serial of its last change (in memory only: a restart starts a new table id).
        self.change_serial = 0
        # Both kept in serial order (a change moves its entry to the end: _mark), so the changes since a serial are
        # read from the end in O(changes), not by a scan of every queue (a slave asks every second).
        self._queue_changed: dict[tuple[str, int], int] = {}
        self._generation_changed: dict[str, int] = {}
        # Removed queues (a deleted group or topic), in serial order like _queue_changed, with the commit version
        # of the removal: what a slave's offset round learns removals from (a queue stored again leaves both). Kept
        # in the offset file too (``removedOffsetTable``), at most REMOVED_OFFSETS_KEPT of them.
        self._queue_removed: dict[tuple[str, int], int] = {}
        self._removed_versions: dict[tuple[str, int], CommitVersion] = {}

    # ------------------------------------------------------------------ queries

    @staticmethod
    def key(group: str, topic: str) -> str:
        """RocketMQ's table key, ``topic@group``."""
        return f"{topic}{TOPIC_GROUP_SEPARATOR}{group}"

    def query_offset(self, group: str, topic: str, queue_id: int) -> int:
        """The stored offset, or -1 when the group never committed one for this queue (deterministic start)."""
        return self._table.get(self.key(group, topic), {}).get(queue_id, -1)

    def last_update_timestamp(self, group: str, topic: str, queue_id: int) -> int:
        """Wall-clock ms of the last applied update since this broker started, 0 if none."""
        return self._updated_at.get((self.key(group, topic), queue_id), 0)

    def topics_of_group(self, group: str) -> list[str]:
        """Topics for which ``group`` has stored offsets, sorted (RocketMQ's whichTopicByConsumer)."""
        suffix = TOPIC_GROUP_SEPARATOR + group
        return sorted(k[: -len(suffix)] for k in self._table if k.endswith(suffix)
                      and TOPIC_GROUP_SEPARATOR not in k[: -len(suffix)])

    def groups_of_topic(self, topic: str) -> list[str]:
        """Groups with stored offsets for ``topic``, sorted (RocketMQ's whichGroupByTopic)."""
        prefix = topic + TOPIC_GROUP_SEPARATOR
        return sorted(k[len(prefix):] for k in self._table if k.startswith(prefix))

    def queue_offsets(self, group: str, topic: str) -> dict[int, int]:
        """A copy of the group's stored offsets for ``topic``, queue id -> offset."""
        return dict(self._table.get(self.key(group, topic), {}))

    # ------------------------------------------------------------------ updates

    def fencing_owner(self, group: str, topic: str, queue_id: int, client_id: str | None) -> str | None:
        """The client whose lock forbids ``client_id`` to move this queue's offset, or None if allowed.

        Only groups consuming orderly are fenced; the lock is looked at without renewing it. The owner is the
        holder of the queue's live lock or, while nobody holds it, the last client that did (between a
        graceful release and the next owner's lock, a paused ex-owner's stale offset is refused too).
        """
        if self.lock_manager is None or not self.is_orderly(group):
            return None
        owner = self.lock_manager.offset_owner(group, MessageQueue(topic, self.broker_name, queue_id))
        if owner is None or owner == client_id:
            return None
        return owner

    def _holder_epoch(self, group: str, topic: str, queue_id: int, client_id: str | None) -> int | None:
        """The grant epoch of the queue's live lock when ``client_id`` holds it: the version of a commit that says no
        epoch (a pull's commit offset) ranks as made under that grant. Otherwise an older lifetime's commit with a
        later lock sequence, handed over by a demoted master, would outrank it, move the offset ahead of the holder
        and be rewound by the holder's next epoch-carrying commit (long chaos seed 56)."""
        if self.lock_manager is None or client_id is None:
            return None
        mq = MessageQueue(topic, self.broker_name, queue_id)
        if self.lock_manager.live_owner(group, mq) != client_id:
            return None
        return self.lock_manager.current_epoch(group, mq)

    def stale_epoch(self, group: str, topic: str, queue_id: int, lock_epoch: int | None) -> int | None:
        """The queue's newest known epoch when ``lock_epoch`` is older than it (the update must be refused), else
        None (also when no epoch is given). Known are this lifetime's latest grant and the newest epoch a commit
        of the queue carried (its commit version): a slave grants nothing and a restarted master has granted
        nothing yet, but an ex-holder's commit is as stale there as anywhere."""
        if lock_epoch is None:
            return None
        current = self.commit_version(group, topic, queue_id).lock_epoch
        if self.lock_manager is not None:
            granted = self.lock_manager.current_epoch(group, MessageQueue(topic, self.broker_name, queue_id))
            current = max(current, granted or 0)
        return current if lock_epoch < current else None

    def reset_generation(self, group: str, topic: str) -> int:
        """How many times the group's offsets of ``topic`` were reset (0: never)."""
        return self._reset_generations.get(self.key(group, topic), 0)

    def bump_reset_generation(self, group: str, topic: str) -> int:
        """A reset of the group's offsets of ``topic`` begins: the new generation (persisted with the offsets)."""
        k = self.key(group, topic)
        generation = self._reset_generations.get(k, 0) + 1
        self._reset_generations[k] = generation
        _mark(self._generation_changed, k, self._next_serial())
        self._version += 1
        return generation

    def stale_reset_generation(self, group: str, topic: str, generation: int | None) -> int | None:
        """The current generation when ``generation`` is older (a commit made before a reset: refuse it), else
        None (also for a commit that carries none)."""
        if generation is None:
            return None
        current = self._reset_generations.get(self.key(group, topic), 0)
        return current if generation < current else None

    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int, client_id: str | None, *,
                      source: str, lock_epoch: int | None = None, reset_generation: int | None = None) -> bool:
        """Store ``offset`` for the queue unless fenced; False (and counted, logged rate-limited) when fenced.

        ``source`` says where the update came from (``update`` for UPDATE_CONSUMER_OFFSET, ``pull`` for a
        pull's commit offset, ...) for the logs. ``lock_epoch``: the fencing epoch the sender consumed under;
        given, the update is judged by it alone (``stale_epoch``), otherwise by the lock's owner
        (``fencing_owner``).

        A pull's commit offset only ever moves the stored offset forward (an older one is ignored, True
        returned). It is the client's progress as of when the pull was sent, and the broker runs a
        connection's requests as concurrent tasks in no fixed order, so a long-poll carrying offset N can be
        applied after an UPDATE_CONSUMER_OFFSET of N+k sent later: applying it would rewind the queue and
        make its next owner consume N..N+k-1 again (found by the chaos suite). Explicit updates may rewind.

        ``reset_generation``: the reset generation the sender's offset was read under; an older one than the
        current is refused first (``stale_reset_generation``, counted in ``stale_generation_updates``).
        """
        _check_offset(offset)
        generation = self.stale_reset_generation(group, topic, reset_generation)
        if generation is not None:
            self.stale_generation_updates[group] += 1
            log_rate_limited(
                self._fenced_log, ("reset", group, topic, queue_id, client_id), self._now_ms(), log.warning,
                "offset.before_reset", group=group, topic=topic, queue_id=queue_id, offset=offset,
                client_id=client_id, reset_generation=reset_generation, current_generation=generation, source=source,
                refused_total=self.stale_generation_updates[group],
            )
            return False
        if lock_epoch is not None:
            current = self.stale_epoch(group, topic, queue_id, lock_epoch)
            if current is not None:
                self.fenced_updates[group] += 1
                log_rate_limited(
                    self._fenced_log, (group, topic, queue_id, client_id), self._now_ms(), log.warning,
                    "offset.fenced", group=group, topic=topic, queue_id=queue_id, offset=offset, client_id=client_id,
                    lock_epoch=lock_epoch, current_epoch=current, source=source,
                    fenced_total=self.fenced_updates[group],
                )
                return False
        else:
            owner = self.fencing_owner(group, topic, queue_id, client_id)
            if owner is not None:
                self.fenced_updates[group] += 1
                log_rate_limited(
                    self._fenced_log, (group, topic, queue_id, client_id), self._now_ms(), log.warning,
                    "offset.fenced", group=group, topic=topic, queue_id=queue_id, offset=offset, client_id=client_id,
                    owner=owner, source=source, fenced_total=self.fenced_updates[group],
                )
                return False
            lock_epoch = self._holder_epoch(group, topic, queue_id, client_id)
        if source == "pull" and offset < self.query_offset(group, topic, queue_id):
            self.stale_pull_commits += 1
            return True
        self._set(group, topic, queue_id, offset, generation=reset_generation, lock_epoch=lock_epoch)
        self.applied_updates += 1
        return True

    def reset_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Set the offset whatever the locks say (admin reset); logged."""
        _check_offset(offset)
        old = self.query_offset(group, topic, queue_id)
        self._set(group, topic, queue_id, offset)
        log.info("offset.reset", group=group, topic=topic, queue_id=queue_id, old=old, new=offset)

    def remove_offsets(self, group: str, topic: str | None = None) -> int:
        """Forget the group's offsets (for one topic, or all); returns how many queues were dropped."""
        keys = [self.key(group, topic)] if topic is not None else [self.key(group, t)
                                                                  for t in self.topics_of_group(group)]
        n = 0
        for k in keys:
            for qid in sorted(self._table.get(k, ())):
                self._drop((k, qid))
                n += 1
        return n

    def drop_entry(self, queue: tuple[str, int]) -> bool:
        """Remove one stored offset because another broker removed it (a merge: it is not a local change either);
        whether there was one."""
        if queue[1] not in self._table.get(queue[0], {}):
            return False
        self._drop(queue)
        return True

    def _drop(self, queue: tuple[str, int]) -> None:
        key, qid = queue
        queues = self._table[key]
        del queues[qid]
        if not queues:
            del self._table[key]
        # stamped as a change of its own (the next tick of the queue's clock): a slave's commit made before the
        # removal loses to it, one made after wins, as between two commits
        gen, epoch, seq = self._version_of(queue)
        removed_version = CommitVersion(gen, epoch, max(seq + 1, self._now_ms()))
        self._updated_at.pop(queue, None)
        self._commit_versions.pop(queue, None)
        self._queue_changed.pop(queue, None)
        self.local_changes.discard(queue)
        _mark(self._queue_removed, queue, self._next_serial())
        self._removed_versions[queue] = removed_version
        while len(self._queue_removed) > REMOVED_OFFSETS_KEPT:
            oldest = next(iter(self._queue_removed))  # serial order
            del self._queue_removed[oldest], self._removed_versions[oldest]
        self._version += 1

    def _stored_again(self, queue: tuple[str, int]) -> None:
        """A removed queue has an offset again: the removal is no longer news to a slave (its change is)."""
        if self._queue_removed.pop(queue, None) is not None:
            del self._removed_versions[queue]

    def _set(self, group: str, topic: str, queue_id: int, offset: int, *, generation: int | None = None,
             lock_epoch: int | None = None) -> None:
        k = self.key(group, topic)
        now = self._now_ms()
        self._table.setdefault(k, {})[queue_id] = offset
        self._updated_at[(k, queue_id)] = now
        # The commit version: the generation the offset belongs to (a commit can carry a reset this broker has not
        # synced yet: a slave), and the next tick of the queue's hybrid logical clock.
        gen = max(self._reset_generations.get(k, 0), generation or 0)
        serial = self._next_serial()
        if gen > self._reset_generations.get(k, 0):
            self._reset_generations[k] = gen
            _mark(self._generation_changed, k, serial)
        _, epoch, seq = self._commit_versions.get((k, queue_id), CommitVersion(0, 0, 0))
        self._commit_versions[(k, queue_id)] = CommitVersion(gen, max(epoch, lock_epoch or 0), max(seq + 1, now))
        _mark(self._queue_changed, (k, queue_id), serial)
        self._stored_again((k, queue_id))
        self.local_changes.add((k, queue_id))
        self._version += 1

    def _next_serial(self) -> int:
        self.change_serial += 1
        return self.change_serial

    # ------------------------------------------------------------------ commit versions (HA, issue 15)

    def commit_version(self, group: str, topic: str, queue_id: int) -> CommitVersion:
        """The queue's commit version ``(reset generation, lock epoch, sequence)``; (generation, 0, 0) when never
        stamped."""
        return self._version_of((self.key(group, topic), queue_id))

    def _version_of(self, queue: tuple[str, int]) -> CommitVersion:
        version = self._commit_versions.get(queue)
        return version if version is not None else CommitVersion(self._reset_generations.get(queue[0], 0), 0, 0)

    def max_lock_epoch(self) -> int:
        """The newest lock epoch any stored commit carried (0: none): a promoted broker grants above it."""
        return max((v.lock_epoch for v in self._commit_versions.values()), default=0)

    def entries(self) -> dict[tuple[str, int], tuple[int, CommitVersion]]:
        """Every stored offset: ("topic@group", queue id) -> (offset, commit version)."""
        out = {}
        for k, queues in self._table.items():
            gen = self._reset_generations.get(k, 0)
            for qid, offset in queues.items():
                out[(k, qid)] = (offset, self._commit_versions.get((k, qid), CommitVersion(gen, 0, 0)))
        return out

    def entry(self, queue: tuple[str, int]) -> tuple[int, CommitVersion] | None:
        """One stored offset, ("topic@group", queue id) -> (offset, commit version); None when there is none."""
        key, qid = queue
        offset = self._table.get(key, {}).get(qid)
        if offset is None:
            return None
        return offset, self._version_of(queue)

    def reset_generations(self) -> dict[str, int]:
        """A copy of the reset generations, "topic@group" -> generation."""
        return dict(self._reset_generations)

    def merge_entry(self, key: str, queue_id: int, offset: int, version: CommitVersion) -> None:
        """Take another broker's offset with its commit version (a merge: not a local change)."""
        _check_offset(offset)
        self._table.setdefault(key, {})[queue_id] = offset
        self._commit_versions[(key, queue_id)] = version
        self._updated_at[(key, queue_id)] = self._now_ms()
        self.local_changes.discard((key, queue_id))
        serial = self._next_serial()
        _mark(self._queue_changed, (key, queue_id), serial)
        self._stored_again((key, queue_id))
        if version.generation > self._reset_generations.get(key, 0):
            self._reset_generations[key] = version.generation
            _mark(self._generation_changed, key, serial)
        self._version += 1

    def merge_reset_generation(self, key: str, generation: int) -> bool:
        """Raise the reset generation of ``key`` to ``generation`` (never lowers it); whether it changed."""
        if generation <= self._reset_generations.get(key, 0):
            return False
        self._reset_generations[key] = generation
        _mark(self._generation_changed, key, self._next_serial())
        self._version += 1
        return True

    # ------------------------------------------------------------------ consume progress

    def progress(self, group: str, topic: str, queue_ids: Iterable[int], store: Any = None) -> list[QueueProgress]:
        """Consume progress of ``group`` on the given queues of ``topic`` (plus any queue with a stored offset).

        ``store`` (optional) answers ``get_max_offset_in_queue`` and, if it has it, ``get_store_timestamp``.
        Lag is ``broker offset - consumer offset`` (a queue with no stored offset counts from 0, as RocketMQ).
        """
        stored = self._table.get(self.key(group, topic), {})
        rows = []
        for qid in sorted(set(queue_ids) | set(stored)):
            consumer = stored.get(qid, -1)
            broker = int(store.get_max_offset_in_queue(topic, qid)) if store is not None else -1
            lag = max(0, broker - max(consumer, 0)) if broker >= 0 else -1
            last_ts = 0
            if store is not None and consumer > 0 and hasattr(store, "get_store_timestamp"):
                last_ts = store.get_store_timestamp(topic, qid, consumer - 1) or 0
            rows.append(QueueProgress(topic, qid, broker, consumer, lag, int(last_ts),
                                      self.last_update_timestamp(group, topic, qid)))
        return rows

    # ------------------------------------------------------------------ persistence

    @property
    def dirty(self) -> bool:
        """True when the table changed since the last successful ``persist``."""
        return self._version != self._persisted_version

    def encode(self) -> dict[str, Any]:
        """The file content: RocketMQ's ``{"offsetTable": {"topic@group": {"<queueId>": offset}}}``, plus
        ``"resetGenerationTable": {"topic@group": generation}`` once a reset happened, the commit versions
        (``commitVersionTable``, ``commitLockEpochTable``: broker/store/offset_merge.py) and the queues removed
        (``removedOffsetTable``, as in :meth:`encode_changes`). It is also the whole table a slave's sync gets, so a
        slave learns a removal made while it was away, even across a restart of this broker."""
        doc: dict[str, Any] = {
            "offsetTable": {k: {str(q): o for q, o in sorted(v.items())} for k, v in sorted(self._table.items())}}
        if self._reset_generations:
            doc["resetGenerationTable"] = dict(sorted(self._reset_generations.items()))
        if self._commit_versions:
            doc.update(encode_versions(self._commit_versions.items()))
        if self._removed_versions:
            doc["removedOffsetTable"] = encode_removed(self._removed_versions.items())
        return doc

    def encode_changes(self, since_serial: int) -> dict[str, Any]:
        """:meth:`encode`'s form holding only what changed after ``since_serial`` of this table: the queues whose
        offset or version changed (with their versions), the reset generations raised, and the queues removed
        (``removedOffsetTable``: ``{"topic@group": {"<queueId>": [generation, lockEpoch, sequence]}}``, the version
        of the removal, stamped as a commit's, so that a slave keeps a queue it committed to after it)."""
        queues = sorted(_changed_since(self._queue_changed, since_serial))
        table: dict[str, dict[str, int]] = {}
        for key, qid in queues:
            table.setdefault(key, {})[str(qid)] = self._table[key][qid]
        doc: dict[str, Any] = {"offsetTable": table}
        gens = {k: self._reset_generations[k] for k in sorted(_changed_since(self._generation_changed, since_serial))}
        if gens:
            doc["resetGenerationTable"] = gens
        versions = [(q, self._commit_versions[q]) for q in queues if q in self._commit_versions]
        if versions:
            doc.update(encode_versions(versions))
        removed = _changed_since(self._queue_removed, since_serial)
        if removed:
            doc["removedOffsetTable"] = encode_removed((q, self._removed_versions[q]) for q in removed)
        return doc

    def snapshot(self) -> tuple[int, dict[str, Any]]:
        """(version, file content) taken at once, so it can be written from a thread while updates go on."""
        return self._version, self.encode()

    def mark_persisted(self, version: int) -> None:
        """Record that the snapshot of ``version`` reached the disk."""
        self._persisted_version = max(self._persisted_version, version)

    def persist(self) -> bool:
        """Write the table atomically if it changed (blocking: fsync). Returns whether it wrote."""
        if self.path is None or not self.dirty:
            return False
        version, data = self.snapshot()
        write_json_atomic(self.path, data)
        self.mark_persisted(version)
        return True

    def load(self) -> int:
        """Read the offset file (blocking); returns how many queue offsets were loaded.

        Raises OffsetStoreError (or ValueError from the JSON reader) naming the file when it is not an offset
        table; single malformed entries are skipped with a warning so one bad line does not lose the rest.
        """
        if self.path is None:
            return 0
        data = read_json(self.path, None)
        if data is None:
            return 0
        table = data.get("offsetTable") if isinstance(data, dict) else None
        if not isinstance(table, dict):
            raise OffsetStoreError(f"{self.path}: expected a map with an 'offsetTable' map")
        loaded: dict[str, dict[int, int]] = {}
        for k, queues in table.items():
            topic, sep, group = str(k).partition(TOPIC_GROUP_SEPARATOR)
            if not sep or not topic or not group or not isinstance(queues, dict):
                log.warning("offset.load_skipped", file=self.path, key=k, reason="not topic@group -> map")
                continue
            for q, o in queues.items():
                try:
                    qid = int(q)
                except (TypeError, ValueError):
                    qid = -1
                if qid < 0 or isinstance(o, bool) or not isinstance(o, int) or o < 0:
                    log.warning("offset.load_skipped", file=self.path, key=k, queue=q, offset=o,
                                reason="queue id and offset must be non-negative integers")
                    continue
                loaded.setdefault(k, {})[qid] = o
        generations = data.get("resetGenerationTable")
        self._reset_generations = {
            str(k): g for k, g in (generations.items() if isinstance(generations, dict) else ())
            if TOPIC_GROUP_SEPARATOR in str(k) and isinstance(g, int) and not isinstance(g, bool) and g > 0}
        self._commit_versions = {(k, q): v for (k, q), v in decode_versions(data).items() if q in loaded.get(k, {})}
        self.local_changes = set()
        self._table = loaded
        self._updated_at.clear()
        # a table replaced whole: a slave's serial of the old one no longer says what it has
        self.table_id = uuid.uuid4().hex
        self._queue_changed.clear()
        self._generation_changed.clear()
        # removals of earlier lifetimes: serial 0, older than any serial a slave of this lifetime asks from (its
        # first sync of this table is a whole one, which carries them), oldest first; malformed entries are skipped
        listed = {(k, q) for k, queues in loaded.items() for q in queues}
        removed = sorted(decode_removed(data, listed).items(), key=lambda r: (r[1].sequence, r[0]))
        removed = removed[-REMOVED_OFFSETS_KEPT:]
        self._queue_removed = {q: 0 for q, _ in removed}
        self._removed_versions = dict(removed)
        self._version = self._persisted_version = 0
        n = sum(len(v) for v in loaded.values())
        log.info("offset.loaded", file=self.path, groups_topics=len(loaded), queues=n)
        return n


def _check_offset(offset: object) -> None:
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ValueError(f"offset must be a non-negative integer, got {offset!r}")


_K = TypeVar("_K")


def _mark(changed: dict[_K, int], key: _K, serial: int) -> None:
    """Record ``key``'s change at ``serial``, moving it to the end so the dict stays in serial order."""
    changed.pop(key, None)
    changed[key] = serial


def _changed_since(changed: dict[_K, int], since_serial: int) -> list[_K]:
    """The keys changed after ``since_serial``, read back from the end of a dict kept in serial order."""
    out = []
    for key, serial in reversed(changed.items()):
        if serial <= since_serial:
            break
        out.append(key)
    return out
