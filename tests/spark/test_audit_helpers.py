"""The audit's pure parts (no JVM): option parsing, offsets files, lag, the report, CLI usage errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from audit_stores import StoreBuilder

from trimq.spark_jobs import audit, cli
from trimq.spark_jobs.commitlog_source import OptionError, parse_size
from trimq.spark_jobs.report import render_report


def test_parse_since_forms() -> None:
    assert audit.parse_since("1700000000123") == 1_700_000_000_123
    assert audit.parse_since("2023-11-14T22:13:20Z") == 1_700_000_000_000
    assert audit.parse_since("2023-11-14T22:13:20") == 1_700_000_000_000  # naive = UTC
    assert audit.parse_since("2023-11-15T00:13:20+02:00") == 1_700_000_000_000
    assert audit.parse_since("24h", now_ms=100_000_000) == 100_000_000 - 86_400_000
    assert audit.parse_since(" 90m ", now_ms=10_000_000) == 10_000_000 - 5_400_000
    with pytest.raises(audit.UsageError, match="epoch milliseconds"):
        audit.parse_since("yesterday")


def test_parse_size() -> None:
    assert parse_size("64m") == 64 << 20
    assert parse_size("2k") == 2048
    assert parse_size("1GiB") == 1 << 30
    assert parse_size(" 4096 ") == 4096
    for bad in ("0", "-1", "lots", "1.5m"):
        with pytest.raises(OptionError):
            parse_size(bad, "splitSize")


def test_consumer_offsets_file(tmp_path: Path) -> None:
    f = tmp_path / "consumerOffset.json"
    f.write_text(json.dumps({"offsetTable": {"Orders@g1": {"0": 5, "1": 7}, "%RETRY%g1@g1": {"0": 0}}}))
    rows = audit.load_consumer_offsets(str(f))
    assert {(r["group"], r["topic"], r["queue_id"], r["consumer_offset"]) for r in rows} == {
        ("g1", "Orders", 0, 5), ("g1", "Orders", 1, 7), ("g1", "%RETRY%g1", 0, 0)}
    for content, message in (
        ("{not json", "not readable JSON"),
        ("[]", "no 'offsetTable'"),
        (json.dumps({"offsetTable": {"nogroup": {"0": 1}}}), "is not '<topic>@<group>'"),
        (json.dumps({"offsetTable": {"T@g": {"x": 1}}}), "is not an integer"),
    ):
        f.write_text(content)
        with pytest.raises(audit.UsageError, match=message):
            audit.load_consumer_offsets(str(f))
    with pytest.raises(audit.UsageError, match="no such file"):
        audit.load_consumer_offsets(str(tmp_path / "missing.json"))


def test_lag_and_offsets_past_the_end() -> None:
    offsets = [
        {"group": "g", "topic": "T", "queue_id": 0, "consumer_offset": 3},
        {"group": "g", "topic": "T", "queue_id": 1, "consumer_offset": 9},
        {"group": "g", "topic": "U", "queue_id": 0, "consumer_offset": 1},
    ]
    ends = [{"topic": "T", "queue_id": 0, "max_offset": 10, "cq_max_offset": 8},
            {"topic": "T", "queue_id": 1, "max_offset": 4, "cq_max_offset": None}]
    rows, ahead = audit._lag(offsets, ends)
    by_q = {(r["topic"], r["queue_id"]): r for r in rows}
    assert (by_q[("T", 0)]["lag"], by_q[("T", 0)]["max_offset_source"]) == (5, "consumequeue")
    assert (by_q[("T", 1)]["lag"], by_q[("T", 1)]["max_offset_source"]) == (0, "commitlog")
    assert by_q[("U", 0)]["lag"] is None
    assert [(a["topic"], a["queue_id"], a["kind"]) for a in ahead] == [("T", 1, "offset_ahead")]
    assert audit._lag(None, ends) == ([], [])


def test_validate_refuses_to_write_into_the_store(tmp_path: Path) -> None:
    StoreBuilder(tmp_path / "s").close()
    store = str(tmp_path / "s")
    for out in (store, f"{store}/commitlog", f"{store}/consumequeue/x"):
        with pytest.raises(audit.UsageError, match="refusing"):
            audit.validate(audit.AuditOptions(store=store, out=out))
    assert audit.validate(audit.AuditOptions(store=store, out=f"{store}/audit"))  # beside the data is fine
    with pytest.raises(audit.UsageError, match="not a directory"):
        audit.validate(audit.AuditOptions(store=str(tmp_path / "nope"), out=str(tmp_path / "o")))


def test_report_is_self_contained_and_escapes_names() -> None:
    summary = {
        "store": "/data/<store>", "generated_at": "2024-01-01T00:00:00Z", "since": None, "defects": 1,
        "exit_code": 1, "records": {"segments": 1, "messages": 2, "malformed_rows": 0, "topics": 1},
        "checks": {"offsets": {"count": 1, "by_kind": {"gap": 1}, "severity": "defect",
                               "examples": [{"kind": "gap", "topic": "<script>x</script>", "detail": {"missing": 1}}]}},
        "throughput": {"bucket_ms": 60_000, "per_topic": []},
        "lineage": {"chains": 0, "examples": [], "top_poison_keys": []},
        "lag": {"checked": True}, "outputs": {},
    }
    html = render_report(
        summary,
        chart_rows=[{"topic": "<script>x</script>", "minute_ms": 60_000 * i, "messages": i} for i in range(5)],
        lag_rows=[{"group": "g", "topic": "T", "queue_id": 0, "lag": 7, "consumer_offset": 1, "max_offset": 8}],
        group_rows=[{"group": "g", "retries": 3, "dlq_arrivals": 1}],
    )
    assert html.count("<svg") == 3
    assert "<script" not in html and "&lt;script&gt;" in html
    assert "http" not in html.replace("http-equiv", "")


def test_cli_usage_errors_exit_2_without_starting_spark(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--out", str(tmp_path / "o")]) == 2
    assert "--store and --out are required" in capsys.readouterr().err
    assert cli.main(["--store", str(tmp_path / "missing"), "--out", str(tmp_path / "o")]) == 2
    StoreBuilder(tmp_path / "s").close()
    assert cli.main(["--store", str(tmp_path / "s"), "--out", str(tmp_path / "o"), "--split-size", "big"]) == 2
    assert "--split-size" in capsys.readouterr().err
    assert cli.main(["--store", str(tmp_path / "s"), "--out", str(tmp_path / "o"), "--since", "when"]) == 2
    assert cli.main(["--store", str(tmp_path / "s"), "--out", str(tmp_path / "o"), "--conf", "novalue"]) == 2
    with pytest.raises(SystemExit) as exc:
        cli.main(["--bogus"])
    assert exc.value.code == 2


def test_deps_zip_for_cluster_workers(tmp_path: Path) -> None:
    import zipfile

    assert cli.main(["--write-py-files", str(tmp_path / "deps.zip")]) == 0
    names = zipfile.ZipFile(tmp_path / "deps.zip").namelist()
    # Paths follow the imported packages' names (trimq.spark_jobs -> trimq/spark_jobs/...), with the root
    # package's __init__.py, so the executors import the same names from the zip (test_spark_cluster runs it).
    assert {"trimq/__init__.py", "trimq/spark_jobs/parser.py", "trimq/spark_jobs/vectorized.py",
            "trimq/protocol/record.py", "trimq/spark_jobs/log4j2.properties"} <= set(names)
    assert not any(n.startswith(("spark_jobs/", "protocol/", "trimq/broker/")) for n in names)



def test_frozen_reference_reports_the_planted_defects(tmp_path: Path) -> None:
    """bench/audit_reference.py (the benchmark's yardstick, no Spark) finds what the audit finds on the
    planted stores of test_spark_audit.py, kind for kind."""
    from audit_stores import build_gaps_store, build_planted_store

    from bench.audit_reference import run

    build_planted_store(tmp_path / "planted")
    rep = run(tmp_path / "planted")
    assert {k: v["by_kind"] for k, v in rep["checks"].items()} == {
        "integrity": {"crc_mismatch": 1, "torn_tail": 1}, "offsets": {"gap": 1}, "consume_queue": {},
        "key_queues": {"key_in_many_queues": 1}, "born_order": {"born_order_inversion": 2},
        "consumer_offsets": {}, "retry_lineage": {}, "dead_letters": {"dlq_arrival": 1}}
    assert (rep["defects"], rep["lineage"]["chains"], rep["lineage"]["retry_deliveries"]) == (6, 1, 3)
    build_gaps_store(tmp_path / "gaps")
    rep = run(tmp_path / "gaps")
    assert {k: v["by_kind"] for k, v in rep["checks"].items() if v["by_kind"]} == {
        "consume_queue": {"unit_mismatch": 1, "missing_unit": 2}, "retry_lineage": {"retry_without_origin": 1}}
    assert rep["lineage"]["chains"] == 4


def test_a_users_jvm_options_add_to_the_sessions_own() -> None:
    """``--conf spark.driver.extraJavaOptions=...`` used to replace the session's, whose Derby home keeps
    derby.log out of the cwd."""
    from trimq.spark_jobs.session import merge_conf, session_conf

    base = session_conf("local[2]", "/tmp/t")
    merged = merge_conf(base, {"spark.driver.extraJavaOptions": "-Xss4m", "spark.executor.extraJavaOptions": "-Xss2m",
                               "spark.app.name": "mine"})
    assert merged["spark.driver.extraJavaOptions"] == "-Dderby.system.home=/tmp/t/derby -Xss4m"
    assert merged["spark.executor.extraJavaOptions"] == "-Xss2m" and merged["spark.app.name"] == "mine"
    assert base["spark.driver.extraJavaOptions"] == "-Dderby.system.home=/tmp/t/derby"


def test_the_audits_driver_jvm_runs_c1_alone_unless_it_writes_the_records_and_a_user_can_take_c2_back() -> None:
    from trimq.spark_jobs.session import merge_conf, session_conf

    conf = merge_conf(session_conf("local[2]", "/tmp/t"), cli.audit_conf({}))
    assert conf["spark.driver.extraJavaOptions"] == "-Dderby.system.home=/tmp/t/derby -XX:TieredStopAtLevel=1"
    mine = cli.audit_conf({"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=4", "spark.app.name": "x"})
    # the JVM takes the last of a repeated -XX flag: the user's
    assert mine["spark.driver.extraJavaOptions"] == "-XX:TieredStopAtLevel=1 -XX:TieredStopAtLevel=4"
    assert mine["spark.app.name"] == "x" and "spark.executor.extraJavaOptions" not in mine
    # every record through the JVM is C2's kind of work
    assert "spark.driver.extraJavaOptions" not in cli.audit_conf({}, write_records=True)


@pytest.mark.parametrize("write_records", [False, True])
def test_the_cli_starts_its_session_with_the_audits_settings_and_exits_3_when_spark_cannot_start(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        write_records: bool) -> None:
    """What main hands build_session (C1 unless it writes the records, then the user's --conf), and exit 3 with the
    reason when the session cannot start (the module's promise: "the audit itself failed")."""
    from trimq.spark_jobs import session

    asked: list[dict[str, str]] = []

    def no_spark(master: str | None, *, conf: dict[str, str], py_files: list[str]) -> None:
        asked.append(conf)
        raise RuntimeError("Java gateway process exited before sending its port number")

    monkeypatch.setattr(session, "build_session", no_spark)
    StoreBuilder(tmp_path / "s").close()
    argv = ["--store", str(tmp_path / "s"), "--out", str(tmp_path / "o"), "--master", "local[1]", "-q",
            "--conf", "spark.app.name=mine"] + (["--write-records"] if write_records else [])
    assert cli.main(argv) == cli.EXIT_ERROR == 3
    err = capsys.readouterr().err
    assert "trimq-audit: the audit failed: RuntimeError: Java gateway process exited" in err
    assert asked == [cli.audit_conf({"spark.app.name": "mine"}, write_records=write_records)]
    assert ("spark.driver.extraJavaOptions" in asked[0]) is not write_records
