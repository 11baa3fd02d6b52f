"""Request handlers built from fakes: each service takes only the collaborators it uses (broker/deps.py), so it
can be tested without a store, a server or a broker; a missing collaborator is a TypeError at construction."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import pytest

from trimq.broker.config import BrokerConfig
from trimq.broker.processors.admin_topic import AdminTopicService
from trimq.broker.processors.send import SendService
from trimq.broker.processors.subscription_group import SubscriptionGroupService
from trimq.broker.store.subscription_groups import SubscriptionGroupConfig
from trimq.broker.store.topics import TopicConfig
from trimq.protocol.codes import RequestCode, ResponseCode
from trimq.protocol.command import RemotingCommand
from trimq.protocol.errors import RequestError


class FakeRegistry:
    def __init__(self) -> None:
        self.handlers: dict[int, Callable[..., Any]] = {}

    def register(self, code: int, handler: Callable[..., Any], *, inline: bool = False,
                 fast_path: Any = None) -> None:
        self.handlers[int(code)] = handler

    def on_connection_closed(self, callback: Callable[[Any], None]) -> None:
        pass

    async def call(self, code: int, ext: dict[str, Any] | None = None, body: Any = None) -> RemotingCommand:
        resp = await self.handlers[code](RemotingCommand.request(code, ext or {}, body), FakeConn())
        assert resp is not None
        return resp


class FakeConn:
    remote = "10.0.0.7:50000"
    attributes: dict[str, Any] = {}


class FakeStore:
    """Queue offsets of one queue, and no records."""

    def get_max_offset_in_queue(self, topic: str, queue_id: int) -> int:
        return 42 if (topic, queue_id) == ("orders", 1) else 0

    def get_min_offset_in_queue(self, topic: str, queue_id: int) -> int:
        return 7 if (topic, queue_id) == ("orders", 1) else 0

    def get_store_timestamp(self, topic: str, queue_id: int, queue_offset: int) -> int | None:
        return None

    def get_offset_in_queue_by_time(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        return 0

    def get_earliest_msg_store_time(self, topic: str, queue_id: int) -> int | None:
        return None

    def queue_offset_at(self, topic: str, queue_id: int, commit_log_offset: int) -> int:
        return 0

    def read_record(self, commit_log_offset: int) -> bytes | None:
        return None

    def lookup_message_by_offset(self, commit_log_offset: int) -> Any:
        return None

    def find_consume_queue(self, topic: str, queue_id: int) -> Any:
        return None


class FakeTopics:
    def __init__(self) -> None:
        self.table: dict[str, TopicConfig] = {}
        self.data_version: dict[str, Any] = {"counter": 0, "timestamp": 0}
        self.listeners: list[Callable[[str], None]] = []

    def get(self, topic: str) -> TopicConfig | None:
        return self.table.get(topic)

    def ensure_topic(self, topic: str, queue_nums: int, perm: int = 6) -> TopicConfig:
        return self.table.setdefault(topic, TopicConfig(topic, queue_nums, queue_nums, perm))

    def auto_create_topic(self, topic: str) -> TopicConfig | None:
        return None

    def table_json(self) -> dict[str, dict[str, Any]]:
        return {t: c.to_json() for t, c in self.table.items()}

    async def acreate_or_update(self, cfg: TopicConfig) -> TopicConfig:
        self.table[cfg.topic_name] = cfg
        return cfg


class FakeGroups:
    def __init__(self) -> None:
        self.table: dict[str, SubscriptionGroupConfig] = {}
        self.persisted = 0

    @property
    def dirty(self) -> bool:
        return False

    def get(self, group: str) -> SubscriptionGroupConfig | None:
        return self.table.get(group)

    def find(self, group: str) -> SubscriptionGroupConfig | None:
        return self.table.get(group)

    def update_and_create(self, cfg: SubscriptionGroupConfig) -> None:
        self.table[cfg.group_name] = cfg

    def encode(self) -> dict[str, Any]:
        return {"subscriptionGroupTable": {g: c.to_wire() for g, c in self.table.items()}}

    async def persist(self) -> None:
        self.persisted += 1


async def test_topic_admin_answers_from_its_collaborators() -> None:
    registry, topics = FakeRegistry(), FakeTopics()
    AdminTopicService(registry=registry, store=FakeStore(), topics=topics, default_queue_nums=8)

    resp = await registry.call(RequestCode.GET_MAX_OFFSET, {"topic": "orders", "queueId": 1})
    assert (resp.code, resp.ext["offset"]) == (ResponseCode.SUCCESS, 42)
    resp = await registry.call(RequestCode.GET_MIN_OFFSET, {"topic": "orders", "queueId": 1})
    assert resp.ext["offset"] == 7

    resp = await registry.call(RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "orders"})
    assert resp.code == ResponseCode.SUCCESS
    cfg = topics.get("orders")
    assert cfg is not None and (cfg.read_queue_nums, cfg.write_queue_nums) == (8, 8)  # the default it was given
    with pytest.raises(RequestError) as err:
        await registry.call(RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "orders", "readQueueNums": 0})
    assert "readQueueNums = 0" in err.value.remark
    with pytest.raises(RequestError) as err:
        await registry.call(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": 5})
    assert "can not find message" in err.value.remark


async def test_subscription_group_admin_persists_before_answering() -> None:
    registry, groups = FakeRegistry(), FakeGroups()
    SubscriptionGroupService(registry=registry, groups=groups)
    resp = await registry.call(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body={"groupName": "g1",
                                                                                     "retryMaxTimes": 3})
    assert resp.code == ResponseCode.SUCCESS and groups.persisted == 1
    resp = await registry.call(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG)
    assert resp.body["subscriptionGroupTable"]["g1"]["retryMaxTimes"] == 3


def test_a_missing_collaborator_is_a_type_error_at_construction() -> None:
    with pytest.raises(TypeError, match="groups"):
        SendService(config=BrokerConfig(), registry=FakeRegistry(),  # type: ignore[call-arg]
                    store=cast(Any, FakeStore()), topics=FakeTopics())
