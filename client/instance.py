"""ClientInstance: the per-process client (RocketMQ's MQClientInstance).

One instance serves every producer and consumer of a process that talks to the same name servers:
it owns the connections (:class:`runtime.client.RemotingClient`), the topic routes and broker
addresses, and the timers, all as tasks in one nursery::

    async with ClientInstance(ClientConfig(namesrv_addr="127.0.0.1:9876")) as client:
        async with Producer(ProducerConfig(...), instance=client) as producer: ...

* routes of every produced or subscribed topic are refreshed every ``poll_name_server_interval``
  (30 s) and on demand (a send to an unknown topic, a broker missing from the table); **at once** when a
  connection to a broker closes or a request to it cannot reach it, and again a few times over the next
  seconds (:data:`ROUTE_REFRESH_BURST_S`) while the route still lists that address — the name server drops a
  dead broker when its connection closes, so a dead master leaves the routes within about a second instead of
  the 30 s poll (issue 15, docs/PROTOCOL.md "Fast detection");
* addresses a request could not reach are avoided for :data:`UNREACHABLE_MS` by the pull path and the offset
  store (they read from and commit to the slave of a broker whose master is away) and the moment a route lists
  a broker's master again, listeners (the producer's latency fault tolerance) are told;
* a heartbeat goes to every known broker every ``heartbeat_broker_interval`` (30 s), at once on start
  and whenever a producer or consumer registers or a rebalance changes something;
* consumers rebalance every ``rebalance_interval`` (20 s) and **immediately** when a broker pushes
  NOTIFY_CONSUMER_IDS_CHANGED (a member joined or left); requests arriving during a rebalance are
  coalesced into one more pass;
* orderly consumers' queue locks are **leases** (issue 14): a renewal task of their own, independent of
  consumption, sends one LOCK_BATCH_MQ per broker (and orderly group) every third of the lease the broker
  grants (2 s by default), covering every queue held there — the request also keeps the consumer a member of
  its group on that broker, so it goes to brokers where nothing is held too; when a connection to a broker
  drops, the consumers stop that broker's queues at once and the renewal task re-locks them;
* consumer offsets are persisted every ``persist_consumer_offset_interval`` (5 s).

Leaving the ``async with`` block cancels every task; producers and consumers unregister themselves
when *their* blocks end, which must be inside this one.

The client id is ``ip@pid``, plus ``@instance_name`` when configured. Two live instances of one process
may not share an id: a second instance without an instance name gets ``ip@pid@2`` (``@3``...), so
separate instances in one process are separate group members. Sharing one instance is cheaper.
"""

from __future__ import annotations

import os
import random
import socket
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Protocol, Self, runtime_checkable

import trio

from trimq.client.api import ConsumerData, HeartbeatData, MQClientAPI
from trimq.client.config import ClientConfig
from trimq.client.errors import (
    ClientClosedError,
    ClientIdConflictError,
    MQBrokerError,
    MQClientError,
    NoNameServerError,
    TopicNotExistError,
)
from trimq.client.subscription import SubscriptionData
from trimq.protocol.codes import RequestCode
from trimq.protocol.command import RemotingCommand
from trimq.protocol.message_queue import MessageQueue
from trimq.protocol.route import PERM_READ, PERM_WRITE, QueueData, TopicRouteData
from trimq.protocol.validation import is_retry_topic
from trimq.runtime.client import RemotingClient, RemotingConnectError, RemotingError
from trimq.runtime.logs import RateLimiter, get_logger, log_rate_limited

__all__ = [
    "DEFAULT_LEASE_MS",
    "MASTERLESS_POLL_S",
    "ROUTE_REFRESH_BURST_S",
    "UNREACHABLE_MS",
    "ClientInstance",
    "ConsumerInner",
    "LeaseHolder",
    "ProducerInner",
    "TopicPublishInfo",
    "build_client_id",
    "local_ip",
]

log = get_logger("trimq.client")

MASTER_ID = 0
_LIVE_CLIENT_IDS: set[str] = set()
#: The lease assumed until a broker says (its LOCK_BATCH_MQ answers carry ``leaseMs``): trimq's default.
DEFAULT_LEASE_MS = 2000
#: After a broker connection closed or failed, routes are refreshed at once and then after these delays (s) while
#: they still list the address (the name server may not have dropped it yet when the first refresh arrives).
ROUTE_REFRESH_BURST_S = (0.1, 0.2, 0.4, 0.8, 1.5, 3.0)
#: How long (ms) an address a request could not reach is avoided for reads and offset commits (the route
#: listing it again, or a later success, ends it sooner).
UNREACHABLE_MS = 3_000
#: While a route lists a broker without its master, routes are refreshed this often (s) instead of every
#: ``poll_name_server_interval``: reads and offsets go back to the master soon after it returns.
MASTERLESS_POLL_S = 2.0


def local_ip() -> str:
    """This host's primary IPv4 address (the one a default route would use), else 127.0.0.1.

    The UDP ``connect`` sends nothing; it only asks the kernel which source address it would use.
    """
    for probe in ("10.255.255.255", "192.0.2.1"):
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((probe, 1))
                ip = str(s.getsockname()[0])
                if ip and not ip.startswith("0."):
                    return ip
        except OSError:
            continue
    return "127.0.0.1"


def build_client_id(client_ip: str, instance_name: str = "", pid: int | None = None) -> str:
    """``ip@pid`` or ``ip@pid@instance_name``."""
    base = f"{client_ip}@{os.getpid() if pid is None else pid}"
    return f"{base}@{instance_name}" if instance_name else base


@dataclass
class TopicPublishInfo:
    """A topic's writable queues and RocketMQ's round-robin queue choice for sends."""

    message_queue_list: list[MessageQueue]
    route: TopicRouteData | None = None
    send_which_queue: int = field(default_factory=lambda: random.randrange(2**31))
    topic: str = ""

    def ok(self) -> bool:
        return bool(self.message_queue_list)

    def selectable_queues(self) -> list[MessageQueue]:
        """What a selector (an ordered send) chooses from: the writable queues of every broker of the route,
        including a broker whose master is down while its slave is up. RocketMQ leaves those out, which silently
        moves the keys of such a queue to other queues and breaks their order; here a send to one fails fast
        (client/producer.py) and the keys of the other queues keep their queues."""
        route = self.route
        if route is None or not self.topic:
            return self.message_queue_list
        brokers = {bd.broker_name for bd in route.broker_datas}
        out: list[MessageQueue] = []
        for qd in sorted(route.queue_datas, key=lambda q: q.broker_name):
            if qd.writeable and qd.broker_name in brokers:
                out.extend(MessageQueue(self.topic, qd.broker_name, i) for i in range(qd.write_queue_nums))
        return out or self.message_queue_list

    def _next(self) -> MessageQueue:
        self.send_which_queue = (self.send_which_queue + 1) & 0x7FFFFFFF
        return self.message_queue_list[self.send_which_queue % len(self.message_queue_list)]

    def select_one_message_queue(self, last_broker_name: str | None = None) -> MessageQueue:
        """Next queue round robin; after a failure, the next one on a *different* broker if there is one."""
        if not self.message_queue_list:
            raise MQClientError("the topic has no writable queue")
        if last_broker_name is None:
            return self._next()
        for _ in range(len(self.message_queue_list)):
            mq = self._next()
            if mq.broker_name != last_broker_name:
                return mq
        return self._next()


@runtime_checkable
class ProducerInner(Protocol):
    """What the instance needs from a registered producer."""

    @property
    def group_name(self) -> str: ...


@runtime_checkable
class ConsumerInner(Protocol):
    """What the instance needs from a registered consumer (RocketMQ's MQConsumerInner)."""

    @property
    def group_name(self) -> str: ...

    @property
    def message_model(self) -> str: ...

    @property
    def consume_type(self) -> str: ...

    @property
    def consume_from_where(self) -> str: ...

    @property
    def consume_orderly(self) -> bool: ...

    def subscriptions(self) -> list[SubscriptionData]: ...

    def update_topic_subscribe_info(self, topic: str, mqs: set[MessageQueue]) -> None: ...

    def is_subscribe_topic_need_update(self, topic: str) -> bool: ...

    async def do_rebalance(self) -> None: ...

    async def persist_consumer_offset(self) -> None: ...


@runtime_checkable
class LeaseHolder(Protocol):
    """A consumer whose queue locks the instance's renewal task renews (client.consumer_core.ConsumerCore)."""

    @property
    def group_name(self) -> str: ...

    @property
    def lease_renewal(self) -> bool: ...

    async def renew_leases(self, addr: str, broker_names: list[str]) -> Any: ...

    def broker_connection_lost(self, broker_names: list[str]) -> None: ...


class ClientInstance:
    """Routes, broker addresses, heartbeats, rebalance and offset timers for one process (see module doc)."""

    def __init__(
        self,
        config: ClientConfig | None = None,
        *,
        remoting: RemotingClient | None = None,
        ssl_context: Any = None,
        credentials: tuple[str, str] | None = None,
    ) -> None:
        """``remoting``: share an existing transport (not closed by this instance); otherwise one is created
        with ``ssl_context`` (TLS) and ``credentials`` (ACL access key and secret key)."""
        self.config = (config or ClientConfig()).client_settings()
        self._own_remoting = remoting is None
        if ssl_context is None and self.config.tls_enable:
            from trimq.runtime.tls import client_ssl_context

            ssl_context = client_ssl_context(self.config.tls_ca_file or None, self.config.tls_cert_file or None,
                                             self.config.tls_key_file or None)
        self.remoting = remoting or RemotingClient(
            default_timeout_s=self.config.mq_client_api_timeout / 1000,
            connect_timeout_s=self.config.connect_timeout / 1000,
            ssl_context=ssl_context,
            credentials=credentials or self.config.credentials,
        )
        self.api = MQClientAPI(self.remoting, timeout_ms=self.config.mq_client_api_timeout)
        self.client_ip = self.config.client_ip or local_ip()
        self._client_id = ""
        self.topic_route_table: dict[str, TopicRouteData] = {}
        self.broker_addr_table: dict[str, dict[int, str]] = {}
        self.topic_publish_info_table: dict[str, TopicPublishInfo] = {}
        self.route_fetch_errors: dict[str, str] = {}
        """Topic -> why its last route fetch got no answer from any name server (gone once one answers)."""
        self.producers: dict[str, ProducerInner] = {}
        self.consumers: dict[str, ConsumerInner] = {}
        self._namesrv_index = random.randrange(1 << 16)
        self._route_lock = trio.Lock()
        self._heartbeat_lock = trio.Lock()
        self._rebalance_wakeup = trio.Event()
        self._heartbeat_wakeup = trio.Event()
        self._lease_wakeup = trio.Event()
        self._lease_ms_by_addr: dict[str, int] = {}
        self._rejoined_at: dict[str, float] = {}
        # Fast detection (issue 15): route refreshes on demand, addresses a request could not reach.
        self._route_wakeup = trio.Event()
        self._route_suspects: dict[str, int] = {}  # address -> refreshes of the burst done
        self._unreachable: dict[str, float] = {}  # address -> trio time until which it is avoided
        self.route_refreshes = 0
        """Route refreshes asked for by a closed or failed broker connection."""
        self.master_listeners: list[Callable[[str], None]] = []
        """Called with a broker name whose master address (re-)appears in a route (or changes)."""
        self.lease_renewals = 0
        """LOCK_BATCH_MQ renewals sent by the renewal task."""
        self._stack: AsyncExitStack | None = None
        self._nursery: trio.Nursery | None = None
        self._running = False
        self._rate = RateLimiter(10_000)
        self.rebalance_count = 0
        self.heartbeat_count = 0
        self.consumer_ids_changed_count = 0
        """NOTIFY_CONSUMER_IDS_CHANGED requests received from brokers."""

    # --- lifecycle -------------------------------------------------------------------------------

    @property
    def client_id(self) -> str:
        """``ip@pid[@instance_name]`` (set when the instance starts)."""
        return self._client_id or build_client_id(self.client_ip, self.config.instance_name)

    @property
    def running(self) -> bool:
        """Between entering and leaving ``async with``."""
        return self._running

    def _claim_client_id(self) -> str:
        wanted = build_client_id(self.client_ip, self.config.instance_name)
        if wanted not in _LIVE_CLIENT_IDS:
            return wanted
        if self.config.instance_name:
            raise ClientIdConflictError(
                f"client id {wanted!r} is already used by another running ClientInstance in this process; "
                f"share that instance or choose another instance_name"
            )
        n = 2
        while build_client_id(self.client_ip, str(n)) in _LIVE_CLIENT_IDS:
            n += 1
        return build_client_id(self.client_ip, str(n))

    async def __aenter__(self) -> Self:
        if self._running:
            raise MQClientError("this ClientInstance is already running")
        self._client_id = self._claim_client_id()
        _LIVE_CLIENT_IDS.add(self._client_id)
        stack = AsyncExitStack()
        try:
            if self._own_remoting:
                await stack.enter_async_context(self.remoting)
            self._nursery = await stack.enter_async_context(trio.open_nursery())
        except BaseException:
            _LIVE_CLIENT_IDS.discard(self._client_id)
            await stack.aclose()
            raise
        self._stack = stack
        self.remoting.register_handler(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, self._on_consumer_ids_changed)
        add_close_listener = getattr(self.remoting, "add_close_listener", None)
        if add_close_listener is not None:
            add_close_listener(self._on_connection_closed)
        add_open_listener = getattr(self.remoting, "add_open_listener", None)
        if add_open_listener is not None:
            add_open_listener(self._on_connection_opened)
        self._running = True
        self._nursery.start_soon(self._route_loop)
        self._nursery.start_soon(self._heartbeat_loop)
        self._nursery.start_soon(self._rebalance_loop)
        self._nursery.start_soon(self._persist_loop)
        self._nursery.start_soon(self._lease_loop)
        log.info("client.started", client_id=self._client_id, namesrv=self.config.namesrv_addr)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        self._running = False
        assert self._stack is not None and self._nursery is not None
        self._nursery.cancel_scope.cancel()
        try:
            return await self._stack.__aexit__(exc_type, exc, tb)
        finally:
            _LIVE_CLIENT_IDS.discard(self._client_id)
            self._stack = None
            self._nursery = None
            log.info("client.stopped", client_id=self._client_id)

    def _check_running(self) -> None:
        if not self._running:
            raise ClientClosedError("the ClientInstance is not running (use it inside `async with`)")

    # --- registration ----------------------------------------------------------------------------

    async def register_producer(self, producer: ProducerInner) -> None:
        """Add a producer group; a heartbeat announces it to the brokers at once."""
        self._check_running()
        group = producer.group_name
        if group in self.producers and self.producers[group] is not producer:
            raise MQClientError(f"producer group {group!r} is already registered on client {self.client_id}")
        self.producers[group] = producer
        await self.send_heartbeat_to_all_brokers()

    async def unregister_producer(self, group: str) -> None:
        """Remove a producer group and tell every broker (UNREGISTER_CLIENT)."""
        if self.producers.pop(group, None) is not None and self._running:
            await self._unregister_client(producer_group=group)

    async def register_consumer(self, consumer: ConsumerInner) -> None:
        """Add a consumer: fetch its topics' routes, heartbeat every broker, rebalance at once."""
        self._check_running()
        group = consumer.group_name
        if group in self.consumers and self.consumers[group] is not consumer:
            raise MQClientError(
                f"consumer group {group!r} is already registered on client {self.client_id}; "
                f"one client instance can hold one consumer per group"
            )
        self.consumers[group] = consumer
        for sub in consumer.subscriptions():
            await self.update_topic_route_info_from_name_server(sub.topic)
        await self.send_heartbeat_to_all_brokers()
        self.rebalance_immediately()
        self._lease_wakeup.set()  # an orderly consumer's membership is kept alive by lease renewals from now on

    async def unregister_consumer(self, group: str) -> None:
        """Remove a consumer group and tell every broker (UNREGISTER_CLIENT), so the others rebalance."""
        if self.consumers.pop(group, None) is not None and self._running:
            await self._unregister_client(consumer_group=group)

    async def _unregister_client(self, *, producer_group: str | None = None, consumer_group: str | None = None) -> None:
        async def one(addr: str) -> None:
            try:
                await self.api.unregister_client(
                    addr, self.client_id, producer_group=producer_group, consumer_group=consumer_group
                )
                log.info("client.unregistered", addr=addr, producer_group=producer_group,
                         consumer_group=consumer_group)
            except (RemotingError, MQBrokerError, MQClientError) as exc:
                log.warning("client.unregister_failed", addr=addr, error=str(exc))

        async with trio.open_nursery() as nursery:
            for addr in self._all_broker_addrs(masters_only=False):
                nursery.start_soon(one, addr)

    # --- routes -------------------------------------------------------------------------------------

    async def _fetch_route(self, topic: str) -> TopicRouteData:
        addrs = self.config.namesrv_addrs
        if not addrs:
            raise NoNameServerError("no name server address configured (namesrv_addr)")
        last: Exception | None = None
        for i in range(len(addrs)):
            addr = addrs[(self._namesrv_index + i) % len(addrs)]
            try:
                route = await self.api.get_topic_route(addr, topic)
                self._namesrv_index = (self._namesrv_index + i) % len(addrs)  # stick with one that works
                return route
            except TopicNotExistError:
                raise
            except (RemotingError, MQBrokerError, MQClientError) as exc:
                last = exc
        assert last is not None
        raise last

    async def update_topic_route_info_from_name_server(
        self, topic: str, *, default_topic: str | None = None, default_queue_nums: int = 4
    ) -> bool:
        """Fetch ``topic``'s route and update brokers, publish info and consumers' queue sets.

        With ``default_topic`` (a producer's ``create_topic_key``), the route of that topic is used for
        ``topic`` with at most ``default_queue_nums`` queues per broker: a send then auto-creates the
        topic on the broker. Returns whether a route was found; failures are logged, not raised.
        """
        async with self._route_lock:
            try:
                if default_topic:
                    src = await self._fetch_route(default_topic)
                    route = _limit_queues(src, default_queue_nums)
                else:
                    route = await self._fetch_route(topic)
            except TopicNotExistError:
                self.route_fetch_errors.pop(topic, None)
                if not is_retry_topic(topic):
                    log_rate_limited(self._rate, ("no_route", topic), _now_ms(), log.warning,
                                     "route.topic_not_exist", topic=topic)
                return False
            except (RemotingError, MQBrokerError, MQClientError) as exc:
                self.route_fetch_errors[topic] = str(exc)
                log_rate_limited(self._rate, ("route_failed", topic), _now_ms(), log.warning,
                                 "route.update_failed", topic=topic, error=str(exc))
                return False
            self.route_fetch_errors.pop(topic, None)
            self._apply_route(topic, route, from_default=bool(default_topic))
            return True

    def _apply_route(self, topic: str, route: TopicRouteData, *, from_default: bool = False) -> None:
        old = self.topic_route_table.get(topic)
        for bd in route.broker_datas:
            before = self.broker_addr_table.get(bd.broker_name, {})
            self.broker_addr_table[bd.broker_name] = dict(bd.broker_addrs)
            master = bd.broker_addrs.get(MASTER_ID)
            if master is not None and before.get(MASTER_ID) != master:
                self._unreachable.pop(master, None)  # registered again: a restarted or promoted master
                if before:  # (not a broker seen for the first time)
                    log.info("route.master_back", broker=bd.broker_name, master=master)
                for listener in list(self.master_listeners):
                    listener(bd.broker_name)
        changed = old != route
        if changed or topic not in self.topic_publish_info_table:
            pub = route.publish_queues(topic)
            if pub or topic in self.topic_publish_info_table:
                self.topic_publish_info_table[topic] = TopicPublishInfo(pub, route, topic=topic)
        if changed or any(c.is_subscribe_topic_need_update(topic) for c in self.consumers.values()):
            sub = route.subscribe_queues(topic)
            for c in list(self.consumers.values()):
                if any(s.topic == topic for s in c.subscriptions()):
                    c.update_topic_subscribe_info(topic, sub)
        if not from_default:
            self.topic_route_table[topic] = route
        if changed:
            log.info("route.changed", topic=topic, brokers=[b.broker_name for b in route.broker_datas],
                     queues={q.broker_name: (q.read_queue_nums, q.write_queue_nums) for q in route.queue_datas})

    def _topics_in_use(self) -> set[str]:
        topics = set(self.topic_publish_info_table)
        for c in list(self.consumers.values()):
            topics.update(s.topic for s in c.subscriptions())
        return topics

    async def update_all_topic_routes(self) -> None:
        """Refresh the route of every produced or subscribed topic, then forget brokers no route lists."""
        for topic in sorted(self._topics_in_use()):
            await self.update_topic_route_info_from_name_server(topic)
        self._clean_offline_brokers()

    # --- fast detection (issue 15) -------------------------------------------------------------------------

    def _known_broker_addr(self, addr: str) -> bool:
        return any(addr in addrs.values() for addrs in self.broker_addr_table.values())

    def request_route_refresh(self, addr: str | None = None) -> None:
        """Refresh every route now (coalesced). With ``addr`` (a broker whose connection closed or failed): keep
        refreshing a few times (:data:`ROUTE_REFRESH_BURST_S`) while the routes still list it."""
        if addr is not None:
            self._route_suspects.setdefault(addr, 0)
        self._route_wakeup.set()

    def broker_unreachable(self, addr: str) -> None:
        """A request could not reach ``addr`` (connect refused, connection broken): avoid it for reads and offset
        commits for :data:`UNREACHABLE_MS` and refresh the routes now."""
        if self._running:
            self._unreachable[addr] = trio.current_time() + UNREACHABLE_MS / 1000
        self.request_route_refresh(addr)
        log_rate_limited(self._rate, ("unreachable", addr), _now_ms(), log.warning, "route.broker_unreachable",
                         addr=addr, brokers=[n for n, a in self.broker_addr_table.items() if addr in a.values()])

    def is_reachable(self, addr: str) -> bool:
        """False while ``addr`` is avoided after a request could not reach it."""
        until = self._unreachable.get(addr)
        if until is None:
            return True
        if trio.current_time() >= until:
            del self._unreachable[addr]
            return True
        return False

    def note_failure(self, addr: str, exc: BaseException) -> None:
        """Called by the pull path, the offset store and the producer with a failed request's error: a broker that
        could not be reached is :meth:`broker_unreachable`."""
        if isinstance(exc, RemotingConnectError):
            self.broker_unreachable(addr)

    def find_broker_addr_in_subscribe(self, broker_name: str, broker_id: int = MASTER_ID) -> tuple[str, int] | None:
        """Where to read ``broker_name`` from (RocketMQ's findBrokerAddressInSubscribe, not only this broker):
        ``broker_id`` (the broker's suggestion) if listed and reachable, else the master, else a slave; an
        unreachable address only when nothing else is listed. ``(address, broker id)`` or None."""
        addrs = self.broker_addr_table.get(broker_name)
        if not addrs:
            return None
        order = [broker_id, MASTER_ID, *sorted(b for b in addrs if b not in (broker_id, MASTER_ID))]
        listed = [(addrs[b], b) for b in order if b in addrs]
        for addr, bid in listed:
            if self.is_reachable(addr):
                return addr, bid
        return listed[0]

    async def find_broker_addr_for_read(self, broker_name: str, broker_id: int = MASTER_ID,
                                        topic: str | None = None) -> tuple[str, int] | None:
        """:meth:`find_broker_addr_in_subscribe`, refreshing ``topic``'s route once when the broker is unknown."""
        found = self.find_broker_addr_in_subscribe(broker_name, broker_id)
        if found is None and topic is not None:
            await self.update_topic_route_info_from_name_server(topic)
            found = self.find_broker_addr_in_subscribe(broker_name, broker_id)
        return found

    async def find_broker_addr_for_offsets(self, broker_name: str, topic: str | None = None) -> str | None:
        """Where offsets of ``broker_name`` go: its master when listed and reachable, else (RocketMQ's
        RemoteBrokerOffsetStore: any broker of that name) its slave, which keeps them for the master (merged by
        commit version when the master is back)."""
        master = self.find_broker_address_in_publish(broker_name)
        if master is not None and self.is_reachable(master):
            return master
        found = await self.find_broker_addr_for_read(broker_name, MASTER_ID, topic)
        return found[0] if found is not None else master

    def master_down(self, broker_name: str) -> bool:
        """True when the routes list ``broker_name`` without a master, or its master is unreachable: its orderly
        queues cannot be locked (locks live on the master) and pause until it is back."""
        addrs = self.broker_addr_table.get(broker_name)
        if not addrs:
            return False
        master = addrs.get(MASTER_ID)
        return master is None or not self.is_reachable(master)

    def _clean_offline_brokers(self) -> None:
        live = {bd.broker_name for r in self.topic_route_table.values() for bd in r.broker_datas}
        for name in list(self.broker_addr_table):
            if name not in live:
                del self.broker_addr_table[name]
                log.info("route.broker_offline", broker=name)

    async def get_publish_info(
        self, topic: str, *, create_topic_key: str = "", default_queue_nums: int = 4
    ) -> TopicPublishInfo | None:
        """The publish info of ``topic``, fetching the route if needed (RocketMQ's tryToFindTopicPublishInfo).

        When the name server does not know the topic and ``create_topic_key`` is set, the default topic's
        route is used so that the first send auto-creates the topic.
        """
        info = self.topic_publish_info_table.get(topic)
        if info is None or not info.ok():
            await self.update_topic_route_info_from_name_server(topic)
            info = self.topic_publish_info_table.get(topic)
        if info is not None and info.ok():
            return info
        if create_topic_key:
            await self.update_topic_route_info_from_name_server(
                topic, default_topic=create_topic_key, default_queue_nums=default_queue_nums
            )
            info = self.topic_publish_info_table.get(topic)
            if info is None or not info.ok():
                # No default-topic route registered: address every master of the cluster instead; the
                # broker that receives the first send creates the topic (if it auto-creates topics).
                await self._route_from_cluster(topic, default_queue_nums)
                info = self.topic_publish_info_table.get(topic)
        return info if info is not None and info.ok() else None

    async def _route_from_cluster(self, topic: str, queue_nums: int) -> None:
        for addr in self.config.namesrv_addrs:
            try:
                cluster = await self.api.get_broker_cluster_info(addr)
            except (RemotingError, MQBrokerError, MQClientError) as exc:
                log.info("route.cluster_info_failed", namesrv=addr, error=str(exc))
                continue
            masters = tuple(bd for _, bd in sorted(cluster.broker_addr_table.items()) if bd.master_addr)
            if not masters:
                return
            qds = tuple(QueueData(bd.broker_name, queue_nums, queue_nums, PERM_READ | PERM_WRITE) for bd in masters)
            self._apply_route(topic, TopicRouteData(masters, qds), from_default=True)
            return

    def find_broker_address_in_publish(self, broker_name: str) -> str | None:
        """The master address of ``broker_name`` from the table (no lookup)."""
        return self.broker_addr_table.get(broker_name, {}).get(MASTER_ID)

    async def find_broker_addr(self, broker_name: str, topic: str | None = None) -> str | None:
        """The master address of ``broker_name``; refreshes ``topic``'s route once when it is unknown."""
        addr = self.find_broker_address_in_publish(broker_name)
        if addr is None and topic is not None:
            await self.update_topic_route_info_from_name_server(topic)
            addr = self.find_broker_address_in_publish(broker_name)
        return addr

    def _all_broker_addrs(self, *, masters_only: bool) -> list[str]:
        out = []
        for addrs in self.broker_addr_table.values():
            for bid, addr in addrs.items():
                if not masters_only or bid == MASTER_ID:
                    out.append(addr)
        return sorted(set(out))

    # --- queries used by consumers ------------------------------------------------------------------

    async def find_consumer_id_list(self, topic: str, group: str) -> list[str] | None:
        """The group's live client ids, from a broker of ``topic``; None (logged) when unavailable.

        Every broker knows every member, so RocketMQ asks one at random. Here an address that cannot be reached
        (a master just lost, a route not yet refreshed) is noted and the next one asked, reachable ones first:
        a rebalance that found no member list would wait for the next periodic one (20 s)."""
        route = self.topic_route_table.get(topic)
        if route is None:
            await self.update_topic_route_info_from_name_server(topic)
            route = self.topic_route_table.get(topic)
        if route is None or not route.broker_datas:
            return None
        addrs: list[str] = []
        for bd in random.sample(route.broker_datas, len(route.broker_datas)):
            first = bd.select_broker_addr()
            addrs += [a for a in (first, *sorted(bd.broker_addrs.values())) if a and a not in addrs]
        addrs.sort(key=lambda a: not self.is_reachable(a))  # stable: the route's order among equals
        error: Exception | None = None
        for addr in addrs:
            try:
                return await self.api.get_consumer_id_list_by_group(addr, group)
            except RemotingConnectError as exc:
                self.note_failure(addr, exc)
                error = exc
                continue
            except (RemotingError, MQBrokerError, MQClientError) as exc:
                error = exc
            break
        log_rate_limited(self._rate, ("cid", group), _now_ms(), log.warning, "rebalance.consumer_list_failed",
                         group=group, topic=topic, addr=addr, error=str(error))
        return None

    async def _addr_or_raise(self, mq: MessageQueue) -> str:
        addr = await self.find_broker_addr(mq.broker_name, mq.topic)
        if addr is None:
            raise MQClientError(f"broker {mq.broker_name!r} of {mq} is not in any known route")
        return addr

    async def max_offset(self, mq: MessageQueue) -> int:
        """The queue's max offset (next to be written) from its broker."""
        return await self.api.get_max_offset(await self._addr_or_raise(mq), mq)

    async def min_offset(self, mq: MessageQueue) -> int:
        """The smallest offset ``mq`` still stores (GET_MIN_OFFSET to its broker)."""
        return await self.api.get_min_offset(await self._addr_or_raise(mq), mq)

    async def search_offset(self, mq: MessageQueue, timestamp_ms: int) -> int:
        """The first offset of ``mq`` stored at or after ``timestamp_ms``."""
        return await self.api.search_offset(await self._addr_or_raise(mq), mq, timestamp_ms)

    # --- heartbeats -------------------------------------------------------------------------------

    def _heartbeat_data(self) -> HeartbeatData:
        consumers = [
            ConsumerData(
                group_name=c.group_name,
                consume_type=c.consume_type,
                message_model=c.message_model,
                consume_from_where=c.consume_from_where,
                consume_orderly=c.consume_orderly,
                subscription_data_set=[s.to_wire() for s in c.subscriptions()],
            )
            for c in list(self.consumers.values())
        ]
        return HeartbeatData(self.client_id, sorted(self.producers), consumers)

    async def send_heartbeat_to_all_brokers(self) -> None:
        """HEART_BEAT to every known broker (masters only when there is no consumer), in parallel."""
        if not self.producers and not self.consumers:
            return
        async with self._heartbeat_lock:
            data = self._heartbeat_data()  # built under the lock: includes everything registered so far
            addrs = self._all_broker_addrs(masters_only=not self.consumers)

            async def one(addr: str) -> None:
                try:
                    await self.api.heartbeat(addr, data)
                except (RemotingError, MQBrokerError, MQClientError) as exc:
                    log_rate_limited(self._rate, ("hb", addr), _now_ms(), log.warning, "heartbeat.failed",
                                     addr=addr, error=str(exc))

            async with trio.open_nursery() as nursery:
                for addr in addrs:
                    nursery.start_soon(one, addr)
            self.heartbeat_count += 1

    # --- rebalance -------------------------------------------------------------------------------

    def rebalance_immediately(self) -> None:
        """Wake the rebalance loop now (coalesced: several calls during one pass cause one more pass)."""
        self._rebalance_wakeup.set()

    async def _on_consumer_ids_changed(self, cmd: RemotingCommand, addr: str) -> RemotingCommand | None:
        group = (cmd.ext or {}).get("consumerGroup")
        log.info("rebalance.consumer_ids_changed", client_id=self.client_id, group=group, broker=addr)
        self.consumer_ids_changed_count += 1
        self.rebalance_immediately()
        return None

    async def do_rebalance(self) -> None:
        """Rebalance every registered consumer once."""
        for consumer in list(self.consumers.values()):
            try:
                await consumer.do_rebalance()
            except Exception:
                log.exception("rebalance.failed", group=consumer.group_name)
        self.rebalance_count += 1

    # --- timers ------------------------------------------------------------------------------------

    async def _route_loop(self) -> None:
        # Every poll_name_server_interval, and at once when asked (request_route_refresh); while a suspect address
        # (a closed or failed broker connection) is still listed, again after each delay of the burst.
        deadline = trio.current_time() + self.config.poll_name_server_interval / 1000
        while True:
            with trio.move_on_at(deadline):
                await self._route_wakeup.wait()
            self._route_wakeup = trio.Event()
            asked = bool(self._route_suspects) or trio.current_time() < deadline
            if asked:
                self.route_refreshes += 1
            await self.update_all_topic_routes()
            if not asked:
                deadline = trio.current_time() + self.config.poll_name_server_interval / 1000
            if any(MASTER_ID not in addrs for addrs in self.broker_addr_table.values()):
                deadline = min(deadline, trio.current_time() + MASTERLESS_POLL_S)  # waiting for a master to return
            delays = []
            for addr, done in list(self._route_suspects.items()):
                if not self._known_broker_addr(addr) or done >= len(ROUTE_REFRESH_BURST_S):
                    del self._route_suspects[addr]
                    continue
                delays.append(ROUTE_REFRESH_BURST_S[done])
                self._route_suspects[addr] = done + 1
            if delays:
                with trio.move_on_after(min(delays)):
                    await self._route_wakeup.wait()
                self._route_wakeup.set()

    def heartbeat_immediately(self) -> None:
        """Wake the heartbeat loop now (a broker said this client is no longer a member of a group)."""
        self._heartbeat_wakeup.set()

    async def _heartbeat_loop(self) -> None:
        while True:
            await self.send_heartbeat_to_all_brokers()
            with trio.move_on_after(self.config.heartbeat_broker_interval / 1000):
                await self._heartbeat_wakeup.wait()
            self._heartbeat_wakeup = trio.Event()

    # --- leases ------------------------------------------------------------------------------------

    def _lease_holders(self) -> list[LeaseHolder]:
        return [c for c in list(self.consumers.values())
                if isinstance(c, LeaseHolder) and c.lease_renewal]

    def _master_names(self, addr: str) -> list[str]:
        """The brokers whose master is ``addr``."""
        return sorted(name for name, addrs in self.broker_addr_table.items() if addrs.get(MASTER_ID) == addr)

    def lease_interval_s(self) -> float:
        """How often the renewal task renews: a third of the shortest lease the brokers grant."""
        lease = min(self._lease_ms_by_addr.values(), default=DEFAULT_LEASE_MS)
        return max(lease, 30) / 3 / 1000

    async def _lease_loop(self) -> None:
        # One LOCK_BATCH_MQ per broker address and orderly group per interval, each as its own task so a broker
        # that does not answer (a partition) delays nobody else; at most one in flight per (address, group).
        in_flight: set[tuple[str, str]] = set()
        async with trio.open_nursery() as renewals:
            while True:
                holders = self._lease_holders()
                for addr in self._all_broker_addrs(masters_only=False):
                    names = self._master_names(addr)
                    for consumer in holders:
                        key = (addr, consumer.group_name)
                        if key not in in_flight:
                            in_flight.add(key)
                            renewals.start_soon(self._renew_one, consumer, addr, names, in_flight, key)
                with trio.move_on_after(self.lease_interval_s() if holders else 3600):
                    await self._lease_wakeup.wait()
                self._lease_wakeup = trio.Event()

    async def _renew_one(self, consumer: LeaseHolder, addr: str, names: list[str], in_flight: set[tuple[str, str]],
                         key: tuple[str, str]) -> None:
        try:
            self.lease_renewals += 1
            answer = await consumer.renew_leases(addr, names)
            if answer is None:
                return
            if answer.lease_ms:
                self._lease_ms_by_addr[addr] = answer.lease_ms
            if answer.member is False:
                log.info("lease.not_a_member", client_id=self.client_id, group=consumer.group_name, broker=addr)
                await self.send_heartbeat_to_all_brokers()  # rejoin the group (after a pause, a restart)...
                now = trio.current_time()
                if now - self._rejoined_at.get(addr, -1e9) > 1.0:  # (at most once a second: never a busy loop)
                    self._rejoined_at[addr] = now
                    self._lease_wakeup.set()  # ... and renew right after, as a member again
            if answer.grace_ms and self._nursery is not None:
                # The broker restarted and keeps queues for their claimants a while: ask again the moment it ends.
                self._nursery.start_soon(self._wake_lease_loop_after, answer.grace_ms / 1000 + 0.01)
        except Exception:
            log.exception("lease.renew_failed", group=consumer.group_name, addr=addr)
        finally:
            in_flight.discard(key)

    async def _wake_lease_loop_after(self, delay_s: float) -> None:
        await trio.sleep(delay_s)
        self._lease_wakeup.set()

    def _on_connection_opened(self, addr: str) -> None:
        # A new connection to ``addr`` was just established: it is reachable, whatever an earlier failure said.
        # Without this, offsets kept going to the slave for UNREACHABLE_MS after a restarted master was back and
        # had already granted this client a lock (chaos seed 23: the slave's older offset rewound a queue).
        self._unreachable.pop(addr, None)

    def _on_connection_closed(self, addr: str) -> None:
        # Called by the transport the moment a connection closes. A broker may have died: refresh the routes now
        # (fast detection, issue 15). And it may release this client's locks after its short disconnect grace, so
        # stop that broker's queues now and re-lock them at once.
        if self._running and self._known_broker_addr(addr):
            self.request_route_refresh(addr)
        names = self._master_names(addr)
        if not names:
            return
        for consumer in list(self.consumers.values()):
            if isinstance(consumer, LeaseHolder) and consumer.lease_renewal:
                consumer.broker_connection_lost(names)
        self._lease_wakeup.set()

    async def _rebalance_loop(self) -> None:
        while True:
            with trio.move_on_after(self.config.rebalance_interval / 1000):
                await self._rebalance_wakeup.wait()
            self._rebalance_wakeup = trio.Event()  # requests during the pass below cause another pass
            await self.do_rebalance()

    async def _persist_loop(self) -> None:
        while True:
            await trio.sleep(self.config.persist_consumer_offset_interval / 1000)
            await self.persist_all_consumer_offsets()

    async def persist_all_consumer_offsets(self) -> None:
        """Persist every consumer's offsets now."""
        for consumer in list(self.consumers.values()):
            try:
                await consumer.persist_consumer_offset()
            except Exception:
                log.exception("offset.persist_all_failed", group=consumer.group_name)


def _limit_queues(route: TopicRouteData, n: int) -> TopicRouteData:
    from dataclasses import replace

    qds = tuple(
        replace(q, read_queue_nums=min(n, q.read_queue_nums), write_queue_nums=min(n, q.read_queue_nums))
        for q in route.queue_datas
    )
    return TopicRouteData(broker_datas=route.broker_datas, queue_datas=qds)


def _now_ms() -> int:
    return int(trio.current_time() * 1000)
