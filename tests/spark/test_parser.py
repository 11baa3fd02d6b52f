"""The record scanner without Spark: split ownership, malformed regions, RocketMQ-encoded records."""

from __future__ import annotations

import os
import socket
import struct
from pathlib import Path

import pytest
from audit_stores import STORE_HOST, StoreBuilder, rocketmq_record, write_rocketmq_segments

from trimq.protocol.record import encode_blank, encode_record
from trimq.spark_jobs import parser as P


def read_all(spec, split_size=None, **kw):
    rows = []
    files = P.resolve_segments(spec)
    size = split_size or max([os.path.getsize(f) for f in files] + [1])
    for split in P.plan_splits(files, size):
        for batch in P.SplitScanner(split, **kw).batches():
            rows.extend(batch.as_dicts())
    return rows


def positions(rows):
    return [(r["segment"], r["file_position"]) for r in rows]


@pytest.fixture
def mixed_store(tmp_path: Path) -> Path:
    """Records of many sizes over several segments with fillers, plus garbage, a zero gap, a CRC
    mismatch, a torn tail and an empty spare segment."""
    b = StoreBuilder(tmp_path, segment_size=4096)
    msgs = []
    for i in range(70):
        msgs.append(b.store(f"T{i % 3}", bytes((i * 7 + j) % 256 for j in range((i * 37) % 500)),
                            queue_id=i % 4, keys=f"k{i % 5}", tags="x"))
        if i == 20:
            b.raw(b"\x01garbage\xff" * 9)
        if i == 40:
            b.raw(bytes(64))  # zeros with records after them
    b.flip_body_byte(msgs[30], 1)
    b.torn_tail("T0", b"y" * 300, 120)
    b.close()
    return tmp_path


def test_every_split_size_reads_each_record_exactly_once(mixed_store: Path) -> None:
    ref = read_all(str(mixed_store))
    assert len(set(positions(ref))) == len(ref)
    assert sum(not r["malformed"] for r in ref) == 70
    for split_size in (1, 2, 3, 5, 8, 60, 90, 91, 92, 127, 300, 777, 1000, 2047, 4095, 4096, 10_000):
        got = read_all(str(mixed_store), split_size)
        assert positions(got) == positions(ref), split_size
        assert got == ref, split_size


def test_malformed_regions_are_reported_once_with_their_position(mixed_store: Path) -> None:
    rows = read_all(str(mixed_store))
    bad = [r for r in rows if r["malformed"]]
    kinds = [r["error"].split(":")[0] for r in bad]
    assert kinds == ["bad_magic", "zero_gap", "torn_tail"]
    garbage, gap, torn = bad
    assert garbage["total_size"] == 81 and garbage["magic"] is not None
    assert gap["total_size"] == 64
    assert torn["total_size"] == 120 and "last segment" in torn["error"]
    # Each region ends where the next record starts.
    by_pos = {(r["segment"], r["file_position"]): r for r in rows}
    for r in (garbage, gap):
        assert (r["segment"], r["file_position"] + r["total_size"]) in by_pos
    # The physical offset of a malformed row is where it is in the log.
    assert garbage["physical_offset"] == int(garbage["segment"]) + garbage["file_position"]
    assert next(r for r in rows if r["crc_ok"] is False)["malformed"] is False


def test_rocketmq_hand_encoded_records(tmp_path: Path) -> None:
    written = write_rocketmq_segments(tmp_path, segment_size=2048)
    rows = read_all(str(tmp_path / "commitlog"))
    assert not any(r["malformed"] for r in rows)
    assert len(rows) == len(written) == 30
    for w, r in zip(written, rows, strict=True):
        assert (r["segment"], r["file_position"], r["physical_offset"]) == (
            w["segment"], w["file_position"], w["physical_offset"])
        assert r["total_size"] == w["total_size"]
        assert r["magic"] == 0xDAA320A7 and r["crc_ok"] is True
        assert (r["topic"], r["queue_id"], r["queue_offset"], r["flag"]) == (
            w["topic"], w["queue_id"], w["queue_offset"], w["flag"])
        assert r["properties"] == w["properties"]
        assert r["keys"] == w["properties"]["KEYS"] and r["tags"] == w["properties"]["TAGS"]
        assert r["body_size"] == len(w["body"])
        assert (r["born_timestamp"], r["store_timestamp"]) == (w["born_timestamp"], w["store_timestamp"])
        born_ip, born_port = w["born_host"]
        if len(born_ip) == 16:
            assert r["born_host"] == f"[2001:db8::7]:{born_port}" and r["sys_flag"] & 0x10
        else:
            assert r["born_host"] == f"172.16.0.9:{born_port}" and not r["sys_flag"] & 0x10
        assert r["store_host"] == "10.9.8.7:10911"
        # MessageDecoder.createMessageId: store ip + port + commit-log offset, upper-case hex.
        expect_id = (socket.inet_aton("10.9.8.7") + struct.pack(">iq", 10911, w["physical_offset"])).hex().upper()
        assert r["msg_id"] == expect_id
    assert rows[5]["sys_flag"] & 0xC == 0x8


def test_rocketmq_ipv6_store_host_and_body(tmp_path: Path) -> None:
    v6 = socket.inet_pton(socket.AF_INET6, "fe80::1")
    rec = rocketmq_record(topic="T", body=b"payload", queue_id=2, queue_offset=9, physical_offset=0,
                          properties={"KEYS": "a"}, born_host=(v6, 1), store_host=(v6, 2),
                          born_timestamp=5, store_timestamp=6)
    seg = tmp_path / "00000000000000000000"
    seg.write_bytes(rec + bytes(100))
    [row] = read_all(str(seg), include_body=True)
    assert row["sys_flag"] & 0x30 == 0x30
    assert row["born_host"] == "[fe80::1]:1" and row["store_host"] == "[fe80::1]:2"
    assert row["body"] == b"payload" and row["crc_ok"]
    assert row["msg_id"] == (v6 + struct.pack(">iq", 2, 0)).hex().upper()


def test_overrun_and_bad_filler_and_non_last_segment(tmp_path: Path) -> None:
    d = tmp_path / "commitlog"
    d.mkdir()
    rec = encode_record(topic="T", body=b"abc", queue_id=0, queue_offset=0, physical_offset=0, store_host=STORE_HOST)
    # Segment 0: a record, then a filler that stops short of the segment end, then zeros.
    seg0 = bytearray(1024)
    seg0[: len(rec)] = rec
    seg0[len(rec) : len(rec) + 8] = encode_blank(100)
    (d / f"{0:020d}").write_bytes(bytes(seg0))
    # Segment 1 (the last): a record whose size runs past the end of the (truncated) file.
    rec1 = encode_record(topic="T", body=b"x" * 300, queue_id=0, queue_offset=1, physical_offset=1024,
                         store_host=STORE_HOST)
    (d / f"{1024:020d}").write_bytes(rec1[:200])
    rows = read_all(str(tmp_path))
    kinds = [(r["segment"], r["file_position"], r["error"].split(":")[0] if r["malformed"] else None) for r in rows]
    assert kinds == [
        (f"{0:020d}", 0, None),
        (f"{0:020d}", len(rec), "bad_filler"),
        (f"{1024:020d}", 0, "torn_tail"),
    ]
    assert "overrun" in rows[2]["error"] and rows[2]["total_size"] == 200
    assert "end of the segment" in rows[1]["error"]


def test_filler_ends_a_segment_and_spare_segments_are_empty(tmp_path: Path) -> None:
    b = StoreBuilder(tmp_path, segment_size=4096)
    for i in range(40):
        b.store("T", b"z" * 200, queue_id=i % 2)
    b.close(spare_segment=True)
    files = P.resolve_segments(str(tmp_path))
    assert len(files) == 4  # three with data, one spare
    splits = P.plan_splits(files, 1 << 20)
    assert [s.last_segment for s in splits] == [False, False, True, True]
    rows = read_all(str(tmp_path))
    assert len(rows) == 40 and not any(r["malformed"] for r in rows)
    assert [r["queue_offset"] for r in rows if r["queue_id"] == 1] == list(range(20))


def test_record_larger_than_the_read_window(tmp_path: Path) -> None:
    big = bytes(range(256)) * 800  # 200 KiB body, larger than the 64 KiB window below
    rec = encode_record(topic="Big", body=big, queue_id=0, queue_offset=0, physical_offset=0, store_host=STORE_HOST)
    rec2 = encode_record(topic="Big", body=b"s", queue_id=0, queue_offset=1, physical_offset=len(rec),
                         store_host=STORE_HOST)
    seg = tmp_path / "00000000000000000000"
    seg.write_bytes(rec + rec2 + bytes(64))
    split = P.plan_splits([str(seg)], 1 << 30)[0]
    rows = [r for b in P.SplitScanner(split, include_body=True, window=64 * 1024).batches() for r in b.as_dicts()]
    assert [r["body"] for r in rows] == [big, b"s"]
    assert all(r["crc_ok"] for r in rows)


def test_batches_hold_at_most_batch_size_rows(mixed_store: Path) -> None:
    files = P.resolve_segments(str(mixed_store))
    sizes = [len(b) for s in P.plan_splits(files, 1 << 20) for b in P.SplitScanner(s, batch_size=4).batches()]
    assert sizes and max(sizes) <= 4 and sum(sizes) == len(read_all(str(mixed_store)))


def test_bad_paths_give_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(P.SegmentPathError, match="no such file"):
        P.resolve_segments(str(tmp_path / "missing"))
    with pytest.raises(P.SegmentPathError, match="no commitlog"):
        P.resolve_segments(str(tmp_path))
    with pytest.raises(P.SegmentPathError, match="no commit-log path"):
        P.resolve_segments(" , ")
    (tmp_path / "commitlog").mkdir()
    assert P.resolve_segments(str(tmp_path)) == []
    with pytest.raises(ValueError, match="positive"):
        P.plan_splits([], 0)


def test_splits_are_planned_from_the_written_extent(tmp_path: Path) -> None:
    """20k records in a preallocated 1 GiB segment with 1 MiB splits: a few tasks, not 1,024; the same
    records as one whole-file read, sparse or written zeros alike."""
    from bench.audit_store_gen import generate

    generate(tmp_path / "sparse", 20_000)
    [seg] = P.resolve_segments(str(tmp_path / "sparse"))
    assert os.path.getsize(seg) == 1 << 30
    splits = P.plan_splits([seg], 1 << 20)
    data_mib = P.written_extent(seg) / (1 << 20)
    assert 8 <= data_mib <= 10 and len(splits) == -(-P.written_extent(seg) // (1 << 20)) <= 11
    assert splits[-1].end == 1 << 30 and all(s.end - s.start == 1 << 20 for s in splits[:-1])
    n = sum(len(b) for s in splits for b in P.SplitScanner(s).batches())
    assert n == 20_000
    # Real zeros (not a hole) after the data: the bisection finds the same extent, every record once.
    dense = tmp_path / "dense" / "00000000000000000000"
    dense.parent.mkdir()
    with open(seg, "rb") as src, open(dense, "wb") as dst:
        dst.write(src.read(int(data_mib * (1 << 20)) + 4096))
        dst.write(bytes(8 << 20))
    splits = P.plan_splits([str(dense)], 1 << 20)
    assert len(splits) <= 11 and splits[-1].end == os.path.getsize(dense)
    rows = [r for s in splits for b in P.SplitScanner(s).batches() for r in b.rows]
    assert len(rows) == 20_000 and not any(r[P.COLUMN_INDEX["malformed"]] for r in rows)
    # A file with no data at all still gets one split (its bytes are checked), an empty one none.
    spare = tmp_path / "00000000000001073741824"
    with open(spare, "wb") as f:
        f.truncate(1 << 30)
    (tmp_path / "empty").write_bytes(b"")
    assert [(s.start, s.end) for s in P.plan_splits([str(spare), str(tmp_path / "empty")], 1 << 20)] == [
        (0, 1 << 30)]
