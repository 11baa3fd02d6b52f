"""The audit job end to end: a clean store, a store with planted defects, and the trimq-audit CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from audit_stores import GROUP, SPLIT_SIZE, build_clean_store, build_gaps_store, write_rocketmq_segments

from trimq.spark_jobs.audit import audit_store
from trimq.spark_jobs.checks import DEFECT_CHECKS

pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("spark")]  # one worker, one Spark session (make test)


def _counts(summary: dict) -> dict[str, dict[str, int]]:
    return {name: res["by_kind"] for name, res in summary["checks"].items()}


def test_clean_store_audits_clean(spark, tmp_path: Path) -> None:
    info = build_clean_store(tmp_path / "store")
    summary = audit_store(spark, tmp_path / "store", tmp_path / "out", split_size=SPLIT_SIZE, write_records=True)
    assert _counts(summary) == {name: {} for name in (*DEFECT_CHECKS, "dead_letters")}
    assert summary["exit_code"] == 0 and summary["clean"] and summary["defects"] == 0
    assert summary["records"]["messages"] == info["messages"]
    assert summary["records"]["malformed_rows"] == 0
    assert summary["checks"]["consume_queue"]["checked"] is True
    # One message retried once, not dead-lettered.
    lin = summary["lineage"]
    assert (lin["chains"], lin["dead_lettered"], lin["retry_deliveries"], lin["dlq_arrivals"]) == (1, 0, 1, 0)
    assert lin["per_group"] == [
        {"group": GROUP, "retries": 1, "scheduled": 1, "dlq_arrivals": 0, "messages": 1, "dead_lettered": 0}
    ]
    # Lag: Orders queues committed at 3..6, retry queue at 1 (its end).
    lag = {(r["topic"], r["queue_id"]): r for r in summary["lag"]["queues"]}
    assert lag[(f"%RETRY%{GROUP}", 0)]["lag"] == 0
    assert all(lag[("Orders", q)]["lag"] > 0 and lag[("Orders", q)]["max_offset_source"] == "consumequeue"
               for q in range(4))
    out = tmp_path / "out"
    assert json.loads((out / "summary.json").read_text())["exit_code"] == 0
    html = (out / "report.html").read_text()
    assert html.count("<svg") == 3 and "<script" not in html and "http://" not in html and "https://" not in html
    assert spark.read.parquet(str(out / "records")).count() == info["messages"]
    assert spark.read.parquet(str(out / "throughput")).count() > 0
    assert (out / "lag" / "part-00000.parquet").is_file()


def test_planted_defects_are_each_reported_once(spark, planted_audit) -> None:
    p, summary, out = planted_audit.planted, planted_audit.summary, planted_audit.out
    assert _counts(summary) == {
        "integrity": {"crc_mismatch": 1, "torn_tail": 1},
        "offsets": {"gap": 1},
        "consume_queue": {},
        "key_queues": {"key_in_many_queues": 1},
        "born_order": {"born_order_inversion": 2},
        "consumer_offsets": {},
        "retry_lineage": {},
        "dead_letters": {"dlq_arrival": 1},
    }
    assert summary["defects"] == 6 and summary["exit_code"] == 1
    ex = {name: res["examples"] for name, res in summary["checks"].items()}

    crc = next(e for e in ex["integrity"] if e["kind"] == "crc_mismatch")
    assert crc["physical_offset"] == p["flipped"].physical_offset
    torn = next(e for e in ex["integrity"] if e["kind"] == "torn_tail")
    assert torn["physical_offset"] == p["torn_at"] and torn["detail"]["region_bytes"] == 68

    [gap] = ex["offsets"]
    assert (gap["topic"], gap["queue_id"], gap["queue_offset"]) == ("Payments", 1, p["lost_offset"])
    assert gap["detail"]["missing"] == 1

    [spread] = ex["key_queues"]
    assert (spread["topic"], spread["key"]) == ("Orders", "order-split")
    assert [q["queue_id"] for q in spread["detail"]["per_queue"]] == [0, 2]

    inv = sorted((e["key"], e["physical_offset"]) for e in ex["born_order"])
    inv1, inv2 = p["inversions"]
    assert inv == [("order-inv1", inv1.physical_offset), ("order-inv2", inv2.physical_offset)]

    [dead] = ex["dead_letters"]
    assert (dead["group"], dead["key"], dead["physical_offset"]) == (GROUP, "poison-1", p["dead"].physical_offset)

    lin = summary["lineage"]
    assert (lin["chains"], lin["dead_lettered"], lin["retry_deliveries"], lin["dlq_arrivals"]) == (1, 1, 3, 1)
    [chain] = lin["examples"]
    assert chain["origin"] == p["poison"].msg_id and chain["origin_topic"] == "Orders"
    assert [(s["stage"], s["reconsume_times"], s["delay_level"]) for s in chain["steps"]] == [
        ("scheduled", 1, 3), ("retry", 1, None), ("scheduled", 2, 4), ("retry", 2, None),
        ("scheduled", 3, 5), ("retry", 3, None), ("dlq", 4, None),
    ]
    assert chain["steps"][0]["delay_ms"] > 0
    assert lin["top_poison_keys"] == [{"group": GROUP, "key": "poison-1", "dlq_arrivals": 1, "rank": 1}]
    # Findings are on disk, one partition per check.
    findings = spark.read.parquet(str(out / "findings"))
    assert findings.count() == 7
    assert "1</td>" in (out / "report.html").read_text()


def test_bare_rocketmq_commitlog_audits_clean(spark, tmp_path: Path) -> None:
    """Only commitlog/ (no consume queues, no offsets), RocketMQ-encoded, records table not written (the
    default)."""
    written = write_rocketmq_segments(tmp_path / "rmq", segment_size=2048)
    summary = audit_store(spark, tmp_path / "rmq", tmp_path / "out", split_size=1024)
    assert summary["exit_code"] == 0 and summary["records"]["messages"] == len(written)
    assert summary["checks"]["consume_queue"]["checked"] is False
    assert summary["lag"]["checked"] is False and summary["lineage"]["chains"] == 0
    assert "records" not in summary["outputs"] and not (tmp_path / "out" / "records").exists()


AUDIT_BIN = Path(sys.executable).with_name("trimq-audit")


def test_a_windowed_audit_checks_only_the_records_stored_since(spark, tmp_path: Path) -> None:
    """``--since``: the second half of a clean store. (The console script in its own JVM, with ``--since``,
    nothing written to the cwd and no log noise, is the cluster test's run: tests/spark/test_spark_cluster.py.)"""
    store = tmp_path / "store"
    info = build_clean_store(store)
    since = info["builder"].records[len(info["builder"].records) // 2].store_timestamp
    summary = audit_store(spark, store, tmp_path / "out", split_size=SPLIT_SIZE, since_ms=since)
    assert summary["since"] == since and summary["clean"]
    assert 0 < summary["records"]["messages"] < info["messages"]


@pytest.mark.skipif(not AUDIT_BIN.exists(), reason="trimq-audit console script not installed in this venv")
def test_cli_usage_error_starts_no_jvm(tmp_path: Path) -> None:
    usage = subprocess.run([str(AUDIT_BIN), "--store", str(tmp_path / "missing"), "--out", str(tmp_path / "o2")],
                           cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert usage.returncode == 2 and "not a directory" in usage.stderr
    assert usage.stderr.count("\n") == 1  # the error line alone: no JVM banner


def test_planted_consume_queue_and_lineage_gaps(spark, tmp_path: Path) -> None:
    """(a) a record whose own unit is missing while another queue's wrong unit points at it; (b) retries
    linked by the unique key: RocketMQ 4.9.3's client fallback (no ORIGIN_MESSAGE_ID, the original's
    properties and UNIQ_KEY) and ORIGIN_MESSAGE_ID = UNIQ_KEY; (c) a retry whose original is missing,
    next to one whose original's segment was deleted by retention (not a defect)."""
    p = build_gaps_store(tmp_path / "store")
    mine, other, lost, ghost = p["mine"], p["other"], p["lost"], p["ghost"]
    orig1, orig2, early = p["orig1"], p["orig2"], p["early"]

    summary = audit_store(spark, tmp_path / "store", tmp_path / "out", split_size=SPLIT_SIZE)
    counts = _counts(summary)
    assert counts["consume_queue"] == {"unit_mismatch": 1, "missing_unit": 2}
    assert counts["retry_lineage"] == {"retry_without_origin": 1}
    assert {k: v for k, v in counts.items() if k not in ("consume_queue", "retry_lineage")} == {
        "integrity": {}, "offsets": {}, "key_queues": {}, "born_order": {}, "consumer_offsets": {},
        "dead_letters": {}}
    assert summary["exit_code"] == 1 and summary["defects"] == 4
    ex = summary["checks"]
    missing = sorted(e["physical_offset"] for e in ex["consume_queue"]["examples"] if e["kind"] == "missing_unit")
    assert missing == sorted([mine.physical_offset, other.physical_offset])
    [mis] = [e for e in ex["consume_queue"]["examples"] if e["kind"] == "unit_mismatch"]
    assert (mis["queue_id"], mis["physical_offset"]) == (0, mine.physical_offset)
    [gone] = ex["retry_lineage"]["examples"]
    assert (gone["physical_offset"], gone["group"]) == (lost.physical_offset, GROUP)
    assert gone["detail"]["origin_message_id"] == ghost and gone["detail"]["reference"] == "offset_id"
    chains = {c["origin"]: c for c in spark.read.parquet(str(tmp_path / "out" / "lineage")).collect()}
    assert chains[orig1.msg_id]["origin_topic"] == "Orders" and chains[orig1.msg_id]["retries"] == 1
    assert [s["stage"] for s in chains[orig1.msg_id]["steps"]] == ["scheduled", "retry"]
    assert chains[orig2.msg_id]["origin_queue_offset"] == orig2.queue_offset
    assert chains[early.msg_id]["origin_queue_id"] is None  # its segment is gone: no finding
    assert summary["lineage"]["chains"] == 4
