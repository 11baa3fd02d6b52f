"""The trimq-commitlog / trimq-consumequeue data sources on a real (shared) SparkSession."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from audit_stores import StoreBuilder, write_rocketmq_segments

from trimq.spark_jobs import parser as P
from trimq.spark_jobs.checks import AUDIT_COLUMNS
from trimq.spark_jobs.commitlog_source import (
    CQ_FORMAT_NAME,
    FORMAT_NAME,
    RECORD_SCHEMA,
    CommitLogDataSource,
    ConsumeQueueDataSource,
    OptionError,
    read_planned,
    register,
)

pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("spark")]  # one worker, one Spark session (make test)

COLS = ["segment", "file_position", "physical_offset", "total_size", "malformed", "error", "crc_ok", "topic",
        "queue_id", "queue_offset", "keys", "tags", "born_host", "msg_id", "properties"]


@pytest.fixture(scope="module")
def small_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("small_store")
    b = StoreBuilder(root, segment_size=2048, cq_units_per_file=4)
    msgs = []
    for i in range(14):
        body = bytes((i + j) % 256 for j in range(200 + 17 * i % 150))
        msgs.append(b.store(f"T{i % 2}", body, queue_id=i % 3, keys=f"k{i}", tags="t"))
        if i == 6:
            b.raw(b"\xde\xad\xbe\xef" * 10)
    b.flip_body_byte(msgs[3])
    b.torn_tail("T0", b"q" * 250, 100)
    b.close()
    return root


def _parser_rows(spec: str) -> list[dict]:
    files = P.resolve_segments(spec)
    rows = []
    for split in P.plan_splits(files, 1 << 30):
        for batch in P.SplitScanner(split).batches():
            rows.extend(batch.as_dicts())
    return rows


def test_splits_smaller_than_a_record_read_every_record_exactly_once(spark, small_store: Path) -> None:
    register(spark)
    df = (spark.read.format(FORMAT_NAME).option("splitSize", "150").option("batchSize", "5")
          .load(str(small_store)))
    assert df.schema == RECORD_SCHEMA
    got = sorted((r.asDict() for r in df.select(*COLS).collect()), key=lambda r: (r["segment"], r["file_position"]))
    want = [{c: r[c] for c in COLS} for r in _parser_rows(str(small_store))]
    assert len(want) == 16  # 14 messages, the garbage region, the torn tail
    assert got == want
    # Records are longer than 150 bytes, so most splits own nothing or one record.
    n_splits = len(P.plan_splits(P.resolve_segments(str(small_store)), 150))
    assert n_splits > len(want)
    assert [r["error"].split(":")[0] for r in got if r["malformed"]] == ["bad_magic", "torn_tail"]
    assert sum(1 for r in got if r["crc_ok"] is False) == 1


def test_rocketmq_hand_encoded_segments_as_a_file_list(spark, tmp_path: Path) -> None:
    register(spark)
    written = write_rocketmq_segments(tmp_path, segment_size=2048)
    files = sorted(str(p) for p in (tmp_path / "commitlog").iterdir())
    df = spark.read.format(FORMAT_NAME).option("includeBody", "true").option("splitSize", "1k").load(",".join(files))
    rows = sorted(df.collect(), key=lambda r: r["physical_offset"])
    assert len(rows) == len(written) == 30
    for w, r in zip(written, rows, strict=True):
        assert not r["malformed"] and r["crc_ok"]
        assert r["body"] == w["body"]
        assert r["properties"] == w["properties"]
        assert (r["queue_id"], r["queue_offset"], r["born_timestamp"]) == (
            w["queue_id"], w["queue_offset"], w["born_timestamp"])
        assert r["born_host"].startswith("[2001:db8::7]:" if len(w["born_host"][0]) == 16 else "172.16.0.9:")


def test_consume_queue_source_returns_the_written_units(spark, small_store: Path) -> None:
    register(spark)
    units = spark.read.format(CQ_FORMAT_NAME).load(str(small_store)).collect()
    got = sorted((u["topic"], u["queue_id"], u["cq_offset"], u["commitlog_offset"], u["size"]) for u in units)
    msgs = [r for r in _parser_rows(str(small_store)) if not r["malformed"]]
    want = sorted((m["topic"], m["queue_id"], m["queue_offset"], m["physical_offset"], m["total_size"]) for m in msgs)
    assert got == want


def test_bad_option_is_a_clear_error(spark, small_store: Path) -> None:
    register(spark)
    with pytest.raises(Exception, match="splitSize 'lots' is not a byte count"):
        spark.read.format(FORMAT_NAME).option("splitSize", "lots").load(str(small_store)).count()
    missing = os.path.join(str(small_store), "nope")
    with pytest.raises(Exception, match="no such file or directory"):
        spark.read.format(FORMAT_NAME).load(missing).count()


@pytest.mark.parametrize("source, options", [
    ("commitlog", {"splitSize": "400", "batchSize": "5"}),
    ("commitlog", {"splitSize": "700", "includeBody": "true"}),
    ("commitlog", {"splitSize": "1k", "columns": ",".join(AUDIT_COLUMNS), "partials": "true"}),
    ("commitlog", {"splitSize": "1k", "columns": ",".join(AUDIT_COLUMNS),
                   "filter": '{"queues": [["T0", 1]], "offsets": [0]}'}),
    ("consumequeue", {}),
    ("consumequeue", {"summary": "true", "minCommitlogOffset": "300"}),
])
def test_a_read_planned_in_the_driver_gives_the_registered_sources_rows_in_its_order(
        spark, small_store: Path, source: str, options: dict[str, str]) -> None:
    """read_planned (the audit's reads) against spark.read.format(...).load(): the same schema and the same rows in
    the same order, for the record schema with splits smaller than a record, bodies, the audit's partials, a
    filter, and both consume-queue forms."""
    register(spark)
    cls, name = ((CommitLogDataSource, FORMAT_NAME) if source == "commitlog"
                 else (ConsumeQueueDataSource, CQ_FORMAT_NAME))
    planned = read_planned(spark, cls, str(small_store), **options)
    registered = spark.read.format(name).options(**options).load(str(small_store))
    assert planned.schema == registered.schema
    want = registered.collect()
    assert want  # every case reads something
    assert planned.collect() == want


def test_read_planned_says_what_is_wrong_with_an_option_in_the_driver(spark, small_store: Path) -> None:
    with pytest.raises(OptionError, match="splitSize 'lots' is not a byte count"):
        read_planned(spark, CommitLogDataSource, str(small_store), splitSize="lots")
    with pytest.raises(OptionError, match="unknown column 'nope'"):
        read_planned(spark, CommitLogDataSource, str(small_store), columns="topic,nope")
