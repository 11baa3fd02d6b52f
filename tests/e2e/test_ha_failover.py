"""Reads survive a dead master (issue 15 part 2), the brokers and the name server real processes.

A stand-alone ``trimq-namesrv``, a master and its slave of ``broker-a`` (``trimq-broker --role slave --broker-id 1``
learns its master from the name server). This test process runs the clients (the SDK, in-process):

1. a producer sends 40 messages, which the slave copies; consumer group A consumes them from the master;
2. the master is SIGKILLed: its connection to the name server closes, the name server drops it, the client's
   long poll breaks and its routes are refreshed at once; A's pulls go to the slave (time printed, not asserted:
   ``make bench`` measures it);
3. a new group B starts while the master is down: it reads all 40 from the slave and commits its offsets there;
4. the master restarts on its store: the slave reconnects and hands it B's offsets, merged by commit version, so
   B's offsets on the returned master are the ones committed to the slave (RocketMQ 4.9.3 loses them).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import trio

from trimq.client.config import ClientConfig, ProducerConfig, PushConsumerConfig
from trimq.client.instance import ClientInstance
from trimq.client.producer import Producer
from trimq.client.push_consumer import PushConsumer
from trimq.protocol.codes import RequestCode, ResponseCode
from trimq.protocol.command import RemotingCommand
from trimq.protocol.message import Message
from trimq.protocol.message_queue import MessageQueue
from trimq.runtime.client import RemotingClient
from trimq.testing.processes import fresh_address_file, listened_address, logged_event

from .conftest import Proc, Procs, tool

TOPIC = "HaFailover"
COUNT = 40


def start_namesrv(procs: Procs) -> str:
    p = procs.start("namesrv", [tool("trimq-namesrv"), "--listen", "127.0.0.1:0", "--log-format", "json",
                                "--log-level", "info"])
    return str(logged_event(p.log, p.popen, "namesrv.started", 20)["address"])


def start_broker(procs: Procs, name: str, store: Path, ns: str, *args: str, listen: str = "127.0.0.1:0",
                 **settings: Any) -> Proc:
    addr_file = fresh_address_file(store)
    env = dict(os.environ)
    env.update({"TRIMQ_BROKER_" + k.upper(): str(v) for k, v in settings.items()})
    p = procs.start(name, [tool("trimq-broker"), "--namesrv", ns, "--listen", listen, "--store", str(store),
                           "--broker-name", "broker-a", "--log-format", "json", "--log-level", "info", *args], env)
    p.address = listened_address(addr_file, p.popen, 20, log=p.log_text, name=name)
    return p


async def until(pred: Any, what: str, timeout: float = 20) -> None:
    with trio.fail_after(timeout):
        while True:
            r = pred()
            if hasattr(r, "__await__"):
                r = await r
            if r:
                return
            await trio.sleep(0.02)


def consumer(ns: str, group: str, seen: list[str]) -> PushConsumer:
    c = PushConsumer(PushConsumerConfig(namesrv_addr=ns, consumer_group=group,
                                        consume_from_where="CONSUME_FROM_FIRST_OFFSET",
                                        persist_consumer_offset_interval=200,
                                        # listener calls that returned when the test closes the consumer commit
                                        # (the default 0, RocketMQ's, drops their results: redelivered later)
                                        await_termination_millis_when_shutdown=5000))
    c.subscribe(TOPIC)

    def listener(msgs: list[Any], context: Any) -> Any:
        seen.extend(m.body.decode() for m in msgs)
        return "CONSUME_SUCCESS"

    c.register_message_listener_concurrently(listener)
    return c


async def test_consumers_read_from_the_slave_after_the_master_is_sigkilled(procs: Procs, tmp_path: Path) -> None:
    ns = start_namesrv(procs)
    master_store, slave_store = tmp_path / "master", tmp_path / "slave"
    master = start_broker(procs, "master", master_store, ns, ha_listen_port=0)
    slave = start_broker(procs, "slave", slave_store, ns, "--role", "slave", "--broker-id", "1",
                         register_broker_interval_ms=1000)
    mqs = [MessageQueue(TOPIC, "broker-a", q) for q in range(2)]
    async with ClientInstance(ClientConfig(namesrv_addr=ns)) as client, RemotingClient() as rc:
        await client.api.create_topic(master.address, TOPIC, read_queue_nums=2, write_queue_nums=2)
        await until(lambda: client.update_topic_route_info_from_name_server(TOPIC), "the topic's route")
        async with Producer(ProducerConfig(producer_group="ha_e2e"), instance=client) as producer:
            sent = {f"m{i}" for i in range(COUNT)}
            for body in sorted(sent):
                await producer.send(Message(TOPIC, body.encode()))

        async def replicated() -> bool:
            r = await rc.invoke(master.address, RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO, {}), 5)
            ha = r.body["ha"]
            return bool(ha["slaves"] == 1 and ha["slaveAckOffset"] == ha["maxOffset"])

        await until(replicated, "the slave to copy every message")

        # 1-2. group A reads from the master, which is then SIGKILLed
        seen_a: list[str] = []
        async with consumer(ns, "ha_e2e_a", seen_a) as a:
            await until(lambda: set(seen_a) == sent, "group A to consume from the master")
            assert a.core is not None
            stats = a.core.pull_service.stats
            before = stats["from_slave"]  # (0 unless a pull could not reach the master: reads go to the master)
            t_kill = trio.current_time()
            await trio.to_thread.run_sync(master.kill)
            await until(lambda: stats["from_slave"] > before, "group A pulling from the slave")
            print(f"\nfirst pull sent to the slave {1000 * (trio.current_time() - t_kill):.0f} ms after SIGKILL")
        # 3. group B starts while the master is down: everything from the slave, offsets committed there
        seen_b: list[str] = []
        async with consumer(ns, "ha_e2e_b", seen_b) as b:
            await until(lambda: set(seen_b) == sent, "group B to consume from the slave")
            assert b.core is not None and b.core.pull_service.stats["from_slave"] > 0
        on_slave = [await client.api.query_consumer_offset(slave.address, "ha_e2e_b", mq) for mq in mqs]
        assert sum(on_slave) == COUNT
        # 4. the master returns on its store and port: it gets B's offsets from the slave
        master = start_broker(procs, "master2", master_store, ns, listen=master.address, ha_listen_port=0)

        async def merged() -> bool:
            try:
                got = [await client.api.query_consumer_offset(master.address, "ha_e2e_b", mq) for mq in mqs]
            except Exception:  # (QUERY_NOT_FOUND until the slave handed them over)
                return False
            return got == on_slave

        await until(merged, "the returned master to have the offsets committed to the slave")

        async def following() -> bool:  # (the offsets may arrive first: the slave's offset rounds run every second)
            r = await rc.invoke(slave.address, RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO, {}), 5)
            return r.code == ResponseCode.SUCCESS and bool(r.body["ha"]["masterConnected"])

        await until(following, "the slave to follow the returned master again")
    assert master.terminate() == 0 and slave.terminate() == 0


def admin(ns: str, *args: str, json_out: bool = True) -> Any:
    """``trimq-admin --namesrv NS [--json] ARGS``: the parsed JSON (or the text) of a successful run."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIMQ_")}
    done = subprocess.run([tool("trimq-admin"), "--namesrv", ns, *(["--json"] if json_out else []), *args],
                          capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr + done.stdout
    return json.loads(done.stdout) if json_out else done.stdout


def roles(ns: str) -> dict[int, tuple[str, int, str | None]]:
    """brokerId -> (role, master epoch, address) of broker-a, from ``trimq-admin cluster list``."""
    (cluster,) = admin(ns, "cluster", "list")["clusters"]
    return {b["brokerId"]: (b["role"], b["masterEpoch"], b["brokerAddr"]) for b in cluster["brokers"]}


def test_cli_promotes_a_slave_and_the_old_master_is_demoted(procs: Procs, tmp_path: Path) -> None:
    ns = start_namesrv(procs)
    master = start_broker(procs, "master", tmp_path / "master", ns, register_broker_interval_ms=1000)
    slave = start_broker(procs, "slave", tmp_path / "slave", ns, "--role", "slave", "--broker-id", "1")
    deadline = time.monotonic() + 20
    while roles(ns) != {0: ("ASYNC_MASTER", 1, master.address), 1: ("SLAVE", 1, slave.address)}:
        assert time.monotonic() < deadline, roles(ns)
        time.sleep(0.1)
    text = admin(ns, "cluster", "list", json_out=False)
    assert "following" in text or "1 slave(s)" in text, text
    out = admin(ns, "broker", "promote", "--broker-name", "broker-a", "--broker-id", "1", json_out=False)
    assert f"at {slave.address} is now ASYNC_MASTER: master epoch 2" in out, out
    # the old master's next registration (1 s) learns of the newer master: it becomes its slave
    while roles(ns) != {0: ("ASYNC_MASTER", 2, slave.address), 1: ("SLAVE", 2, master.address)}:
        assert time.monotonic() < deadline + 20, roles(ns)
        time.sleep(0.1)
    assert master.terminate() == 0 and slave.terminate() == 0
