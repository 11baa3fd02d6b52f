"""Consume-queue files: 20-byte units, pre-sized files (RocketMQ's length), the end of the data by RocketMQ's
recovery rule, older short files, truncation, expired files and min offsets, Java's tags hash."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trimq.broker.store.consume_queue import (
    BLANK_UNIT,
    CQ_STORE_UNIT_SIZE,
    UNIT,
    ConsumeQueue,
    file_name,
    first_invalid_unit,
    tags_string_to_tags_code,
)

FILE = 20 * 16  # 16 units per file


def units(start: int, n: int) -> bytes:
    return b"".join(UNIT.pack(1000 * k, 100 + k, k * 7 - 3) for k in range(start, start + n))


def test_java_string_hash_code() -> None:
    # Values of java.lang.String.hashCode().
    assert tags_string_to_tags_code(None) == 0
    assert tags_string_to_tags_code("") == 0
    assert tags_string_to_tags_code("hello") == 99162322
    assert tags_string_to_tags_code("TagA") == 2598919
    assert tags_string_to_tags_code("polygenelubricants") == -2147483648
    assert tags_string_to_tags_code("é") == 233
    assert tags_string_to_tags_code("😀") == 55357 * 31 + 56832  # two UTF-16 code units: 0xD83D, 0xDE00


def test_units_span_files_and_read_stops_at_the_end_of_a_file(tmp_path: Path) -> None:
    cq = ConsumeQueue(tmp_path / "T" / "0", "T", 0, FILE)
    cq.append(0, units(0, 10))
    cq.append(10, units(10, 30))
    assert (cq.min_offset, cq.max_offset) == (0, 40)
    assert cq.files == [0, FILE, 2 * FILE]
    assert sorted(os.listdir(tmp_path / "T" / "0")) == [file_name(0), file_name(FILE), file_name(2 * FILE)]
    last = (tmp_path / "T" / "0" / file_name(2 * FILE)).read_bytes()
    assert len(last) == FILE and last[8 * CQ_STORE_UNIT_SIZE :] == bytes(FILE - 8 * CQ_STORE_UNIT_SIZE)  # pre-sized
    # RocketMQ's getIndexBuffer: from the offset to the end of its file.
    assert cq.read_units(10, 100) == units(10, 6)
    assert cq.read_units(16, 100) == units(16, 16)
    assert cq.read_units(38, 100) == units(38, 2)
    assert cq.read_units(40, 100) == b""
    assert cq.get_unit(17) == (17000, 117, 17 * 7 - 3)
    assert cq.get_unit(40) is None
    with pytest.raises(ValueError):
        cq.append(39, units(39, 1))
    cq.close()


def test_files_have_rocketmqs_size_and_stay_sparse(tmp_path: Path) -> None:
    """RocketMQ 4.9.3's MappedFileQueue.load refuses a queue file that is not exactly
    mappedFileSizeConsumeQueue (300000 x 20 = 6000000) bytes; the zero tail costs no disk block."""
    d = tmp_path / "T" / "9"
    cq = ConsumeQueue(d, "T", 9, 300_000 * CQ_STORE_UNIT_SIZE)
    cq.append(0, units(0, 3))
    cq.flush()
    st_ = os.stat(d / file_name(0))
    assert st_.st_size == 6_000_000
    assert st_.st_blocks * 512 <= 256 * 1024  # sparse: only the written page(s) are allocated
    cq.close()
    again = ConsumeQueue(d, "T", 9, 6_000_000)
    again.load()
    assert (again.min_offset, again.max_offset) == (0, 3) and again.read_units(0, 10) == units(0, 3)
    again.close()


def test_older_short_files_are_extended_and_a_torn_unit_cut(tmp_path: Path) -> None:
    """Stores written before pre-sizing grew their files unit by unit (a crash could leave a torn unit)."""
    d = tmp_path / "T" / "1"
    d.mkdir(parents=True)
    (d / file_name(0)).write_bytes(units(0, 16))
    (d / file_name(FILE)).write_bytes(units(16, 4) + b"\0" * 40 + b"\x01" * 7)  # zero units and a torn one
    again = ConsumeQueue(d, "T", 1, FILE)
    again.load()
    assert again.max_offset == 20
    assert [os.path.getsize(d / file_name(s)) for s in (0, FILE)] == [FILE, FILE]
    again.append(20, units(20, 1))
    assert again.get_unit(20) == (20000, 120, 137)
    again.close()
    reloaded = ConsumeQueue(d, "T", 1, FILE)
    reloaded.load()
    assert reloaded.max_offset == 21
    reloaded.close()


def test_the_first_invalid_unit_ends_the_queue_and_what_follows_is_zeroed(tmp_path: Path) -> None:
    """RocketMQ's ConsumeQueue.recover stops at the first unit without offset >= 0 and size > 0 (a page written
    before an earlier one, then a crash). The stale units after it are zeroed, so filling the hole with new
    units cannot bring them back."""
    d = tmp_path / "T" / "4"
    cq = ConsumeQueue(d, "T", 4, FILE)
    cq.append(0, units(0, 10))
    cq.close()
    path = d / file_name(0)
    with open(path, "r+b") as fh:
        fh.seek(5 * CQ_STORE_UNIT_SIZE)
        fh.write(bytes(CQ_STORE_UNIT_SIZE))
    again = ConsumeQueue(d, "T", 4, FILE)
    again.load()
    assert again.max_offset == 5
    assert path.read_bytes()[5 * CQ_STORE_UNIT_SIZE :] == bytes(FILE - 5 * CQ_STORE_UNIT_SIZE)
    again.append(5, units(5, 1))
    again.close()
    third = ConsumeQueue(d, "T", 4, FILE)
    third.load()
    assert third.max_offset == 6
    third.close()


def test_recovery_rule_on_raw_units() -> None:
    ok = UNIT.pack(0, 91, 0) + UNIT.pack(1 << 40, 0x7FFFFFFF, -1) + BLANK_UNIT
    assert first_invalid_unit(ok) is None
    assert first_invalid_unit(b"") is None
    for bad in (UNIT.pack(-1, 100, 0), UNIT.pack(5, 0, 0), UNIT.pack(5, -3, 0), bytes(20)):
        assert first_invalid_unit(ok + bad + ok) == 3
        assert first_invalid_unit(bad + ok) == 0
    # a valid unit whose neighbours hold many zero bytes is still valid
    assert first_invalid_unit(UNIT.pack(0, 256, 0) + UNIT.pack(256, 1 << 24, 0)) is None


def test_min_offset_follows_the_commit_log_and_expired_files_go(tmp_path: Path) -> None:
    """RocketMQ's deleteExpiredFileByOffset + correctMinOffset: files (never the last) whose last unit points
    below the log's first offset are deleted; the min offset is the first unit whose record is still there."""
    d = tmp_path / "T" / "5"
    cq = ConsumeQueue(d, "T", 5, FILE)
    cq.append(0, units(0, 40))  # unit k points at log offset 1000 k; 16 units per file
    assert cq.delete_expired_files(0) == (0, [])
    assert cq.min_offset == 0
    deleted, fds = cq.delete_expired_files(17_500)  # records before 17500 are gone: units 0-17
    assert deleted == 1 and len(fds) == 1 and cq.files == [FILE, 2 * FILE]
    for fd in fds:
        os.close(fd)
    assert (cq.min_offset, cq.max_offset) == (18, 40)
    assert cq.read_units(17, 5) == b"" and cq.get_unit(18) == (18000, 118, 18 * 7 - 3)
    deleted, _ = cq.delete_expired_files(10**9)  # everything gone: the last file stays, the offsets too
    assert deleted == 1 and cq.files == [2 * FILE]
    assert (cq.min_offset, cq.max_offset) == (40, 40)
    cq.append(40, units(40, 1))
    cq.close()
    again = ConsumeQueue(d, "T", 5, FILE)
    again.load()
    assert (again.min_offset, again.max_offset) == (32, 41)
    again.correct_min_offset(40_000)
    assert again.min_offset == 40
    again.close()


def test_fill_blank_starts_a_lost_queue_at_the_file_of_its_first_record(tmp_path: Path) -> None:
    d = tmp_path / "T" / "6"
    cq = ConsumeQueue(d, "T", 6, FILE)
    assert cq.fill_blank(37) == 5  # file 2 holds offsets 32-47: blanks for 32-36
    assert cq.files == [2 * FILE] and (cq.min_offset, cq.max_offset) == (32, 37)
    cq.append(37, units(37, 1))
    cq.close()
    again = ConsumeQueue(d, "T", 6, FILE)
    again.load()
    assert (again.min_offset, again.max_offset) == (32, 38)
    assert again.get_unit(32) == UNIT.unpack(BLANK_UNIT)
    again.correct_min_offset(1)
    assert again.min_offset == 37
    again.close()


def test_load_drops_files_after_a_gap_or_a_partial_file(tmp_path: Path) -> None:
    d = tmp_path / "T" / "2"
    cq = ConsumeQueue(d, "T", 2, FILE)
    cq.append(0, units(0, 40))
    cq.close()
    os.truncate(d / file_name(FILE), 3 * CQ_STORE_UNIT_SIZE)  # the middle file lost its tail
    again = ConsumeQueue(d, "T", 2, FILE)
    again.load()
    assert again.max_offset == 16 + 3
    assert not (d / file_name(2 * FILE)).exists()
    again.close()


def test_truncate_across_files(tmp_path: Path) -> None:
    d = tmp_path / "T" / "3"
    cq = ConsumeQueue(d, "T", 3, FILE)
    cq.append(0, units(0, 40))
    cq.truncate(10)
    assert cq.max_offset == 10 and cq.files == [0]
    data = (d / file_name(0)).read_bytes()
    assert len(data) == FILE and data[10 * CQ_STORE_UNIT_SIZE :] == bytes(FILE - 10 * CQ_STORE_UNIT_SIZE)
    cq.append(10, units(10, 10))
    assert cq.read_units(0, 100) == units(0, 16)
    cq.truncate(0)
    assert cq.max_offset == 0
    cq.append(0, units(0, 1))
    assert cq.get_unit(0) == (0, 100, -3)
    cq.close()


@settings(max_examples=30, deadline=None)
@given(chunks=st.lists(st.integers(1, 40), min_size=1, max_size=8))
def test_appends_of_any_size_read_back(tmp_path_factory: pytest.TempPathFactory, chunks: list[int]) -> None:
    d = tmp_path_factory.mktemp("cq")
    cq = ConsumeQueue(d, "T", 0, FILE)
    n = 0
    for c in chunks:
        cq.append(n, units(n, c))
        n += c
    got = b""
    k = 0
    while k < n:
        data = cq.read_units(k, 1000)
        assert data
        got += data
        k += len(data) // CQ_STORE_UNIT_SIZE
    assert got == units(0, n)
    cq.close()
    reloaded = ConsumeQueue(d, "T", 0, FILE)
    reloaded.load()
    assert reloaded.max_offset == n
    reloaded.close()
