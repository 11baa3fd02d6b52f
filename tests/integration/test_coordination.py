"""Broker coordination over the wire: membership, NOTIFY_CONSUMER_IDS_CHANGED, queue locks, offsets, fencing.

Real broker (in-process on port 0, or the ``trimq-broker`` CLI for the SIGKILL test) and real
``RemotingClient``s speaking the protocol directly. Time-dependent tests run on trio's MockClock (the broker's
expiry, lock ages and notification window follow ``trio.current_time()``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from trimq.broker.broker import Broker, open_broker
from trimq.broker.config import BrokerConfig
from trimq.protocol import RemotingCommand, RequestCode, ResponseCode
from trimq.protocol.message_queue import MessageQueue
from trimq.runtime.client import RemotingClient
from trimq.testing.processes import fresh_address_file, listened_address

G = "orderly_group"
T = "TopicA"
BROKER = "broker-a"


def mq(qid: int, topic: str = T) -> MessageQueue:
    return MessageQueue(topic, BROKER, qid)


def heartbeat_body(client_id: str, group: str = G, *, topics: dict[str, str] | None = None,
                   orderly: bool = True, model: str = "CLUSTERING") -> dict[str, Any]:
    subs = topics if topics is not None else {T: "*"}
    return {
        "clientID": client_id,
        "language": "PYTHON",
        "version": "0.1.0",
        "producerDataSet": [],
        "consumerDataSet": [{
            "groupName": group, "consumeType": "CONSUME_PASSIVELY", "messageModel": model,
            "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "consumeOrderly": orderly,
            "subscriptionDataSet": [
                {"topic": t, "subString": e, "tagsSet": [] if e == "*" else e.split("||"), "codeSet": [],
                 "subVersion": 1} for t, e in subs.items()],
        }],
    }


async def call(rc: RemotingClient, addr: str, code: int, ext: dict[str, Any] | None = None,
               body: Any = None) -> RemotingCommand:
    return await rc.invoke(addr, RemotingCommand.request(code, ext, body), timeout_s=10)


async def ok(rc: RemotingClient, addr: str, code: int, ext: dict[str, Any] | None = None,
             body: Any = None) -> RemotingCommand:
    resp = await call(rc, addr, code, ext, body)
    assert resp.code == ResponseCode.SUCCESS, (resp.code, resp.remark)
    return resp


async def consumer_ids(rc: RemotingClient, addr: str, group: str = G) -> list[str]:
    resp = await call(rc, addr, RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": group})
    if resp.code == ResponseCode.SYSTEM_ERROR:
        assert resp.remark is not None and "no consumer for this group" in resp.remark
        return []
    assert resp.ok, resp.remark
    ids: list[str] = resp.body["consumerIdList"]
    return ids


async def lock(rc: RemotingClient, addr: str, client_id: str, mqs: list[MessageQueue],
               group: str = G) -> set[MessageQueue]:
    resp = await ok(rc, addr, RequestCode.LOCK_BATCH_MQ,
                    body={"consumerGroup": group, "clientId": client_id, "mqSet": [m.to_wire() for m in mqs]})
    return {MessageQueue.from_wire(m) for m in resp.body["lockOKMQSet"]}


async def update_offset(rc: RemotingClient, addr: str, qid: int, offset: int, client_id: str | None,
                        group: str = G, topic: str = T) -> RemotingCommand:
    ext: dict[str, Any] = {"consumerGroup": group, "topic": topic, "queueId": qid, "commitOffset": offset}
    if client_id is not None:
        ext["clientId"] = client_id
    return await call(rc, addr, RequestCode.UPDATE_CONSUMER_OFFSET, ext)


async def query_offset(rc: RemotingClient, addr: str, qid: int, group: str = G, topic: str = T) -> int | None:
    resp = await call(rc, addr, RequestCode.QUERY_CONSUMER_OFFSET,
                      {"consumerGroup": group, "topic": topic, "queueId": qid})
    if resp.code == ResponseCode.QUERY_NOT_FOUND:
        return None
    assert resp.ok, resp.remark
    offset: int = resp.ext["offset"]
    return offset


@asynccontextmanager
async def running_broker(store: Path, **settings: Any) -> AsyncIterator[Broker]:
    async with open_broker(BrokerConfig(listen="127.0.0.1:0", store_dir=str(store), **settings)) as broker:
        yield broker


class Member:
    """A consumer process as the broker sees it: one connection, a client id, the notifications it got."""

    def __init__(self, client_id: str) -> None:
        self.client_id = client_id
        self.rc = RemotingClient(default_timeout_s=10)
        self.notifications: list[str] = []
        self.notified = trio.Event()

    async def _on_notify(self, cmd: RemotingCommand, addr: str) -> None:
        assert cmd.is_oneway
        self.notifications.append(cmd.ext["consumerGroup"])
        self.notified.set()

    async def __aenter__(self) -> Member:
        await self.rc.__aenter__()
        self.rc.register_handler(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, self._on_notify)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.rc.__aexit__(*exc)

    async def heartbeat(self, addr: str, **kw: Any) -> None:
        await ok(self.rc, addr, RequestCode.HEART_BEAT, body=heartbeat_body(self.client_id, **kw))


async def wait_until(pred: Callable[[], bool], timeout_s: float = 10, step_s: float = 0.01) -> None:
    with trio.fail_after(timeout_s):
        while not pred():
            await trio.sleep(step_s)


# ------------------------------------------------------------------------------------------------ membership


async def test_heartbeat_registers_and_client_that_stops_heartbeating_is_expired(
        tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    # Idle connections off: the silent member's connection would otherwise close at 120 s (RocketMQ's
    # serverChannelMaxIdleTimeSeconds) and remove it first; here the heartbeat expiry alone is under test.
    # RocketMQ's clocks: under the default lease profile a silent orderly member leaves with its 2 s lease
    # (tests/integration/test_leases.py); the 120 s heartbeat expiry is what is under test here.
    async with running_broker(tmp_path, server_channel_max_idle_time_seconds=0, lock_profile="rocketmq") as broker, \
            Member("quiet") as quiet, Member("chatty") as chatty:
        addr = broker.address
        await quiet.heartbeat(addr)
        await chatty.heartbeat(addr)
        assert await lock(quiet.rc, addr, "quiet", [mq(0)]) == {mq(0)}
        assert await consumer_ids(quiet.rc, addr) == ["chatty", "quiet"]
        for _ in range(4):  # chatty keeps heartbeating every 30 s; quiet has gone silent
            await trio.sleep(30)
            await chatty.heartbeat(addr)
        # 120 s after its last heartbeat "quiet" is still a member (expiry is strictly after 120 s) ...
        assert await consumer_ids(chatty.rc, addr) == ["chatty", "quiet"]
        await trio.sleep(11)  # ... and the next 10-second housekeeping scan removes it
        assert await consumer_ids(chatty.rc, addr) == ["chatty"]
        assert chatty.notifications  # the survivor was told
        table = (await ok(chatty.rc, addr, RequestCode.GET_LOCK_TABLE, {"consumerGroup": G})).body["lockTable"]
        assert table == []  # its long-lapsed lock entry was tidied away with it
        assert broker.consumer_manager.stats["expired"] == 1


async def test_closing_a_connection_removes_the_member_and_its_locks_after_the_grace(tmp_path: Path) -> None:
    # Semantics changed with issue 14 (leases): an orderly member and its queue locks go
    # lock_disconnect_grace_ms (300 ms) after its connection closes, unless it renews in time; under the rocketmq
    # profile the member went at once and its locks stayed (test below).
    async with running_broker(tmp_path) as broker, Member("leaver") as leaver, Member("stayer") as stayer:
        addr = broker.address
        await leaver.heartbeat(addr)
        await stayer.heartbeat(addr)
        assert await lock(leaver.rc, addr, "leaver", [mq(0)]) == {mq(0)}
        await wait_until(lambda: len(stayer.notifications) >= 1)
        assert await consumer_ids(stayer.rc, addr) == ["leaver", "stayer"]
        cm = broker.consumer_manager
        assert cm.find_channel(G, "leaver") is not None
        stayer.notified = trio.Event()
        leaver.rc.close_address(addr)
        await stayer.notified.wait()  # the broker noticed the close and, after the grace, told the others
        assert cm.find_channel(G, "leaver") is None
        assert await consumer_ids(stayer.rc, addr) == ["stayer"]
        assert cm.stats["closed"] == 1
        # The grace is over: its lock too (the client stopped starting batches when its connection dropped).
        assert await lock(stayer.rc, addr, "stayer", [mq(0)]) == {mq(0)}


async def test_under_rocketmq_clocks_a_closed_members_locks_stay_until_they_expire(
        tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    """The rocketmq lock profile (semantics changed with issue 14: the 32 s orphaned-lock rule is gone; with
    leases a closed connection's locks go after a 300 ms grace, tests/integration/test_leases.py): a closed
    member's queue locks live their full 60 s after their last renewal; a member that reconnects and renews
    keeps its locks."""
    async with running_broker(tmp_path, lock_profile="rocketmq") as broker, Member("dead") as dead, \
            Member("alive") as alive, Member("back") as back:
        addr = broker.address
        for m in (dead, alive, back):
            await m.heartbeat(addr)
        assert await lock(dead.rc, addr, "dead", [mq(0)]) == {mq(0)}
        assert await lock(back.rc, addr, "back", [mq(1)]) == {mq(1)}
        dead.rc.close_address(addr)
        back.rc.close_address(addr)
        await trio.sleep(0.5)
        await back.heartbeat(addr)  # reconnects at once and renews: its lock is its own again, full life
        assert await lock(back.rc, addr, "back", [mq(1)]) == {mq(1)}
        await trio.sleep(59.4)  # 59.9 s after the dead member's last renewal: still its own
        assert await lock(alive.rc, addr, "alive", [mq(0)]) == set()
        await trio.sleep(0.2)  # past 60 s
        assert await lock(alive.rc, addr, "alive", [mq(0)]) == {mq(0)}
        assert await lock(alive.rc, addr, "alive", [mq(1)]) == set()  # 'back' renewed over its new connection


async def test_expiry_keeps_a_lock_its_silent_owner_still_renews(
        tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    # RocketMQ's clocks; with leases a renewal is also the orderly member's heartbeat (test_leases.py).
    async with running_broker(tmp_path, lock_profile="rocketmq") as broker, Member("renewer") as renewer:
        addr = broker.address
        await renewer.heartbeat(addr)
        for _ in range(8):  # no more heartbeats, but the lock is renewed every 20 s
            assert await lock(renewer.rc, addr, "renewer", [mq(0)]) == {mq(0)}
            await trio.sleep(20)
        assert await consumer_ids(renewer.rc, addr) == []
        table = (await ok(renewer.rc, addr, RequestCode.GET_LOCK_TABLE, {"consumerGroup": G})).body["lockTable"]
        assert [(r["clientId"], r["expired"]) for r in table] == [("renewer", False)]


async def test_get_consumer_list_of_an_empty_group_is_rocketmqs_system_error(tmp_path: Path) -> None:
    async with running_broker(tmp_path) as broker, RemotingClient() as rc:
        resp = await call(rc, broker.address, RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "nobody"})
        assert resp.code == ResponseCode.SYSTEM_ERROR
        assert resp.remark == "no consumer for this group: nobody"


async def test_notify_once_per_member_when_a_third_joins_and_for_a_burst(
        tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    async with running_broker(tmp_path, lock_profile="rocketmq") as broker:
        addr = broker.address
        async with Member("c1") as c1, Member("c2") as c2, Member("c3") as c3, Member("c4") as c4, \
                Member("c5") as c5, Member("c6") as c6:
            await c1.heartbeat(addr)
            await c2.heartbeat(addr)
            await trio.sleep(1)
            for m in (c1, c2):
                m.notifications.clear()

            await c3.heartbeat(addr)
            await trio.sleep(1)
            assert [m.notifications for m in (c1, c2, c3)] == [[G], [G], [G]]

            # A burst of joins within the coalescing window: still exactly one notification per member.
            async with trio.open_nursery() as nursery:
                for m in (c4, c5, c6):
                    nursery.start_soon(m.heartbeat, addr)
            await trio.sleep(5)
            assert [len(m.notifications) for m in (c1, c2, c3, c4, c5, c6)] == [2, 2, 2, 1, 1, 1]

            # Periodic heartbeats that change nothing notify nobody; a subscription change notifies everyone.
            for m in (c1, c2, c3, c4, c5, c6):
                await m.heartbeat(addr)
            await trio.sleep(5)
            assert [len(m.notifications) for m in (c1, c2, c3, c4, c5, c6)] == [2, 2, 2, 1, 1, 1]
            await c6.heartbeat(addr, topics={T: "*", "TopicB": "*"})
            await trio.sleep(5)
            assert [len(m.notifications) for m in (c1, c2, c3, c4, c5, c6)] == [3, 3, 3, 2, 2, 2]


async def test_unregister_leaves_the_group_and_frees_its_locks_at_once(tmp_path: Path) -> None:
    async with running_broker(tmp_path) as broker, Member("a") as a, Member("b") as b:
        addr = broker.address
        await a.heartbeat(addr)
        await b.heartbeat(addr)
        assert await lock(a.rc, addr, "a", [mq(0), mq(1)]) == {mq(0), mq(1)}
        assert await lock(b.rc, addr, "b", [mq(0), mq(1)]) == set()
        await wait_until(lambda: bool(b.notifications))
        b.notified = trio.Event()
        await ok(a.rc, addr, RequestCode.UNREGISTER_CLIENT, {"clientID": "a", "consumerGroup": G})
        await b.notified.wait()
        assert await consumer_ids(b.rc, addr) == ["b"]
        assert await lock(b.rc, addr, "b", [mq(0), mq(1)]) == {mq(0), mq(1)}


async def test_heartbeat_of_a_clustering_group_creates_its_retry_topic_when_topics_are_managed(
        tmp_path: Path) -> None:
    async with running_broker(tmp_path) as broker, Member("a") as a:
        await a.heartbeat(broker.address)
        tcm = broker.topic_config_manager
        if tcm is None:
            pytest.skip("no topic config manager on this broker yet")
        tc = tcm.get("%RETRY%" + G)
        assert tc is not None and tc.read_queue_nums == 1


async def test_bad_requests_get_specific_errors_and_keep_the_connection(tmp_path: Path) -> None:
    async with running_broker(tmp_path) as broker, RemotingClient() as rc:
        addr = broker.address
        cases: list[tuple[int, dict[str, Any] | None, Any, str]] = [
            (RequestCode.HEART_BEAT, None, "junk", "heartbeat body must be a map"),
            (RequestCode.HEART_BEAT, None, {"clientID": "c", "consumerDataSet": [{"groupName": "g",
                                                                                    "messageModel": "X"}]},
             "consumerDataSet[0].messageModel"),
            (RequestCode.LOCK_BATCH_MQ, None, {"consumerGroup": G, "clientId": "c", "mqSet": [{"topic": T}]},
             "mqSet[0]"),
            (RequestCode.LOCK_BATCH_MQ, None, {"consumerGroup": G, "mqSet": []}, "'clientId'"),
            (RequestCode.QUERY_CONSUMER_OFFSET, {"consumerGroup": G, "topic": T, "queueId": "0"}, None, "'queueId'"),
            (RequestCode.UPDATE_CONSUMER_OFFSET, {"consumerGroup": G, "topic": T, "queueId": 0,
                                                  "commitOffset": -3}, None, "'commitOffset' must be >= 0"),
            (RequestCode.UNREGISTER_CLIENT, {}, None, "'clientID'"),
            (RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "bad group"}, None, "'consumerGroup'"),
        ]
        for code, ext, body, fragment in cases:
            resp = await call(rc, addr, code, ext, body)
            assert resp.code == ResponseCode.SYSTEM_ERROR, (code, resp.remark)
            assert resp.remark is not None and fragment in resp.remark, resp.remark
        assert await query_offset(rc, addr, 0) is None  # the connection still works


# ------------------------------------------------------------------------------------------------ locks


async def test_two_clients_racing_for_overlapping_queues_each_queue_goes_to_exactly_one(tmp_path: Path) -> None:
    async with running_broker(tmp_path, lock_profile="rocketmq") as broker, Member("a") as a, Member("b") as b:
        addr = broker.address
        for round_ in range(20):
            group = f"race_{round_}"
            wanted_a = [mq(i) for i in range(0, 12)]
            wanted_b = [mq(i) for i in range(6, 16)]
            got: dict[str, set[MessageQueue]] = {}

            async def take(m: Member, wanted: list[MessageQueue], g: str = group,
                           out: dict[str, set[MessageQueue]] = got) -> None:
                out[m.client_id] = await lock(m.rc, addr, m.client_id, wanted, group=g)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(take, a, wanted_a)
                nursery.start_soon(take, b, wanted_b)
            assert not got["a"] & got["b"]
            assert got["a"] | got["b"] == set(wanted_a) | set(wanted_b)
            assert set(wanted_a[:6]) <= got["a"] and set(wanted_b[-4:]) <= got["b"]
            table = (await ok(a.rc, addr, RequestCode.GET_LOCK_TABLE, {"consumerGroup": group})).body["lockTable"]
            owners = {MessageQueue.from_wire(r["mq"]): r["clientId"] for r in table}
            assert owners == {**{q: "a" for q in got["a"]}, **{q: "b" for q in got["b"]}}
            # locking again renews and returns the same set; the other side still gets nothing of it
            assert await lock(a.rc, addr, "a", wanted_a, group=group) == got["a"]
            assert await lock(b.rc, addr, "b", sorted(got["a"]), group=group) == set()


async def test_locks_expire_on_the_broker_clock_and_can_then_be_taken_over(
        tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    async with running_broker(tmp_path, lock_profile="rocketmq") as broker, RemotingClient() as rc:
        addr = broker.address
        assert await lock(rc, addr, "a", [mq(0)]) == {mq(0)}
        await trio.sleep(60)  # exactly 60 s: still live
        assert await lock(rc, addr, "b", [mq(0)]) == set()
        body = (await ok(rc, addr, RequestCode.GET_LOCK_TABLE, {"consumerGroup": G})).body
        (row,) = body["lockTable"]
        assert (row["clientId"], row["ageMs"], row["expired"], body["maxLiveMs"]) == ("a", 60_000, False, 60_000)
        await trio.sleep(0.002)
        assert await lock(rc, addr, "b", [mq(0)]) == {mq(0)}
        body = (await ok(rc, addr, RequestCode.GET_LOCK_TABLE)).body
        assert [(r["consumerGroup"], r["clientId"], r["ageMs"]) for r in body["lockTable"]] == [(G, "b", 0)]
        assert body["stats"]["stolen"] == 1
        # UNLOCK_BATCH_MQ releases only the owner's entry
        await ok(rc, addr, RequestCode.UNLOCK_BATCH_MQ, body={"consumerGroup": G, "clientId": "a",
                                                              "mqSet": [mq(0).to_wire()]})
        assert await lock(rc, addr, "a", [mq(0)]) == set()
        await ok(rc, addr, RequestCode.UNLOCK_BATCH_MQ, body={"consumerGroup": G, "clientId": "b",
                                                              "mqSet": [mq(0).to_wire()]})
        assert await lock(rc, addr, "a", [mq(0)]) == {mq(0)}


# ------------------------------------------------------------------------------------------------ offsets


async def test_offsets_deterministic_start_and_clean_restart(tmp_path: Path) -> None:
    async with running_broker(tmp_path) as broker, RemotingClient() as rc:
        addr = broker.address
        assert await query_offset(rc, addr, 0) is None  # nothing stored: QUERY_NOT_FOUND, never 0
        for qid, off in ((0, 17), (1, 5), (3, 123456789012)):
            assert (await update_offset(rc, addr, qid, off, "c1")).ok
        await rc.invoke_oneway(addr, RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, {
            "consumerGroup": "g2", "topic": "%RETRY%g2", "queueId": 0, "commitOffset": 9}))
        await wait_until(lambda: broker.offset_manager.query_offset("g2", "%RETRY%g2", 0) == 9)
        assert await query_offset(rc, addr, 0) == 17
    # clean stop persisted everything; a new broker on the same store answers the same
    saved = json.loads((tmp_path / "config" / "consumerOffset.json").read_text())
    assert saved["offsetTable"] == {"TopicA@orderly_group": {"0": 17, "1": 5, "3": 123456789012},
                                    "%RETRY%g2@g2": {"0": 9}}
    async with running_broker(tmp_path) as broker, RemotingClient() as rc:
        addr = broker.address
        assert [await query_offset(rc, addr, q) for q in range(4)] == [17, 5, None, 123456789012]
        assert await query_offset(rc, addr, 0, group="g2", topic="%RETRY%g2") == 9


async def test_offsets_are_persisted_periodically(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    path = tmp_path / "config" / "consumerOffset.json"
    async with running_broker(tmp_path) as broker, RemotingClient() as rc:
        service: Any = broker.coordination_service
        assert (await update_offset(rc, broker.address, 0, 3, "c1")).ok
        await trio.sleep(4.9)  # flush_consumer_offset_interval_ms = 5000
        assert not path.exists()
        # the write runs in a worker thread, during which the mock clock may jump: wait for it, not for time
        await wait_until(lambda: service.stats["offset_persists"] == 1, timeout_s=3600, step_s=1)
        assert json.loads(path.read_text())["offsetTable"] == {"TopicA@orderly_group": {"0": 3}}
        await trio.sleep(60)  # nothing changed: nothing rewritten
        assert service.stats["offset_persists"] == 1


async def test_fenced_update_is_refused_and_counted_and_the_owners_is_applied(tmp_path: Path) -> None:
    async with running_broker(tmp_path) as broker, Member("owner") as owner, Member("paused") as paused:
        addr = broker.address
        await owner.heartbeat(addr)
        await paused.heartbeat(addr)
        assert (await update_offset(paused.rc, addr, 0, 10, "paused")).ok  # nobody holds queue 0 yet
        assert await lock(owner.rc, addr, "owner", [mq(0)]) == {mq(0)}

        resp = await update_offset(paused.rc, addr, 0, 3, "paused")
        assert resp.code == ResponseCode.NO_PERMISSION
        assert resp.remark is not None and "locked by owner" in resp.remark and "paused" in resp.remark
        # without a clientId field the connection's heartbeat identity is used: still fenced
        resp = await update_offset(paused.rc, addr, 0, 2, None)
        assert resp.code == ResponseCode.NO_PERMISSION
        # oneway updates are fenced too (no answer, nothing applied)
        await paused.rc.invoke_oneway(addr, RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, {
            "consumerGroup": G, "topic": T, "queueId": 0, "commitOffset": 1, "clientId": "paused"}))
        om = broker.offset_manager
        await wait_until(lambda: om.fenced_updates[G] == 3)
        assert await query_offset(paused.rc, addr, 0) == 10

        assert (await update_offset(owner.rc, addr, 0, 11, "owner")).ok
        assert await query_offset(owner.rc, addr, 0) == 11
        assert (await update_offset(paused.rc, addr, 1, 4, "paused")).ok  # an unlocked queue: applied
        body = (await ok(owner.rc, addr, RequestCode.GET_LOCK_TABLE, {"consumerGroup": G})).body
        assert body["fencedUpdates"] == {G: 3}


def _broker_cmd(store: Path) -> list[str]:
    script = os.path.join(os.path.dirname(sys.executable), "trimq-broker")
    head = [script] if os.path.exists(script) else [sys.executable, "-c", "from trimq.tools.broker import main; main()"]
    return [*head, "--listen", "127.0.0.1:0", "--store", str(store), "--log-format", "json"]


async def _start_cli_broker(store: Path, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    addr_file = fresh_address_file(store)
    env = {**os.environ, "TRIMQ_BROKER_FLUSH_CONSUMER_OFFSET_INTERVAL_MS": "100"}
    with open(log, "ab") as out:
        proc = subprocess.Popen(_broker_cmd(store), stdout=out, stderr=out, env=env)
    return proc, await trio.to_thread.run_sync(lambda: listened_address(addr_file, proc, 60, log=log))


async def test_offsets_survive_sigkill_after_a_persist(tmp_path: Path) -> None:
    store, log = tmp_path / "store", tmp_path / "broker.log"
    offsets = {0: 41, 1: 7, 2: 1_000_000}
    proc, addr = await _start_cli_broker(store, log)
    try:
        async with RemotingClient() as rc:
            for qid, off in offsets.items():
                assert (await update_offset(rc, addr, qid, off, "c1")).ok
        path = store / "config" / "consumerOffset.json"

        def persisted() -> bool:
            try:
                table = json.loads(path.read_text())["offsetTable"]
            except (OSError, ValueError, KeyError):
                return False
            return table.get(f"{T}@{G}") == {str(q): o for q, o in offsets.items()}

        await wait_until(persisted, timeout_s=30)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        proc.kill()
    proc, addr = await _start_cli_broker(store, log)
    try:
        async with RemotingClient() as rc:
            assert [await query_offset(rc, addr, q) for q in offsets] == list(offsets.values())
            assert await query_offset(rc, addr, 3) is None
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        proc.kill()


# ------------------------------------------------------------------------------------------------ admin


async def test_admin_connection_list_consume_stats_and_subscription_consistency(tmp_path: Path) -> None:
    async with running_broker(tmp_path) as broker, Member("a") as a, Member("b") as b:
        addr = broker.address
        resp = await call(a.rc, addr, RequestCode.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": G})
        assert resp.code == ResponseCode.CONSUMER_NOT_ONLINE
        await a.heartbeat(addr, topics={T: "TagA||TagB"})
        await b.heartbeat(addr, topics={T: "TagC"})

        body = (await ok(a.rc, addr, RequestCode.GET_CONSUMER_CONNECTION_LIST, {"consumerGroup": G})).body
        assert [c["clientId"] for c in body["connectionSet"]] == ["a", "b"]
        first = body["connectionSet"][0]
        assert (first["language"], first["version"], first["messageModel"], first["consumeOrderly"]) == (
            "PYTHON", "0.1.0", "CLUSTERING", True)
        assert first["clientAddr"].startswith("127.0.0.1:") and first["lastUpdateTimestamp"] > 0
        assert first["subscriptionDataSet"][0]["subString"] == "TagA||TagB"
        assert body["consistent"] is False and body["consumeOrderly"] is True

        body = (await ok(a.rc, addr, RequestCode.GET_SUBSCRIPTION_CONSISTENCY, {"consumerGroup": G})).body
        (report,) = body["groups"]
        assert report == {"consumerGroup": G, "consistent": False, "inconsistentTopics": [T], "members": [
            {"clientId": "a", "subscriptions": {T: "TagA||TagB"}}, {"clientId": "b", "subscriptions": {T: "TagC"}}]}
        await b.heartbeat(addr, topics={T: "TagB||TagA"})
        body = (await ok(a.rc, addr, RequestCode.GET_SUBSCRIPTION_CONSISTENCY)).body
        assert [(g["consumerGroup"], g["consistent"]) for g in body["groups"]] == [(G, True)]

        assert await lock(a.rc, addr, "a", [mq(1)]) == {mq(1)}
        assert (await update_offset(a.rc, addr, 1, 4, "a")).ok
        assert (await update_offset(a.rc, addr, 0, 2, "a")).ok
        body = (await ok(a.rc, addr, RequestCode.GET_CONSUME_STATS, {"consumerGroup": G})).body
        assert body["consumerGroup"] == G and body["orderly"] is True
        rows = {r["mq"]["queueId"]: r for r in body["offsetTable"] if r["mq"]["topic"] == T}
        assert rows[0]["consumerOffset"] == 2 and rows[1]["consumerOffset"] == 4
        assert rows[1]["lockOwner"] == "a" and rows[0]["lockOwner"] is None
        assert rows[1]["lastUpdateTimestamp"] > 0
        store = broker.store
        for qid, row in rows.items():
            if store is None:
                assert (row["brokerOffset"], row["lag"]) == (-1, -1)
            else:
                assert row["brokerOffset"] == store.get_max_offset_in_queue(T, qid)
        resp = await call(a.rc, addr, RequestCode.GET_CONSUME_STATS, {"consumerGroup": "nobody", "topic": T})
        assert (resp.ok and resp.body["offsetTable"] == []) or resp.code == ResponseCode.TOPIC_NOT_EXIST
