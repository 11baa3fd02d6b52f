"""Admin requests the broker answers by asking its consumers: RocketMQ's Broker2Client paths, plus topic stats.

``AdminForwardService`` registers:

* GET_CONSUMER_RUNNING_INFO (307) from an admin tool: forwarded to member ``clientId`` of ``consumerGroup``
  over that client's own connection (``consumer_manager.find_channel``); the client's answer is passed back
  (RocketMQ's AdminBrokerProcessor.getConsumerRunningInfo / callConsumer).
* SKIP_MESSAGE (9004) from an admin tool: forwarded to the member holding the queue — the live lock owner
  for an orderly group, else the member whose running info lists the queue (DESIGN.md §6.5) — which
  dead-letters that one message and moves on.
* INVOKE_BROKER_TO_RESET_OFFSET (222): RocketMQ's resetOffsetByTime. The broker computes each queue's offset
  for the timestamp, writes it into its offset table itself (``offset_manager.reset_offset``: the reset comes
  from the broker, so it bypasses fencing) and persists the table; when the group has live members, each one
  gets RESET_CONSUMER_CLIENT_OFFSET (220) with the table and drops its process queues of those queues, sets
  the offsets in its offset store, persists them and rebalances (client/admin_handlers.py), so in-flight
  consumption cannot write an old position back over the reset.
* GET_TOPIC_STATS_INFO (202): per queue min offset, max offset and the store time of the last message.

Wire fields: docs/PROTOCOL.md §4. Offsets are written synchronously before the first checkpoint of a
handler, so an admin that disconnects mid-request (cancelling the handler) never leaves half a reset.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import trio

from trimq.broker.deps import (
    ConsumerChannels,
    ConsumerOffsets,
    HandlerRegistry,
    LockOwners,
    OffsetPersister,
    QueueOffsets,
    Topics,
)
from trimq.broker.services import HandlerService
from trimq.protocol.codes import RequestCode, ResponseCode, code_name
from trimq.protocol.command import RemotingCommand
from trimq.protocol.errors import RequestError
from trimq.protocol.fields import int_field, str_field
from trimq.protocol.message_queue import MessageQueue
from trimq.protocol.validation import InvalidNameError, check_group, check_topic
from trimq.runtime.logs import get_logger
from trimq.runtime.server import ConnectionClosedError

if TYPE_CHECKING:
    from trimq.runtime.server import Connection

log = get_logger("trimq.broker.admin_forward")

__all__ = ["AdminForwardService", "compute_reset_offsets"]

# The defaults of the broker settings admin_running_info_timeout_ms, admin_skip_message_timeout_ms and
# admin_reset_offset_timeout_ms (broker/config.py), in seconds.
RUNNING_INFO_TIMEOUT_S = 5.0
"""How long a member may take to answer GET_CONSUMER_RUNNING_INFO (RocketMQ: 5 s)."""
SKIP_TIMEOUT_S = 15.0
"""How long a member may take to skip a message (it waits up to 5 s for the queue's batch, then sends back)."""
RESET_TIMEOUT_S = 10.0
"""How long a member may take to apply RESET_CONSUMER_CLIENT_OFFSET."""


def _name(where: str, ext: dict[str, Any], field: str, kind: str, *, required: bool = True) -> str | None:
    value = ext.get(field)
    if value is None or value == "":
        if required:
            raise RequestError(ResponseCode.SYSTEM_ERROR, f"{where}: header field {field!r} is missing")
        return None
    try:
        return check_group(value) if kind == "group" else check_topic(value)
    except InvalidNameError as exc:
        raise RequestError(ResponseCode.SYSTEM_ERROR, f"{where}: header field {field!r}: {exc}") from None


def _bool_field(where: str, ext: dict[str, Any], field: str, default: bool) -> bool:
    value = ext.get(field)
    if value is None:
        return default
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"  # RocketMQ's extFields are strings
    raise RequestError(ResponseCode.SYSTEM_ERROR, f"{where}: header field {field!r} must be a boolean, got {value!r}")


def compute_reset_offsets(
    *, queue_ids: range, timestamp: int, force: bool, by_time: Any, max_offset: Any, consumer_offset: Any
) -> list[tuple[int, int, int]]:
    """RocketMQ's Broker2Client.resetOffset rule, per queue: ``(queue_id, new offset, previous offset)``.

    The offset for ``timestamp`` is ``by_time(qid, timestamp)`` (the max offset for -1). With ``force`` that
    offset is taken; without, only when it is behind the group's offset (a reset never moves a group
    forward) or the group has none (previous -1).
    """
    out = []
    for qid in queue_ids:
        target = int(max_offset(qid)) if timestamp < 0 else int(by_time(qid, timestamp))
        previous = int(consumer_offset(qid))
        new = target if force or previous < 0 or target < previous else previous
        out.append((qid, new, previous))
    return out


class AdminForwardService(HandlerService):
    """Broker -> client admin paths (307, 9004, 222) and GET_TOPIC_STATS_INFO (a broker service)."""

    name = "admin_forward"

    def __init__(self, *, registry: HandlerRegistry, broker_name: str, store: QueueOffsets, topics: Topics,
                 offsets: ConsumerOffsets, offset_persister: OffsetPersister, consumers: ConsumerChannels,
                 locks: LockOwners, running_info_timeout_s: float = RUNNING_INFO_TIMEOUT_S,
                 skip_timeout_s: float = SKIP_TIMEOUT_S, reset_timeout_s: float = RESET_TIMEOUT_S) -> None:
        self.broker_name = broker_name
        self.running_info_timeout_s = running_info_timeout_s
        self.skip_timeout_s = skip_timeout_s
        self.reset_timeout_s = reset_timeout_s
        self.store = store
        self.topics = topics
        self.offsets = offsets
        self.offset_persister = offset_persister
        self.consumers = consumers
        self.locks = locks
        #: Counters for metrics and tests.
        self.stats: dict[str, int] = {"running_info_forwarded": 0, "skips_forwarded": 0, "resets": 0,
                                      "reset_notifications": 0, "forward_failures": 0}
        reg = registry.register
        reg(RequestCode.GET_CONSUMER_RUNNING_INFO, self.get_consumer_running_info)
        reg(RequestCode.SKIP_MESSAGE, self.skip_message)
        reg(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, self.invoke_broker_to_reset_offset)
        reg(RequestCode.GET_TOPIC_STATS_INFO, self.get_topic_stats_info)

    # ------------------------------------------------------------------ helpers

    async def _call_client(self, conn: Connection, code: int, ext: dict[str, Any], body: Any,
                           timeout_s: float, what: str) -> RemotingCommand:
        """One broker -> client request; RequestError(SYSTEM_ERROR) when the client does not answer."""
        try:
            return await conn.request(RemotingCommand.request(code, ext, body), timeout_s)
        except trio.TooSlowError:
            self.stats["forward_failures"] += 1
            raise RequestError(ResponseCode.SYSTEM_ERROR,
                               f"{what}: the client did not answer {code_name(code, response=False)} "
                               f"within {timeout_s:g} s") from None
        except ConnectionClosedError:
            self.stats["forward_failures"] += 1
            raise RequestError(ResponseCode.SYSTEM_ERROR,
                               f"{what}: the client's connection closed before it answered") from None

    def _channel(self, group: str, client_id: str) -> Connection:
        conn = self.consumers.find_channel(group, client_id)
        if conn is None:
            raise RequestError(ResponseCode.CONSUMER_NOT_ONLINE,
                               f"The Consumer <{group}> <{client_id}> not online")
        return conn  # type: ignore[no-any-return]

    @staticmethod
    def _passed_back(cmd: RemotingCommand, resp: RemotingCommand, **extra: Any) -> RemotingCommand:
        body = resp.body
        if extra and isinstance(body, dict):
            body = {**body, **{k: v for k, v in extra.items() if k not in body}}
        return RemotingCommand.response_to(cmd, resp.code, resp.remark, ext=dict(resp.ext or {}), body=body)

    # ------------------------------------------------------------------ GET_CONSUMER_RUNNING_INFO (307)

    async def get_consumer_running_info(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        """307: ask member ``clientId`` of ``consumerGroup`` for its running info and pass the answer back."""
        where = "GET_CONSUMER_RUNNING_INFO"
        ext = cmd.ext or {}
        group = _name(where, ext, "consumerGroup", "group")
        assert group is not None
        client_id = str_field(ext, "clientId")
        target = self._channel(group, client_id)
        fwd = {"consumerGroup": group, "clientId": client_id}
        if "jstackEnable" in ext:
            fwd["jstackEnable"] = ext["jstackEnable"]
        resp = await self._call_client(target, RequestCode.GET_CONSUMER_RUNNING_INFO, fwd, None,
                                       self.running_info_timeout_s, f"consumer {client_id} of group {group}")
        self.stats["running_info_forwarded"] += 1
        return self._passed_back(cmd, resp)

    async def running_info(self, group: str, client_id: str, conn: Connection) -> dict[str, Any] | None:
        """A member's running info, or None when it cannot be had (used to find the holder of a queue)."""
        try:
            resp = await self._call_client(conn, RequestCode.GET_CONSUMER_RUNNING_INFO,
                                           {"consumerGroup": group, "clientId": client_id}, None,
                                           self.running_info_timeout_s, f"consumer {client_id}")
        except RequestError:
            return None
        if resp.code != ResponseCode.SUCCESS or not isinstance(resp.body, dict):
            return None
        return resp.body

    # ------------------------------------------------------------------ SKIP_MESSAGE (9004)

    async def skip_message(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        """9004 from an admin: forward to the member holding ``topic`` queue ``queueId`` of this broker."""
        where = "SKIP_MESSAGE"
        ext = cmd.ext or {}
        group = _name(where, ext, "consumerGroup", "group")
        topic = _name(where, ext, "topic", "topic")
        assert group is not None and topic is not None
        queue_id = int_field(ext, "queueId")
        offset = int_field(ext, "queueOffset")
        if queue_id < 0 or offset < 0:
            raise RequestError(ResponseCode.SYSTEM_ERROR, f"{where}: queueId and queueOffset must be >= 0")
        broker_name = ext.get("brokerName") or self.broker_name
        if broker_name != self.broker_name:
            raise RequestError(ResponseCode.SYSTEM_ERROR,
                               f"{where}: brokerName {broker_name!r} is not this broker ({self.broker_name}); "
                               f"send the request to the broker that hosts the queue")
        mq = MessageQueue(topic, self.broker_name, queue_id)
        client_id, target, how = await self._queue_holder(group, mq, ext.get("clientId"))
        fwd = {"consumerGroup": group, "topic": topic, "brokerName": self.broker_name, "queueId": queue_id,
               "queueOffset": offset}
        resp = await self._call_client(target, RequestCode.SKIP_MESSAGE, fwd, None, self.skip_timeout_s,
                                       f"consumer {client_id} of group {group}")
        self.stats["skips_forwarded"] += 1
        log.warning("admin.skip_forwarded", group=group, mq=str(mq), offset=offset, client_id=client_id, found_by=how,
                    code=code_name(resp.code, response=True), remark=resp.remark, remote=conn.remote)
        return self._passed_back(cmd, resp, clientId=client_id, foundBy=how)

    async def _queue_holder(self, group: str, mq: MessageQueue, wanted: Any) -> tuple[str, Connection, str]:
        """(client id, connection, how it was found) of the member to send a skip for ``mq`` to."""
        cm = self.consumers
        members = cm.member_connections(group)
        if not members:
            raise RequestError(ResponseCode.CONSUMER_NOT_ONLINE, f"the consumer group [{group}] is not online")
        if isinstance(wanted, str) and wanted:
            return wanted, self._channel(group, wanted), "clientId"
        if cm.is_orderly(group):
            owner = self.locks.live_owner(group, mq)
            if owner is not None:
                owner_conn = cm.find_channel(group, owner)
                if owner_conn is not None:
                    return owner, owner_conn, "lock"
        # Concurrently (or an orderly queue nobody holds a live lock on): ask every member what it holds.
        found: list[tuple[str, Connection]] = []

        async def ask(cid: str, c: Connection) -> None:
            info = await self.running_info(group, cid, c)
            for row in (info or {}).get("mqTable") or []:
                try:
                    held = MessageQueue.from_wire(row.get("mq"))
                except (ValueError, AttributeError):
                    continue
                pq = row.get("processQueueInfo") or {}
                if held == mq and not pq.get("dropped", False):
                    found.append((cid, c))

        async with trio.open_nursery() as nursery:
            for cid, c in members:
                nursery.start_soon(ask, cid, c)
        if not found:
            raise RequestError(ResponseCode.SYSTEM_ERROR,
                               f"no live member of group {group} holds {mq.topic} queue {mq.queue_id} of "
                               f"{mq.broker_name} (members: {', '.join(cid for cid, _ in members)})")
        cid, c = sorted(found, key=lambda f: f[0])[0]
        return cid, c, "runningInfo"

    # ------------------------------------------------------------------ INVOKE_BROKER_TO_RESET_OFFSET (222)

    async def invoke_broker_to_reset_offset(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        """222: reset ``group``'s offsets of ``topic`` on this broker to ``timestamp`` (see the module doc)."""
        where = "INVOKE_BROKER_TO_RESET_OFFSET"
        ext = cmd.ext or {}
        topic = _name(where, ext, "topic", "topic")
        group = _name(where, ext, "group", "group")
        assert topic is not None and group is not None
        timestamp = int_field(ext, "timestamp")
        force = _bool_field(where, ext, "isForce", True)
        dry_run = _bool_field(where, ext, "dryRun", False)  # trimq: the plan only, nothing changed or told
        tc = self.topics.get(topic)
        if tc is None:
            raise RequestError(ResponseCode.TOPIC_NOT_EXIST,
                               f"[reset-offset] reset offset failed, no topic in this broker. topic={topic}")
        store = self.store
        om = self.offsets
        rows = compute_reset_offsets(
            queue_ids=range(tc.read_queue_nums), timestamp=timestamp, force=force,
            by_time=lambda q, ts: store.get_offset_in_queue_by_time(topic, q, ts),
            max_offset=lambda q: store.get_max_offset_in_queue(topic, q),
            consumer_offset=lambda q: om.query_offset(group, topic, q),
        )
        if dry_run:
            return RemotingCommand.response_to(cmd, body={
                "consumerGroup": group, "topic": topic, "timestamp": timestamp, "isForce": force, "dryRun": True,
                "online": bool(self.consumers.member_connections(group)), "persisted": False, "clients": [],
                "resetGeneration": om.reset_generation(group, topic),
                "offsetTable": [{"mq": MessageQueue(topic, self.broker_name, qid).to_wire(), "offset": new,
                                 "previousOffset": previous} for qid, new, previous in rows]})
        # Written here, synchronously, before any checkpoint: the broker's table is authoritative at once,
        # for an offline group and for queues no member holds. A new reset generation first: from now on a
        # commit made before this reset (a oneway one on the wire, a member not told) is refused (issue 19).
        generation = om.bump_reset_generation(group, topic)
        for qid, new, _previous in rows:
            om.reset_offset(group, topic, qid, new)
        self.stats["resets"] += 1
        persisted = await self._persist_offsets()
        table = [{"mq": MessageQueue(topic, self.broker_name, qid).to_wire(), "offset": new} for qid, new, _ in rows]
        members = self.consumers.member_connections(group)
        clients: list[dict[str, Any]] = []
        if members:
            fwd = {"topic": topic, "group": group, "timestamp": timestamp, "isForce": force,
                   "resetGeneration": generation}

            async def notify(cid: str, c: Connection) -> None:
                entry: dict[str, Any] = {"clientId": cid, "ok": False, "remark": None, "queues": []}
                clients.append(entry)
                try:
                    resp = await self._call_client(c, RequestCode.RESET_CONSUMER_CLIENT_OFFSET, fwd,
                                                   {"offsetTable": table}, self.reset_timeout_s, f"consumer {cid}")
                except RequestError as exc:
                    entry["remark"] = exc.remark
                    return
                entry["ok"] = resp.code == ResponseCode.SUCCESS
                entry["remark"] = resp.remark
                if isinstance(resp.body, dict):
                    entry["queues"] = resp.body.get("queues") or []
                self.stats["reset_notifications"] += 1

            async with trio.open_nursery() as nursery:
                for cid, c in members:
                    nursery.start_soon(notify, cid, c)
            clients.sort(key=lambda e: e["clientId"])
        log.warning("admin.offset_reset", group=group, topic=topic, timestamp=timestamp, force=force,
                    queues={qid: [previous, new] for qid, new, previous in rows}, online=bool(members),
                    clients=[(c["clientId"], c["ok"]) for c in clients], remote=conn.remote)
        body = {
            "consumerGroup": group,
            "topic": topic,
            "timestamp": timestamp,
            "isForce": force,
            "online": bool(members),
            "persisted": persisted,
            "resetGeneration": generation,
            "offsetTable": [
                {"mq": MessageQueue(topic, self.broker_name, qid).to_wire(), "offset": new, "previousOffset": previous}
                for qid, new, previous in rows
            ],
            "clients": clients,
        }
        return RemotingCommand.response_to(cmd, body=body)

    async def _persist_offsets(self) -> bool:
        # The coordination service owns the offset file; ask it to write now rather than within 5 s.
        try:
            return bool(await self.offset_persister.persist_offsets())
        except OSError as exc:
            log.error("admin.offset_persist_failed", error=str(exc))
            return False

    # ------------------------------------------------------------------ GET_TOPIC_STATS_INFO (202)

    async def get_topic_stats_info(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        """202: RocketMQ's TopicStatsTable — min offset, max offset and last store time of each queue."""
        topic = _name("GET_TOPIC_STATS_INFO", cmd.ext or {}, "topic", "topic")
        assert topic is not None
        tc = self.topics.get(topic)
        if tc is None:
            raise RequestError(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
        store = self.store
        rows = []
        for qid in range(max(tc.read_queue_nums, tc.write_queue_nums)):
            max_offset = store.get_max_offset_in_queue(topic, qid)
            last = store.get_store_timestamp(topic, qid, max_offset - 1) if max_offset > 0 else None
            rows.append({
                "mq": MessageQueue(topic, self.broker_name, qid).to_wire(),
                "minOffset": store.get_min_offset_in_queue(topic, qid),
                "maxOffset": max_offset,
                "lastUpdateTimestamp": int(last or 0),
            })
        return RemotingCommand.response_to(cmd, body={"offsetTable": rows})
