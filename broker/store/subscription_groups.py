"""Subscription-group configs: RocketMQ's SubscriptionGroupManager (``config/subscriptionGroup.json``).

A consumer group's config says how the broker retries its failed messages: ``retry_queue_nums`` queues in
``%RETRY%<group>`` (0 = the broker keeps no retries for the group) and ``retry_max_times`` deliveries before
a message goes to ``%DLQ%<group>``. Defaults are RocketMQ's SubscriptionGroupConfig (ROCKETMQ_FACTS.md §6).

Like RocketMQ 4.9.3's ``findSubscriptionGroupConfig``, an unknown group is created with the defaults on
first use when the broker's ``auto_create_subscription_group`` is on (the default); with it off, an unknown
group is "not found" and the callers answer SUBSCRIPTION_GROUP_NOT_EXIST.

The file layout is RocketMQ's: ``{"subscriptionGroupTable": {group: {...camelCase fields...}},
"dataVersion": {"counter": n, "timestamp": ms}}``. It is written atomically (temp file, fsync, rename).
Mutations happen synchronously (no checkpoint in the middle, so a cancelled handler never leaves half a
change); the durable write follows in a worker thread, serialized so the newest table always lands last.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass
from typing import Any

import trio

from trimq.broker.store.atomic import StateFileError, read_json, write_json_atomic
from trimq.protocol.validation import InvalidNameError, check_group
from trimq.runtime.logs import get_logger

__all__ = ["FILE_NAME", "SubscriptionGroupConfig", "SubscriptionGroupManager"]

log = get_logger("trimq.broker.subscription_groups")

FILE_NAME = "subscriptionGroup.json"

#: Upper bound for ``retryQueueNums`` (RocketMQ has none; a retry topic with more queues than any topic
#: may have is a typo, not a plan).
MAX_RETRY_QUEUE_NUMS = 1024

# camelCase wire/file name -> snake_case attribute, RocketMQ's SubscriptionGroupConfig fields.
_WIRE_NAMES: dict[str, str] = {
    "groupName": "group_name",
    "consumeEnable": "consume_enable",
    "consumeFromMinEnable": "consume_from_min_enable",
    "consumeBroadcastEnable": "consume_broadcast_enable",
    "retryQueueNums": "retry_queue_nums",
    "retryMaxTimes": "retry_max_times",
    "brokerId": "broker_id",
    "whichBrokerWhenConsumeSlowly": "which_broker_when_consume_slowly",
    "notifyConsumerIdsChangedEnable": "notify_consumer_ids_changed_enable",
}


@dataclass(slots=True)
class SubscriptionGroupConfig:
    """One group's config, RocketMQ's defaults (retryQueueNums 1, retryMaxTimes 16, everything enabled)."""

    group_name: str
    consume_enable: bool = True
    consume_from_min_enable: bool = True
    consume_broadcast_enable: bool = True
    retry_queue_nums: int = 1
    retry_max_times: int = 16
    broker_id: int = 0
    which_broker_when_consume_slowly: int = 1
    notify_consumer_ids_changed_enable: bool = True

    def to_wire(self) -> dict[str, Any]:
        """The camelCase map used on the wire and in the JSON file."""
        return {wire: getattr(self, attr) for wire, attr in _WIRE_NAMES.items()}

    @classmethod
    def from_wire(cls, data: object, *, group_name: str | None = None) -> SubscriptionGroupConfig:
        """Build and validate a config from its camelCase map; missing fields take RocketMQ's defaults.

        ``group_name`` fills in ``groupName`` when the map lacks it (the file's table is keyed by group).
        Raises ValueError naming the bad field.
        """
        if not isinstance(data, dict):
            raise ValueError(f"a subscription group config must be a map, got {type(data).__name__}")
        unknown = sorted(str(k) for k in data if k not in _WIRE_NAMES)
        if unknown:
            raise ValueError(f"unknown subscription group field(s) {', '.join(unknown)}")
        values: dict[str, Any] = {}
        for wire, attr in _WIRE_NAMES.items():
            if wire in data:
                values[attr] = data[wire]
        if "group_name" not in values:
            if group_name is None:
                raise ValueError("groupName is missing")
            values["group_name"] = group_name
        cfg = cls(**values)
        cfg.validate()
        return cfg

    def validate(self) -> SubscriptionGroupConfig:
        """Check types and ranges; raise ValueError naming the field (camelCase, as the user wrote it)."""
        try:
            check_group(self.group_name)
        except InvalidNameError as exc:
            raise ValueError(f"groupName: {exc}") from None
        wire_of = {attr: wire for wire, attr in _WIRE_NAMES.items()}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.type in (bool, "bool") and not isinstance(value, bool):
                raise ValueError(f"{wire_of[f.name]} = {value!r}: must be true or false")
            if f.type in (int, "int") and (isinstance(value, bool) or not isinstance(value, int)):
                raise ValueError(f"{wire_of[f.name]} = {value!r}: must be an integer")
        if not 0 <= self.retry_queue_nums <= MAX_RETRY_QUEUE_NUMS:
            raise ValueError(f"retryQueueNums = {self.retry_queue_nums}: must be in [0, {MAX_RETRY_QUEUE_NUMS}]")
        if not -1 <= self.retry_max_times <= 2**31 - 1:
            raise ValueError(f"retryMaxTimes = {self.retry_max_times}: must be in [-1, {2**31 - 1}]")
        if self.broker_id < 0:
            raise ValueError(f"brokerId = {self.broker_id}: must be >= 0")
        if self.which_broker_when_consume_slowly < 0:
            raise ValueError(f"whichBrokerWhenConsumeSlowly = {self.which_broker_when_consume_slowly}: must be >= 0")
        return self


class SubscriptionGroupManager:
    """The broker's subscription-group table (a broker service: loaded at start, persisted at stop).

    Its admin requests (UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, GET_ALL_SUBSCRIPTIONGROUP_CONFIG) are answered by
    broker/processors/subscription_group.py.
    """

    name = "subscription_group_manager"

    def __init__(self, *, store_dir: str, auto_create: bool = True) -> None:
        self.path = os.path.join(store_dir, "config", FILE_NAME)
        self.auto_create = auto_create
        self.table: dict[str, SubscriptionGroupConfig] = {}
        self.data_version = {"counter": 0, "timestamp": int(time.time() * 1000)}
        self._dirty = False
        self._write_lock = trio.Lock()

    # -- lifecycle -------------------------------------------------------------------------------
    async def start(self) -> None:
        self.load()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()

    async def stop(self) -> None:
        if self._dirty:
            await self.persist()

    def load(self) -> None:
        """Read the file (missing = empty table). A file that does not parse or holds a bad entry raises
        ValueError naming the file: starting empty would silently reset every group's retry policy."""
        data = read_json(self.path, default=None)
        self.table = {}
        if data is None:
            return
        if not isinstance(data, dict) or not isinstance(data.get("subscriptionGroupTable", {}), dict):
            raise StateFileError(f"{self.path}: expected a map with a 'subscriptionGroupTable' map")
        for group, raw in data.get("subscriptionGroupTable", {}).items():
            try:
                self.table[group] = SubscriptionGroupConfig.from_wire(raw, group_name=group)
            except ValueError as exc:
                raise StateFileError(f"{self.path}: group {group!r}: {exc}") from None
        dv = data.get("dataVersion")
        if isinstance(dv, dict) and isinstance(dv.get("counter"), int):
            self.data_version = {"counter": dv["counter"], "timestamp": int(dv.get("timestamp") or 0)}

    # -- lookups and changes (synchronous: no checkpoint in the middle) -------------------------
    def get(self, group: str) -> SubscriptionGroupConfig | None:
        """The group's config, or None; never creates one."""
        return self.table.get(group)

    def find(self, group: str) -> SubscriptionGroupConfig | None:
        """RocketMQ's ``findSubscriptionGroupConfig``: the config, created with defaults when unknown and
        auto-creation is on; None when unknown and auto-creation is off. The caller persists (``persist``)
        when ``dirty``; a crash before that only loses an all-defaults entry that the next use recreates."""
        cfg = self.table.get(group)
        if cfg is None and self.auto_create:
            cfg = SubscriptionGroupConfig(group_name=check_group(group))
            self.table[group] = cfg
            self._bump()
            log.info("subscription_group.auto_created", group=group)
        return cfg

    def update_and_create(self, cfg: SubscriptionGroupConfig) -> None:
        """Create or replace a group's config (validated first)."""
        cfg.validate()
        old = self.table.get(cfg.group_name)
        self.table[cfg.group_name] = cfg
        self._bump()
        log.info("subscription_group.updated" if old else "subscription_group.created", **cfg.to_wire())

    def delete(self, group: str) -> bool:
        """RocketMQ's ``deleteSubscriptionGroupConfig``: forget the group's config; whether it had one (the
        caller persists)."""
        if self.table.pop(group, None) is None:
            return False
        self._bump()
        log.info("subscription_group.deleted", group=group)
        return True

    def all(self) -> dict[str, SubscriptionGroupConfig]:
        return dict(self.table)

    @property
    def dirty(self) -> bool:
        return self._dirty

    def encode(self) -> dict[str, Any]:
        """The file's content."""
        return {
            "subscriptionGroupTable": {g: c.to_wire() for g, c in sorted(self.table.items())},
            "dataVersion": dict(self.data_version),
        }

    async def persist(self) -> None:
        """Write the table atomically in a worker thread; concurrent calls are serialized and the last
        snapshot taken is the last one written."""
        async with self._write_lock:
            snapshot = self.encode()
            self._dirty = False
            try:
                await trio.to_thread.run_sync(write_json_atomic, self.path, snapshot)
            except BaseException:
                self._dirty = True
                raise

    def persist_sync(self) -> None:
        """Blocking write (start-up tools and tests)."""
        write_json_atomic(self.path, self.encode())
        self._dirty = False

    def _bump(self) -> None:
        self.data_version = {"counter": self.data_version["counter"] + 1, "timestamp": int(time.time() * 1000)}
        self._dirty = True
