"""The fast paths added for the peer benchmark (issue 10 item 5) agree with the general code they shortcut.

* ``protocol.record.RecordDecoder`` gives exactly the MessageExt of ``iter_records``, and the same RecordError
  on damaged input;
* ProcessQueue's ordered offset map behaves as a sorted dict under any mix of operations;
* ``UniqIdGenerator.next_ids`` gives what ``next_id`` would, one after the other.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trimq.client.process_queue import _OffsetMap
from trimq.client.producer import UniqIdGenerator
from trimq.protocol.errors import RecordError
from trimq.protocol.message import MessageExt, encode_properties
from trimq.protocol.record import RecordDecoder, decode_records, encode_record, iter_records

hosts = st.sampled_from([("127.0.0.1", 10911), ("10.1.2.3", 5), ("::1", 7), ("fe80::1", 65535), ("0.0.0.0", 0)])
props = st.dictionaries(st.sampled_from(["UNIQ_KEY", "TAGS", "KEYS", "MIN_OFFSET", "é"]),
                        st.text(alphabet=st.characters(blacklist_characters="\x01\x02", blacklist_categories=["Cs"]),
                                max_size=20), max_size=4)


@st.composite
def records(draw: st.DrawFn) -> bytes:
    return encode_record(
        topic=draw(st.sampled_from(["Orders", "T", "%RETRY%g", "日本"])),
        body=draw(st.binary(max_size=300)),
        queue_id=draw(st.integers(0, 2**31 - 1)),
        queue_offset=draw(st.integers(0, 2**62)),
        physical_offset=draw(st.integers(0, 2**62)),
        properties=encode_properties(draw(props)),
        flag=draw(st.integers(-(2**31), 2**31 - 1)),
        sys_flag=draw(st.integers(0, 0xF)),
        born_timestamp=draw(st.integers(0, 2**45)),
        born_host=draw(hosts),
        store_timestamp=draw(st.integers(0, 2**45)),
        store_host=draw(hosts),
        reconsume_times=draw(st.integers(0, 20)),
    )


@settings(max_examples=60, deadline=None)
@given(st.lists(records(), max_size=12))
def test_fast_decoder_equals_the_generic_one(recs: list[bytes]) -> None:
    buf = b"".join(recs)
    dec = RecordDecoder()
    assert dec.decode_all(buf) == list(iter_records(buf))
    assert dec.decode_all(memoryview(buf)) == list(iter_records(buf))  # caches warm, any buffer type
    assert decode_records(bytearray(buf)) == list(iter_records(buf))


@settings(max_examples=60, deadline=None)
@given(st.lists(records(), min_size=1, max_size=4), st.data())
def test_fast_decoder_rejects_what_the_generic_one_rejects(recs: list[bytes], data: st.DataObject) -> None:
    buf = bytearray(b"".join(recs))
    if data.draw(st.booleans()):
        buf = buf[: data.draw(st.integers(0, len(buf) - 1))]  # truncated
    else:
        i = data.draw(st.integers(0, len(buf) - 1))
        buf[i] ^= data.draw(st.integers(1, 255))  # one byte flipped
    try:
        expected: list[MessageExt] | None = list(iter_records(bytes(buf)))
    except RecordError:
        expected = None
    if expected is None:
        with pytest.raises(RecordError):
            RecordDecoder().decode_all(bytes(buf))
    else:
        assert RecordDecoder().decode_all(bytes(buf)) == expected


def test_fast_decoder_verifies_the_body_crc() -> None:
    rec = bytearray(encode_record(topic="T", body=b"payload", queue_id=0, queue_offset=0, physical_offset=0))
    body_at = bytes(rec).find(b"payload")
    rec[body_at] ^= 1
    with pytest.raises(RecordError, match="CRC"):
        RecordDecoder().decode_all(bytes(rec))
    assert RecordDecoder().decode_all(bytes(rec), check_crc=False)[0].body == b"qayload"


ops = st.lists(st.tuples(st.sampled_from(["set", "pop", "pop_first", "take", "extend"]), st.integers(0, 40),
                         st.integers(1, 6)), max_size=120)


@settings(max_examples=200, deadline=None)
@given(ops)
def test_offset_map_is_a_sorted_dict(operations: list[tuple[str, int, int]]) -> None:
    m = _OffsetMap()
    model: dict[int, object] = {}
    rnd = random.Random(0)
    for op, k, n in operations:
        if op == "set":
            v = object()
            assert m.set(k, v) == (k not in model)  # type: ignore[arg-type]
            model[k] = v
        elif op == "pop":
            assert m.pop(k) is model.pop(k, None)
        elif op == "pop_first" and model:
            first = min(model)
            assert m.pop_first() == (first, model.pop(first))
        elif op == "take":
            want = [model.pop(x) for x in sorted(model)[:n]]
            assert m.take_first(n) == want
        elif op == "extend":
            start = (max(model) + 1) if model else k
            offs = sorted(rnd.sample(range(start, start + 3 * n), n))
            vals = [object() for _ in offs]
            assert m.extend_ascending(offs, vals)  # type: ignore[arg-type]
            model.update(zip(offs, vals, strict=True))
        assert len(m) == len(model) and bool(m) == bool(model)
        assert m.offsets() == sorted(model)
        assert m.values() == [model[x] for x in sorted(model)]
        if model:
            assert (m.first(), m.last()) == (min(model), max(model))


def test_offset_map_refuses_what_is_not_a_clean_append() -> None:
    m = _OffsetMap()
    a, b = object(), object()
    m.set(5, a)  # type: ignore[arg-type]
    assert not m.extend_ascending([5, 6], [b, b])  # type: ignore[list-item]
    assert not m.extend_ascending([7, 7], [b, b])  # type: ignore[list-item]
    assert not m.extend_ascending([9, 8], [b, b])  # type: ignore[list-item]
    assert not m.extend_ascending([], [])
    assert m.offsets() == [5]


def test_next_ids_continue_next_id() -> None:
    gen = UniqIdGenerator("10.0.0.1")
    now = 1_700_000_000_000
    one = gen.next_id(now)
    many = gen.next_ids(3, now)
    after = gen.next_id(now)
    ids = [one, *many, after]
    assert len(set(ids)) == 5 and all(len(i) == 32 and int(i, 16) >= 0 for i in ids)
    counters = [int(i[-4:], 16) for i in ids]
    assert counters == [(counters[0] + k) & 0xFFFF for k in range(5)]
    assert {i[:-4] for i in ids} == {one[:-4]}
