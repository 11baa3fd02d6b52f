"""A SIGKILLed orderly consumer's queues move to the survivor (issue 14), every part a real process.

One broker with its embedded name server (default settings: 2 s leases, 300 ms disconnect grace), a topic
with 4 queues, two orderly consumers (``trimq-consumer --orderly --record``) and an orderly producer. While it
sends, one consumer is SIGKILLed: its connection closes, the broker releases its locks and its membership
after the grace, the survivor is notified, rebalances and takes its queues over. The checker (tests/e2e/
checker.py) judges the record files: nothing lost, per-key order except replays after the kill, no replay
below the committed offset. The takeover time is printed, not asserted (``make bench`` measures it).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from .checker import Stop, check, client_id_of, read_records
from .conftest import Procs, tool

TOPIC = "LeaseFailover"
GROUP = "lease_failover"
COUNT = 6000
RATE = 1500

pytestmark = pytest.mark.slow


def count_lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def wait(pred: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def test_sigkilled_consumers_queues_move_to_the_survivor(procs: Procs, tmp_path: Path) -> None:
    broker = procs.broker()
    ns = broker.address
    made = procs.run("topic", [tool("trimq-producer"), "--namesrv", ns, "--topic", TOPIC, "--count", "0",
                               "--queues", "4"])
    assert made.returncode == 0, made.stderr
    consumers = {name: procs.start(name, [
        tool("trimq-consumer"), "--namesrv", ns, "--group", GROUP, "--topic", TOPIC, "--orderly", "--from", "first",
        "--record", str(tmp_path / f"{name}.jsonl"), "--instance-name", name, "--log-format", "json",
        "--log-level", "info"]) for name in ("survivor", "victim")}
    for c in consumers.values():
        c.wait_for_log("consumer.cli_started")
    time.sleep(1.0)  # the group settles: two members, two queues each
    prod_rec = tmp_path / "producer.jsonl"
    producer = procs.start("producer", [
        tool("trimq-producer"), "--namesrv", ns, "--topic", TOPIC, "--count", str(COUNT), "--keys", "200",
        "--orderly", "--rate", str(RATE), "--inflight", "32", "--record", str(prod_rec), "--json"])
    wait(lambda: count_lines(prod_rec) >= COUNT // 3, 60, "a third of the messages")
    victim_file = tmp_path / "victim.jsonl"
    wait(lambda: count_lines(victim_file) > 0, 30, "the victim to consume")
    t_kill = time.time_ns() // 1_000_000
    consumers["victim"].kill()
    assert producer.popen.wait(60) == 0, producer.log_text()[-3000:]
    acked = {r["msg_id"] for r in read_records([prod_rec])[0]}
    files = [tmp_path / "survivor.jsonl", victim_file]
    try:
        wait(lambda: acked <= {r["msg_id"] for recs in read_records(files) for r in recs}, 30,
             "every acknowledged message to be consumed")
    finally:
        assert consumers["survivor"].terminate() == 0, consumers["survivor"].log_text()[-3000:]
    victim_id = client_id_of(victim_file)
    assert victim_id
    report = check([prod_rec], files, stops=[Stop(victim_id, t_kill, graceful=False)], topic=TOPIC)
    print(f"\n{report.text()}\ntakeover after SIGKILL: {report.max_takeover_ms(graceful=False)} ms")
    summary = next(json.loads(line) for line in reversed(producer.log_text().splitlines())
                   if line.startswith('{"topic"'))
    assert summary["sent"] == COUNT
    assert report.ok, report.text()
    assert report.takeovers and all(t.new_owner is not None for t in report.takeovers), report.text()
