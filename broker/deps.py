"""What the broker's services need from one another: small ``typing.Protocol`` views, one per role.

The composition root (``Broker.__init__`` in broker/broker.py) builds every component once and hands each
service exactly the collaborators it uses, typed by these views, as client/consume/common.py and
client/offset_store.py do on the client side. So a service can be built from fakes in a unit test
(tests/unit/test_broker_handlers.py), and a dependency that is missing is a TypeError when the broker is
constructed, not a SYSTEM_ERROR at request time. The real implementations are named in each docstring.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

from trimq.broker.store.offsets import QueueProgress
from trimq.broker.store.store_base import ArrivalListener, GetMessageResult, PutResult
from trimq.broker.store.subscription_groups import SubscriptionGroupConfig
from trimq.broker.store.topics import TopicConfig
from trimq.protocol.message import MessageExt
from trimq.protocol.message_queue import MessageQueue
from trimq.runtime.server import Connection, FastPath, Handler

__all__ = [
    "AddressSource",
    "AdminStore",
    "ConsumerChannels",
    "ConsumerOffsets",
    "DeadLetterStore",
    "Draining",
    "HandlerRegistry",
    "LocalNameServer",
    "LockOwners",
    "MessageLookup",
    "MessageWriter",
    "OffsetPersister",
    "ProducerWriter",
    "QueueOffsets",
    "QueueReader",
    "RequestServer",
    "SubscriptionGroups",
    "TopicAdmin",
    "TopicTable",
    "Topics",
]

#: ``() -> (host, port)``: the address other processes reach this broker at (``Broker.advertised_host``).
AddressSource = Callable[[], tuple[str, int]]


# -- the server ------------------------------------------------------------------------------------------

class HandlerRegistry(Protocol):
    """Where a service registers its request handlers (runtime's RemotingServer)."""

    def register(self, code: int, handler: Handler, *, inline: bool = False,
                 fast_path: FastPath | None = None) -> None: ...

    def on_connection_closed(self, callback: Callable[[Connection], None]) -> None: ...


class Draining(Protocol):
    """The start of the server's graceful stop (RemotingServer)."""

    async def wait_shutdown(self) -> None: ...


class RequestServer(HandlerRegistry, Draining, Protocol):
    """A registry a service also watches: its in-flight bound and the start of a graceful stop."""

    max_inflight_requests: int


# -- the store -------------------------------------------------------------------------------------------

class MessageWriter(Protocol):
    """Appends messages (broker/store/message_store.py MessageStore)."""

    async def put_message(self, topic: str, queue_id: int, body: bytes, properties: dict[str, str] | str, *,
                          flag: int = 0, sys_flag: int = 0, born_timestamp: int, born_host: tuple[str, int],
                          reconsume_times: int = 0, tags_code: int | None = None) -> PutResult: ...

    async def put_messages(self, topic: str, queue_id: int, messages: list[tuple[bytes, str, int]], *,
                           sys_flag: int = 0, born_timestamp: int, born_host: tuple[str, int],
                           reconsume_times: int = 0, tags_code: int | None = None) -> PutResult: ...


class ProducerWriter(MessageWriter, Protocol):
    """What the send path uses (MessageStore): appends, then the SYNC_MASTER wait for a slave (issue 15)."""

    async def handle_ha(self, result: PutResult) -> PutResult: ...


class QueueOffsets(Protocol):
    """A consume queue's offsets and timestamps (MessageStore)."""

    def get_max_offset_in_queue(self, topic: str, queue_id: int) -> int: ...

    def get_min_offset_in_queue(self, topic: str, queue_id: int) -> int: ...

    def get_store_timestamp(self, topic: str, queue_id: int, queue_offset: int) -> int | None: ...

    def get_offset_in_queue_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int: ...

    def get_earliest_msg_store_time(self, topic: str, queue_id: int) -> int | None: ...

    def queue_offset_at(self, topic: str, queue_id: int, commit_log_offset: int) -> int: ...


class MasterEpochs(Protocol):
    """The master epochs of a broker's log (broker/store/ha/history.py HAState): the newest, and from which
    commit-log offset each one wrote."""

    history: list[tuple[int, int]]

    @property
    def master_epoch(self) -> int: ...

    def lost_tail_boundary(self, epoch: int, offset: int, queue_offset_at: Callable[[int], int]) -> int | None: ...


class ReadableArrivals(Protocol):
    """Arrivals once readers may see them (broker/store/read.py ReadGate)."""

    listeners: list[ArrivalListener]


class QueueReader(Protocol):
    """What a pull reads (MessageStore): messages of a queue, its end, and arrivals for long polling."""

    arrival_listeners: list[ArrivalListener]

    @property
    def read_gate(self) -> ReadableArrivals: ...

    def has_readable(self, topic: str, queue_id: int, offset: int) -> bool: ...

    def queue_offset_at(self, topic: str, queue_id: int, commit_log_offset: int) -> int: ...

    def get_message(self, topic: str, queue_id: int, offset: int, max_msg_nums: int,
                    tag_codes: frozenset[int] | set[int] | None = None, *,
                    max_bytes: int | None = None) -> GetMessageResult: ...

    def get_max_offset_in_queue(self, topic: str, queue_id: int) -> int: ...

    def get_min_offset_in_queue(self, topic: str, queue_id: int) -> int: ...


class MessageLookup(Protocol):
    """Single records by commit-log offset, and a queue's units (MessageStore)."""

    def read_record(self, commit_log_offset: int) -> bytes | None: ...

    def lookup_message_by_offset(self, commit_log_offset: int) -> MessageExt | None: ...

    def find_consume_queue(self, topic: str, queue_id: int) -> Any: ...


class DeadLetterStore(ProducerWriter, MessageLookup, Protocol):
    """What retries and dead letters use (MessageStore): copies appended (a send-back waits for a slave on a
    SYNC_MASTER, as a send does), records found, queue bounds."""

    def get_max_offset_in_queue(self, topic: str, queue_id: int) -> int: ...

    def get_min_offset_in_queue(self, topic: str, queue_id: int) -> int: ...


class AdminStore(QueueOffsets, MessageLookup, Protocol):
    """What the topic admin reads (MessageStore): queue offsets and records by offset."""


# -- configs -----------------------------------------------------------------------------------------------

class Topics(Protocol):
    """Topic configs: lookups and on-demand creation (broker/store/topics.py TopicConfigManager)."""

    def get(self, topic: str) -> TopicConfig | None: ...

    def ensure_topic(self, topic: str, queue_nums: int, perm: int = ...) -> TopicConfig: ...

    def auto_create_topic(self, topic: str) -> TopicConfig | None: ...


class TopicTable(Protocol):
    """The whole topic table as registered with name servers (TopicConfigManager)."""

    data_version: dict[str, Any]
    listeners: list[Callable[[str], None]]

    def table_json(self) -> dict[str, dict[str, Any]]: ...


class TopicAdmin(Topics, TopicTable, Protocol):
    """Topic lookups, the table, and admin updates that wait for the file (TopicConfigManager)."""

    async def acreate_or_update(self, cfg: TopicConfig) -> TopicConfig: ...


class SubscriptionGroups(Protocol):
    """Consumer-group configs (broker/store/subscription_groups.py SubscriptionGroupManager)."""

    @property
    def dirty(self) -> bool: ...

    def get(self, group: str) -> SubscriptionGroupConfig | None: ...

    def find(self, group: str) -> SubscriptionGroupConfig | None: ...

    def update_and_create(self, cfg: SubscriptionGroupConfig) -> None: ...

    def encode(self) -> dict[str, Any]: ...

    async def persist(self) -> None: ...


# -- coordination ----------------------------------------------------------------------------------------

class ConsumerOffsets(Protocol):
    """Committed consumer offsets (broker/store/offsets.py ConsumerOffsetManager)."""

    def query_offset(self, group: str, topic: str, queue_id: int) -> int: ...

    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int, client_id: str | None, *,
                      source: str, lock_epoch: int | None = None, reset_generation: int | None = None) -> bool: ...

    def reset_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None: ...

    def reset_generation(self, group: str, topic: str) -> int: ...

    def bump_reset_generation(self, group: str, topic: str) -> int: ...

    def progress(self, group: str, topic: str, queue_ids: Iterable[int], store: Any = None
                 ) -> list[QueueProgress]: ...


class ConsumerChannels(Protocol):
    """Where a group's members are connected (broker/consumers.py ConsumerManager)."""

    def find_channel(self, group: str, client_id: str) -> Connection | None: ...

    def member_connections(self, group: str) -> list[tuple[str, Connection]]: ...

    def is_orderly(self, group: str) -> bool: ...


class LockOwners(Protocol):
    """Who holds a queue's lock now (broker/locks.py RebalanceLockManager)."""

    def live_owner(self, group: str, mq: MessageQueue) -> str | None: ...


class OffsetPersister(Protocol):
    """Writes the offset table now (broker/processors/consumer.py CoordinationService)."""

    async def persist_offsets(self, *, raise_errors: bool = False) -> bool: ...


# -- the embedded name server ------------------------------------------------------------------------------

class LocalNameServer(Protocol):
    """A name server in this process, registered with directly (no connection)."""

    def register_local(self, *, cluster: str, broker_addr: str, broker_name: str, broker_id: int,
                       topic_config_table: dict[str, dict[str, Any]], data_version: Any = None) -> None: ...

    def unregister_local(self, *, cluster: str, broker_addr: str, broker_name: str, broker_id: int) -> None: ...
