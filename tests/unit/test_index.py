"""The message index (broker/store/index.py): Java's String.hashCode, RocketMQ 4.9.3's IndexFile layout byte for
byte against tests/vectors/index.json (made by RocketMQ's own putKey, run by Java: tests/vectors/make_index.py),
chains and time ranges, file roll-over, reload, deletion with the commit log, sparse default-size files.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from trimq.broker.store.index import (
    DEFAULT_MAX_HASH_SLOT_NUM,
    DEFAULT_MAX_INDEX_NUM,
    INDEX_HEADER_SIZE,
    IndexFile,
    IndexService,
    build_key,
    index_file_size,
    index_key_hash,
    java_string_hash,
    keys_of,
)

VECTORS = json.loads((Path(__file__).parent.parent / "vectors" / "index.json").read_text())
T0 = 1_700_000_000_000


def test_default_geometry_is_rocketmqs() -> None:
    assert (DEFAULT_MAX_HASH_SLOT_NUM, DEFAULT_MAX_INDEX_NUM) == (5_000_000, 20_000_000)
    assert index_file_size(DEFAULT_MAX_HASH_SLOT_NUM, DEFAULT_MAX_INDEX_NUM) == 420_000_040


@pytest.mark.parametrize("case", VECTORS["hashes"], ids=lambda c: repr(c["key"]))
def test_java_hash_code(case: dict[str, object]) -> None:
    key = str(case["key"])
    assert java_string_hash(key) == case["hashCode"]
    assert index_key_hash(key) == case["indexKeyHash"]  # Math.abs, and Integer.MIN_VALUE -> 0
    assert index_key_hash(key) % DEFAULT_MAX_HASH_SLOT_NUM == case["slot5000000"]


def test_file_bytes_match_rocketmqs_put_key(tmp_path: Path) -> None:
    spec = VECTORS["file"]
    f = IndexFile(tmp_path / "20231114221320123", spec["hashSlotNum"], spec["indexNum"])
    for put in spec["puts"]:
        assert f.put_key(put["key"], put["phyOffset"], put["storeTimestamp"]) is put["ok"]
    f.sync_header()  # trimq writes the header once per batch of puts
    assert f.mm[:].hex() == spec["hex"]
    f.close()


def test_chains_time_ranges_and_collisions(tmp_path: Path) -> None:
    f = IndexFile(tmp_path / "f", 4, 64)
    assert f.put_key("T#k1", 0, T0)
    assert f.put_key("T#k2", 100, T0 + 1_500)
    assert f.put_key("T#k1", 200, T0 + 5_000)
    assert f.put_key("Aa", 300, T0 + 6_000)  # "Aa" and "BB" have the same hash: both are candidates
    assert f.put_key("BB", 400, T0 + 7_000)
    out: list[int] = []
    f.select_phy_offsets(out, "T#k1", 10, 0, 2**62)
    assert out == [200, 0]  # newest first
    out = []
    f.select_phy_offsets(out, "T#k1", 1, 0, 2**62)
    assert out == [200]  # max_num
    out = []
    f.select_phy_offsets(out, "T#k1", 10, T0 + 1_000, 2**62)
    assert out == [200]  # older than begin: the walk stops
    out = []
    f.select_phy_offsets(out, "T#k1", 10, 0, T0 + 4_999)
    assert out == [0]
    out = []
    f.select_phy_offsets(out, "Aa", 10, 0, 2**62)
    assert out == [400, 300]  # the index keeps hashes: a caller checks the records
    out = []
    f.select_phy_offsets(out, "Aa", 10, 0, 2**62, accept=lambda off: off == 300)
    assert out == [300]
    assert f.header.index_count == 6 and f.header.hash_slot_count <= 4
    assert (f.header.begin_phy_offset, f.header.end_phy_offset) == (0, 400)
    assert (f.header.begin_timestamp, f.header.end_timestamp) == (T0, T0 + 7_000)
    f.close()


def test_damaged_chain_never_loops(tmp_path: Path) -> None:
    f = IndexFile(tmp_path / "f", 1, 8)
    for i in range(4):
        assert f.put_key("T#k", i * 10, T0)
    entries = INDEX_HEADER_SIZE + 4
    f.mm[entries + 2 * 20 + 16: entries + 2 * 20 + 20] = (3).to_bytes(4, "big")  # entry 2 -> entry 3 (a cycle)
    out: list[int] = []
    f.select_phy_offsets(out, "T#k", 100, 0, 2**62)
    assert out == [30, 20, 10]
    f.close()


def java_hash_by_definition(key: str) -> int:
    """``String.hashCode`` from its definition (ASCII keys), as a signed 32-bit int."""
    h = sum(ord(c) * 31 ** (len(key) - 1 - i) for i, c in enumerate(key)) % 2**32
    return h - 2**32 if h >= 2**31 else h


def test_long_and_odd_keys_hash_as_java() -> None:
    for key in ("x" * 65, "k" * 301, "abc", "ab", "T#" + "0123456789ABCDEF" * 5):
        assert java_string_hash(key) == java_hash_by_definition(key)


def test_load_builds_the_pair_table_before_the_first_dispatch(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The byte-pair table of the hash (65,536 entries) is built when the broker loads its index, not by the first
    dispatch, which held up the first windows' sends behind it (issue 22); every entry is 31 * first + second."""
    from trimq.broker.store import index

    monkeypatch.setattr(index, "_PAIRS", [])
    IndexService(tmp_path / "index").load()
    pairs = index._PAIRS
    assert len(pairs) == 65536
    for first, second in ((0, 0), (0x41, 0x7A), (0xFF, 0x01), (0x01, 0xFF), (0xFF, 0xFF)):
        native = (first | second << 8) if sys.byteorder == "little" else (first << 8 | second)
        assert pairs[native] == 31 * first + second
    IndexService(tmp_path / "index").load()
    assert index._PAIRS is pairs and len(pairs) == 65536  # built once
    assert java_string_hash("ab" * 20) == java_hash_by_definition("ab" * 20)


@pytest.mark.parametrize("byteorder", ["little", "big"])
def test_the_pair_table_on_either_byte_order(monkeypatch: pytest.MonkeyPatch, byteorder: str) -> None:
    """A key's bytes read as native uint16: on a big-endian machine the first byte is the high one."""
    from trimq.broker.store import index

    monkeypatch.setattr(index, "_PAIRS", [])
    monkeypatch.setattr(sys, "byteorder", byteorder)
    pairs = index._make_pairs()
    assert len(pairs) == 65536
    for first, second in ((0, 0), (0x41, 0x7A), (0xFF, 0x01), (0x01, 0xFF), (0xFF, 0xFF)):
        native = (first | second << 8) if byteorder == "little" else (first << 8 | second)
        assert pairs[native] == 31 * first + second


def test_keys_of() -> None:
    assert keys_of("a b  c", "U1") == ["U1", "a", "b", "c"]
    assert keys_of(None, None) == []
    assert keys_of("", "") == [""]  # RocketMQ indexes a present UNIQ_KEY even when empty
    assert build_key("T", "k") == "T#k"


def service(path: Path, clock: list[int], **kw: int) -> IndexService:
    svc = IndexService(path, max_hash_slot_num=kw.get("slots", 16), max_index_num=kw.get("entries", 5),
                       max_msgs_num_batch=kw.get("batch", 64), now_ms=lambda: clock[0])
    svc.load()
    return svc


def test_long_keys_hashed_from_a_cached_head_give_rocketmqs_entries(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """build_index hashes a long key's head once (UNIQ_KEYs of one producer share it) and its tail each time:
    the file is byte for byte what putKey of the whole "topic#key" writes, whether the head was cached or the
    cache started again (full), and for short, very long and non-ASCII keys."""
    import trimq.broker.store.index as index_mod

    monkeypatch.setattr(index_mod, "_HEAD_CACHE_MAX", 3)  # 10 heads (5 producers x 2 topics): it fills and restarts
    producers = ["7F00000112AB" + f"{p:08X}" for p in range(5)]
    words = [producers[i % 5] + f"{i * 7919:08X}{i:04X}" for i in range(40)]  # 32 hex digits, 5 heads
    words += [producers[0] + f"{i // 7:08X}{i * 4099 % 65536:04X}" for i in range(40)]  # heads shared by a ms
    words += ["k" * 24, "k" * 25, "x" * 65, "q" * 300, "é" * 30, "key-1", "ORDER_1001 ORDER_1002"]
    clock = [T0]
    svc = service(tmp_path / "index", clock, slots=97, entries=200)
    plain = IndexFile(tmp_path / "plain", 97, 200)
    for i, word in enumerate(words):
        topic = "Orders" if i % 2 else "T"
        uniq, keys = (word, None) if i % 3 else (None, word)
        n = svc.build_index(topic, i * 100, T0 + i, 0, keys, uniq)
        expected = keys_of(keys, uniq)
        assert n == len(expected)
        for key in expected:
            assert plain.put_key(build_key(topic, key), i * 100, T0 + i)
    assert 0 < svc._head_count <= 3 and sum(map(len, svc._heads_by_topic.values())) == svc._head_count
    svc.files[-1].sync_header()
    plain.sync_header()
    assert svc.files[-1].mm[:] == plain.mm[:]
    assert svc.query_offset("Orders", words[39], 10, 0, 2**62).phy_offsets == [3900]
    svc.close()
    plain.close()


def test_a_batch_of_unique_keys_sharing_heads_gives_rocketmqs_entries(tmp_path: Path) -> None:
    """build_index_batch's inline path (a UNIQ_KEY whose head is cached: its 4-digit counter from a table) writes
    what putKey of the whole "topic#key" writes, for every counter value's hash (negative ones included) and
    with KEYS words after the UNIQ_KEY, across batches and topics."""
    clock = [T0]
    svc = service(tmp_path / "index", clock, slots=1009, entries=5000)
    plain = IndexFile(tmp_path / "plain", 1009, 5000)
    head = "7F00000112AB5EED0001" + "0A1B2C3D"
    records: list[tuple[str, int, int, int, str | None, str | None]] = []
    for i in range(3000):
        topic = ("T", "Orders", "é")[i % 3]
        uniq = head + f"{i * 22 % 65536:04X}"
        keys = f"ORDER_{i} ORDER_{i // 2}" if i % 5 == 0 else None
        records.append((topic, 100 + i * 50, T0 + i, 0, keys, uniq))
    for at in range(0, len(records), 97):
        svc.build_index_batch(records[at:at + 97])
    for rec_topic, offset, ts, _flag, rec_keys, rec_uniq in records:
        for key in keys_of(rec_keys, rec_uniq):
            assert plain.put_key(build_key(rec_topic, key), offset, ts)
    svc.files[-1].sync_header()
    plain.sync_header()
    assert svc.files[-1].mm[:] == plain.mm[:]
    svc.close()
    plain.close()


def test_service_rolls_over_reloads_and_deletes(tmp_path: Path) -> None:
    clock = [T0]
    svc = service(tmp_path / "index", clock)
    assert svc.build_index("T", 0, T0, 0, None, None) == 0
    assert svc.files == []  # nothing to index, no file
    # 4 entries per file (entry 0 unused): 10 records of one key each, 3 files
    for i in range(10):
        assert svc.build_index("T", i * 100, T0 + i * 1000, 0, f"k{i % 3}", None) == 1
    assert len(svc.files) == 3
    names = [f.path.name for f in svc.files]
    assert names == sorted(names) and len(set(names)) == 3  # unique even when created in one ms
    local = time.localtime(T0 // 1000)
    assert names[0] == time.strftime("%Y%m%d%H%M%S", local) + "000"  # yyyyMMddHHmmssSSS, local time
    assert svc.files[1].header.begin_phy_offset == 400  # a new file starts after the full one's end
    assert svc.build_index("T", 500, T0, 0, "late", None) == 0  # older than the newest entry: skipped
    assert svc.build_index("T", 1000, T0 + 10_000, 0xC, "rolled-back", None) == 0  # rollback half
    res = svc.query_offset("T", "k0", 10, 0, 2**62)
    assert res.phy_offsets == [0, 300, 600, 900]
    assert (res.index_last_update_phyoffset, res.index_last_update_timestamp) == (900, T0 + 9_000)
    assert svc.query_offset("T", "k0", 2, 0, 2**62).phy_offsets == [600, 900]  # the newest, ascending
    assert svc.query_offset("T", "k0", 10, T0 + 5_000, T0 + 8_000).phy_offsets == [600]
    assert svc.query_offset("Other", "k0", 10, 0, 2**62).phy_offsets == []
    svc.close()

    again = service(tmp_path / "index", clock)
    assert [f.path.name for f in again.files] == names
    assert again.end_phy_offset == 900 and again.entry_count() == 10
    assert again.query_offset("T", "k1", 10, 0, 2**62).phy_offsets == [100, 400, 700]
    assert again.delete_expired_file(450) == 1  # the first file's newest entry (300) is below 450
    assert again.delete_expired_file(10**9) == 1  # never the last file
    assert len(again.files) == 1 and sorted(os.listdir(tmp_path / "index")) == names[2:]
    again.close()


def test_a_batch_rolls_over_inside_a_records_keys(tmp_path: Path) -> None:
    """build_index_batch writes a record's keys into the file while it has room and the rest into the next one,
    as RocketMQ's putKey loop does; rolled-back halves and records without keys are skipped."""
    clock = [T0]
    svc = service(tmp_path / "index", clock)  # 4 entries per file
    records = [
        ("T", 0, T0, 0, "a b", "U0"),  # 3 entries: the first file holds 3 of 4
        ("T", 100, T0 + 1_000, 0xC, "rolled back", None),  # skipped
        ("T", 200, T0 + 2_000, 0, None, None),  # nothing to index
        ("T", 300, T0 + 3_000, 0, "c d", "U1"),  # 1 entry fits, 2 go to a new file
    ]
    assert svc.build_index_batch(records) == (2, 6)
    assert [f.header.index_count - 1 for f in svc.files] == [4, 2]
    assert svc.files[1].header.begin_phy_offset == 300 and svc.files[0].header.end_phy_offset == 300
    for key, offsets in (("U0", [0]), ("a", [0]), ("b", [0]), ("U1", [300]), ("c", [300]), ("d", [300])):
        assert svc.query_offset("T", key, 10, 0, 2**62).phy_offsets == offsets, key
    assert svc.build_index("T", 250, T0, 0, "late", None) == 0  # older than the newest entry: skipped
    svc.close()


def test_other_geometry_is_dropped_for_a_rebuild(tmp_path: Path) -> None:
    clock = [T0]
    svc = service(tmp_path / "index", clock)
    svc.build_index("T", 0, T0, 0, "k", None)
    svc.close()
    other = service(tmp_path / "index", clock, slots=32)
    assert other.files == [] and os.listdir(tmp_path / "index") == []
    other.close()


def test_reset_end_after_a_cut_log(tmp_path: Path) -> None:
    clock = [T0]
    svc = service(tmp_path / "index", clock, entries=64)
    svc.build_index("T", 0, T0, 0, "a", None)
    svc.build_index("T", 100, T0, 0, "b", None)
    svc.reset_end_phy_offset(100)
    assert svc.end_phy_offset == 100
    assert svc.build_index("T", 100, T0, 0, "c", None) == 1  # the record now at 100 is indexed
    svc.close()


def test_default_size_file_is_sparse(tmp_path: Path) -> None:
    svc = IndexService(tmp_path / "index")
    svc.load()
    svc.build_index("T", 0, T0, 0, "k", "U")
    (f,) = svc.files
    st = os.stat(f.path)
    assert st.st_size == 420_000_040
    assert st.st_blocks * 512 < 1024 * 1024  # only the pages written are allocated
    assert svc.query_offset("T", "U", 1, 0, 2**62).phy_offsets == [0]
    svc.close()


def test_a_new_files_header_is_the_one_read_from_zeros(tmp_path: Path) -> None:
    """A new file's header is built, not read back from the fresh map (whose first touch faulted in pages around
    it): the same as a zero header read, index count 1, carried over offsets and times, written to the file."""
    from trimq.broker.store.index import IndexHeader

    assert IndexHeader() == IndexHeader.unpack_from(bytes(INDEX_HEADER_SIZE))
    f = IndexFile(tmp_path / "f", 16, 8, end_phy_offset=4096, end_timestamp=T0)
    assert f.header == IndexHeader(T0, T0, 4096, 4096, 0, 1)
    assert IndexHeader.unpack_from(f.mm) == f.header
    f.close()
