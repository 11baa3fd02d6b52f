"""Every ``trimq-admin`` subcommand against a real broker (a ``trimq-broker --embedded-namesrv`` subprocess
shared by the module), run as a subprocess with ``--json`` and its fields checked.

Consumers for the group commands are trio-native PushConsumers in the test process (the CLI runs through
``trio.run_process`` meanwhile): an orderly group blocked on a poison message (status -> skip -> DLQ ->
resend, progress, locks, connections, list, reset-offset planned then executed online and offline) and a
concurrent group (skip routed by the members' running info). Waits poll for a condition; nothing asserts a
duration.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from trimq.client import (
    ConsumeConcurrentlyStatus,
    ConsumeOrderlyStatus,
    Message,
    MessageQueue,
    Producer,
    ProducerConfig,
    PushConsumer,
    PushConsumerConfig,
)
from trimq.testing.processes import ADDRESS_FILE_NAME, listened_address

from .conftest import tool

BROKER_NAME = "broker-a"
ADMIN = tool("trimq-admin")


@pytest.fixture(scope="module")
def addr(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One broker (with its embedded name server) for the whole module; its address."""
    base = tmp_path_factory.mktemp("admin_cli")
    store = base / "store"
    log = base / "broker.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([tool("trimq-broker"), "--embedded-namesrv", "--listen", "127.0.0.1:0", "--store",
                                 str(store), "--log-format", "json", "--log-level", "warning"],
                                stdout=out, stderr=out, cwd=base)
    try:
        yield listened_address(store / ADDRESS_FILE_NAME, proc, 20, log=log)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def admin(addr: str, *args: str, json_out: bool = True) -> subprocess.CompletedProcess[str]:
    argv = [ADMIN, "--namesrv", addr, *(["--json"] if json_out else []), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=_env())


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIMQ_")}
    env["TZ"] = "UTC"
    return env


def ok(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert result.returncode == 0, f"exit {result.returncode}: {result.stderr}"
    doc: dict[str, Any] = json.loads(result.stdout)
    return doc


def failed(result: subprocess.CompletedProcess[str], status: int = 1) -> str:
    assert result.returncode == status, f"exit {result.returncode} (wanted {status}): {result.stdout}{result.stderr}"
    return result.stderr


async def aadmin(addr: str, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI from trio code (the in-process consumers keep running meanwhile)."""
    res = await trio.run_process([ADMIN, "--namesrv", addr, "--json", *args], capture_stdout=True,
                                 capture_stderr=True, check=False, env=_env())
    return subprocess.CompletedProcess(res.args, res.returncode, res.stdout.decode(), res.stderr.decode())


async def poll_admin(addr: str, args: list[str], pred: Callable[[dict[str, Any]], bool],
                     timeout: float = 15) -> dict[str, Any]:
    """Run the command until ``pred(document)`` holds; the last document."""
    with trio.fail_after(timeout):
        while True:
            doc = ok(await aadmin(addr, *args))
            if pred(doc):
                return doc
            await trio.sleep(0.1)


async def wait_until(pred: Callable[[], Any], timeout: float = 15) -> None:
    with trio.fail_after(timeout):
        while not pred():
            await trio.sleep(0.02)


def consumer_config(addr: str, group: str, name: str, **kw: Any) -> PushConsumerConfig:
    return PushConsumerConfig(namesrv_addr=addr, consumer_group=group, instance_name=name,
                              consume_from_where="CONSUME_FROM_FIRST_OFFSET", persist_consumer_offset_interval=100,
                              **kw)


# ---------------------------------------------------------------------------------------------- topics etc.


def test_topic_create_list_status(addr: str) -> None:
    doc = ok(admin(addr, "topic", "create", "-t", "AdmTopic", "-q", "3", "--perm", "rw"))
    assert doc["topic"] == "AdmTopic" and doc["readQueueNums"] == doc["writeQueueNums"] == 3
    assert doc["perm"] == 6 and doc["permText"] == "RW-" and doc["routed"] is True
    assert [b["brokerName"] for b in doc["brokers"]] == [BROKER_NAME]

    sent = subprocess.run([tool("trimq-producer"), "--namesrv", addr, "--topic", "AdmTopic", "--count", "9",
                           "--json"], capture_output=True, text=True, timeout=60, env=_env())
    assert sent.returncode == 0 and json.loads(sent.stdout)["sent"] == 9, sent.stderr

    listed_doc = ok(admin(addr, "topic", "list"))
    assert ok(admin(addr, "topic", "list", "--json", json_out=False)) == listed_doc  # --json after the command
    listed = {t["topic"]: t for t in listed_doc["topics"]}
    assert listed["AdmTopic"]["brokers"] == [{"brokerName": BROKER_NAME, "readQueueNums": 3, "writeQueueNums": 3,
                                              "perm": 6}]

    status = ok(admin(addr, "topic", "status", "-t", "AdmTopic"))
    assert status["topic"] == "AdmTopic" and status["totalMessages"] == 9
    assert [(q["brokerName"], q["queueId"]) for q in status["queues"]] == [(BROKER_NAME, i) for i in range(3)]
    assert sum(q["maxOffset"] - q["minOffset"] for q in status["queues"]) == 9
    now = time.time() * 1000
    for q in status["queues"]:
        assert (q["lastUpdateTimestamp"] > now - 60_000) == (q["maxOffset"] > 0)

    table = admin(addr, "topic", "status", "-t", "AdmTopic", json_out=False)
    assert table.returncode == 0
    assert table.stdout.splitlines()[0].split() == ["BROKER", "QID", "MIN_OFFSET", "MAX_OFFSET", "MESSAGES",
                                                   "LAST_UPDATED"]
    assert "topic AdmTopic: 9 messages stored" in table.stdout


def test_cluster_list(addr: str) -> None:
    ok(admin(addr, "topic", "create", "-t", "AdmCluster", "-q", "1"))
    doc = ok(admin(addr, "cluster", "list"))
    (cluster,) = doc["clusters"]
    (broker,) = cluster["brokers"]
    assert cluster["cluster"] == "DefaultCluster"
    assert broker["brokerName"] == BROKER_NAME and broker["brokerId"] == 0 and broker["brokerAddr"] == addr
    assert broker["role"] == "ASYNC_MASTER" and broker["masterEpoch"] == 1 and broker["slaves"] == 0  # HA
    assert "AdmCluster" in broker["topics"] and broker["topicCount"] == len(broker["topics"])
    assert 0 <= broker["ageMs"] < 120_000
    assert abs(broker["lastUpdateTimestamp"] + broker["ageMs"] - time.time() * 1000) < 60_000


def test_message_show(addr: str, tmp_path: Path) -> None:
    ok(admin(addr, "topic", "create", "-t", "AdmMsg", "-q", "1"))
    sent = subprocess.run([tool("trimq-producer"), "--namesrv", addr, "--topic", "AdmMsg", "--count", "2", "--tag",
                           "TagM", "--json"], capture_output=True, text=True, timeout=60, env=_env())
    assert sent.returncode == 0, sent.stderr

    by_pos = ok(admin(addr, "message", "show", "-t", "AdmMsg", "-q", "0", "--offset", "1"))
    assert by_pos["topic"] == "AdmMsg" and by_pos["queueId"] == 0 and by_pos["queueOffset"] == 1
    assert by_pos["brokerName"] == BROKER_NAME and by_pos["tags"] == "TagM"
    assert by_pos["properties"]["TAGS"] == "TagM" and "MAX_OFFSET" not in by_pos["properties"]
    assert by_pos["bodyEncoding"] == "utf-8" and by_pos["body"].startswith('{"key":')
    assert by_pos["bodySize"] == len(by_pos["body"].encode())

    body_file = tmp_path / "body.bin"
    by_id = ok(admin(addr, "message", "show", "--msg-id", by_pos["msgId"], "--body-file", str(body_file)))
    assert {k: v for k, v in by_id.items() if k != "bodyFile"} == by_pos
    assert by_id["bodyFile"] == str(body_file) and body_file.read_bytes() == by_pos["body"].encode()

    assert "no message at AdmMsg queue 0 offset 7" in failed(admin(addr, "message", "show", "-t", "AdmMsg", "-q", "0",
                                                                  "--offset", "7"))
    assert "offset message id" in failed(admin(addr, "message", "show", "--msg-id", "nothex"))
    assert "--msg-id" in failed(admin(addr, "message", "show", "--msg-id", by_pos["msgId"], "-t", "AdmMsg"), 2)
    assert "does not exist" in failed(admin(addr, "message", "show", "-t", "NoSuchTopic", "-q", "0", "--offset", "0"))


def test_usage_and_errors(addr: str) -> None:
    assert "--group" in failed(admin(addr, "consumer", "progress", "-g", "bad group!"), 2)
    assert "--timestamp" in failed(admin(addr, "consumer", "reset-offset", "-g", "g", "-t", "T", "--timestamp",
                                         "yesterday"), 2)
    assert "--all" in failed(admin(addr, "dlq", "resend", "-g", "g"), 2)
    assert "--perm" in failed(admin(addr, "topic", "create", "-t", "T", "--perm", "9"), 2)
    no_ns = subprocess.run([ADMIN, "topic", "list"], capture_output=True, text=True, timeout=60, env=_env())
    assert no_ns.returncode == 2 and "--namesrv" in no_ns.stderr
    down = failed(admin("127.0.0.1:1", "cluster", "list"))
    assert down.startswith("trimq-admin: error: no name server answered")
    assert "not online" in failed(admin(addr, "consumer", "connections", "-g", "adm_nobody"))
    assert "no consume progress" in failed(admin(addr, "consumer", "progress", "-g", "adm_nobody"))
    assert "not online" in failed(admin(addr, "consumer", "status", "-g", "adm_nobody"))
    doc = ok(admin(addr, "dlq", "list", "-g", "adm_nobody"))
    assert doc == {"consumerGroup": "adm_nobody", "topic": "%DLQ%adm_nobody", "messages": [], "truncated": False,
                   "errors": []}
    assert ok(admin(addr, "consumer", "locks", "-g", "adm_nobody"))["locks"] == []


def test_allocate_keeps_working_with_the_group_json_flag() -> None:
    res = subprocess.run([ADMIN, "--json", "allocate", "--strategy", "AVG", "--queues", "4", "--consumers", "2"],
                         capture_output=True, text=True, timeout=60, env=_env())
    doc = ok(res)
    assert doc["strategy"] == "AVG" and doc["queues"] == 4 and doc["moved"] == 0


# ---------------------------------------------------------------------------------------------- an orderly group


async def test_orderly_group_status_skip_dlq_progress_locks_reset(addr: str) -> None:
    topic, group = "AdmOrderly", "adm_orderly"
    ok(await aadmin(addr, "topic", "create", "-t", topic, "-q", "2"))
    consumed: list[tuple[int, int, bytes]] = []

    async def listener(msgs: list[Any], context: Any) -> ConsumeOrderlyStatus:
        for m in msgs:
            if m.body == b"poison" and "TRIMQ_DLQ_MSG_ID" not in m.properties:
                return ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT
            consumed.append((m.queue_id, m.queue_offset, m.body))
        return ConsumeOrderlyStatus.SUCCESS

    consumer = PushConsumer(consumer_config(addr, group, "adm-orderly", suspend_current_queue_time_millis=100))
    consumer.subscribe(topic, "*")
    consumer.register_message_listener_orderly(listener)
    async with Producer(ProducerConfig(namesrv_addr=addr, producer_group="adm_orderly_p")) as producer:
        for qid, bodies in ((0, [b"m0", b"m1", b"poison", b"m3"]), (1, [b"n0", b"n1", b"n2"])):
            for body in bodies:
                await producer.send(Message(topic, body, keys=body.decode()),
                                    message_queue=MessageQueue(topic, BROKER_NAME, qid))

        async with consumer:
            cid = consumer.client_id
            await wait_until(lambda: len(consumed) >= 5 and consumer.blocked_queues())

            conns = ok(await aadmin(addr, "consumer", "connections", "-g", group))
            assert [c["clientId"] for c in conns["connectionSet"]] == [cid]
            assert conns["consumeOrderly"] is True and conns["consistent"] is True
            assert topic in conns["subscriptionTable"] and f"%RETRY%{group}" in conns["subscriptionTable"]

            status = ok(await aadmin(addr, "consumer", "status", "-g", group))
            (client,) = status["clients"]
            assert client["clientId"] == cid and client["consumeOrderly"] is True and status["errors"] == []
            (blocked,) = client["blockedQueues"]
            assert blocked["mq"] == {"topic": topic, "brokerName": BROKER_NAME, "queueId": 0}
            assert blocked["offset"] == 2 and blocked["attempts"] >= 1
            assert {"topic": topic, "brokerName": BROKER_NAME, "queueId": 0} in client["lockedQueues"]
            assert client["statusTable"][topic]["consumeOK"] >= 5

            locks = ok(await aadmin(addr, "consumer", "locks", "-g", group))
            held = {(lk["topic"], lk["queueId"]): lk for lk in locks["locks"]}
            assert held[(topic, 0)]["clientId"] == cid and held[(topic, 1)]["clientId"] == cid
            assert held[(topic, 0)]["expired"] is False and locks["fencedUpdates"] == 0

            def settled(d: dict[str, Any]) -> bool:
                rows = {(q["topic"], q["queueId"]): q for q in d["queues"]}
                return rows.get((topic, 0), {}).get("consumerOffset") == 2 and \
                    rows.get((topic, 1), {}).get("consumerOffset") == 3

            progress = await poll_admin(addr, ["consumer", "progress", "-g", group], settled)
            rows = {(q["topic"], q["queueId"]): q for q in progress["queues"]}
            assert progress["orderly"] is True and progress["online"] is True
            assert rows[(topic, 0)]["brokerOffset"] == 4 and rows[(topic, 0)]["lag"] == 2
            assert rows[(topic, 1)]["lag"] == 0 and rows[(topic, 0)]["owner"] == cid
            assert (f"%RETRY%{group}", 0) in rows
            assert progress["totalLag"] == 2
            only = ok(await aadmin(addr, "consumer", "progress", "-g", group, "-t", topic))
            assert {q["topic"] for q in only["queues"]} == {topic}

            # the blocked queue: skip the poison message (the broker finds the lock owner) -> DLQ
            skip = ok(await aadmin(addr, "consumer", "skip", "-g", group, "-t", topic, "-q", "0", "--offset", "2"))
            assert skip["clientId"] == cid and skip["foundBy"] == "lock" and skip["queueOffset"] == 2
            assert skip["nextOffset"] == 3 and skip["deadLetterTopic"] == f"%DLQ%{group}"
            await wait_until(lambda: (0, 3, b"m3") in consumed)
            not_cached = failed(await aadmin(addr, "consumer", "skip", "-g", group, "-t", topic, "-q", "0",
                                             "--offset", "0"))
            assert "is not cached by this consumer" in not_cached

            dlq = ok(await aadmin(addr, "dlq", "list", "-g", group))
            (letter,) = dlq["messages"]
            assert letter["originTopic"] == topic and letter["keys"] == "poison" and letter["resent"] is False
            assert letter["brokerName"] == BROKER_NAME and letter["queueOffset"] == 0
            with_body = ok(await aadmin(addr, "dlq", "list", "-g", group, "--body"))
            assert with_body["messages"][0]["body"] == "poison"

            resend = ok(await aadmin(addr, "dlq", "resend", "-g", group, "--msg-id", letter["msgId"]))
            assert resend["resentCount"] == 1 and resend["failed"] == []
            assert resend["resent"][0]["dlqMsgId"] == letter["msgId"] and resend["resent"][0]["topic"] == topic
            await wait_until(lambda: any(b == b"poison" for _, _, b in consumed))
            assert ok(await aadmin(addr, "dlq", "list", "-g", group))["messages"][0]["resent"] is True
            again = ok(await aadmin(addr, "dlq", "resend", "-g", group, "--all"))
            assert again["resentCount"] == 0 and again["skipped"] == 1
            unknown = await aadmin(addr, "dlq", "resend", "-g", group, "--msg-id", "0" * 32)
            assert "1 resend(s) failed" in failed(unknown)
            assert json.loads(unknown.stdout)["failed"][0]["msgId"] == "0" * 32

            # reset by time while online: every queue back to 0, the member restarts them from there
            before = {body: sum(1 for _, _, b in consumed if b == body) for body in (b"m0", b"n0")}
            # the plan first: nothing changes without --execute
            plan = ok(await aadmin(addr, "consumer", "reset-offset", "-g", group, "-t", topic, "--timestamp", "0"))
            assert plan["dryRun"] is True and plan["online"] is True and plan["clients"] == []
            assert [(q["queueId"], q["previousOffset"], q["offset"]) for q in plan["queues"]] == [(0, 5, 0), (1, 3, 0)]
            listed = ok(await aadmin(addr, "consumer", "list"))
            [entry] = [g for g in listed["groups"] if g["consumerGroup"] == group]
            assert (entry["members"], entry["consumeMode"], entry["brokers"]) == (1, "orderly", [BROKER_NAME])
            reset = ok(await aadmin(addr, "consumer", "reset-offset", "-g", group, "-t", topic, "--timestamp", "0",
                                    "--execute"))
            assert reset["online"] is True and reset["isForce"] is True and reset["errors"] == []
            assert reset["dryRun"] is False and reset["resetGenerations"] == {BROKER_NAME: 1}
            assert [(q["queueId"], q["previousOffset"], q["offset"]) for q in reset["queues"]] == [(0, 5, 0), (1, 3, 0)]
            (member,) = reset["clients"]
            # "queues" counts the queues the notice found held: a commit the broker refused as made before the
            # reset (the generation moved first) makes the member drop and re-read that queue, and the notice may
            # land while it is out of the table (1 in ~15 runs here), both queues too (a fresh clone's run under
            # load, 2026-11-29); either way both queues start over at 0.
            assert member["clientId"] == cid and member["ok"] is True and member["queues"] in (0, 1, 2)
            await wait_until(lambda: all(sum(1 for _, _, b in consumed if b == body) >= n + 1
                                         for body, n in before.items()))

        # offline: the broker writes the offsets itself
        reset = ok(await aadmin(addr, "consumer", "reset-offset", "-g", group, "-t", topic, "--timestamp", "now",
                                "--execute"))
        assert reset["online"] is False and reset["clients"] == []
        assert [(q["queueId"], q["offset"]) for q in reset["queues"]] == [(0, 5), (1, 3)]
        progress = ok(await aadmin(addr, "consumer", "progress", "-g", group, "-t", topic))
        assert progress["online"] is False and progress["totalLag"] == 0
        assert [q["consumerOffset"] for q in progress["queues"]] == [5, 3]
        rewind = ok(await aadmin(addr, "consumer", "reset-offset", "-g", group, "-t", topic, "--timestamp", "0",
                                 "--no-force", "--execute"))
        assert [q["offset"] for q in rewind["queues"]] == [0, 0]
        forward = ok(await aadmin(addr, "consumer", "reset-offset", "-g", group, "-t", topic, "--timestamp", "now",
                                  "--no-force", "--execute"))
        assert [q["offset"] for q in forward["queues"]] == [0, 0]  # without force a reset never moves forward


# ---------------------------------------------------------------------------------------------- a concurrent group


async def test_concurrent_group_skip_found_through_running_info(addr: str) -> None:
    topic, group = "AdmConc", "adm_conc"
    ok(await aadmin(addr, "topic", "create", "-t", topic, "-q", "1"))
    gate = trio.Event()
    consumed: list[bytes] = []

    async def listener(msgs: list[Any], context: Any) -> ConsumeConcurrentlyStatus:
        for m in msgs:
            if m.body == b"hang":
                await gate.wait()
            consumed.append(m.body)
        return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

    consumer = PushConsumer(consumer_config(addr, group, "adm-conc"))
    consumer.subscribe(topic, "*")
    consumer.register_message_listener_concurrently(listener)
    async with Producer(ProducerConfig(namesrv_addr=addr, producer_group="adm_conc_p")) as producer, consumer:
        for body in (b"a", b"hang", b"b"):
            await producer.send(Message(topic, body), message_queue=MessageQueue(topic, BROKER_NAME, 0))
        await wait_until(lambda: {b"a", b"b"} <= set(consumed))
        try:
            status = ok(await aadmin(addr, "consumer", "status", "-g", group))
            (client,) = status["clients"]
            assert client["consumeOrderly"] is False and client["blockedQueues"] == []
            (row,) = [r for r in client["mqTable"] if r["mq"]["topic"] == topic]
            assert row["processQueueInfo"]["cachedMsgCount"] == 1  # the hanging one

            progress = ok(await aadmin(addr, "consumer", "progress", "-g", group, "-t", topic))
            assert progress["orderly"] is False and progress["queues"][0]["owner"] == consumer.client_id

            skip = ok(await aadmin(addr, "consumer", "skip", "-g", group, "-t", topic, "-q", "0", "--offset", "1"))
            assert skip["foundBy"] == "runningInfo" and skip["clientId"] == consumer.client_id
            assert skip["queueOffset"] == 1 and skip["nextOffset"] == 3
            (letter,) = ok(await aadmin(addr, "dlq", "list", "-g", group))["messages"]
            assert letter["originTopic"] == topic and letter["bodySize"] == 4
        finally:
            gate.set()


# ---------------------------------------------------------------------------------------------- two brokers


def _start_broker(base: Path, name: str, *args: str) -> tuple[subprocess.Popen[bytes], Path]:
    store = base / name
    log = base / f"{name}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([tool("trimq-broker"), "--listen", "127.0.0.1:0", "--store", str(store),
                                 "--broker-name", name, "--log-format", "json", "--log-level", "warning", *args],
                                stdout=out, stderr=out, cwd=base)
    return proc, store / ADDRESS_FILE_NAME


async def _address(proc: subprocess.Popen[bytes], addr_file: Path) -> str:
    store = addr_file.parent
    log = store.parent / f"{store.name}.log"  # (where _start_broker writes it)
    return await trio.to_thread.run_sync(lambda: listened_address(addr_file, proc, 20, log=log))


async def test_two_brokers_merge_per_broker_answers(tmp_path: Path) -> None:
    procs = []
    try:
        p1, f1 = _start_broker(tmp_path, "broker-a", "--embedded-namesrv")
        procs.append(p1)
        ns = await _address(p1, f1)
        p2, f2 = _start_broker(tmp_path, "broker-b", "--namesrv", ns)
        procs.append(p2)
        addr_b = await _address(p2, f2)
        await poll_admin(ns, ["cluster", "list"], lambda d: len(d["clusters"][0]["brokers"]) == 2)

        topic, group = "AdmTwo", "adm_two"
        created = ok(await aadmin(ns, "topic", "create", "-t", topic, "-q", "2"))
        assert sorted(b["brokerName"] for b in created["brokers"]) == ["broker-a", "broker-b"]
        assert created["routed"] is True
        cluster = ok(await aadmin(ns, "cluster", "list"))
        brokers = {b["brokerName"]: b for b in cluster["clusters"][0]["brokers"]}
        assert brokers["broker-b"]["brokerAddr"] == addr_b and topic in brokers["broker-b"]["topics"]

        async with Producer(ProducerConfig(namesrv_addr=ns, producer_group="adm_two_p")) as producer:
            for i in range(8):
                await producer.send(Message(topic, f"m{i}".encode(), keys=f"k{i % 2}"))
        status = ok(await aadmin(ns, "topic", "status", "-t", topic))
        assert [(q["brokerName"], q["queueId"]) for q in status["queues"]] == [
            ("broker-a", 0), ("broker-a", 1), ("broker-b", 0), ("broker-b", 1)]
        assert status["totalMessages"] == 8

        assert "--broker" in failed(await aadmin(ns, "message", "show", "-t", topic, "-q", "0", "--offset", "0"), 2)
        shown = ok(await aadmin(ns, "message", "show", "-t", topic, "-q", "0", "--offset", "0", "-b", "broker-b"))
        assert shown["brokerName"] == "broker-b" and shown["storeHost"] == addr_b

        consumed: list[bytes] = []

        async def listener(msgs: list[Any], context: Any) -> ConsumeConcurrentlyStatus:
            consumed.extend(m.body for m in msgs)
            return ConsumeConcurrentlyStatus.CONSUME_SUCCESS

        consumer = PushConsumer(consumer_config(ns, group, "adm-two"))
        consumer.subscribe(topic, "*")
        consumer.register_message_listener_concurrently(listener)
        async with consumer:
            await wait_until(lambda: len(consumed) == 8)

            def caught_up(d: dict[str, Any]) -> bool:
                mine = [q for q in d["queues"] if q["topic"] == topic]
                return len(mine) == 4 and all(q["consumerOffset"] == q["brokerOffset"] for q in mine)

            progress = await poll_admin(ns, ["consumer", "progress", "-g", group], caught_up)
            assert progress["totalLag"] == 0 and progress["online"] is True
            assert {q["owner"] for q in progress["queues"] if q["topic"] == topic} == {consumer.client_id}

            reset = ok(await aadmin(ns, "consumer", "reset-offset", "-g", group, "-t", topic, "--timestamp", "0",
                                    "--execute"))
            assert [(q["brokerName"], q["queueId"], q["offset"]) for q in reset["queues"]] == [
                ("broker-a", 0, 0), ("broker-a", 1, 0), ("broker-b", 0, 0), ("broker-b", 1, 0)]
            # each broker told the member about its own queues. How many it still held at that moment is timing:
            # a commit on the wire when the broker bumped the reset generation is refused, and the member re-reads
            # that queue from the broker (which already has the reset offset) — so at most 2, the replay
            # below is what proves the reset.
            told = sorted((c["brokerName"], c["clientId"], c["ok"]) for c in reset["clients"])
            assert told == [("broker-a", consumer.client_id, True), ("broker-b", consumer.client_id, True)]
            assert all(c["queues"] <= 2 for c in reset["clients"]), reset["clients"]
            # every message again (at least once: a reset replays, it does not promise exactly once)
            await wait_until(lambda: all(consumed.count(f"m{i}".encode()) >= 2 for i in range(8)))

        # by key, in every topic of both brokers (the message index), then the topic goes from both and the route
        found = ok(await aadmin(ns, "message", "query", "--key", "k1"))
        assert sorted(m["body"] for m in found["messages"]) == ["m1", "m3", "m5", "m7"]
        assert {m["brokerName"] for m in found["messages"]} == {"broker-a", "broker-b"}
        gone = ok(await aadmin(ns, "topic", "delete", "-t", topic))
        assert [b["brokerName"] for b in gone["brokers"]] == ["broker-a", "broker-b"] and gone["errors"] == []
        assert topic not in [t["topic"] for t in ok(await aadmin(ns, "topic", "list"))["topics"]]
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)


# ---------------------------------------------------------------------------------------------- wire errors


async def test_forwarding_requests_answer_precise_errors(addr: str) -> None:
    from trimq.protocol.codes import RequestCode, ResponseCode
    from trimq.protocol.command import RemotingCommand
    from trimq.runtime.client import RemotingClient

    async with RemotingClient(default_timeout_s=10) as rc:
        async def call(code: int, ext: dict[str, Any]) -> RemotingCommand:
            return await rc.invoke(addr, RemotingCommand.request(code, ext))

        r = await call(RequestCode.GET_CONSUMER_RUNNING_INFO, {"consumerGroup": "adm_ghost", "clientId": "x@1"})
        assert r.code == ResponseCode.CONSUMER_NOT_ONLINE and "<adm_ghost> <x@1> not online" in (r.remark or "")
        r = await call(RequestCode.GET_CONSUMER_RUNNING_INFO, {"consumerGroup": "adm_ghost"})
        assert r.code == ResponseCode.SYSTEM_ERROR and "clientId" in (r.remark or "")
        r = await call(RequestCode.SKIP_MESSAGE, {"consumerGroup": "adm_ghost", "topic": "T", "queueId": 0,
                                                  "queueOffset": 0})
        assert r.code == ResponseCode.CONSUMER_NOT_ONLINE
        r = await call(RequestCode.SKIP_MESSAGE, {"consumerGroup": "adm_ghost", "topic": "T", "queueId": 0,
                                                  "queueOffset": 0, "brokerName": "elsewhere"})
        assert r.code == ResponseCode.SYSTEM_ERROR and "not this broker" in (r.remark or "")
        r = await call(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, {"topic": "AdmNoSuch", "group": "g",
                                                                   "timestamp": 0})
        assert r.code == ResponseCode.TOPIC_NOT_EXIST and "no topic in this broker" in (r.remark or "")
        r = await call(RequestCode.INVOKE_BROKER_TO_RESET_OFFSET, {"topic": "AdmNoSuch", "group": "g",
                                                                   "timestamp": "soon"})
        assert r.code == ResponseCode.SYSTEM_ERROR and "timestamp" in (r.remark or "")
        r = await call(RequestCode.GET_TOPIC_STATS_INFO, {"topic": "AdmNoSuch"})
        assert r.code == ResponseCode.TOPIC_NOT_EXIST
