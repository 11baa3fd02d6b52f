"""The JVM reader of clean segments (spark_jobs/jvm_reader.py, jvm/CommitLogSource.java): the scan tells clean
segments from the rest exactly, and ``read_records`` gives the rows of ``spark.read.format("trimq-commitlog")``, in
its order, on every kind of store: clean, planted defects, gaps, hand-encoded RocketMQ segments with IPv6 hosts,
and segments each broken in one way the JVM reader leaves to the Python one."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from audit_stores import (
    StoreBuilder,
    build_clean_store,
    build_gaps_store,
    build_planted_store,
    rocketmq_record,
    write_rocketmq_segments,
)

from trimq.spark_jobs import jvm_reader
from trimq.spark_jobs.commitlog_source import FORMAT_NAME, register
from trimq.spark_jobs.jvm_reader import build_jar, jvm_reader_loaded, read_records, scan_segments
from trimq.spark_jobs.parser import resolve_segments
from trimq.spark_jobs.session import with_jvm_reader

SPLIT = 4096  # several splits per test segment


def python_rows(spark, path: Path, include_body: bool) -> list:
    register(spark)
    return (spark.read.format(FORMAT_NAME).option("splitSize", str(SPLIT))
            .option("includeBody", str(include_body).lower()).load(str(path)).collect())


def clean_flags(spark, path: Path) -> list[bool]:
    return [c is not None for c in scan_segments(spark, resolve_segments(str(path)), split_size=SPLIT)]


def test_the_session_loads_the_jvm_reader(spark) -> None:
    # `make` builds the jar and build_session puts it on the class path: without it every read below would go to
    # the Python reader and prove nothing
    assert jvm_reader_loaded(spark)


@pytest.mark.parametrize("kind", ["clean", "planted", "gaps", "rocketmq"])
def test_read_records_gives_the_data_sources_rows_in_order(spark, tmp_path: Path, kind: str) -> None:
    root = tmp_path / kind
    {"clean": build_clean_store, "planted": build_planted_store, "gaps": build_gaps_store,
     "rocketmq": write_rocketmq_segments}[kind](root)
    flags = clean_flags(spark, root)
    # which segments the JVM reads: all of a clean store, all but the planted store's damaged one, none of the
    # hand-encoded segments (IPv6 born hosts in each)
    expected = {"clean": all(flags), "planted": any(flags) and not all(flags), "gaps": all(flags),
                "rocketmq": not any(flags)}
    assert expected[kind], flags
    for include_body in (False, True):
        mine = read_records(spark, str(root), split_size=SPLIT, include_body=include_body).collect()
        assert mine == python_rows(spark, root, include_body)
        assert mine


def _broken_segment_store(root: Path, how: str) -> Path:
    """Segments of regular records (four fit in one), one of them broken in one way after the sixth record: only it
    goes to the Python reader."""
    b = StoreBuilder(root, segment_size=2048)
    for i in range(6):
        b.store("T", bytes([i]) * 300, queue_id=i % 2, keys=f"k{i}")
    qoff = b.next_offset.get(("T", 0), 0)
    props = {"KEYS": "x", "TAGS": "t"}
    record = dict(topic="T", body=b"odd", queue_id=0, queue_offset=qoff, physical_offset=b.base + b.pos,
                  properties=props, born_host=(socket.inet_aton("192.168.7.8"), 54321),
                  store_host=(socket.inet_aton("10.1.2.3"), 10911), born_timestamp=b.now,
                  store_timestamp=b.tick())
    if how == "ipv6":
        record["born_host"] = (bytes(15) + b"\x01", 7)
    elif how == "bad_utf8_topic":
        raw = rocketmq_record(**{**record, "topic": "T\u00e9"})  # type: ignore[arg-type]
        raw = raw.replace("T\u00e9".encode(), b"T\xc3\x28")  # the same length, no longer UTF-8
    if how == "property_named_twice":
        raw = rocketmq_record(**{**record, "properties": {"KEYS": "x", "KEYX": "y"}})  # type: ignore[arg-type]
        raw = raw.replace(b"KEYX\x01", b"KEYS\x01")
    elif how != "bad_utf8_topic":
        raw = rocketmq_record(**record)  # type: ignore[arg-type]
    if how == "garbage":
        b.raw(b"\xde\xad\xbe\xef" * 10)
    else:
        b.raw(raw)
    for i in range(6, 12):
        b.store("T", bytes([i]) * 300, queue_id=i % 2, keys=f"k{i}")
    b.close()
    return root


@pytest.mark.parametrize("how", ["ipv6", "bad_utf8_topic", "property_named_twice", "garbage"])
def test_a_segment_the_jvm_cannot_vouch_for_goes_to_the_python_reader(spark, tmp_path: Path, how: str) -> None:
    root = _broken_segment_store(tmp_path / how, how)
    flags = clean_flags(spark, root)
    assert False in flags and True in flags, flags
    mine = read_records(spark, str(root), split_size=SPLIT).collect()
    assert mine == python_rows(spark, root, False)


def test_many_distinct_hosts_and_an_empty_store(spark, tmp_path: Path) -> None:
    # more born hosts than the reader's host table has slots: each row still names its own
    b = StoreBuilder(tmp_path / "hosts", segment_size=64 * 1024)
    for i in range(150):
        b.store("T", b"x" * 20, queue_id=i % 4, keys=f"k{i}", born_host=(f"10.0.{i // 50}.{i % 50}", 1000 + i))
    root = b.close()
    assert all(clean_flags(spark, root))
    mine = read_records(spark, str(root), split_size=SPLIT).collect()
    assert mine == python_rows(spark, root, False)
    assert len({r["born_host"] for r in mine}) == 150
    # a store whose segments hold no record: no rows, the record schema
    empty = StoreBuilder(tmp_path / "empty").close()
    frame = read_records(spark, str(empty), split_size=SPLIT)
    assert frame.collect() == [] and frame.schema == spark.read.format(FORMAT_NAME).load(str(empty)).schema


def test_a_segment_changed_after_the_scan_is_an_error_not_a_guess(spark, tmp_path: Path) -> None:
    root = tmp_path / "s"
    build_clean_store(root)
    frame = read_records(spark, str(root), split_size=SPLIT)  # the scan runs here
    first = resolve_segments(str(root))[0]
    with open(first, "r+b") as f:  # the first record's magic, gone
        f.seek(4)
        f.write(b"\0\0\0\0")
    with pytest.raises(Exception, match="is not the regular record the scan found there"):
        frame.collect()


def test_without_a_jdk_the_build_says_what_is_missing_and_a_bad_source_says_why(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "nojdk"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RuntimeError, match="no javac"):
        build_jar(tmp_path / "x.jar")
    monkeypatch.undo()
    broken = tmp_path / "CommitLogSource.java"
    broken.write_text("class Broken {")
    monkeypatch.setattr(jvm_reader, "SOURCE_PATH", broken)
    with pytest.raises(RuntimeError, match="javac failed"):
        build_jar(tmp_path / "x.jar")
    assert not (tmp_path / "x.jar").exists()


def test_the_reader_jar_adds_to_a_users_jars() -> None:
    assert with_jvm_reader({}, "/r.jar")["spark.jars"] == "/r.jar"
    assert with_jvm_reader({"spark.jars": "/mine.jar", "x": "1"}, "/r.jar") == {"spark.jars": "/mine.jar,/r.jar",
                                                                             "x": "1"}
    assert with_jvm_reader({"spark.jars": "/mine.jar"}, None) == {"spark.jars": "/mine.jar"}
