"""Queue allocation strategies: RocketMQ 4.9.3's six, quirks included, plus bounded-load consistent hashing.

Every strategy answers one question for one consumer: given the topic's queues and the group's client
ids, which queues are mine? Every member computes its own share independently, so a strategy must be a
pure function of its inputs. RocketMQ's ``RebalanceImpl`` sorts both lists before calling ``allocate``
(:func:`sorted_inputs` does the same), and the RocketMQ strategies here return exactly what RocketMQ
4.9.3 returns for the same sorted inputs (ROCKETMQ_FACTS.md §1-§2), odd corners included:

* ``AVG``: contiguous blocks, the first ``n % c`` consumers get one extra; consumers past ``n`` get nothing.
* ``AVG_BY_CIRCLE``: round robin.
* ``CONFIG``: the configured list, whatever the arguments (outsiders get it too).
* ``MACHINE_ROOM``: only brokers named ``room@name`` (exactly two parts after Java's ``split("@")``) in
  one of ``consumer_idcs``; the remainder queues are taken from the *tail* of the eligible list.
* ``MACHINE_ROOM_NEARBY``: own room first, then rooms without consumers in room-name order, each shared
  by the *full* client list through the inner strategy.
* ``CONSISTENT_HASH``: MD5 ring, ``"<cid>-<i>"`` virtual nodes, ``str(mq)`` keys; with 0 virtual nodes
  nobody gets anything.

``CONSISTENT_HASH_BOUNDED`` is trimq's own (DESIGN.md §6.4): consistent hashing with bounded loads.

Errors. Where RocketMQ throws ``IllegalArgumentException`` we raise :class:`ValueError` with the same
message. Where RocketMQ would throw ``NullPointerException`` (a required collaborator missing, a
``None`` where it dereferences) we raise :class:`TypeError` with a message naming what is missing.

Nothing here imports trio or does I/O.
"""

from __future__ import annotations

import bisect
import hashlib
import math
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from fractions import Fraction
from functools import lru_cache
from typing import Any, Protocol, runtime_checkable

from sortedcontainers import SortedDict

from trimq.protocol.message_queue import MessageQueue, java_string_key

__all__ = [
    "STRATEGY_NAMES",
    "AllocateMachineRoomNearby",
    "AllocateMessageQueueAveragely",
    "AllocateMessageQueueAveragelyByCircle",
    "AllocateMessageQueueByConfig",
    "AllocateMessageQueueByMachineRoom",
    "AllocateMessageQueueConsistentHash",
    "AllocateMessageQueueConsistentHashBounded",
    "AllocateStrategy",
    "ConsistentHashRouter",
    "MachineRoomResolver",
    "SplitRoomResolver",
    "allocate_all",
    "count_moved",
    "get_strategy",
    "md5_hash",
    "movement_benchmark",
    "simulate",
    "sorted_inputs",
]

HashFunction = Callable[[str], int]


@runtime_checkable
class AllocateStrategy(Protocol):
    """What every strategy offers: RocketMQ's ``AllocateMessageQueueStrategy``."""

    @property
    def name(self) -> str:
        """RocketMQ's ``getName()``, e.g. ``"AVG"`` or ``"MACHINE_ROOM_NEARBY-AVG"``."""
        ...

    def allocate(
        self, consumer_group: str, current_cid: str, mq_all: Sequence[MessageQueue], cid_all: Sequence[str]
    ) -> list[MessageQueue]:
        """The queues ``current_cid`` should consume, given all queues and all client ids (both sorted)."""
        ...


@runtime_checkable
class MachineRoomResolver(Protocol):
    """Tells which machine room a broker (by one of its queues) and a client are deployed in."""

    def broker_deploy_in(self, mq: MessageQueue) -> str: ...

    def consumer_deploy_in(self, client_id: str) -> str: ...


class SplitRoomResolver:
    """A resolver that takes the room as the text before the first ``separator``.

    ``SplitRoomResolver("-")`` maps broker ``IDC1-broker-a`` and client ``IDC1-CID-0`` to room ``IDC1``,
    like the resolver of RocketMQ's AllocateMachineRoomNearByTest.
    """

    def __init__(self, separator: str = "-") -> None:
        if not separator:
            raise ValueError("the room separator must be a non-empty string")
        self.separator = separator

    def broker_deploy_in(self, mq: MessageQueue) -> str:
        return mq.broker_name.split(self.separator)[0]

    def consumer_deploy_in(self, client_id: str) -> str:
        return client_id.split(self.separator)[0]


# --------------------------------------------------------------------------------------------------
# Validation shared by the strategies


def _check_common(current_cid: object, mq_all: object, cid_all: Any) -> bool:
    """RocketMQ's checks for AVG, AVG_BY_CIRCLE, CONSISTENT_HASH(+BOUNDED), MACHINE_ROOM_NEARBY, in order; then
    whether ``current_cid`` is a member (an outsider gets nothing: RocketMQ logs "[BUG]" and returns empty)."""
    if current_cid is None or (isinstance(current_cid, str) and len(current_cid) < 1):
        raise ValueError("currentCID is empty")
    if not isinstance(current_cid, str):
        raise TypeError(f"currentCID must be a str, got {type(current_cid).__name__}")
    if mq_all is None or len(mq_all) == 0:  # type: ignore[arg-type]
        raise ValueError("mqAll is null or mqAll empty")
    if cid_all is None or len(cid_all) == 0:
        raise ValueError("cidAll is null or cidAll empty")
    return current_cid in cid_all


def _java_split(text: str, sep: str) -> list[str]:
    """Java's ``String.split`` with a literal one-char regex and limit 0: trailing empty parts dropped."""
    parts = text.split(sep)
    if len(parts) == 1:  # no match: Java returns the input itself, even when it is ""
        return parts
    while parts and parts[-1] == "":
        parts.pop()
    return parts


# --------------------------------------------------------------------------------------------------
# RocketMQ's strategies


class AllocateMessageQueueAveragely:
    """``AVG``: contiguous blocks; the first ``n % c`` consumers get one queue more."""

    name = "AVG"

    def allocate(
        self, consumer_group: str, current_cid: str, mq_all: Sequence[MessageQueue], cid_all: Sequence[str]
    ) -> list[MessageQueue]:
        if not _check_common(current_cid, mq_all, cid_all):
            return []
        index = list(cid_all).index(current_cid)
        n, c = len(mq_all), len(cid_all)
        mod = n % c
        extra = mod > 0 and index < mod
        average_size = 1 if n <= c else n // c + (1 if extra else 0)
        start = index * average_size if extra else index * average_size + mod
        taken = min(average_size, n - start)  # <= 0 for consumers past the last queue
        # RocketMQ indexes with "% n"; start + i < n always, so it never wraps.
        return [mq_all[(start + i) % n] for i in range(taken)]

    def __repr__(self) -> str:
        return "AllocateMessageQueueAveragely()"


class AllocateMessageQueueAveragelyByCircle:
    """``AVG_BY_CIRCLE``: consumer ``i`` gets queues ``i, i+c, i+2c, ...``."""

    name = "AVG_BY_CIRCLE"

    def allocate(
        self, consumer_group: str, current_cid: str, mq_all: Sequence[MessageQueue], cid_all: Sequence[str]
    ) -> list[MessageQueue]:
        if not _check_common(current_cid, mq_all, cid_all):
            return []
        index = list(cid_all).index(current_cid)
        return [mq_all[j] for j in range(index, len(mq_all), len(cid_all))]

    def __repr__(self) -> str:
        return "AllocateMessageQueueAveragelyByCircle()"


class AllocateMessageQueueByConfig:
    """``CONFIG``: always the configured list, with no validation; outsiders get it too.

    RocketMQ returns the very list object it was given; so do we. When no list was configured RocketMQ
    returns ``null``, which RebalanceImpl treats as "nothing"; we return a fresh empty list.
    """

    name = "CONFIG"

    def __init__(self, message_queues: Sequence[MessageQueue] | None = None) -> None:
        self.message_queues: list[MessageQueue] | None = (
            message_queues if message_queues is None or isinstance(message_queues, list) else list(message_queues)
        )

    def allocate(
        self, consumer_group: str, current_cid: str, mq_all: Sequence[MessageQueue], cid_all: Sequence[str]
    ) -> list[MessageQueue]:
        if self.message_queues is None:
            return []
        return self.message_queues

    def __repr__(self) -> str:
        return f"AllocateMessageQueueByConfig({self.message_queues!r})"


class AllocateMessageQueueByMachineRoom:
    """``MACHINE_ROOM``: share the queues of brokers named ``<room>@<name>`` with ``room`` in ``consumer_idcs``.

    Validation differs from the others: a blank (whitespace-only) ``current_cid`` is rejected too.
    Every consumer shares all eligible rooms (client ids are not interpreted). Consumer ``i`` gets the
    block ``[i*base, i*base+base)`` and, if ``i < rem``, also ``eligible[base*c + i]`` from the tail.
    A ``None`` ``consumer_idcs`` raises TypeError (RocketMQ: NullPointerException) only once a broker
    name of the eligible ``x@y`` shape is examined, as in RocketMQ.
    """

    name = "MACHINE_ROOM"

    def __init__(self, consumer_idcs: Iterable[str] | None = None) -> None:
        self.consumer_idcs: set[str] | None = None if consumer_idcs is None else set(consumer_idcs)

    def allocate(
        self, consumer_group: str, current_cid: str, mq_all: Sequence[MessageQueue], cid_all: Sequence[str]
    ) -> list[MessageQueue]:
        if current_cid is None or (isinstance(current_cid, str) and current_cid.strip() == ""):
            raise ValueError("currentCID is empty")  # commons-lang isBlank
        if not mq_all:
            raise ValueError("mqAll is null or mqAll empty")
        if not cid_all:
            raise ValueError("cidAll is null or cidAll empty")
        if current_cid not in cid_all:
            return []
        current_index = list(cid_all).index(current_cid)
        eligible: list[MessageQueue] = []
        for mq in mq_all:
            parts = _java_split(mq.broker_name, "@")
            if len(parts) == 2:
                if self.consumer_idcs is None:
                    raise TypeError(
                        "MACHINE_ROOM needs consumer_idcs (a set of machine-room names); it is None "
                        f"(RocketMQ: NullPointerException) while examining broker {mq.broker_name!r}"
                    )
                if parts[0] in self.consumer_idcs:
                    eligible.append(mq)
        c = len(cid_all)
        base, rem = divmod(len(eligible), c)
        start = base * current_index
        result = eligible[start : start + base]
        if rem > current_index:
            result.append(eligible[current_index + base * c])
        return result

    def __repr__(self) -> str:
        idcs = None if self.consumer_idcs is None else sorted(self.consumer_idcs)
        return f"AllocateMessageQueueByMachineRoom({idcs!r})"


class AllocateMachineRoomNearby:
    """``MACHINE_ROOM_NEARBY-<inner>``: prefer queues in the consumer's own machine room.

    Own-room queues are shared by the own room's consumers through ``inner``; then every room that has
    queues but no consumer at all is shared by the full ``cid_all`` through ``inner``, rooms in name
    order. The result is therefore not in ``mq_all`` order. A missing ``inner`` or ``resolver`` raises
    TypeError (RocketMQ: NullPointerException at construction).
    """

    def __init__(self, inner: AllocateStrategy | None, resolver: MachineRoomResolver | None) -> None:
        if inner is None:
            raise TypeError("allocateMessageQueueStrategy is null: MACHINE_ROOM_NEARBY needs inner=<strategy>")
        if resolver is None:
            raise TypeError("machineRoomResolver is null: MACHINE_ROOM_NEARBY needs resolver=<resolver>")
        if not callable(getattr(inner, "allocate", None)):
            raise TypeError(f"inner must be an allocation strategy (with .allocate), got {inner!r}")
        for method in ("broker_deploy_in", "consumer_deploy_in"):
            if not callable(getattr(resolver, method, None)):
                raise TypeError(f"resolver must have a {method}() method, got {resolver!r}")
        self.inner = inner
        self.resolver = resolver

    @property
    def name(self) -> str:
        return "MACHINE_ROOM_NEARBY-" + self.inner.name

    def allocate(
        self, consumer_group: str, current_cid: str, mq_all: Sequence[MessageQueue], cid_all: Sequence[str]
    ) -> list[MessageQueue]:
        if not _check_common(current_cid, mq_all, cid_all):
            return []
        # Rooms sorted by name, Java's TreeMap<String, ...> order; input order kept inside a room.
        mr2mq: dict[str, list[MessageQueue]] = {}
        for mq in mq_all:
            room = self.resolver.broker_deploy_in(mq)
            if not room:
                raise ValueError(f"Machine room is null for mq {mq}")
            mr2mq.setdefault(room, []).append(mq)
        mr2c: dict[str, list[str]] = {}
        for cid in cid_all:
            room = self.resolver.consumer_deploy_in(cid)
            if not room:
                raise ValueError(f"Machine room is null for consumer id {cid}")
            mr2c.setdefault(room, []).append(cid)

        results: list[MessageQueue] = []
        current_room = self.resolver.consumer_deploy_in(current_cid)
        own_queues = mr2mq.pop(current_room, None)
        if own_queues:
            results.extend(self.inner.allocate(consumer_group, current_cid, own_queues, mr2c[current_room]))
        for room in sorted(mr2mq, key=java_string_key):
            if room not in mr2c:  # nobody lives there: everyone shares these queues
                results.extend(self.inner.allocate(consumer_group, current_cid, mr2mq[room], cid_all))
        return results

    def __repr__(self) -> str:
        return f"AllocateMachineRoomNearby({self.inner!r}, {self.resolver!r})"


# --------------------------------------------------------------------------------------------------
# Consistent hashing


def md5_hash(key: str) -> int:
    """RocketMQ's default ring hash: MD5 digest bytes 0..3, big-endian, unsigned (0 .. 2**32-1)."""
    return int.from_bytes(hashlib.md5(key.encode("utf-8")).digest()[:4], "big")


class ConsistentHashRouter:
    """RocketMQ's ``ConsistentHashRouter`` over string node keys.

    The ring is a sorted map hash -> (node key, replica index); a virtual node whose hash equals an
    existing one overwrites it. ``route_node`` takes the first ring entry at or after the key's hash,
    wrapping to the smallest.
    """

    def __init__(
        self, nodes: Iterable[str] = (), virtual_node_count: int = 10, hash_function: HashFunction | None = None
    ) -> None:
        self.hash_function: HashFunction = hash_function if hash_function is not None else md5_hash
        self._ring: SortedDict = SortedDict()
        self._replicas: dict[str, int] = {}  # node key -> vnodes currently on the ring
        for node in nodes:
            self.add_node(node, virtual_node_count)

    def _hash(self, key: str) -> int:
        h = self.hash_function(key)
        if isinstance(h, bool) or not isinstance(h, int):
            raise TypeError(f"hash_function must return an int, returned {type(h).__name__} for {key!r}")
        return h

    def add_node(self, node: str, virtual_node_count: int) -> None:
        """Add ``virtual_node_count`` vnodes ``"<node>-<i>"``, numbered after the node's existing ones."""
        if virtual_node_count < 0:
            raise ValueError(f"illegal virtual node counts :{virtual_node_count}")
        existing = self._replicas.get(node, 0)
        for i in range(virtual_node_count):
            replica = i + existing
            h = self._hash(f"{node}-{replica}")
            old = self._ring.get(h)
            if old is not None:
                self._replicas[old[0]] -= 1
            self._ring[h] = (node, replica)
            self._replicas[node] = self._replicas.get(node, 0) + 1

    def remove_node(self, node: str) -> None:
        """Remove every vnode of ``node``."""
        for h in [h for h, (owner, _) in self._ring.items() if owner == node]:
            del self._ring[h]
        self._replicas.pop(node, None)

    def existing_replicas(self, node: str) -> int:
        """How many vnodes of ``node`` are on the ring (after overwrites)."""
        return self._replicas.get(node, 0)

    def route_node(self, key: str) -> str | None:
        """The node owning ``key``: first vnode clockwise from its hash (inclusive), or None if empty."""
        if not self._ring:
            return None
        i = self._ring.bisect_left(self._hash(key))
        if i == len(self._ring):
            i = 0
        node: str = self._ring.peekitem(i)[1][0]
        return node

    def __len__(self) -> int:
        return len(self._ring)


class AllocateMessageQueueConsistentHash:
    """``CONSISTENT_HASH``: each queue goes to the owner of ``str(mq)`` on an MD5 ring of the client ids.

    The ring is rebuilt from ``cid_all`` on every call. With ``virtual_node_count == 0`` the ring is
    empty and every consumer gets nothing (the queues stay unassigned, no error), as in RocketMQ.
    """

    name = "CONSISTENT_HASH"

    def __init__(self, virtual_node_count: int = 10, hash_function: HashFunction | None = None) -> None:
        if isinstance(virtual_node_count, bool) or not isinstance(virtual_node_count, int):
            raise TypeError(f"virtual_node_count must be an int, got {virtual_node_count!r}")
        if virtual_node_count < 0:
            raise ValueError(f"illegal virtualNodeCnt :{virtual_node_count}")
        if hash_function is not None and not callable(hash_function):
            raise TypeError(f"hash_function must be a callable str -> int, got {hash_function!r}")
        self.virtual_node_count = virtual_node_count
        self.hash_function = hash_function

    def allocate(
        self, consumer_group: str, current_cid: str, mq_all: Sequence[MessageQueue], cid_all: Sequence[str]
    ) -> list[MessageQueue]:
        if not _check_common(current_cid, mq_all, cid_all):
            return []
        router = ConsistentHashRouter(cid_all, self.virtual_node_count, self.hash_function)
        return [mq for mq in mq_all if router.route_node(str(mq)) == current_cid]

    def __repr__(self) -> str:
        return f"AllocateMessageQueueConsistentHash({self.virtual_node_count})"


DEFAULT_BOUNDED_VIRTUAL_NODES = 40


class AllocateMessageQueueConsistentHashBounded:
    """``CONSISTENT_HASH_BOUNDED``: consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam).

    Every member computes the same global assignment: distinct queues in MessageQueue order, each goes
    to the first client clockwise from the hash of ``str(mq)`` on an MD5 ring of ``"<cid>-<i>"`` virtual
    nodes whose load is still below ``max_load(n, c) = ceil(n / c * (1 + epsilon))``. So every queue has
    exactly one owner, nobody holds more than the cap, and a join or leave moves few queues (the ring
    decides, the cap only spills the overflow to the next client). The result depends only on the
    *sets* of queues and client ids (duplicates are collapsed; input order does not matter), never on
    ``current_cid`` except to pick its share. Validation is AVG's.
    """

    name = "CONSISTENT_HASH_BOUNDED"

    def __init__(
        self,
        epsilon: float = 0.25,
        virtual_node_count: int = DEFAULT_BOUNDED_VIRTUAL_NODES,
        hash_function: HashFunction | None = None,
    ) -> None:
        if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)):
            raise TypeError(f"epsilon must be a number, got {epsilon!r}")
        if not math.isfinite(epsilon) or epsilon <= 0:
            raise ValueError(f"epsilon must be a finite number > 0, got {epsilon!r}")
        if isinstance(virtual_node_count, bool) or not isinstance(virtual_node_count, int):
            raise TypeError(f"virtual_node_count must be an int, got {virtual_node_count!r}")
        if virtual_node_count < 1:
            raise ValueError(f"virtual_node_count must be >= 1 for {self.name}, got {virtual_node_count}")
        if hash_function is not None and not callable(hash_function):
            raise TypeError(f"hash_function must be a callable str -> int, got {hash_function!r}")
        self.epsilon = epsilon
        self.virtual_node_count = virtual_node_count
        self.hash_function = hash_function

    def max_load(self, queues: int, consumers: int) -> int:
        """The cap: ``ceil(queues / consumers * (1 + epsilon))``, computed exactly."""
        return math.ceil(Fraction(queues) * (1 + Fraction(self.epsilon)) / consumers)

    def assignment(self, mq_all: Sequence[MessageQueue], cid_all: Sequence[str]) -> dict[str, list[MessageQueue]]:
        """The global assignment: every distinct client id -> its queues (in MessageQueue order)."""
        mqs = tuple(sorted(set(mq_all)))
        cids = tuple(sorted(set(cid_all), key=java_string_key))
        args = (mqs, cids, self.virtual_node_count, Fraction(self.epsilon), self.hash_function)
        try:
            hash(self.hash_function)
        except TypeError:  # an unhashable callable cannot be a cache key; compute without the cache
            table = _bounded_assignment.__wrapped__(*args)
        else:
            table = _bounded_assignment(*args)
        return {cid: list(queues) for cid, queues in table.items()}

    def allocate(
        self, consumer_group: str, current_cid: str, mq_all: Sequence[MessageQueue], cid_all: Sequence[str]
    ) -> list[MessageQueue]:
        if not _check_common(current_cid, mq_all, cid_all):
            return []
        return self.assignment(mq_all, cid_all)[current_cid]

    def __repr__(self) -> str:
        return (
            f"AllocateMessageQueueConsistentHashBounded(epsilon={self.epsilon}, "
            f"virtual_node_count={self.virtual_node_count})"
        )


@lru_cache(maxsize=64)
def _bounded_assignment(
    mqs: tuple[MessageQueue, ...],
    cids: tuple[str, ...],
    virtual_node_count: int,
    epsilon: Fraction,
    hash_function: HashFunction | None,
) -> dict[str, tuple[MessageQueue, ...]]:
    # Cached because allocate_all (and a rebalance round across many topics) asks the same question
    # once per member; the answer is immutable tuples so sharing it is safe.
    hash_fn = md5_hash if hash_function is None else _checked_hash(hash_function)
    # Ties on a hash are broken by (cid, replica) so the ring is a pure function of the id set.
    ring = sorted((hash_fn(f"{cid}-{i}"), cid, i) for cid in cids for i in range(virtual_node_count))
    points = [h for h, _, _ in ring]
    cap = math.ceil(len(mqs) * (1 + epsilon) / len(cids))
    load = dict.fromkeys(cids, 0)
    owned: dict[str, list[MessageQueue]] = {cid: [] for cid in cids}
    for mq in mqs:
        start = bisect.bisect_left(points, hash_fn(str(mq)))
        # cap * c >= n * (1 + eps) > n, so some client always has room; the walk ends within one lap.
        for step in range(len(ring)):
            cid = ring[(start + step) % len(ring)][1]
            if load[cid] < cap:
                load[cid] += 1
                owned[cid].append(mq)
                break
    return {cid: tuple(queues) for cid, queues in owned.items()}


def _checked_hash(hash_function: HashFunction) -> HashFunction:
    def checked(key: str) -> int:
        h = hash_function(key)
        if isinstance(h, bool) or not isinstance(h, int):
            raise TypeError(f"hash_function must return an int, returned {type(h).__name__} for {key!r}")
        return h

    return checked


# --------------------------------------------------------------------------------------------------
# Registry


STRATEGY_NAMES: tuple[str, ...] = (
    "AVG",
    "AVG_BY_CIRCLE",
    "CONFIG",
    "MACHINE_ROOM",
    "MACHINE_ROOM_NEARBY",
    "CONSISTENT_HASH",
    "CONSISTENT_HASH_BOUNDED",
)

_PARAMS: dict[str, tuple[str, ...]] = {
    "AVG": (),
    "AVG_BY_CIRCLE": (),
    "CONFIG": ("message_queues",),
    "MACHINE_ROOM": ("consumer_idcs",),
    "MACHINE_ROOM_NEARBY": ("inner", "resolver"),
    "CONSISTENT_HASH": ("virtual_node_count", "hash_function"),
    "CONSISTENT_HASH_BOUNDED": ("epsilon", "virtual_node_count", "hash_function"),
}


def get_strategy(name: str, **params: Any) -> AllocateStrategy:
    """Build a strategy by RocketMQ name (case-insensitive).

    ``CONFIG(message_queues)``, ``MACHINE_ROOM(consumer_idcs)``, ``MACHINE_ROOM_NEARBY(inner, resolver)``
    (``inner`` may be a strategy or a strategy name; ``"MACHINE_ROOM_NEARBY-AVG"`` implies
    ``inner="AVG"``), ``CONSISTENT_HASH(virtual_node_count=10, hash_function=None)``,
    ``CONSISTENT_HASH_BOUNDED(epsilon=0.25, virtual_node_count=40, hash_function=None)``.
    An unknown name or parameter raises ValueError listing the valid ones.
    """
    if not isinstance(name, str):
        raise ValueError(f"strategy name must be a string, one of {', '.join(STRATEGY_NAMES)}; got {name!r}")
    key = name.strip().upper()
    if key.startswith("MACHINE_ROOM_NEARBY-") and "inner" not in params:
        params = {**params, "inner": key[len("MACHINE_ROOM_NEARBY-") :]}
        key = "MACHINE_ROOM_NEARBY"
    if key not in _PARAMS:
        raise ValueError(f"unknown allocation strategy {name!r}; valid names: {', '.join(STRATEGY_NAMES)}")
    unknown = sorted(set(params) - set(_PARAMS[key]))
    if unknown:
        accepted = ", ".join(_PARAMS[key]) or "none"
        raise ValueError(f"strategy {key} does not take {', '.join(unknown)} (parameters: {accepted})")
    if key == "AVG":
        return AllocateMessageQueueAveragely()
    if key == "AVG_BY_CIRCLE":
        return AllocateMessageQueueAveragelyByCircle()
    if key == "CONFIG":
        return AllocateMessageQueueByConfig(params.get("message_queues"))
    if key == "MACHINE_ROOM":
        return AllocateMessageQueueByMachineRoom(params.get("consumer_idcs"))
    if key == "MACHINE_ROOM_NEARBY":
        inner = params.get("inner")
        if isinstance(inner, str):
            inner = get_strategy(inner)
        return AllocateMachineRoomNearby(inner, params.get("resolver"))
    if key == "CONSISTENT_HASH":
        return AllocateMessageQueueConsistentHash(**params)
    return AllocateMessageQueueConsistentHashBounded(**params)


# --------------------------------------------------------------------------------------------------
# Simulation helpers (back `trimq-admin allocate`)


def sorted_inputs(mq_all: Iterable[MessageQueue], cid_all: Iterable[str]) -> tuple[list[MessageQueue], list[str]]:
    """Sort queues and client ids as RocketMQ's RebalanceImpl does before calling a strategy."""
    return sorted(mq_all), sorted(cid_all, key=java_string_key)


def allocate_all(
    strategy: AllocateStrategy, consumer_group: str, mq_all: Iterable[MessageQueue], cid_all: Iterable[str]
) -> dict[str, list[MessageQueue]]:
    """Run ``strategy`` for every member on sorted inputs: client id -> its queues (ids in sorted order)."""
    mqs, cids = sorted_inputs(mq_all, cid_all)
    return {cid: list(strategy.allocate(consumer_group, cid, mqs, cids)) for cid in cids}


def _owners(assignment: Mapping[str, Iterable[MessageQueue]]) -> dict[MessageQueue, frozenset[str]]:
    owners: dict[MessageQueue, set[str]] = {}
    for cid, queues in assignment.items():
        for mq in queues:
            owners.setdefault(mq, set()).add(cid)
    return {mq: frozenset(s) for mq, s in owners.items()}


def count_moved(before: Mapping[str, Iterable[MessageQueue]], after: Mapping[str, Iterable[MessageQueue]]) -> int:
    """How many queues changed owner(s) between two assignments.

    A queue that was unassigned and became assigned, or the reverse, counts as moved; a queue owned by
    several consumers (CONFIG) moves when its owner set changes.
    """
    b, a = _owners(before), _owners(after)
    return sum(1 for mq in b.keys() | a.keys() if b.get(mq, frozenset()) != a.get(mq, frozenset()))


def _consumer_id(i: int) -> str:
    return f"CID-{i:04d}"


def simulate(
    strategy_name: str,
    queues: int,
    consumers: int,
    join: int = 0,
    leave: int = 0,
    *,
    topic: str = "TopicTest",
    brokers: Sequence[str] = ("broker-a",),
    consumer_group: str = "simulated_group",
    **params: Any,
) -> dict[str, Any]:
    """Allocate ``queues`` queues per broker among ``consumers`` members, then after a membership change.

    Queues are ``MessageQueue(topic, broker, 0..queues-1)`` for each broker in ``brokers`` (RocketMQ
    topics have the same queue count on every broker). Consumers are ``CID-0000``, ``CID-0001``, ...;
    the change removes the ``leave`` lowest-numbered (oldest) members and adds ``join`` new ones numbered
    after the highest, so joiners sort last. ``params`` go to :func:`get_strategy`.

    Returns ``strategy`` (its name), ``queues`` (all MessageQueues), ``consumers_before``/``_after``,
    ``before``/``after`` (client id -> list of MessageQueue), ``moved`` (:func:`count_moved`),
    ``unassigned_before``/``_after`` and ``max_load_before``/``_after``.
    """
    checks = (("queues", queues, 1), ("consumers", consumers, 1), ("join", join, 0), ("leave", leave, 0))
    for label, value, low in checks:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{label} must be an integer >= {low}, got {value!r}")
    if leave >= consumers + join:
        raise ValueError(f"leave ({leave}) must leave at least one consumer of {consumers} + {join} joining")
    if not brokers:
        raise ValueError("brokers must name at least one broker")
    strategy = get_strategy(strategy_name, **params)
    mq_all = [MessageQueue(topic, broker, q) for broker in brokers for q in range(queues)]
    cids_before = [_consumer_id(i) for i in range(consumers)]
    cids_after = cids_before[leave:] + [_consumer_id(consumers + k) for k in range(join)]
    before = allocate_all(strategy, consumer_group, mq_all, cids_before)
    after = allocate_all(strategy, consumer_group, mq_all, cids_after)

    def unassigned(assignment: Mapping[str, list[MessageQueue]]) -> int:
        return len(set(mq_all) - set(_owners(assignment)))

    return {
        "strategy": strategy.name,
        "queues": sorted(mq_all),
        "consumers_before": sorted(cids_before, key=java_string_key),
        "consumers_after": sorted(cids_after, key=java_string_key),
        "before": before,
        "after": after,
        "moved": count_moved(before, after),
        "unassigned_before": unassigned(before),
        "unassigned_after": unassigned(after),
        "max_load_before": max((len(v) for v in before.values()), default=0),
        "max_load_after": max((len(v) for v in after.values()), default=0),
    }


def movement_benchmark(
    strategy_names: Sequence[str] = ("AVG", "CONSISTENT_HASH", "CONSISTENT_HASH_BOUNDED"),
    *,
    scenarios: int = 60,
    seed: int = 20240601,
) -> dict[str, Any]:
    """Total queues moved by each strategy over the same seeded random joins/leaves.

    Each scenario draws 4..64 queues over one or two brokers, 2..16 members with random
    ``ip@pid``-style ids (so newcomers sort anywhere, as real client ids do), then one to three members
    join or leave (random ones). Returns ``{"scenarios": N, "seed": seed, "moved": {name: total},
    "per_scenario": [{"queues", "consumers", "change", name: moved, ...}, ...]}``. Deterministic.
    """
    rng = random.Random(seed)
    totals = dict.fromkeys(strategy_names, 0)
    rows: list[dict[str, Any]] = []
    strategies = {name: get_strategy(name) for name in strategy_names}

    def new_id() -> str:
        return f"10.0.{rng.randrange(256)}.{rng.randrange(1, 255)}@{rng.randrange(1000, 65536)}"

    for _ in range(scenarios):
        n_brokers = rng.choice((1, 2))
        per_broker = rng.randint(2, 32)
        mq_all = [
            MessageQueue("TopicBench", f"broker-{chr(97 + b)}", q) for b in range(n_brokers) for q in range(per_broker)
        ]
        members = sorted({new_id() for _ in range(rng.randint(2, 16))})
        k = rng.randint(1, 3)
        if rng.random() < 0.5 or len(members) <= k:
            change = f"+{k}"
            after_members = sorted(set(members) | {new_id() for _ in range(k)})
        else:
            change = f"-{k}"
            gone = set(rng.sample(members, k))
            after_members = [m for m in members if m not in gone]
        row: dict[str, Any] = {"queues": len(mq_all), "consumers": len(members), "change": change}
        for name, strategy in strategies.items():
            moved = count_moved(
                allocate_all(strategy, "bench", mq_all, members), allocate_all(strategy, "bench", mq_all, after_members)
            )
            totals[name] += moved
            row[name] = moved
        rows.append(row)
    return {"scenarios": scenarios, "seed": seed, "moved": totals, "per_scenario": rows}
