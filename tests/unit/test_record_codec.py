"""protocol/record.py against golden RocketMQ 4.x records (tests/vectors/records.json, built independently
by tests/vectors/make_records.py from ROCKETMQ_FACTS.md §9), plus hypothesis round trips, and the broker's
fast batch encoder against the reference codec."""

from __future__ import annotations

import ipaddress
import json
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trimq.broker.store.commitlog import RecordEncoder, host_sys_flag
from trimq.protocol.errors import RecordError
from trimq.protocol.message import decode_properties, encode_properties
from trimq.protocol.record import (
    BLANK_MAGIC_CODE,
    decode_record,
    encode_blank,
    encode_record,
    host_bytes,
    iter_records,
    message_id,
    parse_message_id,
    read_header,
    record_length,
)

VECTORS = json.loads((Path(__file__).parent.parent / "vectors" / "records.json").read_text())


def _encode_case(f: dict[str, Any]) -> bytes:
    return encode_record(
        topic=f["topic"], body=bytes.fromhex(f["body"]), queue_id=f["queue_id"], queue_offset=f["queue_offset"],
        physical_offset=f["phys"], properties=f["props"], flag=f["flag"], sys_flag=f["sys_flag"],
        born_timestamp=f["born_ts"], born_host=tuple(f["born"]), store_timestamp=f["store_ts"],
        store_host=tuple(f["store"]), reconsume_times=f["reconsume"], prepared_transaction_offset=f["prepared"],
    )


@pytest.mark.parametrize("case", VECTORS["records"], ids=lambda c: c["name"])
def test_golden_record_decodes_and_reencodes_byte_for_byte(case: dict[str, Any]) -> None:
    raw = bytes.fromhex(case["hex"])
    f = case["fields"]
    msg = decode_record(raw)
    assert msg.topic == f["topic"]
    assert msg.body == bytes.fromhex(f["body"])
    assert msg.queue_id == f["queue_id"]
    assert msg.flag == f["flag"]
    assert msg.queue_offset == f["queue_offset"]
    assert msg.commit_log_offset == f["phys"]
    assert msg.born_timestamp == f["born_ts"]
    assert msg.born_host == tuple(f["born"])
    assert msg.store_timestamp == f["store_ts"]
    assert msg.store_host == tuple(f["store"])
    assert msg.reconsume_times == f["reconsume"]
    assert msg.prepared_transaction_offset == f["prepared"]
    assert msg.properties == decode_properties(f["props"])
    assert msg.store_size == len(raw)
    assert msg.msg_id == message_id(tuple(f["store"]), f["phys"])  # type: ignore[arg-type]
    assert record_length(len(msg.body), len(f["topic"].encode()), len(f["props"].encode()),
                         ":" in f["born"][0], ":" in f["store"][0]) == len(raw)
    # The properties string keeps its order, so the record re-encodes to the very same bytes.
    assert _encode_case(f) == raw
    assert list(iter_records(raw + raw)) == [msg, msg]


@pytest.mark.parametrize("case", VECTORS["records"], ids=lambda c: c["name"])
def test_broker_fast_encoder_matches_the_golden_bytes(case: dict[str, Any]) -> None:
    f = case["fields"]
    enc = RecordEncoder()
    born_b, store_b = host_bytes(tuple(f["born"])), host_bytes(tuple(f["store"]))  # type: ignore[arg-type]
    body, props = bytes.fromhex(f["body"]), f["props"].encode()
    topic_field = enc.topic_bytes(f["topic"])
    size = enc.record_size(len(body), len(topic_field), len(props), len(born_b), len(store_b))
    sys_flag = host_sys_flag(f["sys_flag"], len(born_b), len(store_b))

    head = enc.middle(len(born_b), len(store_b)).pack(
        size, 0xDAA320A7, zlib.crc32(body) & 0x7FFFFFFF, f["queue_id"], f["flag"], f["queue_offset"], f["phys"],
        sys_flag, f["born_ts"], born_b, f["store_ts"], store_b, f["reconsume"], f["prepared"], len(body),
    )
    raw = head + body + topic_field + struct.pack(">h", len(props)) + props
    assert raw.hex() == case["hex"]


def test_golden_filler() -> None:
    filler = VECTORS["filler"]
    raw = bytes.fromhex(filler["hex"])
    assert encode_blank(filler["remaining"]) == raw
    hdr = read_header(raw, 0)
    assert hdr.is_blank and hdr.magic == BLANK_MAGIC_CODE and hdr.total_size == filler["remaining"]


def test_corrupted_golden_records_are_rejected() -> None:
    raw = bytearray(bytes.fromhex(VECTORS["records"][0]["hex"]))
    bad_crc = bytearray(raw)
    body_pos = 4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8 + 8 + 8 + 8 + 4 + 8 + 4
    bad_crc[body_pos] ^= 0xFF
    with pytest.raises(RecordError, match="CRC"):
        decode_record(bytes(bad_crc))
    bad_magic = bytearray(raw)
    bad_magic[4] ^= 0xFF
    with pytest.raises(RecordError, match="magic"):
        decode_record(bytes(bad_magic))
    with pytest.raises(RecordError):
        decode_record(bytes(raw[:-1]))
    bad_size = bytearray(raw)
    struct.pack_into(">i", bad_size, 0, len(raw) - 1)
    with pytest.raises(RecordError):
        decode_record(bytes(bad_size))


def test_message_id_round_trip() -> None:
    mid = message_id(("10.0.0.5", 10911), 123456)
    assert mid == "0A00000500002A9F000000000001E240"
    assert parse_message_id(mid) == (("10.0.0.5", 10911), 123456)
    v6 = message_id(("fe80::1", 10911), 7)
    assert len(v6) == 56 and parse_message_id(v6) == (("fe80::1", 10911), 7)
    with pytest.raises(ValueError):
        parse_message_id("XYZ")


_ipv4 = st.ip_addresses(v=4).map(str)
_ipv6 = st.ip_addresses(v=6).map(str)
_hosts = st.tuples(st.one_of(_ipv4, _ipv6), st.integers(0, 65535))
_topics = st.text(alphabet="abcXYZ012_-%|", min_size=1, max_size=127)
_prop_text = st.text(alphabet=st.characters(blacklist_characters="\x01\x02", codec="utf-8"),
                     max_size=20)
_props = st.dictionaries(_prop_text.filter(bool), _prop_text, max_size=5)


@settings(max_examples=150, deadline=None)
@given(
    topic=_topics, body=st.binary(max_size=600), queue_id=st.integers(0, 2**31 - 1),
    queue_offset=st.integers(0, 2**62), phys=st.integers(0, 2**62), flag=st.integers(-(2**31), 2**31 - 1),
    born=_hosts, store=_hosts, born_ts=st.integers(0, 2**62), store_ts=st.integers(0, 2**62),
    reconsume=st.integers(0, 2**31 - 1), props=_props,
)
def test_round_trip(topic: str, body: bytes, queue_id: int, queue_offset: int, phys: int, flag: int,
                    born: tuple[str, int], store: tuple[str, int], born_ts: int, store_ts: int, reconsume: int,
                    props: dict[str, str]) -> None:
    prop_s = encode_properties(props)
    raw = encode_record(topic=topic, body=body, queue_id=queue_id, queue_offset=queue_offset, physical_offset=phys,
                        properties=prop_s, flag=flag, born_timestamp=born_ts, born_host=born,
                        store_timestamp=store_ts, store_host=store, reconsume_times=reconsume)
    msg = decode_record(raw)
    assert (msg.topic, msg.body, msg.queue_id, msg.queue_offset, msg.commit_log_offset, msg.flag) == (
        topic, body, queue_id, queue_offset, phys, flag)
    assert (msg.born_timestamp, msg.store_timestamp, msg.reconsume_times) == (born_ts, store_ts, reconsume)
    assert ipaddress.ip_address(msg.born_host[0]) == ipaddress.ip_address(born[0]) and msg.born_host[1] == born[1]
    assert ipaddress.ip_address(msg.store_host[0]) == ipaddress.ip_address(store[0])
    assert msg.store_host[1] == store[1]
    assert msg.properties == props
    assert msg.store_size == len(raw)
    # Re-encoding what was decoded gives the same bytes.
    again = encode_record(topic=msg.topic, body=msg.body, queue_id=msg.queue_id, queue_offset=msg.queue_offset,
                          physical_offset=msg.commit_log_offset, properties=encode_properties(msg.properties),
                          flag=msg.flag, sys_flag=msg.sys_flag, born_timestamp=msg.born_timestamp,
                          born_host=msg.born_host, store_timestamp=msg.store_timestamp, store_host=msg.store_host,
                          reconsume_times=msg.reconsume_times)
    assert again == raw


@settings(max_examples=50, deadline=None)
@given(bodies=st.lists(st.binary(max_size=300), min_size=1, max_size=8), cut=st.integers(1, 90))
def test_truncated_stream_is_an_error_never_a_crash(bodies: list[bytes], cut: int) -> None:
    raw = b"".join(
        encode_record(topic="T", body=b, queue_id=0, queue_offset=i, physical_offset=0) for i, b in enumerate(bodies)
    )
    assert [m.body for m in iter_records(raw)] == bodies
    with pytest.raises(RecordError):
        list(iter_records(raw[: len(raw) - cut]))


def test_text_without_a_utf8_form_is_a_record_error() -> None:
    # Found by a hypothesis run: a lone surrogate raised UnicodeEncodeError instead of RecordError.
    with pytest.raises(RecordError, match="not valid text"):
        encode_record(topic="T", body=b"", queue_id=0, queue_offset=0, physical_offset=0, properties="K\x01\ud800\x02")
