"""The MessageStore: commit log + consume queues + flushing + recovery (docs/STORAGE.md).

One object per broker (the broker's ``store``, built in broker/broker.py), run as a broker service. Its jobs
live in modules of their own, composed here: appends and group commit (``append.py``), reads (``read.py``),
recovery, flushing and reclaim (``lifecycle.py``); its settings, results and shared state in ``store_base.py``.

* **Appends** (``put_message``, ``put_messages``) encode records and write them with no await between
  choosing the position and updating it, so appends are serialized by construction (one writer) while
  pulls, which only slice mapped memory, never wait for them. The only await before an append is for a
  new segment file when the prepared one is not ready (files are created ahead of need in a thread).
  Consume-queue units are written in the same step, so a message is pullable as soon as its send returns.
* **Flushing**: ASYNC_FLUSH fsyncs every ``flush_interval_ms``; SYNC_FLUSH answers a put only once its
  bytes are fsynced, and every put that arrives while an fsync runs shares the next one (group commit).
  Both modes fsync the consume queues and write the checkpoint on the interval.
* **Recovery** (``start``): scan the commit log from the checkpoint, verify magic/CRC/offsets, cut the torn
  tail, repair consume-queue tails, rebuild the units past the last valid one, then serve.
* **Reclaim** (``broker/store/clean.py``): expired segments and the consume-queue files that follow them are
  deleted as RocketMQ does; a nearly full disk refuses writes.
* **Index** (``broker/store/index.py``, ``index_dispatch.py``): RocketMQ's index files, written by a task of
  their own from the commit log (an append only wakes it), rebuilt past their newest entry at start.

Extension points for the later services: ``arrival_listeners`` (replication, delayed delivery; long polling
listens to ``read_gate``, which passes arrivals on once readable), ``put_hook`` (the
schedule service redirects DELAY messages to SCHEDULE_TOPIC_XXXX there) and ``tags_code_resolvers``
(per-topic rule for the consume-queue tags field, e.g. the delivery time of scheduled messages).
"""

from __future__ import annotations

from collections.abc import Callable

import trio

from trimq.broker.store.append import StoreAppend
from trimq.broker.store.clean import CleanService
from trimq.broker.store.lifecycle import StoreLifecycle
from trimq.broker.store.read import ReadGate, StoreRead
from trimq.broker.store.store_base import StoreConfig

__all__ = ["MessageStore"]


class MessageStore(StoreLifecycle, StoreAppend, StoreRead):
    """See the module docstring. Lifecycle: ``await start()`` (recovery), ``run()`` in a nursery (flush and
    file preparation loops), ``await stop()`` (final flush, checkpoint, abort marker removed)."""

    name = "store"

    def __init__(self, config: StoreConfig, *, store_host: Callable[[], tuple[str, int]] | None = None,
                 now_ms: Callable[[], int] | None = None, disk_usage: Callable[[str], float] | None = None) -> None:
        """``store_host``: the broker's address for the records (known once it listens); ``now_ms``: the wall
        clock of file ages and ``delete_when``; ``disk_usage``: the used ratio of the disk holding a path (tests
        inject fakes of the last two)."""
        super().__init__(config, store_host=store_host, now_ms=now_ms, disk_usage=disk_usage)
        #: Reclaim (broker/store/clean.py): it sees the whole store, deleting through the lifecycle part.
        self.cleaner = CleanService(self)
        #: SYNC_MASTER's high watermark for readers (read.py ReadGate): long polling listens to it.
        self.read_gate = ReadGate(lambda: self.commitlog.max_offset)
        self.arrival_listeners.append(self.read_gate.on_arrival)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._flush_loop)
            nursery.start_soon(self._alloc_loop)
            nursery.start_soon(self.cleaner.run)
            nursery.start_soon(self.index_dispatcher.run)
            if self.config.sync_flush:
                nursery.start_soon(self._group_commit_loop)
            task_status.started()
