"""ClientInstance timers on trio's MockClock: rebalance every 20 s and at once when asked (a broker's
NOTIFY_CONSUMER_IDS_CHANGED), offsets persisted every 5 s, routes refreshed every 30 s, heartbeats."""

from __future__ import annotations

from typing import Any

import trio

from trimq.client.config import ClientConfig
from trimq.client.instance import ClientInstance
from trimq.client.subscription import SubscriptionData, build_subscription_data
from trimq.protocol.codes import RequestCode
from trimq.protocol.command import RemotingCommand
from trimq.protocol.message_queue import MessageQueue


class FakeConsumer:
    group_name = "g1"
    message_model = "CLUSTERING"
    consume_type = "CONSUME_PASSIVELY"
    consume_from_where = "CONSUME_FROM_LAST_OFFSET"
    consume_orderly = False

    def __init__(self) -> None:
        self.rebalances: list[float] = []
        self.persists: list[float] = []

    def subscriptions(self) -> list[SubscriptionData]:
        return [build_subscription_data("T", "*")]

    def update_topic_subscribe_info(self, topic: str, mqs: set[MessageQueue]) -> None: ...

    def is_subscribe_topic_need_update(self, topic: str) -> bool:
        return False

    async def do_rebalance(self) -> None:
        self.rebalances.append(trio.current_time())

    async def persist_consumer_offset(self) -> None:
        self.persists.append(trio.current_time())


async def test_timers_and_immediate_rebalance(autojump_clock: Any) -> None:
    async with ClientInstance(ClientConfig(client_ip="1.2.3.4")) as client:
        routes: list[float] = []
        orig = client.update_all_topic_routes

        async def counting_refresh() -> None:
            routes.append(trio.current_time())
            await orig()

        client.update_all_topic_routes = counting_refresh  # type: ignore[method-assign]
        t0 = trio.current_time()
        consumer = FakeConsumer()
        await client.register_consumer(consumer)
        await trio.sleep(0.001)
        assert [t - t0 for t in consumer.rebalances] == [0.0]  # at once on registration
        await trio.sleep(61)
        # every 20 s after that, every 5 s for offsets, every 30 s for routes
        assert [round(t - t0) for t in consumer.rebalances] == [0, 20, 40, 60]
        assert len(consumer.persists) == 12
        assert [round(t - t0) for t in routes] == [30, 60]

        # a broker says the group changed: rebalance now, not at t=80
        before = len(consumer.rebalances)
        notify = RemotingCommand.request(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, {"consumerGroup": "g1"}, oneway=True)
        assert await client._on_consumer_ids_changed(notify, "broker:1") is None
        await trio.sleep(0.001)
        assert len(consumer.rebalances) == before + 1 and client.consumer_ids_changed_count == 1
        # several requests during one pass coalesce into one more pass
        for _ in range(5):
            client.rebalance_immediately()
        await trio.sleep(0.001)
        assert len(consumer.rebalances) == before + 2
        await client.unregister_consumer("g1")
        await trio.sleep(40)
        assert len(consumer.rebalances) == before + 2  # unregistered: no more rebalances of it


async def test_heartbeat_data_lists_groups_and_subscriptions(autojump_clock: Any) -> None:
    async with ClientInstance(ClientConfig(client_ip="1.2.3.4", instance_name="x")) as client:
        await client.register_consumer(FakeConsumer())

        class P:
            group_name = "pg"

        await client.register_producer(P())
        wire = client._heartbeat_data().to_wire()
        assert wire["clientID"].endswith("@x") and wire["language"] == "PYTHON"
        assert wire["producerDataSet"] == [{"groupName": "pg"}]
        (c,) = wire["consumerDataSet"]
        assert (c["groupName"], c["messageModel"], c["consumeOrderly"]) == ("g1", "CLUSTERING", False)
        assert c["subscriptionDataSet"][0]["topic"] == "T" and c["subscriptionDataSet"][0]["subString"] == "*"


async def test_the_member_list_comes_from_the_next_broker_address_when_one_cannot_be_reached(
        autojump_clock: Any) -> None:
    # An ASYNC failover test: the rebalance after a queue was moved back asked a master just stopped, found no member
    # list and waited 20 s for the next one. Now the next address is asked (reachable ones first).
    from trimq.protocol.route import BrokerData, TopicRouteData
    from trimq.runtime.client import RemotingConnectError

    async with ClientInstance(ClientConfig(client_ip="1.2.3.4")) as client:
        asked: list[str] = []

        async def members(addr: str, group: str, **kw: Any) -> list[str]:
            asked.append(addr)
            if addr == "old:1":
                raise RemotingConnectError("cannot connect to old:1")
            return ["c1", "c2"]

        client.api.get_consumer_id_list_by_group = members  # type: ignore[method-assign,assignment]
        client.topic_route_table["T"] = TopicRouteData((BrokerData("c", "broker-a", {0: "old:1", 1: "new:1"}),), ())
        assert await client.find_consumer_id_list("T", "g1") == ["c1", "c2"]
        assert asked == ["old:1", "new:1"] and not client.is_reachable("old:1")
        asked.clear()
        assert await client.find_consumer_id_list("T", "g1") == ["c1", "c2"]
        assert asked == ["new:1"]  # the unreachable address is asked last now
