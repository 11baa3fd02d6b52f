"""Prometheus metrics of one broker: a registry of its own (several brokers in one process do not clash),
served at ``GET /metrics`` on ``metrics_host:metrics_port`` by a task in the broker's nursery.

What costs something per request or per message is kept to a minimum: the hot paths only bump plain
counters (``SendService.put_stats``, ``PullService.get_stats``, the lock/offset/retry counters of the
coordination and retry services) and three histograms are observed per request / per append batch / per
fsync. Everything else is read from the live components when the registry is scraped (a custom collector),
so it is exact at scrape time and costs nothing in between.

Names follow RocketMQ 5's broker metrics with a ``trimq_`` prefix where one exists
(``rocketmq_messages_in_total`` -> ``trimq_messages_in_total``); units are seconds and bytes, per the
Prometheus conventions (RocketMQ uses milliseconds). The full list is in :data:`METRICS` and
docs/OPERATIONS.md.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import trio
from prometheus_client import CollectorRegistry, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from trimq.protocol.validation import DLQ_GROUP_TOPIC_PREFIX, RETRY_GROUP_TOPIC_PREFIX, SCHEDULE_TOPIC
from trimq.runtime.logs import RateLimiter, get_logger, log_rate_limited
from trimq.runtime.metrics_http import serve_metrics
from trimq.runtime.rpc_metrics import RpcMetrics

if TYPE_CHECKING:
    from prometheus_client.registry import Collector

    from trimq.broker.config import BrokerConfig
    from trimq.broker.consumers import ConsumerManager
    from trimq.broker.locks import RebalanceLockManager
    from trimq.broker.long_polling import LongPolling
    from trimq.broker.processors.consumer import CoordinationService
    from trimq.broker.processors.pull import PullService
    from trimq.broker.processors.retry import RetryService
    from trimq.broker.processors.send import SendService
    from trimq.broker.store.message_store import MessageStore
    from trimq.broker.store.offsets import ConsumerOffsetManager
    from trimq.broker.store.schedule import ScheduleMessageService
    from trimq.broker.store.topics import TopicConfigManager
    from trimq.runtime.server import RemotingServer

log = get_logger("trimq.metrics")

__all__ = ["METRICS", "STORE_BUCKETS", "BrokerCollector", "BrokerMetrics"]

STORE_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                 1.0, 2.5, 5.0)

#: name -> (type, labels, meaning): the broker's metrics (docs/OPERATIONS.md lists the same; a test checks).
METRICS: dict[str, tuple[str, str, str]] = {
    "trimq_broker_info": ("gauge", "cluster, broker, address", "always 1; the labels say which broker this is"),
    "trimq_broker_permission": ("gauge", "", "RocketMQ PermName bits of the broker (6 = read and write)"),
    "trimq_rpc_latency_seconds": ("histogram", "request_code, response_code",
                                  "time to handle one request (long-polling pulls include the hold); "
                                  "``_count`` is the number of requests"),
    "trimq_messages_in_total": ("counter", "topic", "messages stored by SEND_MESSAGE(_V2) / SEND_BATCH_MESSAGE"),
    "trimq_throughput_in_bytes_total": ("counter", "topic", "commit-log record bytes of those messages"),
    "trimq_messages_out_total": ("counter", "topic, consumer_group", "messages returned by PULL_MESSAGE"),
    "trimq_throughput_out_bytes_total": ("counter", "topic, consumer_group", "record bytes returned by pulls"),
    "trimq_storage_append_latency_seconds": ("histogram", "", "one commit-log append (a batch counts once)"),
    "trimq_storage_fsync_latency_seconds": ("histogram", "mode",
                                            "one fsync pass: mode=interval (commit log, consume queues, "
                                            "checkpoint) or group_commit (SYNC_FLUSH)"),
    "trimq_storage_size_bytes": ("gauge", "", "size of the commit-log segment files"),
    "trimq_commitlog_max_offset_bytes": ("gauge", "", "commit-log write position"),
    "trimq_storage_flush_behind_bytes": ("gauge", "", "bytes written but not yet fsynced"),
    "trimq_storage_writable": ("gauge", "", "1 while the store accepts writes"),
    "trimq_storage_disk_used_ratio": ("gauge", "path",
                                      "used share (0-1, -1 unknown) of the disk holding path=commitlog or "
                                      "consumequeue, as last measured by the reclaim service (docs/STORAGE.md §9)"),
    "trimq_storage_disk_full": ("gauge", "", "1 while the disk is above disk_space_warning_level_ratio and "
                                "sends are refused"),
    "trimq_storage_deleted_files_total": ("counter", "kind",
                                          "files deleted as expired or over quota: kind=commitlog (segments) "
                                          "or consumequeue"),
    "trimq_topic_number": ("gauge", "", "topic configs on the broker"),
    "trimq_consumer_group_number": ("gauge", "", "consumer groups with a live member or a stored offset"),
    "trimq_consumer_lag_messages": ("gauge", "consumer_group, topic, queue_id",
                                    "broker max offset - committed offset (a queue with none counts from 0, "
                                    "as RocketMQ's consumerProgress)"),
    "trimq_consumer_lag_latency_seconds": ("gauge", "consumer_group, topic, queue_id",
                                           "age of the oldest unconsumed message (0 when caught up)"),
    "trimq_consumer_connections": ("gauge", "consumer_group", "live members of the group on this broker"),
    "trimq_producer_connections": ("gauge", "producer_group", "live producers of the group"),
    "trimq_consumer_membership_events_total": ("counter", "event",
                                               "registered, unregistered, closed (connection), expired "
                                               "(no heartbeat), ..."),
    "trimq_consumer_ids_changed_notifications_total": ("counter", "", "NOTIFY_CONSUMER_IDS_CHANGED pushed"),
    "trimq_locks_held": ("gauge", "consumer_group", "live queue locks (orderly consumption)"),
    "trimq_lock_operations_total": ("counter", "outcome",
                                    "per queue: acquired, renewed, stolen (expired lock taken over), refused, "
                                    "unlocked, unlock_refused, unlock_not_locked"),
    "trimq_offset_fenced_updates_total": ("counter", "consumer_group",
                                          "offset commits refused because another client holds the lock"),
    "trimq_offset_stale_generation_updates_total": ("counter", "consumer_group",
                                                    "offset commits refused because they were made before "
                                                    "an offset reset of the group (reset generation)"),
    "trimq_offset_updates_total": ("counter", "", "offset commits applied"),
    "trimq_retry_messages_total": ("counter", "consumer_group", "messages stored in %RETRY%<group>"),
    "trimq_send_to_dlq_messages_total": ("counter", "consumer_group", "messages stored in %DLQ%<group>"),
    "trimq_send_back_total": ("counter", "result", "CONSUMER_SEND_MSG_BACK handled: result=retry or dlq"),
    "trimq_schedule_messages_total": ("counter", "outcome",
                                      "delayed messages: delivered, duplicate_skipped, dropped"),
    "trimq_schedule_backlog_messages": ("gauge", "delay_level", "delayed messages not yet delivered"),
    "trimq_connections": ("gauge", "", "open client connections"),
    "trimq_connections_refused_total": ("counter", "", "connections refused at max_connections"),
    "trimq_protocol_errors_total": ("counter", "", "connections closed for a malformed frame"),
    "trimq_connections_closed_total": ("counter", "reason",
                                       "connections the broker closed: reason=idle (no frame for "
                                       "server_channel_max_idle_time_seconds) or write_stalled (answers not read "
                                       "for max_write_stall_ms)"),
    "trimq_pending_write_bytes": ("gauge", "", "answer bytes queued for all connections, not yet written "
                                  "(bounded by max_total_pending_write_bytes, docs/PROTOCOL.md §2)"),
    "trimq_field_range_errors_total": ("counter", "oneway",
                                       "requests refused because a numeric field is outside its Java type's range "
                                       "(oneway=true: dropped without an answer)"),
    "trimq_answer_encode_errors_total": ("counter", "", "answers that could not be encoded, sent as SYSTEM_ERROR"),
    "trimq_handler_errors_total": ("counter", "", "requests whose handler failed unexpectedly (SYSTEM_ERROR)"),
    "trimq_long_polling_requests_held": ("gauge", "", "pulls currently held waiting for messages"),
    "trimq_long_polling_queues": ("gauge", "", "queues with at least one held pull"),
    # -- high availability (issue 15, broker/ha/, docs/OPERATIONS.md "High availability")
    "trimq_ha_role": ("gauge", "role", "1 for the broker's current role: ASYNC_MASTER, SYNC_MASTER or SLAVE"),
    "trimq_ha_master_epoch": ("gauge", "", "the newest master epoch this broker knows (grows with each promotion)"),
    "trimq_ha_slave_connections": ("gauge", "", "master: slaves connected to its HA port"),
    "trimq_ha_master_connected": ("gauge", "", "slave: 1 while it follows its master over the HA port"),
    "trimq_ha_replication_lag_bytes": ("gauge", "",
                                       "master: commit-log bytes its best slave has not acknowledged"),
    "trimq_ha_replication_lag_seconds": ("gauge", "",
                                         "master: age of the oldest message its best slave has not acknowledged "
                                         "(0 when it has everything)"),
    "trimq_ha_offsets_sync_age_seconds": ("gauge", "",
                                          "slave: seconds since its consumer offsets were last merged with its "
                                          "master's (since its start until the first time; a promoted slave "
                                          "serves them); 0 on a master"),
    "trimq_ha_offset_queues_fetched_total": ("counter", "answer",
                                             "slave: queue offsets received from its master's GET_ALL_CONSUMER_OFFSET: "
                                             "answer=whole (full syncs, or a master without the incremental form) "
                                             "or changes (the offset rounds)"),
    "trimq_ha_sync_master_waits_total": ("counter", "outcome",
                                         "SYNC_MASTER sends that waited for a slave: outcome=ok, timeout "
                                         "(FLUSH_SLAVE_TIMEOUT) or slave_not_available"),
}


def _counter(name: str, doc: str, labels: list[str] | None = None) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, labels=labels)


def _gauge(name: str, doc: str, labels: list[str] | None = None) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels)


def _doc(name: str) -> str:
    return METRICS[name][2].replace("``", "")


def _reclaim_metrics(store: Any) -> Iterator[Metric]:
    """Disk use and deleted files of the store's reclaim service (broker/store/clean.py)."""
    used = _gauge("trimq_storage_disk_used_ratio", _doc("trimq_storage_disk_used_ratio"), ["path"])
    for path, ratio in sorted(store.disk_used_ratio.items()):
        used.add_metric([path], ratio)
    yield used
    full = _gauge("trimq_storage_disk_full", _doc("trimq_storage_disk_full"))
    full.add_metric([], 1 if store.disk_full else 0)
    yield full
    deleted = _counter("trimq_storage_deleted_files", _doc("trimq_storage_deleted_files_total"), ["kind"])
    for kind, n in sorted(store.deleted_files.items()):
        deleted.add_metric([kind], n)
    yield deleted


class BrokerCollector:
    """Reads the broker's components when the registry is scraped (on the trio thread, like everything else
    that touches them). A part that fails is skipped and logged (rate-limited): a scrape never takes the
    broker down. The broker hands it every component it reads (broker/broker.py)."""

    def __init__(self, *, config: BrokerConfig, server: RemotingServer, store: MessageStore,
                 topics: TopicConfigManager, offsets: ConsumerOffsetManager, consumers: ConsumerManager,
                 locks: RebalanceLockManager, send: SendService, pull: PullService,
                 coordination: CoordinationService, retry: RetryService, schedule: ScheduleMessageService,
                 long_polling: LongPolling, now_ms: Callable[[], int] | None = None) -> None:
        self.config = config
        self.server = server
        self.store = store
        self.topics = topics
        self.offsets = offsets
        self.consumers = consumers
        self.locks = locks
        self.send = send
        self.pull = pull
        self.coordination = coordination
        self.retry = retry
        self.schedule = schedule
        self.long_polling = long_polling
        self._now_ms = now_ms or (lambda: time.time_ns() // 1_000_000)
        self._errors = RateLimiter(60_000)
        #: The HA controller (broker/ha/controller.py), set by the composition root.
        self.ha: Any = None

    def describe(self) -> list[Metric]:
        return []  # the families vary with the broker's state; nothing to pre-declare

    def collect(self) -> Iterator[Metric]:
        for part in (self._info, self._traffic, self._storage, self._consumers, self._locks_offsets,
                     self._retries, self._server, self._ha):
            try:
                yield from part()
            except Exception as exc:  # a scrape must not crash the daemon
                log_rate_limited(self._errors, part.__name__, self._now_ms(), log.warning, "metrics.collect_failed",
                                 part=part.__name__.lstrip("_"), error=f"{type(exc).__name__}: {exc}")

    # -- parts ------------------------------------------------------------------------------------------
    def _ha(self) -> Iterator[Metric]:
        ha = self.ha
        if ha is None:
            return
        status = ha.status()
        role = _gauge("trimq_ha_role", _doc("trimq_ha_role"), ["role"])
        for name in ("ASYNC_MASTER", "SYNC_MASTER", "SLAVE"):
            role.add_metric([name], 1 if status["brokerRole"] == name else 0)
        yield role
        svc = ha.service
        for name, value in (("trimq_ha_master_epoch", status["masterEpoch"]),
                            ("trimq_ha_slave_connections", len(svc.connections)),
                            ("trimq_ha_master_connected", 1 if ha.client.connected else 0),
                            ("trimq_ha_replication_lag_bytes", svc.lag_bytes()),
                            ("trimq_ha_replication_lag_seconds", svc.lag_seconds(self._now_ms())),
                            ("trimq_ha_offsets_sync_age_seconds", ha.offsets_sync_age_ms() / 1000)):
            g = _gauge(name, _doc(name))
            g.add_metric([], value)
            yield g
        sync = ha.sync
        fetched = _counter("trimq_ha_offset_queues_fetched_total", _doc("trimq_ha_offset_queues_fetched_total"),
                           ["answer"])
        fetched.add_metric(["whole"], sync.offset_queues_whole)
        fetched.add_metric(["changes"], sync.offset_queues_in_changes)
        yield fetched
        waits = _counter("trimq_ha_sync_master_waits_total", _doc("trimq_ha_sync_master_waits_total"), ["outcome"])
        waits.add_metric(["ok"], svc.sync_ok)
        waits.add_metric(["timeout"], svc.sync_timeouts)
        waits.add_metric(["slave_not_available"], svc.slave_not_available)
        yield waits

    def _info(self) -> Iterator[Metric]:
        cfg = self.config
        info = _gauge("trimq_broker_info", _doc("trimq_broker_info"), ["cluster", "broker", "address"])
        try:
            address = self.server.address
        except IndexError:
            address = cfg.listen
        info.add_metric([cfg.cluster_name, cfg.broker_name, address], 1)
        yield info
        perm = _gauge("trimq_broker_permission", _doc("trimq_broker_permission"))
        perm.add_metric([], cfg.broker_permission)
        yield perm

    def _traffic(self) -> Iterator[Metric]:
        send = self.send
        if send is not None:
            msgs = _counter("trimq_messages_in_total", _doc("trimq_messages_in_total"), ["topic"])
            size = _counter("trimq_throughput_in_bytes_total", _doc("trimq_throughput_in_bytes_total"), ["topic"])
            for topic, (n, b) in sorted(send.put_stats.items()):
                msgs.add_metric([topic], n)
                size.add_metric([topic], b)
            yield msgs
            yield size
        pull = self.pull
        if pull is not None:
            labels = ["topic", "consumer_group"]
            msgs = _counter("trimq_messages_out_total", _doc("trimq_messages_out_total"), labels)
            size = _counter("trimq_throughput_out_bytes_total", _doc("trimq_throughput_out_bytes_total"), labels)
            for (topic, group), (n, b) in sorted(pull.get_stats.items()):
                msgs.add_metric([topic, group], n)
                size.add_metric([topic, group], b)
            yield msgs
            yield size

    def _storage(self) -> Iterator[Metric]:
        store = self.store
        cl = store.commitlog
        files = len(cl.segments) + (1 if cl.has_spare else 0)
        for name, value in (
            ("trimq_storage_size_bytes", files * cl.segment_size),
            ("trimq_commitlog_max_offset_bytes", cl.max_offset),
            ("trimq_storage_flush_behind_bytes", max(0, cl.max_offset - cl.flushed_offset)),
            ("trimq_storage_writable", 1 if store.writable else 0),
        ):
            g = _gauge(name, _doc(name))
            g.add_metric([], value)
            yield g
        yield from _reclaim_metrics(store)
        topics = self.topics
        if topics is not None:
            g = _gauge("trimq_topic_number", _doc("trimq_topic_number"))
            g.add_metric([], len(topics.all()))
            yield g

    def _lag_targets(self) -> dict[str, set[str]]:
        """consumer group -> topics whose lag is reported: every stored offset, plus the subscriptions of
        the live clustering members (a group that never committed shows its whole backlog)."""
        offsets, consumers = self.offsets, self.consumers
        targets: dict[str, set[str]] = {}
        if offsets is not None:
            for key in offsets.encode()["offsetTable"]:
                topic, _, group = key.partition("@")
                if topic and group:
                    targets.setdefault(group, set()).add(topic)
        if consumers is not None:
            for group in consumers.consumer_groups():
                info = consumers.group_info(group)
                if info is None or not any(m.message_model == "CLUSTERING" for m in info.members.values()):
                    continue  # broadcasting consumers keep their offsets locally
                targets.setdefault(group, set()).update(consumers.subscribed_topics(group))
        return targets

    def _consumers(self) -> Iterator[Metric]:
        offsets, consumers, store, topics = self.offsets, self.consumers, self.store, self.topics
        targets = self._lag_targets()
        groups = _gauge("trimq_consumer_group_number", _doc("trimq_consumer_group_number"))
        groups.add_metric([], len(targets))
        yield groups
        if offsets is not None and store is not None:
            labels = ["consumer_group", "topic", "queue_id"]
            lag = _gauge("trimq_consumer_lag_messages", _doc("trimq_consumer_lag_messages"), labels)
            lag_s = _gauge("trimq_consumer_lag_latency_seconds", _doc("trimq_consumer_lag_latency_seconds"), labels)
            now = self._now_ms()
            for group in sorted(targets):
                for topic in sorted(targets[group]):
                    cfg = topics.get(topic) if topics is not None else None
                    qids = range(cfg.read_queue_nums) if cfg is not None else ()
                    for row in offsets.progress(group, topic, qids, store):
                        if row.lag < 0:
                            continue
                        labels_v = [group, topic, str(row.queue_id)]
                        lag.add_metric(labels_v, row.lag)
                        age = 0.0
                        if row.lag > 0:
                            ts = store.get_store_timestamp(topic, row.queue_id, max(row.consumer_offset, 0))
                            if ts:
                                age = max(0, now - ts) / 1000
                        lag_s.add_metric(labels_v, age)
            yield lag
            yield lag_s
        if consumers is not None:
            conns = _gauge("trimq_consumer_connections", _doc("trimq_consumer_connections"), ["consumer_group"])
            for group in consumers.consumer_groups():
                info = consumers.group_info(group)
                conns.add_metric([group], len(info.members) if info is not None else 0)
            yield conns
            prods = _gauge("trimq_producer_connections", _doc("trimq_producer_connections"), ["producer_group"])
            for group in consumers.producer_groups():
                pinfo = consumers.producer_info(group)
                prods.add_metric([group], len(pinfo.members) if pinfo is not None else 0)
            yield prods
            events = _counter("trimq_consumer_membership_events", _doc("trimq_consumer_membership_events_total"),
                              ["event"])
            for event, n in sorted(consumers.stats.items()):
                events.add_metric([event], n)
            yield events
        coordination = self.coordination
        if coordination is not None:
            c = _counter("trimq_consumer_ids_changed_notifications",
                         _doc("trimq_consumer_ids_changed_notifications_total"))
            c.add_metric([], coordination.stats.get("notifications_sent", 0))
            yield c

    def _locks_offsets(self) -> Iterator[Metric]:
        locks = self.locks
        if locks is not None:
            held = _gauge("trimq_locks_held", _doc("trimq_locks_held"), ["consumer_group"])
            for group in locks.groups():
                held.add_metric([group], locks.live_lock_count(group))
            yield held
            ops = _counter("trimq_lock_operations", _doc("trimq_lock_operations_total"), ["outcome"])
            for outcome, n in sorted(locks.stats.as_dict().items()):
                ops.add_metric([outcome], n)
            yield ops
        offsets = self.offsets
        if offsets is not None:
            fenced = _counter("trimq_offset_fenced_updates", _doc("trimq_offset_fenced_updates_total"),
                              ["consumer_group"])
            for group, n in sorted(offsets.fenced_updates.items()):
                fenced.add_metric([group], n)
            yield fenced
            stale = _counter("trimq_offset_stale_generation_updates",
                             _doc("trimq_offset_stale_generation_updates_total"), ["consumer_group"])
            for group, n in sorted(offsets.stale_generation_updates.items()):
                stale.add_metric([group], n)
            yield stale
            applied = _counter("trimq_offset_updates", _doc("trimq_offset_updates_total"))
            applied.add_metric([], offsets.applied_updates)
            yield applied

    def _retries(self) -> Iterator[Metric]:
        store = self.store
        if store is not None:
            # Queue max offsets only grow, so the messages ever stored in a group's %RETRY% / %DLQ% topic are a
            # counter for free (it also survives restarts), and it counts both ways in: send-back and the
            # client's own send to the retry topic.
            retry = _counter("trimq_retry_messages", _doc("trimq_retry_messages_total"), ["consumer_group"])
            dlq = _counter("trimq_send_to_dlq_messages", _doc("trimq_send_to_dlq_messages_total"),
                           ["consumer_group"])
            for topic in sorted(store.topics()):
                for prefix, family in ((RETRY_GROUP_TOPIC_PREFIX, retry), (DLQ_GROUP_TOPIC_PREFIX, dlq)):
                    if topic.startswith(prefix):
                        total = sum(store.get_max_offset_in_queue(topic, q) for q in store.queue_ids(topic))
                        family.add_metric([topic[len(prefix):]], total)
            yield retry
            yield dlq
        retry_service = self.retry
        if retry_service is not None:
            back = _counter("trimq_send_back", _doc("trimq_send_back_total"), ["result"])
            back.add_metric(["retry"], retry_service.sent_back)
            back.add_metric(["dlq"], retry_service.dead_letters)
            yield back
        schedule = self.schedule
        if schedule is not None:
            sched = _counter("trimq_schedule_messages", _doc("trimq_schedule_messages_total"), ["outcome"])
            sched.add_metric(["delivered"], schedule.delivered)
            sched.add_metric(["duplicate_skipped"], schedule.skipped_duplicates)
            sched.add_metric(["dropped"], schedule.dropped)
            yield sched
            if store is not None:
                backlog = _gauge("trimq_schedule_backlog_messages", _doc("trimq_schedule_backlog_messages"),
                                 ["delay_level"])
                for qid in store.queue_ids(SCHEDULE_TOPIC):
                    level = qid + 1
                    pending = store.get_max_offset_in_queue(SCHEDULE_TOPIC, qid) - schedule.offsets.get(level, 0)
                    backlog.add_metric([str(level)], max(0, pending))
                yield backlog

    def _server(self) -> Iterator[Metric]:
        server = self.server
        for name, value, kind in (
            ("trimq_connections", len(server.connections), _gauge),
            ("trimq_connections_refused_total", server.refused_connections, _counter),
            ("trimq_protocol_errors_total", server.protocol_errors, _counter),
            ("trimq_pending_write_bytes", server.pending_write_bytes, _gauge),
            ("trimq_answer_encode_errors_total", server.encode_errors, _counter),
            ("trimq_handler_errors_total", server.handler_errors, _counter),
        ):
            m = kind(name, _doc(name))
            m.add_metric([], value)
            yield m
        closed = _counter("trimq_connections_closed", _doc("trimq_connections_closed_total"), ["reason"])
        closed.add_metric(["idle"], server.idle_closed)
        closed.add_metric(["write_stalled"], server.stalled_closed)
        yield closed
        ranges = _counter("trimq_field_range_errors", _doc("trimq_field_range_errors_total"), ["oneway"])
        for oneway, n in sorted(server.field_range_errors.items()):
            ranges.add_metric([str(oneway).lower()], n)
        yield ranges
        lp = self.long_polling
        if lp is not None:
            for name, value in (("trimq_long_polling_requests_held", lp.held),
                                ("trimq_long_polling_queues", lp.waiting_queues)):
                g = _gauge(name, _doc(name))
                g.add_metric([], value)
                yield g


class BrokerMetrics:
    """The broker's registry: RPC latency, store append/fsync latency, the scrape-time collector, the
    process collector, and the embedded name server's metrics when it has one.

    ``Broker.__init__`` creates it when ``metrics_port`` is set (installing the hooks before anything is
    served); ``Broker.run`` starts :meth:`serve` in its background nursery. ``extra``: more collectors for
    the same registry (the embedded name server's).
    """

    def __init__(self, *, config: BrokerConfig, server: RemotingServer, store: MessageStore,
                 collector: BrokerCollector, extra: tuple[Collector, ...] = (),
                 registry: CollectorRegistry | None = None) -> None:
        self.broker_name = config.broker_name
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=False)
        self.host = config.metrics_host
        self.port = config.metrics_port
        self.address: tuple[str, int] | None = None
        self.rpc = RpcMetrics(self.registry, server)
        self.server = server
        self.append_latency = Histogram("trimq_storage_append_latency_seconds", _doc(
            "trimq_storage_append_latency_seconds"), registry=self.registry, buckets=STORE_BUCKETS)
        self.fsync_latency = Histogram("trimq_storage_fsync_latency_seconds", _doc(
            "trimq_storage_fsync_latency_seconds"), ["mode"], registry=self.registry, buckets=STORE_BUCKETS)
        fsync_children = {mode: self.fsync_latency.labels(mode) for mode in ("interval", "group_commit")}
        store.on_append = self.append_latency.observe
        store.on_fsync = lambda mode, seconds: fsync_children[mode].observe(seconds)
        self.collector = collector
        self.registry.register(self.collector)
        ProcessCollector(registry=self.registry)
        for more in extra:
            self.registry.register(more)

    async def serve(self, *, task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve ``/metrics`` and ``/healthz`` (200 while the server serves) until cancelled;
        ``task_status.started((host, port))``."""
        async with trio.open_nursery() as nursery:
            serve = functools.partial(serve_metrics, self.registry, self.host, self.port,
                                      healthy=lambda: self.server.serving)
            self.address = await nursery.start(serve)
            log.info("metrics.started", daemon="broker", broker=self.broker_name,
                     address=f"{self.address[0]}:{self.address[1]}")
            task_status.started(self.address)
