"""Master/slave brokers in-process over loopback (issue 15): a slave follows its master over the HA port,
serves pulls from the consume queues it rebuilt, refuses sends, syncs the master's metadata; SYNC_MASTER answers
SLAVE_NOT_AVAILABLE with no slave, FLUSH_SLAVE_TIMEOUT when the slave does not confirm, SUCCESS when it does."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from trimq.broker.broker import Broker
from trimq.broker.locks import make_epoch
from trimq.broker.store.ha.codec import Hello, StreamBuffer, encode_hello
from trimq.broker.store.offset_merge import CommitVersion
from trimq.protocol.address import parse_address
from trimq.protocol.codes import RequestCode, ResponseCode
from trimq.protocol.command import RemotingCommand
from trimq.protocol.message import encode_properties
from trimq.protocol.record import parse_message_id
from trimq.runtime.client import RemotingClient

RC = RequestCode


async def call(rc: RemotingClient, addr: str, code: int, ext: dict[str, Any] | None = None, body: Any = None
               ) -> RemotingCommand:
    return await rc.invoke(addr, RemotingCommand.request(code, ext or {}, body), timeout_s=10)


async def send(rc: RemotingClient, addr: str, topic: str, qid: int, body: bytes) -> RemotingCommand:
    ext = {"producerGroup": "pg", "topic": topic, "queueId": qid, "sysFlag": 0, "bornTimestamp": 1, "flag": 0,
           "properties": encode_properties({"KEYS": body.decode()})}
    return await call(rc, addr, RC.SEND_MESSAGE, ext, body)


def slave_settings(master: Broker, **extra: Any) -> dict[str, Any]:
    return {"broker_role": "SLAVE", "broker_id": 1, "ha_master_address": master.ha_controller.ha_server_addr,
            **extra}


async def group_and_offset_on(rc: RemotingClient, master: Broker, offset: int) -> None:
    """Group ``cg`` (retryMaxTimes 5) and its committed ``offset`` of Orders queue 1, made on the master."""
    r = await call(rc, master.address, RC.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
                   body={"groupName": "cg", "retryMaxTimes": 5})
    assert r.code == ResponseCode.SUCCESS, r.remark
    r = await call(rc, master.address, RC.UPDATE_CONSUMER_OFFSET,
                   {"consumerGroup": "cg", "topic": "Orders", "queueId": 1, "commitOffset": offset})
    assert r.code == ResponseCode.SUCCESS, r.remark


@asynccontextmanager
async def master_and_synced_slave(broker_factory: Callable[..., Any], **slave_extra: Any
                                  ) -> AsyncIterator[tuple[Broker, Broker, Any]]:
    """A master and its slave with no offset rounds of their own (the test drives them), once the slave has had the
    full sync its handshake brings (the next one is 10 s away): (master, slave, the slave's sync)."""
    async with broker_factory() as master, \
            master_and_synced_slave_of(broker_factory, master, slave_offset_sync_interval_ms=0,
                                       **slave_extra) as (slave, sync):
        yield master, slave, sync


@asynccontextmanager
async def master_and_synced_slave_of(broker_factory: Callable[..., Any], master: Broker, **slave_extra: Any
                                     ) -> AsyncIterator[tuple[Broker, Any]]:
    """The slave of a running master, once it has had the full sync its handshake brings: (slave, its sync)."""
    async with broker_factory(**slave_settings(master), **slave_extra) as slave:
        sync = slave.ha_controller.sync
        with trio.fail_after(10):
            while sync.syncs == 0:
                await trio.sleep(0.01)
        yield slave, sync


async def caught_up(master: Broker, slave: Broker) -> None:
    with trio.fail_after(10):
        while not slave.ha_controller.client.connected or \
                slave.store.commitlog.max_offset != master.store.commitlog.max_offset or \
                slave.ha_controller.client.writer.reput_offset != master.store.commitlog.max_offset or \
                master.ha_controller.service.push_slave_max_offset != master.store.commitlog.max_offset:
            await trio.sleep(0.01)


async def test_slave_replicates_serves_pulls_refuses_sends_and_syncs_metadata(
        broker_factory: Callable[..., Any], rclient: RemotingClient) -> None:
    # the slave writes its offsets periodically only once in 10 minutes here: what is on its disk came from the sync
    async with broker_factory() as master, \
            broker_factory(**slave_settings(master), flush_consumer_offset_interval_ms=600_000) as slave:
        for i in range(30):
            r = await send(rclient, master.address, "Orders", i % 2, b"m%d" % i)
            assert r.code == ResponseCode.SUCCESS, r.remark
        await caught_up(master, slave)
        assert master.ha_controller.status()["lagBytes"] == 0
        # the slave's index is built from the replicated records too
        slave.store.index_dispatcher.dispatch_all()
        found = slave.store.index_dispatcher.query_messages("Orders", "m7", 4, 0, 2**62)
        assert [m.body for m in found.messages] == [b"m7"]
        assert await slave.ha_controller.sync.sync_all(rclient)  # topic configs (RocketMQ: 3 s after the start)
        # pulls from the slave read the replicated records through its rebuilt consume queues
        pull = {"consumerGroup": "cg", "topic": "Orders", "queueId": 1, "queueOffset": 0, "maxMsgNums": 32,
                "sysFlag": 0, "commitOffset": 0, "suspendTimeoutMillis": 0, "subscription": "*", "subVersion": 0}
        on_slave = await call(rclient, slave.address, RC.PULL_MESSAGE, pull)
        on_master = await call(rclient, master.address, RC.PULL_MESSAGE, pull)
        assert on_slave.code == ResponseCode.SUCCESS and on_slave.body == on_master.body
        assert on_slave.ext["nextBeginOffset"] == 15
        # a slave refuses sends, saying why
        r = await send(rclient, slave.address, "Orders", 0, b"nope")
        assert r.code == ResponseCode.SERVICE_NOT_AVAILABLE
        assert "SLAVE" in (r.remark or "") and master.address in (r.remark or "")
        # metadata: topics, subscription groups and consumer offsets come from the master
        await group_and_offset_on(rclient, master, offset=9)
        assert await slave.ha_controller.sync.sync_all(rclient)
        assert slave.topic_config_manager.get("Orders") == master.topic_config_manager.get("Orders")
        cfg = slave.subscription_group_manager.get("cg")
        assert cfg is not None and cfg.retry_max_times == 5
        assert slave.offset_manager.query_offset("cg", "Orders", 1) == 9
        # and on its disk at once: a slave killed before its next periodic write would restart (and could be
        # promoted) on an older table (long ASYNC seed 18)
        on_disk = json.loads(Path(slave.offset_manager.path).read_text())
        assert on_disk["offsetTable"]["Orders@cg"]["1"] == 9
        status = slave.ha_controller.status()
        assert status["brokerRole"] == "SLAVE" and status["masterConnected"] and status["masterAddr"] == master.address
        # a topic created after the last sync: promoted, the slave gives its replicated queues a config at once
        assert (await send(rclient, master.address, "Fresh", 3, b"f")).code == ResponseCode.SUCCESS
        await caught_up(master, slave)
        assert slave.topic_config_manager.get("Fresh") is None
        r = await call(rclient, slave.address, RC.PROMOTE_BROKER, {"brokerName": "broker-a", "brokerId": 1})
        assert r.code == ResponseCode.SUCCESS and r.ext["masterEpoch"] == 2, r.remark
        cfg = slave.topic_config_manager.get("Fresh")
        assert cfg is not None and cfg.write_queue_nums == 4


async def test_between_full_syncs_a_slave_merges_the_consumer_offsets_alone(
        broker_factory: Callable[..., Any], rclient: RemotingClient) -> None:
    # 100 ms: the smallest offset interval; the full syncs stay 10 s apart (the first came with the handshake)
    async with broker_factory() as master, broker_factory(**slave_settings(master),
                                                          slave_offset_sync_interval_ms=100) as slave:
        assert (await send(rclient, master.address, "Orders", 1, b"m")).code == ResponseCode.SUCCESS
        await caught_up(master, slave)
        with trio.fail_after(10):
            while slave.ha_controller.sync.syncs == 0:
                await trio.sleep(0.01)
        await group_and_offset_on(rclient, master, offset=1)
        with trio.fail_after(5):  # no call: the slave's own schedule brings it (a round ends after its write)
            sync = slave.ha_controller.sync
            while slave.offset_manager.query_offset("cg", "Orders", 1) != 1 or not sync.offset_syncs:
                await trio.sleep(0.01)
        on_disk = json.loads(Path(slave.offset_manager.path).read_text())
        assert on_disk["offsetTable"]["Orders@cg"]["1"] == 1
        # the group table waits for the next full sync
        assert slave.ha_controller.sync.syncs == 1 and slave.subscription_group_manager.get("cg") is None


async def test_offset_rounds_fetch_only_what_changed_since_the_last_answer(
        broker_factory: Callable[..., Any], rclient: RemotingClient) -> None:
    async with master_and_synced_slave(broker_factory, metrics_port=0) as (master, slave, sync):
        await group_and_offset_on(rclient, master, offset=1)
        for q in (0, 2, 3):
            r = await call(rclient, master.address, RC.UPDATE_CONSUMER_OFFSET,
                           {"consumerGroup": "cg", "topic": "Orders", "queueId": q, "commitOffset": 5})
            assert r.code == ResponseCode.SUCCESS, r.remark
        assert await sync.sync_offsets(rclient)
        fetched, incremental = sync.offset_queues_fetched, sync.incremental_offset_syncs
        r = await call(rclient, master.address, RC.UPDATE_CONSUMER_OFFSET,
                       {"consumerGroup": "cg", "topic": "Orders", "queueId": 2, "commitOffset": 9})
        assert r.code == ResponseCode.SUCCESS, r.remark
        assert await sync.sync_offsets(rclient)
        # one queue changed: one queue came, and it was merged
        assert (sync.offset_queues_fetched - fetched, sync.incremental_offset_syncs) == (1, incremental + 1)
        assert slave.offset_manager.query_offset("cg", "Orders", 2) == 9
        assert await sync.sync_offsets(rclient) and sync.offset_queues_fetched - fetched == 1  # nothing changed
        # a full sync takes the whole table, as do the rounds after the master's table is another one (a restart)
        assert await sync.sync_all(rclient) and sync.offset_queues_fetched - fetched == 1 + 4
        master.offset_manager.table_id = "restarted"
        assert await sync.sync_offsets(rclient) and sync.offset_queues_fetched - fetched == 1 + 4 + 4
        assert sync.offset_table_seen == ("restarted", master.offset_manager.change_serial)
        # what an operator sees: 4 + 1 queues came as changes, 4 + 4 whole (the handshake's sync had none yet)
        assert slave.metrics is not None
        sample = slave.metrics.registry.get_sample_value
        assert sample("trimq_ha_offset_queues_fetched_total", {"answer": "changes"}) == 5
        assert sample("trimq_ha_offset_queues_fetched_total", {"answer": "whole"}) == 8
        # the request's fields: a serial beyond the table's gets the whole table; a malformed field, a clear error
        r = await call(rclient, master.address, RC.GET_ALL_CONSUMER_OFFSET,
                       {"offsetTableId": "restarted", "sinceChangeSerial": master.offset_manager.change_serial + 1})
        assert r.code == ResponseCode.SUCCESS and r.ext["incremental"] is False and len(r.body["offsetTable"]
                                                                                        ["Orders@cg"]) == 4
        for ext in ({"offsetTableId": "restarted"}, {"offsetTableId": "restarted", "sinceChangeSerial": -1},
                    {"sinceChangeSerial": 0}):  # no serial, a negative one, no table: the whole table
            r = await call(rclient, master.address, RC.GET_ALL_CONSUMER_OFFSET, ext)
            assert r.code == ResponseCode.SUCCESS and r.ext["incremental"] is False, ext
            assert len(r.body["offsetTable"]["Orders@cg"]) == 4, ext
        r = await call(rclient, master.address, RC.GET_ALL_CONSUMER_OFFSET, {"offsetTableId": 7})
        assert r.code == ResponseCode.SYSTEM_ERROR and "offsetTableId" in (r.remark or "")
        r = await call(rclient, master.address, RC.GET_ALL_CONSUMER_OFFSET,
                       {"offsetTableId": "restarted", "sinceChangeSerial": "soon"})
        assert r.code == ResponseCode.SYSTEM_ERROR and "sinceChangeSerial" in (r.remark or "")


async def test_a_group_deleted_on_the_master_loses_its_offsets_on_the_slave_too(
        broker_factory: Callable[..., Any], rclient: RemotingClient) -> None:
    # RocketMQ's slave keeps a deleted group's offsets (it merges the master's table into its own), and serves
    # them once promoted: a group created again under the old name would start from them.
    async with master_and_synced_slave(broker_factory) as (master, slave, sync):
        await group_and_offset_on(rclient, master, offset=4)
        r = await call(rclient, master.address, RC.UPDATE_CONSUMER_OFFSET,
                       {"consumerGroup": "keep", "topic": "Orders", "queueId": 1, "commitOffset": 2})
        assert r.code == ResponseCode.SUCCESS, r.remark
        assert await sync.sync_offsets(rclient)
        assert slave.offset_manager.query_offset("cg", "Orders", 1) == 4
        r = await call(rclient, master.address, RC.DELETE_SUBSCRIPTIONGROUP, {"groupName": "cg", "removeOffset": True})
        assert r.code == ResponseCode.SUCCESS, r.remark
        assert await sync.sync_offsets(rclient) and sync.incremental_offset_syncs >= 1
        assert slave.offset_manager.query_offset("cg", "Orders", 1) == -1
        assert slave.offset_manager.query_offset("keep", "Orders", 1) == 2
        assert slave.offset_manager.path is not None
        on_disk = json.loads(Path(slave.offset_manager.path).read_text())  # written at once, as a merge is
        assert "Orders@cg" not in on_disk["offsetTable"] and on_disk["offsetTable"]["Orders@keep"] == {"1": 2}
        # a slave hands over offsets, never removals: a MERGE_CONSUMER_OFFSET naming one removes nothing
        r = await call(rclient, master.address, RC.MERGE_CONSUMER_OFFSET, body={
            "offsetTable": {}, "removedOffsetTable": {"Orders@keep": {"1": [9, 9, 2**40]}}})
        assert r.code == ResponseCode.SUCCESS and r.ext["merged"] == 0, r.remark
        assert master.offset_manager.query_offset("keep", "Orders", 1) == 2


async def test_a_group_deleted_while_the_slave_was_away_and_the_master_restarted_since_is_removed_on_its_return(
        broker_factory: Callable[..., Any], rclient: RemotingClient, tmp_path: Any) -> None:
    # The restarted master's table is a new one, so the returning slave's first sync gets it whole: before the
    # removals were kept in the offset file, that table did not say the group was deleted and the slave kept (and,
    # once promoted, served) its offsets.
    m_dir, s_dir = str(tmp_path / "m"), str(tmp_path / "s")
    slave_extra = {"store_dir": s_dir, "slave_offset_sync_interval_ms": 0}
    async with broker_factory(store_dir=m_dir) as master:
        async with master_and_synced_slave_of(broker_factory, master, **slave_extra) as (slave, sync):
            await group_and_offset_on(rclient, master, offset=4)
            assert await sync.sync_offsets(rclient)
            assert slave.offset_manager.query_offset("cg", "Orders", 1) == 4
        r = await call(rclient, master.address, RC.DELETE_SUBSCRIPTIONGROUP, {"groupName": "cg", "removeOffset": True})
        assert r.code == ResponseCode.SUCCESS, r.remark
    async with broker_factory(store_dir=m_dir) as master:
        assert master.offset_manager.query_offset("cg", "Orders", 1) == -1
        async with master_and_synced_slave_of(broker_factory, master, **slave_extra) as (slave, sync):
            assert slave.offset_manager.query_offset("cg", "Orders", 1) == -1
            assert sync.offset_table_seen is not None and sync.offset_table_seen[0] == master.offset_manager.table_id


async def test_offset_rounds_after_a_bad_answer_and_with_a_master_from_before_the_changes_form(
        broker_factory: Callable[..., Any], rclient: RemotingClient) -> None:
    async with master_and_synced_slave(broker_factory) as (master, slave, sync):
        seen = sync.offset_table_seen
        assert seen is not None and seen[0] == master.offset_manager.table_id
        real = master.ha_controller.get_all_consumer_offset
        asked: list[dict[str, Any]] = []

        async def bad(cmd: RemotingCommand, conn: Any) -> RemotingCommand:
            return RemotingCommand.response_to(cmd, body={"no": "offsetTable"})

        async def from_before(cmd: RemotingCommand, conn: Any) -> RemotingCommand:
            asked.append(dict(cmd.ext))
            cmd.ext = {}
            resp = await real(cmd, conn)
            resp.ext = {}  # RocketMQ's brokers, and trimq's before the incremental form, answer no such fields
            return resp

        # a bad answer fails the round and keeps the serial: the next round asks again for everything since it
        master.server.register(RC.GET_ALL_CONSUMER_OFFSET, bad)
        await group_and_offset_on(rclient, master, offset=4)
        assert not await sync.sync_offsets(rclient) and sync.offset_table_seen == seen
        master.server.register(RC.GET_ALL_CONSUMER_OFFSET, real)
        assert await sync.sync_offsets(rclient) and sync.incremental_offset_syncs == 1
        assert slave.offset_manager.query_offset("cg", "Orders", 1) == 4
        # a master that names no table gets whole-table requests from then on
        master.server.register(RC.GET_ALL_CONSUMER_OFFSET, from_before)
        assert await sync.sync_offsets(rclient) and sync.offset_table_seen is None
        assert await sync.sync_offsets(rclient)
        assert asked[0]["offsetTableId"] == master.offset_manager.table_id and asked[1] == {}
        assert sync.incremental_offset_syncs == 1 and sync.offset_queues_whole == 2


async def test_the_age_of_a_slaves_offsets_is_reported_and_grows_while_its_syncs_fail(
        broker_factory: Callable[..., Any], rclient: RemotingClient) -> None:
    async with broker_factory(metrics_port=0) as master, \
            broker_factory(**slave_settings(master), slave_offset_sync_interval_ms=0, metrics_port=0) as slave:
        assert master.metrics is not None and slave.metrics is not None
        await caught_up(master, slave)
        sync, now = slave.ha_controller.sync, [10_000_000]
        sync.now_ms = lambda: now[0]
        assert await sync.sync_offsets(rclient)
        now[0] += 7_000
        assert slave.ha_controller.status()["offsetsSyncAgeMs"] == 7_000
        gauge = slave.metrics.registry.get_sample_value
        assert gauge("trimq_ha_offsets_sync_age_seconds") == 7.0
        # the HA stream still works but the master's request port does not answer (TrimqSlaveOffsetsStale)
        sync.master_addr = lambda: "127.0.0.1:1"
        assert not await sync.sync_offsets(rclient)
        now[0] += 60_000
        assert slave.ha_controller.client.connected and gauge("trimq_ha_offsets_sync_age_seconds") == 67.0
        assert master.ha_controller.status().get("offsetsSyncAgeMs") is None
        assert master.metrics.registry.get_sample_value("trimq_ha_offsets_sync_age_seconds") == 0.0


async def silent_slave(master: Broker) -> trio.SocketStream:
    """A connection to the master's HA port that completes the handshake and then never reports an offset."""
    host, port = parse_address(master.ha_controller.ha_server_addr)
    stream = await trio.open_tcp_stream(host, port)
    await stream.send_all(encode_hello(Hello(0, 0)))
    buf = StreamBuffer()
    while buf.next_hello_ack() is None:
        buf.feed(await stream.receive_some(65536))
    return stream


async def test_sync_master_waits_for_its_slave(broker_factory: Callable[..., Any], rclient: RemotingClient) -> None:
    async with broker_factory(broker_role="SYNC_MASTER", slave_timeout=150) as master:
        # no slave: stored, but SLAVE_NOT_AVAILABLE (11), with the message's id and offset
        r = await send(rclient, master.address, "T", 0, b"a")
        assert r.code == ResponseCode.SLAVE_NOT_AVAILABLE and r.ext["queueOffset"] == 0 and r.ext["msgId"]
        # a slave that completes the handshake and never reports: FLUSH_SLAVE_TIMEOUT (12) after slave_timeout
        silent = await silent_slave(master)
        r = await send(rclient, master.address, "T", 0, b"b")
        assert r.code == ResponseCode.FLUSH_SLAVE_TIMEOUT and r.ext["queueOffset"] == 1
        await silent.aclose()
        # a real slave confirms: SUCCESS
        async with broker_factory(**slave_settings(master)) as slave:
            with trio.fail_after(10):
                while not master.ha_controller.service.connections:
                    await trio.sleep(0.01)
            r = await send(rclient, master.address, "T", 0, b"c")
            assert r.code == ResponseCode.SUCCESS, r.remark
            assert slave.store.commitlog.max_offset >= master.store.commitlog.max_offset
        svc = master.ha_controller.service
        assert svc.slave_not_available >= 1 and svc.sync_timeouts == 1 and svc.sync_ok >= 1


async def test_sync_master_send_back_waits_for_its_slave(broker_factory: Callable[..., Any],
                                                         rclient: RemotingClient) -> None:
    """A retry copy is acknowledged like a send: once a slave holds it (the client then commits past the
    original, so a copy only the master held would be lost with it); without a slave, SYSTEM_ERROR naming the
    status (SLAVE_NOT_AVAILABLE, FLUSH_SLAVE_TIMEOUT), the copy stored on the master all the same (RocketMQ's
    asyncConsumerSendMsgBack)."""
    async with broker_factory(broker_role="SYNC_MASTER", slave_timeout=150) as master:
        r = await send(rclient, master.address, "T", 0, b"a")
        assert r.code == ResponseCode.SLAVE_NOT_AVAILABLE
        # delayLevel -1: straight to the dead-letter queue (no parking in the schedule topic)
        back = {"group": "cg", "offset": parse_message_id(r.ext["msgId"])[1], "delayLevel": -1,
                "originMsgId": r.ext["msgId"], "originTopic": "T"}
        end = master.store.commitlog.max_offset
        refused = await call(rclient, master.address, RC.CONSUMER_SEND_MSG_BACK, back)
        assert refused.code == ResponseCode.SYSTEM_ERROR and refused.remark == "SLAVE_NOT_AVAILABLE"
        assert master.store.commitlog.max_offset > end  # stored on the master all the same
        silent = await silent_slave(master)
        late = await call(rclient, master.address, RC.CONSUMER_SEND_MSG_BACK, back)
        assert late.code == ResponseCode.SYSTEM_ERROR and late.remark == "FLUSH_SLAVE_TIMEOUT"
        await silent.aclose()
        async with broker_factory(**slave_settings(master)) as slave:
            with trio.fail_after(10):
                while not master.ha_controller.service.connections:
                    await trio.sleep(0.01)
            ok = await call(rclient, master.address, RC.CONSUMER_SEND_MSG_BACK, back)
            assert ok.code == ResponseCode.SUCCESS, ok.remark
            assert slave.store.commitlog.max_offset >= master.store.commitlog.max_offset
            assert master.store.get_max_offset_in_queue("%DLQ%cg", 0) == 3


def _log_bytes(b: Broker, end: int) -> bytes:
    out = bytearray()
    for seg in b.store.commitlog.segments:
        if seg.start < end:
            out += seg.path.read_bytes()[: min(end, seg.end) - seg.start]
    return bytes(out)


async def test_promotion_and_the_old_masters_demotion_with_tail_truncation(
        broker_factory: Callable[..., Any], namesrv_factory: Callable[..., Any], rclient: RemotingClient,
        tmp_path: Any) -> None:
    from trimq.client.admin import open_admin

    a_dir, b_dir = str(tmp_path / "a"), str(tmp_path / "b")

    async def commit_u(broker: Broker, offset: int) -> None:
        r = await call(rclient, broker.address, RC.UPDATE_CONSUMER_OFFSET,
                       {"consumerGroup": "cg", "topic": "U", "queueId": 0, "commitOffset": offset})
        assert r.code == ResponseCode.SUCCESS, r.remark

    async with namesrv_factory() as ns:
        common = {"namesrv_addr": ns.address, "broker_name": "broker-a"}
        slave_cfg = {**common, "store_dir": b_dir, "broker_role": "SLAVE", "broker_id": 1}
        # 1. a pair: the slave finds its master through the name server and copies it
        async with broker_factory(store_dir=a_dir, **common) as a:
            async with broker_factory(**slave_cfg) as b:
                for i in range(10):
                    assert (await send(rclient, a.address, "T", i % 2, b"both%d" % i)).code == ResponseCode.SUCCESS
                for i in range(2):
                    assert (await send(rclient, a.address, "U", 0, b"u%d" % i)).code == ResponseCode.SUCCESS
                await commit_u(a, 1)
                await caught_up(a, b)
                assert await b.ha_controller.sync.sync_all(rclient)  # the slave knows U's offset 1
                promoted_at = b.store.commitlog.max_offset
            # 2. the slave is gone; the master writes a tail the slave never gets, then dies. A consumer of U
            # consumed into that tail and committed there (a newer commit than the slave synced).
            for i in range(5):
                assert (await send(rclient, a.address, "T", 0, b"tail%d" % i)).code == ResponseCode.SUCCESS
            for i in range(3):
                assert (await send(rclient, a.address, "U", 0, b"utail%d" % i)).code == ResponseCode.SUCCESS
            await commit_u(a, 5)
            old_end = a.store.commitlog.max_offset
            old_broker_epoch = a.lock_manager.broker_epoch
        assert old_end > promoted_at
        # 3. the slave is promoted and takes writes under master epoch 2
        async with broker_factory(**slave_cfg) as b:
            await b.register_service.registered.wait()
            # a synced commit made under a grant of a master lifetime this slave never heard of (the master
            # restarted between syncs): the promoted broker's grants must exceed it, or its holders' commits
            # would be refused as older
            unheard = make_epoch(old_broker_epoch + 5, 1)
            b.offset_manager.merge_entry("T@cg", 0, 1, CommitVersion(0, unheard, 1))
            async with open_admin(ns.address) as admin:
                result = await admin.broker_promote("broker-a", 1)
            assert (result.broker_role, result.master_epoch, result.max_offset) == ("ASYNC_MASTER", 2, promoted_at)
            assert b.ha_controller.role == "ASYNC_MASTER" and b.ha_controller.broker_id == 0
            assert b.lock_manager.broker_epoch > old_broker_epoch  # its lock epochs exceed the old master's
            assert make_epoch(b.lock_manager.broker_epoch, 0) > unheard  # and every synced commit's
            assert b.lock_manager.in_restart_grace()  # no lock table: the lease restart grace first
            assert b.ha_controller.state.history == [(1, 0), (2, promoted_at)]
            # never synced from the old master (the first sync is 3 s after the start): the topic of its queues
            # gets a config at the promotion, so it is routed at once
            cfg = b.topic_config_manager.get("T")
            assert cfg is not None and cfg.write_queue_nums == 4
            for i in range(3):
                r = await send(rclient, b.address, "T", i % 2, b"new%d" % i)
                assert r.code == ResponseCode.SUCCESS, r.remark
            with trio.fail_after(10):  # registered as the master of broker-a
                while ns.routes.master_of("broker-a")[0] != b.address:
                    await trio.sleep(0.01)
            # 4. the old master comes back as ASYNC_MASTER: superseded, it becomes a slave and cuts its tail
            async with broker_factory(store_dir=a_dir, **common) as a:
                with trio.fail_after(10):
                    while a.ha_controller.role != "SLAVE" or not a.ha_controller.client.connected:
                        await trio.sleep(0.01)
                await caught_up(b, a)
                end = b.store.commitlog.max_offset
                assert a.store.commitlog.max_offset == end
                assert _log_bytes(a, end) == _log_bytes(b, end)
                assert a.ha_controller.state.history == [(1, 0), (2, promoted_at)]
                r = await send(rclient, a.address, "T", 0, b"refused")
                assert r.code == ResponseCode.SERVICE_NOT_AVAILABLE and b.address in (r.remark or "")
                # U's offset 5 pointed into the cut tail: moved back to U's end in the new log (2), and what the old
                # master hands its new master never skips the new master's messages at U's offsets 2..4 (chaos long
                # ASYNC seed 13: the old commit, newer than the synced one, was handed over and adopted)
                assert a.offset_manager.query_offset("cg", "U", 0) == 2
                # and on disk before the new master's records fill those offsets (long ASYNC seed 19: a crash before
                # the next periodic write brought 5 back, where it no longer looked past the end)
                on_disk = json.loads((Path(a_dir) / "config" / "consumerOffset.json").read_text())
                assert on_disk["offsetTable"]["U@cg"]["0"] == 2
                for i in range(3):
                    assert (await send(rclient, b.address, "U", 0, b"unew%d" % i)).code == ResponseCode.SUCCESS
                assert await a.ha_controller.sync.sync_all(rclient)
                assert b.offset_manager.query_offset("cg", "U", 0) == 2
                assert ns.routes.master_of("broker-a")[0] == b.address
                # no unit of the cut tail is left: the old master's queue 0 reads what the new master has
                pull = {"consumerGroup": "cg", "topic": "T", "queueId": 0, "queueOffset": 0, "maxMsgNums": 32,
                        "sysFlag": 0, "commitOffset": 0, "suspendTimeoutMillis": 0, "subscription": "*",
                        "subVersion": 0}
                on_a = await call(rclient, a.address, RC.PULL_MESSAGE, pull)
                on_b = await call(rclient, b.address, RC.PULL_MESSAGE, pull)
                assert on_a.body == on_b.body and b"tail" not in on_a.body
        # the demotion is durable: the old master restarts as a slave
        async with broker_factory(store_dir=a_dir, **common) as a:
            assert a.ha_controller.role == "SLAVE" and a.ha_controller.broker_id == 1


async def test_a_slave_restarted_while_its_master_is_away_promotes_above_the_masters_lock_epochs(
        broker_factory: Callable[..., Any], rclient: RemotingClient, tmp_path: Any) -> None:
    # long ASYNC chaos seed 56: the master had started three times, its slave twice, and the slave was promoted after
    # a restart (no handshake since, so no HelloAck in memory). It granted under the old master's broker epoch 3: a
    # commit the returning old master handed over (its epoch-3 grant, later counter) outranked the new holder's grant
    # and every commit of that holder was refused as stale.
    a_dir, b_dir = str(tmp_path / "a"), str(tmp_path / "b")

    async def master_lifetime() -> None:
        async with broker_factory(store_dir=a_dir):
            pass

    for _ in range(2):
        await master_lifetime()
    async with broker_factory(store_dir=a_dir) as a:
        assert a.lock_manager.broker_epoch == 3
        async with broker_factory(store_dir=b_dir, **slave_settings(a)) as b:
            await caught_up(a, b)
            assert b.lock_manager.broker_epoch == 1  # its own lifetime
    # the slave wrote down the master's broker epoch at the handshake: known across its restarts
    assert json.loads((Path(b_dir) / "config" / "brokerEpoch.json").read_text())["brokerEpoch"] == 3
    for _ in range(2):  # lifetimes of the master this slave never hears of
        await master_lifetime()
    old_broker_epoch = json.loads((Path(a_dir) / "config" / "brokerEpoch.json").read_text())["brokerEpoch"]
    assert old_broker_epoch == 5
    async with broker_factory(store_dir=b_dir, broker_role="SLAVE", broker_id=1,
                              ha_master_address="127.0.0.1:1") as b:  # the master is gone
        assert b.lock_manager.broker_epoch == 4  # its own start, above the master's it knew
        r = await call(rclient, b.address, RC.PROMOTE_BROKER, {"brokerName": b.config.broker_name, "brokerId": 1})
        assert r.code == ResponseCode.SUCCESS, r.remark
        assert b.ha_controller.role == "ASYNC_MASTER" and b.ha_controller.master_epoch == 2
        # master epoch 2's band: above the old master's lifetimes, the ones never heard of too
        assert b.lock_manager.broker_epoch == 2 << 16 > old_broker_epoch


async def test_runtime_info_shows_the_role_and_cli_flags_set_it(broker_factory: Callable[..., Any],
                                                                  rclient: RemotingClient) -> None:
    from click.testing import CliRunner

    from trimq.tools.broker import main

    out = CliRunner().invoke(main, ["--role", "slave", "--broker-id", "2", "--print-config"])
    assert out.exit_code == 0, out.output
    assert '"broker_role": "SLAVE"' in out.output and '"broker_id": 2' in out.output
    async with broker_factory(broker_role="SYNC_MASTER") as master:
        r = await call(rclient, master.address, RC.GET_BROKER_RUNTIME_INFO)
        ha = r.body["ha"]
        assert ha["brokerRole"] == "SYNC_MASTER" and ha["brokerId"] == 0 and ha["masterEpoch"] == 1
        assert ha["slaves"] == 0 and ha["haServerAddr"] == master.ha_controller.ha_server_addr


async def test_a_slave_with_no_way_to_find_its_master_says_so(broker_factory: Callable[..., Any]) -> None:
    """A slave started with neither name servers nor ha_master_address replicated nothing, silently (found by hand:
    ``trimq-broker --role slave --broker-id 1``). It still starts (one kept only to be promoted is a choice)."""
    from structlog.testing import capture_logs

    for settings, warned in (({}, True), ({"ha_master_address": "127.0.0.1:1"}, False)):
        with capture_logs() as logs:
            async with broker_factory(broker_role="SLAVE", broker_id=1, **settings):
                pass
        assert any(e["event"] == "ha.no_master_source" for e in logs) is warned, settings
