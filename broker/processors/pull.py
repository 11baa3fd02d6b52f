"""PULL_MESSAGE with long polling (RocketMQ's PullMessageProcessor + DefaultMessageStore.getMessage).

Store status -> response code (RocketMQ 4.9.3 on a master; docs/PROTOCOL.md §4.1):

==========================  ======================  =========================================
store status                response                nextBeginOffset
==========================  ======================  =========================================
FOUND                       SUCCESS                 past the last unit examined
NO_MATCHED_MESSAGE          PULL_RETRY_IMMEDIATELY  past the units filtered out by tag
MESSAGE_WAS_REMOVING        PULL_RETRY_IMMEDIATELY  past the units examined
NO_MATCHED_LOGIC_QUEUE /    PULL_NOT_FOUND if the   0
NO_MESSAGE_IN_QUEUE         offset is 0, else
                            PULL_OFFSET_MOVED
OFFSET_TOO_SMALL            PULL_OFFSET_MOVED       min offset
OFFSET_OVERFLOW_ONE         PULL_NOT_FOUND          the offset (== max offset)
OFFSET_OVERFLOW_BADLY       PULL_OFFSET_MOVED       max offset (RocketMQ: 0 when min is 0)
OFFSET_FOUND_NULL           PULL_NOT_FOUND          the offset
==========================  ======================  =========================================

A PULL_NOT_FOUND with the suspend flag is held (long polling) for min(suspendTimeoutMillis,
suspend_timeout_ms), or ``short_polling_time_ms`` when long polling is off, and answered as soon as the
queue grows. With the commit-offset flag the group's ``commitOffset`` is stored (first pass only, like
RocketMQ's ``brokerAllowSuspend``) in the consumer offsets (the same fencing as UPDATE_CONSUMER_OFFSET).
"""

from __future__ import annotations

import functools
import heapq
import math
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

import trio

from trimq.broker.config import BrokerConfig
from trimq.broker.deps import ConsumerOffsets, MasterEpochs, QueueReader, RequestServer, Topics
from trimq.broker.long_polling import LongPolling
from trimq.broker.store.consume_queue import tags_string_to_tags_code
from trimq.broker.store.store_base import GetMessageResult, GetMessageStatus
from trimq.protocol.codes import RequestCode, ResponseCode
from trimq.protocol.command import RemotingCommand
from trimq.protocol.errors import RequestError
from trimq.protocol.fields import int_field, str_field
from trimq.runtime.logs import RateLimiter, get_logger, log_rate_limited
from trimq.runtime.server import DEFERRED, Deferred

if TYPE_CHECKING:
    from trimq.runtime.server import Connection

log = get_logger("trimq.pull")

__all__ = ["PullService", "parse_subscription"]

SYSFLAG_COMMIT_OFFSET = 0x1
SYSFLAG_SUSPEND = 0x2
SYSFLAG_SUBSCRIPTION = 0x4
SYSFLAG_CLASS_FILTER = 0x8

_RETRY = ResponseCode.PULL_RETRY_IMMEDIATELY
_CODES = {
    GetMessageStatus.FOUND: ResponseCode.SUCCESS,
    GetMessageStatus.NO_MATCHED_MESSAGE: _RETRY,
    GetMessageStatus.MESSAGE_WAS_REMOVING: _RETRY,
    GetMessageStatus.OFFSET_TOO_SMALL: ResponseCode.PULL_OFFSET_MOVED,
    GetMessageStatus.OFFSET_OVERFLOW_BADLY: ResponseCode.PULL_OFFSET_MOVED,
    GetMessageStatus.OFFSET_OVERFLOW_ONE: ResponseCode.PULL_NOT_FOUND,
    GetMessageStatus.OFFSET_FOUND_NULL: ResponseCode.PULL_NOT_FOUND,
}


@functools.lru_cache(maxsize=1024)
def parse_subscription(expression: str | None) -> frozenset[int] | None:
    """Tag expression -> the tags codes to accept, or None for every message ("*", empty).

    ``"TagA || TagB"`` accepts messages whose tags hash is one of the two (RocketMQ's FilterAPI); the
    exact tag is compared by the client, since different tags can share a hash.
    """
    if expression is None:
        return None
    expr = expression.strip()
    if not expr or expr == "*":
        return None
    tags = [t.strip() for t in expr.split("||")]
    tags = [t for t in tags if t]
    if not tags:
        return None
    return frozenset(tags_string_to_tags_code(t) for t in tags)


def _grown(store: QueueReader, topic: str, queue_id: int, offset: int) -> Callable[[], bool]:
    return lambda: store.has_readable(topic, queue_id, offset)


class PullService:
    """Registers PULL_MESSAGE and feeds the long-polling waiting rooms from the store."""

    name = "pull"

    def __init__(self, *, config: BrokerConfig, server: RequestServer, store: QueueReader, topics: Topics,
                 offsets: ConsumerOffsets, long_polling: LongPolling) -> None:
        self.config = config
        self.server = server
        self.store = store
        self.topics = topics
        self.offsets = offsets
        self.long_polling = long_polling
        self.store.read_gate.listeners.append(self.long_polling.notify)  # arrivals once readable (ReadGate)
        #: The master epochs of this broker's log (broker.py wires the HA state): answers say the newest, and a pull
        #: whose position was reached under an older one is checked against where the next one began (_truncated).
        self.epochs: MasterEpochs | None = None
        self._truncated_log = RateLimiter(10_000)
        #: (topic, group) -> [messages, record bytes] returned by pulls, read by broker/metrics.py at scrape time.
        self.get_stats: dict[tuple[str, str], list[int]] = {}
        # A pull is answered in the connection's reading task when it finds messages (or must not wait), and held
        # without a task when it must wait (long polling): the arrival of a message answers it from the
        # sender's append, the expiry loop below answers it on timeout. Only past the per-connection bound of
        # held pulls, or with an authorizer, does a pull get a task of its own (pull_message).
        server.register(RequestCode.PULL_MESSAGE, self.pull_message, fast_path=self.pull_message_fast)
        self._deadlines: list[tuple[float, int, _HeldPull]] = []  # heap; answered entries are skipped
        self._seq = 0
        self._expiry_wakeup = trio.Event()
        self._next_expiry = math.inf

    async def start(self) -> None:
        pass

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._expiry_loop)
            task_status.started()
            # Held pulls must be answered as soon as the broker starts draining, not after their timeout.
            await self.server.wait_shutdown()
            self.long_polling.shutdown()
            nursery.cancel_scope.cancel()

    async def _expiry_loop(self) -> None:
        """Answer held pulls whose time is up (PULL_NOT_FOUND), sleeping until the earliest deadline."""
        heap = self._deadlines
        while True:
            now = trio.current_time()
            while heap and (heap[0][2].done or heap[0][0] <= now):
                _, _, held = heapq.heappop(heap)
                if not held.done:
                    self.long_polling.release(held.topic, held.queue_id, held)
                    held.expire()
            if len(heap) > 1024 and len(heap) > 4 * self.long_polling.held:
                # answered entries linger until their deadline: drop them when they dominate
                self._deadlines = heap = [e for e in heap if not e[2].done]
                heapq.heapify(heap)
            self._next_expiry = heap[0][0] if heap else math.inf
            self._expiry_wakeup = trio.Event()
            with trio.move_on_at(self._next_expiry):
                await self._expiry_wakeup.wait()

    def _hold_fast(self, cmd: RemotingCommand, conn: Connection, group: str, topic: str, queue_id: int,
                   max_nums: int, tag_codes: frozenset[int] | None, result: GetMessageResult) -> bool:
        """Hold a pull without a task (see __init__); False when it must take the task path instead."""
        if self.long_polling.closed or conn.deferred >= self.server.max_inflight_requests:
            return False
        if self.config.long_polling_enable:
            hold_ms = min(max(0, int_field(cmd.ext, "suspendTimeoutMillis", 15_000)), self.config.suspend_timeout_ms)
        else:
            hold_ms = self.config.short_polling_time_ms
        deadline = trio.current_time() + hold_ms / 1000
        held = _HeldPull(self, cmd, conn, group, topic, queue_id, result.next_begin_offset, max_nums, tag_codes,
                         deadline, result)
        conn.defer()
        self.long_polling.hold(topic, queue_id, held)
        self._seq += 1
        heapq.heappush(self._deadlines, (deadline, self._seq, held))
        if deadline < self._next_expiry:
            self._next_expiry = deadline
            self._expiry_wakeup.set()
        return True

    async def stop(self) -> None:
        self.long_polling.shutdown()

    # ------------------------------------------------------------------------------------------------
    def _parse(self, cmd: RemotingCommand, conn: Connection) -> tuple[str, str, int, int, int, int,
                                                                        frozenset[int] | None]:
        """Validate a pull: (group, topic, queue id, offset, max messages, sys flag, tag codes)."""
        ext = cmd.ext
        group = str_field(ext, "consumerGroup")
        topic = str_field(ext, "topic")
        queue_id = int_field(ext, "queueId")
        offset = int_field(ext, "queueOffset")
        max_nums = int_field(ext, "maxMsgNums", 32)
        sys_flag = int_field(ext, "sysFlag", 0)
        if offset < 0:
            raise RequestError(ResponseCode.SYSTEM_ERROR, f"queueOffset {offset} is negative")
        if max_nums < 1:
            raise RequestError(ResponseCode.SYSTEM_ERROR, f"maxMsgNums {max_nums} must be at least 1")
        subscription = ext.get("subscription")
        if subscription is not None and not isinstance(subscription, str):
            raise RequestError(ResponseCode.SUBSCRIPTION_PARSE_FAILED, "subscription must be a string")
        cfg = self.topics.get(topic)
        if cfg is None:
            raise RequestError(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!")
        if not cfg.readable:
            raise RequestError(ResponseCode.NO_PERMISSION, f"the topic[{topic}] pulling message is forbidden")
        if not 0 <= queue_id < cfg.read_queue_nums:
            raise RequestError(
                ResponseCode.SYSTEM_ERROR,
                f"queueId[{queue_id}] is illegal, topic:[{topic}] topicConfig.readQueueNums:"
                f"[{cfg.read_queue_nums}] consumer:[{conn.remote}]",
            )
        return group, topic, queue_id, offset, max_nums, sys_flag, parse_subscription(subscription)

    def _truncated(self, cmd: RemotingCommand) -> GetMessageResult | None:
        """A position reached under an older master epoch (the pull's ``masterEpoch``) and past the queue offset
        where this log's next epoch began: the records the consumer read up there never reached this log (an
        ASYNC master lost before its slave had them), and this log gives those queue offsets to other messages,
        which the consumer would skip. Answered PULL_OFFSET_MOVED to that queue offset; None: the position stands.
        Checked when the pull arrives and again when it is answered (held across a demotion, the epoch moved)."""
        epochs = self.epochs
        if epochs is None:
            return None
        ext = cmd.ext
        client_epoch = int_field(ext, "masterEpoch", -1)
        if client_epoch < 0 or client_epoch >= epochs.master_epoch:
            return None  # every pull of a current position: nothing more to read
        group, topic = str_field(ext, "consumerGroup"), str_field(ext, "topic")
        queue_id, offset = int_field(ext, "queueId"), int_field(ext, "queueOffset")
        store = self.store
        boundary = epochs.lost_tail_boundary(client_epoch, offset,
                                             lambda start: store.queue_offset_at(topic, queue_id, start))
        if boundary is None:
            return None
        log_rate_limited(self._truncated_log, (group, topic, queue_id), int(time.time() * 1000), log.warning,
                         "pull.position_truncated", group=group, topic=topic, queue_id=queue_id, offset=offset,
                         moved_to=boundary, client_epoch=client_epoch, master_epoch=epochs.master_epoch)
        return GetMessageResult(GetMessageStatus.OFFSET_OVERFLOW_BADLY, boundary,
                                store.get_min_offset_in_queue(topic, queue_id),
                                store.get_max_offset_in_queue(topic, queue_id))

    def pull_message_fast(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand | Deferred | None:
        """The pull answered at once (messages found, or no suspend asked), or held without a task (DEFERRED);
        None when it must take the task path (the full handler then does everything again, commit included)."""
        group, topic, queue_id, offset, max_nums, sys_flag, tag_codes = self._parse(cmd, conn)
        commit = _commit_fields(cmd.ext, sys_flag)
        moved = self._truncated(cmd)
        if moved is not None:  # its commit offset is of the lost records too: not applied
            return self._response(cmd, ResponseCode.PULL_OFFSET_MOVED, moved)
        result = self.store.get_message(topic, queue_id, offset, max_nums, tag_codes)
        code = self._code(result, offset)
        if code == ResponseCode.PULL_NOT_FOUND and sys_flag & SYSFLAG_SUSPEND:
            if not self._hold_fast(cmd, conn, group, topic, queue_id, max_nums, tag_codes, result):
                return None
            self._commit_offset(group, topic, queue_id, commit, conn)
            return DEFERRED
        self._commit_offset(group, topic, queue_id, commit, conn)
        self._count(topic, group, result)
        return self._response(cmd, code, result)

    async def pull_message(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        group, topic, queue_id, offset, max_nums, sys_flag, tag_codes = self._parse(cmd, conn)
        commit = _commit_fields(cmd.ext, sys_flag)
        moved = self._truncated(cmd)
        if moved is not None:
            return self._response(cmd, ResponseCode.PULL_OFFSET_MOVED, moved)
        ext = cmd.ext
        result = self.store.get_message(topic, queue_id, offset, max_nums, tag_codes)
        code = self._code(result, offset)
        self._commit_offset(group, topic, queue_id, commit, conn)

        if code == ResponseCode.PULL_NOT_FOUND and sys_flag & SYSFLAG_SUSPEND:
            if self.config.long_polling_enable:
                hold_ms = min(max(0, int_field(ext, "suspendTimeoutMillis", 15_000)), self.config.suspend_timeout_ms)
            else:
                hold_ms = self.config.short_polling_time_ms
            result, code = await self._hold(topic, queue_id, result.next_begin_offset, max_nums, tag_codes,
                                            hold_ms, result)
        self._count(topic, group, result)
        return self._response(cmd, code, result)

    def _count(self, topic: str, group: str, result: GetMessageResult) -> None:
        if result.message_count:
            st = self.get_stats.get((topic, group))
            if st is None:
                # Group names come from clients: bound the table rather than trust them.
                st = [0, 0] if len(self.get_stats) >= 100_000 else self.get_stats.setdefault((topic, group), [0, 0])
            st[0] += result.message_count
            st[1] += len(result.body)

    def _code(self, result: GetMessageResult, offset: int) -> int:
        code = _CODES.get(result.status)
        if code is None:  # NO_MATCHED_LOGIC_QUEUE, NO_MESSAGE_IN_QUEUE
            code = ResponseCode.PULL_OFFSET_MOVED if offset != 0 else ResponseCode.PULL_NOT_FOUND
        return code

    async def _hold(self, topic: str, queue_id: int, offset: int, max_nums: int, tag_codes: frozenset[int] | None,
                    hold_ms: int, result: GetMessageResult) -> tuple[GetMessageResult, int]:
        """Wait for the queue to grow past ``offset``; pull again when it does (no second suspend)."""
        deadline = trio.current_time() + hold_ms / 1000
        store = self.store
        code: int = ResponseCode.PULL_NOT_FOUND
        while True:
            arrived = await self.long_polling.wait(topic, queue_id, deadline, _grown(store, topic, queue_id, offset))
            if not arrived:
                # Keep how far filtering already moved us: the client continues from there.
                result.next_begin_offset = offset
                result.max_offset = store.get_max_offset_in_queue(topic, queue_id)
                return result, ResponseCode.PULL_NOT_FOUND
            result = store.get_message(topic, queue_id, offset, max_nums, tag_codes)
            code = self._code(result, offset)
            if (result.status is GetMessageStatus.NO_MATCHED_MESSAGE and trio.current_time() < deadline
                    and not self.long_polling.closed):
                offset = result.next_begin_offset  # only messages of other tags arrived: keep holding
                continue
            return result, code

    def _commit_offset(self, group: str, topic: str, queue_id: int, commit: _PullCommit | None,
                       conn: Connection) -> None:
        if commit is None:
            return
        try:
            self.offsets.commit_offset(group, topic, queue_id, commit.offset, conn.attributes.get("client_id"),
                                       source="pull", lock_epoch=commit.lock_epoch,
                                       reset_generation=commit.reset_generation)
        except Exception:
            log.exception("pull.commit_offset_failed", group=group, topic=topic, queue_id=queue_id)

    def _response(self, cmd: RemotingCommand, code: int, result: GetMessageResult) -> RemotingCommand:
        if code != ResponseCode.PULL_OFFSET_MOVED:
            # The answer's master epoch vouches for the position it gives: a pull held while this broker moved to a
            # newer epoch (demoted, its tail cut) is checked again.
            moved = self._truncated(cmd)
            if moved is not None:
                code, result = ResponseCode.PULL_OFFSET_MOVED, moved
            elif code == ResponseCode.PULL_NOT_FOUND and result.next_begin_offset > result.max_offset:
                code = ResponseCode.PULL_OFFSET_MOVED  # a held pull whose queue was cut meanwhile
                result.next_begin_offset = result.max_offset
        ext = {
            "nextBeginOffset": result.next_begin_offset,
            "minOffset": result.min_offset,
            "maxOffset": result.max_offset,
            "suggestWhichBrokerId": 0,
        }
        if self.epochs is not None:
            ext["masterEpoch"] = self.epochs.master_epoch
        body = result.body if code == ResponseCode.SUCCESS else None
        return RemotingCommand(code=int(code), opaque=cmd.opaque, flag=1, ext=ext, body=body)


class _PullCommit(NamedTuple):
    """A pull's commit offset (sysFlag 0x1) and what it was read and consumed under."""

    offset: int
    #: The reset generation the offset was read under: a pull sent before a reset is refused (issue 19).
    reset_generation: int | None
    #: The lock grant it was consumed under (trimq): judged and ranked by it as UPDATE_CONSUMER_OFFSET is. Without
    #: it, a commit in a promoted master's restart grace (no holder yet) ranked below the old master's older commit
    #: of a later lock sequence, which the demoted old master then handed over (long ASYNC seed 24).
    lock_epoch: int | None


def _commit_fields(ext: dict[str, Any], sys_flag: int) -> _PullCommit | None:
    """The pull's commit, None without one. Read before anything is read or held: a malformed field is the pull's
    error answer, never an error after its hold began (which left the hold behind)."""
    if not sys_flag & SYSFLAG_COMMIT_OFFSET:
        return None
    offset = int_field(ext, "commitOffset", -1)
    if offset < 0:
        return None
    generation, lock_epoch = int_field(ext, "resetGeneration", -1), int_field(ext, "lockEpoch", -1)
    return _PullCommit(offset, generation if generation >= 0 else None, lock_epoch if lock_epoch >= 0 else None)


class _HeldPull:
    """A pull held without a task (long polling). Answered once: by an arrival that brings a matching message,
    by its deadline (the expiry loop), or at shutdown; dropped when its connection is gone."""

    __slots__ = ("cmd", "conn", "deadline", "done", "group", "max_nums", "offset", "queue_id", "result", "service",
                 "started", "tag_codes", "topic")

    def __init__(self, service: PullService, cmd: RemotingCommand, conn: Connection, group: str, topic: str,
                 queue_id: int, offset: int, max_nums: int, tag_codes: frozenset[int] | None, deadline: float,
                 result: GetMessageResult) -> None:
        self.service = service
        self.cmd = cmd
        self.conn = conn
        self.group = group
        self.topic = topic
        self.queue_id = queue_id
        self.offset = offset
        self.max_nums = max_nums
        self.tag_codes = tag_codes
        self.deadline = deadline
        self.result = result
        self.done = False
        self.started = time.perf_counter()

    def on_arrival(self, max_offset: int) -> bool:
        if self.done:
            return True
        if self.conn.closed:
            self.done = True
            self.conn.drop_deferred()
            return True
        if max_offset <= self.offset:
            return False
        svc = self.service
        result = svc.store.get_message(self.topic, self.queue_id, self.offset, self.max_nums, self.tag_codes)
        code = svc._code(result, self.offset)
        if (result.status is GetMessageStatus.NO_MATCHED_MESSAGE and trio.current_time() < self.deadline
                and not svc.long_polling.closed):
            self.offset = result.next_begin_offset  # only messages of other tags arrived: keep holding
            return False
        self._answer(code, result)
        return True

    def expire(self) -> None:
        """Time is up: PULL_NOT_FOUND, keeping how far filtering already moved the offset."""
        if self.done:
            return
        result = self.result
        result.next_begin_offset = self.offset
        result.max_offset = self.service.store.get_max_offset_in_queue(self.topic, self.queue_id)
        self._answer(ResponseCode.PULL_NOT_FOUND, result)

    def on_shutdown(self) -> None:
        """As a held task does at shutdown: what has arrived meanwhile, or PULL_NOT_FOUND."""
        if self.done:
            return
        svc = self.service
        if svc.store.get_max_offset_in_queue(self.topic, self.queue_id) > self.offset:
            result = svc.store.get_message(self.topic, self.queue_id, self.offset, self.max_nums, self.tag_codes)
            self._answer(svc._code(result, self.offset), result)
        else:
            self.expire()

    def _answer(self, code: int, result: GetMessageResult) -> None:
        self.done = True
        conn = self.conn
        if conn.closed:
            conn.drop_deferred()
            return
        svc = self.service
        svc._count(self.topic, self.group, result)
        resp = svc._response(self.cmd, code, result)
        server = conn.server
        if server.observe is not None:
            server.observe(self.cmd.code, resp.code, time.perf_counter() - self.started)
        conn.answer_deferred(resp)
