"""QUERY_MESSAGE (12): stored messages by key or unique key, from the message index (docs/STORAGE.md §10).

RocketMQ 4.9.3's QueryMessageProcessor.queryMessage over ``DefaultMessageStore.queryMessage``:

* ext ``topic``, ``key``, ``maxNum``, ``beginTimestamp``, ``endTimestamp`` (ms), and ``_UNIQUE_KEY_QUERY``
  (``"true"``: ``key`` is a unique key, UNIQ_KEY, and ``maxNum`` becomes ``default_query_max_num``, 32);
* answer: SUCCESS with ext ``indexLastUpdateTimestamp`` / ``indexLastUpdatePhyoffset`` (the index's newest
  entry) and the body the raw records found, concatenated as in a pull (oldest first, at most ``maxNum``,
  capped by ``max_msgs_num_batch``); QUERY_NOT_FOUND ("can not find message, maybe time range not correct")
  when none matches.

Differences, each documented in docs/PROTOCOL.md: the broker answers only records that really match (topic,
key in KEYS or UNIQ_KEY equal, store time in the range) — RocketMQ answers every hash hit and leaves the
filtering to its client; ``topic`` may be left out (trimq): every topic this broker stores is looked in;
``maxNum``, ``beginTimestamp`` and ``endTimestamp`` default to the cap, 0 and no end. The lookup first waits
(at most ``INDEX_WAIT_S``) until the index holds every message stored before the request arrived.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from trimq.broker.deps import HandlerRegistry
from trimq.broker.services import HandlerService
from trimq.broker.store.index_dispatch import QueryMessageResult
from trimq.protocol.codes import RequestCode, ResponseCode
from trimq.protocol.command import RemotingCommand
from trimq.protocol.errors import RequestError
from trimq.protocol.fields import flag_field, int_field
from trimq.protocol.validation import InvalidNameError, check_topic
from trimq.runtime.logs import get_logger

if TYPE_CHECKING:
    from trimq.runtime.server import Connection

log = get_logger("trimq.broker.query")

__all__ = ["INDEX_WAIT_S", "UNIQUE_MSG_QUERY_FLAG", "QueryMessageService"]

UNIQUE_MSG_QUERY_FLAG = "_UNIQUE_KEY_QUERY"  # RocketMQ's MixAll.UNIQUE_MSG_QUERY_FLAG
INDEX_WAIT_S = 3.0
"""How long a lookup waits for the index to catch up with what was stored before it (a rebuild after a
restart may take longer: the answer then holds what is indexed so far)."""
LONG_MAX = 2**63 - 1
INT_MAX = 2**31 - 1


class KeyIndex(Protocol):
    """The store's message index (broker/store/index_dispatch.py IndexDispatcher)."""

    enabled: bool

    async def wait_dispatched(self, offset: int, timeout_s: float) -> bool: ...

    def query_messages(self, topic: str, key: str, max_num: int, begin: int, end: int, *,
                       unique: bool = False) -> QueryMessageResult: ...


class StoredTopics(Protocol):
    """The store's topics and log end (MessageStore)."""

    @property
    def max_phy_offset(self) -> int: ...

    def topics(self) -> list[str]: ...


class QueryMessageService(HandlerService):
    """Answers QUERY_MESSAGE from the index (a broker service with nothing to load, run or persist)."""

    name = "query_message"

    def __init__(self, *, registry: HandlerRegistry, index: KeyIndex, store: StoredTopics,
                 default_query_max_num: int = 32, max_msgs_num_batch: int = 64,
                 index_wait_s: float = INDEX_WAIT_S) -> None:
        self.index = index
        self.store = store
        self.default_query_max_num = default_query_max_num
        self.max_msgs_num_batch = max_msgs_num_batch
        self.index_wait_s = index_wait_s
        #: Counters for metrics and tests.
        self.stats: dict[str, int] = {"queries": 0, "found": 0, "not_found": 0}
        registry.register(RequestCode.QUERY_MESSAGE, self.query_message)

    async def query_message(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        """12: see the module docstring."""
        ext = cmd.ext or {}
        key = ext.get("key")
        if not isinstance(key, str) or not key:
            raise RequestError(ResponseCode.SYSTEM_ERROR, "QUERY_MESSAGE: header field 'key' is missing")
        topic = ext.get("topic")
        if topic is not None and topic != "":
            try:
                topic = check_topic(topic)
            except InvalidNameError as exc:
                raise RequestError(ResponseCode.SYSTEM_ERROR, f"QUERY_MESSAGE: header field 'topic': {exc}") from None
        else:
            topic = None
        unique = flag_field(ext, UNIQUE_MSG_QUERY_FLAG)
        max_num = self.default_query_max_num if unique else int_field(ext, "maxNum", INT_MAX, bits=32)
        max_num = min(max_num, self.max_msgs_num_batch)
        begin = int_field(ext, "beginTimestamp", 0)
        end = int_field(ext, "endTimestamp", LONG_MAX)
        self.stats["queries"] += 1
        if not self.index.enabled:
            self.stats["not_found"] += 1
            raise RequestError(ResponseCode.QUERY_NOT_FOUND,
                               "can not find message: the message index is off on this broker "
                               "(message_index_enable = false)")
        await self.index.wait_dispatched(self.store.max_phy_offset, self.index_wait_s)
        topics = [topic] if topic is not None else sorted(self.store.topics())
        found: list[tuple[int, bytes]] = []
        last_ts = last_phy = 0
        for t in topics:
            r = self.index.query_messages(t, key, max_num, begin, end, unique=unique)
            last_ts, last_phy = r.index_last_update_timestamp, r.index_last_update_phyoffset
            found += [(m.commit_log_offset, raw) for m, raw in zip(r.messages, r.records, strict=True)]
        if not found:
            self.stats["not_found"] += 1
            raise RequestError(ResponseCode.QUERY_NOT_FOUND, "can not find message, maybe time range not correct")
        found.sort()
        body = b"".join(raw for _, raw in found[-max_num:])  # the newest, oldest first
        self.stats["found"] += 1
        return RemotingCommand.response_to(
            cmd, ext={"indexLastUpdateTimestamp": last_ts, "indexLastUpdatePhyoffset": last_phy}, body=body)
