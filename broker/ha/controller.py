"""The broker's HA role: master or slave of its broker name, and the moves between them (docs/OPERATIONS.md
"High availability", docs/PROTOCOL.md "Replication stream").

``HAController`` is a broker service. It always serves the HA port (broker/store/ha/master.py; a slave refuses
handshakes), and as a SLAVE it follows its master (broker/store/ha/slave.py) and syncs the master's metadata
(slave_sync.py). It decides:

* **the role at start**: ``broker_role`` / ``broker_id``, unless a promotion or demotion recorded in
  ``STORE/config/haState.json`` says otherwise; a master with no epoch history starts master epoch 1.
* **what a slave refuses**: sends (SERVICE_NOT_AVAILABLE, the remark naming the role and the master).
* **SYNC_MASTER**: the store's ``replica_wait`` is the HA service's wait (MessageStore.handle_ha).
* **promotion** (PROMOTE_BROKER, ``trimq-admin broker promote``): a slave stops following, cuts a partly
  received record, becomes master of a master epoch newer than any it knows (recorded with its max offset in the
  epoch history), takes a lock broker epoch above its old master's (so its lock epochs exceed every one the old
  master granted) and applies the lease restart grace before granting queue locks to new holders.
* **demotion**: a name server answering a registration with a master of a newer epoch for this broker name makes
  a master a slave of that master (it refuses writes at once; its HA client cuts the tail the new master never
  had).
* **registration**: the broker id, the HA address and the master epoch sent with REGISTER_BROKER.
"""

from __future__ import annotations

import ssl
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import trio

from trimq.broker.config import BrokerConfig
from trimq.broker.deps import AddressSource, HandlerRegistry
from trimq.broker.ha.slave_sync import (
    OffsetMerge,
    SlaveSynchronize,
    SyncedDelayOffsets,
    SyncedGroups,
    SyncedOffsets,
    SyncedTopics,
    overwrite_offsets,
)
from trimq.broker.locks import split_epoch
from trimq.broker.store.epoch import BrokerEpochStore, promotion_floor
from trimq.broker.store.ha.codec import HelloAck
from trimq.broker.store.ha.history import HAState, ha_state_path
from trimq.broker.store.ha.master import HAService
from trimq.broker.store.ha.slave import HAClient
from trimq.broker.store.message_store import MessageStore
from trimq.broker.store.offset_merge import CommitVersion
from trimq.broker.store.offsets import TOPIC_GROUP_SEPARATOR
from trimq.broker.store.schedule import encode_offset_table
from trimq.broker.store.topics import TopicConfig
from trimq.protocol.address import format_address, parse_address
from trimq.protocol.codes import RequestCode, ResponseCode
from trimq.protocol.command import RemotingCommand
from trimq.protocol.errors import RequestError
from trimq.protocol.fields import int_field
from trimq.runtime.client import RemotingClient
from trimq.runtime.logs import get_logger
from trimq.runtime.server import Connection
from trimq.runtime.tls import client_ssl_context

log = get_logger("trimq.ha")

__all__ = ["ASYNC_MASTER", "SLAVE", "SYNC_MASTER", "HAController"]

ASYNC_MASTER, SYNC_MASTER, SLAVE = "ASYNC_MASTER", "SYNC_MASTER", "SLAVE"
MASTER_ID = 0
# how the store's not-writable reasons set by the role begin (a role change clears only these)
_SLAVE = "this broker is a SLAVE"
_UNCONFIRMED = "this restarted master is not yet confirmed"


class LockLifetime(Protocol):
    """The lock table's lifetime (broker/locks.py RebalanceLockManager)."""

    @property
    def broker_epoch(self) -> int: ...

    @property
    def takeover_after_ms(self) -> int: ...

    def start_lifetime(self, broker_epoch: int, restart_grace_ms: int) -> None: ...


class OffsetTable(SyncedOffsets, Protocol):
    """Consumer offsets the master serves and the slave syncs (ConsumerOffsetManager)."""

    table_id: str
    change_serial: int

    def encode(self) -> dict[str, Any]: ...

    def encode_changes(self, since_serial: int) -> dict[str, Any]: ...

    def entries(self) -> dict[tuple[str, int], tuple[int, CommitVersion]]: ...

    def max_lock_epoch(self) -> int: ...

    def reset_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None: ...

    def merge_entry(self, key: str, queue_id: int, offset: int, version: CommitVersion) -> None: ...

    def drop_entry(self, queue: tuple[str, int]) -> bool: ...


class HAController:
    """See the module docstring. ``epoch_store`` is the coordination service's broker epoch file; ``ssl_context`` the
    broker's server TLS context (None: plain TCP), which the HA port serves too (slaves connect with TLS then)."""

    name = "ha"

    def __init__(self, *, config: BrokerConfig, registry: HandlerRegistry, store: MessageStore,
                 topics: SyncedTopics, groups: SyncedGroups, offsets: OffsetTable,
                 schedule: SyncedDelayOffsets | None, locks: LockLifetime, epoch_store: BrokerEpochStore,
                 address: AddressSource, merge_offsets: OffsetMerge = overwrite_offsets,
                 ssl_context: ssl.SSLContext | None = None) -> None:
        self.config = config
        self.store = store
        self.offsets = offsets
        self.schedule = schedule
        self.locks = locks
        self.epoch_store = epoch_store
        self.address = address
        self.leases = config.lock_profile == "lease"
        self.state = HAState(ha_state_path(config.store_dir))
        self.role = config.broker_role
        self.broker_id = config.broker_id
        #: The master's addresses learned from the name server's registration answer (or the HA handshake).
        self.learned_master_addr = ""
        self.learned_master_ha_addr = ""
        #: the newest master epoch a name server named for this broker name (a promotion goes above it, even when
        #: that master never reached this broker)
        self.learned_master_epoch = 0
        #: Called after every role change (the register service re-registers at once).
        self.listeners: list[Callable[[], None]] = []
        host = parse_address(config.listen)[0]
        self.service = HAService(
            store, self.state, host=host, port=config.ha_port, batch_size=config.ha_transfer_batch_size,
            heartbeat_interval_ms=config.ha_send_heartbeat_interval,
            housekeeping_interval_ms=config.ha_housekeeping_interval, fallbehind_max=config.ha_slave_fallbehind_max,
            slave_timeout_ms=config.slave_timeout, is_master=lambda: self.is_master,
            master_addr=self._own_addr, broker_epoch=lambda: self.locks.broker_epoch, ssl_context=ssl_context)
        self.client = HAClient(store, self.state, master_ha_address=self.master_ha_address,
                               heartbeat_interval_ms=config.ha_send_heartbeat_interval,
                               housekeeping_interval_ms=config.ha_housekeeping_interval,
                               on_master=self._on_master, ssl_context=_broker_ssl_context(config))
        self.client.on_master_lost = self._on_master_lost
        self.client.before_follow = self._before_follow
        #: Writes config/consumerOffset.json now (the broker wires the coordination service's, which serialises
        #: writes); used after the clamp that follows a cut and after a metadata sync merged offsets.
        self.persist_offsets: Callable[[], Awaitable[object]] | None = None
        #: Until the first handshake since a demotion or a start, committed offsets may point into a tail the master
        #: never had (cut by that handshake, then moved back by ``_offsets_before_follow``): no metadata sync hands
        #: them over before that.
        self._first_handshake_pending = False
        #: A restarted master waits for a name server's word before it takes sends (``start``).
        self._confirmation_pending = False
        self.sync = SlaveSynchronize(master_addr=self._sync_master_addr, topics=topics, groups=groups, offsets=offsets,
                                     schedule=schedule, interval_ms=config.slave_synchronize_interval_ms,
                                     offset_interval_ms=config.slave_offset_sync_interval_ms,
                                     merge_offsets=merge_offsets, persist_offsets=self._write_offsets)
        self.promotions = 0
        self.demotions = 0
        self._transition: tuple[str, str, str] | None = None  # (new role, master addr, master HA addr)
        self._transition_done = trio.Event()
        self._role_scope = trio.CancelScope()
        registry.register(RequestCode.PROMOTE_BROKER, self.promote_broker)
        registry.register(RequestCode.GET_ALL_CONSUMER_OFFSET, self.get_all_consumer_offset)
        registry.register(RequestCode.GET_ALL_DELAY_OFFSET, self.get_all_delay_offset)

    # -- state -------------------------------------------------------------------------------------------
    @property
    def is_master(self) -> bool:
        return self.role != SLAVE

    def _own_addr(self) -> str:
        host, port = self.address()
        return format_address(host, port)

    @property
    def ha_server_addr(self) -> str:
        """``host:port`` of this broker's HA port as other brokers reach it (registered with name servers)."""
        host, _ = self.address()
        return format_address(host, self.service.port)

    @property
    def master_epoch(self) -> int:
        return self.state.master_epoch

    def master_ha_address(self) -> str:
        """The HA address a slave follows: ``ha_master_address``, else the one learned from a name server."""
        return self.config.ha_master_address or self.learned_master_ha_addr

    def master_addr(self) -> str:
        """The master's request address (its metadata): from the HA handshake, else from a name server."""
        ack = self.client.master
        if ack is not None and ack.master_addr and self.client.connected:
            return ack.master_addr
        return self.learned_master_addr or (ack.master_addr if ack is not None else "")

    def _sync_master_addr(self) -> str:
        return "" if self._first_handshake_pending else self.master_addr()

    def _slave_reason(self) -> str:
        master = self.master_addr() or self.master_ha_address() or "unknown"
        return (f"{_SLAVE} (brokerId {self.broker_id}) of {self.config.broker_name}: sends go to its "
                f"master (brokerId 0, at {master})")

    def _apply_role(self) -> None:
        """Make the store follow the role: a slave refuses writes; a SYNC_MASTER waits for its slave, and its
        readers see only what a slave holds (ReadGate)."""
        store = self.store
        if self.role == SLAVE:
            store.writable = False
            store.not_writable_reason = self._slave_reason()
            store.replica_wait = None
        elif self._confirmation_pending:
            store.writable = False
            store.not_writable_reason = (
                f"{_UNCONFIRMED} by a name server since it started (it may have been superseded by a promoted "
                f"slave while it was down): sends are taken once its registration with "
                f"{';'.join(self.config.namesrv_addrs)} is answered and no answer names a newer master")
            store.replica_wait = None
        else:
            if not store.writable and store.not_writable_reason.startswith((_SLAVE, _UNCONFIRMED)):
                store.writable = True
                store.not_writable_reason = ""
            store.replica_wait = self.service.wait_for_slave if self.role == SYNC_MASTER else None
        store.read_gate.follow(self.service.read_limit if self.role == SYNC_MASTER else None)

    def _notify(self) -> None:
        for listener in list(self.listeners):
            try:
                listener()
            except Exception:
                log.exception("ha.listener_failed")

    # -- lifecycle ------------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Read the HA state (a recorded promotion or demotion wins over the configured role) and apply it."""
        await trio.to_thread.run_sync(self.state.load)
        if self.state.broker_role and (self.state.broker_role, self.state.broker_id) != (self.role, self.broker_id):
            log.warning("ha.role_from_state", configured_role=self.role, configured_broker_id=self.broker_id,
                        role=self.state.broker_role, broker_id=self.state.broker_id,
                        path=self.state.path, why="a promotion or demotion recorded in the store")
            self.role, self.broker_id = self.state.broker_role, self.state.broker_id
        restarted_master = self.is_master and bool(self.state.history)
        if self.is_master and not self.state.history:
            self.state.begin_epoch(1, 0)  # the first master of this store writes epoch 1 from the start
            self.state.broker_role, self.state.broker_id = self.role, self.broker_id
            await trio.to_thread.run_sync(self.state.save)
        # A master that was down may have been replaced by its promoted slave meanwhile: a send it acknowledged before
        # a name server told it so would be cut when it follows that master. It takes sends once a registration round
        # got an answer and none named a newer master (a store's first start cannot be superseded).
        self._confirmation_pending = (restarted_master and self.config.ha_confirm_master_at_start
                                      and bool(self.config.namesrv_addrs))
        # a slave's store may hold a tail its master never had (a demoted master that stopped before the cut)
        self._first_handshake_pending = not self.is_master
        self._apply_role()
        if self._confirmation_pending:
            log.warning("ha.master_unconfirmed", master_epoch=self.master_epoch, namesrv=self.config.namesrv_addr,
                        why="restarted: sends are refused until its name servers answer its registration")
        log.info("ha.role", role=self.role, broker_id=self.broker_id, master_epoch=self.master_epoch,
                 ha_port=self.config.ha_port)
        if not self.is_master and not (self.config.namesrv_addr or self.config.ha_master_address
                                       or self.config.embedded_namesrv):
            # Not refused: a slave kept only to be promoted is a choice; but one that means to replicate never will.
            log.warning("ha.no_master_source", role=self.role,
                        why="a slave learns its master's HA address from its name servers (namesrv_addr) or "
                            "ha_master_address; with neither it replicates nothing")

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(self.service.serve)
            task_status.started()
            async with RemotingClient(max_frame_bytes=self.config.max_frame_bytes, connect_timeout_s=3.0,
                                      ssl_context=_broker_ssl_context(self.config)) as rc:
                while True:
                    self._role_scope = trio.CancelScope()
                    with self._role_scope:
                        if self.role == SLAVE:
                            async with trio.open_nursery() as slave:
                                slave.start_soon(self.client.run)
                                slave.start_soon(self.sync.run, rc)
                        else:
                            await trio.sleep_forever()
                    if self._transition is not None:
                        await self._do_transition()

    async def stop(self) -> None:
        pass

    # -- transitions -------------------------------------------------------------------------------------------
    async def _request_transition(self, role: str, master_addr: str = "", master_ha_addr: str = "") -> None:
        if self._transition is not None:
            raise RequestError(ResponseCode.SYSTEM_BUSY, "a role change is under way")
        self._transition = (role, master_addr, master_ha_addr)
        self._transition_done = done = trio.Event()
        self._role_scope.cancel()
        await done.wait()

    async def _do_transition(self) -> None:
        assert self._transition is not None
        role, master_addr, master_ha_addr = self._transition
        try:
            with trio.CancelScope(shield=True):
                if role == SLAVE:
                    await self._become_slave(master_addr, master_ha_addr)
                else:
                    await self._become_master(role)
        finally:
            self._transition = None
            self._transition_done.set()
        self._notify()

    async def _become_master(self, role: str) -> None:
        store = self.store
        writer = self.client.writer
        writer.dispatch()
        cl = store.commitlog
        if writer.reput_offset < cl.max_offset:  # a record only partly received: the new master never had it
            await writer.cut(writer.reput_offset)
        known = self.client.master
        epoch = max(self.state.master_epoch, known.master_epoch if known is not None else 0,
                    self.learned_master_epoch) + 1
        self.state.begin_epoch(epoch, cl.max_offset)
        self.state.broker_role, self.state.broker_id = role, MASTER_ID
        await trio.to_thread.run_sync(self.state.save)
        # Lock epochs above every one the old master granted: its broker epoch is the high half of them (the epoch
        # store holds the one of the last lifetime this broker followed, also across its own restarts). The synced
        # commits' epochs count too, and the new master epoch's band (broker/store/epoch.py) covers the lifetimes
        # the old master may have started since this broker last heard of it: a grant below one of theirs would
        # have its holder's commits refused as stale.
        old_broker_epoch = known.broker_epoch if known is not None else 0
        es = self.epoch_store
        above = max(self.locks.broker_epoch, old_broker_epoch, split_epoch(self.offsets.max_lock_epoch())[0],
                    promotion_floor(epoch) - 1)
        await trio.to_thread.run_sync(es.bump, above)
        # Nobody's lease is known here: wait out the longest one the old master could have granted.
        grace = max(es.max_takeover_ms, self.locks.takeover_after_ms) if self.leases else 0
        self.locks.start_lifetime(es.broker_epoch, grace)
        self.role, self.broker_id = role, MASTER_ID
        self.learned_master_addr = self.learned_master_ha_addr = ""
        self._recreate_topics()
        self._clamp_offsets()
        self._apply_role()
        self.promotions += 1
        log.warning("ha.promoted", role=role, master_epoch=epoch, start_offset=cl.max_offset,
                    broker_epoch=es.broker_epoch, restart_grace_ms=grace,
                    old_master=known.master_addr if known is not None else "")

    def _recreate_topics(self) -> None:
        """Topics the old master created after the last metadata sync have replicated queues but no config here:
        give them one (as a store's start does after a crash window), so they are routed at once."""
        topics = self.sync.topics
        known = topics.all()
        for topic in self.store.topics():
            ids = self.store.queue_ids(topic)
            if topic not in known and ids:
                queues = max(self.config.default_topic_queue_nums, max(ids) + 1)
                topics.create_or_update(TopicConfig(topic, queues, queues))
                log.warning("ha.topic_recreated", topic=topic, queues=queues, why="created after the last sync")

    def _clamp_offsets(self) -> None:
        """Committed offsets past the end of a queue here (synced from the old master, covering records that never
        reached this log) go back to that end: the queue's next messages take those offsets, and a consumer
        starting from the stored offset would skip them."""
        for group, topic, queue_id, offset, end, _version in self._offsets_past_the_end():
            self.offsets.reset_offset(group, topic, queue_id, end)
            log.warning("ha.offset_clamped", group=group, topic=topic, queue_id=queue_id, offset=offset, to=end,
                        why="past the queue's end in the promoted log")

    async def _before_follow(self) -> None:
        """After a handshake, before following: remember the master's broker epoch, then clamp the offsets."""
        master = self.client.master
        if master is not None:
            # Persisted (when higher), so a promotion after this broker restarted, its HelloAck gone, still grants
            # above it.
            await trio.to_thread.run_sync(self.epoch_store.raise_to, master.broker_epoch)
        await self._offsets_before_follow()

    async def _offsets_before_follow(self) -> None:
        """After a handshake, before following: committed offsets past a queue's end here go back to that end. A
        demoted master's log lost the tail its successor never had, and its consumers' commits into that tail must
        not reach the new master, whose own records take those queue offsets (chaos long ASYNC seed 13). Their
        versions stay (made under the old master), so a newer commit on the new master wins the merge (a synced
        entry merely ahead of this slave's replication comes back at the next sync, at the same version). Written to
        disk before anything is followed: once the new master's records fill those queue offsets, a restart could
        no longer tell such an offset from a good one (long ASYNC seed 19: a crash before the next periodic write,
        then a promotion). Done at the first handshake since a demotion or a start, so a crash between the cut and
        the write is caught at the next start."""
        if not self._first_handshake_pending:
            return
        moved = self._offsets_past_the_end()
        for group, topic, queue_id, offset, end, version in moved:
            self.offsets.merge_entry(f"{topic}{TOPIC_GROUP_SEPARATOR}{group}", queue_id, end, version)
            log.warning("ha.offset_clamped", group=group, topic=topic, queue_id=queue_id, offset=offset, to=end,
                        why="past the queue's end after the cut of this broker's tail")
        if moved:
            await self._write_offsets()

    async def _write_offsets(self) -> None:
        if self.persist_offsets is not None:
            await self.persist_offsets()

    def _offsets_past_the_end(self) -> list[tuple[str, str, int, int, int, CommitVersion]]:
        store, out = self.store, []
        for (key, queue_id), (offset, version) in self.offsets.entries().items():
            topic, _, group = key.partition(TOPIC_GROUP_SEPARATOR)
            end = store.get_max_offset_in_queue(topic, queue_id)
            if offset > end:
                out.append((group, topic, queue_id, offset, end, version))
        return out

    async def _become_slave(self, master_addr: str, master_ha_addr: str) -> None:
        old_role = self.role
        self._confirmation_pending = False
        self._first_handshake_pending = old_role != SLAVE
        self.role = SLAVE
        self.broker_id = self.config.broker_id if self.config.broker_role == SLAVE else 1
        self.learned_master_addr, self.learned_master_ha_addr = master_addr, master_ha_addr
        self._apply_role()
        self.service.close_connections()
        self.state.broker_role, self.state.broker_id = SLAVE, self.broker_id
        await trio.to_thread.run_sync(self.state.save)
        self.demotions += 1
        log.warning("ha.demoted", previous_role=old_role, broker_id=self.broker_id, master=master_addr,
                    master_ha=master_ha_addr, master_epoch=self.master_epoch)

    # -- name server answers ---------------------------------------------------------------------------------
    def register_ext(self) -> dict[str, Any]:
        """What REGISTER_BROKER carries for HA: the broker id, the HA address, the master epoch."""
        return {"brokerId": self.broker_id, "haServerAddr": self.ha_server_addr, "masterEpoch": self.master_epoch}

    async def on_register_answer(self, ext: dict[str, Any]) -> None:
        """A name server's REGISTER_BROKER answer: a slave learns its master's addresses; a master that the name
        server knows to be superseded (a master of a newer epoch for this broker name) becomes its slave."""
        master = str(ext.get("masterAddr") or "")
        master_ha = str(ext.get("haServerAddr") or "")
        epoch = ext.get("masterEpoch", 0)
        epoch = epoch if isinstance(epoch, int) and not isinstance(epoch, bool) else 0
        own = self._own_addr()
        self.learned_master_epoch = max(self.learned_master_epoch, epoch)
        if self.is_master:
            if master and master != own and epoch > self.master_epoch and self._transition is None:
                log.warning("ha.superseded", master=master, master_epoch=epoch, own_master_epoch=self.master_epoch)
                await self._request_transition(SLAVE, master, master_ha)
            return
        if master and master != own and (master, master_ha) != (self.learned_master_addr,
                                                                 self.learned_master_ha_addr):
            self.learned_master_addr, self.learned_master_ha_addr = master, master_ha
            self.store.not_writable_reason = self._slave_reason()
            self.client.address_changed()

    def on_registered(self) -> None:
        """A registration round ended in which a name server answered and none named a newer master (one that did
        made this broker a slave already): a restarted master takes sends from now on."""
        if self._confirmation_pending and self.is_master and self._transition is None:
            self._confirmation_pending = False
            self._apply_role()
            log.info("ha.master_confirmed", master_epoch=self.master_epoch,
                     why="its name servers answered its registration naming no newer master: sends are taken")

    def _on_master(self, ack: HelloAck) -> None:
        self._first_handshake_pending = False  # the handshake cut what the master never had (before this call)
        if not self.learned_master_addr and ack.master_addr:
            self.store.not_writable_reason = self._slave_reason()
        self.sync.wake()  # (re)connected: merge offsets both ways now, not up to 10 s later

    def _on_master_lost(self) -> None:
        # Consumers read from this slave while its master is away (HA part 2): a topic the master created after the
        # last metadata sync gets a config from its replicated queues now, or its pulls would find no topic.
        if not self.is_master:
            self._recreate_topics()

    # -- requests -----------------------------------------------------------------------------------------------
    async def promote_broker(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        """PROMOTE_BROKER (trimq 9010): ext ``brokerName``, ``brokerId`` (must be this broker's), optional
        ``brokerRole`` (ASYNC_MASTER, the default, or SYNC_MASTER), ``force`` (bool: promote even though a master of a
        newer epoch than this broker's log exists, losing what it stored). Answers the new epochs."""
        ext = cmd.ext
        name = ext.get("brokerName", self.config.broker_name)
        if name != self.config.broker_name:
            raise RequestError(ResponseCode.SYSTEM_ERROR, f"this broker is {self.config.broker_name}, not {name!r}")
        bid = int_field(ext, "brokerId", self.broker_id)
        if bid != self.broker_id:
            raise RequestError(ResponseCode.SYSTEM_ERROR, f"this broker is brokerId {self.broker_id}, not {bid!r}")
        role = ext.get("brokerRole") or ASYNC_MASTER
        if role not in (ASYNC_MASTER, SYNC_MASTER):
            raise RequestError(ResponseCode.SYSTEM_ERROR,
                               f"brokerRole must be ASYNC_MASTER or SYNC_MASTER, got {role!r}")
        if self.is_master:
            raise RequestError(ResponseCode.SYSTEM_ERROR,
                               f"{self.config.broker_name} brokerId {self.broker_id} is already a master ({self.role})")
        force = ext.get("force") is True
        if self.learned_master_epoch > self.master_epoch and not force:
            # Its log ends in an older epoch than a master the name server named (a slave that never reached that
            # master, or a demoted master that never had its tail cut): promoted, it would drop every message that
            # master acknowledged, and its own divergent tail would be served as if acknowledged.
            raise RequestError(
                ResponseCode.SYSTEM_ERROR,
                f"{self.config.broker_name} brokerId {self.broker_id} has followed master epochs up to "
                f"{self.master_epoch} only, but a master of epoch {self.learned_master_epoch} exists "
                f"({self.learned_master_addr or 'address unknown'}): promoting this broker would lose what that "
                f"master stored. Bring that master back, or promote with force to accept the loss")
        log.warning("ha.promote_requested", role=role, by=conn.remote, force=force,
                    newest_known_master_epoch=self.learned_master_epoch)
        await self._request_transition(role)
        return RemotingCommand.response_to(cmd, ext={
            "brokerRole": self.role, "brokerId": self.broker_id, "masterEpoch": self.master_epoch,
            "brokerEpoch": self.locks.broker_epoch, "maxOffset": self.store.commitlog.max_offset})

    async def get_all_consumer_offset(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        """GET_ALL_CONSUMER_OFFSET (43): the offset table as the file holds it (a slave's sync); with
        ``offsetTableId`` and ``sinceChangeSerial`` of this table's lifetime, only what changed after that serial
        (``incremental``). Every answer names the table and its current serial, for the next request."""
        offsets = self.offsets
        table_id = cmd.ext.get("offsetTableId")
        if table_id is not None and not isinstance(table_id, str):
            raise RequestError(ResponseCode.SYSTEM_ERROR,
                               f"header field 'offsetTableId' must be a string, got {type(table_id).__name__}")
        since = int_field(cmd.ext, "sinceChangeSerial", -1)
        ext: dict[str, Any] = {"offsetTableId": offsets.table_id, "changeSerial": offsets.change_serial}
        if table_id == offsets.table_id and 0 <= since <= offsets.change_serial:
            return RemotingCommand.response_to(cmd, body=offsets.encode_changes(since),
                                               ext={**ext, "incremental": True})
        return RemotingCommand.response_to(cmd, body=offsets.encode(), ext={**ext, "incremental": False})

    async def get_all_delay_offset(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        """GET_ALL_DELAY_OFFSET (45): the delay levels' progress as delayOffset.json holds it."""
        table = self.schedule.offsets if self.schedule is not None else {}
        return RemotingCommand.response_to(cmd, body=encode_offset_table(table))

    # -- metrics -----------------------------------------------------------------------------------------
    def offsets_sync_age_ms(self) -> int:
        """Slave: ms since its consumer offsets were last merged with its master's (since the start until the first
        time); a master: 0 (its own table is the current one)."""
        return 0 if self.is_master else self.sync.offsets_age_ms()

    def status(self) -> dict[str, Any]:
        """Role, epochs, replication progress and lag (metrics, GET_BROKER_RUNTIME_INFO, trimq-admin)."""
        svc, client = self.service, self.client
        out: dict[str, Any] = {"brokerRole": self.role, "brokerId": self.broker_id, "masterEpoch": self.master_epoch,
                               "haServerAddr": self.ha_server_addr, "maxOffset": self.store.commitlog.max_offset}
        if self.is_master:
            out.update(slaves=len(svc.connections), slaveAckOffset=svc.push_slave_max_offset,
                       lagBytes=svc.lag_bytes(), lagSeconds=round(svc.lag_seconds(), 3))
        else:
            out.update(masterConnected=client.connected, masterAddr=self.master_addr(),
                       masterHaAddr=self.master_ha_address(), dispatchedOffset=client.writer.reput_offset,
                       offsetsSyncAgeMs=self.offsets_sync_age_ms())
        return out


def _broker_ssl_context(config: BrokerConfig) -> ssl.SSLContext | None:
    """TLS towards the master's request port when this broker serves TLS itself (same CA, same certificate)."""
    if not config.tls_cert_file:
        return None
    return client_ssl_context(config.tls_ca_file or None, config.tls_cert_file or None, config.tls_key_file or None)
