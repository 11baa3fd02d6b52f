"""Merging two brokers' consumer offsets by commit version (HA, issue 15): pure, no I/O, no trio.

A slave keeps accepting offset commits while its master is away (consumers pull from it then), and when the
master is back the two tables disagree. RocketMQ 4.9.3's slave overwrites its table with the master's every
10 s, losing what was committed to the slave; taking the larger offset instead would undo an admin reset that
moved an offset backwards. Here every queue's offset carries a **commit version** ``(reset generation, lock epoch,
sequence)`` (broker/store/offsets.py stamps it on every change: the newest queue-lock epoch a commit of the queue
carried, and a hybrid logical clock), and the newer version wins, whatever the offsets. The lock epoch ranks above
the clock: a commit made later, but under an older lock grant (an ex-holder that woke up while the master was
away and committed to the slave), loses to the new holder's (chaos seed 87).

* a queue only one side has is taken by the other;
* both have it: the larger version wins; equal versions with different offsets (tables from before versions
  existed, all ``(generation, 0)``) go the master's way, as RocketMQ's overwrite;
* reset generations are merged by taking the larger, per ``topic@group`` (they never go back);
* a queue the master removed (a deleted group or topic: ``removedOffsetTable`` in its changes since a serial, with
  the removal's version, stamped as a commit's) is removed from the slave too, unless the slave's version is newer
  (committed there after the removal). Only the changes carry removals: a whole table names what exists, so a
  removal made while the slave was away past a restart of its master (a new table id, a whole-table answer) is
  not carried; the slave keeps that copy and serves it until the group commits again.

:func:`merge_and_hand_back` is the slave's half (its metadata sync, broker/ha/slave_sync.py): it takes every
entry of its master's table that is newer (:func:`merge_by_commit_version`) and returns what the slave then sends its
master (MERGE_CONSUMER_OFFSET): the queues whose version is newer than the master's (only a commit on the slave makes
one newer: a merge copies versions as they are), and the queues the master does not have that the slave changed
itself (``local_changes``: so a group the master deleted is not brought back by an old copy); the master applies them
with :func:`merge_into` too. A queue both sides have at the same version is no
longer a local change of the slave.

The wire form of a table is GET_ALL_CONSUMER_OFFSET's body: ``offsetTable`` (RocketMQ's), plus
``resetGenerationTable``, ``commitVersionTable`` (``{"topic@group": {"<queueId>": [generation, sequence]}}``) and
``commitLockEpochTable`` (``{"topic@group": {"<queueId>": lockEpoch}}``, queues whose lock epoch is not 0), which
RocketMQ ignores. The lock epoch has a table of its own so that a broker from before it was part of the version
still reads every version (and merges by generation and sequence, as it did).
"""

from __future__ import annotations

from collections.abc import Container, Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

__all__ = [
    "CommitVersion",
    "DecodedTable",
    "MergeResult",
    "VersionedOffsets",
    "decode_table",
    "decode_versions",
    "encode_versions",
    "merge_and_hand_back",
    "merge_by_commit_version",
    "merge_tables",
]

QueueKey = tuple[str, int]  # ("topic@group", queue id)


class CommitVersion(NamedTuple):
    """The version of a queue's stored offset; compared as a tuple, the larger is newer."""

    generation: int  # the reset generation the offset belongs to
    lock_epoch: int  # the newest queue-lock fencing epoch a commit of the queue carried (0: none)
    sequence: int  # the hybrid logical clock of the queue's changes (wall ms, or one more than the last)


def encode_versions(versions: Iterable[tuple[QueueKey, CommitVersion]]) -> dict[str, Any]:
    """``commitVersionTable`` and, when some lock epoch is not 0, ``commitLockEpochTable`` (the module docstring)."""
    table: dict[str, dict[str, list[int]]] = {}
    epochs: dict[str, dict[str, int]] = {}
    for (key, qid), v in sorted(versions):
        table.setdefault(key, {})[str(qid)] = [v.generation, v.sequence]
        if v.lock_epoch:
            epochs.setdefault(key, {})[str(qid)] = v.lock_epoch
    out: dict[str, Any] = {"commitVersionTable": table}
    if epochs:
        out["commitLockEpochTable"] = epochs
    return out


def decode_versions(body: Any) -> dict[QueueKey, CommitVersion]:
    """The versions ``encode_versions`` wrote (in a file or a sync body); malformed entries are left out (a lock
    epoch that is, as 0)."""
    out: dict[QueueKey, CommitVersion] = {}
    if not isinstance(body, dict):
        return out
    versions, epochs = body.get("commitVersionTable"), body.get("commitLockEpochTable")
    epochs = epochs if isinstance(epochs, dict) else {}
    for key, queues in (versions.items() if isinstance(versions, dict) else ()):
        key_epochs = epochs.get(key)
        key_epochs = key_epochs if isinstance(key_epochs, dict) else {}
        for q, v in (queues.items() if isinstance(queues, dict) else ()):
            if not (isinstance(v, list | tuple) and len(v) == 2 and all(_nat(x) for x in v)) or not str(q).isdigit():
                continue
            epoch = key_epochs.get(q, 0)
            out[(str(key), int(q))] = CommitVersion(int(v[0]), epoch if _nat(epoch) else 0, int(v[1]))
    return out


class VersionedOffsets(Protocol):
    """The offsets a merge works on (broker/store/offsets.py ConsumerOffsetManager)."""

    local_changes: set[QueueKey]

    def entries(self) -> dict[QueueKey, tuple[int, CommitVersion]]: ...

    def entry(self, queue: QueueKey) -> tuple[int, CommitVersion] | None: ...

    def reset_generations(self) -> dict[str, int]: ...

    def merge_entry(self, key: str, queue_id: int, offset: int, version: CommitVersion) -> None: ...

    def merge_reset_generation(self, key: str, generation: int) -> bool: ...

    def drop_entry(self, queue: QueueKey) -> bool: ...


@dataclass(slots=True)
class DecodedTable:
    """A table in its wire form, checked: queue -> (offset, version), the generations, and the queues the other
    side removed with the version each had (``removedOffsetTable``, in the changes since a serial only)."""

    entries: dict[QueueKey, tuple[int, CommitVersion]] = field(default_factory=dict)
    generations: dict[str, int] = field(default_factory=dict)
    removed: dict[QueueKey, CommitVersion] = field(default_factory=dict)


@dataclass(slots=True)
class MergeResult:
    """What a merge decided: the queues taken from the remote table (``adopted``), the local ones newer than the
    remote's or, absent there, changed locally (``newer_here``: to send to the other side), generations raised, and
    the local queues removed because the remote side removed them (``removed``)."""

    adopted: list[QueueKey] = field(default_factory=list)
    newer_here: list[QueueKey] = field(default_factory=list)
    generations_raised: list[str] = field(default_factory=list)
    removed: list[QueueKey] = field(default_factory=list)


def _nat(v: Any) -> bool:
    return type(v) is int and v >= 0


def decode_table(body: Any) -> DecodedTable:
    """Check and decode a GET_ALL_CONSUMER_OFFSET / MERGE_CONSUMER_OFFSET body. ValueError without an
    ``offsetTable`` map; malformed single entries are skipped (one bad entry does not stop a sync)."""
    table = body.get("offsetTable") if isinstance(body, dict) else None
    if not isinstance(table, dict):
        raise ValueError("the consumer offset body has no offsetTable map")
    gens_raw = body.get("resetGenerationTable")
    generations = {str(k): g for k, g in (gens_raw.items() if isinstance(gens_raw, dict) else ())
                   if "@" in str(k) and _nat(g)}
    versions = decode_versions(body)
    out = DecodedTable(generations=generations)
    for key, queues in table.items():
        key = str(key)
        topic, sep, group = key.partition("@")
        if not sep or not topic or not group or not isinstance(queues, dict):
            continue
        for q, offset in queues.items():
            try:
                qid = int(q)
            except (TypeError, ValueError):
                continue
            if qid < 0 or not _nat(offset):
                continue
            version = versions.get((key, qid))
            if version is None:  # a table without versions (RocketMQ's, or older)
                version = CommitVersion(generations.get(key, 0), 0, 0)
            out.entries[(key, qid)] = (offset, version)
    out.removed = decode_removed(body, out.entries)
    return out


def decode_removed(body: dict[str, Any], listed: Container[QueueKey]) -> dict[QueueKey, CommitVersion]:
    """A body's ``removedOffsetTable``: queue -> the version of its removal. Malformed entries are skipped, and so
    are queues in ``listed`` (the body's own offsets: a queue both listed and removed is taken as listed)."""
    out: dict[QueueKey, CommitVersion] = {}
    removed = body.get("removedOffsetTable")
    for key, queues in (removed.items() if isinstance(removed, dict) else ()):
        key = str(key)
        if "@" not in key or not isinstance(queues, dict):
            continue
        for q, v in queues.items():
            if str(q).isdigit() and isinstance(v, list | tuple) and len(v) == 3 and all(_nat(x) for x in v) \
                    and (key, int(q)) not in listed:
                out[(key, int(q))] = CommitVersion(*v)
    return out


def encode_removed(removed: Iterable[tuple[QueueKey, CommitVersion]]) -> dict[str, dict[str, list[int]]]:
    """:func:`decode_removed`'s inverse: ``{"topic@group": {"<queueId>": [generation, lockEpoch, sequence]}}``."""
    table: dict[str, dict[str, list[int]]] = {}
    for (key, qid), version in sorted(removed):
        table.setdefault(key, {})[str(qid)] = list(version)
    return table


def merge_tables(local: dict[QueueKey, tuple[int, CommitVersion]], remote: dict[QueueKey, tuple[int, CommitVersion]],
                 local_changes: set[QueueKey]) -> MergeResult:
    """The decision alone (pure): which remote entries to take and which local changes are newer than remote."""
    result = MergeResult()
    for q, (r_offset, r_version) in sorted(remote.items()):
        mine = local.get(q)
        if mine is None:
            result.adopted.append(q)
            continue
        l_offset, l_version = mine
        if r_version > l_version or (r_version == l_version and r_offset != l_offset):
            result.adopted.append(q)
        elif l_version > r_version:
            # Only a commit on this broker makes its version newer (a merge copies versions as they are), so this
            # is ours to hand over even when it is not marked (this broker restarted since).
            result.newer_here.append(q)
    for q in sorted(local_changes):
        if q in local and q not in remote:
            result.newer_here.append(q)
    return result


def merge_by_commit_version(offsets: VersionedOffsets, body: dict[str, Any]) -> int:
    """Take every entry of ``body`` (another broker's table) that is newer than ours; raise reset generations.
    Returns how many queues changed."""
    return len(merge_into(offsets, decode_table(body)).adopted)


def _local_for(offsets: VersionedOffsets, remote: DecodedTable) -> dict[QueueKey, tuple[int, CommitVersion]]:
    """The local entries a merge with ``remote`` looks at: the remote's queues and the local changes (a table's worth
    of lookups for a whole table, a few for the changes of one second)."""
    local = {}
    for q in remote.entries.keys() | offsets.local_changes:
        mine = offsets.entry(q)
        if mine is not None:
            local[q] = mine
    return local


def merge_into(offsets: VersionedOffsets, remote: DecodedTable) -> MergeResult:
    """Apply a decoded remote table to ``offsets`` (see :func:`merge_by_commit_version`); the full result."""
    local = _local_for(offsets, remote)
    result = merge_tables(local, remote.entries, offsets.local_changes)
    for key, gen in sorted(remote.generations.items()):
        if offsets.merge_reset_generation(key, gen):
            result.generations_raised.append(key)
    for key, qid in result.adopted:
        offset, version = remote.entries[(key, qid)]
        offsets.merge_entry(key, qid, offset, version)
    # A removal is stamped as a commit (offsets.py): it reaches the queues this side holds at an older version; a
    # queue committed here after it (the slave's own commit while its master was away) is kept, and handed back.
    for q, removed_version in sorted(remote.removed.items()):
        mine = offsets.entry(q)
        if mine is not None and mine[1] <= removed_version and offsets.drop_entry(q):
            result.removed.append(q)
    # A local change the remote side now has at the same version is no longer ours to hand over.
    for q in list(offsets.local_changes):
        mine, theirs = local.get(q), remote.entries.get(q)
        if mine is not None and theirs is not None and mine == theirs:
            offsets.local_changes.discard(q)
    return result


def merge_and_hand_back(offsets: VersionedOffsets, body: dict[str, Any]) -> tuple[int, dict[str, Any] | None]:
    """A slave's half of a sync in one pass: :func:`merge_by_commit_version`, then the body of what is newer here,
    from one decode and one comparison (the queues a merge finds newer here are the ones it leaves alone, so they
    are still newer after it). Returns (queues changed or removed, MERGE_CONSUMER_OFFSET body or None)."""
    result = merge_into(offsets, decode_table(body))
    return len(result.adopted) + len(result.removed), _hand_back_body(offsets, result.newer_here)


def _hand_back_body(offsets: VersionedOffsets, queues: list[QueueKey]) -> dict[str, Any] | None:
    mine = {q: e for q in queues if (e := offsets.entry(q)) is not None}
    if not mine:
        return None
    table: dict[str, dict[str, int]] = {}
    for (key, qid), (offset, _) in mine.items():
        table.setdefault(key, {})[str(qid)] = offset
    gens = offsets.reset_generations()
    return {"offsetTable": table, **encode_versions((q, v) for q, (_, v) in mine.items()),
            "resetGenerationTable": {k: gens[k] for k in table if gens.get(k, 0) > 0}}
