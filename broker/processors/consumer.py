"""Broker coordination over the wire: consumer groups, queue locks, consumer offsets and their admin views.

``CoordinationService`` drives three components the broker builds for it: the consumer manager
(broker/consumers.py), the lock manager (broker/locks.py) and the offset manager (broker/store/offsets.py). It
answers HEART_BEAT, UNREGISTER_CLIENT, GET_CONSUMER_LIST_BY_GROUP, LOCK_BATCH_MQ, UNLOCK_BATCH_MQ,
QUERY_CONSUMER_OFFSET, UPDATE_CONSUMER_OFFSET and the admin queries GET_CONSUMER_CONNECTION_LIST,
GET_CONSUME_STATS, GET_LOCK_TABLE and GET_SUBSCRIPTION_CONSISTENCY, and runs four loops: client expiry,
coalesced NOTIFY_CONSUMER_IDS_CHANGED, offset persistence, and (``lock_profile="lease"``) the lease scan.

Queue-lock leases (issue 14, docs/PROTOCOL.md "Queue-lock leases"): LOCK_BATCH_MQ answers carry each grant's
fencing epoch and the lease; a renewal counts as its client's heartbeat for its orderly membership (and is
refused, ``member: false``, when the client is not a member); the lease scan removes orderly members whose
lease or disconnect grace ran out; a closed connection's locks are released after the grace; on start the
broker epoch (broker/store/epoch.py) is incremented and the restart grace begins; UPDATE_CONSUMER_OFFSET's
``lockEpoch`` fences commits by epoch.

Time: expiry, lock ages and the notification window use the broker clock ``trio.current_time()`` (so a
``trio.testing.MockClock`` drives them in tests); persisted and displayed timestamps use the wall clock.
Handlers mutate state synchronously before their first checkpoint, so a cancelled handler (the peer left)
never leaves half an update behind.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

import trio

from trimq.broker.config import BrokerConfig
from trimq.broker.consumers import ConsumerManager, parse_heartbeat
from trimq.broker.deps import HandlerRegistry, MasterEpochs, QueueOffsets, SubscriptionGroups, Topics
from trimq.broker.locks import RESTART_GRACE_OWNER, RebalanceLockManager
from trimq.broker.store.atomic import write_json_atomic
from trimq.broker.store.epoch import BrokerEpochStore, epoch_file_path
from trimq.broker.store.offsets import ConsumerOffsetManager
from trimq.protocol.codes import RequestCode, ResponseCode
from trimq.protocol.command import RemotingCommand
from trimq.protocol.errors import RequestError
from trimq.protocol.message_queue import MessageQueue
from trimq.protocol.validation import InvalidNameError, check_group, check_topic, retry_topic
from trimq.runtime.logs import RateLimiter, get_logger, log_rate_limited

if TYPE_CHECKING:
    from trimq.runtime.server import Connection

log = get_logger("trimq.broker.coordination")

__all__ = ["CoordinationService", "broker_now_ms", "wall_ms"]

NOTIFY_SEND_TIMEOUT_S = 5.0


def broker_now_ms() -> int:
    """The broker clock in milliseconds: trio's clock, so MockClock tests control expiry and lock ages."""
    return int(trio.current_time() * 1000)


def wall_ms() -> int:
    """The wall clock in milliseconds: persisted and displayed timestamps."""
    return time.time_ns() // 1_000_000


# ---------------------------------------------------------------------------------------------- field parsing


def _field(where: str, m: Any, name: str, kind: str, *, required: bool = True) -> Any:
    """One field of ``ext`` / a body map, type-checked; RequestError(SYSTEM_ERROR) naming it when wrong."""
    value = m.get(name) if isinstance(m, dict) else None
    if value is None:
        if required:
            raise RequestError(ResponseCode.SYSTEM_ERROR, f"{where}: missing field {name!r}")
        return None
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise RequestError(ResponseCode.SYSTEM_ERROR, f"{where}: field {name!r} must be an integer, got {value!r}")
        return value
    if kind == "group":
        try:
            return check_group(value)
        except InvalidNameError as exc:
            raise RequestError(ResponseCode.SYSTEM_ERROR, f"{where}: field {name!r}: {exc}") from None
    if kind == "topic":
        try:
            return check_topic(value)
        except InvalidNameError as exc:
            raise RequestError(ResponseCode.SYSTEM_ERROR, f"{where}: field {name!r}: {exc}") from None
    if not isinstance(value, str) or not value:
        raise RequestError(ResponseCode.SYSTEM_ERROR, f"{where}: field {name!r} must be a non-empty string")
    return value


def _queue_id(where: str, m: Any) -> int:
    qid: int = _field(where, m, "queueId", "int")
    if qid < 0:
        raise RequestError(ResponseCode.SYSTEM_ERROR, f"{where}: field 'queueId' must be >= 0, got {qid}")
    return qid


def _claims(where: str, body: dict[str, Any]) -> dict[MessageQueue, int]:
    """The optional ``claims`` of a LOCK_BATCH_MQ body: queue -> the lock epoch its client still holds it under."""
    raw = body.get("claims")
    if raw is None:
        return {}
    if not isinstance(raw, list):
        raise RequestError(ResponseCode.SYSTEM_ERROR, f"{where}: field 'claims' must be a list of message queues")
    claims = {}
    for i, m in enumerate(raw):
        epoch = m.get("lockEpoch") if isinstance(m, dict) else None
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise RequestError(ResponseCode.SYSTEM_ERROR,
                               f"{where}: claims[{i}].lockEpoch must be a non-negative integer, got {epoch!r}")
        try:
            claims[MessageQueue.from_wire(m)] = epoch
        except ValueError as exc:
            raise RequestError(ResponseCode.SYSTEM_ERROR, f"{where}: claims[{i}]: {exc}") from None
    return claims


def _lock_body(where: str, body: Any) -> tuple[str, str, list[MessageQueue]]:
    """consumerGroup, clientId and mqSet of a LOCK_BATCH_MQ / UNLOCK_BATCH_MQ body."""
    if not isinstance(body, dict):
        raise RequestError(ResponseCode.SYSTEM_ERROR,
                           f"{where}: body must be a map with consumerGroup, clientId, mqSet")
    group = _field(where, body, "consumerGroup", "group")
    client_id = _field(where, body, "clientId", "str")
    raw = body.get("mqSet")
    if not isinstance(raw, list):
        raise RequestError(ResponseCode.SYSTEM_ERROR, f"{where}: field 'mqSet' must be a list of message queues")
    mqs = []
    for i, m in enumerate(raw):
        try:
            mqs.append(MessageQueue.from_wire(m))
        except ValueError as exc:
            raise RequestError(ResponseCode.SYSTEM_ERROR, f"{where}: mqSet[{i}]: {exc}") from None
    return group, client_id, mqs


# ---------------------------------------------------------------------------------------------- the service


class CoordinationService:
    """Consumer groups, queue locks and consumer offsets of one broker (a broker service, see broker/broker.py)."""

    name = "coordination"

    def __init__(self, *, config: BrokerConfig, registry: HandlerRegistry, consumer_manager: ConsumerManager,
                 lock_manager: RebalanceLockManager, offset_manager: ConsumerOffsetManager, topics: Topics,
                 groups: SubscriptionGroups, store: QueueOffsets) -> None:
        """The consumer manager's ``on_dirty`` must call :meth:`wake_notifier` (the broker wires it)."""
        self.config = config
        self.consumer_manager = consumer_manager
        self.lock_manager = lock_manager
        self.offset_manager = offset_manager
        self.topics = topics
        self.groups = groups
        self.store = store
        #: The master epochs of this broker's log (broker.py wires the HA state): a commit says the epoch its
        #: position was reached under, and one past where a newer epoch began is lowered to there.
        self.epochs: MasterEpochs | None = None
        self._truncated_log = RateLimiter(10_000)
        self._dirty_event = trio.Event()
        self._lease_wakeup = trio.Event()
        self._persist_lock = trio.Lock()
        self.leases = config.lock_profile == "lease"
        #: ``<store>/config/brokerEpoch.json``: the high half of every lock epoch, incremented on start.
        self.epoch_store = BrokerEpochStore(epoch_file_path(config.store_dir))
        #: Counters for metrics and tests.
        self.stats: dict[str, int] = {"notifications_sent": 0, "offset_persists": 0, "offset_persist_failures": 0,
                                      "lease_members_removed": 0, "lock_requests_not_member": 0}
        for code, handler in (
            (RequestCode.HEART_BEAT, self.heart_beat),
            (RequestCode.UNREGISTER_CLIENT, self.unregister_client),
            (RequestCode.GET_CONSUMER_LIST_BY_GROUP, self.get_consumer_list_by_group),
            (RequestCode.LOCK_BATCH_MQ, self.lock_batch_mq),
            (RequestCode.UNLOCK_BATCH_MQ, self.unlock_batch_mq),
            (RequestCode.QUERY_CONSUMER_OFFSET, self.query_consumer_offset),
            (RequestCode.UPDATE_CONSUMER_OFFSET, self.update_consumer_offset),
            (RequestCode.GET_CONSUMER_CONNECTION_LIST, self.get_consumer_connection_list),
            (RequestCode.GET_CONSUME_STATS, self.get_consume_stats),
            (RequestCode.GET_LOCK_TABLE, self.get_lock_table),
            (RequestCode.GET_SUBSCRIPTION_CONSISTENCY, self.get_subscription_consistency),
        ):
            registry.register(code, handler, inline=True)  # none of them waits: no task per request
        registry.on_connection_closed(self._on_connection_closed)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Load config/consumerOffset.json (a file that is not an offset table stops the broker with its name), then
        begin a lock lifetime: the next broker epoch, persisted before any grant, and the restart grace."""
        await trio.to_thread.run_sync(self.offset_manager.load)
        lm = self.lock_manager
        begun = await trio.to_thread.run_sync(self.epoch_store.begin, lm.takeover_after_ms)
        grace = begun.restart_grace_ms if self.leases else 0  # the rocketmq profile: RocketMQ has no grace
        lm.start_lifetime(begun.broker_epoch, grace)
        log.info("lock.lifetime_started", broker_epoch=begun.broker_epoch, lease_ms=lm.max_live_ms,
                 takeover_after_ms=lm.takeover_after_ms, restart_grace_ms=grace, profile=self.config.lock_profile)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Client expiry, coalesced notifications and offset persistence, until cancelled."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._housekeeping_loop)
            nursery.start_soon(self._notify_loop)
            nursery.start_soon(self._persist_loop)
            if self.leases:
                nursery.start_soon(self._lease_loop)
            task_status.started()

    async def stop(self) -> None:
        """Persist the offsets one last time."""
        await self.persist_offsets(raise_errors=True)

    # ------------------------------------------------------------------ loops

    async def _housekeeping_loop(self) -> None:
        # RocketMQ's ClientHousekeepingService: scan every 10 s, drop clients silent for 120 s.
        interval = self.config.client_housekeeping_interval_ms / 1000
        while True:
            await trio.sleep(interval)
            for group, client_id in self.consumer_manager.scan_not_active():
                self._drop_expired_locks(group, client_id)

    def _drop_expired_locks(self, group: str, client_id: str) -> None:
        # Tidy the lock table of a client that went silent, but only when every lock it has has lapsed: a live
        # lock means it is still renewing, and only its owner or the 60 s expiry may end that.
        mine = [info for info in self.lock_manager.lock_table(group) if info.client_id == client_id]
        if mine and all(info.expired for info in mine):
            self.lock_manager.unlock_all_for_client(group, client_id)
            log.info("lock.expired_entries_dropped", group=group, client_id=client_id, queues=len(mine))

    async def _lease_loop(self) -> None:
        # Orderly members leave with their lease (or their disconnect grace), at the moment it runs out, so the
        # others are notified when their locks may be taken over. The loop sleeps until the first such moment;
        # renewals only push it later, and a join or a closed connection wakes it to look again.
        while True:
            deadline = self.consumer_manager.next_lease_deadline()
            with trio.move_on_at(deadline / 1000 if deadline is not None else math.inf):
                await self._lease_wakeup.wait()
            self._lease_wakeup = trio.Event()
            for group, client_id, reason in self.consumer_manager.scan_leases():
                self.stats["lease_members_removed"] += 1
                log.info("consumer.lease_removed", group=group, client_id=client_id, reason=reason)
            for group, mq, owner in self.lock_manager.drop_released():
                log.info("lock.released_on_disconnect", group=group, client_id=owner, mq=str(mq))

    def wake_notifier(self) -> None:
        """A consumer group changed: push NOTIFY_CONSUMER_IDS_CHANGED after the coalescing window."""
        self._dirty_event.set()
        self._lease_wakeup.set()  # a member may have joined: the lease loop's next deadline may be sooner

    async def _notify_loop(self) -> None:
        # One pass per coalescing window: everything that changed meanwhile costs one notification per member.
        delay = self.config.notify_consumer_ids_changed_delay_ms / 1000
        while True:
            await self._dirty_event.wait()
            self._dirty_event = trio.Event()
            if delay:
                await trio.sleep(delay)
            groups = [g for g in self.consumer_manager.take_dirty_groups() if self._notify_enabled(g)]
            async with trio.open_nursery() as nursery:
                for group in groups:
                    for client_id, conn in self.consumer_manager.member_connections(group):
                        nursery.start_soon(self._notify_one, group, client_id, conn)

    async def _notify_one(self, group: str, client_id: str, conn: Connection) -> None:
        # A member that does not read its socket must not delay the others: bounded, per member.
        with trio.move_on_after(NOTIFY_SEND_TIMEOUT_S) as scope:
            await conn.send_oneway(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, {"consumerGroup": group})
        if scope.cancelled_caught:
            log.warning("consumer.notify_timeout", group=group, client_id=client_id, remote=conn.remote)
            return
        self.stats["notifications_sent"] += 1
        log.debug("consumer.notified", group=group, client_id=client_id, remote=conn.remote)

    async def _persist_loop(self) -> None:
        interval = self.config.flush_consumer_offset_interval_ms / 1000
        while True:
            await trio.sleep(interval)
            await self.persist_offsets()

    async def persist_offsets(self, *, raise_errors: bool = False) -> bool:
        """Write config/consumerOffset.json now if it changed (atomically, in a worker thread)."""
        om = self.offset_manager
        async with self._persist_lock:
            if om.path is None or not om.dirty:
                return False
            version, data = om.snapshot()
            try:
                await trio.to_thread.run_sync(write_json_atomic, om.path, data)
            except OSError as exc:
                self.stats["offset_persist_failures"] += 1
                log.error("offset.persist_failed", file=om.path, error=str(exc))
                if raise_errors:
                    raise
                return False
            om.mark_persisted(version)
            self.stats["offset_persists"] += 1
            return True

    def _on_connection_closed(self, conn: Connection) -> None:
        # Lease profile: the client's locks and orderly memberships go after the short disconnect grace, unless it
        # renews over a new connection first — a process that died frees its queues in well under a second, and
        # the client itself stopped starting batches of this broker's queues the moment its connection dropped.
        # Non-orderly memberships go at once. The rocketmq profile: memberships go at once, locks stay until
        # they expire (RocketMQ).
        cm = self.consumer_manager
        cm.connection_closed(conn)
        self._lease_wakeup.set()  # its orderly memberships now leave at the end of the grace
        client_id = conn.attributes.get("client_id")
        grace = self.config.lock_disconnect_grace
        if client_id and grace and not cm.has_open_connection(client_id, other_than=conn):
            released = self.lock_manager.release_client_after(client_id, grace)
            if released:
                log.info("lock.releasing_on_disconnect", client_id=client_id, queues=len(released), grace_ms=grace)

    # ------------------------------------------------------------------ membership

    async def heart_beat(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        """HEART_BEAT (34): register the client's producer and consumer groups; SUCCESS."""
        try:
            data = parse_heartbeat(cmd.body)
        except ValueError as exc:
            raise RequestError(ResponseCode.SYSTEM_ERROR, f"HEART_BEAT: {exc}") from None
        self.consumer_manager.heartbeat(conn, data)
        for cd in data.consumers:
            self._ensure_retry_topic(cd.group_name)
        return RemotingCommand.response_to(cmd)

    def _ensure_retry_topic(self, group: str) -> None:
        # As RocketMQ's heartbeat does: find (auto-creating) the group's subscription config and make sure its
        # %RETRY% topic exists with the configured retryQueueNums (1 by default), so consumers find a route for
        # it. Both managers persist on their own; a heartbeat never waits for a disk write.
        topic = retry_topic(group)
        try:
            cfg = self.groups.find(group)
            if cfg is None:  # unknown group and auto-creation off: RocketMQ creates nothing either
                return
            queue_nums = cfg.retry_queue_nums
            if queue_nums <= 0 or self.topics.get(topic) is not None:
                return
            self.topics.ensure_topic(topic, queue_nums)
        except Exception as exc:
            log.error("consumer.retry_topic_failed", group=group, topic=topic, error=f"{type(exc).__name__}: {exc}")

    def _notify_enabled(self, group: str) -> bool:
        if not self.config.notify_consumer_ids_changed_enable:
            return False
        cfg = self.groups.get(group)
        return bool(getattr(cfg, "notify_consumer_ids_changed_enable", True))

    async def unregister_client(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        """UNREGISTER_CLIENT (35): leave the named groups (every group when none is named) and free its locks."""
        where = "UNREGISTER_CLIENT"
        client_id = _field(where, cmd.ext, "clientID", "str")
        producer_group = _field(where, cmd.ext, "producerGroup", "group", required=False)
        consumer_group = _field(where, cmd.ext, "consumerGroup", "group", required=False)
        cm = self.consumer_manager
        if producer_group is None and consumer_group is None:
            consumer_groups, producer_groups = cm.groups_of_client(client_id)
        else:
            consumer_groups = [consumer_group] if consumer_group else []
            producer_groups = [producer_group] if producer_group else []
        for group in producer_groups:
            cm.unregister_producer(group, client_id)
        for group in consumer_groups:
            cm.unregister_consumer(group, client_id)
            # A graceful leave has stopped consuming: free its queues now, not after 60 s (DESIGN.md §6.1).
            released = self.lock_manager.unlock_all_for_client(group, client_id)
            if released:
                log.info("lock.released_on_unregister", group=group, client_id=client_id,
                         queues=[str(mq) for mq in released])
        return RemotingCommand.response_to(cmd)

    async def get_consumer_list_by_group(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        """GET_CONSUMER_LIST_BY_GROUP (38): body ``{"consumerIdList": [...]}``; SYSTEM_ERROR when nobody is there."""
        group = _field("GET_CONSUMER_LIST_BY_GROUP", cmd.ext, "consumerGroup", "group")
        ids = self.consumer_manager.get_consumer_ids(group)
        if not ids:
            raise RequestError(ResponseCode.SYSTEM_ERROR, f"no consumer for this group: {group}")
        return RemotingCommand.response_to(cmd, body={"consumerIdList": ids})

    # ------------------------------------------------------------------ locks

    async def lock_batch_mq(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        """LOCK_BATCH_MQ (41): lock what can be locked; body ``{"lockOKMQSet": [mq], "keptMQSet": [mq],
        "lockEpochs": [int], "leaseMs": int, "member": bool}`` (docs/PROTOCOL.md "Queue-lock leases")."""
        group, client_id, mqs = _lock_body("LOCK_BATCH_MQ", cmd.body)
        claims = _claims("LOCK_BATCH_MQ", cmd.body)
        lm, cm = self.lock_manager, self.consumer_manager
        cm.mark_orderly(group)
        conn.attributes.setdefault("client_id", client_id)  # its locks follow this connection's close
        if self.leases and not cm.touch(group, client_id, conn):
            # Membership follows the lease: a client that left the group (its lease ran out, or it never
            # heartbeated) holds nothing until its heartbeat brings it back, so it never holds a queue the
            # others' allocation gives to someone else.
            self.stats["lock_requests_not_member"] += 1
            log.debug("lock.not_a_member", group=group, client_id=client_id, queues=len(mqs))
            return RemotingCommand.response_to(cmd, body={"lockOKMQSet": [], "keptMQSet": [], "lockEpochs": [],
                                                          "leaseMs": lm.max_live_ms, "member": False})
        result = lm.try_lock_batch_detailed(group, mqs, client_id, claims)
        for mq, previous in result.stolen.items():
            log.info("lock.stolen", group=group, client_id=client_id, previous_owner=previous, mq=str(mq))
        if result.acquired:
            log.debug("lock.acquired", group=group, client_id=client_id, mqs=[str(mq) for mq in result.acquired])
        if result.refused:
            log.debug("lock.refused", group=group, client_id=client_id,
                      held={str(mq): owner for mq, owner in result.refused.items()})
        if result.claimed:
            log.info("lock.claimed", group=group, client_id=client_id, mqs=[str(mq) for mq in result.claimed])
        # keptMQSet (trimq): the locked queues nobody else held since this client's previous lock; a client
        # re-locking any other queue must not trust what it cached of it (client/rebalance/impl.py).
        locked = sorted(result.locked)
        body: dict[str, Any] = {
            "lockOKMQSet": [mq.to_wire() for mq in locked],
            "keptMQSet": [mq.to_wire() for mq in sorted(result.kept)],
            "lockEpochs": [result.epochs[mq] for mq in locked],
            "leaseMs": lm.max_live_ms,
            "member": True,
        }
        if RESTART_GRACE_OWNER in result.refused.values():
            body["graceMs"] = lm.restart_grace_remaining_ms()  # when to ask again for what the grace kept
        return RemotingCommand.response_to(cmd, body=body)

    async def unlock_batch_mq(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        """UNLOCK_BATCH_MQ (42): release the caller's locks among ``mqSet``; SUCCESS."""
        group, client_id, mqs = _lock_body("UNLOCK_BATCH_MQ", cmd.body)
        result = self.lock_manager.unlock_batch_detailed(group, mqs, client_id)
        if result.unlocked:
            log.debug("lock.released", group=group, client_id=client_id, mqs=[str(mq) for mq in result.unlocked])
        if result.refused:
            log.info("lock.unlock_refused", group=group, client_id=client_id,
                     held={str(mq): owner for mq, owner in result.refused.items()})
        return RemotingCommand.response_to(cmd)

    # ------------------------------------------------------------------ offsets

    async def query_consumer_offset(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        """QUERY_CONSUMER_OFFSET (14): ext ``offset``; QUERY_NOT_FOUND when none is stored (deterministic start)."""
        where = "QUERY_CONSUMER_OFFSET"
        group = _field(where, cmd.ext, "consumerGroup", "group")
        topic = _field(where, cmd.ext, "topic", "topic")
        qid = _queue_id(where, cmd.ext)
        offset = self.offset_manager.query_offset(group, topic, qid)
        # The reset generation the offset is read under: the member's commits carry it back (issue 19).
        generation = self.offset_manager.reset_generation(group, topic)
        ext: dict[str, Any] = {"resetGeneration": generation}
        if self.epochs is not None:  # the log the offset stands in: the member's commits say it back (§7)
            ext["masterEpoch"] = self.epochs.master_epoch
        if offset < 0:
            return RemotingCommand.response_to(cmd, ResponseCode.QUERY_NOT_FOUND,
                                               f"no offset stored for group {group} on {topic} queue {qid}", ext=ext)
        return RemotingCommand.response_to(cmd, ext={"offset": offset, **ext})

    async def update_consumer_offset(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        """UPDATE_CONSUMER_OFFSET (15, also oneway): store the offset; NO_PERMISSION when fenced."""
        where = "UPDATE_CONSUMER_OFFSET"
        group = _field(where, cmd.ext, "consumerGroup", "group")
        topic = _field(where, cmd.ext, "topic", "topic")
        qid = _queue_id(where, cmd.ext)
        offset = _field(where, cmd.ext, "commitOffset", "int")
        if offset < 0:
            raise RequestError(ResponseCode.SYSTEM_ERROR, f"{where}: field 'commitOffset' must be >= 0, got {offset}")
        client_id = _field(where, cmd.ext, "clientId", "str", required=False) or conn.attributes.get("client_id")
        generation = _field(where, cmd.ext, "resetGeneration", "int", required=False)
        current = self.offset_manager.stale_reset_generation(group, topic, generation)
        if current is not None:  # made before a reset it did not see (issue 19): counted and logged there
            self.offset_manager.commit_offset(group, topic, qid, offset, client_id, source="update",
                                              reset_generation=generation)
            return RemotingCommand.response_to(
                cmd, ResponseCode.NO_PERMISSION,
                f"offset update refused: the offsets of {topic} of group {group} were reset (reset generation "
                f"{current}) after this commit's offset was read (generation {generation}); read the offset again",
                ext={"resetGeneration": current})
        epoch = _field(where, cmd.ext, "lockEpoch", "int", required=False)
        if epoch is not None and epoch < 0:
            raise RequestError(ResponseCode.SYSTEM_ERROR, f"{where}: field 'lockEpoch' must be >= 0, got {epoch}")
        offset = self._within_epoch(cmd, group, topic, qid, offset)
        om = self.offset_manager
        if epoch is not None:
            current = om.stale_epoch(group, topic, qid, epoch)
            if not om.commit_offset(group, topic, qid, offset, client_id, source="update", lock_epoch=epoch):
                raise RequestError(
                    ResponseCode.NO_PERMISSION,
                    f"offset update refused (fenced): lock epoch {epoch} of {client_id} is older than epoch "
                    f"{current} of the latest lock grant or commit of {topic} queue {qid} of group {group}",
                )
            return RemotingCommand.response_to(cmd)
        owner = om.fencing_owner(group, topic, qid, client_id)
        if not om.commit_offset(group, topic, qid, offset, client_id, source="update"):
            raise RequestError(
                ResponseCode.NO_PERMISSION,
                f"offset update refused (fenced): {topic} queue {qid} of group {group} is locked by {owner} "
                f"(or was last), not by {client_id}",
            )
        return RemotingCommand.response_to(cmd)

    def _within_epoch(self, cmd: RemotingCommand, group: str, topic: str, queue_id: int, offset: int) -> int:
        """A commit's offset, lowered to the queue offset where this log's next master epoch began when the commit
        says (``masterEpoch``) its position was reached under an older epoch and lies past there: the consumer read
        records this log does not have (an ASYNC master's lost tail), and this log gave those queue offsets to other
        messages, which the queue's next owner would skip (the pull check's twin: docs/PROTOCOL.md §7)."""
        epochs = self.epochs
        client_epoch = _field("UPDATE_CONSUMER_OFFSET", cmd.ext, "masterEpoch", "int", required=False)
        if epochs is None or client_epoch is None:
            return offset
        store = self.store
        boundary = epochs.lost_tail_boundary(client_epoch, offset,
                                             lambda start: store.queue_offset_at(topic, queue_id, start))
        if boundary is None:
            return offset
        log_rate_limited(self._truncated_log, (group, topic, queue_id), int(time.time() * 1000), log.warning,
                         "offset.position_truncated", group=group, topic=topic, queue_id=queue_id, offset=offset,
                         stored=boundary, client_epoch=client_epoch, master_epoch=epochs.master_epoch)
        return boundary

    # ------------------------------------------------------------------ admin queries

    async def get_consumer_connection_list(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        """GET_CONSUMER_CONNECTION_LIST (203): the group's members; CONSUMER_NOT_ONLINE when it has none."""
        group = _field("GET_CONSUMER_CONNECTION_LIST", cmd.ext, "consumerGroup", "group")
        ginfo = self.consumer_manager.group_info(group)
        latest = ginfo.latest() if ginfo else None
        if ginfo is None or latest is None:
            raise RequestError(ResponseCode.CONSUMER_NOT_ONLINE, f"the consumer group [{group}] is not online")
        connections = [
            {
                "clientId": m.client_id,
                "clientAddr": m.address,
                "language": m.language,
                "version": m.version,
                "lastUpdateTimestamp": m.last_update_timestamp,
                "consumeType": m.consume_type,
                "messageModel": m.message_model,
                "consumeFromWhere": m.consume_from_where,
                "consumeOrderly": m.consume_orderly,
                "subscriptionDataSet": [s.to_wire() for _, s in sorted(m.subscriptions.items())],
            }
            for _, m in sorted(ginfo.members.items())
        ]
        body = {
            "consumerGroup": group,
            "connectionSet": connections,
            "subscriptionTable": {t: s.to_wire() for t, s in sorted(ginfo.subscription_table().items())},
            "consumeType": latest.consume_type,
            "messageModel": latest.message_model,
            "consumeFromWhere": latest.consume_from_where,
            "consumeOrderly": self.consumer_manager.is_orderly(group),
            "consistent": self.consumer_manager.subscription_consistency(group).consistent,
        }
        return RemotingCommand.response_to(cmd, body=body)

    async def get_consume_stats(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        """GET_CONSUME_STATS (208): per queue broker offset, consumer offset, lag, timestamps, lock owner."""
        where = "GET_CONSUME_STATS"
        group = _field(where, cmd.ext, "consumerGroup", "group")
        topic = _field(where, cmd.ext, "topic", "topic", required=False)
        om, cm = self.offset_manager, self.consumer_manager
        store, tcm = self.store, self.topics
        if topic is not None:
            topics = [topic]
            if tcm.get(topic) is None and not om.queue_offsets(group, topic):
                raise RequestError(ResponseCode.TOPIC_NOT_EXIST, f"topic {topic} does not exist on this broker")
        else:
            topics = sorted(set(om.topics_of_group(group)) | set(cm.subscribed_topics(group)))
        orderly = cm.is_orderly(group)
        broker_name = self.config.broker_name
        rows: list[dict[str, Any]] = []
        for t in topics:
            tc = tcm.get(t)
            queue_ids = range(tc.read_queue_nums) if tc is not None else range(0)
            for p in om.progress(group, t, queue_ids, store):
                mq = MessageQueue(t, broker_name, p.queue_id)
                rows.append({
                    "mq": mq.to_wire(),
                    "brokerOffset": p.broker_offset,
                    "consumerOffset": p.consumer_offset,
                    "lag": p.lag,
                    "lastTimestamp": p.last_timestamp,
                    "lastUpdateTimestamp": p.last_update_timestamp,
                    "lockOwner": self.lock_manager.live_owner(group, mq) if orderly else None,
                })
        body = {
            "consumerGroup": group,
            "orderly": orderly,
            "totalLag": sum(r["lag"] for r in rows if r["lag"] > 0),
            "offsetTable": rows,
        }
        return RemotingCommand.response_to(cmd, body=body)

    async def get_lock_table(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        """GET_LOCK_TABLE (9001, trimq): queue -> owner, age, expired, for one group or all."""
        group = _field("GET_LOCK_TABLE", cmd.ext, "consumerGroup", "group", required=False)
        lm = self.lock_manager
        groups = [group] if group is not None else lm.groups()
        wall = wall_ms()
        rows = [
            {
                "consumerGroup": g,
                "mq": info.mq.to_wire(),
                "clientId": info.client_id,
                "lastUpdateTimestamp": wall - info.age_ms,
                "ageMs": info.age_ms,
                "expired": info.expired,
                "lockEpoch": info.epoch,
                "releasing": info.releasing,
            }
            for g in groups
            for info in lm.lock_table(g)
        ]
        fenced = self.offset_manager.fenced_updates
        body = {
            "maxLiveMs": lm.max_live_ms,
            "leaseMs": lm.max_live_ms,
            "takeoverAfterMs": lm.takeover_after_ms,
            "lockProfile": self.config.lock_profile,
            "brokerEpoch": lm.broker_epoch,
            "restartGrace": lm.in_restart_grace(),
            "lockTable": rows,
            "fencedUpdates": {g: fenced[g] for g in sorted(fenced) if group is None or g == group},
            "stats": lm.stats.as_dict(),
        }
        return RemotingCommand.response_to(cmd, body=body)

    async def get_subscription_consistency(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        """GET_SUBSCRIPTION_CONSISTENCY (9005, trimq): whether each group's members subscribe alike."""
        group = _field("GET_SUBSCRIPTION_CONSISTENCY", cmd.ext, "consumerGroup", "group", required=False)
        cm = self.consumer_manager
        groups = [group] if group is not None else cm.consumer_groups()
        return RemotingCommand.response_to(
            cmd, body={"groups": [cm.subscription_consistency(g).to_wire() for g in groups]}
        )
