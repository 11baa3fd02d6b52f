"""The broker process and its composition root: one RemotingServer plus the services that answer its requests.

``Broker.__init__`` is the one place that builds the broker: every component once, kept as a typed attribute,
each service handed exactly the collaborators it uses (typed by the small views in broker/deps.py), so a
missing dependency is a TypeError here and not a SYSTEM_ERROR at request time. ``Broker.run`` starts the
services in list order (the store is open before anything that needs it), runs their background loops,
serves, and stops them in reverse order after the server drained (runtime/daemon.py has the lifecycle).
"""

from __future__ import annotations

import os
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from trimq.broker.acl import AccessValidator, load_acl
from trimq.broker.config import BrokerConfig
from trimq.broker.consumers import ConsumerManager
from trimq.broker.ha.controller import HAController
from trimq.broker.ha.offset_sync import OffsetMergeService, merge_and_hand_back
from trimq.broker.locks import RebalanceLockManager
from trimq.broker.long_polling import LongPolling
from trimq.broker.metrics import BrokerCollector, BrokerMetrics
from trimq.broker.processors.admin_forward import AdminForwardService
from trimq.broker.processors.admin_groups import AdminGroupsService
from trimq.broker.processors.admin_topic import AdminTopicService
from trimq.broker.processors.basic import BasicService
from trimq.broker.processors.consumer import CoordinationService, broker_now_ms, wall_ms
from trimq.broker.processors.pull import PullService
from trimq.broker.processors.query import QueryMessageService
from trimq.broker.processors.register import RegisterService, advertised_host
from trimq.broker.processors.retry import RetryService
from trimq.broker.processors.send import SendService
from trimq.broker.processors.subscription_group import SubscriptionGroupService
from trimq.broker.store.message_store import MessageStore
from trimq.broker.store.offsets import ConsumerOffsetManager, offset_file_path
from trimq.broker.store.schedule import ScheduleMessageService
from trimq.broker.store.store_base import RECLAIM_SETTINGS, StoreConfig
from trimq.broker.store.subscription_groups import SubscriptionGroupManager
from trimq.broker.store.topics import TopicConfigManager
from trimq.namesrv.metrics import NamesrvCollector
from trimq.namesrv.service import NameServer, NamesrvService
from trimq.protocol.address import format_address
from trimq.runtime.daemon import Service, open_listeners, run_services
from trimq.runtime.logs import get_logger
from trimq.runtime.server import RemotingServer
from trimq.runtime.settings import ConfigError
from trimq.runtime.tls import server_ssl_context

log = get_logger("trimq.broker")

__all__ = ["ADDRESS_FILE_NAME", "Broker", "open_broker", "store_config"]

# In the store directory: HOST:PORT once the server listens (how a caller learns the port of --listen HOST:0).
ADDRESS_FILE_NAME = "broker.addr"


class Broker:
    """A broker: ``async with open_broker(config) as broker`` in tests, ``await broker.run()`` in the daemon."""

    def __init__(self, config: BrokerConfig) -> None:
        config.validate()
        if os.path.exists(config.store_dir) and not os.path.isdir(config.store_dir):
            raise ConfigError(f"store_dir = {config.store_dir!r}: exists and is not a directory")
        self.config = config
        self.server = server = RemotingServer(
            name=config.broker_name,
            max_frame_bytes=config.max_frame_bytes,
            max_connections=config.max_connections,
            max_inflight_requests=config.max_inflight_requests,
            max_pending_write_bytes=config.max_pending_write_bytes,
            max_total_pending_write_bytes=config.max_total_pending_write_bytes,
            busy_body_bytes=config.busy_body_bytes,
            write_stall_timeout_s=config.max_write_stall_ms / 1000,
            max_idle_s=config.server_channel_max_idle_time_seconds,
            shutdown_grace_s=config.shutdown_grace_ms / 1000,
        )
        self.ssl_context = _server_ssl_context(config)
        self.acl: AccessValidator | None = None
        if config.acl_file:
            acl = self.acl = AccessValidator(load_acl(config.acl_file))
            server.authorizer = lambda cmd, conn: acl.check(cmd, conn.remote)
        self.started = trio.Event()

        # -- storage (issue 3): the store, topic configs, consumer-group configs
        self.store = MessageStore(store_config(config), store_host=self.advertised_host)
        self.topic_config_manager = topics = TopicConfigManager(
            config.store_dir, default_queue_nums=config.default_topic_queue_nums,
            auto_create=config.auto_create_topic_enable, store=self.store)
        self.subscription_group_manager = groups = SubscriptionGroupManager(
            store_dir=config.store_dir, auto_create=config.auto_create_subscription_group)
        # -- coordination (issue 4): membership, queue locks, consumer offsets
        # Queue locks are leases (issue 14): lock_profile "lease" (the default) or RocketMQ's clocks ("rocketmq").
        self.lock_manager = RebalanceLockManager(max_live_ms=config.lock_lease_ms, now_ms=broker_now_ms,
                                                 takeover_margin_ms=config.lock_takeover_margin_ms)
        leases = config.lock_profile == "lease"
        self.consumer_manager = ConsumerManager(
            channel_expired_timeout_ms=config.channel_expired_timeout_ms, now_ms=broker_now_ms, wall_ms=wall_ms,
            on_dirty=lambda: self.coordination_service.wake_notifier(),
            lease_expiry_ms=self.lock_manager.takeover_after_ms if leases else 0,
            disconnect_grace_ms=config.lock_disconnect_grace)
        self.offset_manager = ConsumerOffsetManager(
            offset_file_path(config.store_dir), broker_name=config.broker_name, lock_manager=self.lock_manager,
            is_orderly=self.consumer_manager.is_orderly, now_ms=wall_ms)
        self.long_polling = LongPolling()
        self.namesrv = NameServer(server) if config.embedded_namesrv else None

        # -- request handlers: each gets the views it uses (broker/deps.py)
        self.basic_service = BasicService(config=config, registry=server, connections=server.connections)
        self.send_service = SendService(config=config, registry=server, store=self.store, topics=topics,
                                        groups=groups)
        self.pull_service = PullService(config=config, server=server, store=self.store, topics=topics,
                                        offsets=self.offset_manager, long_polling=self.long_polling)
        self.admin_topic_service = AdminTopicService(registry=server, store=self.store, topics=topics,
                                                     default_queue_nums=config.default_topic_queue_nums)
        self.query_message_service = QueryMessageService(
            registry=server, index=self.store.index_dispatcher, store=self.store,
            default_query_max_num=config.default_query_max_num, max_msgs_num_batch=config.max_msgs_num_batch)
        self.namesrv_service = NamesrvService(self.namesrv) if self.namesrv is not None else None
        self.register_service = RegisterService(config=config, server=server, topics=topics, namesrv=self.namesrv,
                                                address=self.advertised_host, started=self.started)
        self.coordination_service = CoordinationService(
            config=config, registry=server, consumer_manager=self.consumer_manager, lock_manager=self.lock_manager,
            offset_manager=self.offset_manager, topics=topics, groups=groups, store=self.store)
        self.subscription_group_service = SubscriptionGroupService(registry=server, groups=groups)
        # After the pull service: it wires the store's put hook, tags-code rule and arrivals before the store
        # starts, so recovery computes due times the same way.
        self.schedule_message_service = ScheduleMessageService(
            store=self.store, store_dir=config.store_dir, topics=topics, delay_levels=config.message_delay_level,
            flush_interval_ms=config.flush_delay_offset_interval_ms)
        self.retry_service = RetryService(config=config, registry=server, store=self.store, topics=topics,
                                          groups=groups, acl_enabled=self.acl is not None,
                                          index=self.store.index_dispatcher)
        self.admin_forward_service = AdminForwardService(
            registry=server, broker_name=config.broker_name, store=self.store, topics=topics,
            offsets=self.offset_manager, offset_persister=self.coordination_service,
            consumers=self.consumer_manager, locks=self.lock_manager,
            running_info_timeout_s=config.admin_running_info_timeout_ms / 1000,
            skip_timeout_s=config.admin_skip_message_timeout_ms / 1000,
            reset_timeout_s=config.admin_reset_offset_timeout_ms / 1000)
        self.admin_groups_service = AdminGroupsService(
            registry=server, store=self.store, topics=topics, groups=groups, offsets=self.offset_manager,
            offset_persister=self.coordination_service)

        #: Start order; stopped in reverse. The store first, topics before anything that creates topics.
        self.services: list[Service] = [
            self.basic_service, self.store, topics, self.send_service, self.pull_service, self.admin_topic_service,
            self.query_message_service,
            *([self.namesrv_service] if self.namesrv_service is not None else []), self.register_service,
            self.coordination_service, groups, self.subscription_group_service, self.schedule_message_service,
            self.retry_service, self.admin_forward_service, self.admin_groups_service,
        ]
        # -- high availability (issue 15): the role, the HA port, a slave's replication and metadata sync. Last:
        # it starts after the store, the configs and the lock lifetime it works on.
        self.ha_controller = HAController(
            config=config, registry=server, store=self.store, topics=topics, groups=groups,
            offsets=self.offset_manager, schedule=self.schedule_message_service, locks=self.lock_manager,
            epoch_store=self.coordination_service.epoch_store, address=self.advertised_host,
            # offsets committed to a slave while its master was away survive the master's return (merged by commit
            # version both ways: broker/ha/offset_sync.py), unlike RocketMQ's overwrite
            merge_offsets=merge_and_hand_back, ssl_context=self.ssl_context)
        self.ha_controller.persist_offsets = self.coordination_service.persist_offsets
        self.offset_merge_service = OffsetMergeService(registry=server, offsets=self.offset_manager)
        self.register_service.ha = self.ha_controller
        self.basic_service.ha_status = self.ha_controller.status
        self.ha_controller.listeners.append(self.register_service.wake)
        # Only a master delivers delayed messages (RocketMQ's handleScheduleMessageService).
        self.schedule_message_service.is_master = lambda: self.ha_controller.is_master
        self.ha_controller.listeners.append(self.schedule_message_service.role_changed)
        # Pull answers carry the master epoch; positions reached under an older one are checked (a lost tail).
        self.pull_service.epochs = self.ha_controller.state
        self.coordination_service.epochs = self.ha_controller.state  # and commits say theirs (the same check)
        self.services.append(self.ha_controller)
        self.metrics: BrokerMetrics | None = None
        if config.metrics_port >= 0:  # installs its hooks before anything is served (0: any free port)
            collector = BrokerCollector(
                config=config, server=server, store=self.store, topics=topics, offsets=self.offset_manager,
                consumers=self.consumer_manager, locks=self.lock_manager, send=self.send_service,
                pull=self.pull_service, coordination=self.coordination_service, retry=self.retry_service,
                schedule=self.schedule_message_service, long_polling=self.long_polling)
            collector.ha = self.ha_controller
            extra = (NamesrvCollector(self.namesrv.routes),) if self.namesrv is not None else ()
            self.metrics = BrokerMetrics(config=config, server=server, store=self.store, collector=collector,
                                         extra=extra)

    def advertised_host(self) -> tuple[str, int]:
        """``(host, port)`` other processes reach this broker at (records' store host, routes)."""
        return advertised_host(self.config, self.server.addresses)

    @property
    def address(self) -> str:
        """``host:port`` actually listened on (valid once started)."""
        return self.server.address

    def shutdown(self) -> None:
        """Begin a graceful stop."""
        self.server.shutdown()

    async def run(self, *, task_status: trio.TaskStatus[Broker] = trio.TASK_STATUS_IGNORED) -> None:
        """Start every service, serve until ``shutdown()``, then stop services in reverse order."""
        listeners = await open_listeners(self.config.listen, self.ssl_context)

        async def serve() -> None:
            async with trio.open_nursery() as serving:
                await serving.start(self.server.serve_listeners, listeners)
                self._write_address_file()
                log.info("broker.started", broker=self.config.broker_name, address=self.address,
                         store=self.config.store_dir, flush=self.config.flush_disk_type)
                self.started.set()
                task_status.started(self)

        try:
            await run_services(self.services, serve, background=[self.metrics.serve] if self.metrics else [])
        finally:
            log.info("broker.stopped", broker=self.config.broker_name)

    def _write_address_file(self) -> None:
        os.makedirs(self.config.store_dir, exist_ok=True)
        host, port = self.server.addresses[0]
        path = os.path.join(self.config.store_dir, ADDRESS_FILE_NAME)
        tmp = path + ".tmp"
        with open(tmp, "w") as fh:
            fh.write(format_address(host, port) + "\n")
        os.replace(tmp, path)


def store_config(config: BrokerConfig) -> StoreConfig:
    """The store's settings, from the broker's."""
    return StoreConfig(
        store_dir=config.store_dir,
        segment_size=config.mapped_file_size_commit_log,
        consume_queue_file_size=config.mapped_file_size_consume_queue,
        flush_disk_type=config.flush_disk_type,
        flush_interval_ms=config.flush_interval_ms,
        sync_flush_timeout_ms=config.sync_flush_timeout_ms,
        max_message_size=config.max_message_size,
        max_transfer_count=config.max_transfer_count_on_message_in_memory,
        max_transfer_bytes=config.max_transfer_bytes_on_message_in_memory,
        message_index_enable=config.message_index_enable,
        max_hash_slot_num=config.max_hash_slot_num,
        max_index_num=config.max_index_num,
        max_msgs_num_batch=config.max_msgs_num_batch,
        **{name: getattr(config, name) for name in RECLAIM_SETTINGS},
    )


def _server_ssl_context(config: BrokerConfig) -> ssl.SSLContext | None:
    """The TLS context of the broker's listeners (None: plain TCP). ConfigError for unusable files."""
    if not config.tls_cert_file:
        return None
    try:
        return server_ssl_context(config.tls_cert_file, config.tls_key_file or None, config.tls_ca_file or None,
                                  require_client_cert=config.tls_require_client_cert)
    except ValueError as exc:
        raise ConfigError(f"TLS: {exc}") from None


@asynccontextmanager
async def open_broker(config: BrokerConfig) -> AsyncIterator[Broker]:
    """Run a broker in the background for the duration of the block (tests, embedding, the demo)."""
    broker = Broker(config)
    async with trio.open_nursery() as nursery:
        await nursery.start(broker.run)
        try:
            yield broker
        finally:
            broker.shutdown()
