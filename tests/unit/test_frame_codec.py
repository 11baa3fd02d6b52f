"""Frame codec: golden vectors, round trips, chunking invariance, and malformed input."""

from __future__ import annotations

import json
import os
import struct

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trimq.protocol import (
    EmptyFrameError,
    FieldTypeError,
    FrameDecoder,
    FrameTooLargeError,
    MalformedPayloadError,
    MissingFieldError,
    NotAMapError,
    ProtocolError,
    RemotingCommand,
    UnencodableCommandError,
    encode_frame,
)

VECTORS = os.path.join(os.path.dirname(__file__), "..", "vectors", "frames.json")


def _golden() -> list[dict]:
    with open(VECTORS) as fh:
        return json.load(fh)


@pytest.mark.parametrize("vec", _golden(), ids=lambda v: v["name"])
def test_golden_frames_decode_and_reencode_byte_for_byte(vec: dict) -> None:
    raw = bytes.fromhex(vec["hex"])
    (cmd,) = FrameDecoder().feed(raw)
    want = dict(vec["command"])
    if vec["body_is_bin"]:
        want["body"] = bytes.fromhex(want["body"])
    assert cmd.to_map() == want
    assert encode_frame(cmd) == raw


scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1), st.text(max_size=20),
                    st.binary(max_size=40), st.floats(allow_nan=False))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                        st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                      max_leaves=12)
commands = st.builds(
    RemotingCommand,
    code=st.integers(-(2**31), 2**31),
    opaque=st.integers(0, 2**32),
    flag=st.integers(0, 3),
    version=st.integers(0, 500),
    remark=st.one_of(st.none(), st.text(max_size=30)),
    ext=st.dictionaries(st.text(max_size=10), scalars, max_size=6),
    body=values,
)


@settings(max_examples=300, deadline=None)
@given(commands)
def test_encode_decode_round_trip(cmd: RemotingCommand) -> None:
    (back,) = FrameDecoder().feed(encode_frame(cmd))
    assert back == cmd


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(commands, min_size=1, max_size=8), st.data())
def test_any_split_of_a_stream_gives_the_same_commands(cmds: list[RemotingCommand], data: st.DataObject) -> None:
    stream = b"".join(encode_frame(c) for c in cmds)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=12)))
    dec = FrameDecoder()
    got: list[RemotingCommand] = []
    prev = 0
    for cut in [*cuts, len(stream)]:
        got += dec.feed(stream[prev:cut])
        prev = cut
    assert got == cmds
    assert dec.buffered == 0


def test_one_byte_at_a_time() -> None:
    cmds = [RemotingCommand(code=i, opaque=i, body=b"x" * i) for i in range(1, 30)]
    stream = b"".join(encode_frame(c) for c in cmds)
    dec = FrameDecoder()
    got = []
    for i in range(len(stream)):
        got += dec.feed(stream[i : i + 1])
    assert got == cmds


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=200), st.integers(8, 64))
def test_random_bytes_only_raise_protocol_error_and_never_buffer_past_the_limit(raw: bytes, limit: int) -> None:
    dec = FrameDecoder(max_frame_bytes=limit)
    try:
        dec.feed(raw)
    except ProtocolError:
        return
    assert dec.buffered <= limit + 4


def _frame_of(payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + payload


@pytest.mark.parametrize(
    ("raw", "error"),
    [
        (struct.pack(">I", 17 * 1024 * 1024), FrameTooLargeError),
        (struct.pack(">I", 0), EmptyFrameError),
        (_frame_of(b"\xc1"), MalformedPayloadError),  # 0xc1 is never used in msgpack
        (_frame_of(msgpack.packb(1) + msgpack.packb(2)), MalformedPayloadError),  # two values
        (_frame_of(msgpack.packb([1, 2])), NotAMapError),
        (_frame_of(msgpack.packb({"opaque": 1})), MissingFieldError),
        (_frame_of(msgpack.packb({"code": 1})), MissingFieldError),
        (_frame_of(msgpack.packb({"code": "10", "opaque": 1})), FieldTypeError),
        (_frame_of(msgpack.packb({"code": True, "opaque": 1})), FieldTypeError),
        (_frame_of(msgpack.packb({"code": 1, "opaque": 1, "ext": [1]})), FieldTypeError),
        (_frame_of(msgpack.packb({"code": 1, "opaque": 1, "ext": {1: 2}})), FieldTypeError),
        (_frame_of(msgpack.packb({"code": 1, "opaque": 1, "remark": 5})), FieldTypeError),
        (_frame_of(b"\xa3ab"), MalformedPayloadError),  # truncated str
        (_frame_of(b"\xa2\xff\xfe"), MalformedPayloadError),  # str that is not UTF-8
    ],
)
def test_each_malformed_input_raises_its_specific_error(raw: bytes, error: type[ProtocolError]) -> None:
    with pytest.raises(error):
        FrameDecoder().feed(raw)


def test_oversized_length_is_rejected_before_any_payload_arrives() -> None:
    dec = FrameDecoder(max_frame_bytes=1024)
    with pytest.raises(FrameTooLargeError) as info:
        dec.feed(struct.pack(">I", 1025))
    assert "1025" in str(info.value) and "1024" in str(info.value)


def test_encoder_refuses_frames_over_the_limit() -> None:
    with pytest.raises(FrameTooLargeError):
        encode_frame(RemotingCommand(code=1, body=b"x" * 2000), max_frame_bytes=1000)


@pytest.mark.parametrize(("ext", "body", "said"), [
    ({"queueOffset": 2**64}, None, "ext.queueOffset = 18446744073709551616 is outside msgpack's 64-bit integers"),
    ({}, {"offsetTable": {"T@g": {"0": -(2**63) - 1}}},
     "body.offsetTable.T@g.0 = -9223372036854775809 is outside msgpack's 64-bit integers"),
    ({"ids": [1, {2, 3}]}, None, "ext.ids[1] holds a set, which msgpack does not encode"),
])
def test_encoder_names_the_value_msgpack_cannot_encode(ext: dict, body: object, said: str) -> None:
    """It raised msgpack's bare OverflowError ("Integer value out of range"), found through trimq-admin
    reset-offset with a 20-digit timestamp."""
    with pytest.raises(UnencodableCommandError) as raised:
        encode_frame(RemotingCommand.request(11, ext, body))
    assert str(raised.value) == f"request code 11 cannot be encoded: {said}"
    assert isinstance(raised.value, ValueError)
    encode_frame(RemotingCommand.request(11, {"queueOffset": 2**64 - 1, "min": -(2**63)}))  # the edges do encode


def test_a_bytes_like_value_is_not_blamed_for_another_fields_value() -> None:
    """msgpack encodes bytearray and memoryview: the field at fault is the integer after them."""
    cmd = RemotingCommand.request(11, {"key": bytearray(b"k"), "view": memoryview(b"v"), "queueOffset": 2**64})
    with pytest.raises(UnencodableCommandError, match=r": ext\.queueOffset = 18446744073709551616"):
        encode_frame(cmd)


def test_response_helpers() -> None:
    req = RemotingCommand.request(10, {"topic": "T"}, b"b")
    req.opaque = 5
    resp = RemotingCommand.response_to(req, 13, "too big")
    assert resp.is_response and not resp.is_oneway and resp.opaque == 5 and not resp.ok
    assert RemotingCommand.request(40, oneway=True).is_oneway
