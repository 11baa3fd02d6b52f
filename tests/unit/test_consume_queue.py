"""Consume-queue files: 20-byte units, file roll-over, torn units, truncation, Java's tags hash."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trimq.broker.store.consume_queue import CQ_STORE_UNIT_SIZE, UNIT, ConsumeQueue, file_name, tags_string_to_tags_code

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
    assert os.path.getsize(tmp_path / "T" / "0" / file_name(2 * FILE)) == 8 * CQ_STORE_UNIT_SIZE
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


def test_load_cuts_a_torn_unit_and_trailing_zero_units(tmp_path: Path) -> None:
    d = tmp_path / "T" / "1"
    cq = ConsumeQueue(d, "T", 1, FILE)
    cq.append(0, units(0, 20))
    cq.close()
    last = d / file_name(FILE)
    with open(last, "ab") as fh:
        fh.write(b"\0" * 40 + b"\x01" * 7)  # two zero units and a torn one
    again = ConsumeQueue(d, "T", 1, FILE)
    again.load()
    assert again.max_offset == 20
    assert os.path.getsize(last) == 4 * CQ_STORE_UNIT_SIZE
    again.append(20, units(20, 1))
    assert again.get_unit(20) == (20000, 120, 137)
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
    assert os.path.getsize(d / file_name(0)) == 10 * CQ_STORE_UNIT_SIZE
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
