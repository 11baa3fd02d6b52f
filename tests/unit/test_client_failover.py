"""The client's side of a dead master (issue 15 part 2) on trio's MockClock: where reads and offsets go, the burst
of route refreshes after a broker connection closes, the 2 s refresh while a broker has no master, a master that
registers again, and the queues a selector sees."""

from __future__ import annotations

from typing import Any

import trio

from trimq.client.config import ClientConfig
from trimq.client.instance import ROUTE_REFRESH_BURST_S, UNREACHABLE_MS, ClientInstance, TopicPublishInfo
from trimq.protocol.message_queue import MessageQueue
from trimq.protocol.route import PERM_READ, PERM_WRITE, BrokerData, QueueData, TopicRouteData
from trimq.runtime.client import RemotingConnectError

RW = PERM_READ | PERM_WRITE
MASTER, SLAVE, B = "127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"


def route(a_addrs: dict[int, str]) -> TopicRouteData:
    return TopicRouteData(
        (BrokerData("c", "broker-a", dict(a_addrs)), BrokerData("c", "broker-b", {0: B})),
        (QueueData("broker-a", 2, 2, RW), QueueData("broker-b", 2, 2, RW)))


class Namesrv:
    """What the name server answers, changed by the test; counts the route fetches."""

    def __init__(self, client: ClientInstance) -> None:
        self.route = route({0: MASTER, 1: SLAVE})
        self.fetches: list[float] = []
        client._fetch_route = self.fetch  # type: ignore[method-assign]

    async def fetch(self, topic: str) -> TopicRouteData:
        self.fetches.append(trio.current_time())
        return self.route


async def test_reads_and_offsets_go_to_the_slave_while_the_master_is_away(autojump_clock: Any) -> None:
    async with ClientInstance(ClientConfig(client_ip="1.2.3.4", namesrv_addr="127.0.0.1:9")) as client:
        ns = Namesrv(client)
        await client.update_topic_route_info_from_name_server("T")
        assert client.find_broker_addr_in_subscribe("broker-a") == (MASTER, 0)
        assert client.find_broker_addr_in_subscribe("broker-a", 1) == (SLAVE, 1)  # suggested by the broker
        assert await client.find_broker_addr_for_offsets("broker-a", "T") == MASTER
        assert not client.master_down("broker-a")
        # a pull to the master could not connect: it is avoided for UNREACHABLE_MS, routes are refreshed
        client.note_failure(MASTER, RemotingConnectError("refused"))
        assert client.find_broker_addr_in_subscribe("broker-a") == (SLAVE, 1)
        assert await client.find_broker_addr_for_offsets("broker-a", "T") == SLAVE
        assert client.master_down("broker-a")
        await trio.sleep(UNREACHABLE_MS / 1000)
        assert client.find_broker_addr_in_subscribe("broker-a") == (MASTER, 0)
        # the name server dropped the master: only the slave is listed
        ns.route = route({1: SLAVE})
        await client.update_topic_route_info_from_name_server("T")
        assert client.find_broker_addr_in_subscribe("broker-a") == (SLAVE, 1)
        assert await client.find_broker_addr_for_offsets("broker-a", "T") == SLAVE
        assert client.master_down("broker-a") and not client.master_down("broker-b")
        # a selector still sees broker-a's queues (its keys do not move); round robin does not
        info = client.topic_publish_info_table["T"]
        assert {mq.broker_name for mq in info.message_queue_list} == {"broker-b"}
        assert info.selectable_queues() == [MessageQueue("T", b, q) for b in ("broker-a", "broker-b") for q in (0, 1)]


async def test_a_closed_broker_connection_refreshes_routes_at_once_and_in_a_burst(autojump_clock: Any) -> None:
    async with ClientInstance(ClientConfig(client_ip="1.2.3.4", namesrv_addr="127.0.0.1:9")) as client:
        ns = Namesrv(client)
        client.topic_publish_info_table["T"] = TopicPublishInfo([])  # a topic in use
        await client.update_topic_route_info_from_name_server("T")
        ns.fetches.clear()
        t0 = trio.current_time()
        client._on_connection_closed(MASTER)  # as the transport calls it
        await trio.sleep(0.05)
        assert [round(t - t0, 3) for t in ns.fetches] == [0.0]  # at once, not after the 30 s poll
        await trio.sleep(sum(ROUTE_REFRESH_BURST_S[:3]))  # still listed: refreshed again 0.1, 0.2, 0.4 s later
        assert len(ns.fetches) == 4 and client.route_refreshes == 4
        ns.route = route({1: SLAVE})  # the name server dropped it: the burst ends ...
        await trio.sleep(0.9)
        n = len(ns.fetches)
        assert MASTER not in client.broker_addr_table["broker-a"].values()
        # ... but a broker without master is looked at every 2 s (its master's return is noticed)
        back: list[str] = []
        client.master_listeners.append(back.append)
        await trio.sleep(4.1)
        assert len(ns.fetches) == n + 2
        ns.route = route({0: MASTER, 1: SLAVE})
        await trio.sleep(2.1)
        assert back == ["broker-a"] and client.find_broker_addr_in_subscribe("broker-a") == (MASTER, 0)
        await trio.sleep(60)  # masters everywhere: back to the 30 s poll
        assert len(ns.fetches) <= n + 3 + 2


async def test_a_new_connection_ends_the_avoidance_of_its_address() -> None:
    """Chaos seed 23: a broker marked unreachable stayed avoided for UNREACHABLE_MS even after the client had
    connected to it again and been granted locks there. Real sockets, so no MockClock (nothing here waits)."""
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(trio.serve_tcp, lambda stream: trio.sleep_forever(), 0)
        port = listeners[0].socket.getsockname()[1]
        addr = f"127.0.0.1:{port}"
        async with ClientInstance(ClientConfig(client_ip="1.2.3.4", namesrv_addr="127.0.0.1:9")) as client:
            client.note_failure(addr, RemotingConnectError("connection broken"))
            assert not client.is_reachable(addr)
            await client.remoting._channel(addr)  # what any request to it does first
            assert client.is_reachable(addr)
        nursery.cancel_scope.cancel()


async def test_a_failing_connection_listener_is_logged_and_the_others_still_run() -> None:
    """Open and close listeners run from the transport's own tasks: one that raises is logged, the connection is
    still made (or closed) and the listeners after it still run."""
    import structlog

    from trimq.runtime.client import RemotingClient

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(trio.serve_tcp, lambda stream: trio.sleep_forever(), 0)
        addr = f"127.0.0.1:{listeners[0].socket.getsockname()[1]}"
        seen: list[tuple[str, str]] = []

        def broken(a: str) -> None:
            raise RuntimeError("listener bug")

        async with RemotingClient() as client:
            for add, kind in ((client.add_open_listener, "open"), (client.add_close_listener, "close")):
                add(broken)

                def record(a: str, kind: str = kind) -> None:
                    seen.append((kind, a))

                add(record)
            with structlog.testing.capture_logs() as logs:
                await client._channel(addr)
                client.close_address(addr)
        assert seen == [("open", addr), ("close", addr)]
        assert [e["event"] for e in logs if e["log_level"] == "error"] == [
            "connection.open_listener_failed", "connection.close_listener_failed"]
        nursery.cancel_scope.cancel()
