"""Long polling: hold a pull on a queue with nothing new until a message arrives or time runs out.

RocketMQ's PullRequestHoldService re-checks held pulls every few seconds and on arrival; here the store's
arrival listener (``notify``) reaches exactly the pulls held on the queue that just grew, so there is no
polling loop. A held pull is either

* a task parked in :meth:`LongPolling.wait` (the general path), or
* a :class:`HeldRequest` registered with :meth:`LongPolling.hold`: no task at all. ``notify`` calls its
  ``on_arrival`` synchronously (the pull service answers it from there), and its owner expires it. This is
  what a pull answered by the connection's fast path uses: most pulls of a live consumer are held, and a
  task per held pull cost more than the pull itself.

``shutdown`` releases every held pull at once so the broker's drain does not wait out their timeouts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import trio

__all__ = ["HeldRequest", "LongPolling"]


class HeldRequest(Protocol):
    """A pull held without a task."""

    def on_arrival(self, max_offset: int) -> bool:
        """The queue grew to ``max_offset``: answer if possible; True when done (it is then forgotten)."""

    def on_shutdown(self) -> None:
        """The broker is stopping: answer now with whatever there is."""


class LongPolling:
    """Waiting rooms per (topic, queue id)."""

    def __init__(self) -> None:
        self._lots: dict[tuple[str, int], trio.lowlevel.ParkingLot] = {}
        self._holds: dict[tuple[str, int], list[HeldRequest]] = {}
        self.closed = False
        self._task_waiters = 0
        self._held_requests = 0

    @property
    def held(self) -> int:
        """Pulls currently held (a gauge for metrics and tests)."""
        return self._task_waiters + self._held_requests

    def notify(self, topic: str, queue_id: int, max_offset: int) -> None:
        """The store appended to ``topic``/``queue_id`` (called synchronously by the writer)."""
        key = (topic, queue_id)
        lot = self._lots.get(key)
        if lot is not None:
            lot.unpark_all()
        holds = self._holds.get(key)
        if holds:
            keep = [h for h in holds if not h.on_arrival(max_offset)]
            self._held_requests -= len(holds) - len(keep)
            if keep:
                self._holds[key] = keep
            else:
                del self._holds[key]

    def hold(self, topic: str, queue_id: int, request: HeldRequest) -> None:
        """Hold ``request`` until ``notify`` finds it done, ``release`` drops it, or ``shutdown``."""
        self._holds.setdefault((topic, queue_id), []).append(request)
        self._held_requests += 1

    def release(self, topic: str, queue_id: int, request: HeldRequest) -> None:
        """Forget a held request (its owner answered it on timeout)."""
        holds = self._holds.get((topic, queue_id))
        if holds is None:
            return
        try:
            holds.remove(request)
        except ValueError:
            return
        self._held_requests -= 1
        if not holds:
            del self._holds[(topic, queue_id)]

    def shutdown(self) -> None:
        """Release every held pull now, and make later waits return at once."""
        self.closed = True
        for lot in self._lots.values():
            lot.unpark_all()
        holds, self._holds = self._holds, {}
        self._held_requests = 0
        for requests in holds.values():
            for request in requests:
                request.on_shutdown()

    async def wait(self, topic: str, queue_id: int, deadline: float, has_new: Callable[[], bool]) -> bool:
        """Wait until ``has_new()`` or the trio clock reaches ``deadline`` (or shutdown); returns ``has_new()``."""
        key = (topic, queue_id)
        lot = self._lots.get(key)
        if lot is None:
            lot = self._lots[key] = trio.lowlevel.ParkingLot()
        self._task_waiters += 1
        try:
            while not self.closed and not has_new():
                with trio.move_on_at(deadline) as scope:
                    await lot.park()
                if scope.cancelled_caught:
                    break
        finally:
            self._task_waiters -= 1
            if not lot.statistics().tasks_waiting and self._lots.get(key) is lot:
                del self._lots[key]
        return has_new()

    @property
    def waiting_queues(self) -> int:
        return len(set(self._lots) | set(self._holds))
