"""The vectorised reader (spark_jobs.vectorized) against the sequential parser, row for row, without Spark."""

from __future__ import annotations

import itertools
import json
import os
import socket
from pathlib import Path

import pyarrow as pa
import pytest
from audit_stores import (
    STORE_HOST,
    StoreBuilder,
    build_clean_store,
    build_planted_store,
    rocketmq_record,
    write_rocketmq_segments,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trimq.protocol.message import encode_properties
from trimq.protocol.record import encode_record
from trimq.spark_jobs import parser as P
from trimq.spark_jobs import vectorized as V

VECTORS = Path(__file__).parent.parent / "vectors" / "records.json"


def sequential(spec: str, split_size: int | None = None, **kw) -> list[dict]:
    files = P.resolve_segments(spec)
    size = split_size or max([os.path.getsize(f) for f in files] + [1])
    out = []
    for split in P.plan_splits(files, size):
        for rb in P.SplitScanner(split, **kw).batches():
            out.extend(V.batch_to_arrow(rb).to_pylist())
    return out


def vectorised(spec: str, split_size: int | None = None, stats: list | None = None, **kw) -> list[dict]:
    files = P.resolve_segments(spec)
    size = split_size or max([os.path.getsize(f) for f in files] + [1])
    out = []
    for split in P.plan_splits(files, size):
        vs = V.VectorScanner(split, **kw)
        for b in vs.batches():
            assert b.schema == vs.schema
            assert b.num_rows <= vs.batch_size
            out.extend(b.to_pylist())
        if stats is not None:
            stats.append((vs.fast_records, vs.slow_items))
    return out


def assert_same(spec: str, split_sizes=(None,), **kw) -> list[dict]:
    want = sequential(spec, include_body=kw.get("include_body", False))
    for ss in split_sizes:
        got = vectorised(spec, ss, **kw)
        assert len(got) == len(want), ss
        for w, g in zip(want, got, strict=True):
            assert g == w, ss
    return want


@pytest.fixture
def defect_store(tmp_path: Path) -> Path:
    """Fillers, garbage, a zero gap, a CRC mismatch, a torn tail, a spare segment, IPv6 born hosts."""
    b = StoreBuilder(tmp_path, segment_size=4096)
    msgs = []
    for i in range(70):
        born = ("2001:db8::5", 7000 + i) if i % 4 == 0 else ("192.168.7.8", 54321)
        msgs.append(b.store(f"T{i % 3}", bytes((i * 7 + j) % 256 for j in range((i * 37) % 500)),
                            queue_id=i % 4, keys=f"k{i % 5} x", tags="x", born_host=born))
        if i == 20:
            b.raw(b"\x01garbage\xff" * 9)
        if i == 40:
            b.raw(bytes(64))
    b.flip_body_byte(msgs[30], 1)
    b.torn_tail("T0", b"y" * 300, 120)
    b.close()
    return tmp_path


def test_same_rows_as_the_sequential_parser_on_the_audit_stores(tmp_path: Path) -> None:
    build_planted_store(tmp_path / "planted")
    build_clean_store(tmp_path / "clean")
    write_rocketmq_segments(tmp_path / "rmq", segment_size=2048)  # IPv6 born hosts, a transactional flag
    for name in ("planted", "clean", "rmq"):
        rows = assert_same(str(tmp_path / name), (None, 150, 1000, 4096), include_body=True)
        assert rows and any(r["properties"] for r in rows)


def test_same_rows_with_fillers_torn_tails_bad_crcs_and_garbage(defect_store: Path) -> None:
    stats: list = []
    want = sequential(str(defect_store))
    assert [r["error"].split(":")[0] for r in want if r["malformed"]] == ["bad_magic", "zero_gap", "torn_tail"]
    assert sum(r["crc_ok"] is False for r in want) == 1
    assert any(r["born_host"].startswith("[2001:db8::5]") for r in want)
    assert vectorised(str(defect_store), stats=stats) == want
    # Most records were decoded vectorised; the walker took the regions, the fillers and the tail.
    assert sum(f for f, _ in stats) >= 65
    for ss in (7, 91, 333, 1000, 4095):  # 7: every split smaller than a record's size and magic fields
        assert vectorised(str(defect_store), ss) == want, ss


def test_golden_records_and_ipv6_store_hosts(tmp_path: Path) -> None:
    """tests/vectors/records.json (IPv4/IPv6 hosts, empty body and properties) back to back in a segment."""
    doc = json.loads(VECTORS.read_text())
    blob = b"".join(bytes.fromhex(r["hex"]) for r in doc["records"])
    v6 = socket.inet_pton(socket.AF_INET6, "fe80::1")
    blob += rocketmq_record(topic="T6", body=b"payload", queue_id=2, queue_offset=9, physical_offset=len(blob),
                            properties={"KEYS": "a b"}, born_host=(v6, 1), store_host=(v6, 2), born_timestamp=5,
                            store_timestamp=6)
    seg = tmp_path / "commitlog" / "00000000000000000000"
    seg.parent.mkdir()
    seg.write_bytes(blob + bytes(300))
    rows = assert_same(str(tmp_path), (None,), include_body=True)
    assert len(rows) == len(doc["records"]) + 1
    assert rows[-1]["store_host"] == "[fe80::1]:2" and rows[-1]["msg_id"].startswith(v6.hex().upper())
    assert [r["topic"] for r in rows[:-1]] == [r["fields"]["topic"] for r in doc["records"]]


def test_irregular_records_go_to_the_walker_one_at_a_time(tmp_path: Path) -> None:
    """Text that is not UTF-8, a property name twice, lengths that do not add up: same rows as before."""
    recs = []
    pos = 0

    def add(raw: bytes) -> None:
        nonlocal pos
        recs.append(raw)
        pos += len(raw)

    def rec(i: int, **kw) -> bytes:
        args = dict(topic="T", body=b"b" * i, queue_id=0, queue_offset=i, physical_offset=pos,
                    properties=encode_properties({"KEYS": f"k{i}"}), store_host=STORE_HOST)
        args.update(kw)
        return encode_record(**args)

    for i in range(5):
        add(rec(i))
    bad_topic = bytearray(rec(5, topic="TT"))
    bad_topic[-len(encode_properties({"KEYS": "k5"}).encode()) - 2 - 2] = 0xFF  # first topic byte
    add(bytes(bad_topic))
    add(rec(6, properties="KEYS\x01a\x02TAGS\x01t\x02KEYS\x01b\x02"))  # dict semantics: KEYS = b
    add(rec(7, properties="KEYS\x01\xe9t\xe9".encode("latin-1").decode("latin-1")))
    fields = bytearray(rec(8))
    fields[84:88] = (len(fields)).to_bytes(4, "big")  # body length larger than the record
    add(bytes(fields))
    for i in range(9, 14):
        add(rec(i))
    seg = tmp_path / "00000000000000000000"
    seg.write_bytes(b"".join(recs) + bytes(64))
    stats: list = []
    want = sequential(str(seg))
    assert vectorised(str(seg), stats=stats) == want
    assert want[5]["topic"] == "\ufffdT" and want[6]["keys"] == "b"
    assert [r["malformed"] for r in want].count(True) == 1 and "bad_fields" in want[8]["error"]
    fast, slow = stats[0]
    assert fast == len(want) - 3 and slow >= 3


def test_record_larger_than_the_window_and_small_batches(tmp_path: Path) -> None:
    big = bytes(range(256)) * 800  # 200 KiB body, larger than the 64 KiB window below
    rec = encode_record(topic="Big", body=big, queue_id=0, queue_offset=0, physical_offset=0, store_host=STORE_HOST)
    rest = [encode_record(topic="S", body=b"s" * i, queue_id=0, queue_offset=1 + i, physical_offset=0,
                          store_host=STORE_HOST) for i in range(40)]
    seg = tmp_path / "00000000000000000000"
    seg.write_bytes(rec + b"".join(rest) + bytes(64))
    split = P.plan_splits([str(seg)], 1 << 30)[0]
    got = [b for b in V.VectorScanner(split, include_body=True, window=64 * 1024, batch_size=7).batches()]
    assert max(b.num_rows for b in got) <= 7
    rows = [r for b in got for r in b.to_pylist()]
    assert rows[0]["body"] == big and len(rows) == 41 and all(r["crc_ok"] for r in rows)
    assert rows == sequential(str(seg), include_body=True)


def test_projection_and_derived_columns(defect_store: Path) -> None:
    full = sequential(str(defect_store))
    cols = ["topic", "queue_offset", "physical_offset", "malformed", "shard_key", "queue_step", "born_step",
            "split_start", "prop_KEYS", "prop_UNIQ_KEY"]
    for ss in (None, 1000):
        rows = vectorised(str(defect_store), ss, columns=cols)
        assert [list(r) for r in rows[:1]] == [cols]
        assert [(r["topic"], r["physical_offset"]) for r in rows] == [(r["topic"], r["physical_offset"]) for r in full]
        # Reference for the steps: the same definition, in plain Python, within each split.
        splits = P.plan_splits(P.resolve_segments(str(defect_store)), ss or 1 << 30)
        last_q: dict = {}
        last_b: dict = {}
        for r, f in zip(rows, full, strict=True):
            sid = (f["segment"], r["split_start"])
            assert any(s.segment == f["segment"] and s.start == r["split_start"] for s in splits)
            assert r["prop_KEYS"] == f["keys"] and r["prop_UNIQ_KEY"] is None
            key = f["keys"].split()[0] if f["keys"] and f["keys"].split() else None
            assert r["shard_key"] == key
            if f["malformed"]:
                assert r["queue_step"] is None and r["born_step"] is None
                continue
            q = (sid, f["topic"], f["queue_id"])
            assert r["queue_step"] == (f["queue_offset"] - last_q[q] if q in last_q else None)
            last_q[q] = f["queue_offset"]
            k = (sid, f["topic"], key)
            assert r["born_step"] == (f["born_timestamp"] - last_b[k] if k in last_b else None)
            last_b[k] = f["born_timestamp"]
    with pytest.raises(KeyError):
        V.projection_schema(["nope"])
    assert V.projection_schema(None) == V.ARROW_RECORD_SCHEMA
    assert V.projection_schema(["prop_X"]).field("prop_X").type == pa.string()


def test_split_partials_equal_their_definitions(defect_store: Path) -> None:
    """spark_jobs.partials (what the audit reads) against the same aggregates computed in plain Python
    from the sequential parser's rows, per split, with a window."""
    from trimq.spark_jobs.checks import AUDIT_COLUMNS
    from trimq.spark_jobs.partials import SplitPartials

    files = P.resolve_segments(str(defect_store))
    rows_all = sequential(str(defect_store))
    since = sorted(r["store_timestamp"] for r in rows_all if not r["malformed"])[30]
    for split in P.plan_splits(files, 1000):
        want_rows = [r for b in P.SplitScanner(split).batches() for r in V.batch_to_arrow(b).to_pylist()]
        got = [r for b in SplitPartials(split, AUDIT_COLUMNS, since_ms=since).batches() for r in b.to_pylist()]
        by_kind: dict = {}
        for r in got:
            by_kind.setdefault(r["kind"], []).append(r)
        win = [r for r in want_rows if r["malformed"] or r["store_timestamp"] >= since]
        # Records sent: the window's malformed rows and CRC failures (no retries in this store).
        assert sorted(r["file_position"] for r in by_kind.get("record", [])) == sorted(
            r["file_position"] for r in win if r["malformed"] or r["crc_ok"] is False)
        msgs = [r for r in want_rows if not r["malformed"]]
        queues: dict = {}
        for r in msgs:
            q = queues.setdefault((r["topic"], r["queue_id"]), {"n": 0, "lo": None, "hi": None, "hi_all": -1})
            q["hi_all"] = max(q["hi_all"], r["queue_offset"])
            if r["store_timestamp"] >= since:
                q["n"] += 1
                q["lo"] = r["queue_offset"] if q["lo"] is None else min(q["lo"], r["queue_offset"])
                q["hi"] = r["queue_offset"] if q["hi"] is None else max(q["hi"], r["queue_offset"])
        assert {(r["topic"], r["queue_id"]): {k: r[k] for k in ("n", "lo", "hi", "hi_all")}
                for r in by_kind.get("queue_run", [])} == queues
        keys: dict = {}
        for r in msgs:
            k = (r["topic"], r["keys"].split()[0], r["queue_id"])
            e = keys.setdefault(k, {"n_w": 0, "first_born": r["born_timestamp"], "first_phys": r["physical_offset"]})
            e["last_born"] = r["born_timestamp"]
            e["n_w"] += r["store_timestamp"] >= since
        assert {(r["topic"], r["shard_key"], r["queue_id"]): {k: r[k] for k in ("n_w", "first_born", "first_phys",
                                                                                "last_born")}
                for r in by_kind.get("key_run", [])} == keys
        sizes: dict = {}
        for r in msgs:
            if r["store_timestamp"] >= since:
                k = (r["topic"], r["queue_id"], r["total_size"])
                sizes[k] = sizes.get(k, 0) + 1
        assert {(r["topic"], r["queue_id"], r["total_size"]): r["messages"] for r in by_kind.get("size", [])} == sizes
        assert sum(r["messages"] for r in by_kind.get("minute", [])) == sum(sizes.values())


def scan_stats(store: Path, **kw) -> tuple[list[dict], int, int]:
    """Rows, record starts walked, records decoded vectorised (one split per segment)."""
    rows, walked, fast = [], 0, 0
    files = P.resolve_segments(str(store))
    for split in P.plan_splits(files, max(os.path.getsize(f) for f in files)):
        vs = V.VectorScanner(split, **kw)
        for b in vs.batches():
            rows.extend(b.to_pylist())
        walked += vs.walked_records
        fast += vs.fast_records
    return rows, walked, fast


def test_record_starts_from_the_consume_queues_and_where_they_lie(defect_store: Path) -> None:
    """Issue 21: the consume queues propose the record starts; the bytes confirm them. Units that lie (pointing
    into a body, twice at one record, with a wrong size) or are missing change nothing in the rows: the walk
    covers what they do not prove."""
    want = sequential(str(defect_store))
    rows, walked, fast = scan_stats(defect_store)
    assert rows == want and fast >= 65 and walked <= 8  # walked: only where no unit is (after the regions)
    rows, walked_all, _ = scan_stats(defect_store, use_consume_queues=False)
    assert rows == want and walked_all >= 65
    # Damage the units: each file's 2nd unit points 7 bytes into its record, its 4th repeats its 3rd, its 6th
    # says a wrong size; one queue loses its directory altogether.
    cq_files = sorted((defect_store / "consumequeue").rglob("0" * 20))
    assert len(cq_files) >= 4
    for f in cq_files:
        data = bytearray(f.read_bytes())
        off = int.from_bytes(data[20:28], "big")
        if off:
            data[20:28] = (off + 7).to_bytes(8, "big")
        data[60:80] = data[40:60]
        if int.from_bytes(data[100:108], "big"):
            data[108:112] = (3).to_bytes(4, "big")
        f.write_bytes(bytes(data))
    for p in sorted(cq_files[0].parent.iterdir()):
        p.unlink()
    rows, walked, _ = scan_stats(defect_store)
    assert rows == want and 0 < walked < walked_all
    for ss in (91, 1000):
        assert vectorised(str(defect_store), ss) == want, ss


def test_consume_queue_starts_are_the_same_chunk_by_chunk(defect_store: Path) -> None:
    """``ConsumeQueuePositions`` holds one chunk of proposed starts at a time (memory bounded by the chunk, not the
    segment); read chunk by chunk, through chunk ends that fall inside records, they are the same starts as at
    once, and ``next_after`` finds the next one across a chunk end."""
    from trimq.spark_jobs.cq_positions import ConsumeQueuePositions, consume_queue_root

    seg = P.resolve_segments(str(defect_store))[0]
    root = consume_queue_root(seg)
    assert root is not None
    size = os.path.getsize(seg)
    whole = ConsumeQueuePositions(root, 0, size).at_or_after(0, size).tolist()
    assert len(whole) >= 10
    for chunk in (97, 500, 1000):
        small = ConsumeQueuePositions(root, 0, size, chunk=chunk)
        got, pos = [], 0
        while pos < size:
            part = small.at_or_after(pos, size)
            assert len(small._pos) <= chunk  # one chunk's starts at most
            got += part.tolist()
            pos = small._hi  # the next chunk
        assert got == whole, chunk
        nxt = ConsumeQueuePositions(root, 0, size, chunk=chunk)
        for p, following in itertools.pairwise(whole):
            found = nxt.next_after(p)  # within the loaded chunk: None when the next start lies beyond it
            assert found == (following if following < nxt._hi else None), (chunk, p)
    with pytest.raises(ValueError, match="chunk must be positive"):
        ConsumeQueuePositions(root, 0, size, chunk=0)


def test_the_body_crc_is_zlibs_crc32() -> None:
    """The reader's CRC (ISA-L's when ``isal`` is installed, which ``make`` does) is RocketMQ's: zlib's CRC-32,
    not CRC-32C, on empty, short and long bodies."""
    import zlib

    assert V._crc32 is not zlib.crc32  # the fast one is in use here
    for body in (b"", b"a", bytes(range(256)) * 3, os.urandom(70_000)):
        assert V._crc32(body) == zlib.crc32(body)


def test_shard_keys_fast_path_equals_the_regex() -> None:
    """``_shard_keys`` skips the regex when no value holds a whitespace byte; both paths give the first
    token, null for null, empty or blank values, on sliced arrays too."""
    import pyarrow.compute as pc

    def regex(keys: pa.Array) -> pa.Array:
        return pc.struct_field(pc.extract_regex(keys, V._SHARD_KEY_RE), [0])

    plain = pa.array(["k1", "", None, "order-7", "ü-key"] * 3)
    spaced = pa.array(["k1", " a b", "\tx", "   ", None, "", "y z\n"])
    for keys in (plain, plain.slice(2, 9), spaced, spaced.slice(1, 4), pa.array([], pa.string()),
                 pa.nulls(3, pa.string()), pa.array(["k1", "", None, " a b"], pa.large_string())):
        assert V._shard_keys(keys).equals(regex(keys)), keys
    assert V._shard_keys(plain).to_pylist()[:5] == ["k1", None, None, "order-7", "ü-key"]


def test_a_name_twice_is_found_with_many_distinct_property_names(tmp_path: Path) -> None:
    """With more (record, name) pairs than the counters allow (1100 records of 1100 distinct names), the repeated
    name check sorts instead of counting: the record with a name twice still goes to the walker, same rows."""
    recs = []
    pos = 0
    for i in range(1100):
        props = {"KEYS": f"k{i}", f"P{i}": "v"}
        text = encode_properties(props) if i != 700 else f"P{i}\x01a\x02KEYS\x01k\x02P{i}\x01b\x02"
        raw = encode_record(topic="T", body=b"b", queue_id=0, queue_offset=i, physical_offset=pos,
                            properties=text, store_host=STORE_HOST)
        recs.append(raw)
        pos += len(raw)
    seg = tmp_path / "00000000000000000000"
    seg.write_bytes(b"".join(recs) + bytes(64))
    stats: list = []
    want = sequential(str(seg))
    assert vectorised(str(seg), stats=stats) == want
    assert dict(want[700]["properties"])["P700"] == "b"
    fast, slow = stats[0]
    assert fast == 1099 and slow >= 1


_PROPERTY_NAMES = ["KEYS", "KEY", "KEYSX", "TAGS", "UNIQ_KEY", "", "a"]
_PROPERTY_VALUES = ["", "v", " k ", "k1 k2", "\x01", "x\x01y", "é", "\t"]
_ENTRY = st.one_of(
    st.tuples(st.sampled_from(_PROPERTY_NAMES), st.sampled_from(_PROPERTY_VALUES)).map("\x01".join),
    st.sampled_from(_PROPERTY_NAMES + _PROPERTY_VALUES),  # an entry without \x01 (or just a value's bytes)
)
_PROPERTY_TEXT = st.tuples(st.lists(_ENTRY, max_size=6), st.booleans()).map(
    lambda et: "\x02".join(et[0]) + ("\x02" if et[1] else "")
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=st.lists(_PROPERTY_TEXT, min_size=1, max_size=8))
def test_the_property_lookup_equals_the_parsers_map(tmp_path: Path, texts: list[str]) -> None:
    """Property texts of names that are prefixes of one another, entries without \\x01, empty names and values,
    values holding \\x01, a trailing \\x02, a name twice: ``keys``, ``tags``, ``shard_key`` and ``prop_<NAME>``
    of the vectorised lookup are the sequential parser's map (the last entry of a name wins)."""
    recs = []
    pos = 0
    for i, text in enumerate(texts):
        raw = encode_record(topic="T", body=b"b" * i, queue_id=0, queue_offset=i, physical_offset=pos,
                            properties=text, store_host=STORE_HOST)
        recs.append(raw)
        pos += len(raw)
    seg = tmp_path / "00000000000000000000"  # rewritten by each example (the fixture's tmp_path is shared)
    seg.write_bytes(b"".join(recs) + bytes(64))
    want = sequential(str(seg))
    cols = ["keys", "tags", "shard_key", "prop_UNIQ_KEY", "prop_KEY", "malformed"]
    got = vectorised(str(seg), columns=cols)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        props = dict(w["properties"] or [])
        assert g["keys"] == w["keys"] and g["tags"] == w["tags"] and g["malformed"] == w["malformed"]
        assert g["prop_UNIQ_KEY"] == props.get("UNIQ_KEY") and g["prop_KEY"] == props.get("KEY")
        key = w["keys"].split()[0] if w["keys"] and w["keys"].split() else None
        assert g["shard_key"] == key
