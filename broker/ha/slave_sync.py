"""A slave's copy of its master's metadata (RocketMQ 4.9.3's ``SlaveSynchronize``).

Every ``slave_synchronize_interval_ms`` (10 s; the first 3 s after the slave starts) the slave asks its master,
over the ordinary request port, for the topic configs (GET_ALL_TOPIC_CONFIG), the consumer offsets
(GET_ALL_CONSUMER_OFFSET), the delay offsets (GET_ALL_DELAY_OFFSET) and the subscription groups
(GET_ALL_SUBSCRIPTIONGROUP_CONFIG), and takes them over. Topics and groups are replaced when the master's data
version differs; delay offsets are overwritten. Consumer offsets go through ``merge_offsets``: RocketMQ
overwrites the slave's (:func:`overwrite_offsets`), which loses what consumers committed to the slave while the
master was away; the HA issue's part 2 merges by commit version instead (docs/PROTOCOL.md "Replication
stream").

Between two full syncs the slave merges the consumer offsets alone every ``slave_offset_sync_interval_ms`` (1 s;
0 turns it off, as in RocketMQ): a master killed 9 s after a sync would leave its slave, read from or promoted, with
offsets 9 s old, and every queue that changed hands after the failover would be replayed from there. Those rounds
ask for what changed since the last answer (GET_ALL_CONSUMER_OFFSET's ``offsetTableId`` and ``sinceChangeSerial``),
so a round costs both brokers the commits of that second, not the whole table; the full syncs still fetch the
whole table, and an answer of another table (a master restarted or replaced) is whole too.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import trio

from trimq.broker.store.schedule import decode_offset_table
from trimq.broker.store.subscription_groups import SubscriptionGroupConfig
from trimq.broker.store.topics import TopicConfig
from trimq.protocol.codes import RequestCode, ResponseCode
from trimq.protocol.command import RemotingCommand
from trimq.runtime.client import RemotingClient, RemotingError
from trimq.runtime.logs import RateLimiter, get_logger, log_rate_limited

log = get_logger("trimq.ha")

__all__ = ["OffsetMerge", "SlaveSynchronize", "overwrite_offsets"]

FIRST_SYNC_DELAY_S = 3.0
REQUEST_TIMEOUT_S = 3.0


class SyncedTopics(Protocol):
    """The slave's topic table (broker/store/topics.py TopicConfigManager)."""

    data_version: dict[str, Any]

    def all(self) -> dict[str, TopicConfig]: ...

    def create_or_update(self, cfg: TopicConfig) -> TopicConfig: ...

    def delete(self, topic: str) -> bool: ...


class SyncedGroups(Protocol):
    """The slave's subscription groups (broker/store/subscription_groups.py SubscriptionGroupManager)."""

    data_version: dict[str, Any]

    def all(self) -> dict[str, SubscriptionGroupConfig]: ...

    def update_and_create(self, cfg: SubscriptionGroupConfig) -> None: ...

    async def persist(self) -> None: ...


class SyncedOffsets(Protocol):
    """The slave's consumer offsets (broker/store/offsets.py ConsumerOffsetManager)."""

    def query_offset(self, group: str, topic: str, queue_id: int) -> int: ...

    def _set(self, group: str, topic: str, queue_id: int, offset: int) -> None: ...


class SyncedDelayOffsets(Protocol):
    """The slave's delay-level progress (broker/store/schedule.py ScheduleMessageService)."""

    offsets: dict[int, int]

    def _set_offset(self, level: int, offset: int, copy_end: int | None = None) -> None: ...


#: ``(the slave's offsets, the master's GET_ALL_CONSUMER_OFFSET body) -> (queues changed, MERGE_CONSUMER_OFFSET body
#: or None)``: the body is what the slave hands back to its master after the merge (issue 15 part 2: offsets
#: committed to the slave; broker/store/offset_merge.py ``merge_and_hand_back``).
OffsetMerge = Callable[[Any, dict[str, Any]], "tuple[int, dict[str, Any] | None]"]


def overwrite_offsets(offsets: SyncedOffsets, body: dict[str, Any]) -> tuple[int, None]:
    """RocketMQ's rule: every offset the master has replaces the slave's (nothing is handed back). Returns how many
    changed."""
    table = body.get("offsetTable") if isinstance(body, dict) else None
    if not isinstance(table, dict):
        raise ValueError("GET_ALL_CONSUMER_OFFSET body has no offsetTable map")
    changed = 0
    for key, queues in table.items():
        topic, sep, group = str(key).partition("@")
        if not sep or not isinstance(queues, dict):
            continue
        for q, offset in queues.items():
            try:
                qid = int(q)
            except (TypeError, ValueError):
                continue
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0 or qid < 0:
                continue
            if offsets.query_offset(group, topic, qid) != offset:
                offsets._set(group, topic, qid, offset)
                changed += 1
    return changed, None


class SlaveSynchronize:
    """Fetches the master's metadata into the slave's tables (see the module docstring)."""

    def __init__(self, *, master_addr: Callable[[], str], topics: SyncedTopics, groups: SyncedGroups,
                 offsets: SyncedOffsets, schedule: SyncedDelayOffsets | None, interval_ms: int = 10_000,
                 offset_interval_ms: int = 0, merge_offsets: OffsetMerge = overwrite_offsets,
                 persist_offsets: Callable[[], Awaitable[object]] | None = None,
                 now_ms: Callable[[], int] = lambda: time.time_ns() // 1_000_000) -> None:
        """``now_ms``: the wall clock of :attr:`offsets_synced_at_ms` (read by metrics scrapes, not by trio)."""
        self.master_addr = master_addr
        self.topics = topics
        self.groups = groups
        self.offsets = offsets
        self.schedule = schedule
        self.interval_s = interval_ms / 1000
        #: Consumer offsets alone between the full syncs (0: not).
        self.offset_interval_s = offset_interval_ms / 1000
        self.merge_offsets = merge_offsets
        #: Writes the offsets to disk now (the broker's offset writer, through the HA controller).
        self.persist_offsets = persist_offsets
        self.pushed_offsets = 0  # queues handed to the master (MERGE_CONSUMER_OFFSET)
        self._wakeup = trio.Event()
        self.syncs = 0  # completed rounds (tests)
        self.offset_syncs = 0  # completed offset-only rounds between them
        self.now_ms = now_ms
        #: Wall-clock ms at which the master's offset table last merged here was asked for (the start until the
        #: first): a promoted slave serves the offsets of that moment (trimq_ha_offsets_sync_age_seconds).
        self.offsets_synced_at_ms = now_ms()
        self._errors = RateLimiter(60_000)
        #: ``(offsetTableId, changeSerial)`` of the master's table as of the last merged answer (offset rounds ask
        #: for what changed since); None until an answer carried them (a master from before them: whole tables).
        self.offset_table_seen: tuple[str, int] | None = None
        # queues received in GET_ALL_CONSUMER_OFFSET answers, whole tables and changes only (metrics, tests)
        self.offset_queues_whole = 0
        self.offset_queues_in_changes = 0
        self.incremental_offset_syncs = 0  # answers that held only the changes

    async def run(self, rc: RemotingClient) -> None:
        """Sync 3 s after the start, then every ``interval_ms`` and at every :meth:`wake`, until cancelled; in
        between, the consumer offsets alone every ``offset_interval_ms``."""
        with trio.move_on_after(FIRST_SYNC_DELAY_S):
            await self._wakeup.wait()
        next_full = trio.current_time()
        while True:
            woken = self._wakeup.is_set()
            self._wakeup = trio.Event()  # a wake() during the round below starts the next one at once
            if woken or trio.current_time() >= next_full:
                await self.sync_all(rc)
                next_full = trio.current_time() + self.interval_s
            else:
                await self.sync_offsets(rc)
            wait = next_full - trio.current_time()
            if self.offset_interval_s:
                wait = min(wait, self.offset_interval_s)
            with trio.move_on_after(wait):
                await self._wakeup.wait()

    def wake(self) -> None:
        """Sync now (the slave has just connected to its master: hand over what was committed meanwhile)."""
        self._wakeup.set()

    async def sync_all(self, rc: RemotingClient) -> bool:
        """One round; False when the master is unknown or a request failed (logged, rate-limited)."""
        if not await self._round(rc, self._sync_topics, self._sync_offsets, self._sync_delay_offsets,
                                 self._sync_groups):
            return False
        self.syncs += 1
        return True

    async def sync_offsets(self, rc: RemotingClient) -> bool:
        """The consumer offsets alone (merged both ways, as in :meth:`sync_all`); False as there."""
        if not await self._round(rc, functools.partial(self._sync_offsets, quiet=True)):
            return False
        self.offset_syncs += 1
        return True

    def offsets_age_ms(self) -> int:
        """ms since the consumer offsets were last merged with the master's (since the start until the first time)."""
        return max(0, self.now_ms() - self.offsets_synced_at_ms)

    async def _round(self, rc: RemotingClient, *steps: Callable[[RemotingClient, str], Awaitable[None]]) -> bool:
        addr = self.master_addr()
        if not addr:
            return False
        try:
            for step in steps:
                await step(rc, addr)
        except (RemotingError, ValueError, TypeError, KeyError) as exc:
            log_rate_limited(self._errors, addr, int(trio.current_time() * 1000), log.warning,
                             "ha.slave_sync_failed", master=addr, error=str(exc) or type(exc).__name__)
            return False
        return True

    @property
    def offset_queues_fetched(self) -> int:
        """Queues received in GET_ALL_CONSUMER_OFFSET answers, in all."""
        return self.offset_queues_whole + self.offset_queues_in_changes

    async def _request(self, rc: RemotingClient, addr: str, code: RequestCode,
                       ext: dict[str, Any] | None = None) -> RemotingCommand:
        """The master's SUCCESS answer with a map body; ValueError otherwise (the round fails, logged)."""
        resp = await rc.invoke(addr, RemotingCommand.request(code, ext or {}), REQUEST_TIMEOUT_S)
        if resp.code != ResponseCode.SUCCESS:
            raise ValueError(f"{code.name} answered {resp.code}: {resp.remark}")
        if not isinstance(resp.body, dict):
            raise ValueError(f"{code.name} answered no map")
        return resp

    async def _fetch(self, rc: RemotingClient, addr: str, code: RequestCode) -> dict[str, Any]:
        body: dict[str, Any] = (await self._request(rc, addr, code)).body
        return body

    async def _sync_topics(self, rc: RemotingClient, addr: str) -> None:
        body = await self._fetch(rc, addr, RequestCode.GET_ALL_TOPIC_CONFIG)
        table = body.get("topicConfigTable")
        if not isinstance(table, dict):
            raise ValueError("GET_ALL_TOPIC_CONFIG body has no topicConfigTable map")
        if body.get("dataVersion") == self.topics.data_version:
            return
        wanted = {name: TopicConfig.from_json(raw).validate() for name, raw in table.items()}
        current = self.topics.all()
        for name, cfg in wanted.items():
            if current.get(name) != cfg:
                self.topics.create_or_update(cfg)
        for name in set(current) - set(wanted):
            self.topics.delete(name)
        version = body.get("dataVersion")
        if isinstance(version, dict):
            self.topics.data_version = dict(version)
        log.info("ha.topics_synced", master=addr, topics=len(wanted))

    async def _sync_offsets(self, rc: RemotingClient, addr: str, *, quiet: bool = False) -> None:
        """``quiet``: the offset-only round, which finds changes every second on a busy slave (logged at debug) and
        asks only for the changes since the last answer; a full sync takes the whole table."""
        asked_at = self.now_ms()
        ext: dict[str, Any] = {}
        if quiet and self.offset_table_seen is not None:
            ext = {"offsetTableId": self.offset_table_seen[0], "sinceChangeSerial": self.offset_table_seen[1]}
        resp = await self._request(rc, addr, RequestCode.GET_ALL_CONSUMER_OFFSET, ext)
        body = resp.body
        table = body.get("offsetTable")
        queues = sum(len(q) for q in table.values() if isinstance(q, dict)) if isinstance(table, dict) else 0
        changed, push = self.merge_offsets(self.offsets, body)
        table_id, serial = resp.ext.get("offsetTableId"), resp.ext.get("changeSerial")
        if resp.ext.get("incremental") is True:
            self.incremental_offset_syncs += 1
            self.offset_queues_in_changes += queues
        else:
            self.offset_queues_whole += queues
        # remembered only once merged: a failed merge asks again for everything since the last good answer
        self.offset_table_seen = None
        if isinstance(table_id, str) and type(serial) is int and serial >= 0:
            self.offset_table_seen = (table_id, serial)
        if changed:
            (log.debug if quiet else log.info)("ha.offsets_synced", master=addr, changed=changed)
            # Written now, not at the next periodic write: a slave killed in between restarted on its older table,
            # and once promoted served offsets below what it had synced; the old master, back as its slave, then
            # handed over a commit of a newer grant below them and the queue went back (long ASYNC seed 18).
            if self.persist_offsets is not None:
                await self.persist_offsets()
        # what the slave serves now is the master's table as of the request (whether handing back below succeeds)
        self.offsets_synced_at_ms = asked_at
        if push:
            resp = await rc.invoke(addr, RemotingCommand.request(RequestCode.MERGE_CONSUMER_OFFSET, {}, push),
                                   REQUEST_TIMEOUT_S)
            if resp.code != ResponseCode.SUCCESS:
                raise ValueError(f"MERGE_CONSUMER_OFFSET answered {resp.code}: {resp.remark}")
            n = sum(len(q) for q in push["offsetTable"].values())
            self.pushed_offsets += n
            log.info("ha.offsets_handed_to_master", master=addr, queues=n)

    async def _sync_delay_offsets(self, rc: RemotingClient, addr: str) -> None:
        if self.schedule is None:
            return
        body = await self._fetch(rc, addr, RequestCode.GET_ALL_DELAY_OFFSET)
        for level, offset in decode_offset_table(body, source=f"GET_ALL_DELAY_OFFSET from {addr}").items():
            if self.schedule.offsets.get(level) != offset:
                self.schedule._set_offset(level, offset)

    async def _sync_groups(self, rc: RemotingClient, addr: str) -> None:
        body = await self._fetch(rc, addr, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)
        if body.get("dataVersion") == self.groups.data_version:
            return
        table = body.get("subscriptionGroupTable")
        if not isinstance(table, dict):
            raise ValueError("GET_ALL_SUBSCRIPTIONGROUP_CONFIG body has no subscriptionGroupTable map")
        current = self.groups.all()
        for name, raw in table.items():
            cfg = SubscriptionGroupConfig.from_wire(raw, group_name=name)
            if current.get(name) != cfg:
                self.groups.update_and_create(cfg)
        version = body.get("dataVersion")
        if isinstance(version, dict):
            self.groups.data_version = dict(version)
        await self.groups.persist()
