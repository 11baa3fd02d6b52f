"""The name server: broker registration (remote and embedded), routes, expiry, connection loss, the CLIs."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from trimq.protocol.codes import RequestCode, ResponseCode
from trimq.protocol.command import RemotingCommand
from trimq.runtime.client import RemotingClient

RC = RequestCode


async def call(rc: RemotingClient, addr: str, code: int, ext: dict[str, Any] | None = None, body: Any = None
               ) -> RemotingCommand:
    return await rc.invoke(addr, RemotingCommand.request(code, ext or {}, body), timeout_s=10)


async def route(rc: RemotingClient, addr: str, topic: str) -> dict[str, Any] | None:
    r = await call(rc, addr, RC.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
    if r.code == ResponseCode.TOPIC_NOT_EXIST:
        return None
    assert r.code == ResponseCode.SUCCESS, r.remark
    return r.body  # type: ignore[no-any-return]


async def eventually(pred: Callable[[], Any], timeout_s: float = 10) -> Any:
    with trio.fail_after(timeout_s):
        while True:
            v = await pred()
            if v:
                return v
            await trio.sleep(0.02)


def fake_broker(addr: str, name: str = "broker-x") -> dict[str, Any]:
    return {"brokerAddr": addr, "brokerName": name, "clusterName": "C", "brokerId": 0}


TOPICS = {"topicConfigTable": {"T": {"topicName": "T", "readQueueNums": 4, "writeQueueNums": 4, "perm": 6}}}


async def test_broker_registers_on_start_on_topic_change_and_unregisters_on_stop(
    broker_factory: Callable[..., Any], namesrv_factory: Callable[..., Any], rclient: RemotingClient
) -> None:
    async with namesrv_factory() as ns:
        async with broker_factory(namesrv_addr=ns.address, broker_name="broker-q") as b:
            r = await call(rclient, b.address, RC.UPDATE_AND_CREATE_TOPIC,
                           {"topic": "Routed", "readQueueNums": 3, "writeQueueNums": 3, "perm": 6})
            assert r.code == ResponseCode.SUCCESS
            rt = await eventually(lambda: route(rclient, ns.address, "Routed"))
            assert rt["brokerDatas"] == [{"cluster": "DefaultCluster", "brokerName": "broker-q",
                                          "brokerAddrs": {"0": b.address}}]
            assert rt["queueDatas"] == [{"brokerName": "broker-q", "readQueueNums": 3, "writeQueueNums": 3,
                                         "perm": 6, "topicSysFlag": 0}]
            # An auto-created topic shows up too, without waiting 30 s.
            r = await call(rclient, b.address, RC.SEND_MESSAGE,
                           {"producerGroup": "p", "topic": "Auto", "queueId": 0, "bornTimestamp": 0}, b"x")
            assert r.code == ResponseCode.SUCCESS
            await eventually(lambda: route(rclient, ns.address, "Auto"))
            info = (await call(rclient, ns.address, RC.GET_BROKER_CLUSTER_INFO)).body
            assert info["clusterAddrTable"] == {"DefaultCluster": ["broker-q"]}
            topics = (await call(rclient, ns.address, RC.GET_ALL_TOPIC_LIST_FROM_NAMESERVER)).body
            assert {"Auto", "Routed"} <= set(topics["topicList"])
        # Stopping the broker unregisters it at once.
        assert await route(rclient, ns.address, "Routed") is None


async def test_a_closed_registration_connection_drops_the_broker(namesrv_factory: Callable[..., Any]) -> None:
    async with namesrv_factory() as ns, RemotingClient() as broker_side, RemotingClient() as client:
        r = await call(broker_side, ns.address, RC.REGISTER_BROKER, fake_broker("10.9.9.9:10911"), TOPICS)
        assert r.code == ResponseCode.SUCCESS
        assert await route(client, ns.address, "T") is not None
        broker_side.close_address(ns.address)
        await eventually(lambda: _is_none(route(client, ns.address, "T")))


async def _is_none(aw: Any) -> bool:
    return await aw is None


@pytest.fixture
def mock_clock() -> trio.testing.MockClock:
    """Autojump after 20 ms of real idleness (loopback packets may be late on a loaded machine)."""
    return trio.testing.MockClock(autojump_threshold=0.02)


async def test_a_silent_broker_expires_after_120_s(namesrv_factory: Callable[..., Any],
                                                   mock_clock: trio.testing.MockClock) -> None:
    async with namesrv_factory() as ns, RemotingClient(default_timeout_s=600) as rc:
        await call(rc, ns.address, RC.REGISTER_BROKER, fake_broker("10.9.9.1:1", "quiet"), TOPICS)
        await call(rc, ns.address, RC.REGISTER_BROKER, fake_broker("10.9.9.2:1", "chatty"), TOPICS)
        for _ in range(10):  # "chatty" keeps registering every 30 s; "quiet" never again
            await trio.sleep(30)
            await call(rc, ns.address, RC.REGISTER_BROKER, fake_broker("10.9.9.2:1", "chatty"), TOPICS)
            rt = await route(rc, ns.address, "T")
            names = [bd["brokerName"] for bd in rt["brokerDatas"]] if rt else []
            if trio.current_time() < 120:
                assert names == ["chatty", "quiet"]
        assert names == ["chatty"]


async def test_bad_registrations_are_refused_with_a_reason(namesrv_factory: Callable[..., Any],
                                                           rclient: RemotingClient) -> None:
    async with namesrv_factory() as ns:
        cases = [
            ({"brokerName": "b", "clusterName": "c", "brokerId": 0}, TOPICS, "brokerAddr"),
            ({**fake_broker("h:1"), "brokerId": "x"}, TOPICS, "brokerId"),
            (fake_broker("nohostport"), TOPICS, "brokerAddr"),
            (fake_broker("h:1"), ["not", "a", "map"], "map"),
            (fake_broker("h:1"), {"topicConfigTable": {"T": {"readQueueNums": "many"}}}, "T"),
        ]
        for ext, body, why in cases:
            r = await call(rclient, ns.address, RC.REGISTER_BROKER, ext, body)
            assert r.code == ResponseCode.SYSTEM_ERROR and why in (r.remark or ""), r.remark
        r = await call(rclient, ns.address, RC.GET_ROUTEINFO_BY_TOPIC, {"topic": "T"})
        assert r.code == ResponseCode.TOPIC_NOT_EXIST and "T" in (r.remark or "")
        r = await call(rclient, ns.address, RC.SEND_MESSAGE, {})
        assert r.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED


async def test_embedded_name_server_serves_routes_on_the_broker_port(broker_factory: Callable[..., Any],
                                                                    rclient: RemotingClient) -> None:
    async with broker_factory(embedded_namesrv=True) as b:
        r = await call(rclient, b.address, RC.SEND_MESSAGE,
                       {"producerGroup": "p", "topic": "Local", "queueId": 0, "bornTimestamp": 0}, b"x")
        assert r.code == ResponseCode.SUCCESS
        rt = await eventually(lambda: route(rclient, b.address, "Local"))
        assert rt["brokerDatas"][0]["brokerAddrs"] == {"0": b.address}


async def test_embedded_name_server_knows_an_auto_created_topic_as_soon_as_the_send_is_answered(
        broker_factory: Callable[..., Any], rclient: RemotingClient) -> None:
    # Regression: registration was debounced, so a consumer started right after a producer created the topic
    # got TOPIC_NOT_EXIST and waited for the 30 s route poll.
    async with broker_factory(embedded_namesrv=True) as b:
        r = await call(rclient, b.address, RC.SEND_MESSAGE,
                       {"producerGroup": "p", "topic": "JustMade", "queueId": 0, "bornTimestamp": 0}, b"x")
        assert r.code == ResponseCode.SUCCESS
        resp = await call(rclient, b.address, RC.GET_ROUTEINFO_BY_TOPIC, {"topic": "JustMade"})
        assert resp.code == ResponseCode.SUCCESS, resp.remark


async def test_cli_namesrv_and_broker_subprocesses(daemons: Any, tmp_path: Path) -> None:
    ns = await daemons.namesrv()
    store = tmp_path / "cli-store"
    broker = await daemons.broker(store, "--namesrv", ns.address, "--broker-name", "broker-cli")
    async with RemotingClient() as rc:
        r = await call(rc, broker.address, RC.SEND_MESSAGE,
                       {"producerGroup": "p", "topic": "Cli", "queueId": 0, "bornTimestamp": 0}, b"x")
        assert r.code == ResponseCode.SUCCESS
        rt = await eventually(lambda: route(rc, ns.address, "Cli"))
        assert rt["brokerDatas"][0]["brokerName"] == "broker-cli"
        assert broker.terminate() == 0  # SIGTERM: graceful, unregisters
        assert await route(rc, ns.address, "Cli") is None
    assert ns.terminate() == 0
    assert "namesrv.stopped" in ns.log_text()
    # The name server writes nothing to its working directory (tmp_path): only our logs and the store.
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("daemon")) == ["cli-store"]


async def test_cli_broker_with_embedded_namesrv_is_a_whole_system(daemons: Any, tmp_path: Path) -> None:
    broker = await daemons.broker(tmp_path / "one", "--embedded-namesrv")
    async with RemotingClient() as rc:
        r = await call(rc, broker.address, RC.SEND_MESSAGE,
                       {"producerGroup": "p", "topic": "Solo", "queueId": 0, "bornTimestamp": 0}, b"x")
        assert r.code == ResponseCode.SUCCESS
        await eventually(lambda: route(rc, broker.address, "Solo"))
    assert broker.terminate() == 0
    assert not (tmp_path / "one" / "abort").exists()
    assert os.path.exists(tmp_path / "one" / "checkpoint")
