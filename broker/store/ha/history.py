"""The HA state of a store: its role override, master epoch and epoch history (``<store>/config/haState.json``).

A **master epoch** numbers the masters of one broker name: the first master has epoch 1, a promoted slave
takes the newest epoch it knows plus one. The **epoch history** lists ``(epoch, start offset)``: from which
commit-log offset each master epoch wrote. A slave adopts its master's history at every handshake; a promotion
appends ``(new epoch, the promoted slave's max offset)``.

A broker that comes back from an older epoch (a former master, or a slave that followed it) may hold a tail the
new master never had: :func:`truncation_point` says where its log must be cut before it follows the new master,
as Kafka's leader-epoch truncation does. Everything below that point is byte-identical on both sides (it was
replicated, or written under the same epoch by the same master).

Pure functions and a small file; no trio.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trimq.broker.store.atomic import StateFileError, read_json, write_json_atomic

__all__ = ["HAState", "ha_state_path", "truncation_point"]


def ha_state_path(store_dir: str) -> str:
    """``<store>/config/haState.json``."""
    return os.path.join(store_dir, "config", "haState.json")


def truncation_point(history: list[tuple[int, int]], slave_epoch: int, slave_max: int, master_max: int) -> int:
    """Where a slave's log must end before it follows a master with ``history`` and max offset ``master_max``.

    ``slave_epoch`` is the newest master epoch the slave's log was written under. The slave keeps ``[0, t)`` with
    ``t`` = the smallest of its max offset, the master's max offset and the start of the first master epoch newer
    than the slave's (bytes it holds past that were written by an older master and never replicated to the newer
    one). A slave that knows no epoch (0: a store from before HA, or whose state file was lost) is trusted as
    RocketMQ trusts every slave: only what the master does not have is cut.
    """
    point = min(slave_max, master_max)
    if slave_epoch > 0:
        for epoch, start in sorted(history):
            if epoch > slave_epoch:
                point = min(point, start)
                break
    return max(0, point)


@dataclass
class HAState:
    """What a store remembers about its HA role across restarts (``path`` None: memory only)."""

    path: str | None
    #: The role and broker id set by a promotion or demotion; they win over the configured ones at start.
    broker_role: str = ""
    broker_id: int = -1
    #: ``[(master epoch, start offset)]``, ascending.
    history: list[tuple[int, int]] = field(default_factory=list)

    @property
    def master_epoch(self) -> int:
        """The newest master epoch this store knows (0: none)."""
        return self.history[-1][0] if self.history else 0

    def load(self) -> HAState:
        """Read the file (a missing file is an empty state); ValueError naming the file when it is not one."""
        if self.path is None:
            return self
        data = read_json(self.path, None)
        if data is None:
            return self
        try:
            self.broker_role = str(data.get("brokerRole", ""))
            self.broker_id = int(data.get("brokerId", -1))
            self.history = sorted((int(e), int(s)) for e, s in data.get("epochHistory", []))
        except (AttributeError, TypeError, ValueError) as exc:
            raise StateFileError(f"{self.path}: not an HA state file ({exc})") from None
        return self

    def to_json(self) -> dict[str, Any]:
        return {"brokerRole": self.broker_role, "brokerId": self.broker_id,
                "epochHistory": [[e, s] for e, s in self.history]}

    def save(self) -> None:
        """Write the file atomically (blocking, fsync)."""
        if self.path is not None:
            write_json_atomic(self.path, self.to_json())

    def lost_tail_boundary(self, epoch: int, offset: int, queue_offset_at: Callable[[int], int]) -> int | None:
        """For a queue position ``offset`` reached under master epoch ``epoch``: the queue offset where the first
        newer epoch began in this log (``queue_offset_at`` maps a commit-log offset to the queue's offset there)
        when ``offset`` lies past it, i.e. was read from records this log does not have (an ASYNC master's lost
        tail); None when the position stands (``epoch`` not older than this log's newest, or negative: not said)."""
        if epoch < 0 or epoch >= self.master_epoch:
            return None
        start = next((s for e, s in self.history if e > epoch), None)
        if start is None:
            return None
        boundary = queue_offset_at(start)
        return boundary if offset > boundary else None

    def begin_epoch(self, epoch: int, start_offset: int) -> None:
        """Record that master epoch ``epoch`` writes from ``start_offset`` on (a promotion, a first master)."""
        if self.history and epoch <= self.history[-1][0]:
            raise ValueError(f"master epoch {epoch} is not newer than {self.history[-1][0]}")
        self.history.append((epoch, start_offset))

    def adopt(self, history: list[tuple[int, int]] | tuple[tuple[int, int], ...]) -> None:
        """A slave takes its master's history whole: once cut to the truncation point, its log is a prefix of
        the master's."""
        self.history = sorted((int(e), int(s)) for e, s in history)
