"""``trimq-admin``: administer topics, consumer groups, dead letters and the cluster (RocketMQ's mqadmin).

::

    trimq-admin --namesrv 127.0.0.1:9876 topic list
    trimq-admin --namesrv 127.0.0.1:9876 --json consumer progress -g orders

Every command asks the name server for the brokers (or the topic's route) and then the brokers; tables for
people, ``--json`` for scripts (one JSON document on stdout). Errors go to stderr as ``trimq-admin: error:
...`` with exit status 1 (2 for a usage error). docs/ADMIN.md shows every command with its output.

The operations are methods of :class:`Admin` (async, returning the JSON document), so they can be used from
trio code too; the click commands run them with ``trio.run`` and print them with the renderers of
:mod:`trimq.client.admin_format`.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar

import click
import trio

from trimq.client import admin_format as fmt
from trimq.client.admin_allocate import allocate_command
from trimq.client.api import MQClientAPI, PullStatus
from trimq.client.errors import MQBrokerError, MQClientError, TopicNotExistError, TrimqClientError
from trimq.client.remoting import RemotingClient, RemotingError
from trimq.protocol.codes import RequestCode, ResponseCode
from trimq.protocol.message import MessageConst, MessageExt
from trimq.protocol.message_queue import MessageQueue
from trimq.protocol.validation import InvalidNameError, check_group, check_topic, dlq_topic

__all__ = ["Admin", "AdminError", "PartialFailure", "main"]

T = TypeVar("T")

TOOLS_CONSUMER_GROUP = "TOOLS_CONSUMER"
"""The group name of the admin's own pulls (``message show --offset``), RocketMQ's MixAll.TOOLS_CONSUMER_GROUP."""
FORWARD_EXTRA_MS = 6_000
"""Added to the timeout of requests the broker forwards to a consumer (it waits up to 5 s for the consumer)."""
SKIP_TIMEOUT_MS = 20_000
RESET_TIMEOUT_MS = 30_000
ROUTE_WAIT_S = 5.0
DLQ_PAGE = 256


class AdminError(MQClientError):
    """A command cannot do what was asked; the message says why (printed on stderr, exit status 1)."""


class PartialFailure(AdminError):
    """Some of the work failed: the document is still printed, then the message, exit status 1."""

    def __init__(self, message: str, document: dict[str, Any]) -> None:
        super().__init__(message)
        self.document = document


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


def _mq_fields(m: Any) -> dict[str, Any]:
    """``topic``, ``brokerName``, ``queueId`` of a wire message queue (tolerant of junk: the admin only shows it)."""
    m = m if isinstance(m, dict) else {}
    return {"topic": m.get("topic"), "brokerName": m.get("brokerName"), "queueId": m.get("queueId")}


def _message_document(msg: MessageExt, broker_name: str | None) -> dict[str, Any]:
    text, encoding = fmt.body_text(msg.body)
    props = dict(sorted(msg.properties.items()))
    return {
        "brokerName": broker_name,
        "msgId": msg.msg_id,
        "uniqKey": props.get(MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX),
        "topic": msg.topic,
        "queueId": msg.queue_id,
        "queueOffset": msg.queue_offset,
        "commitLogOffset": msg.commit_log_offset,
        "tags": msg.tags,
        "keys": msg.keys,
        "bornTimestamp": msg.born_timestamp,
        "bornHost": f"{msg.born_host[0]}:{msg.born_host[1]}",
        "storeTimestamp": msg.store_timestamp,
        "storeHost": f"{msg.store_host[0]}:{msg.store_host[1]}",
        "reconsumeTimes": msg.reconsume_times,
        "flag": msg.flag,
        "sysFlag": msg.sys_flag,
        "storeSize": msg.store_size,
        "bodyCRC": msg.body_crc,
        "properties": props,
        "bodySize": len(msg.body),
        "bodyEncoding": encoding,
        "body": text,
    }


@dataclass
class Admin:
    """The operations behind ``trimq-admin`` (each returns the command's JSON document)."""

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
        body = await self._namesrv(lambda a: self.api.admin_query(a, RequestCode.GET_BROKER_CLUSTER_INFO))
        if not isinstance(body, dict):
            raise AdminError("the name server answered GET_BROKER_CLUSTER_INFO without a body")
        return body

    async def brokers(self) -> dict[str, str]:
        """Broker name -> address of its master (else any address), for every broker the name server knows."""
        table = (await self.cluster_info_raw()).get("brokerAddrTable") or {}
        out: dict[str, str] = {}
        for name, bd in sorted(table.items()):
            addrs = (bd or {}).get("brokerAddrs") or {}
            addr = addrs.get("0") or addrs.get(0) or next(iter(addrs.values()), None)
            if addr:
                out[str(name)] = str(addr)
        if not out:
            raise AdminError(f"the name server ({'; '.join(self.namesrv_addrs)}) knows no broker")
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
            raise click.UsageError(f"topic {topic} is on several brokers ({', '.join(brokers)}): "
                                   f"name one with --broker")
        return next(iter(brokers.items()))

    @staticmethod
    def _warn(errors: dict[str, Exception], what: str) -> list[dict[str, str]]:
        out = []
        for name, exc in errors.items():
            click.echo(f"trimq-admin: warning: {what} of broker {name}: {exc}", err=True)
            out.append({"brokerName": name, "error": str(exc)})
        return out

    # ------------------------------------------------------------------ topics

    async def topic_list(self) -> dict[str, Any]:
        topics = await self._namesrv(lambda a: self.api.get_all_topic_list(a, timeout_ms=self.timeout_ms))
        configs = await _each(await self.brokers(), lambda _n, a: self.api.get_all_topic_config(a))
        errors = self._warn({n: r for n, r in configs.items() if isinstance(r, Exception)}, "topic configs")
        rows = []
        for topic in sorted(topics):
            rows.append({"topic": topic, "brokers": [
                {"brokerName": name, "readQueueNums": cfg[topic].read_queue_nums,
                 "writeQueueNums": cfg[topic].write_queue_nums, "perm": cfg[topic].perm}
                for name, cfg in configs.items() if not isinstance(cfg, Exception) and topic in cfg
            ]})
        return {"topics": rows, "errors": errors}

    async def topic_create(self, topic: str, queues: int, perm: int, brokers: Iterable[str] = (),
                           cluster: str | None = None, wait: bool = True) -> dict[str, Any]:
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
        targets = {n: known[n] for n in (wanted or known)}
        results = await _each(targets, lambda _n, a: self.api.create_topic(
            a, topic, read_queue_nums=queues, write_queue_nums=queues, perm=perm, timeout_ms=self.timeout_ms))
        failed = {n: r for n, r in results.items() if isinstance(r, Exception)}
        doc: dict[str, Any] = {
            "topic": topic, "readQueueNums": queues, "writeQueueNums": queues, "perm": perm,
            "permText": fmt.perm_text(perm),
            "brokers": [{"brokerName": n, "brokerAddr": a} for n, a in targets.items() if n not in failed],
            "routed": False,
        }
        if failed:
            doc["errors"] = [{"brokerName": n, "error": str(e)} for n, e in failed.items()]
            raise PartialFailure(f"topic {topic} could not be created on {', '.join(failed)}", doc)
        if wait:
            doc["routed"] = await self._wait_route(topic, set(targets), queues)
        return doc

    async def _wait_route(self, topic: str, brokers: set[str], queues: int) -> bool:
        """Wait (bounded) until the name server routes ``topic`` to every broker with ``queues`` queues: the
        brokers re-register right after a topic change, so scripts can use the topic at once."""
        with trio.move_on_after(ROUTE_WAIT_S):
            while True:
                try:
                    route = await self._namesrv(lambda a: self.api.get_topic_route(a, topic))
                    have = {q.broker_name for q in route.queue_datas if q.read_queue_nums == queues}
                    if brokers <= have:
                        return True
                except (MQBrokerError, AdminError):
                    pass
                await trio.sleep(0.1)
        return False

    async def topic_status(self, topic: str) -> dict[str, Any]:
        brokers = await self.route_brokers(topic)
        stats = await _each(brokers, lambda _n, a: self.api.admin_query(
            a, RequestCode.GET_TOPIC_STATS_INFO, {"topic": topic}, timeout_ms=self.timeout_ms))
        errors = self._warn({n: r for n, r in stats.items() if isinstance(r, Exception)}, "topic stats")
        rows = []
        for name, body in stats.items():
            if isinstance(body, Exception):
                continue
            for r in (body or {}).get("offsetTable") or []:
                mq = _mq_fields(r.get("mq"))
                lo, hi = int(r.get("minOffset", 0)), int(r.get("maxOffset", 0))
                rows.append({"brokerName": mq["brokerName"] or name, "queueId": mq["queueId"], "minOffset": lo,
                             "maxOffset": hi, "messages": max(0, hi - lo),
                             "lastUpdateTimestamp": int(r.get("lastUpdateTimestamp") or 0)})
        rows.sort(key=lambda r: (r["brokerName"], r["queueId"]))
        if not rows and errors:
            raise AdminError(f"no broker of topic {topic} answered: {errors[0]['error']}")
        return {"topic": topic, "queues": rows, "totalMessages": sum(r["messages"] for r in rows), "errors": errors}

    # ------------------------------------------------------------------ consumer groups

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

    async def consumer_connections(self, group: str) -> dict[str, Any]:
        name, _addr, body = await self._group_broker(group)
        return {"brokerName": name, **body}

    async def _running_info(self, addr: str, group: str, client_id: str) -> dict[str, Any]:
        body = await self.api.admin_query(addr, RequestCode.GET_CONSUMER_RUNNING_INFO,
                                          {"consumerGroup": group, "clientId": client_id},
                                          timeout_ms=self.timeout_ms + FORWARD_EXTRA_MS)
        if not isinstance(body, dict):
            raise AdminError(f"consumer {client_id} answered GET_CONSUMER_RUNNING_INFO without a body")
        return body

    async def consumer_status(self, group: str, client_id: str | None = None) -> dict[str, Any]:
        name, addr, conns = await self._group_broker(group)
        ids = [c.get("clientId") for c in conns.get("connectionSet") or [] if c.get("clientId")]
        if client_id is not None:
            if client_id not in ids:
                raise AdminError(f"client {client_id} is not a member of group {group} (members: {', '.join(ids)})")
            ids = [client_id]
        infos = await _each({cid: cid for cid in ids}, lambda cid, _: self._running_info(addr, group, cid))
        clients = [{"clientId": cid, **info} for cid, info in infos.items() if not isinstance(info, Exception)]
        errors = [{"clientId": cid, "error": str(e)} for cid, e in infos.items() if isinstance(e, Exception)]
        doc = {"consumerGroup": group, "brokerName": name, "clients": clients, "errors": errors}
        if errors:
            raise PartialFailure(f"{len(errors)} of {len(ids)} member(s) did not report their running info: "
                                 + "; ".join(f"{e['clientId']}: {e['error']}" for e in errors), doc)
        return doc

    async def _queue_owners(self, group: str) -> tuple[bool, dict[tuple[str, str, int], str]]:
        """(online, (topic, broker, queue id) -> client id) from the running info of every member (best
        effort: a member that does not answer owns nothing here)."""
        try:
            _name, addr, conns = await self._group_broker(group)
        except AdminError:
            return False, {}
        ids = [c.get("clientId") for c in conns.get("connectionSet") or [] if c.get("clientId")]
        infos = await _each({cid: cid for cid in ids}, lambda cid, _: self._running_info(addr, group, cid))
        owners: dict[tuple[str, str, int], str] = {}
        for cid, info in infos.items():
            if isinstance(info, Exception):
                continue
            for row in info.get("mqTable") or []:
                mq = _mq_fields(row.get("mq"))
                if not (row.get("processQueueInfo") or {}).get("dropped"):
                    owners[(mq["topic"], mq["brokerName"], mq["queueId"])] = cid
        return True, owners

    async def consumer_progress(self, group: str, topic: str | None = None) -> dict[str, Any]:
        brokers = await self.brokers()
        stats = await _each(brokers, lambda _n, a: self.api.get_consume_stats(a, group, topic,
                                                                              timeout_ms=self.timeout_ms))
        errors = self._warn({n: r for n, r in stats.items()
                             if isinstance(r, Exception) and not isinstance(r, TopicNotExistError)}, "consume stats")
        bodies = {n: b for n, b in stats.items() if isinstance(b, dict)}
        orderly = any(b.get("orderly") for b in bodies.values())
        online, owners = await self._queue_owners(group)
        rows = []
        for name, body in bodies.items():
            for r in body.get("offsetTable") or []:
                mq = _mq_fields(r.get("mq"))
                key = (mq["topic"], mq["brokerName"] or name, mq["queueId"])
                owner = r.get("lockOwner") if orderly else None
                rows.append({
                    "topic": key[0], "brokerName": key[1], "queueId": key[2],
                    "brokerOffset": r.get("brokerOffset"), "consumerOffset": r.get("consumerOffset"),
                    "lag": r.get("lag"), "owner": owner or owners.get(key),
                    "lastTimestamp": r.get("lastTimestamp") or 0,
                    "lastUpdateTimestamp": r.get("lastUpdateTimestamp") or 0,
                })
        if not rows:
            if errors:
                raise AdminError(f"no consume progress for group {group}: {errors[0]['error']}")
            where = f" on topic {topic}" if topic else ""
            raise AdminError(f"no consume progress for group {group}{where}: it has no stored offset and no member "
                             f"subscribes (has it consumed anything?)")
        rows.sort(key=lambda r: (r["topic"] or "", r["brokerName"] or "", r["queueId"] or 0))
        return {
            "consumerGroup": group, "topic": topic, "orderly": orderly, "online": online,
            "totalLag": sum(r["lag"] for r in rows if isinstance(r["lag"], int) and r["lag"] > 0),
            "queues": rows, "errors": errors,
        }

    async def consumer_locks(self, group: str) -> dict[str, Any]:
        tables = await _each(await self.brokers(), lambda _n, a: self.api.get_lock_table(a, group,
                                                                                         timeout_ms=self.timeout_ms))
        errors = self._warn({n: r for n, r in tables.items() if isinstance(r, Exception)}, "lock table")
        locks, per_broker = [], []
        for name, body in tables.items():
            if isinstance(body, Exception):
                continue
            fenced = int(((body.get("fencedUpdates") or {}).get(group)) or 0)
            per_broker.append({"brokerName": name, "maxLiveMs": body.get("maxLiveMs"), "fencedUpdates": fenced,
                               "stats": body.get("stats") or {}})
            for r in body.get("lockTable") or []:
                mq = _mq_fields(r.get("mq"))
                locks.append({"topic": mq["topic"], "brokerName": mq["brokerName"] or name, "queueId": mq["queueId"],
                              "clientId": r.get("clientId"), "lastUpdateTimestamp": r.get("lastUpdateTimestamp"),
                              "ageMs": r.get("ageMs"), "expired": bool(r.get("expired"))})
        locks.sort(key=lambda r: (r["topic"] or "", r["brokerName"] or "", r["queueId"] or 0))
        return {"consumerGroup": group, "locks": locks,
                "fencedUpdates": sum(b["fencedUpdates"] for b in per_broker), "brokers": per_broker,
                "errors": errors}

    async def reset_offset(self, group: str, topic: str, timestamp: int, force: bool = True) -> dict[str, Any]:
        brokers = await self.route_brokers(topic)
        ext = {"topic": topic, "group": group, "timestamp": timestamp, "isForce": force}
        results = await _each(brokers, lambda _n, a: self.api.admin_query(
            a, RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, ext, timeout_ms=max(self.timeout_ms, RESET_TIMEOUT_MS)))
        rows, clients, errors = [], [], []
        for name, body in results.items():
            if isinstance(body, Exception):
                errors.append({"brokerName": name, "error": str(body)})
                continue
            for r in body.get("offsetTable") or []:
                mq = _mq_fields(r.get("mq"))
                rows.append({"brokerName": mq["brokerName"] or name, "queueId": mq["queueId"],
                             "previousOffset": r.get("previousOffset"), "offset": r.get("offset")})
            for c in body.get("clients") or []:
                clients.append({"brokerName": name, "clientId": c.get("clientId"), "ok": bool(c.get("ok")),
                                "remark": c.get("remark"),
                                "queues": sum(1 for q in c.get("queues") or [] if q.get("held"))})
        rows.sort(key=lambda r: (r["brokerName"], r["queueId"]))
        doc = {"consumerGroup": group, "topic": topic, "timestamp": timestamp, "isForce": force,
               "online": bool(clients), "queues": rows, "clients": clients, "errors": errors}
        if errors:
            raise PartialFailure("offsets were not reset on " + "; ".join(
                f"{e['brokerName']}: {e['error']}" for e in errors), doc)
        bad = [c for c in clients if not c["ok"]]
        if bad:
            raise PartialFailure("offsets were reset on the brokers, but these members did not confirm (they may "
                                 "write an older offset back; run the reset again once they are healthy): " +
                                 "; ".join(f"{c['clientId']} via {c['brokerName']}: {c['remark']}" for c in bad), doc)
        return doc

    async def consumer_skip(self, group: str, topic: str, queue_id: int, offset: int, broker: str | None = None,
                            client_id: str | None = None) -> dict[str, Any]:
        name, addr = await self._queue_broker(topic, broker)
        ext = {"consumerGroup": group, "topic": topic, "brokerName": name, "queueId": queue_id,
               "queueOffset": offset, "clientId": client_id}
        body = await self.api.admin_query(addr, RequestCode.SKIP_MESSAGE, ext,
                                          timeout_ms=max(self.timeout_ms, SKIP_TIMEOUT_MS))
        return {"brokerName": name, "deadLetterTopic": dlq_topic(group), **(body if isinstance(body, dict) else {})}

    # ------------------------------------------------------------------ dead letters

    async def dlq_list(self, group: str, limit: int = 1000, include_body: bool = False) -> dict[str, Any]:
        more: list[str] = []

        async def one(name: str, addr: str) -> list[dict[str, Any]]:
            out: list[dict[str, Any]] = []
            offset = 0
            while True:
                if len(out) >= limit:
                    more.append(name)
                    break
                body = await self.api.admin_query(addr, RequestCode.QUERY_DLQ_MESSAGES, {
                    "consumerGroup": group, "offset": offset, "maxNums": min(DLQ_PAGE, limit - len(out)),
                    "includeBody": include_body}, timeout_ms=self.timeout_ms)
                msgs = (body or {}).get("messages") or []
                for m in msgs:
                    entry = {"brokerName": name, **m}
                    if include_body and isinstance(m.get("body"), bytes | bytearray):
                        entry["body"], entry["bodyEncoding"] = fmt.body_text(m["body"])
                    out.append(entry)
                nxt = int((body or {}).get("nextOffset", offset))
                if not msgs or nxt <= offset or nxt >= int((body or {}).get("maxOffset", 0)):
                    break
                offset = nxt
            return out

        results = await _each(await self.brokers(), one)
        errors = self._warn({n: r for n, r in results.items() if isinstance(r, Exception)}, "dead letters")
        messages = [m for r in results.values() if not isinstance(r, Exception) for m in r]
        return {"consumerGroup": group, "topic": dlq_topic(group), "messages": messages[:limit],
                "truncated": bool(more) or len(messages) > limit, "errors": errors}

    async def dlq_resend(self, group: str, msg_ids: list[str] | None) -> dict[str, Any]:
        ext: dict[str, Any] = {"consumerGroup": group}
        if msg_ids:
            ext["msgIds"] = list(msg_ids)
        results = await _each(await self.brokers(), lambda _n, a: self.api.admin_query(
            a, RequestCode.RESEND_DLQ_MESSAGES, ext, timeout_ms=max(self.timeout_ms, RESET_TIMEOUT_MS)))
        errors = [{"brokerName": n, "error": str(r)} for n, r in results.items() if isinstance(r, Exception)]
        bodies = {n: b for n, b in results.items() if isinstance(b, dict)}
        resent = [{"brokerName": n, **r} for n, b in bodies.items() for r in b.get("resent") or []]
        failed: list[dict[str, Any]] = []
        if msg_ids:
            # An id is on one broker: it failed only if no broker resent it (every answering one listed it).
            for mid in dict.fromkeys(msg_ids):
                reports = [(n, f) for n, b in bodies.items() for f in b.get("failed") or [] if f.get("msgId") == mid]
                if bodies and len(reports) == len(bodies):
                    real = [(n, f) for n, f in reports if f.get("queueOffset") is not None] or reports
                    n, f = real[0]
                    failed.append({"brokerName": n, **f})
        else:
            failed = [{"brokerName": n, **f} for n, b in bodies.items() for f in b.get("failed") or []]
        doc = {"consumerGroup": group, "resent": resent, "resentCount": len(resent),
               "skipped": sum(int(b.get("skipped") or 0) for b in bodies.values()), "failed": failed,
               "errors": errors}
        problems = [f"{f.get('msgId') or f.get('queueOffset')}: {f.get('error')}" for f in failed] + \
                   [f"{e['brokerName']}: {e['error']}" for e in errors]
        if problems:
            raise PartialFailure(f"{len(problems)} resend(s) failed: " + "; ".join(problems), doc)
        return doc

    # ------------------------------------------------------------------ messages and cluster

    async def message_by_id(self, msg_id: str) -> dict[str, Any]:
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
        return _message_document(msg, names.get(addr))

    async def message_at(self, topic: str, queue_id: int, offset: int, broker: str | None = None) -> dict[str, Any]:
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
        return _message_document(msg, name)

    async def cluster_list(self) -> dict[str, Any]:
        info = await self.cluster_info_raw()
        live = info.get("brokerLiveTable") or {}
        topics = info.get("brokerTopicTable") or {}
        table = info.get("brokerAddrTable") or {}
        clusters = []
        for cluster, names in sorted((info.get("clusterAddrTable") or {}).items()):
            brokers = []
            for name in sorted(names or []):
                for bid, addr in sorted(((table.get(name) or {}).get("brokerAddrs") or {}).items(),
                                        key=lambda kv: int(kv[0])):
                    li = live.get(addr) or {}
                    brokers.append({"brokerName": name, "brokerId": int(bid), "brokerAddr": addr,
                                    "lastUpdateTimestamp": li.get("lastUpdateTimestamp"), "ageMs": li.get("ageMs"),
                                    "topicCount": len(topics.get(name) or []), "topics": list(topics.get(name) or [])})
            clusters.append({"cluster": cluster, "brokers": brokers})
        return {"clusters": clusters}


# ---------------------------------------------------------------------------------------------- the CLI


@dataclass
class CliOptions:
    namesrv: str | None
    as_json: bool
    timeout_ms: int
    access_key: str | None
    secret_key: str | None
    tls: bool
    tls_ca_file: str | None


def _fail(message: str, status: int = 1) -> NoReturn:
    click.echo(f"trimq-admin: error: {message}", err=True)
    sys.exit(status)


def _check_name(kind: str, value: str, hint: str) -> str:
    try:
        return check_group(value) if kind == "group" else check_topic(value)
    except InvalidNameError as exc:
        raise click.BadParameter(str(exc), param_hint=hint) from None


def _run(op: Callable[[Admin], Awaitable[dict[str, Any]]], render: Callable[[dict[str, Any]], str]) -> None:
    """Run ``op`` against the cluster and print its document (JSON or ``render``); errors exit 1."""
    opts: CliOptions = click.get_current_context().find_object(CliOptions)  # type: ignore[assignment]
    if not opts.namesrv:
        raise click.UsageError("no name server: pass --namesrv HOST:PORT (or set TRIMQ_NAMESRV_ADDR)")
    addrs = [a.strip() for a in opts.namesrv.split(";") if a.strip()]
    if bool(opts.access_key) != bool(opts.secret_key):
        raise click.UsageError("--access-key and --secret-key go together")
    ssl_context = None
    if opts.tls or opts.tls_ca_file:
        from trimq.client.tls import TlsConfigError, client_ssl_context

        try:
            ssl_context = client_ssl_context(opts.tls_ca_file)
        except TlsConfigError as exc:
            raise click.BadParameter(str(exc), param_hint="--tls-ca-file") from None
    credentials = (opts.access_key, opts.secret_key) if opts.access_key and opts.secret_key else None

    async def session() -> dict[str, Any]:
        async with RemotingClient(default_timeout_s=opts.timeout_ms / 1000, connect_timeout_s=opts.timeout_ms / 1000,
                                  ssl_context=ssl_context, credentials=credentials) as rc:
            return await op(Admin(MQClientAPI(rc, timeout_ms=opts.timeout_ms), addrs, opts.timeout_ms))

    def emit(doc: dict[str, Any]) -> None:
        click.echo(fmt.to_json(doc) if opts.as_json else render(doc))

    try:
        doc = trio.run(session)
    except BaseException as raised:
        error = _leaf(raised)  # the client's nursery wraps what the command raised in an exception group
        if isinstance(error, PartialFailure):
            emit(error.document)
            _fail(str(error))
        if isinstance(error, TrimqClientError | RemotingError):
            _fail(str(error))
        if isinstance(error, click.ClickException):
            raise error from None
        if isinstance(error, KeyboardInterrupt):
            _fail("interrupted", 130)
        raise
    emit(doc)


def _leaf(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.option("--namesrv", envvar=["TRIMQ_NAMESRV_ADDR", "NAMESRV_ADDR"], metavar="HOST:PORT",
              help="Name server address (several separated by ';'); env TRIMQ_NAMESRV_ADDR.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document for scripts instead of tables.")
@click.option("--timeout-ms", type=click.IntRange(min=1, max=600_000), default=5000, show_default=True,
              help="Timeout of each request.")
@click.option("--access-key", envvar="TRIMQ_ACCESS_KEY", help="ACL access key (brokers with --acl).")
@click.option("--secret-key", envvar="TRIMQ_SECRET_KEY", help="ACL secret key.")
@click.option("--tls", is_flag=True, help="Connect with TLS (system CAs unless --tls-ca-file).")
@click.option("--tls-ca-file", type=click.Path(dir_okay=False), help="CA file to verify TLS servers with.")
@click.pass_context
def main(ctx: click.Context, namesrv: str | None, as_json: bool, timeout_ms: int, access_key: str | None,
         secret_key: str | None, tls: bool, tls_ca_file: str | None) -> None:
    """Administer a trimq cluster: topics, consumer groups, dead letters, messages, brokers.

    Tables for people, --json for scripts; errors on stderr with exit status 1 (2 for usage errors).
    """
    from trimq.protocol.logs import configure_logging

    configure_logging("auto", os.environ.get("TRIMQ_ADMIN_LOG_LEVEL", "error"))
    ctx.obj = CliOptions(namesrv, as_json, timeout_ms, access_key, secret_key, tls, tls_ca_file)
    if as_json:
        ctx.default_map = {"allocate": {"as_json": True}}  # the group's --json also applies to allocate


main.add_command(allocate_command)

def _json_flag(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        opts = ctx.find_object(CliOptions)
        if opts is not None:
            opts.as_json = True


_JSON = click.option("--json", "as_json", is_flag=True, expose_value=False, callback=_json_flag,
                     help="Print one JSON document (same as trimq-admin --json).")
_GROUP = click.option("-g", "--group", "group", required=True, help="Consumer group.")
_TOPIC = click.option("-t", "--topic", "topic", required=True, help="Topic.")
_BROKER = click.option("-b", "--broker", "broker", help="Broker name (when the topic is on several brokers).")


# --- topic -------------------------------------------------------------------------------------------------


@main.group(name="topic")
def topic_group() -> None:
    """Topics: list, create, status."""


@topic_group.command(name="list")
@_JSON
def topic_list() -> None:
    """Every topic the name server routes, with its queues and permission on each broker."""
    _run(lambda a: a.topic_list(), fmt.render_topic_list)


@topic_group.command(name="create")
@_JSON
@_TOPIC
@click.option("-q", "--queues", type=click.IntRange(min=1, max=1024), default=4, show_default=True,
              help="Read and write queues on each broker.")
@click.option("--perm", default="6", show_default=True, help="Permission: 0..7 or letters (rw, r, w).")
@click.option("-b", "--broker", "brokers", multiple=True, help="Create on this broker only (repeatable).")
@click.option("-c", "--cluster", help="Create on every broker of this cluster.")
@click.option("--wait/--no-wait", default=True, show_default=True,
              help="Wait (up to 5 s) until the name server routes the topic.")
def topic_create(topic: str, queues: int, perm: str, brokers: tuple[str, ...], cluster: str | None,
                 wait: bool) -> None:
    """Create or update TOPIC (default: on every broker the name server knows)."""
    _check_name("topic", topic, "--topic")
    try:
        perm_value = fmt.parse_perm(perm)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--perm") from None
    _run(lambda a: a.topic_create(topic, queues, perm_value, brokers, cluster, wait), fmt.render_topic_create)


@topic_group.command(name="status")
@_JSON
@_TOPIC
def topic_status(topic: str) -> None:
    """Per queue: min offset, max offset, message count and the store time of the last message."""
    _check_name("topic", topic, "--topic")
    _run(lambda a: a.topic_status(topic), lambda d: fmt.render_topic_status(d))


# --- consumer ----------------------------------------------------------------------------------------------


@main.group(name="consumer")
def consumer_group() -> None:
    """Consumer groups: progress, connections, locks, status, reset-offset, skip."""


@consumer_group.command(name="progress")
@_JSON
@_GROUP
@click.option("-t", "--topic", "topic", help="Only this topic (default: every topic of the group, %RETRY% too).")
def consumer_progress(group: str, topic: str | None) -> None:
    """Per queue: broker offset, consumer offset, lag and owner; the group's total lag (RocketMQ's
    consumerProgress)."""
    _check_name("group", group, "--group")
    if topic is not None:
        _check_name("topic", topic, "--topic")
    _run(lambda a: a.consumer_progress(group, topic), lambda d: fmt.render_consumer_progress(d))


@consumer_group.command(name="connections")
@_JSON
@_GROUP
def consumer_connections(group: str) -> None:
    """The group's live members (client id, address, version, last heartbeat) and subscriptions."""
    _check_name("group", group, "--group")
    _run(lambda a: a.consumer_connections(group), lambda d: fmt.render_consumer_connections(d))


@consumer_group.command(name="locks")
@_JSON
@_GROUP
def consumer_locks(group: str) -> None:
    """The brokers' queue locks of the group (owner, age, expired) and fenced offset updates."""
    _check_name("group", group, "--group")
    _run(lambda a: a.consumer_locks(group), lambda d: fmt.render_consumer_locks(d))


@consumer_group.command(name="status")
@_JSON
@_GROUP
@click.option("--client", "client_id", help="Only this member (client id).")
def consumer_status(group: str, client_id: str | None) -> None:
    """Each member's running info, fetched through the broker: process queues, locked and blocked queues,
    consume latency."""
    _check_name("group", group, "--group")
    _run(lambda a: a.consumer_status(group, client_id), lambda d: fmt.render_consumer_status(d, now_ms=_now_ms()))


@consumer_group.command(name="reset-offset")
@_JSON
@_GROUP
@_TOPIC
@click.option("-s", "--timestamp", "timestamp", required=True, metavar="WHEN",
              help="Epoch ms, yyyyMMddHHmmss, ISO 8601, yyyy-MM-dd#HH:mm:ss:SSS, now, or -30m style.")
@click.option("--force/--no-force", default=True, show_default=True,
              help="--no-force only moves a queue back (never skips messages).")
def consumer_reset_offset(group: str, topic: str, timestamp: str, force: bool) -> None:
    """Move the group's offsets of TOPIC to the first message stored at or after a time (RocketMQ's
    resetOffsetByTime). Safe with the group online: members drop the queues and restart from the new offsets."""
    _check_name("group", group, "--group")
    _check_name("topic", topic, "--topic")
    try:
        ts = fmt.parse_timestamp(timestamp, now_ms=_now_ms())
    except fmt.TimestampError as exc:
        raise click.BadParameter(str(exc), param_hint="--timestamp") from None
    _run(lambda a: a.reset_offset(group, topic, ts, force), lambda d: fmt.render_reset_offset(d))


@consumer_group.command(name="skip")
@_JSON
@_GROUP
@_TOPIC
@click.option("-q", "--queue", "queue_id", type=click.IntRange(min=0), required=True, help="Queue id.")
@click.option("--offset", type=click.IntRange(min=0), required=True, help="Queue offset of the message to skip.")
@_BROKER
@click.option("--client", "client_id", help="The member to ask (default: the queue's holder).")
def consumer_skip(group: str, topic: str, queue_id: int, offset: int, broker: str | None,
                  client_id: str | None) -> None:
    """Dead-letter one message a member holds (typically the one an orderly queue is blocked on) and move on."""
    _check_name("group", group, "--group")
    _check_name("topic", topic, "--topic")
    _run(lambda a: a.consumer_skip(group, topic, queue_id, offset, broker, client_id), fmt.render_consumer_skip)


# --- dlq ---------------------------------------------------------------------------------------------------


@main.group(name="dlq")
def dlq_group() -> None:
    """Dead letters of a consumer group (%DLQ%group): list, resend."""


@dlq_group.command(name="list")
@_JSON
@_GROUP
@click.option("--limit", type=click.IntRange(min=1), default=1000, show_default=True, help="At most this many.")
@click.option("--body", "include_body", is_flag=True, help="Include the bodies (text if UTF-8, else hex).")
def dlq_list(group: str, limit: int, include_body: bool) -> None:
    """The group's dead letters, oldest first, with their origin and whether they were resent."""
    _check_name("group", group, "--group")
    _run(lambda a: a.dlq_list(group, limit, include_body), lambda d: fmt.render_dlq_list(d))


@dlq_group.command(name="resend")
@_JSON
@_GROUP
@click.option("--msg-id", "msg_ids", multiple=True, help="A dead letter's id, origin id or unique key (repeatable).")
@click.option("--all", "resend_all", is_flag=True, help="Every dead letter not resent yet.")
def dlq_resend(group: str, msg_ids: tuple[str, ...], resend_all: bool) -> None:
    """Send dead letters back to their original topic (with reconsume times 0)."""
    _check_name("group", group, "--group")
    if bool(msg_ids) == resend_all:
        raise click.UsageError("name the dead letters with --msg-id ID (repeatable) or pass --all, not both")
    _run(lambda a: a.dlq_resend(group, list(msg_ids) or None), fmt.render_dlq_resend)


# --- message / cluster -------------------------------------------------------------------------------------


@main.group(name="message")
def message_group() -> None:
    """Stored messages."""


@message_group.command(name="show")
@_JSON
@click.option("--msg-id", "msg_id", help="Offset message id (the broker's msgId).")
@click.option("-t", "--topic", "topic", help="Topic (with --queue and --offset).")
@click.option("-q", "--queue", "queue_id", type=click.IntRange(min=0), help="Queue id.")
@click.option("--offset", type=click.IntRange(min=0), help="Queue offset.")
@_BROKER
@click.option("--body-file", type=click.Path(dir_okay=False, writable=True), help="Also write the raw body here.")
def message_show(msg_id: str | None, topic: str | None, queue_id: int | None, offset: int | None,
                 broker: str | None, body_file: str | None) -> None:
    """One message, decoded: properties and body (text if UTF-8, else hex)."""
    by_position = (topic, queue_id, offset)
    if msg_id is not None and any(v is not None for v in by_position):
        raise click.UsageError("use --msg-id, or --topic with --queue and --offset, not both")
    if msg_id is None and any(v is None for v in by_position):
        raise click.UsageError("name the message with --msg-id ID, or --topic T --queue Q --offset O")
    if topic is not None:
        _check_name("topic", topic, "--topic")

    async def op(a: Admin) -> dict[str, Any]:
        if msg_id is not None:
            doc = await a.message_by_id(msg_id)
        else:
            assert topic is not None and queue_id is not None and offset is not None
            doc = await a.message_at(topic, queue_id, offset, broker)
        if body_file:
            raw = doc["body"].encode() if doc["bodyEncoding"] == "utf-8" else bytes.fromhex(doc["body"])
            try:
                with open(body_file, "wb") as fh:
                    fh.write(raw)
            except OSError as exc:
                raise AdminError(f"cannot write the body to {body_file}: {exc.strerror or exc}") from None
            doc["bodyFile"] = body_file
        return doc

    _run(op, lambda d: fmt.render_message(d))


@main.group(name="cluster")
def cluster_group() -> None:
    """Brokers known to the name server."""


@cluster_group.command(name="list")
@_JSON
def cluster_list() -> None:
    """Brokers by cluster: address, topics, when each last registered with the name server."""
    _run(lambda a: a.cluster_list(), lambda d: fmt.render_cluster_list(d, now_ms=_now_ms()))
