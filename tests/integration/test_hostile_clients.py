"""Hostile clients against a real broker (issue 20): multi-MB fields, numbers beyond a Java long, idle and
silent connections. Each answer is a small error, nothing bad is stored, and the broker keeps serving."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from trimq.broker.broker import Broker
from trimq.client.config import ProducerConfig
from trimq.client.producer import Producer
from trimq.namesrv.service import NameServer
from trimq.protocol import RemotingCommand, RequestCode, ResponseCode
from trimq.protocol.frame import DEFAULT_MAX_FRAME_BYTES, FrameDecoder, encode_frame
from trimq.protocol.message import Message
from trimq.protocol.signature import sign_command
from trimq.runtime.client import RemotingClient
from trimq.runtime.server import MAX_REMARK_CHARS

HUGE = DEFAULT_MAX_FRAME_BYTES - 512  # a field this long still fits one request frame; an echo of it does not
ACL = """
[[accounts]]
access_key = "admin-key"
secret_key = "admin-secret"
admin = true
"""
BrokerFactory = Callable[..., Any]


def huge_requests() -> list[tuple[str, RemotingCommand]]:
    """Requests whose answers used to echo a ~16 MiB field (or could): one per kind of field."""
    s = "x" * HUGE
    pull = {"consumerGroup": s, "topic": "T", "queueId": 0, "queueOffset": 0, "maxMsgNums": 1, "sysFlag": 0}
    send = {"producerGroup": "p", "topic": s, "queueId": 0, "sysFlag": 0, "bornTimestamp": 0, "properties": ""}
    return [
        ("queueId spelt as a 16 MiB string", RemotingCommand.request(
            RequestCode.QUERY_CONSUMER_OFFSET, {"consumerGroup": "g", "topic": "T", "queueId": s})),
        ("16 MiB topic", RemotingCommand.request(RequestCode.SEND_MESSAGE, send, b"m")),
        ("16 MiB consumer group", RemotingCommand.request(RequestCode.PULL_MESSAGE, pull)),
        ("16 MiB group as bytes", RemotingCommand.request(
            RequestCode.CONSUMER_SEND_MSG_BACK, {"group": s.encode(), "offset": 0, "delayLevel": 0})),
        ("16 MiB client id", RemotingCommand.request(RequestCode.HEART_BEAT, body={"clientID": [s]})),
    ]


def runtime_info(*, signed: bool) -> RemotingCommand:
    cmd = RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO)
    return sign_command(cmd, "admin-key", "admin-secret") if signed else cmd


async def assert_bounded_errors(broker: Broker, requests: list[tuple[str, RemotingCommand]], *,
                                signed: bool = False) -> None:
    """Each request gets a small error answer while another client is served; the broker runs on."""
    served = 0
    done = trio.Event()

    async def other_client() -> None:
        nonlocal served
        async with RemotingClient() as rc:
            while not done.is_set():
                r = await rc.invoke(broker.address, runtime_info(signed=signed), 10)
                assert r.ok
                served += 1
                await trio.sleep(0.01)

    async with trio.open_nursery() as nursery, RemotingClient() as rc:
        nursery.start_soon(other_client)
        for what, cmd in requests:
            r = await rc.invoke(broker.address, cmd, 10)
            assert r.code != ResponseCode.SUCCESS, what
            assert r.remark and len(r.remark) <= MAX_REMARK_CHARS + 40, (what, len(r.remark or ""))
        done.set()
    assert served > 0
    async with RemotingClient() as rc:
        assert (await rc.invoke(broker.address, runtime_info(signed=signed))).ok


async def test_16_mib_fields_get_bounded_errors_and_the_broker_keeps_serving(broker_factory: BrokerFactory) -> None:
    async with broker_factory() as broker:
        await assert_bounded_errors(broker, huge_requests())


async def test_16_mib_fields_with_the_acl_signed_or_not(broker_factory: BrokerFactory, tmp_path: Path) -> None:
    """With the ACL on, a 16 MiB AccessKey needs no credentials to reach the answer path (NO_PERMISSION
    echoed it); a signed request with a 16 MiB field reaches the handler's errors."""
    acl = tmp_path / "acl.toml"
    acl.write_text(ACL)
    s = "k" * HUGE
    unsigned = [
        ("16 MiB AccessKey", RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO,
                                                     {"AccessKey": s, "Signature": "x"})),
        ("16 MiB AccessKey on a send", RemotingCommand.request(
            RequestCode.SEND_MESSAGE, {"AccessKey": s, "Signature": "x", "topic": "T", "queueId": 0}, b"m")),
    ]
    signed = [(what, sign_command(cmd, "admin-key", "admin-secret")) for what, cmd in huge_requests()]
    async with broker_factory(acl_file=str(acl)) as broker:
        await assert_bounded_errors(broker, unsigned + signed, signed=True)


def field_range_errors(broker: Broker) -> dict[str, float | None]:
    """``trimq_field_range_errors_total`` by its ``oneway`` label, as the metrics endpoint reports it."""
    assert broker.metrics is not None
    get = broker.metrics.registry.get_sample_value
    return {oneway: get("trimq_field_range_errors_total", {"oneway": oneway}) for oneway in ("false", "true")}


async def test_consumer_offsets_beyond_a_java_long_are_refused_and_never_stored(
        broker_factory: BrokerFactory, tmp_path: Path) -> None:
    """2^63 and 2^64-1 used to be stored, persisted to consumerOffset.json and reloaded."""
    store = tmp_path / "offsets-store"
    ext = {"consumerGroup": "g", "topic": "T", "queueId": 0}

    def update(offset: Any, *, oneway: bool = False) -> RemotingCommand:
        return RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, {**ext, "commitOffset": offset},
                                       oneway=oneway)

    async with broker_factory(store_dir=str(store), metrics_port=0) as broker, RemotingClient() as rc:
        broker.topic_config_manager.ensure_topic("T", 1)
        for bad in (2**63, 2**64 - 1, str(2**63)):
            r = await rc.invoke(broker.address, update(bad))
            assert r.code == ResponseCode.SYSTEM_ERROR
            assert "'commitOffset' = 9223372036854775808" in (r.remark or "") or "18446744073709551615" in (
                r.remark or "")
            assert "Java long" in (r.remark or "")
        q = await rc.invoke(broker.address, RemotingCommand.request(RequestCode.QUERY_CONSUMER_OFFSET, ext))
        assert q.code == ResponseCode.QUERY_NOT_FOUND
        assert (await rc.invoke(broker.address, update(7))).ok
        await rc.invoke_oneway(broker.address, update(2**64 - 1, oneway=True))  # dropped, counted, logged
        q = await rc.invoke(broker.address, RemotingCommand.request(RequestCode.QUERY_CONSUMER_OFFSET, ext))
        assert q.ok and q.ext["offset"] == 7
        assert field_range_errors(broker) == {"false": 3, "true": 1}
    text = (store / "config" / "consumerOffset.json").read_text()
    assert "9223372036854775808" not in text and "18446744073709551615" not in text
    assert json.loads(text)
    async with broker_factory(store_dir=str(store)) as broker, RemotingClient() as rc:
        q = await rc.invoke(broker.address, RemotingCommand.request(RequestCode.QUERY_CONSUMER_OFFSET, ext))
        assert q.ok and q.ext["offset"] == 7


# ------------------------------------------------------------------------------------------------ idle connections


@asynccontextmanager
async def raw(broker: Broker) -> AsyncIterator[trio.SocketStream]:
    host, port = broker.address.rsplit(":", 1)
    stream = await trio.open_tcp_stream(host, int(port))
    async with stream:
        yield stream


async def ask(stream: trio.SocketStream, opaque: int) -> RemotingCommand:
    await stream.send_all(encode_frame(RemotingCommand(code=RequestCode.GET_BROKER_RUNTIME_INFO, opaque=opaque)))
    dec = FrameDecoder()
    while True:
        data = await stream.receive_some(65536)
        assert data, "closed"
        for resp in dec.feed(data):
            if resp.opaque == opaque:  # earlier answers nobody read are skipped
                return resp


async def test_a_connection_silent_for_120_s_is_closed_one_that_speaks_is_not(
        broker_factory: BrokerFactory, autojump_clock: trio.testing.MockClock) -> None:
    async with broker_factory() as broker, raw(broker) as silent, raw(broker) as chatty:
        assert (await ask(silent, 1)).ok  # its last frame
        t0 = trio.current_time()
        for i in range(12):  # ten minutes, a frame every 50 s
            await trio.sleep(50)
            assert (await ask(chatty, 2 + i)).ok
            if trio.current_time() - t0 < 120:
                assert broker.server.idle_closed == 0
        with trio.fail_after(1):
            assert await silent.receive_some(10) == b""  # closed by the broker
        assert broker.server.idle_closed == 1 and len(broker.server.connections) == 1


async def test_the_idle_timeout_is_configurable_and_can_be_turned_off(
        broker_factory: BrokerFactory, autojump_clock: trio.testing.MockClock) -> None:
    async with broker_factory(server_channel_max_idle_time_seconds=10) as broker, raw(broker) as s:
        await trio.sleep(9.5)
        assert broker.server.idle_closed == 0
        await trio.sleep(1)
        assert broker.server.idle_closed == 1
        with trio.fail_after(1):
            assert await s.receive_some(10) == b""
    async with broker_factory(server_channel_max_idle_time_seconds=0) as broker, raw(broker) as s:
        await trio.sleep(600)  # five times the default: never closed
        assert (await ask(s, 1)).ok and broker.server.idle_closed == 0


async def test_client_heartbeats_keep_their_connection_open(
        broker_factory: BrokerFactory, namesrv_factory: Callable[..., Any],
        autojump_clock: trio.testing.MockClock) -> None:
    """A producer that sends once and then only heartbeats (every 30 s) keeps its broker connection for ten
    minutes; its route polls go to the (separate) name server, so the heartbeats alone keep it alive."""
    ns: NameServer
    async with namesrv_factory() as ns, broker_factory(namesrv_addr=ns.address) as broker:
        broker.topic_config_manager.ensure_topic("Beat", 1)  # registered with the name server at once
        async with RemotingClient() as admin:
            while not (await admin.invoke(ns.address, RemotingCommand.request(
                    RequestCode.GET_ROUTEINFO_BY_TOPIC, {"topic": "Beat"}))).ok:
                await trio.sleep(0.1)
        async with Producer(ProducerConfig(producer_group="beat-p", namesrv_addr=ns.address)) as producer:
            await producer.send(Message("Beat", b"once"))
            ids = set(broker.server.connections)
            beats = producer.instance.heartbeat_count if producer.instance else 0
            await trio.sleep(600)
            assert producer.instance is not None and producer.instance.heartbeat_count - beats >= 600 // 30 - 1
            assert broker.server.idle_closed == 0
            assert set(broker.server.connections) == ids
        await trio.sleep(121)  # ... while a connection nobody uses any more goes
        assert not broker.server.connections


@pytest.mark.parametrize("oneway", [False, True])
async def test_a_refused_frame_still_counts_as_activity(
        broker_factory: BrokerFactory, autojump_clock: trio.testing.MockClock, oneway: bool) -> None:
    """A frame refused by the range check (answered, or dropped when oneway) still keeps its connection open."""
    async with broker_factory() as broker, raw(broker) as s:
        await trio.sleep(100)
        flag = 0x2 if oneway else 0
        await s.send_all(encode_frame(RemotingCommand(code=RequestCode.GET_MAX_OFFSET, opaque=1, flag=flag,
                                                      ext={"topic": "T", "queueId": 2**40})))
        await trio.sleep(100)
        assert (await ask(s, 2)).ok and broker.server.idle_closed == 0
