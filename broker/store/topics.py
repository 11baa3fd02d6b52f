"""Topic configs (RocketMQ's TopicConfigManager): ``config/topics.json``, written atomically.

The broker's ``topic_config_manager`` (built in broker/broker.py). Reads and updates are synchronous and in
memory; the file is rewritten by a background task (in a worker thread) soon after a change, and at stop. An
admin update (``acreate_or_update``) waits for the file. A topic created just before a crash and missing from
the file is re-created at start from its consume-queue directories, so no stored message loses its topic.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from trimq.broker.store.atomic import StateFileError, read_json, write_json_atomic
from trimq.protocol.validation import check_topic
from trimq.runtime.logs import get_logger

log = get_logger("trimq.topics")

__all__ = ["PERM_INHERIT", "PERM_PRIORITY", "PERM_READ", "PERM_WRITE", "TopicConfig", "TopicConfigManager"]

# RocketMQ's PermName.
PERM_PRIORITY = 0x8
PERM_READ = 0x4
PERM_WRITE = 0x2
PERM_INHERIT = 0x1
MAX_QUEUE_NUMS = 1024


@dataclass(slots=True)
class TopicConfig:
    """One topic's queues and permissions (RocketMQ's TopicConfig)."""

    topic_name: str
    read_queue_nums: int = 4
    write_queue_nums: int = 4
    perm: int = PERM_READ | PERM_WRITE
    topic_filter_type: str = "SINGLE_TAG"
    topic_sys_flag: int = 0
    order: bool = False

    def validate(self) -> TopicConfig:
        """Raise ValueError naming the bad field; returns self."""
        check_topic(self.topic_name)
        for name in ("read_queue_nums", "write_queue_nums"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_QUEUE_NUMS:
                raise ValueError(f"{name} = {v!r}: must be an integer in [0, {MAX_QUEUE_NUMS}]")
        if max(self.read_queue_nums, self.write_queue_nums) < 1:
            raise ValueError("a topic needs at least one read or write queue")
        if isinstance(self.perm, bool) or not isinstance(self.perm, int) or not 0 <= self.perm <= 0xF:
            raise ValueError(f"perm = {self.perm!r}: must be an integer in [0, 15] (READ 4 | WRITE 2 | INHERIT 1)")
        return self

    @property
    def readable(self) -> bool:
        return bool(self.perm & PERM_READ)

    @property
    def writable(self) -> bool:
        return bool(self.perm & PERM_WRITE)

    def to_json(self) -> dict[str, Any]:
        """RocketMQ's JSON field names."""
        return {
            "topicName": self.topic_name,
            "readQueueNums": self.read_queue_nums,
            "writeQueueNums": self.write_queue_nums,
            "perm": self.perm,
            "topicFilterType": self.topic_filter_type,
            "topicSysFlag": self.topic_sys_flag,
            "order": self.order,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TopicConfig:
        return cls(
            topic_name=str(d["topicName"]),
            read_queue_nums=int(d.get("readQueueNums", 4)),
            write_queue_nums=int(d.get("writeQueueNums", 4)),
            perm=int(d.get("perm", PERM_READ | PERM_WRITE)),
            topic_filter_type=str(d.get("topicFilterType", "SINGLE_TAG")),
            topic_sys_flag=int(d.get("topicSysFlag", 0)),
            order=bool(d.get("order", False)),
        )


class TopicConfigManager:
    """The broker's topic table; a broker service (``start`` loads, ``run`` persists, ``stop`` saves)."""

    name = "topic_config_manager"

    def __init__(self, store_dir: str | Path, *, default_queue_nums: int = 4, auto_create: bool = True,
                 store: Any = None) -> None:
        self.path = Path(store_dir) / "config" / "topics.json"
        self.default_queue_nums = default_queue_nums
        self.auto_create = auto_create
        self.store = store
        self.topics: dict[str, TopicConfig] = {}
        self.data_version = {"timestamp": int(time.time() * 1000), "counter": 0}
        self.listeners: list[Callable[[str], None]] = []
        self._dirty = False
        self._wakeup = trio.Event()
        self._persist_lock = trio.Lock()

    # -- lifecycle --------------------------------------------------------------------------------------
    async def start(self) -> None:
        self.load()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await self._wakeup.wait()
            self._wakeup = trio.Event()
            if self._dirty:
                try:
                    await self.apersist()
                except OSError as exc:
                    log.error("topics.persist_failed", path=str(self.path), error=str(exc))
                    await trio.sleep(1)
                    self._wakeup.set()

    async def stop(self) -> None:
        if self._dirty:
            with trio.CancelScope(shield=True):
                await self.apersist()

    def load(self) -> None:
        """Read ``topics.json`` and add topics that have consume queues but no config (a crash window)."""
        data = read_json(self.path, None)
        self.topics = {}
        if data is not None:
            table = data.get("topicConfigTable", {}) if isinstance(data, dict) else None
            if not isinstance(table, dict):
                raise StateFileError(f"{self.path}: no topicConfigTable map")
            for name, raw in table.items():
                try:
                    self.topics[name] = TopicConfig.from_json(raw).validate()
                except (KeyError, TypeError, ValueError) as exc:
                    raise StateFileError(f"{self.path}: topic {name!r}: {exc}") from None
            dv = data.get("dataVersion")
            if isinstance(dv, dict):
                self.data_version = {"timestamp": int(dv.get("timestamp", 0)), "counter": int(dv.get("counter", 0))}
        if self.store is not None:
            for topic in self.store.topics():
                ids = self.store.queue_ids(topic)
                if topic not in self.topics and ids:
                    n = max(self.default_queue_nums, max(ids) + 1)
                    self.topics[topic] = TopicConfig(topic, n, n)
                    self._dirty = True
                    log.warning("topics.recreated_from_store", topic=topic, queues=n)
        if self._dirty:
            self.persist()

    # -- queries ----------------------------------------------------------------------------------------
    def get(self, topic: str) -> TopicConfig | None:
        return self.topics.get(topic)

    def all(self) -> dict[str, TopicConfig]:
        return dict(self.topics)

    def table_json(self) -> dict[str, dict[str, Any]]:
        """``{topic: TopicConfig JSON}`` (GET_ALL_TOPIC_CONFIG, REGISTER_BROKER)."""
        return {name: cfg.to_json() for name, cfg in self.topics.items()}

    # -- updates ----------------------------------------------------------------------------------------
    def create_or_update(self, cfg: TopicConfig) -> TopicConfig:
        """Add or replace a topic (validated); the file is rewritten shortly after, listeners run now."""
        cfg.validate()
        old = self.topics.get(cfg.topic_name)
        self.topics[cfg.topic_name] = cfg
        if old != cfg:
            self._changed(cfg.topic_name)
        return cfg

    async def acreate_or_update(self, cfg: TopicConfig) -> TopicConfig:
        """``create_or_update`` and wait until ``topics.json`` holds it."""
        self.create_or_update(cfg)
        await self.apersist()
        return cfg

    def ensure_topic(self, topic: str, queue_nums: int, perm: int = PERM_READ | PERM_WRITE) -> TopicConfig:
        """The topic's config, created with ``queue_nums`` queues if it does not exist (e.g. %RETRY%g)."""
        cfg = self.topics.get(topic)
        if cfg is None:
            cfg = self.create_or_update(TopicConfig(topic, queue_nums, queue_nums, perm))
            log.info("topic.created", topic=topic, queues=queue_nums, perm=perm)
        return cfg

    def auto_create_topic(self, topic: str) -> TopicConfig | None:
        """A send to an unknown topic: create it with the default queue count if auto-creation is on."""
        if not self.auto_create:
            return None
        return self.ensure_topic(topic, self.default_queue_nums)

    def delete(self, topic: str) -> bool:
        if self.topics.pop(topic, None) is None:
            return False
        self._changed(topic)
        return True

    def _changed(self, topic: str) -> None:
        self.data_version = {"timestamp": int(time.time() * 1000), "counter": self.data_version["counter"] + 1}
        self._dirty = True
        self._wakeup.set()
        for listener in list(self.listeners):
            try:
                listener(topic)
            except Exception:
                log.exception("topics.listener_failed", topic=topic)

    # -- persistence ------------------------------------------------------------------------------------
    def _snapshot(self) -> dict[str, Any]:
        return {"dataVersion": dict(self.data_version), "topicConfigTable": self.table_json()}

    def persist(self) -> None:
        """Write ``topics.json`` now (blocking)."""
        self._dirty = False
        write_json_atomic(self.path, self._snapshot())

    async def apersist(self) -> None:
        """Write ``topics.json`` in a worker thread (one writer at a time, latest state wins)."""
        async with self._persist_lock:
            self._dirty = False
            snap = self._snapshot()
            try:
                await trio.to_thread.run_sync(write_json_atomic, self.path, snap)
            except BaseException:
                self._dirty = True
                raise
