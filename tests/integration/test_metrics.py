"""Broker and name-server metrics over HTTP: the endpoint of a running daemon parses as Prometheus text, the
traffic counters count, the lag gauge follows offsets committed over the wire, locks and fenced updates show.

Real in-process brokers and name servers with ``metrics_port`` set, real ``RemotingClient`` requests, and a
plain HTTP GET of ``/metrics`` parsed with ``prometheus_client.parser``. No sleeps: every value is read
after the request that changes it has been answered (the gauges are computed at scrape time).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog.testing
import trio
from prometheus_client.parser import text_string_to_metric_families

import trimq.broker.metrics as broker_metrics
import trimq.namesrv.metrics as namesrv_metrics
from trimq.namesrv.config import NamesrvConfig
from trimq.namesrv.service import open_namesrv
from trimq.protocol import RemotingCommand, RequestCode, ResponseCode
from trimq.protocol.message_queue import MessageQueue
from trimq.runtime.client import RemotingClient

QUIET = {"flush_interval_ms": 60_000, "register_broker_interval_ms": 600_000}
OPERATIONS_MD = Path(__file__).resolve().parents[2] / "docs" / "OPERATIONS.md"

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


async def scrape(address: tuple[str, int]) -> tuple[str, Samples]:
    """GET /metrics; returns the body and every sample keyed by (name, labels)."""
    stream = await trio.open_tcp_stream(*address)
    async with stream:
        await stream.send_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        data = b""
        while chunk := await stream.receive_some(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    assert b"text/plain" in head
    text = body.decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, frozenset(s.labels.items()))] = s.value
    return text, samples


def value(samples: Samples, name: str, **labels: Any) -> float | None:
    return samples.get((name, frozenset((k, str(v)) for k, v in labels.items())))


async def call(rc: RemotingClient, addr: str, code: int, ext: dict[str, Any] | None = None,
               body: Any = None) -> RemotingCommand:
    return await rc.invoke(addr, RemotingCommand.request(code, ext or {}, body), timeout_s=10)


async def send(rc: RemotingClient, addr: str, topic: str, n: int, queue_id: int = 0) -> None:
    for i in range(n):
        r = await call(rc, addr, RequestCode.SEND_MESSAGE, {"producerGroup": "p", "topic": topic, "queueId": queue_id,
                                                           "bornTimestamp": 0, "properties": ""}, b"m%d" % i)
        assert r.code == ResponseCode.SUCCESS, r.remark


async def commit(rc: RemotingClient, addr: str, group: str, topic: str, queue_id: int, offset: int,
                 client_id: str | None = None) -> RemotingCommand:
    ext: dict[str, Any] = {"consumerGroup": group, "topic": topic, "queueId": queue_id, "commitOffset": offset}
    if client_id is not None:
        ext["clientId"] = client_id
    return await call(rc, addr, RequestCode.UPDATE_CONSUMER_OFFSET, ext)


def lag(samples: Samples, group: str, topic: str, queue_id: int) -> float | None:
    return value(samples, "trimq_consumer_lag_messages", consumer_group=group, topic=topic, queue_id=queue_id)


async def test_broker_endpoint_parses_and_the_lag_gauge_follows_the_consumer(
    broker_factory: Callable[..., Any], rclient: RemotingClient
) -> None:
    async with broker_factory(metrics_port=0, **QUIET) as b:
        assert b.metrics is not None and b.metrics.address is not None
        addr = b.address
        await send(rclient, addr, "LagTopic", 5)
        assert (await commit(rclient, addr, "g1", "LagTopic", 0, 2)).code == ResponseCode.SUCCESS
        text, s = await scrape(b.metrics.address)
        assert "# TYPE trimq_consumer_lag_messages gauge" in text
        assert lag(s, "g1", "LagTopic", 0) == 3
        assert lag(s, "g1", "LagTopic", 1) == 0  # the topic's other (empty) queues are listed too
        assert value(s, "trimq_messages_in_total", topic="LagTopic") == 5
        assert (value(s, "trimq_throughput_in_bytes_total", topic="LagTopic") or 0) > 5 * 2
        assert (value(s, "trimq_rpc_latency_seconds_count", request_code="SEND_MESSAGE",
                      response_code="SUCCESS") or 0) >= 5
        assert (value(s, "trimq_storage_append_latency_seconds_count") or 0) >= 5
        assert (value(s, "trimq_commitlog_max_offset_bytes") or 0) > 0
        assert value(s, "trimq_broker_info", cluster="DefaultCluster", broker="broker-a", address=addr) == 1
        assert value(s, "trimq_storage_writable") == 1

        # The consumer falls behind ...
        await send(rclient, addr, "LagTopic", 4)
        _, s = await scrape(b.metrics.address)
        assert lag(s, "g1", "LagTopic", 0) == 7
        assert (value(s, "trimq_consumer_lag_latency_seconds", consumer_group="g1", topic="LagTopic",
                      queue_id=0) or 0) >= 0
        # ... pulls, and catches up.
        r = await call(rclient, addr, RequestCode.PULL_MESSAGE, {
            "consumerGroup": "g1", "topic": "LagTopic", "queueId": 0, "queueOffset": 2, "maxMsgNums": 32,
            "sysFlag": 0, "subscription": "*"})
        assert r.code == ResponseCode.SUCCESS
        assert (await commit(rclient, addr, "g1", "LagTopic", 0, 9)).code == ResponseCode.SUCCESS
        _, s = await scrape(b.metrics.address)
        assert lag(s, "g1", "LagTopic", 0) == 0
        assert value(s, "trimq_consumer_lag_latency_seconds", consumer_group="g1", topic="LagTopic", queue_id=0) == 0
        assert value(s, "trimq_messages_out_total", topic="LagTopic", consumer_group="g1") == 7
        assert (value(s, "trimq_throughput_out_bytes_total", topic="LagTopic", consumer_group="g1") or 0) > 0
        assert value(s, "trimq_offset_updates_total") == 2
        assert value(s, "trimq_consumer_group_number") == 1
        assert (value(s, "trimq_connections") or 0) >= 1


async def test_locks_fencing_and_connections_per_group(
    broker_factory: Callable[..., Any], rclient: RemotingClient
) -> None:
    async with broker_factory(metrics_port=0, **QUIET) as b:
        addr = b.address
        await send(rclient, addr, "Orders", 3)
        hb = {"clientID": "A", "language": "PYTHON", "version": "0.1.0", "producerDataSet": [{"groupName": "pg"}],
              "consumerDataSet": [{
                  "groupName": "og", "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
                  "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET", "consumeOrderly": True,
                  "subscriptionDataSet": [{"topic": "Orders", "subString": "*", "tagsSet": [], "codeSet": [],
                                           "subVersion": 1}]}]}
        assert (await call(rclient, addr, RequestCode.HEART_BEAT, body=hb)).code == ResponseCode.SUCCESS
        mq = MessageQueue("Orders", "broker-a", 0)
        r = await call(rclient, addr, RequestCode.LOCK_BATCH_MQ,
                       body={"consumerGroup": "og", "clientId": "A", "mqSet": [mq.to_wire()]})
        assert r.code == ResponseCode.SUCCESS and r.body["lockOKMQSet"]
        _, s = await scrape(b.metrics.address)
        assert value(s, "trimq_locks_held", consumer_group="og") == 1
        assert value(s, "trimq_lock_operations_total", outcome="acquired") == 1
        assert value(s, "trimq_consumer_connections", consumer_group="og") == 1
        assert value(s, "trimq_producer_connections", producer_group="pg") == 1
        # A live member that never committed: its whole backlog is lag (RocketMQ's consumerProgress).
        assert lag(s, "og", "Orders", 0) == 3
        assert value(s, "trimq_offset_fenced_updates_total", consumer_group="og") is None

        # Another client may not move the locked queue's offset: refused and counted.
        await commit(rclient, addr, "og", "Orders", 0, 1, client_id="B")
        _, s = await scrape(b.metrics.address)
        assert value(s, "trimq_offset_fenced_updates_total", consumer_group="og") == 1
        assert lag(s, "og", "Orders", 0) == 3
        await commit(rclient, addr, "og", "Orders", 0, 3, client_id="A")
        _, s = await scrape(b.metrics.address)
        assert lag(s, "og", "Orders", 0) == 0
        assert value(s, "trimq_consumer_membership_events_total", event="registered") == 1
        assert value(s, "trimq_offset_stale_generation_updates_total", consumer_group="og") is None

        # An online reset, then a commit made before it (generation 0): refused and counted apart.
        r = await call(rclient, addr, RequestCode.INVOKE_BROKER_TO_RESET_OFFSET,
                       ext={"topic": "Orders", "group": "og", "timestamp": 0, "isForce": True})
        assert r.code == ResponseCode.SUCCESS and r.body["resetGeneration"] == 1
        r = await call(rclient, addr, RequestCode.UPDATE_CONSUMER_OFFSET,
                       {"consumerGroup": "og", "topic": "Orders", "queueId": 0, "commitOffset": 3,
                        "clientId": "A", "resetGeneration": 0})
        assert r.code == ResponseCode.NO_PERMISSION
        _, s = await scrape(b.metrics.address)
        assert value(s, "trimq_offset_stale_generation_updates_total", consumer_group="og") == 1
        assert value(s, "trimq_offset_fenced_updates_total", consumer_group="og") == 1


async def test_two_brokers_in_one_process_have_their_own_registries(
    broker_factory: Callable[..., Any], rclient: RemotingClient
) -> None:
    async with broker_factory(metrics_port=0, broker_name="broker-a", **QUIET) as a, \
            broker_factory(metrics_port=0, broker_name="broker-b", **QUIET) as b:
        await send(rclient, a.address, "OnlyOnA", 2)
        _, sa = await scrape(a.metrics.address)
        _, sb = await scrape(b.metrics.address)
        assert value(sa, "trimq_messages_in_total", topic="OnlyOnA") == 2
        assert value(sb, "trimq_messages_in_total", topic="OnlyOnA") is None
        assert any(k[0] == "trimq_broker_info" and ("broker", "broker-b") in k[1] for k in sb)
        assert a.metrics.registry is not b.metrics.registry


async def healthz(address: tuple[str, int]) -> str:
    """The status line of GET /healthz."""
    stream = await trio.open_tcp_stream(*address)
    async with stream:
        await stream.send_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        data = b""
        while chunk := await stream.receive_some(65536):
            data += chunk
    return data.split(b"\r\n", 1)[0].decode()


async def test_healthz_of_both_daemons_is_200_while_they_serve(
    broker_factory: Callable[..., Any]
) -> None:
    async with open_namesrv(config=NamesrvConfig(listen="127.0.0.1:0", metrics_port=0)) as ns:
        assert ns.metrics is not None and ns.metrics.address is not None
        assert await healthz(ns.metrics.address) == "HTTP/1.1 200 OK"
    async with broker_factory(metrics_port=0, **QUIET) as b:
        assert await healthz(b.metrics.address) == "HTTP/1.1 200 OK"
        b.shutdown()  # the drain has begun: /healthz answers 503 from now on (tests/unit/test_metrics_http.py)
        assert not b.server.serving


async def test_metrics_off_by_default(broker_factory: Callable[..., Any]) -> None:
    async with broker_factory(**QUIET) as b:
        assert b.metrics is None
        assert b.server.observe is None
        assert b.store.on_append is None


async def test_a_failing_part_does_not_break_the_scrape(
    broker_factory: Callable[..., Any], rclient: RemotingClient
) -> None:
    async with broker_factory(metrics_port=0, **QUIET) as b:
        class Broken:
            def encode(self) -> dict[str, Any]:
                raise RuntimeError("boom")

        collector = b.metrics.collector
        real = collector.offsets
        collector.offsets = Broken()  # type: ignore[assignment]
        try:
            _, s = await scrape(b.metrics.address)
        finally:
            collector.offsets = real
        assert value(s, "trimq_storage_writable") == 1  # the other parts are still there
        assert value(s, "trimq_connections") is not None


async def test_name_server_metrics(broker_factory: Callable[..., Any], rclient: RemotingClient) -> None:
    cfg = NamesrvConfig(listen="127.0.0.1:0", metrics_port=0)
    async with open_namesrv(config=cfg) as ns:
        assert ns.metrics is not None and ns.metrics.address is not None
        async with broker_factory(namesrv_addr=ns.address, broker_name="broker-x", cluster_name="C1", **QUIET) as b:
            register = b.register_service
            with trio.fail_after(10):
                await register.registered.wait()
            text, s = await scrape(ns.metrics.address)
            assert value(s, "trimq_namesrv_brokers", cluster="C1") == 1
            assert (value(s, "trimq_namesrv_topics") or 0) >= 1
            assert value(s, "trimq_namesrv_clusters") == 1
            assert (value(s, "trimq_rpc_latency_seconds_count", request_code="REGISTER_BROKER",
                          response_code="SUCCESS") or 0) >= 1
            ages = [v for k, v in s.items() if k[0] == "trimq_namesrv_broker_registration_age_seconds"]
            assert len(ages) == 1 and ages[0] >= 0
            assert "process_resident_memory_bytes" in text


async def test_embedded_name_server_metrics_come_with_the_broker(broker_factory: Callable[..., Any]) -> None:
    async with broker_factory(metrics_port=0, embedded_namesrv=True, **QUIET) as b:
        register = b.register_service
        with trio.fail_after(10):
            await register.registered.wait()
        _, s = await scrape(b.metrics.address)
        assert value(s, "trimq_namesrv_brokers", cluster="DefaultCluster") == 1


async def test_unknown_request_codes_share_one_label(broker_factory: Callable[..., Any],
                                                     rclient: RemotingClient) -> None:
    async with broker_factory(metrics_port=0, **QUIET) as b:
        for code in (55_501, 55_502, 55_503):
            r = await call(rclient, b.address, code)
            assert r.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED
        _, s = await scrape(b.metrics.address)
        assert value(s, "trimq_rpc_latency_seconds_count", request_code="other",
                     response_code="REQUEST_CODE_NOT_SUPPORTED") == 3


def test_every_metric_is_documented() -> None:
    """docs/OPERATIONS.md lists every metric name of broker.metrics.METRICS and namesrv.metrics.METRICS."""
    doc = OPERATIONS_MD.read_text()
    documented = set(re.findall(r"`(trimq_[a-z_]+)`", doc))
    missing = (set(broker_metrics.METRICS) | set(namesrv_metrics.METRICS)) - documented
    assert not missing, f"metrics missing from docs/OPERATIONS.md: {sorted(missing)}"


async def test_refused_connections_are_counted_and_their_warning_rate_limited(
    broker_factory: Callable[..., Any], rclient: RemotingClient
) -> None:
    async with broker_factory(metrics_port=0, max_connections=1, **QUIET) as b:
        r = await call(rclient, b.address, RequestCode.GET_BROKER_RUNTIME_INFO)  # the one allowed connection
        assert r.code is not None
        host, port = b.address.rsplit(":", 1)
        with structlog.testing.capture_logs() as logs:
            for _ in range(3):
                stream = await trio.open_tcp_stream(host, int(port))
                async with stream:
                    with trio.fail_after(10):
                        assert await stream.receive_some(10) == b""  # closed by the broker at once
        refused = [e for e in logs if e["event"] == "connection.refused"]
        assert len(refused) == 1 and refused[0]["log_level"] == "warning"  # one line per 10 s, not per connection
        assert refused[0]["limit"] == 1 and refused[0]["suppressed"] == 0
        # The scrape itself is plain HTTP on another port: not refused.
        _, s = await scrape(b.metrics.address)
        assert value(s, "trimq_connections_refused_total") == 3
        assert value(s, "trimq_connections") == 1
