"""ConsumeLock: a process queue's consume lock, exclusive or shared.

RocketMQ's ProcessQueue.consumeLock is a plain lock: an orderly batch holds it from the listener call until its
offset is committed, and a rebalance that removes the queue takes it (waiting at most
``consume_lock_wait_millis``) before it persists the offset and unlocks the queue on the broker, so nothing of the
queue is being consumed when another client may take it. With ``order_scope="key"`` many batches of one queue
(different keys) run at once; each holds the lock *shared*, and the rebalance (or an operator's skip) still takes
it *exclusively*, once every batch under way has committed.

* Exclusive: trio.Lock's interface (``acquire``, ``acquire_nowait``, ``release``, ``async with``), owned by the task
  that took it; what queue scope and the rebalance use, unchanged.
* Shared: :meth:`ConsumeLock.acquire_shared` / :meth:`ConsumeLock.release_shared` (any number of holders, not owned
  by a task).
* A task waiting for the exclusive lock stops new shared holders (writer preference): the rebalance gets the lock
  within one batch's time instead of never while keys keep flowing. If it gives up (its wait is cancelled), the
  shared waiters go on.
"""

from __future__ import annotations

import trio
import trio.lowlevel

__all__ = ["ConsumeLock"]


class ConsumeLock:
    """A lock with an exclusive and a shared mode (see the module documentation)."""

    __slots__ = ("_lot", "_owner", "_shared", "_waiting_exclusive")

    def __init__(self) -> None:
        self._owner: trio.lowlevel.Task | None = None
        self._shared = 0
        self._waiting_exclusive = 0
        self._lot = trio.lowlevel.ParkingLot()

    def locked(self) -> bool:
        """Held, exclusively or by some shared holder."""
        return self._owner is not None or self._shared > 0

    @property
    def shared_holders(self) -> int:
        return self._shared

    # --- exclusive (trio.Lock's interface) ---------------------------------------------------------------

    def acquire_nowait(self) -> None:
        """Take the lock exclusively now or raise trio.WouldBlock."""
        task = trio.lowlevel.current_task()
        if self._owner is task:
            raise RuntimeError("attempt to re-acquire an already held ConsumeLock")
        if self._owner is not None or self._shared:
            raise trio.WouldBlock
        self._owner = task

    async def acquire(self) -> None:
        """Take the lock exclusively, waiting until nobody holds it."""
        await trio.lowlevel.checkpoint_if_cancelled()
        try:
            self.acquire_nowait()
        except trio.WouldBlock:
            self._waiting_exclusive += 1
            try:
                while self._owner is not None or self._shared:
                    await self._lot.park()
            finally:
                self._waiting_exclusive -= 1
                if not self._waiting_exclusive:
                    self._lot.unpark_all()  # shared waiters held back by this wait may go (it gave up, or won)
            self._owner = trio.lowlevel.current_task()
        else:
            await trio.lowlevel.cancel_shielded_checkpoint()

    def release(self) -> None:
        """Release the exclusive hold (only its owner may)."""
        if self._owner is not trio.lowlevel.current_task():
            raise RuntimeError("can't release a ConsumeLock you don't own")
        self._owner = None
        self._lot.unpark_all()

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(self, *exc: object) -> None:
        self.release()

    # --- shared ------------------------------------------------------------------------------------------

    def acquire_shared_nowait(self) -> None:
        """Join the shared holders now or raise trio.WouldBlock (held exclusively, or an exclusive wait)."""
        if self._owner is not None or self._waiting_exclusive:
            raise trio.WouldBlock
        self._shared += 1

    async def acquire_shared(self) -> None:
        """Join the shared holders, waiting while the lock is held or wanted exclusively. Uncontended, this takes no
        scheduling round (it is taken for every key-scope batch)."""
        try:
            self.acquire_shared_nowait()
            return
        except trio.WouldBlock:
            pass
        while self._owner is not None or self._waiting_exclusive:
            await self._lot.park()
        self._shared += 1

    def release_shared(self) -> None:
        """Leave the shared holders."""
        if self._shared <= 0:
            raise RuntimeError("release_shared without a shared hold")
        self._shared -= 1
        if not self._shared and self._waiting_exclusive:
            self._lot.unpark_all()

    def shared(self) -> _Shared:
        """``async with lock.shared():`` hold the lock shared for the block."""
        return _Shared(self)

    def __repr__(self) -> str:
        return (f"ConsumeLock(owner={self._owner!r}, shared={self._shared}, "
                f"waiting_exclusive={self._waiting_exclusive})")


class _Shared:
    __slots__ = ("_lock",)

    def __init__(self, lock: ConsumeLock) -> None:
        self._lock = lock

    async def __aenter__(self) -> None:
        await self._lock.acquire_shared()

    async def __aexit__(self, *exc: object) -> None:
        self._lock.release_shared()
