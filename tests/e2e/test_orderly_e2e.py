"""Orderly consumption end to end, every part a real process started through its command-line tool.

One broker with its embedded name server, a topic with 8 queues, three orderly consumers of one group
(``trimq-consumer --orderly --record``) and an orderly producer (``trimq-producer --orderly --record``)
sending 24 000 messages for 1 000 keys. While it sends, one consumer is stopped gracefully (SIGTERM) and,
later, another is killed (SIGKILL). Then tests/e2e/checker.py judges the record files:

* every acknowledged message was consumed;
* per key, consumption follows send order, except for replays after the SIGKILL, and a replay starts no
  earlier than the committed offset (read from the broker right before the kill: the dead consumer's queues
  move 300 ms after it, and their new owners' commits would raise the floor past their own replay);
* the graceful stop caused no duplicate;
* the graceful takeover (from the SIGTERM to the first message each of the stopped consumer's queues
  gave its new owner) took under a second. Both takeover times are printed.

Default lock settings: 2 s leases (issue 14), so the killed consumer's queues are taken over within a second
(its connection closes; the broker releases its locks after a 300 ms grace) rather than RocketMQ's 60 s.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from trimq.client.config import ClientConfig
from trimq.client.errors import OffsetNotFoundError
from trimq.client.instance import ClientInstance
from trimq.client.runner import TrioRunner
from trimq.protocol.message_queue import MessageQueue

from .checker import Stop, check, client_id_of, read_records
from .conftest import Procs, tool

TOPIC = "E2EOrders"
GROUP = "e2e_orderly"
QUEUES = 8
KEYS = 1000
COUNT = 24_000
RATE = 2400  # msg/s: ~10 s of traffic
STOP_AT = 0.35  # fraction of acknowledged messages when c1 gets SIGTERM
KILL_AT = 0.65  # ... and c2 gets SIGKILL
TAKEOVER_LIMIT_MS = 1000


pytestmark = pytest.mark.slow


def count_lines(path: Path) -> int:
    if not path.exists():
        return 0
    with open(path, "rb") as fh:
        return sum(buf.count(b"\n") for buf in iter(lambda: fh.read(1 << 16), b""))


def wait(pred: object, timeout: float, what: str, interval: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not pred():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


@pytest.fixture
def runner() -> Iterator[TrioRunner]:
    with TrioRunner() as r:
        yield r


def committed_offsets(runner: TrioRunner, broker_addr: str) -> dict[tuple[str, str, int], int]:
    """The group's committed offset of every queue, straight from the broker."""
    instance = runner.enter(ClientInstance(ClientConfig(namesrv_addr=broker_addr)))
    out = {}
    try:
        for q in range(QUEUES):
            try:
                out[(TOPIC, "broker-a", q)] = runner.call(instance.api.query_consumer_offset, broker_addr, GROUP,
                                                          MessageQueue(TOPIC, "broker-a", q))
            except OffsetNotFoundError:
                pass
    finally:
        runner.exit(instance)
    return out


def test_orderly_end_to_end_with_graceful_stop_and_kill(procs: Procs, tmp_path: Path, runner: TrioRunner) -> None:
    t_begin = time.monotonic()
    broker = procs.broker()
    ns = broker.address
    made = procs.run("topic", [tool("trimq-producer"), "--namesrv", ns, "--topic", TOPIC, "--count", "0",
                               "--queues", str(QUEUES)])
    assert made.returncode == 0, made.stderr

    consumers = {}
    for name in ("c1", "c2", "c3"):
        consumers[name] = procs.start(name, [
            tool("trimq-consumer"), "--namesrv", ns, "--group", GROUP, "--topic", TOPIC, "--orderly",
            "--from", "first", "--record", str(tmp_path / f"{name}.jsonl"), "--instance-name", name,
            "--log-format", "json", "--log-level", "info",
        ])
    for c in consumers.values():
        c.wait_for_log("consumer.cli_started")
    time.sleep(1.0)  # let the group settle on its final allocation (3 members)

    prod_rec = tmp_path / "producer.jsonl"
    producer = procs.start("producer", [
        tool("trimq-producer"), "--namesrv", ns, "--topic", TOPIC, "--count", str(COUNT), "--keys", str(KEYS),
        "--orderly", "--rate", str(RATE), "--inflight", "64", "--record", str(prod_rec), "--json",
    ])

    wait(lambda: count_lines(prod_rec) >= COUNT * STOP_AT, 60, "the producer to reach the stop point")
    t_stop = time.time_ns() // 1_000_000
    consumers["c1"].signal(signal.SIGTERM)

    wait(lambda: count_lines(prod_rec) >= COUNT * KILL_AT, 60, "the producer to reach the kill point")
    committed = committed_offsets(runner, ns)  # a floor for the replays: only lower than at the kill
    t_kill = time.time_ns() // 1_000_000
    consumers["c2"].kill()

    assert producer.popen.wait(90) == 0, producer.log_text()[-3000:]
    summary = next(json.loads(line) for line in reversed(producer.log_text().splitlines())
                   if line.startswith('{"topic"'))
    assert summary["sent"] == COUNT
    assert consumers["c1"].popen.wait(30) == 0, consumers["c1"].log_text()[-3000:]

    acked = {r["msg_id"] for r in read_records([prod_rec])[0]}
    files = [tmp_path / f"{n}.jsonl" for n in consumers]

    def all_consumed() -> bool:
        seen = {r["msg_id"] for recs in read_records(files) for r in recs}
        return acked <= seen

    try:
        wait(all_consumed, 60, "every acknowledged message to be consumed", interval=0.5)
    finally:
        assert consumers["c3"].terminate() == 0, consumers["c3"].log_text()[-3000:]

    ids = {n: client_id_of(tmp_path / f"{n}.jsonl") for n in consumers}
    assert all(ids.values()), ids
    stops = [Stop(str(ids["c1"]), t_stop, graceful=True), Stop(str(ids["c2"]), t_kill, graceful=False)]
    report = check([prod_rec], files, stops=stops, committed=committed, topic=TOPIC)
    graceful = report.max_takeover_ms(graceful=True)
    crash = report.max_takeover_ms(graceful=False)
    print(f"\n{report.text()}")
    print(f"producer: {summary['sent']} messages in {summary['elapsed_s']} s ({summary['msgs_per_s']} msg/s, "
          f"rate limit {RATE}); graceful takeover {graceful} ms; takeover after SIGKILL {crash} ms; "
          f"test wall time {time.monotonic() - t_begin:.1f} s")
    assert report.ok, report.text()
    assert report.produced == COUNT and len(acked) == COUNT
    assert report.takeover_ms(graceful=True), "c1 owned no queue when it was stopped"
    assert graceful is not None and graceful < TAKEOVER_LIMIT_MS, report.text()
    assert crash is not None, report.text()
    # the graceful stop caused no duplicate: every duplicate is part of a replay after the kill
    assert report.duplicates <= report.replayed
    assert all(r.from_client == ids["c2"] for r in report.replays)
