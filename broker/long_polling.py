"""Long polling: hold a pull on a queue with nothing new until a message arrives or time runs out.

RocketMQ's PullRequestHoldService re-checks held pulls every few seconds and on arrival; here a held pull
parks on the queue's ParkingLot and the store's arrival listener unparks exactly the pulls waiting on the
queue that just grew, so there is no polling loop. ``shutdown`` releases every held pull at once so the
broker's drain does not wait out their timeouts.
"""

from __future__ import annotations

from collections.abc import Callable

import trio

__all__ = ["LongPolling"]


class LongPolling:
    """Waiting rooms per (topic, queue id)."""

    def __init__(self) -> None:
        self._lots: dict[tuple[str, int], trio.lowlevel.ParkingLot] = {}
        self.closed = False
        self.held = 0  # pulls currently held (a gauge for metrics and tests)

    def notify(self, topic: str, queue_id: int, max_offset: int) -> None:
        """The store appended to ``topic``/``queue_id`` (called synchronously by the writer)."""
        lot = self._lots.get((topic, queue_id))
        if lot is not None:
            lot.unpark_all()

    def shutdown(self) -> None:
        """Release every held pull now, and make later waits return at once."""
        self.closed = True
        for lot in self._lots.values():
            lot.unpark_all()

    async def wait(self, topic: str, queue_id: int, deadline: float, has_new: Callable[[], bool]) -> bool:
        """Wait until ``has_new()`` or the trio clock reaches ``deadline`` (or shutdown); returns ``has_new()``."""
        key = (topic, queue_id)
        lot = self._lots.get(key)
        if lot is None:
            lot = self._lots[key] = trio.lowlevel.ParkingLot()
        self.held += 1
        try:
            while not self.closed and not has_new():
                with trio.move_on_at(deadline) as scope:
                    await lot.park()
                if scope.cancelled_caught:
                    break
        finally:
            self.held -= 1
            if not lot.statistics().tasks_waiting and self._lots.get(key) is lot:
                del self._lots[key]
        return has_new()

    @property
    def waiting_queues(self) -> int:
        return len(self._lots)
