"""Administer topics, consumer groups, dead letters and the cluster from Python (RocketMQ's MQAdminExt).

::

    from trimq.client.admin import open_admin

    async with open_admin("127.0.0.1:9876") as admin:
        await admin.ensure_topic("Orders", 8)
        progress = await admin.consumer_progress("orders")
        print(progress.total_lag)

Every operation asks the name server for the brokers (or the topic's route), then the brokers — and, through
a broker, the consumers themselves. Each returns a typed result (:mod:`trimq.client.admin_results`);
:func:`~trimq.client.admin_results.to_document` turns one into the JSON document ``trimq-admin --json``
prints. Operations that ask every broker keep going when one does not answer and list it in the result's
``errors``; operations that did part of their work raise :class:`PartialFailure` carrying the result.

The command line over this class is ``trimq-admin`` (:mod:`trimq.tools.admin`, docs/ADMIN.md).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import trio

from trimq.client.admin_results import (
    BrokerAddress,
    BrokerFailure,
    BrokerLockInfo,
    BrokerPromoteResult,
    ClientFailure,
    ClusterBroker,
    ClusterEntry,
    ClusterList,
    ConsumerConnection,
    ConsumerConnections,
    ConsumerDeleteResult,
    ConsumerGroupEntry,
    ConsumerGroupList,
    ConsumerLocks,
    ConsumerProgress,
    ConsumerRunningInfo,
    ConsumerStatus,
    DeadLetter,
    DeadLetterList,
    MemberReset,
    MessageQueryResult,
    QueueLock,
    QueueProgress,
    QueueReset,
    QueueStatus,
    ResendFailure,
    ResendResult,
    Resent,
    ResetOffsetResult,
    SkipResult,
    StoredMessage,
    TopicBrokerConfig,
    TopicCreateResult,
    TopicDeleteResult,
    TopicEntry,
    TopicList,
    TopicStatus,
)
from trimq.client.api import MQClientAPI, PullStatus
from trimq.client.config import ClientConfig
from trimq.client.errors import MQBrokerError, MQClientError, TopicNotExistError, TrimqClientError
from trimq.protocol.codes import RequestCode, ResponseCode
from trimq.protocol.message import MessageConst
from trimq.protocol.message_queue import MessageQueue
from trimq.protocol.validation import dlq_topic
from trimq.runtime.client import RemotingClient, RemotingError

__all__ = ["Admin", "AdminError", "BrokerNotNamedError", "PartialFailure", "open_admin"]

T = TypeVar("T")

TOOLS_CONSUMER_GROUP = "TOOLS_CONSUMER"
"""The group name of the admin's own pulls (``message_at``), RocketMQ's MixAll.TOOLS_CONSUMER_GROUP."""
FORWARD_EXTRA_MS = 6_000
"""Added to the timeout of requests the broker forwards to a consumer (it waits up to 5 s for the consumer)."""
SKIP_TIMEOUT_MS = 20_000
RESET_TIMEOUT_MS = 30_000
ROUTE_WAIT_S = 5.0
GET_ALL_CONSUMER_OFFSET = 43
"""RocketMQ's RequestCode.GET_ALL_CONSUMER_OFFSET: a broker's whole offset table (``consumer list`` finds the
groups that stored offsets without a config there, when the broker serves it)."""
DLQ_PAGE = 256
PERM_READ_WRITE = 6


class AdminError(MQClientError):
    """An operation cannot do what was asked; the message says why."""


class BrokerNotNamedError(AdminError):
    """The topic is on several brokers and the operation needs one: name it (``broker=``)."""


class PartialFailure(AdminError):
    """Some of the work failed; ``result`` is what was done (the operation's typed result)."""

    def __init__(self, message: str, result: Any) -> None:
        super().__init__(message)
        self.result = result


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


async def _each(items: dict[str, T], fn: Callable[[str, T], Awaitable[Any]]) -> dict[str, Any]:
    """Run ``fn(key, item)`` for every item concurrently; key -> result, or the exception it raised."""
    out: dict[str, Any] = {}

    async def one(key: str, item: T) -> None:
        try:
            out[key] = await fn(key, item)
        except (TrimqClientError, RemotingError) as exc:
            out[key] = exc

    async with trio.open_nursery() as nursery:
        for key, item in items.items():
            nursery.start_soon(one, key, item)
    return {k: out[k] for k in sorted(out)}


def _failures(results: dict[str, Any], *, skip: tuple[type[BaseException], ...] = ()) -> list[BrokerFailure]:
    return [BrokerFailure(n, str(r)) for n, r in results.items()
            if isinstance(r, Exception) and not isinstance(r, skip)]


def _mq_fields(m: Any) -> tuple[Any, Any, Any]:
    """(topic, broker name, queue id) of a wire message queue (tolerant of junk: the admin only shows it)."""
    m = m if isinstance(m, dict) else {}
    return m.get("topic"), m.get("brokerName"), m.get("queueId")


def _int(value: Any, default: int = 0) -> int:
    try:
        return int(value) if value is not None else default
    except (TypeError, ValueError):
        return default


@dataclass
class Admin:
    """Administration of a trimq cluster over an open :class:`~trimq.client.api.MQClientAPI`: the name
    servers ``namesrv_addrs`` are asked in order, every request waits at most ``timeout_ms``.

    Use :func:`open_admin` for an Admin with connections of its own; a program that already runs a client
    can share its connections: ``Admin(producer.instance.api, config.namesrv_addrs)``.
    """

    api: MQClientAPI
    namesrv_addrs: list[str]
    timeout_ms: int = 5000

    # ------------------------------------------------------------------ name server and brokers

    async def _namesrv(self, call: Callable[[str], Awaitable[T]]) -> T:
        """``call(addr)`` on the first name server that answers (a broker error is an answer)."""
        last: Exception | None = None
        for addr in self.namesrv_addrs:
            try:
                return await call(addr)
            except RemotingError as exc:
                last = exc
        raise AdminError(f"no name server answered ({'; '.join(self.namesrv_addrs)}): {last}")

    async def cluster_info_raw(self) -> dict[str, Any]:
        """GET_BROKER_CLUSTER_INFO's body as the name server sent it (docs/PROTOCOL.md)."""
        body = await self._namesrv(lambda a: self.api.admin_query(a, RequestCode.GET_BROKER_CLUSTER_INFO))
        if not isinstance(body, dict):
            raise AdminError("the name server answered GET_BROKER_CLUSTER_INFO without a body")
        return body

    async def brokers(self, *, masters_only: bool = False) -> dict[str, str]:
        """Broker name -> address of its master (else any address, unless ``masters_only``), for every broker
        the name server knows. AdminError when it knows none."""
        table = (await self.cluster_info_raw()).get("brokerAddrTable") or {}
        out: dict[str, str] = {}
        for name, bd in sorted(table.items()):
            addrs = (bd or {}).get("brokerAddrs") or {}
            master = addrs.get("0") or addrs.get(0)
            addr = master if masters_only else master or next(iter(addrs.values()), None)
            if addr:
                out[str(name)] = str(addr)
        if not out:
            what = "master broker" if masters_only else "broker"
            raise AdminError(f"the name server ({'; '.join(self.namesrv_addrs)}) knows no {what}")
        return out

    async def route_brokers(self, topic: str) -> dict[str, str]:
        """Broker name -> master address of the brokers hosting ``topic``; AdminError when it has no route."""
        try:
            route = await self._namesrv(lambda a: self.api.get_topic_route(a, topic, timeout_ms=self.timeout_ms))
        except TopicNotExistError:
            raise AdminError(f"topic {topic} does not exist (the name server has no route for it)") from None
        out = {bd.broker_name: addr for bd in route.broker_datas if (addr := bd.select_broker_addr())}
        if not out:
            raise AdminError(f"topic {topic} has no broker with an address in its route")
        return dict(sorted(out.items()))

    async def _queue_broker(self, topic: str, broker: str | None) -> tuple[str, str]:
        """(broker name, address) of the broker of a queue of ``topic``: ``broker`` or the only one."""
        brokers = await self.route_brokers(topic)
        if broker is not None:
            if broker not in brokers:
                raise AdminError(f"broker {broker} does not host topic {topic} (it is on {', '.join(brokers)})")
            return broker, brokers[broker]
        if len(brokers) > 1:
            raise BrokerNotNamedError(f"topic {topic} is on several brokers ({', '.join(brokers)}): name one")
        return next(iter(brokers.items()))

    # ------------------------------------------------------------------ topics

    async def topic_list(self) -> TopicList:
        """Every topic the name server routes, with its queues and permission on each broker."""
        topics = await self._namesrv(lambda a: self.api.get_all_topic_list(a, timeout_ms=self.timeout_ms))
        configs = await _each(await self.brokers(), lambda _n, a: self.api.get_all_topic_config(a))
        entries = [TopicEntry(topic, [
            TopicBrokerConfig(name, cfg[topic].read_queue_nums, cfg[topic].write_queue_nums, cfg[topic].perm)
            for name, cfg in configs.items() if not isinstance(cfg, Exception) and topic in cfg
        ]) for topic in sorted(topics)]
        return TopicList(entries, _failures(configs))

    async def topic_create(self, topic: str, queues: int, perm: int = PERM_READ_WRITE, brokers: Iterable[str] = (),
                           cluster: str | None = None, wait: bool = True) -> TopicCreateResult:
        """Create or update ``topic`` with ``queues`` read and write queues on the brokers named (those of
        ``cluster`` too), or on every broker the name server knows; with ``wait``, wait (up to 5 s) until the
        name server routes it to all of them. PartialFailure when some broker refused."""
        known = await self.brokers()
        wanted = list(dict.fromkeys(brokers))
        if cluster is not None:
            names = ((await self.cluster_info_raw()).get("clusterAddrTable") or {}).get(cluster)
            if not names:
                raise AdminError(f"the name server knows no cluster {cluster}")
            wanted += [n for n in names if n not in wanted]
        unknown = [n for n in wanted if n not in known]
        if unknown:
            raise AdminError(f"unknown broker {', '.join(unknown)} (known: {', '.join(known)})")
        return await self._create(topic, queues, perm, {n: known[n] for n in (wanted or known)},
                                  ROUTE_WAIT_S if wait else 0.0)

    async def ensure_topic(self, topic: str, queues: int = 4, *, perm: int = PERM_READ_WRITE,
                           timeout_s: float = 15.0) -> TopicCreateResult:
        """Create or update ``topic`` with ``queues`` read and write queues on every master broker the name
        server knows, and wait until the name server routes all of them, so producers and consumers can use it
        at once. AdminError when that does not happen within ``timeout_s``."""
        result = await self._create(topic, queues, perm, await self.brokers(masters_only=True), timeout_s)
        if not result.routed:
            raise AdminError(f"topic {topic}: the name server did not route {queues} queues on "
                             f"{', '.join(b.broker_name for b in result.brokers)} within {timeout_s} s")
        return result

    async def _create(self, topic: str, queues: int, perm: int, targets: dict[str, str],
                      wait_s: float) -> TopicCreateResult:
        results = await _each(targets, lambda _n, a: self.api.create_topic(
            a, topic, read_queue_nums=queues, write_queue_nums=queues, perm=perm, timeout_ms=self.timeout_ms))
        failed = _failures(results)
        created = [BrokerAddress(n, a) for n, a in targets.items() if not isinstance(results.get(n), Exception)]
        if failed:
            result = TopicCreateResult(topic, queues, queues, perm, created, False, failed)
            raise PartialFailure(f"topic {topic} could not be created on "
                                 f"{', '.join(f.broker_name for f in failed)}", result)
        routed = wait_s > 0 and await self._wait_route(topic, set(targets), queues, wait_s)
        return TopicCreateResult(topic, queues, queues, perm, created, routed)

    async def _wait_route(self, topic: str, brokers: set[str], queues: int, wait_s: float) -> bool:
        """Wait (at most ``wait_s``) until the name server routes ``topic`` to every broker with ``queues``
        queues: the brokers re-register right after a topic change."""
        with trio.move_on_after(wait_s):
            while True:
                try:
                    route = await self._namesrv(lambda a: self.api.get_topic_route(a, topic))
                    have = {q.broker_name for q in route.queue_datas
                            if q.read_queue_nums == queues and q.write_queue_nums == queues}
                    if brokers <= have:
                        return True
                except (MQBrokerError, AdminError):
                    pass
                await trio.sleep(0.05)
        return False

    async def topic_status(self, topic: str) -> TopicStatus:
        """Per queue: min and max offset, message count, store time of the last message (RocketMQ's
        topicStatus). AdminError when no broker of the topic answered."""
        brokers = await self.route_brokers(topic)
        stats = await _each(brokers, lambda _n, a: self.api.admin_query(
            a, RequestCode.GET_TOPIC_STATS_INFO, {"topic": topic}, timeout_ms=self.timeout_ms))
        errors = _failures(stats)
        rows = []
        for name, body in stats.items():
            if isinstance(body, Exception):
                continue
            for r in (body or {}).get("offsetTable") or []:
                _t, broker_name, queue_id = _mq_fields(r.get("mq"))
                lo, hi = _int(r.get("minOffset")), _int(r.get("maxOffset"))
                rows.append(QueueStatus(broker_name or name, queue_id, lo, hi, max(0, hi - lo),
                                        _int(r.get("lastUpdateTimestamp"))))
        rows.sort(key=lambda q: (q.broker_name, q.queue_id))
        if not rows and errors:
            raise AdminError(f"no broker of topic {topic} answered: {errors[0].error}")
        return TopicStatus(topic, rows, sum(q.messages for q in rows), errors)

    async def topic_delete(self, topic: str, cluster: str | None = None) -> TopicDeleteResult:
        """RocketMQ's mqadmin deleteTopic: DELETE_TOPIC_IN_BROKER on every master broker (of ``cluster``, or
        all), then DELETE_TOPIC_IN_NAMESRV on every name server. The brokers forget the topic's config, its
        consume queues and the offsets stored for it; its messages stay in the commit log until they expire.
        PartialFailure when a broker or name server refused."""
        known = await self.brokers(masters_only=True)
        if cluster is not None:
            names = ((await self.cluster_info_raw()).get("clusterAddrTable") or {}).get(cluster)
            if not names:
                raise AdminError(f"the name server knows no cluster {cluster}")
            known = {n: a for n, a in known.items() if n in names}
        results = await _each(known, lambda _n, a: self.api.invoke(
            a, RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": topic}, timeout_ms=self.timeout_ms))
        errors = _failures(results)
        deleted = [BrokerAddress(n, a) for n, a in known.items() if not isinstance(results.get(n), Exception)]
        namesrvs = await _each({a: a for a in self.namesrv_addrs}, lambda a, _: self.api.invoke(
            a, RequestCode.DELETE_TOPIC_IN_NAMESRV, {"topic": topic}, timeout_ms=self.timeout_ms))
        errors += [BrokerFailure(f"name server {a}", str(r)) for a, r in namesrvs.items() if isinstance(r, Exception)]
        result = TopicDeleteResult(topic, deleted, [a for a, r in namesrvs.items() if not isinstance(r, Exception)],
                                   errors)
        if errors:
            raise PartialFailure(f"topic {topic} was not deleted everywhere: " +
                                 "; ".join(f"{e.broker_name}: {e.error}" for e in errors), result)
        return result

    # ------------------------------------------------------------------ consumer groups

    async def consumer_list(self) -> ConsumerGroupList:
        """Every consumer group the brokers know (GET_ALL_SUBSCRIPTIONGROUP_CONFIG, and GET_ALL_CONSUMER_OFFSET for
        groups that only stored offsets), each with its live members
        (GET_CONSUMER_CONNECTION_LIST on every broker), how it consumes and its total lag (GET_CONSUME_STATS),
        as kafka-consumer-groups --list --describe / mqadmin consumerProgress show them."""
        brokers = await self.brokers()
        tables = await _each(brokers, lambda _n, a: self.api.admin_query(
            a, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, timeout_ms=self.timeout_ms))
        offsets = await _each(brokers, lambda _n, a: self.api.admin_query(
            a, GET_ALL_CONSUMER_OFFSET, timeout_ms=self.timeout_ms))  # best effort: brokers may not serve it
        errors = _failures(tables)
        names = sorted({str(g) for body in tables.values() if isinstance(body, dict)
                        for g in (body.get("subscriptionGroupTable") or {})}
                       # groups that stored offsets without a config (RocketMQ's "topic@group" keys)
                       | {str(k).partition("@")[2] for body in offsets.values() if isinstance(body, dict)
                          for k in (body.get("offsetTable") or {}) if "@" in str(k)})

        async def describe(group: str, _: str) -> ConsumerGroupEntry:
            conns = await _each(brokers, lambda _n, a: self.api.get_consumer_connection_list(
                a, group, timeout_ms=self.timeout_ms))
            stats = await _each(brokers, lambda _n, a: self.api.get_consume_stats(a, group,
                                                                                  timeout_ms=self.timeout_ms))
            members: set[str] = set()
            mode = model = ctype = None
            for body in conns.values():
                if isinstance(body, dict):
                    members |= {str(c.get("clientId")) for c in body.get("connectionSet") or [] if c.get("clientId")}
                    mode = "orderly" if body.get("consumeOrderly") else "concurrently"
                    model, ctype = body.get("messageModel"), body.get("consumeType")
            lag = 0
            on = []
            for name, body in stats.items():
                if isinstance(body, dict):
                    lag += _int(body.get("totalLag"))
                    if body.get("offsetTable"):
                        on.append(name)
                    if mode is None and body.get("offsetTable"):
                        mode = "orderly" if body.get("orderly") else None
            on = sorted(set(on) | {n for n, b in conns.items() if isinstance(b, dict)})
            return ConsumerGroupEntry(group, len(members), mode, model, ctype, lag, on)

        described = await _each({g: g for g in names}, describe)
        groups = [e for e in described.values() if isinstance(e, ConsumerGroupEntry)]
        errors += [BrokerFailure(f"group {g}", str(e)) for g, e in described.items() if isinstance(e, Exception)]
        return ConsumerGroupList(groups, errors)

    async def consumer_delete(self, group: str, *, force: bool = False,
                              keep_offsets: bool = False) -> ConsumerDeleteResult:
        """RocketMQ's mqadmin deleteSubGroup on every master broker: the group's config goes, and (unless
        ``keep_offsets``) its stored offsets. Refused (AdminError) while the group has live members, unless
        ``force``: they would keep consuming with the defaults and write their offsets back. PartialFailure
        when a broker refused."""
        brokers = await self.brokers(masters_only=True)
        conns = await _each(brokers, lambda _n, a: self.api.get_consumer_connection_list(
            a, group, timeout_ms=self.timeout_ms))
        members = sorted({str(c.get("clientId")) for b in conns.values() if isinstance(b, dict)
                          for c in b.get("connectionSet") or [] if c.get("clientId")})
        if members and not force:
            raise AdminError(f"consumer group {group} has {len(members)} live member(s) ({', '.join(members)}): stop "
                             f"them first, or delete anyway with force (--force)")
        ext = {"groupName": group, "removeOffset": not keep_offsets}
        results = await _each(brokers, lambda _n, a: self.api.invoke(
            a, RequestCode.DELETE_SUBSCRIPTIONGROUP, ext, timeout_ms=self.timeout_ms))
        errors = _failures(results)
        result = ConsumerDeleteResult(group, [n for n in brokers if not isinstance(results.get(n), Exception)],
                                      not keep_offsets, members, errors)
        if errors:
            raise PartialFailure(f"consumer group {group} was not deleted on " +
                                 "; ".join(f"{e.broker_name}: {e.error}" for e in errors), result)
        return result

    async def _group_broker(self, group: str) -> tuple[str, str, dict[str, Any]]:
        """(broker name, address, GET_CONSUMER_CONNECTION_LIST body) of the first broker the group is on."""
        last: Exception | None = None
        for name, addr in (await self.brokers()).items():
            try:
                return name, addr, await self.api.get_consumer_connection_list(addr, group, timeout_ms=self.timeout_ms)
            except MQBrokerError as exc:
                if exc.code != ResponseCode.CONSUMER_NOT_ONLINE:
                    last = exc
            except RemotingError as exc:
                last = exc
        detail = f" (last error: {last})" if last else ""
        raise AdminError(f"consumer group {group} is not online: no broker has a member{detail}")

    async def consumer_connections(self, group: str) -> ConsumerConnections:
        """The group's live members and subscriptions, as the first broker it is on sees them; AdminError
        when no broker has a member."""
        name, _addr, body = await self._group_broker(group)
        conns = [ConsumerConnection(
            str(c.get("clientId")), c.get("clientAddr"), c.get("language"), c.get("version"),
            c.get("lastUpdateTimestamp"),
            {k: v for k, v in c.items() if k not in ("clientId", "clientAddr", "language", "version",
                                                     "lastUpdateTimestamp")},
        ) for c in body.get("connectionSet") or [] if isinstance(c, dict)]
        known = ("consumerGroup", "connectionSet", "subscriptionTable", "consumeType", "messageModel",
                 "consumeFromWhere", "consumeOrderly", "consistent")
        return ConsumerConnections(
            name, str(body.get("consumerGroup") or group), conns, dict(body.get("subscriptionTable") or {}),
            body.get("consumeType"), body.get("messageModel"), body.get("consumeFromWhere"),
            bool(body.get("consumeOrderly")), bool(body.get("consistent", True)),
            {k: v for k, v in body.items() if k not in known})

    async def _running_info(self, addr: str, group: str, client_id: str) -> dict[str, Any]:
        body = await self.api.admin_query(addr, RequestCode.GET_CONSUMER_RUNNING_INFO,
                                          {"consumerGroup": group, "clientId": client_id},
                                          timeout_ms=self.timeout_ms + FORWARD_EXTRA_MS)
        if not isinstance(body, dict):
            raise AdminError(f"consumer {client_id} answered GET_CONSUMER_RUNNING_INFO without a body")
        return body

    async def consumer_status(self, group: str, client_id: str | None = None) -> ConsumerStatus:
        """Each member's running info (or only ``client_id``'s), fetched through the broker. PartialFailure
        when a member did not answer."""
        name, addr, conns = await self._group_broker(group)
        ids = [c.get("clientId") for c in conns.get("connectionSet") or [] if c.get("clientId")]
        if client_id is not None:
            if client_id not in ids:
                raise AdminError(f"client {client_id} is not a member of group {group} (members: {', '.join(ids)})")
            ids = [client_id]
        infos = await _each({cid: cid for cid in ids}, lambda cid, _: self._running_info(addr, group, cid))
        clients = [ConsumerRunningInfo(cid, info) for cid, info in infos.items() if not isinstance(info, Exception)]
        errors = [ClientFailure(cid, str(e)) for cid, e in infos.items() if isinstance(e, Exception)]
        result = ConsumerStatus(group, name, clients, errors)
        if errors:
            raise PartialFailure(f"{len(errors)} of {len(ids)} member(s) did not report their running info: "
                                 + "; ".join(f"{e.client_id}: {e.error}" for e in errors), result)
        return result

    async def _queue_owners(self, group: str) -> tuple[bool, dict[tuple[Any, Any, Any], str]]:
        """(online, (topic, broker, queue id) -> client id) from the running info of every member (best
        effort: a member that does not answer owns nothing here)."""
        try:
            _name, addr, conns = await self._group_broker(group)
        except AdminError:
            return False, {}
        ids = [c.get("clientId") for c in conns.get("connectionSet") or [] if c.get("clientId")]
        infos = await _each({cid: cid for cid in ids}, lambda cid, _: self._running_info(addr, group, cid))
        owners: dict[tuple[Any, Any, Any], str] = {}
        for cid, info in infos.items():
            if isinstance(info, Exception):
                continue
            for row in info.get("mqTable") or []:
                if not (row.get("processQueueInfo") or {}).get("dropped"):
                    owners[_mq_fields(row.get("mq"))] = cid
        return True, owners

    async def consumer_progress(self, group: str, topic: str | None = None) -> ConsumerProgress:
        """RocketMQ's consumerProgress: per queue of the group's topics (or ``topic``), the broker offset,
        consumer offset, lag and owner. AdminError when no broker has anything for the group."""
        brokers = await self.brokers()
        stats = await _each(brokers, lambda _n, a: self.api.get_consume_stats(a, group, topic,
                                                                              timeout_ms=self.timeout_ms))
        errors = _failures(stats, skip=(TopicNotExistError,))
        bodies = {n: b for n, b in stats.items() if isinstance(b, dict)}
        orderly = any(b.get("orderly") for b in bodies.values())
        online, owners = await self._queue_owners(group)
        rows = []
        for name, body in bodies.items():
            for r in body.get("offsetTable") or []:
                t, b, q = _mq_fields(r.get("mq"))
                key = (t, b or name, q)
                owner = r.get("lockOwner") if orderly else None
                rows.append(QueueProgress(
                    key[0], key[1], key[2], r.get("brokerOffset"), r.get("consumerOffset"), r.get("lag"),
                    owner or owners.get(key), r.get("lastTimestamp") or 0, r.get("lastUpdateTimestamp") or 0))
        if not rows:
            if errors:
                raise AdminError(f"no consume progress for group {group}: {errors[0].error}")
            where = f" on topic {topic}" if topic else ""
            raise AdminError(f"no consume progress for group {group}{where}: it has no stored offset and no member "
                             f"subscribes (has it consumed anything?)")
        rows.sort(key=lambda r: (r.topic or "", r.broker_name or "", r.queue_id or 0))
        total = sum(r.lag for r in rows if isinstance(r.lag, int) and r.lag > 0)
        return ConsumerProgress(group, topic, orderly, online, total, rows, errors)

    async def consumer_locks(self, group: str) -> ConsumerLocks:
        """The brokers' queue locks of the group and the offset updates they fenced."""
        tables = await _each(await self.brokers(), lambda _n, a: self.api.get_lock_table(a, group,
                                                                                         timeout_ms=self.timeout_ms))
        locks, per_broker = [], []
        for name, body in tables.items():
            if isinstance(body, Exception):
                continue
            fenced = _int((body.get("fencedUpdates") or {}).get(group))
            per_broker.append(BrokerLockInfo(name, body.get("maxLiveMs"), fenced, dict(body.get("stats") or {})))
            for r in body.get("lockTable") or []:
                t, b, q = _mq_fields(r.get("mq"))
                locks.append(QueueLock(t, b or name, q, r.get("clientId"), r.get("lastUpdateTimestamp"),
                                       r.get("ageMs"), bool(r.get("expired"))))
        locks.sort(key=lambda r: (r.topic or "", r.broker_name or "", r.queue_id or 0))
        return ConsumerLocks(group, locks, sum(b.fenced_updates for b in per_broker), per_broker, _failures(tables))

    async def reset_offset(self, group: str, topic: str, timestamp: int, force: bool = True, *,
                           dry_run: bool = False) -> ResetOffsetResult:
        """RocketMQ's resetOffsetByTime: the group's offsets of ``topic`` move to the first message stored at or
        after ``timestamp`` (epoch ms; with ``force`` False, only backwards). Safe with the group online: each
        broker tells the live members, and a commit made before the reset is refused (the reset generation,
        docs/ADMIN.md). ``dry_run``: only the plan — each queue's current and new offset — nothing changed.
        PartialFailure when a broker failed or a member did not confirm."""
        brokers = await self.route_brokers(topic)
        ext = {"topic": topic, "group": group, "timestamp": timestamp, "isForce": force}
        if dry_run:
            ext["dryRun"] = True
        results = await _each(brokers, lambda _n, a: self.api.admin_query(
            a, RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, ext, timeout_ms=max(self.timeout_ms, RESET_TIMEOUT_MS)))
        rows: list[QueueReset] = []
        clients: list[MemberReset] = []
        for name, body in results.items():
            if isinstance(body, Exception):
                continue
            for r in body.get("offsetTable") or []:
                _t, b, q = _mq_fields(r.get("mq"))
                rows.append(QueueReset(b or name, q, r.get("previousOffset"), r.get("offset")))
            for c in body.get("clients") or []:
                clients.append(MemberReset(name, c.get("clientId"), bool(c.get("ok")), c.get("remark"),
                                           sum(1 for q in c.get("queues") or [] if q.get("held"))))
        rows.sort(key=lambda r: (r.broker_name, r.queue_id))
        errors = _failures(results)
        online = bool(clients) or any(isinstance(b, dict) and b.get("online") for b in results.values())
        generations = {n: _int(b.get("resetGeneration")) for n, b in results.items()
                       if isinstance(b, dict) and b.get("resetGeneration") is not None}
        result = ResetOffsetResult(group, topic, timestamp, force, online if dry_run else bool(clients), rows,
                                   clients, errors, dry_run, generations)
        if errors:
            raise PartialFailure("offsets were not reset on " + "; ".join(
                f"{e.broker_name}: {e.error}" for e in errors), result)
        bad = [c for c in clients if not c.ok]
        if bad:
            raise PartialFailure("offsets were reset on the brokers, but these members did not confirm (they may "
                                 "write an older offset back; run the reset again once they are healthy): " +
                                 "; ".join(f"{c.client_id} via {c.broker_name}: {c.remark}" for c in bad), result)
        return result

    async def consumer_skip(self, group: str, topic: str, queue_id: int, offset: int, broker: str | None = None,
                            client_id: str | None = None) -> SkipResult:
        """Dead-letter the message at ``offset`` of a queue through the member holding the queue (or
        ``client_id``), which moves on at once (DESIGN.md §6.5)."""
        name, addr = await self._queue_broker(topic, broker)
        ext = {"consumerGroup": group, "topic": topic, "brokerName": name, "queueId": queue_id,
               "queueOffset": offset, "clientId": client_id}
        body = await self.api.admin_query(addr, RequestCode.SKIP_MESSAGE, ext,
                                          timeout_ms=max(self.timeout_ms, SKIP_TIMEOUT_MS))
        return SkipResult(name, dlq_topic(group), dict(body) if isinstance(body, dict) else {})

    # ------------------------------------------------------------------ dead letters

    async def dlq_list(self, group: str, limit: int = 1000, include_body: bool = False) -> DeadLetterList:
        """The group's dead letters on every broker, oldest first, at most ``limit``."""
        more: list[str] = []

        async def one(name: str, addr: str) -> list[DeadLetter]:
            out: list[DeadLetter] = []
            offset = 0
            while True:
                if len(out) >= limit:
                    more.append(name)
                    break
                body = await self.api.admin_query(addr, RequestCode.QUERY_DLQ_MESSAGES, {
                    "consumerGroup": group, "offset": offset, "maxNums": min(DLQ_PAGE, limit - len(out)),
                    "includeBody": include_body}, timeout_ms=self.timeout_ms)
                msgs = (body or {}).get("messages") or []
                out += [DeadLetter.from_wire(name, m) for m in msgs if isinstance(m, dict)]
                nxt = _int((body or {}).get("nextOffset"), offset)
                if not msgs or nxt <= offset or nxt >= _int((body or {}).get("maxOffset")):
                    break
                offset = nxt
            return out

        results = await _each(await self.brokers(), one)
        messages = [m for r in results.values() if not isinstance(r, Exception) for m in r]
        return DeadLetterList(group, dlq_topic(group), messages[:limit], bool(more) or len(messages) > limit,
                              _failures(results))

    async def dlq_resend(self, group: str, msg_ids: Sequence[str] | None = None) -> ResendResult:
        """Send dead letters back to their original topic: those named by ``msg_ids`` (a dead letter's id, its
        origin id or unique key), or every one not resent yet. PartialFailure when some could not be."""
        ext: dict[str, Any] = {"consumerGroup": group}
        if msg_ids:
            ext["msgIds"] = list(msg_ids)
        results = await _each(await self.brokers(), lambda _n, a: self.api.admin_query(
            a, RequestCode.RESEND_DLQ_MESSAGES, ext, timeout_ms=max(self.timeout_ms, RESET_TIMEOUT_MS)))
        errors = _failures(results)
        bodies = {n: b for n, b in results.items() if isinstance(b, dict)}
        resent = [Resent(n, r.get("dlqMsgId"), r.get("queueOffset"), r.get("topic"), r.get("queueId"),
                         r.get("msgId")) for n, b in bodies.items() for r in b.get("resent") or []]
        failed: list[ResendFailure] = []
        if msg_ids:
            # An id is on one broker: it failed only if no broker resent it (every answering one listed it).
            for mid in dict.fromkeys(msg_ids):
                reports = [(n, f) for n, b in bodies.items() for f in b.get("failed") or [] if f.get("msgId") == mid]
                if bodies and len(reports) == len(bodies):
                    real = [(n, f) for n, f in reports if f.get("queueOffset") is not None] or reports
                    n, f = real[0]
                    failed.append(ResendFailure(n, f.get("msgId"), f.get("queueOffset"), f.get("error")))
        else:
            failed = [ResendFailure(n, f.get("msgId"), f.get("queueOffset"), f.get("error"))
                      for n, b in bodies.items() for f in b.get("failed") or []]
        result = ResendResult(group, resent, len(resent), sum(_int(b.get("skipped")) for b in bodies.values()),
                              failed, errors)
        problems = [f"{f.msg_id or f.queue_offset}: {f.error}" for f in failed] + \
                   [f"{e.broker_name}: {e.error}" for e in errors]
        if problems:
            raise PartialFailure(f"{len(problems)} resend(s) failed: " + "; ".join(problems), result)
        return result

    # ------------------------------------------------------------------ messages and cluster

    async def message_by_id(self, msg_id: str) -> StoredMessage:
        """The message with offset message id ``msg_id`` (the broker's msgId: it names the broker's address
        and the commit-log offset), not a producer's unique key."""
        from trimq.protocol.address import format_address
        from trimq.protocol.record import parse_message_id

        try:
            (host, port), _offset = parse_message_id(msg_id)
        except ValueError as exc:
            raise AdminError(f"{exc}; --msg-id takes an offset message id (the broker's msgId, as shown by "
                             f"'dlq list' or a send result's offset_msg_id), not a producer's unique key") from None
        addr = format_address(host, port)
        names = {a: n for n, a in (await self.brokers()).items()}
        try:
            msg = await self.api.view_message_by_id(msg_id, timeout_ms=self.timeout_ms)
        except RemotingError as exc:
            raise AdminError(f"message id {msg_id} names the broker at {addr}, which cannot be reached: "
                             f"{exc}") from None
        return StoredMessage(names.get(addr), msg)

    async def message_query(self, key: str, topic: str | None = None, *, unique_key: bool = False, max_num: int = 64,
                            begin_ms: int = 0, end_ms: int = 2**63 - 1) -> MessageQueryResult:
        """Stored messages whose KEYS hold ``key`` (``unique_key``: whose UNIQ_KEY, the producer's message id, is
        ``key``), on every broker of ``topic`` — or, without a topic, on every broker of the cluster in every
        topic (RocketMQ's queryMsgByKey / queryMsgByUniqueKey; answered from each broker's message index,
        docs/STORAGE.md §10). At most ``max_num`` per broker, oldest first; brokers that do not answer are
        listed in ``errors``. AdminError when none answered."""
        brokers = await (self.route_brokers(topic) if topic is not None else self.brokers())
        found = await _each(brokers, lambda _n, a: self.api.query_message(
            a, topic, key, max_num=max_num, begin_timestamp=begin_ms, end_timestamp=end_ms, unique=unique_key,
            timeout_ms=self.timeout_ms * 3))  # RocketMQ's client gives a query three timeouts
        errors = _failures(found)
        if errors and len(errors) == len(found):
            raise AdminError(f"no broker answered the query: {errors[0].broker_name}: {errors[0].error}")
        messages = [StoredMessage(name, m) for name, msgs in found.items() if not isinstance(msgs, Exception)
                    for m in msgs]
        messages.sort(key=lambda s: (s.message.store_timestamp, s.broker_name or "", s.message.commit_log_offset))
        return MessageQueryResult(key, topic, unique_key, messages, errors)

    async def message_at(self, topic: str, queue_id: int, offset: int, broker: str | None = None) -> StoredMessage:
        """The message at ``offset`` of queue ``queue_id`` of ``topic`` (on ``broker``, needed when the topic is
        on several); pulled as RocketMQ's TOOLS_CONSUMER group, nothing committed."""
        name, addr = await self._queue_broker(topic, broker)
        mq = MessageQueue(topic, name, queue_id)
        result = await self.api.pull_message(
            addr, consumer_group=TOOLS_CONSUMER_GROUP, mq=mq, queue_offset=offset, max_msg_nums=1, sys_flag=0,
            commit_offset=0, suspend_timeout_millis=0, subscription="*", sub_version=0, timeout_ms=self.timeout_ms)
        msg = next((m for m in result.msg_found_list if m.queue_offset == offset), None)
        if result.status is not PullStatus.FOUND or msg is None:
            held = (f"it holds offsets {result.min_offset}..{result.max_offset - 1}"
                    if result.max_offset > result.min_offset else "it is empty")
            raise AdminError(f"no message at {topic} queue {queue_id} offset {offset} of {name} ({held})")
        for prop in (MessageConst.MIN_OFFSET, MessageConst.MAX_OFFSET):  # added by the pull decoder, not stored
            msg.properties.pop(prop, None)
        return StoredMessage(name, msg)

    async def broker_promote(self, broker_name: str, broker_id: int = 1, role: str = "ASYNC_MASTER",
                             force: bool = False) -> BrokerPromoteResult:
        """Promote the slave ``broker_id`` of ``broker_name`` to its master (PROMOTE_BROKER, docs/OPERATIONS.md
        "High availability"): a newer master epoch, lock epochs above the old master's. ``role``: ASYNC_MASTER or
        SYNC_MASTER. The broker refuses when its log ends in an older master epoch than a master that exists (it
        would lose what that master stored) unless ``force``. AdminError when the name server knows no such broker;
        MQBrokerError when it refuses."""
        table = (await self.cluster_info_raw()).get("brokerAddrTable") or {}
        addrs = (table.get(broker_name) or {}).get("brokerAddrs") or {}
        addr = addrs.get(str(broker_id)) or addrs.get(broker_id)
        if not addr:
            known = ", ".join(f"{k}: {v}" for k, v in sorted(addrs.items())) or "none"
            raise AdminError(f"the name server knows no broker {broker_name} with brokerId {broker_id} "
                             f"(its brokerIds: {known})")
        ext: dict[str, Any] = {"brokerName": broker_name, "brokerId": broker_id, "brokerRole": role}
        if force:
            ext["force"] = True
        resp = await self.api.invoke(addr, RequestCode.PROMOTE_BROKER, ext, timeout_ms=self.timeout_ms)
        answer = resp.ext
        return BrokerPromoteResult(broker_name, str(addr), str(answer.get("brokerRole", role)),
                                   int(answer.get("masterEpoch", 0)), int(answer.get("brokerEpoch", 0)),
                                   int(answer.get("maxOffset", 0)))

    async def cluster_list(self) -> ClusterList:
        """The brokers the name server knows, by cluster, with when each last registered."""
        info = await self.cluster_info_raw()
        live = info.get("brokerLiveTable") or {}
        topics = info.get("brokerTopicTable") or {}
        table = info.get("brokerAddrTable") or {}
        # HA roles and replication lag (issue 15): each broker's runtime info, asked concurrently
        addrs = {str(a): str(a) for bd in table.values() for a in ((bd or {}).get("brokerAddrs") or {}).values()}
        runtime = await _each(addrs, lambda a, _: self.api.get_broker_runtime_info(a, timeout_ms=self.timeout_ms))
        clusters = []
        for cluster, names in sorted((info.get("clusterAddrTable") or {}).items()):
            brokers = []
            for name in sorted(names or []):
                for bid, addr in sorted(((table.get(name) or {}).get("brokerAddrs") or {}).items(),
                                        key=lambda kv: int(kv[0])):
                    li = live.get(addr) or {}
                    rt = runtime.get(str(addr))
                    ha = (rt.get("ha") if isinstance(rt, dict) else None) or {}
                    brokers.append(ClusterBroker(
                        name, int(bid), addr, li.get("lastUpdateTimestamp"), li.get("ageMs"),
                        len(topics.get(name) or []), list(topics.get(name) or []),
                        role=ha.get("brokerRole"), master_epoch=ha.get("masterEpoch", li.get("masterEpoch")),
                        lag_bytes=ha.get("lagBytes"), lag_seconds=ha.get("lagSeconds"), slaves=ha.get("slaves"),
                        master_connected=ha.get("masterConnected"),
                        error=str(rt) if isinstance(rt, Exception) else None,
                        offsets_sync_age_ms=ha.get("offsetsSyncAgeMs")))
            clusters.append(ClusterEntry(cluster, brokers))
        return ClusterList(clusters)


@asynccontextmanager
async def open_admin(config: ClientConfig | str, *, timeout_ms: int = 5000) -> AsyncIterator[Admin]:
    """An :class:`Admin` with connections of its own, closed when the block ends.

    ``config`` is a name server address list (``"host:port;host:port"``) or a
    :class:`~trimq.client.config.ClientConfig`, whose TLS settings and ACL credentials are used.
    """
    if isinstance(config, str):
        config = ClientConfig(namesrv_addr=config)
    ssl_context = None
    if config.tls_enable:
        from trimq.runtime.tls import client_ssl_context

        ssl_context = client_ssl_context(config.tls_ca_file or None, config.tls_cert_file or None,
                                         config.tls_key_file or None)
    async with RemotingClient(default_timeout_s=timeout_ms / 1000, connect_timeout_s=timeout_ms / 1000,
                              ssl_context=ssl_context, credentials=config.credentials) as rc:
        yield Admin(MQClientAPI(rc, timeout_ms=timeout_ms), config.namesrv_addrs, timeout_ms)
