"""Deleting topics and consumer groups on one broker: RocketMQ 4.9.3's AdminBrokerProcessor.deleteTopic and
deleteSubscriptionGroup (``trimq-admin topic delete`` / ``consumer delete``, docs/ADMIN.md).

* DELETE_TOPIC_IN_BROKER (215), ext ``topic``: the topic's config goes (the broker's next registration drops
  its route from the name servers; ``trimq-admin`` also sends DELETE_TOPIC_IN_NAMESRV, 216) and its consume
  queues are deleted (RocketMQ's ``cleanUnusedTopic``); the records stay in the commit log until they expire.
  A system topic (SCHEDULE_TOPIC_XXXX, ...) is refused, as RocketMQ refuses it. trimq also forgets the
  consumer offsets every group stored for the topic (RocketMQ keeps them, and a topic created again under the
  same name would start its consumers at offsets of the old one).
* DELETE_SUBSCRIPTIONGROUP (207), ext ``groupName`` and ``removeOffset`` (default false, as RocketMQ's): the
  group's config goes, and with ``removeOffset`` its stored offsets. The broker does not look at live members
  (RocketMQ does not either): ``trimq-admin consumer delete`` refuses while the group has any, unless forced.

Both answer SUCCESS once the change is on disk (topics.json, subscriptionGroup.json, consumerOffset.json).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from trimq.broker.deps import HandlerRegistry
from trimq.broker.services import HandlerService
from trimq.protocol.codes import RequestCode, ResponseCode
from trimq.protocol.command import RemotingCommand
from trimq.protocol.errors import RequestError
from trimq.protocol.fields import flag_field
from trimq.protocol.validation import SYSTEM_TOPICS, InvalidNameError, check_group, check_topic
from trimq.runtime.logs import get_logger

if TYPE_CHECKING:
    from trimq.runtime.server import Connection

log = get_logger("trimq.admin")

__all__ = ["AdminGroupsService"]


class DeletableTopics(Protocol):
    """Topic configs (broker/store/topics.py TopicConfigManager)."""

    def delete(self, topic: str) -> bool: ...

    async def apersist(self) -> None: ...


class DeletableGroups(Protocol):
    """Consumer-group configs (broker/store/subscription_groups.py SubscriptionGroupManager)."""

    def delete(self, group: str) -> bool: ...

    async def persist(self) -> None: ...


class DeletableOffsets(Protocol):
    """Consumer offsets (broker/store/offsets.py ConsumerOffsetManager)."""

    def groups_of_topic(self, topic: str) -> list[str]: ...

    def remove_offsets(self, group: str, topic: str | None = None) -> int: ...


class OffsetPersister(Protocol):
    async def persist_offsets(self, *, raise_errors: bool = False) -> bool: ...


class TopicQueues(Protocol):
    """The store (MessageStore)."""

    def delete_topic_queues(self, topic: str) -> int: ...


def _error(remark: str) -> RequestError:
    return RequestError(ResponseCode.SYSTEM_ERROR, remark)


class AdminGroupsService(HandlerService):
    """DELETE_TOPIC_IN_BROKER (215) and DELETE_SUBSCRIPTIONGROUP (207) (a broker service with nothing to load,
    run or persist of its own)."""

    name = "admin_groups"

    def __init__(self, *, registry: HandlerRegistry, store: TopicQueues, topics: DeletableTopics,
                 groups: DeletableGroups, offsets: DeletableOffsets, offset_persister: OffsetPersister) -> None:
        self.store = store
        self.topics = topics
        self.groups = groups
        self.offsets = offsets
        self.offset_persister = offset_persister
        #: Counters for metrics and tests.
        self.stats: dict[str, int] = {"topics_deleted": 0, "groups_deleted": 0}
        registry.register(RequestCode.DELETE_TOPIC_IN_BROKER, self.delete_topic_in_broker)
        registry.register(RequestCode.DELETE_SUBSCRIPTIONGROUP, self.delete_subscription_group)

    async def delete_topic_in_broker(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        """215: see the module docstring."""
        topic = (cmd.ext or {}).get("topic")
        try:
            topic = check_topic(topic)
        except InvalidNameError as exc:
            raise _error(f"the specified topic is invalid: {exc}") from None
        if topic in SYSTEM_TOPICS:
            raise _error(f"the topic[{topic}] is conflict with system topic.")
        # Synchronous up to the first await: a peer that leaves meanwhile never leaves half a deletion.
        had_config = self.topics.delete(topic)
        queues = self.store.delete_topic_queues(topic)
        groups = self.offsets.groups_of_topic(topic)
        for group in groups:
            self.offsets.remove_offsets(group, topic)
        self.stats["topics_deleted"] += 1
        log.warning("admin.topic_deleted", topic=topic, config=had_config, queues=queues, offsets_of=groups,
                    remote=conn.remote)
        await self.topics.apersist()
        if groups:
            await self.offset_persister.persist_offsets()
        return RemotingCommand.response_to(cmd)

    async def delete_subscription_group(self, cmd: RemotingCommand, conn: Connection) -> RemotingCommand:
        """207: see the module docstring."""
        ext = cmd.ext or {}
        try:
            group = check_group(ext.get("groupName"))
        except InvalidNameError as exc:
            raise _error(f"header field 'groupName': {exc}") from None
        remove_offset = flag_field(ext, "removeOffset")
        had_config = self.groups.delete(group)
        removed = self.offsets.remove_offsets(group) if remove_offset else 0
        self.stats["groups_deleted"] += 1
        log.warning("admin.group_deleted", group=group, config=had_config, offsets_removed=removed,
                    remote=conn.remote)
        await self.groups.persist()
        if removed:
            await self.offset_persister.persist_offsets()
        return RemotingCommand.response_to(cmd)
