"""Consumer offset stores: where a consumer remembers how far it consumed each queue.

* :class:`OffsetTable` — the pure bookkeeping (no I/O): offsets per queue, increase-only updates.
* :class:`RemoteBrokerOffsetStore` — CLUSTERING: offsets live on the broker that hosts the queue
  (QUERY_CONSUMER_OFFSET / UPDATE_CONSUMER_OFFSET); memory is the write-back cache that the client
  instance persists every ``persist_consumer_offset_interval`` (5 s) and on queue removal.
* :class:`LocalFileOffsetStore` — BROADCASTING: every consumer keeps its own offsets in a JSON file,
  written atomically (temp file, fsync, rename, fsync of the directory; the previous version is kept as
  ``.bak`` and used when the main file is unreadable).

Orderly consumers fence their commits (issue 14): the rebalance tells the remote store the fencing epoch of
each queue lock it holds (:meth:`RemoteBrokerOffsetStore.set_lock_epoch`), and every UPDATE_CONSUMER_OFFSET of
that queue carries it (``lockEpoch``), as does every pull's commit offset (client/pull.py), so the broker refuses a
commit made under a lock that has since been granted to someone else, and ranks the others by it.

Resets (issue 19): the store remembers, per queue, the reset generation its offset was read under (from
QUERY_CONSUMER_OFFSET, or from the reset notification, client/admin_handlers.py) and every commit carries it
(``resetGeneration``); the broker refuses a commit made before a reset the member did not see, and the store
then calls ``on_stale_reset(mq)`` (the push consumer drops the queue and reads its offset again).

HA (issue 15): offsets go to the queue's master, and to its slave while the master is away (not listed in the
route, or a request could not reach it: ``ClientInstance.find_broker_addr_for_offsets``), as RocketMQ's
RemoteBrokerOffsetStore does; the slave keeps them and hands them to the master when it returns (merged by commit
version, broker/store/offset_merge.py), where RocketMQ 4.9.3 loses them.

``read_offset`` returns the offset, ``-1`` when none is stored, ``-2`` when it could not be read (broker
unreachable or answering an error). Unlike RocketMQ 4.9.3, a broker *error* other than QUERY_NOT_FOUND
is -2, not -1, so a transient failure is never mistaken for "new group, start from the configured place".
"""

from __future__ import annotations

import enum
import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Protocol

import trio

from trimq.client.api import MQClientAPI
from trimq.client.errors import (
    MQBrokerError,
    MQClientError,
    NoPermissionError,
    OffsetNotFoundError,
    StaleResetGenerationError,
)
from trimq.protocol.codes import ResponseCode
from trimq.protocol.message_queue import MessageQueue
from trimq.runtime.client import RemotingError
from trimq.runtime.logs import RateLimiter, get_logger, log_rate_limited

__all__ = [
    "LocalFileOffsetStore",
    "OffsetStore",
    "OffsetTable",
    "ReadOffsetType",
    "RemoteBrokerOffsetStore",
    "default_local_offset_dir",
]

log = get_logger("trimq.offset_store")

NOT_FOUND = -1
READ_ERROR = -2


class ReadOffsetType(enum.Enum):
    READ_FROM_MEMORY = "READ_FROM_MEMORY"
    READ_FROM_STORE = "READ_FROM_STORE"
    MEMORY_FIRST_THEN_STORE = "MEMORY_FIRST_THEN_STORE"


READ_FROM_MEMORY = ReadOffsetType.READ_FROM_MEMORY
READ_FROM_STORE = ReadOffsetType.READ_FROM_STORE
MEMORY_FIRST_THEN_STORE = ReadOffsetType.MEMORY_FIRST_THEN_STORE


class OffsetTable:
    """Offsets per message queue (pure). ``update(mq, offset, increase_only=True)`` never moves one back."""

    def __init__(self) -> None:
        self._table: dict[MessageQueue, int] = {}

    def update(self, mq: MessageQueue, offset: int, increase_only: bool) -> bool:
        """Set ``mq``'s offset; with ``increase_only`` only if larger than the current one. True if changed."""
        if isinstance(offset, bool) or not isinstance(offset, int):
            raise TypeError(f"offset must be an int, got {offset!r}")
        current = self._table.get(mq)
        if current is None or not increase_only or offset > current:
            self._table[mq] = offset
            return current != offset
        return False

    def get(self, mq: MessageQueue) -> int | None:
        return self._table.get(mq)

    def remove(self, mq: MessageQueue) -> None:
        self._table.pop(mq, None)

    def items(self) -> list[tuple[MessageQueue, int]]:
        return list(self._table.items())

    def snapshot(self, topic: str | None = None) -> dict[MessageQueue, int]:
        """A copy, optionally of one topic only (RocketMQ's cloneOffsetTable)."""
        return {mq: o for mq, o in self._table.items() if topic is None or mq.topic == topic}

    def __contains__(self, mq: object) -> bool:
        return mq in self._table

    def __len__(self) -> int:
        return len(self._table)


class OffsetStore(Protocol):
    """What the rebalance, the pull loop and the consume services use (RocketMQ's OffsetStore)."""

    async def load(self) -> None: ...

    def update_offset(self, mq: MessageQueue, offset: int, increase_only: bool) -> None: ...

    async def read_offset(self, mq: MessageQueue, type: ReadOffsetType) -> int: ...

    async def persist_all(self, mqs: Iterable[MessageQueue]) -> None: ...

    async def persist(self, mq: MessageQueue) -> None: ...

    def remove_offset(self, mq: MessageQueue) -> None: ...

    def clone_offset_table(self, topic: str) -> dict[MessageQueue, int]: ...


class BrokerAccess(Protocol):
    """What the remote store needs from the client instance."""

    @property
    def client_id(self) -> str: ...

    @property
    def api(self) -> MQClientAPI: ...

    async def find_broker_addr(self, broker_name: str, topic: str | None = None) -> str | None: ...


class _MemoryOps:
    table: OffsetTable

    def update_offset(self, mq: MessageQueue, offset: int, increase_only: bool) -> None:
        """Record a consumed-up-to offset in memory (persisted later)."""
        self.table.update(mq, offset, increase_only)

    def update(self, mq: MessageQueue, offset: int, increase_only: bool) -> None:
        """Alias of :meth:`update_offset`."""
        self.update_offset(mq, offset, increase_only)

    def clone_offset_table(self, topic: str) -> dict[MessageQueue, int]:
        return self.table.snapshot(topic)


class RemoteBrokerOffsetStore(_MemoryOps):
    """CLUSTERING offsets kept on the brokers, cached in memory."""

    def __init__(self, consumer_group: str, broker: BrokerAccess, *, timeout_ms: int = 3000) -> None:
        self.consumer_group = consumer_group
        self.broker = broker
        self.timeout_ms = timeout_ms
        self.table = OffsetTable()
        self.fenced_updates = 0
        self._rate = RateLimiter(10_000)
        self._persist_locks: dict[MessageQueue, trio.Lock] = {}
        self._lock_epochs: dict[MessageQueue, int] = {}
        self._reset_generations: dict[MessageQueue, int] = {}
        self._master_epochs: dict[MessageQueue, int] = {}
        #: Commits the broker refused as made before a reset of the group's offsets.
        self.stale_reset_updates = 0
        #: Called with a queue whose commit was refused as made before a reset (the push consumer resyncs it).
        self.on_stale_reset: Callable[[MessageQueue], None] | None = None

    def set_lock_epoch(self, mq: MessageQueue, epoch: int | None) -> None:
        """The fencing epoch of the lock under which ``mq``'s cached offset is (and will be) consumed; sent with
        every commit of ``mq`` (None: commits carry none, as for concurrent consumers)."""
        if epoch is None:
            self._lock_epochs.pop(mq, None)
        else:
            self._lock_epochs[mq] = epoch

    def lock_epoch(self, mq: MessageQueue) -> int | None:
        """The epoch commits of ``mq`` carry, or None."""
        return self._lock_epochs.get(mq)

    def reset_generation(self, mq: MessageQueue) -> int | None:
        """The reset generation ``mq``'s offset was read under (None: unknown), carried by its commits."""
        return self._reset_generations.get(mq)

    def set_reset_generation(self, mq: MessageQueue, generation: int | None) -> None:
        """``mq``'s offset now stands for ``generation`` (a reset notification set it)."""
        if generation is None:
            self._reset_generations.pop(mq, None)
        else:
            self._reset_generations[mq] = generation

    def set_master_epoch(self, mq: MessageQueue, epoch: int) -> None:
        """The master epoch of the log ``mq``'s position was reached in (a pull answer that kept the position says
        it): sent with its commits, so a broker whose log began a newer epoch since stores at most where that began
        (a position read from an ASYNC master's lost tail; docs/PROTOCOL.md §7)."""
        self._master_epochs[mq] = epoch

    def master_epoch(self, mq: MessageQueue) -> int | None:
        """The master epoch ``mq``'s commits carry, or None (not known yet: none is sent)."""
        return self._master_epochs.get(mq)

    async def load(self) -> None:
        """Nothing to load: offsets are read from the broker when a queue is assigned."""

    async def read_offset(self, mq: MessageQueue, type: ReadOffsetType) -> int:
        """Memory, the broker, or memory then broker; -1 when none is stored, -2 when unreadable."""
        if type is not READ_FROM_STORE:
            cached = self.table.get(mq)
            if cached is not None:
                return cached
            if type is READ_FROM_MEMORY:
                return NOT_FOUND
        try:
            offset = await self.fetch_consume_offset_from_broker(mq)
        except OffsetNotFoundError:
            return NOT_FOUND
        except (MQClientError, MQBrokerError, RemotingError) as exc:
            log.warning("offset.read_failed", group=self.consumer_group, mq=str(mq), error=str(exc))
            return READ_ERROR
        self.table.update(mq, offset, False)
        return offset

    async def fetch_consume_offset_from_broker(self, mq: MessageQueue) -> int:
        """QUERY_CONSUMER_OFFSET on the queue's broker; raises OffsetNotFoundError when none is stored. A queue held
        under a lock (it has a lock epoch) is read from the master, where the lock and the group's latest commits
        are: a slave's copy lags by a sync interval, and starting from it would re-consume what the previous
        holder committed (chaos seed 23)."""
        addr = await self._addr(mq, master=mq in self._lock_epochs)
        offset, generation, epoch = await self.broker.api.query_consumer_offset_state(
            addr, self.consumer_group, mq, timeout_ms=self.timeout_ms)
        self.set_reset_generation(mq, generation)
        if epoch is None:  # a broker that does not say: known at the first pull answer
            self._master_epochs.pop(mq, None)
        else:
            self._master_epochs[mq] = epoch
        if offset < 0:
            raise OffsetNotFoundError(ResponseCode.QUERY_NOT_FOUND, "no offset stored", addr, "QUERY_CONSUMER_OFFSET")
        return offset

    async def _addr(self, mq: MessageQueue, *, master: bool = False) -> str:
        find = getattr(self.broker, "find_broker_addr_for_offsets", None)  # (fakes in tests: the master only)
        if find is not None and not master:
            addr = await find(mq.broker_name, mq.topic)
        else:
            addr = await self.broker.find_broker_addr(mq.broker_name, mq.topic)
        if addr is None:
            raise MQClientError(f"broker {mq.broker_name!r} of {mq} is not in any known route")
        return addr

    async def update_consume_offset_to_broker(self, mq: MessageQueue, offset: int) -> bool:
        """UPDATE_CONSUMER_OFFSET (with the queue's lock epoch, if any); False (and logged, counted) when the
        broker fenced the update."""
        addr = await self._addr(mq)
        epoch = self._lock_epochs.get(mq)
        generation = self._reset_generations.get(mq)
        try:
            await self.broker.api.update_consumer_offset(
                addr, self.consumer_group, mq, offset, self.broker.client_id, timeout_ms=self.timeout_ms,
                lock_epoch=epoch, reset_generation=generation, master_epoch=self._master_epochs.get(mq),
            )
        except RemotingError as exc:
            note_failure = getattr(self.broker, "note_failure", None)
            if note_failure is not None:
                note_failure(addr, exc)  # the next attempt goes to the slave (issue 15)
            raise
        except StaleResetGenerationError as exc:
            # The offset is from before a reset this member was not told of: never again, read it anew.
            self.stale_reset_updates += 1
            log_rate_limited(
                self._rate, ("reset", mq), _now_ms(), log.warning, "offset.before_reset",
                group=self.consumer_group, mq=str(mq), offset=offset, reset_generation=generation,
                current_generation=exc.reset_generation,
            )
            known = self._reset_generations.get(mq)
            if self.on_stale_reset is not None and (known is None or known < exc.reset_generation):
                self.on_stale_reset(mq)  # (not when the reset's notification got here meanwhile)
            return False
        except NoPermissionError as exc:
            self.fenced_updates += 1
            log_rate_limited(
                self._rate, ("fenced", mq), _now_ms(), log.warning, "offset.fenced",
                group=self.consumer_group, mq=str(mq), offset=offset, remark=exc.remark,
            )
            return False
        return True

    async def persist_all(self, mqs: Iterable[MessageQueue]) -> None:
        """Send every cached offset of ``mqs`` to its broker (brokers in parallel); forget the others."""
        wanted = set(mqs)
        if not wanted:
            return
        by_broker: dict[str, list[tuple[MessageQueue, int]]] = {}
        for mq, offset in self.table.items():
            if mq in wanted:
                by_broker.setdefault(mq.broker_name, []).append((mq, offset))
            else:
                self.table.remove(mq)  # RocketMQ drops offsets of queues no longer assigned
                log.info("offset.unused_removed", group=self.consumer_group, mq=str(mq), offset=offset)

        async def one_broker(items: list[tuple[MessageQueue, int]]) -> None:
            for mq, offset in items:
                await self._persist_one(mq, offset)

        async with trio.open_nursery() as nursery:
            for items in by_broker.values():
                nursery.start_soon(one_broker, items)

    async def persist(self, mq: MessageQueue) -> None:
        """Send ``mq``'s cached offset to its broker now (used when a queue is removed)."""
        offset = self.table.get(mq)
        if offset is not None:
            await self._persist_one(mq, offset)

    async def _persist_one(self, mq: MessageQueue, offset: int) -> None:
        # One UPDATE_CONSUMER_OFFSET per queue at a time, carrying the offset as it is when sent (None: the
        # queue was given away meanwhile): the broker handles a connection's requests concurrently, so two
        # overlapping updates could land in either order and a snapshot taken before the other could rewind
        # the queue for its next owner (found by the chaos suite).
        lock = self._persist_locks.get(mq)
        if lock is None:
            lock = self._persist_locks[mq] = trio.Lock()
        async with lock:
            current = self.table.get(mq)
            if current is None:
                return
            try:
                await self.update_consume_offset_to_broker(mq, current)
            except (MQClientError, MQBrokerError, RemotingError) as exc:
                log_rate_limited(
                    self._rate, ("persist", mq), _now_ms(), log.warning, "offset.persist_failed",
                    group=self.consumer_group, mq=str(mq), offset=current, error=str(exc),
                )

    def remove_offset(self, mq: MessageQueue) -> None:
        """Forget ``mq``'s cached offset and lock epoch (after persisting it, when the queue is given away)."""
        self.table.remove(mq)
        self._lock_epochs.pop(mq, None)
        self._reset_generations.pop(mq, None)
        self._master_epochs.pop(mq, None)


def default_local_offset_dir(store_id: str, consumer_group: str, base_dir: str = "") -> Path:
    """``<base>/<store_id>/<group>``; base defaults to ``$TRIMQ_CLIENT_LOCAL_OFFSET_STORE_DIR`` or ``~/.trimq_offsets``.

    ``store_id`` should be stable across restarts (RocketMQ uses ``ip@instanceName``, with ``DEFAULT``
    for broadcasting consumers, so it does not change with the pid).
    """
    base = base_dir or os.environ.get("TRIMQ_CLIENT_LOCAL_OFFSET_STORE_DIR") or str(Path.home() / ".trimq_offsets")
    return Path(base) / store_id / consumer_group


class LocalFileOffsetStore(_MemoryOps):
    """BROADCASTING offsets in ``<dir>/offsets.json``, written atomically."""

    FILE_NAME = "offsets.json"

    def __init__(self, consumer_group: str, directory: str | os.PathLike[str]) -> None:
        self.consumer_group = consumer_group
        self.directory = Path(directory)
        self.path = self.directory / self.FILE_NAME
        self.table = OffsetTable()

    async def load(self) -> None:
        """Read the file (or its ``.bak`` when the file is unreadable) into memory."""
        stored = await trio.to_thread.run_sync(self._read_file)
        for mq, offset in stored.items():
            self.table.update(mq, offset, False)

    async def read_offset(self, mq: MessageQueue, type: ReadOffsetType) -> int:
        if type is not READ_FROM_STORE:
            cached = self.table.get(mq)
            if cached is not None:
                return cached
            if type is READ_FROM_MEMORY:
                return NOT_FOUND
        try:
            stored = await trio.to_thread.run_sync(self._read_file)
        except MQClientError as exc:
            log.warning("offset.read_failed", group=self.consumer_group, path=str(self.path), error=str(exc))
            return READ_ERROR
        offset = stored.get(mq)
        if offset is None:
            return NOT_FOUND
        self.table.update(mq, offset, False)
        return offset

    async def persist_all(self, mqs: Iterable[MessageQueue]) -> None:
        """Write the offsets of ``mqs`` to the file, atomically."""
        wanted = set(mqs)
        if not wanted:
            return
        data = {mq: o for mq, o in self.table.items() if mq in wanted}
        await trio.to_thread.run_sync(self._write_file, data)

    async def persist(self, mq: MessageQueue) -> None:
        """No-op, as in RocketMQ: the periodic persist_all writes the whole file."""

    def remove_offset(self, mq: MessageQueue) -> None:
        """No-op, as in RocketMQ (broadcasting consumers keep every queue)."""

    # --- file I/O (runs in a worker thread) ---------------------------------------------------------

    @staticmethod
    def _encode(data: dict[MessageQueue, int]) -> str:
        entries = [{**mq.to_wire(), "offset": off} for mq, off in sorted(data.items())]
        return json.dumps({"offsetTable": entries}, indent=1, sort_keys=True)

    @staticmethod
    def _decode(text: str, path: Path) -> dict[MessageQueue, int]:
        try:
            doc: Any = json.loads(text)
            out: dict[MessageQueue, int] = {}
            for e in doc["offsetTable"]:
                offset = e["offset"]
                if isinstance(offset, bool) or not isinstance(offset, int):
                    raise ValueError(f"offset {offset!r} is not an integer")
                out[MessageQueue.from_wire(e)] = offset
            return out
        except (ValueError, KeyError, TypeError) as exc:
            raise MQClientError(f"offset file {path} is not a valid offset table: {exc}") from None

    def _read_file(self) -> dict[MessageQueue, int]:
        bak = self.path.with_name(self.FILE_NAME + ".bak")
        errors = []
        for p in (self.path, bak):
            try:
                text = p.read_text(encoding="utf-8")
            except FileNotFoundError:
                continue
            except OSError as exc:
                errors.append(f"{p}: {exc.strerror or exc}")
                continue
            try:
                data = self._decode(text, p)
            except MQClientError as exc:
                errors.append(str(exc))
                continue
            if p is bak:
                log.warning("offset.file_recovered_from_backup", path=str(self.path))
            return data
        if errors:
            raise MQClientError("cannot read local offsets: " + "; ".join(errors))
        return {}

    def _write_file(self, data: dict[MessageQueue, int]) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.FILE_NAME + ".tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(self._encode(data))
            fh.flush()
            os.fsync(fh.fileno())
        if self.path.exists():
            os.replace(self.path, self.path.with_name(self.FILE_NAME + ".bak"))
        os.replace(tmp, self.path)
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _now_ms() -> int:
    import time

    return int(time.time() * 1000)
