"""Master/slave brokers in-process, HA part 2 (issue 15): offsets committed to the slave while its master is
away survive the master's return (merged by commit version both ways); only a master delivers delayed
messages (RocketMQ's handleScheduleMessageService), a promoted slave starts delivering, and delivers a delayed
message whose copy never reached it though the progress it synced had passed it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import trio

from tests.integration.relay import Relay
from trimq.broker.broker import Broker
from trimq.client.api import ConsumerData, HeartbeatData, MQClientAPI
from trimq.client.errors import MQBrokerError, NoPermissionError
from trimq.protocol.codes import RequestCode, ResponseCode
from trimq.protocol.command import RemotingCommand
from trimq.protocol.message import encode_properties
from trimq.protocol.message_queue import MessageQueue
from trimq.runtime.client import RemotingClient

RC = RequestCode


async def call(rc: RemotingClient, addr: str, code: int, ext: dict[str, Any] | None = None, body: Any = None
               ) -> RemotingCommand:
    return await rc.invoke(addr, RemotingCommand.request(code, ext or {}, body), timeout_s=10)


async def send(rc: RemotingClient, addr: str, topic: str, qid: int, body: bytes, **props: str) -> RemotingCommand:
    ext = {"producerGroup": "pg", "topic": topic, "queueId": qid, "sysFlag": 0, "bornTimestamp": 1, "flag": 0,
           "properties": encode_properties(props)}
    return await call(rc, addr, RC.SEND_MESSAGE, ext, body)


async def commit(rc: RemotingClient, addr: str, qid: int, offset: int) -> None:
    r = await call(rc, addr, RC.UPDATE_CONSUMER_OFFSET,
                   {"consumerGroup": "cg", "topic": "T", "queueId": qid, "commitOffset": offset})
    assert r.code == ResponseCode.SUCCESS, r.remark


async def query(rc: RemotingClient, addr: str, qid: int) -> int:
    r = await call(rc, addr, RC.QUERY_CONSUMER_OFFSET, {"consumerGroup": "cg", "topic": "T", "queueId": qid})
    assert r.code == ResponseCode.SUCCESS, r.remark
    return int(r.ext["offset"])


async def until(pred: Callable[[], bool], what: str, timeout: float = 10) -> None:
    with trio.fail_after(timeout):
        while not pred():
            await trio.sleep(0.01)


async def run_broker(factory: Callable[..., Any], settings: dict[str, Any], stop: trio.Event,
                     stopped: trio.Event | None = None,
                     task_status: trio.TaskStatus[Broker] = trio.TASK_STATUS_IGNORED) -> None:
    """A broker in a task of its own, so it can stop while brokers started after it go on."""
    async with factory(**settings) as broker:
        task_status.started(broker)
        await stop.wait()
    if stopped is not None:
        stopped.set()


class Pair:
    """A master (on a store of its own, so it can stop and come back) and its slave, in ``nursery``."""

    def __init__(self, nursery: trio.Nursery, factory: Callable[..., Any], namesrv_addr: str, tmp_path: Any) -> None:
        self.nursery, self.factory = nursery, factory
        self.common = {"namesrv_addr": namesrv_addr, "broker_name": "broker-a", "register_broker_interval_ms": 1000}
        self.master_settings = {"store_dir": str(tmp_path / "master"), **self.common}

    async def start(self) -> tuple[Broker, Broker]:
        self.stop_master, self.master_stopped = trio.Event(), trio.Event()
        master: Broker = await self.nursery.start(run_broker, self.factory, self.master_settings, self.stop_master,
                                                  self.master_stopped)
        slave: Broker = await self.nursery.start(run_broker, self.factory,
                                                 {"broker_role": "SLAVE", "broker_id": 1, **self.common}, trio.Event())
        await until(lambda: slave.ha_controller.client.connected, "the slave following its master")
        self.slave = slave
        return master, slave

    async def stop(self) -> None:
        """The master goes away; the slave notices."""
        self.stop_master.set()
        await self.master_stopped.wait()
        await until(lambda: not self.slave.ha_controller.client.connected, "the slave noticing")

    async def restart(self) -> Broker:
        """The master comes back on its store (and runs to the end of the test)."""
        master: Broker = await self.nursery.start(run_broker, self.factory, self.master_settings, trio.Event())
        return master


async def test_offsets_committed_on_the_slave_survive_the_masters_return(
        broker_factory: Callable[..., Any], namesrv_factory: Callable[..., Any], rclient: RemotingClient,
        tmp_path: Any) -> None:
    async with namesrv_factory() as ns, trio.open_nursery() as nursery:
        pair = Pair(nursery, broker_factory, ns.address, tmp_path)
        master, slave = await pair.start()
        for i in range(4):
            assert (await send(rclient, master.address, "T", i % 2, b"m%d" % i)).code == ResponseCode.SUCCESS
        await commit(rclient, master.address, 0, 1)
        await commit(rclient, master.address, 1, 1)
        assert await slave.ha_controller.sync.sync_all(rclient)
        assert slave.offset_manager.query_offset("cg", "T", 1) == 1
        await commit(rclient, master.address, 1, 5)  # after the last sync: the slave never sees this one
        assert (await send(rclient, master.address, "Late", 0, b"late")).code == ResponseCode.SUCCESS
        await until(lambda: slave.store.get_max_offset_in_queue("Late", 0) == 1, "the late topic replicated")
        assert slave.topic_config_manager.get("Late") is None  # created after the last sync
        # the master goes away; its consumers read from the slave and commit there
        await pair.stop()
        # the slave serves the topic its master created after the last sync
        pull = {"consumerGroup": "cg", "topic": "Late", "queueId": 0, "queueOffset": 0, "maxMsgNums": 32,
                "sysFlag": 0, "commitOffset": 0, "suspendTimeoutMillis": 0, "subscription": "*", "subVersion": 0}
        r = await call(rclient, slave.address, RC.PULL_MESSAGE, pull)
        assert r.code == ResponseCode.SUCCESS and r.ext["nextBeginOffset"] == 1, r.remark
        await commit(rclient, slave.address, 0, 2)
        await commit(rclient, slave.address, 1, 3)  # newer than the master's 5, though smaller
        # the master returns on its store: the slave reconnects, merges and hands over what was committed to it
        master = await pair.restart()
        assert master.offset_manager.query_offset("cg", "T", 1) == 5  # (its own table, as it stopped)
        await until(lambda: slave.ha_controller.sync.pushed_offsets >= 2, "the slave handing its offsets over")
        assert [await query(rclient, master.address, q) for q in (0, 1)] == [2, 3]
        assert [await query(rclient, slave.address, q) for q in (0, 1)] == [2, 3]
        # a commit on the returned master is newer again, and the slave takes it at its next sync
        await commit(rclient, master.address, 1, 4)
        assert await slave.ha_controller.sync.sync_all(rclient)
        assert slave.offset_manager.query_offset("cg", "T", 1) == 4
        assert not slave.offset_manager.local_changes
        nursery.cancel_scope.cancel()


async def test_a_commit_under_an_older_lock_grant_never_rewinds_a_queue_across_its_masters_restart(
        broker_factory: Callable[..., Any], namesrv_factory: Callable[..., Any], rclient: RemotingClient,
        tmp_path: Any) -> None:
    """Long chaos seed 87: a consumer paused past its lease ("a") woke while the master was down and committed
    its old offset to the slave under its old lock epoch; the slave, which knew no newer grant, stamped it newer
    than the new holder's ("b") commits and handed it to the returning master: the queue went back ~250
    messages. A commit's lock epoch is now part of its version, and an epoch older than the queue's latest
    commit is refused wherever it arrives, a restarted master included."""
    q0 = MessageQueue("T", "broker-a", 0)
    sub = {"topic": "T", "subString": "*", "tagsSet": [], "codeSet": [], "subVersion": 1}
    async with namesrv_factory() as ns, trio.open_nursery() as nursery, \
            RemotingClient(default_timeout_s=10) as rc_a, RemotingClient(default_timeout_s=10) as rc_b:
        a, b = MQClientAPI(rc_a, timeout_ms=10_000), MQClientAPI(rc_b, timeout_ms=10_000)
        pair = Pair(nursery, broker_factory, ns.address, tmp_path)
        master, slave = await pair.start()
        for api, cid in ((a, "a"), (b, "b")):
            await api.heartbeat(master.address, HeartbeatData(cid, [], [ConsumerData(
                "cg", "CONSUME_PASSIVELY", "CLUSTERING", "CONSUME_FROM_FIRST_OFFSET", True, [sub])]))
        e1 = (await a.lock_batch_mq_lease(master.address, "cg", "a", [q0])).epochs[q0]
        await a.update_consumer_offset(master.address, "cg", q0, 10, "a", lock_epoch=e1)
        assert await slave.ha_controller.sync.sync_all(rclient)
        # "a" is cut off; "b" takes the queue over under a newer grant and commits after the slave's last sync
        await a.unlock_batch_mq(master.address, "cg", "a", [q0])
        e2 = (await b.lock_batch_mq_lease(master.address, "cg", "b", [q0])).epochs[q0]
        assert e2 > e1
        await b.update_consumer_offset(master.address, "cg", q0, 20, "b", lock_epoch=e2)
        await pair.stop()
        # "a" wakes up while the master is away and commits what it had, under its old epoch, to the slave
        await a.update_consumer_offset(slave.address, "cg", q0, 12, "a", lock_epoch=e1)
        assert await query(rclient, slave.address, 0) == 12  # it knows no newer grant than e1
        master = await pair.restart()
        await until(lambda: slave.ha_controller.client.connected, "the slave following the returned master")
        assert await slave.ha_controller.sync.sync_all(rclient)  # (it also syncs on reconnecting)
        assert await query(rclient, master.address, 0) == 20  # b's commit stands
        assert await query(rclient, slave.address, 0) == 20
        # its late commit straight to the restarted master (whose lock table is empty) is refused too
        with pytest.raises(NoPermissionError, match="epoch"):
            await a.update_consumer_offset(master.address, "cg", q0, 13, "a", lock_epoch=e1)
        await b.update_consumer_offset(master.address, "cg", q0, 21, "b", lock_epoch=e2)
        assert await query(rclient, master.address, 0) == 21
        nursery.cancel_scope.cancel()


async def test_a_pull_commit_in_a_promoted_masters_grace_outranks_the_old_masters_older_commit(
        broker_factory: Callable[..., Any], namesrv_factory: Callable[..., Any], rclient: RemotingClient,
        tmp_path: Any) -> None:
    """Long ASYNC seed 24: in the promoted master's restart grace (nobody may lock yet) the holder went on consuming
    and its pulls committed 444; a pull's commit said no lock epoch, so it ranked under the older one of the
    promoted master's stale table, and the demoted old master's earlier commit (442, under a later grant of its
    lifetime) won the merge: the queue went back. A pull's commit now says the grant it was consumed under."""
    from trimq.client.admin import open_admin

    q0 = MessageQueue("T", "broker-a", 0)
    sub = {"topic": "T", "subString": "*", "tagsSet": [], "codeSet": [], "subVersion": 1}
    async with namesrv_factory() as ns, trio.open_nursery() as nursery, \
            RemotingClient(default_timeout_s=10) as rc_a:
        a = MQClientAPI(rc_a, timeout_ms=10_000)
        pair = Pair(nursery, broker_factory, ns.address, tmp_path)
        master, slave = await pair.start()
        for i in range(20):
            assert (await send(rclient, master.address, "T", 0, b"m%d" % i)).code == ResponseCode.SUCCESS
        await until(lambda: slave.store.commitlog.max_offset == master.store.commitlog.max_offset, "caught up")
        await a.heartbeat(master.address, HeartbeatData("a", [], [ConsumerData(
            "cg", "CONSUME_PASSIVELY", "CLUSTERING", "CONSUME_FROM_FIRST_OFFSET", True, [sub])]))
        e1 = (await a.lock_batch_mq_lease(master.address, "cg", "a", [q0])).epochs[q0]
        await a.update_consumer_offset(master.address, "cg", q0, 10, "a", lock_epoch=e1)
        assert await slave.ha_controller.sync.sync_all(rclient)  # the slave's last view: 10 under e1
        await a.unlock_batch_mq(master.address, "cg", "a", [q0])
        e2 = (await a.lock_batch_mq_lease(master.address, "cg", "a", [q0])).epochs[q0]
        assert e2 > e1
        await a.update_consumer_offset(master.address, "cg", q0, 12, "a", lock_epoch=e2)
        await pair.stop()
        async with open_admin(ns.address) as admin:
            assert (await admin.broker_promote("broker-a", 1)).master_epoch == 2
        assert slave.lock_manager.in_restart_grace()
        # the holder goes on under its grant e2 and pulls from the promoted master, committing 14 on the way
        result = await a.pull_message(slave.address, consumer_group="cg", mq=q0, queue_offset=14, max_msg_nums=4,
                                      sys_flag=1, commit_offset=14, suspend_timeout_millis=0, subscription="*",
                                      sub_version=1, lock_epoch=e2)
        assert result.status.name == "FOUND"
        assert slave.offset_manager.commit_version("cg", "T", 0).lock_epoch == e2
        # and judged by it: a pull's commit under the older grant e1 is refused as UPDATE_CONSUMER_OFFSET's would be
        await a.pull_message(slave.address, consumer_group="cg", mq=q0, queue_offset=16, max_msg_nums=4, sys_flag=1,
                             commit_offset=16, suspend_timeout_millis=0, subscription="*", sub_version=1, lock_epoch=e1)
        assert slave.offset_manager.query_offset("cg", "T", 0) == 14 and slave.offset_manager.fenced_updates["cg"] == 1
        # the old master comes back on its store, is superseded, follows and hands over its older 12 (under e2 too)
        old = await pair.restart()
        await until(lambda: old.ha_controller.role == "SLAVE" and old.ha_controller.client.connected,
                    "the old master following the promoted one", timeout=15)
        assert await old.ha_controller.sync.sync_all(rclient)
        assert await query(rclient, slave.address, 0) == 14
        assert await query(rclient, old.address, 0) == 14
        nursery.cancel_scope.cancel()


async def test_an_old_master_returning_while_its_promoted_slave_is_down_waits_as_that_ones_slave(
        broker_factory: Callable[..., Any], namesrv_factory: Callable[..., Any], rclient: RemotingClient,
        tmp_path: Any) -> None:
    """Chaos long ASYNC seed 11: the promoted master was killed right after its promotion, the old master came back
    on its store, found no live master to defer to, took the route and acknowledged sends; the promoted master's
    return cut them. The name server remembers the newest master: the old one waits as its slave, refusing sends,
    and follows it when it returns, losing nothing either acknowledged."""
    from trimq.client.admin import open_admin

    async with namesrv_factory() as ns, trio.open_nursery() as nursery:
        common = {"namesrv_addr": ns.address, "broker_name": "broker-a", "register_broker_interval_ms": 1000}
        a_cfg = {"store_dir": str(tmp_path / "a"), **common}
        b_cfg = {"store_dir": str(tmp_path / "b"), "broker_role": "SLAVE", "broker_id": 1, **common}
        stop_a, a_stopped = trio.Event(), trio.Event()
        a: Broker = await nursery.start(run_broker, broker_factory, a_cfg, stop_a, a_stopped)
        stop_b, b_stopped = trio.Event(), trio.Event()
        b: Broker = await nursery.start(run_broker, broker_factory, b_cfg, stop_b, b_stopped)
        for i in range(3):
            assert (await send(rclient, a.address, "T", 0, b"m%d" % i)).code == ResponseCode.SUCCESS
        await until(lambda: b.store.commitlog.max_offset == a.store.commitlog.max_offset, "the slave caught up")
        stop_a.set()
        await a_stopped.wait()
        async with open_admin(ns.address) as admin:
            assert (await admin.broker_promote("broker-a", 1)).master_epoch == 2
        r = await send(rclient, b.address, "T", 0, b"acked-by-the-promoted-master")
        assert r.code == ResponseCode.SUCCESS and r.ext["queueOffset"] == 3, r.remark
        await until(lambda: ns.routes.master_of("broker-a")[0] == b.address, "the promoted master registered")
        stop_b.set()  # the promoted master goes down too
        await b_stopped.wait()
        await until(lambda: ns.routes.master_of("broker-a") == ("", None), "no live master")
        # a slave registering now is told the newest epoch all the same (what a promotion of it must go above)
        r = await call(rclient, ns.address, RC.REGISTER_BROKER,
                       {"brokerAddr": "10.9.9.9:10911", "brokerName": "broker-a", "clusterName": "DefaultCluster",
                        "brokerId": 1}, {"topicConfigTable": {}})
        assert r.code == ResponseCode.SUCCESS and (r.ext["masterAddr"], r.ext["masterEpoch"]) == ("", 2), r.ext
        await call(rclient, ns.address, RC.UNREGISTER_BROKER,
                   {"brokerAddr": "10.9.9.9:10911", "brokerName": "broker-a", "clusterName": "DefaultCluster",
                    "brokerId": 1})
        # the old master comes back on its store: it is told of the promoted master and waits as its slave
        a = await nursery.start(run_broker, broker_factory, a_cfg, trio.Event())
        await until(lambda: a.ha_controller.role == "SLAVE", "the old master superseded")
        r = await send(rclient, a.address, "T", 0, b"would-be-cut")
        assert r.code == ResponseCode.SERVICE_NOT_AVAILABLE, r.remark
        assert ns.routes.master_of("broker-a")[0] != a.address
        assert a.ha_controller.learned_master_epoch == 2
        # promoting it would lose what the promoted master acknowledged: refused unless forced
        await until(lambda: ns.routes.broker_addr_table.get("broker-a") is not None
                    and ns.routes.broker_addr_table["broker-a"].broker_addrs.get(1) == a.address,
                    "registered as the slave")
        async with open_admin(ns.address) as admin:
            with pytest.raises(MQBrokerError, match="master of epoch 2 exists"):
                await admin.broker_promote("broker-a", 1)
        assert a.ha_controller.role == "SLAVE"
        # the promoted master returns (on another port): the old one follows it and gets what it acknowledged
        b = await nursery.start(run_broker, broker_factory, b_cfg, trio.Event())
        assert b.ha_controller.role == "ASYNC_MASTER" and b.ha_controller.master_epoch == 2
        await until(lambda: a.ha_controller.client.connected
                    and a.store.commitlog.max_offset == b.store.commitlog.max_offset, "the old master following",
                    timeout=15)
        p = await call(rclient, a.address, RC.PULL_MESSAGE, pull_request(3))
        assert p.code == ResponseCode.SUCCESS and b"acked-by-the-promoted-master" in p.body, p.remark
        nursery.cancel_scope.cancel()


async def test_a_restarted_master_takes_no_send_before_a_name_server_says_it_was_not_superseded(
        broker_factory: Callable[..., Any], namesrv_factory: Callable[..., Any], rclient: RemotingClient,
        tmp_path: Any) -> None:
    """The old master came back at its address after its slave's promotion, and a producer still routing to that
    address sent to it before the name server's answer demoted it: the send was acknowledged, then cut when the old
    master followed the promoted one. A restarted master now refuses sends until a name server answers its
    registration: here the name server that knows of the promotion is out of reach and a second one never heard of
    it (it answers at once: a name server that restarted since forgets), so it refuses, saying why, until the whole
    registration round is answered; the first one's answer demotes it. It never acknowledged anything the promoted
    master lacks."""
    from trimq.client.admin import open_admin

    async with namesrv_factory() as ns, namesrv_factory() as forgetful, trio.open_nursery() as nursery:
        relay = Relay(ns.address)  # the old master's way to the name server, which can stop answering
        await nursery.start(relay.serve)
        common = {"broker_name": "broker-a", "register_broker_interval_ms": 1000}
        a_cfg = {"store_dir": str(tmp_path / "a"), "namesrv_addr": f"{relay.address};{forgetful.address}", **common}
        stop_a, a_stopped = trio.Event(), trio.Event()
        a: Broker = await nursery.start(run_broker, broker_factory, a_cfg, stop_a, a_stopped)
        assert a.store.writable  # a store's first start: no master can have replaced it yet
        b: Broker = await nursery.start(run_broker, broker_factory, {"namesrv_addr": ns.address, "broker_role": "SLAVE",
                                                                     "broker_id": 1, **common}, trio.Event())
        assert (await send(rclient, a.address, "T", 0, b"m0")).code == ResponseCode.SUCCESS
        await until(lambda: b.store.commitlog.max_offset == a.store.commitlog.max_offset, "the slave caught up")
        stop_a.set()
        await a_stopped.wait()
        async with open_admin(ns.address) as admin:
            assert (await admin.broker_promote("broker-a", 1)).master_epoch == 2
        assert (await send(rclient, b.address, "T", 0, b"acked-by-the-promoted-master")).code == ResponseCode.SUCCESS
        relay.blackhole()
        forgetful.routes.newest_master.clear()  # the second name server "restarted"
        a = await nursery.start(run_broker, broker_factory, a_cfg, trio.Event())
        await until(lambda: forgetful.routes.master_of("broker-a")[0] == a.address, "the forgetful one answered")
        await trio.sleep(0.1)  # its answer reached the broker
        r = await send(rclient, a.address, "T", 0, b"would-be-cut")
        assert (r.code == ResponseCode.SERVICE_NOT_AVAILABLE and r.remark is not None
                and "not yet confirmed by a name server" in r.remark), r
        assert relay.address in r.remark and a.ha_controller.role == "ASYNC_MASTER"
        relay.heal()
        await until(lambda: a.ha_controller.role == "SLAVE", "the old master demoted by the name server's answer")
        await until(lambda: a.ha_controller.client.connected
                    and a.store.commitlog.max_offset == b.store.commitlog.max_offset, "the old master following")
        p = await call(rclient, a.address, RC.PULL_MESSAGE, pull_request(1))
        assert p.code == ResponseCode.SUCCESS and b"acked-by-the-promoted-master" in p.body, p.remark
        assert b"would-be-cut" not in p.body
        nursery.cancel_scope.cancel()


async def test_a_restarted_master_confirmed_by_its_name_server_takes_sends_and_can_opt_out_of_waiting(
        broker_factory: Callable[..., Any], namesrv_factory: Callable[..., Any], rclient: RemotingClient,
        tmp_path: Any) -> None:
    """A restarted master that no slave replaced takes sends once its name server answered; with
    ``ha_confirm_master_at_start = false`` (RocketMQ's behaviour) it takes them at once, answer or not."""
    async with namesrv_factory() as ns, trio.open_nursery() as nursery:
        relay = Relay(ns.address)
        await nursery.start(relay.serve)
        cfg = {"store_dir": str(tmp_path / "a"), "namesrv_addr": relay.address}

        async def restart(confirm: bool) -> tuple[Broker, trio.Event, trio.Event]:
            stop, stopped = trio.Event(), trio.Event()
            broker = await nursery.start(run_broker, broker_factory, {**cfg, "ha_confirm_master_at_start": confirm},
                                         stop, stopped)
            return broker, stop, stopped

        for confirm in (True, False):
            a, stop, stopped = await restart(confirm)
            assert (await send(rclient, a.address, "T", 0, b"first")).code == ResponseCode.SUCCESS

            def registered(a: Broker = a) -> bool:
                return a.register_service.registrations >= 1

            await until(registered, "registered")
            stop.set()
            await stopped.wait()
            relay.blackhole()  # the next start gets no answer until healed
            a, stop, stopped = await restart(confirm)
            r = await send(rclient, a.address, "T", 0, b"while-unconfirmed")
            assert r.code == (ResponseCode.SERVICE_NOT_AVAILABLE if confirm else ResponseCode.SUCCESS), r.remark
            relay.heal()

            def confirmed(a: Broker = a) -> bool:
                return a.store.writable

            await until(confirmed, "confirmed by the name server's answer")
            assert (await send(rclient, a.address, "T", 0, b"confirmed")).code == ResponseCode.SUCCESS
            assert a.ha_controller.role == "ASYNC_MASTER"
            stop.set()
            await stopped.wait()
        # without a name server to ask (an embedded one, or ha_master_address alone), a restart takes sends at once
        stop, stopped = trio.Event(), trio.Event()
        a = await nursery.start(run_broker, broker_factory, {**cfg, "namesrv_addr": ""}, stop, stopped)
        assert a.store.writable
        assert (await send(rclient, a.address, "T", 0, b"no-name-server")).code == ResponseCode.SUCCESS
        stop.set()
        await stopped.wait()
        nursery.cancel_scope.cancel()


async def test_a_slave_that_never_reached_its_master_refuses_promotion_unless_forced(
        broker_factory: Callable[..., Any], namesrv_factory: Callable[..., Any], rclient: RemotingClient) -> None:
    """A slave that never followed the master a name server names (its HA port unreachable here) holds none of its
    writes: promoting it would lose them, so it refuses; ``force`` promotes it above that master's epoch. The
    forced promotion goes through ``trimq-admin broker promote --force``, the operator's way."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from trimq.client.admin import open_admin

    async def promote_cli(*extra: str) -> subprocess.CompletedProcess[bytes]:
        cli = str(Path(sys.executable).with_name("trimq-admin"))
        return await trio.run_process([cli, "--namesrv", ns.address, "--json", "broker", "promote", "--broker-name",
                                       "broker-a", "--broker-id", "1", *extra], capture_stdout=True,
                                      capture_stderr=True, check=False)

    async with namesrv_factory() as ns:
        common = {"namesrv_addr": ns.address, "broker_name": "broker-a", "register_broker_interval_ms": 1000}
        async with broker_factory(**common) as master, \
                broker_factory(broker_role="SLAVE", broker_id=1, ha_master_address="127.0.0.1:9", **common) as slave:
            assert (await send(rclient, master.address, "T", 0, b"only-on-the-master")).code == ResponseCode.SUCCESS
            await until(lambda: slave.ha_controller.learned_master_epoch == 1, "the slave told of its master")
            async with open_admin(ns.address) as admin:
                with pytest.raises(MQBrokerError, match="followed master epochs up to 0 only"):
                    await admin.broker_promote("broker-a", 1)
                assert slave.ha_controller.role == "SLAVE"
            refused = await promote_cli()
            assert refused.returncode != 0 and b"followed master epochs up to 0 only" in refused.stderr + refused.stdout
            assert slave.ha_controller.role == "SLAVE"
            forced = await promote_cli("--force")
            assert forced.returncode == 0, forced.stderr
            result = json.loads(forced.stdout)
            assert (result["brokerRole"], result["masterEpoch"]) == ("ASYNC_MASTER", 2)


async def test_only_a_master_delivers_delayed_messages(broker_factory: Callable[..., Any],
                                                       rclient: RemotingClient) -> None:
    levels = {"message_delay_level": "100ms 200ms"}
    async with broker_factory(**levels) as master, broker_factory(
            broker_role="SLAVE", broker_id=1, ha_master_address=master.ha_controller.ha_server_addr,
            **levels) as slave:
        r = await send(rclient, master.address, "T", 0, b"later", DELAY="1")
        assert r.code == ResponseCode.SUCCESS, r.remark
        await until(lambda: master.schedule_message_service.delivered == 1, "the master's delivery")
        await until(lambda: slave.store.get_max_offset_in_queue("T", 0) == 1, "the copy replicated")
        await trio.sleep(0.3)  # the slave had the schedule entry for longer than its delay
        assert slave.schedule_message_service.delivered == 0
        # promoted, it delivers
        r = await call(rclient, slave.address, RC.PROMOTE_BROKER, {"brokerName": "broker-a", "brokerId": 1})
        assert r.code == ResponseCode.SUCCESS, r.remark
        r = await send(rclient, slave.address, "T", 0, b"later2", DELAY="1")
        assert r.code == ResponseCode.SUCCESS, r.remark
        await until(lambda: slave.schedule_message_service.delivered == 1, "the promoted slave's delivery")


async def test_a_promoted_slave_delivers_a_delayed_message_its_synced_progress_had_passed(
        broker_factory: Callable[..., Any], rclient: RemotingClient) -> None:
    """The master delivers a delayed message while the copy has not reached the slave, and the slave's metadata sync
    takes the master's delay progress past it: promoted, the slave must deliver it rather than lose it (its
    schedule entry was replicated long before; a send-back on a SYNC_MASTER is answered only after that)."""
    levels = {"message_delay_level": "100ms 200ms"}
    async with broker_factory(**levels) as master, trio.open_nursery() as nursery:
        link = Relay(master.ha_controller.ha_server_addr)
        await nursery.start(link.serve)
        async with broker_factory(broker_role="SLAVE", broker_id=1, ha_master_address=link.address,
                                  **levels) as slave:
            r = await send(rclient, master.address, "T", 0, b"later", DELAY="1")
            assert r.code == ResponseCode.SUCCESS, r.remark
            await until(lambda: slave.store.commitlog.max_offset == master.store.commitlog.max_offset,
                        "the schedule entry replicated")
            link.blackhole()
            await until(lambda: master.schedule_message_service.delivered == 1, "the master's delivery")
            assert await slave.ha_controller.sync.sync_all(rclient)
            assert slave.schedule_message_service.offsets[1] == 1  # the master's progress, past the entry
            assert slave.store.get_max_offset_in_queue("T", 0) == 0  # but the copy never arrived
            r = await call(rclient, slave.address, RC.PROMOTE_BROKER, {"brokerName": "broker-a", "brokerId": 1})
            assert r.code == ResponseCode.SUCCESS, r.remark
            await until(lambda: slave.schedule_message_service.delivered == 1, "the promoted slave's delivery")
            await until(lambda: slave.store.get_max_offset_in_queue("T", 0) == 1, "the copy on the new master")
            assert slave.schedule_message_service.offsets[1] == 1
        nursery.cancel_scope.cancel()


def pull_request(offset: int, suspend_ms: int = 0) -> dict[str, Any]:
    return {"consumerGroup": "cg", "topic": "T", "queueId": 0, "queueOffset": offset, "maxMsgNums": 32,
            "sysFlag": 2 if suspend_ms else 0, "commitOffset": 0, "suspendTimeoutMillis": suspend_ms,
            "subscription": "*", "subVersion": 0}


async def test_a_sync_master_serves_readers_only_what_a_slave_holds_so_a_promotion_skips_nothing(
        broker_factory: Callable[..., Any], rclient: RemotingClient) -> None:
    """A consumer that read a record only the master held would continue, after a failover, past the queue offset
    the promoted slave gives the next message: that message, acknowledged, would never be consumed. A SYNC_MASTER
    lets readers see what a slave acknowledged (a held pull is answered on the acknowledgement), everything once
    no slave is connected."""
    async with broker_factory(broker_role="SYNC_MASTER", slave_timeout=200) as master, \
            trio.open_nursery() as nursery:
        link = Relay(master.ha_controller.ha_server_addr)
        link_scope = trio.CancelScope()

        async def run_link(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            with link_scope:
                await link.serve(task_status=task_status)

        await nursery.start(run_link)
        async with broker_factory(broker_role="SLAVE", broker_id=1, ha_master_address=link.address) as slave:
            await until(lambda: bool(master.ha_controller.service.connections), "the slave connected")
            r = await send(rclient, master.address, "T", 0, b"m0")
            assert r.code == ResponseCode.SUCCESS, r.remark
            held: list[RemotingCommand] = []

            async def held_pull() -> None:
                held.append(await call(rclient, master.address, RC.PULL_MESSAGE, pull_request(1, 5000)))

            nursery.start_soon(held_pull)
            await until(lambda: master.long_polling.held == 1, "the pull held")
            r = await send(rclient, master.address, "T", 0, b"m1")
            assert r.code == ResponseCode.SUCCESS, r.remark
            await until(lambda: bool(held), "the held pull answered once the slave acknowledged m1", timeout=3)
            assert held[0].code == ResponseCode.SUCCESS and held[0].ext["nextBeginOffset"] == 2
            # the link stalls: the master stores m2, no slave confirms it, and no reader sees it
            link.blackhole()
            r = await send(rclient, master.address, "T", 0, b"m2")
            assert r.code == ResponseCode.FLUSH_SLAVE_TIMEOUT, r.remark
            p = await call(rclient, master.address, RC.PULL_MESSAGE, pull_request(2))
            assert p.code == ResponseCode.PULL_NOT_FOUND and p.ext["nextBeginOffset"] == 2
            assert p.ext["maxOffset"] == 3
            # the master is lost; the promoted slave gives m3 queue offset 2, where the consumer goes on
            r = await call(rclient, slave.address, RC.PROMOTE_BROKER, {"brokerName": "broker-a", "brokerId": 1})
            assert r.code == ResponseCode.SUCCESS, r.remark
            r = await send(rclient, slave.address, "T", 0, b"m3")
            assert r.code == ResponseCode.SUCCESS and r.ext["queueOffset"] == 2, r.remark
            p = await call(rclient, slave.address, RC.PULL_MESSAGE, pull_request(2))
            assert p.code == ResponseCode.SUCCESS and p.ext["nextBeginOffset"] == 3 and b"m3" in p.body
        # no slave connected any more: the old master's readers see m2 (as its sends say SLAVE_NOT_AVAILABLE)
        link_scope.cancel()
        await until(lambda: not master.ha_controller.service.connections, "the slave gone")
        p = await call(rclient, master.address, RC.PULL_MESSAGE, pull_request(2))
        assert p.code == ResponseCode.SUCCESS and b"m2" in p.body
        nursery.cancel_scope.cancel()


async def test_after_an_async_master_failover_positions_and_offsets_past_the_new_log_move_back(
        broker_factory: Callable[..., Any], rclient: RemotingClient) -> None:
    """An ASYNC_MASTER serves records before its slave has them. Lost with the master, they leave consumers
    positioned (and committed offsets synced) past the promoted slave's end, where its next messages take the same
    queue offsets. A pull says the master epoch of its position: the promoted broker moves one past where its own
    epoch began back there (PULL_OFFSET_MOVED); promotion clamps stored offsets to the queues' ends."""
    async with broker_factory() as master, trio.open_nursery() as nursery:
        link = Relay(master.ha_controller.ha_server_addr)
        await nursery.start(link.serve)
        async with broker_factory(broker_role="SLAVE", broker_id=1, ha_master_address=link.address) as slave:
            r = await send(rclient, master.address, "T", 0, b"m0")
            assert r.code == ResponseCode.SUCCESS, r.remark
            await until(lambda: slave.store.commitlog.max_offset == master.store.commitlog.max_offset, "m0 replicated")
            link.blackhole()
            r = await send(rclient, master.address, "T", 0, b"m1")
            assert r.code == ResponseCode.SUCCESS, r.remark  # ASYNC: acknowledged, the slave never gets it
            p = await call(rclient, master.address, RC.PULL_MESSAGE, pull_request(1))
            assert p.code == ResponseCode.SUCCESS and b"m1" in p.body and p.ext["nextBeginOffset"] == 2
            assert p.ext["masterEpoch"] == 1
            r = await call(rclient, master.address, RC.UPDATE_CONSUMER_OFFSET,
                           {"consumerGroup": "cg", "topic": "T", "queueId": 0, "commitOffset": 2})
            assert r.code == ResponseCode.SUCCESS, r.remark
            assert await slave.ha_controller.sync.sync_all(rclient)
            assert slave.offset_manager.query_offset("cg", "T", 0) == 2  # past the slave's end (1)
            # the master is lost; the slave is promoted (master epoch 2) and stores m2 at queue offset 1
            r = await call(rclient, slave.address, RC.PROMOTE_BROKER, {"brokerName": "broker-a", "brokerId": 1})
            assert r.code == ResponseCode.SUCCESS and r.ext["masterEpoch"] == 2, r.remark
            assert slave.offset_manager.query_offset("cg", "T", 0) == 1  # clamped to the queue's end
            r = await send(rclient, slave.address, "T", 0, b"m2")
            assert r.code == ResponseCode.SUCCESS and r.ext["queueOffset"] == 1, r.remark
            # the consumer's position 2 was reached under epoch 1: moved back to where epoch 2 began
            p = await call(rclient, slave.address, RC.PULL_MESSAGE, {**pull_request(2), "masterEpoch": 1})
            assert p.code == ResponseCode.PULL_OFFSET_MOVED and p.ext["nextBeginOffset"] == 1
            assert p.ext["masterEpoch"] == 2
            p = await call(rclient, slave.address, RC.PULL_MESSAGE, {**pull_request(1), "masterEpoch": 1})
            assert p.code == ResponseCode.SUCCESS and b"m2" in p.body and p.ext["nextBeginOffset"] == 2
            # a position of this epoch (or of none said) stands
            p = await call(rclient, slave.address, RC.PULL_MESSAGE, {**pull_request(2), "masterEpoch": 2})
            assert p.code == ResponseCode.PULL_NOT_FOUND and p.ext["nextBeginOffset"] == 2
            p = await call(rclient, slave.address, RC.PULL_MESSAGE, pull_request(2))
            assert p.code == ResponseCode.PULL_NOT_FOUND
            # A commit says its position's epoch too (long ASYNC seed 12: a consumer that had read m1 from the old
            # master committed 2 to the promoted one, and the queue's next owner skipped m2): stored at most where
            # epoch 2 began; a commit of this epoch, or of none said (RocketMQ's clients), stands.
            q = await call(rclient, slave.address, RC.QUERY_CONSUMER_OFFSET,
                           {"consumerGroup": "cg", "topic": "T", "queueId": 0})
            assert q.ext["masterEpoch"] == 2  # an offset read here stands in epoch 2's log: its commits say so
            for said, stored in ((1, 1), (2, 2), (None, 2)):
                r = await call(rclient, slave.address, RC.UPDATE_CONSUMER_OFFSET,
                               {"consumerGroup": "cg2", "topic": "T", "queueId": 0, "commitOffset": 2,
                                **({"masterEpoch": said} if said is not None else {})})
                assert r.code == ResponseCode.SUCCESS, r.remark
                assert slave.offset_manager.query_offset("cg2", "T", 0) == stored, said
        nursery.cancel_scope.cancel()


async def test_an_ordered_send_to_a_broker_whose_master_is_down_fails_fast_and_no_key_moves(
        broker_factory: Callable[..., Any], namesrv_factory: Callable[..., Any]) -> None:
    from trimq.client.config import ProducerConfig
    from trimq.client.errors import BrokerNotAvailableError
    from trimq.client.producer import Producer
    from trimq.client.selectors import SelectMessageQueueByHash
    from trimq.protocol.message import Message
    from trimq.protocol.message_queue import MessageQueue

    async with namesrv_factory() as ns, trio.open_nursery() as nursery:
        common = {"namesrv_addr": ns.address}
        stop_a, a_stopped = trio.Event(), trio.Event()
        a: Broker = await nursery.start(run_broker, broker_factory, {"broker_name": "broker-a", **common}, stop_a,
                                        a_stopped)
        await nursery.start(run_broker, broker_factory,
                            {"broker_name": "broker-a", "broker_role": "SLAVE", "broker_id": 1, **common}, trio.Event())
        b: Broker = await nursery.start(run_broker, broker_factory, {"broker_name": "broker-b", **common},
                                        trio.Event())
        async with Producer(ProducerConfig(namesrv_addr=ns.address, producer_group="ordered")) as producer:
            assert producer.instance is not None
            for broker in (a, b):
                await producer.instance.api.create_topic(broker.address, "T", read_queue_nums=2, write_queue_nums=2)
            await until(lambda: ns.routes.pickup_topic_route_data("T") is not None and
                        len(ns.routes.pickup_topic_route_data("T").queue_datas) == 2, "both brokers routed")
            selector = SelectMessageQueueByHash()
            mqs = await producer.message_queues("T")
            keys = {selector(mqs, None, f"k{i}").broker_name: f"k{i}" for i in range(20)}
            for key in keys.values():
                await producer.send(Message("T", b"x"), selector=selector, arg=key)
            stop_a.set()
            await a_stopped.wait()
            client = producer.instance
            await until(lambda: 0 not in client.broker_addr_table.get("broker-a", {0: ""}), "the route refreshed")
            with trio.fail_after(5):  # (a guard, not a timing assertion: without the fix it waits, then moves keys)
                a0 = MessageQueue("T", "broker-a", 0)
                for attempt in (lambda: producer.send(Message("T", b"y"), message_queue=a0),
                                lambda: producer.send(Message("T", b"y"), selector=selector, arg=keys["broker-a"])):
                    try:
                        await attempt()
                    except BrokerNotAvailableError as exc:
                        assert "master is down" in str(exc)
                    else:
                        raise AssertionError("an ordered send to broker-a went through without its master")
            # the keys of broker-b keep their queue; the selector still sees broker-a's queues
            assert await producer.message_queues("T") == mqs
            r = await producer.send(Message("T", b"z"), selector=selector, arg=keys["broker-b"])
            assert r.message_queue == selector(mqs, None, keys["broker-b"])
            # an unordered send goes to broker-b
            r = await producer.send(Message("T", b"u"))
            assert r.message_queue.broker_name == "broker-b"
        nursery.cancel_scope.cancel()


async def test_a_pull_with_a_bad_master_epoch_is_refused_naming_it(broker_factory: Callable[..., Any],
                                                                     rclient: RemotingClient) -> None:
    async with broker_factory() as broker:
        assert (await send(rclient, broker.address, "T", 0, b"m0")).code == ResponseCode.SUCCESS
        for bad, says in (("x", "must be an integer"), (2**31, "outside the range of a Java int")):
            p = await call(rclient, broker.address, RC.PULL_MESSAGE, {**pull_request(0), "masterEpoch": bad})
            assert p.code == ResponseCode.SYSTEM_ERROR and "'masterEpoch'" in (p.remark or "") \
                and says in (p.remark or ""), p.remark
        p = await call(rclient, broker.address, RC.PULL_MESSAGE, {**pull_request(0), "masterEpoch": 1})
        assert p.code == ResponseCode.SUCCESS and p.ext["masterEpoch"] == 1  # a single broker's first epoch


async def test_a_consumer_that_read_an_async_masters_lost_tail_gets_the_promoted_masters_next_message(
        broker_factory: Callable[..., Any], namesrv_factory: Callable[..., Any], rclient: RemotingClient,
        tmp_path: Any) -> None:
    """End to end with the SDK: a consumer reads m1 from an ASYNC master whose slave never gets it; the slave is
    promoted, the old master demoted (m1 cut) with the consumer's pull held there, and m2 stored at m1's queue
    offset. The held pull's answer moves the consumer back, at once, since its position belongs to master epoch 1,
    and it consumes m2 (before, it went on from 2 and m2 was never consumed)."""
    from trimq.client import (
        ConsumeConcurrentlyStatus,
        Message,
        Producer,
        ProducerConfig,
        PushConsumer,
        PushConsumerConfig,
    )
    from trimq.client.admin import open_admin
    from trimq.protocol.message_queue import MessageQueue

    got: list[bytes] = []

    def listener(msgs: list[Any], context: Any) -> ConsumeConcurrentlyStatus:
        got.extend(m.body for m in msgs)
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    q0 = MessageQueue("T", "broker-a", 0)
    async with namesrv_factory() as ns, trio.open_nursery() as nursery:
        common = {"namesrv_addr": ns.address, "broker_name": "broker-a", "register_broker_interval_ms": 1000}
        stop_master, master_stopped = trio.Event(), trio.Event()
        master: Broker = await nursery.start(run_broker, broker_factory,
                                             {"store_dir": str(tmp_path / "master"), **common}, stop_master,
                                             master_stopped)
        link = Relay(master.ha_controller.ha_server_addr)
        await nursery.start(link.serve)
        slave: Broker = await nursery.start(run_broker, broker_factory,
                                            {"broker_role": "SLAVE", "broker_id": 1,
                                             "ha_master_address": link.address, **common}, trio.Event())
        async with Producer(ProducerConfig(namesrv_addr=ns.address)) as producer:
            assert producer.instance is not None
            await producer.instance.api.create_topic(master.address, "T", read_queue_nums=1, write_queue_nums=1)
            with trio.fail_after(10):  # routed (the broker's next registration carries the topic)
                while not await producer.instance.update_topic_route_info_from_name_server("T"):
                    await trio.sleep(0.05)
            consumer = PushConsumer(PushConsumerConfig(namesrv_addr=ns.address, consumer_group="cg",
                                                       consume_from_where="CONSUME_FROM_FIRST_OFFSET"))
            consumer.subscribe("T", "*")
            consumer.register_message_listener_concurrently(listener)
            async with consumer:
                await producer.send(Message("T", b"m0"), message_queue=q0)
                await until(lambda: got == [b"m0"], "m0 consumed")
                await until(lambda: slave.store.commitlog.max_offset == master.store.commitlog.max_offset,
                            "m0 replicated")
                link.blackhole()
                await producer.send(Message("T", b"m1"), message_queue=q0)  # acknowledged: ASYNC
                await until(lambda: got == [b"m0", b"m1"], "m1 consumed")
                assert slave.store.get_max_offset_in_queue("T", 0) == 1  # the slave never got m1
                # The slave is promoted; the old master learns it was superseded, becomes its slave and cuts m1,
                # the consumer's pull (from 2) still held there. The promoted master stores m2 at m1's queue
                # offset; the old master stops, answering the held pull, and the consumer goes on from there.
                async with open_admin(ns.address) as admin:
                    promoted = await admin.broker_promote("broker-a", 1)
                assert promoted.master_epoch == 2
                await until(lambda: master.ha_controller.role == "SLAVE" and master.ha_controller.master_epoch == 2
                            and master.store.get_max_offset_in_queue("T", 0) == 1, "the old master demoted, m1 cut")
                r = await send(rclient, slave.address, "T", 0, b"m2")
                assert r.code == ResponseCode.SUCCESS and r.ext["queueOffset"] == 1, r.remark
                stop_master.set()
                await master_stopped.wait()
                await until(lambda: b"m2" in got, "m2 consumed", timeout=15)
        nursery.cancel_scope.cancel()
