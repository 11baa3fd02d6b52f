"""The broker epoch: a number stored in ``<store>/config/brokerEpoch.json`` that grows with every broker start.

It is the high half of every queue-lock fencing epoch the broker grants (broker/locks.py,
``(broker_epoch << 32) | counter``): lock tables live in memory and their counters restart from 1, so without
it a grant after a restart could compare lower than one before. The HA issue increments it on a slave's
promotion too (:meth:`BrokerEpochStore.bump`), above every epoch its old master's lifetimes used, so that the new
master's grants outrank every grant of the old one (long ASYNC chaos seed 56: the master had started three times and
its slave twice, the promoted slave's grants took the old master's epoch 3, and a commit the returning old master
handed over ranked above them and fenced the new holder's commits). Two rules make sure of it:

* a slave raises its own epoch to its master's at every handshake (:meth:`BrokerEpochStore.raise_to`), so a slave
  restarted while its master was away still knows the lifetime it last followed;
* each master epoch (the HA succession, broker/store/ha/history.py) has a band of its own, ``2**16`` broker epochs
  from ``master_epoch << 16`` (:func:`promotion_floor`): a promotion goes at least there, above the lifetimes of the
  old master that this slave never followed too (restarts after its last handshake), unless the old master started
  65,536 times in its band.

The file also remembers the longest takeover time (lease + margin, ms) any lifetime of this store has granted
locks with: a restarted broker keeps free queues for their claimants that long (the restart grace,
docs/PROTOCOL.md "Queue-lock leases"), whatever its own lease setting is now.

The file is written atomically and fsynced *before* the broker grants anything, so a crash can never reuse
an epoch. Blocking file I/O: the coordination service runs :meth:`BrokerEpochStore.begin` in a thread.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any

from trimq.broker.store.atomic import StateFileError, read_json, write_json_atomic

__all__ = ["BrokerEpochError", "BrokerEpochFileError", "BrokerEpochStore", "EpochStart", "epoch_file_path",
           "promotion_floor"]

#: Broker epochs fit the high 31 bits of a non-negative int64 fencing epoch.
MAX_BROKER_EPOCH = 2**31 - 1

#: Broker epochs per master epoch (the module docstring): a master restarts up to 65,535 times in its band.
MASTER_EPOCH_BAND_BITS = 16


def promotion_floor(master_epoch: int) -> int:
    """The lowest broker epoch of ``master_epoch``'s band: where a slave promoted to that master epoch starts at
    least (0 past the 32,767th master epoch, whose bands would not fit: then only the known epochs count)."""
    floor = master_epoch << MASTER_EPOCH_BAND_BITS
    return floor if 0 < floor <= MAX_BROKER_EPOCH else 0


class BrokerEpochError(ValueError):
    """A broker epoch that cannot be used: the file's, one that cannot grow any more, or a master's out of range."""


class BrokerEpochFileError(BrokerEpochError, StateFileError):
    """The epoch file exists but does not hold a broker epoch (the broker does not start: StateFileError)."""


def epoch_file_path(store_dir: str) -> str:
    """``<store>/config/brokerEpoch.json``."""
    return os.path.join(store_dir, "config", "brokerEpoch.json")


@dataclass(frozen=True, slots=True)
class EpochStart:
    """What :meth:`BrokerEpochStore.begin` found and wrote.

    ``broker_epoch`` is this lifetime's epoch; ``restart_grace_ms`` how long free queues are kept for their
    claimants (0 on a store's first start: nobody can hold a lease on a broker that never granted one).
    """

    broker_epoch: int
    restart_grace_ms: int
    first_start: bool


class BrokerEpochStore:
    """Reads, increments and persists the broker epoch of one store (``path`` None: memory only, tests)."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.broker_epoch = 0
        self.max_takeover_ms = 0
        # bump and raise_to run in worker threads, maybe at once (a promotion while a handshake ends): each
        # changes the epoch and writes the file under the lock, so the file never ends below the memory
        self._lock = threading.Lock()

    def _read(self) -> dict[str, Any] | None:
        if self.path is None:
            return None
        data = read_json(self.path, None)
        if data is None:
            return None
        epoch = data.get("brokerEpoch") if isinstance(data, dict) else None
        longest = data.get("maxTakeoverMs", 0) if isinstance(data, dict) else None
        for name, value in (("brokerEpoch", epoch), ("maxTakeoverMs", longest)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise BrokerEpochFileError(f"{self.path}: {name} must be a non-negative integer, got {value!r}")
        assert isinstance(data, dict)
        return data

    def _write(self) -> None:
        if self.path is not None:
            write_json_atomic(self.path, {"brokerEpoch": self.broker_epoch, "maxTakeoverMs": self.max_takeover_ms})

    def begin(self, takeover_after_ms: int) -> EpochStart:
        """Start a broker lifetime that grants locks taken over after ``takeover_after_ms``: increment the epoch,
        remember the longest takeover time, persist both (blocking, fsync). Returns the epoch and the grace."""
        with self._lock:
            data = self._read()
            previous_epoch = int(data["brokerEpoch"]) if data is not None else 0
            previous_longest = int(data.get("maxTakeoverMs", 0)) if data is not None else 0
            if previous_epoch >= MAX_BROKER_EPOCH:
                raise BrokerEpochError(f"{self.path}: brokerEpoch {previous_epoch} cannot grow any more")
            self.broker_epoch = previous_epoch + 1
            self.max_takeover_ms = max(previous_longest, takeover_after_ms)
            self._write()
        # The grace covers what the *previous* lifetimes granted; a store's first start has nothing to wait for.
        return EpochStart(self.broker_epoch, previous_longest if data is not None else 0, data is None)

    def bump(self, above: int = 0) -> int:
        """Move the epoch past both itself and ``above`` during a lifetime (the HA issue's promotion of a slave:
        ``above`` is the newest epoch it knows its old master used); persists; returns it."""
        with self._lock:
            epoch = max(self.broker_epoch, above)
            if epoch >= MAX_BROKER_EPOCH:
                raise BrokerEpochError(f"{self.path}: brokerEpoch {epoch} cannot grow any more")
            self.broker_epoch = epoch + 1
            self._write()
            return self.broker_epoch

    def raise_to(self, broker_epoch: int) -> bool:
        """Raise the epoch to ``broker_epoch`` when that is higher (a slave learning its master's); persists then.
        Whether it grew."""
        if isinstance(broker_epoch, bool) or not isinstance(broker_epoch, int) or \
                not 0 <= broker_epoch <= MAX_BROKER_EPOCH:
            raise BrokerEpochError(f"brokerEpoch must be an integer in [0, {MAX_BROKER_EPOCH}], got {broker_epoch!r}")
        with self._lock:
            if broker_epoch <= self.broker_epoch:
                return False
            self.broker_epoch = broker_epoch
            self._write()
            return True
