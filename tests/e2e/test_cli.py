"""``trimq-producer`` and ``trimq-consumer`` as a user runs them: flags, record formats, errors, signals."""

from __future__ import annotations

import hashlib
import json
import signal
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from trimq.tools.records import decode_body, encode_body, key_name

from .checker import check
from .conftest import Procs, env_with, tool


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_body_codec() -> None:
    body = encode_body("key-0001", 7, 64)
    assert len(body) == 64 and body.startswith(b'{"key":"key-0001","seq":7}\n')
    assert decode_body(body) == ("key-0001", 7)
    assert decode_body(encode_body("k", 0, 0)) == ("k", 0)  # never cut below the header
    for other in (b"", b"hello", b'{"key":1,"seq":2}\n', b'{"key":"a","seq":true}\n', b'{"key":"a"'):
        assert decode_body(other) is None
    assert key_name(7, 1000) == "key-0007" and key_name(7, 100_000) == "key-00007"


def test_help_lists_the_flags(procs: Procs) -> None:
    out = procs.run("help", [tool("trimq-producer"), "--help"])
    assert out.returncode == 0
    for flag in ("--namesrv", "--topic", "--count", "--keys", "--body-size", "--orderly", "--record", "--rate",
                 "--batch", "--tag", "--delay-level", "--queues", "--inflight"):
        assert flag in out.stdout, flag
    out = procs.run("help", [tool("trimq-consumer"), "--help"])
    assert out.returncode == 0
    for flag in ("--namesrv", "--group", "--topic", "--tags", "--orderly", "--handler", "--record", "--from",
                 "--timestamp", "--config", "--instance-name", "--log-format", "--log-level",
                 "--max-reconsume-times", "--exit-after-idle", "--order-scope", "--max-in-flight-keys"):
        assert flag in out.stdout, flag


def test_bad_input_gives_clear_errors(procs: Procs, tmp_path: Path) -> None:
    out = procs.run("p", [tool("trimq-producer"), "--topic", "T", "--count", "1"],
                    env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert out.returncode == 2 and "no name server" in out.stderr
    out = procs.run("p", [tool("trimq-producer"), "--namesrv", "127.0.0.1:1", "--topic", "bad topic!", "--count", "1"])
    assert out.returncode == 2 and "--topic" in out.stderr
    out = procs.run("c", [tool("trimq-consumer"), "--namesrv", "127.0.0.1:1", "--topic", "T"])
    assert out.returncode == 2 and "consumer_group" in out.stderr
    out = procs.run("c", [tool("trimq-consumer"), "--namesrv", "127.0.0.1:1", "--group", "g", "--topic", "T",
                          "--handler", "nosuchmodule:handle"])
    assert out.returncode == 2 and "cannot import 'nosuchmodule'" in out.stderr
    out = procs.run("c", [tool("trimq-consumer"), "--namesrv", "127.0.0.1:1", "--group", "g", "--topic", "T",
                          "--from", "last", "--timestamp", "20240101000000"])
    assert out.returncode == 2 and "--timestamp needs --from timestamp" in out.stderr
    out = procs.run("c", [tool("trimq-consumer"), "--namesrv", "127.0.0.1:1", "--group", "g", "--topic", "T",
                          "--order-scope", "key"])
    assert out.returncode == 2 and "--order-scope needs --orderly" in out.stderr
    cfg = tmp_path / "c.toml"
    cfg.write_text('[consumer]\nconsume_thread_max = 0\n')
    out = procs.run("c", [tool("trimq-consumer"), "--namesrv", "127.0.0.1:1", "--group", "g", "--topic", "T",
                          "--config", str(cfg)])
    assert out.returncode == 2 and "consume_thread_max" in out.stderr


def test_producer_record_format_and_orderly_routing(procs: Procs, tmp_path: Path) -> None:
    broker = procs.broker()
    rec = tmp_path / "p.jsonl"
    out = procs.run("producer", [tool("trimq-producer"), "--namesrv", broker.address, "--topic", "CliOrders",
                                 "--count", "60", "--keys", "6", "--orderly", "--queues", "4", "--record", str(rec),
                                 "--body-size", "100", "--tag", "TagA", "--batch", "3", "--json"])
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert summary["sent"] == 60 and summary["failed"] == 0 and summary["msgs_per_s"] > 0
    assert "\r" not in out.stderr  # no progress bar when stderr is not a terminal
    lines = read_jsonl(rec)
    assert len(lines) == 60
    assert set(lines[0]) == {"topic", "broker", "queue_id", "queue_offset", "key", "seq", "msg_id", "send_time",
                             "ack_time", "status", "offset_msg_id"}
    assert {r["status"] for r in lines} == {"SEND_OK"}
    by_key: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in lines:
        by_key[r["key"]].append(r)
    assert sorted(by_key) == [f"key-000{i}" for i in range(6)]
    for recs in by_key.values():
        assert [r["seq"] for r in recs] == list(range(10))  # acknowledged in per-key order
        assert len({r["queue_id"] for r in recs}) == 1  # one key, one queue
        offsets = [r["queue_offset"] for r in recs]
        assert offsets == sorted(offsets) and len(set(offsets)) == 10
    assert len({r["msg_id"] for r in lines}) == 60


def test_producer_progress_and_interrupt(procs: Procs, tmp_path: Path) -> None:
    broker = procs.broker()
    p = procs.start("producer", [tool("trimq-producer"), "--namesrv", broker.address, "--topic", "CliSlow",
                                 "--count", "100000", "--rate", "200", "--progress", "--record",
                                 str(tmp_path / "p.jsonl")])
    deadline = time.monotonic() + 20
    while not (tmp_path / "p.jsonl").exists() or len(read_jsonl(tmp_path / "p.jsonl")) < 20:
        assert time.monotonic() < deadline and p.popen.poll() is None, p.log_text()
        time.sleep(0.1)
    time.sleep(0.4)
    p.signal(signal.SIGINT)
    assert p.popen.wait(20) == 1  # interrupted: not all sent
    text = p.log.read_bytes().decode()
    assert "\rsent [" in text and "(interrupted)" in text
    assert len(read_jsonl(tmp_path / "p.jsonl")) < 100000


def test_consumer_record_format_handler_and_sigterm(procs: Procs, tmp_path: Path) -> None:
    broker = procs.broker()
    prod = tmp_path / "p.jsonl"
    out = procs.run("producer", [tool("trimq-producer"), "--namesrv", broker.address, "--topic", "CliTopic",
                                 "--count", "40", "--keys", "4", "--orderly", "--queues", "4", "--record", str(prod)])
    assert out.returncode == 0, out.stderr

    # Three consumers of three groups at once, each leaving after 1.5 s without a message:
    # 1) --record, --orderly, --from first: everything recorded, then a graceful exit;
    # 2) a sync --handler from the working directory, no --record: JSON lines on stdout;
    # 3) a tag filter nothing matches.
    (tmp_path / "myhandler.py").write_text(
        "import threading\n"
        "lock = threading.Lock()\n"
        "def handle(msgs, context):\n"
        "    with lock, open('handled.txt', 'a') as fh:\n"
        "        for m in msgs:\n"
        "            fh.write(f'{threading.current_thread().name} {m.queue_offset}\\n')\n"
        "    return True\n"
    )
    rec = tmp_path / "c.jsonl"
    common = ["--namesrv", broker.address, "--topic", "CliTopic", "--from", "first", "--exit-after-idle", "1.5"]
    c1 = procs.start("consumer1", [tool("trimq-consumer"), *common, "--group", "cli_g1", "--orderly", "--record",
                                   str(rec), "--instance-name", "one", "--metrics-port", "0"])
    c2 = procs.start("consumer2", [tool("trimq-consumer"), *common, "--group", "cli_g2", "--handler",
                                   "myhandler:handle"])
    c3 = procs.start("consumer3", [tool("trimq-consumer"), *common, "--group", "cli_g3", "--tags", "NoSuchTag",
                                   "--quiet"])
    for c in (c1, c2, c3):
        assert c.popen.wait(30) == 0, c.log_text()

    assert "consumed 40 messages (idle)" in c1.log_text()
    assert "trimq-consumer: metrics on http://127.0.0.1:" in c1.log_text()  # --metrics-port
    lines = read_jsonl(rec)
    assert len(lines) == 40
    r = lines[0]
    assert set(r) >= {"topic", "broker", "queue_id", "queue_offset", "keys", "msg_id", "reconsume_times",
                      "body_sha1", "consume_time", "start_time", "client_id", "key", "seq"}
    assert r["start_time"] <= r["consume_time"]
    assert r["client_id"].endswith("@one") and r["broker"] == "broker-a" and r["keys"] == r["key"]
    assert r["body_sha1"] == hashlib.sha1(encode_body(r["key"], r["seq"], 64)).hexdigest()
    report = check([prod], [rec])
    assert report.ok and report.duplicates == 0, report.text()

    handled = (tmp_path / "handled.txt").read_text().splitlines()
    assert len(handled) == 40 and "MainThread" not in handled[0]  # a plain def runs in worker threads
    printed = [json.loads(line) for line in c2.log_text().splitlines() if line.startswith("{")]
    assert len(printed) == 40 and all(p["body"].startswith('{"key"') for p in printed)

    assert "consumed 0 messages (idle)" in c3.log_text()

    # 3) SIGTERM is a graceful shutdown with exit status 0, and the offsets it committed hold
    c = procs.start("consumer4", [tool("trimq-consumer"), "--namesrv", broker.address, "--group", "cli_g1",
                                  "--topic", "CliTopic", "--orderly", "--record", str(tmp_path / "c4.jsonl"),
                                  "--log-level", "info", "--log-format", "json"])
    c.wait_for_log("consumer.cli_started")
    time.sleep(0.5)
    assert c.terminate() == 0
    assert "consumed 0 messages (signal)" in c.log_text()  # group cli_g1 had committed all 40


def test_consumer_async_handler_failure_is_retried(procs: Procs, tmp_path: Path) -> None:
    # short delay levels: a concurrent RECONSUME_LATER comes back from %RETRY% after 300 ms, not 10 s
    broker = procs.broker(env=env_with(message_delay_level="100ms 200ms 300ms 500ms 1s"))
    out = procs.run("producer", [tool("trimq-producer"), "--namesrv", broker.address, "--topic", "CliRetry",
                                 "--count", "3", "--keys", "1", "--queues", "1", "--orderly"])
    assert out.returncode == 0, out.stderr
    (tmp_path / "flaky.py").write_text(
        "attempts = {}\n"
        "async def handle(msgs, context):\n"
        "    m = msgs[0]\n"
        "    attempts[m.queue_offset] = attempts.get(m.queue_offset, 0) + 1\n"
        "    if m.queue_offset == 1 and attempts[1] < 2:\n"
        "        raise RuntimeError('first attempt fails')\n"
        "    return None\n"
    )
    consumers = {}
    for mode in ("orderly", "concurrently"):
        consumers[mode] = procs.start(mode, [
            tool("trimq-consumer"), "--namesrv", broker.address, "--group", f"cli_retry_{mode}", "--topic",
            "CliRetry", "--from", "first", "--handler", "flaky:handle", "--record", str(tmp_path / f"{mode}.jsonl"),
            "--exit-after-idle", "2.5", *(["--orderly"] if mode == "orderly" else []),
        ])
    for mode, c in consumers.items():
        assert c.popen.wait(60) == 0, c.log_text()
        lines = read_jsonl(tmp_path / f"{mode}.jsonl")
        assert sorted(r["seq"] for r in lines) == [0, 1, 2], mode  # the failed attempt is not recorded
        retried = next(r for r in lines if r["seq"] == 1)
        assert retried["reconsume_times"] >= 1 and retried["topic"] == "CliRetry", mode
        if mode == "orderly":  # retried in place: nothing after it in the queue was consumed first
            assert [r["seq"] for r in lines] == [0, 1, 2]
