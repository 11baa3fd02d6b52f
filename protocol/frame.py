"""Frame codec: a 4-byte big-endian length N, then N bytes holding one msgpack map.

Sans-IO: ``encode_frame`` turns a command into bytes, ``FrameDecoder.feed`` turns received bytes into
commands. The decoder's cost is O(bytes fed): a partial frame is kept in one buffer that is compacted
only after whole frames were consumed from it, so a peer dribbling one byte at a time cannot make it
quadratic (h11's ReceiveBuffer argument). It never keeps more than one incomplete frame, whose size the
length check bounds by ``max_frame_bytes`` before any payload byte is buffered.
"""

from __future__ import annotations

import struct
from typing import Any

import msgpack

from trimq.protocol.command import RemotingCommand
from trimq.protocol.errors import (
    EmptyFrameError,
    FieldTypeError,
    FrameTooLargeError,
    MalformedPayloadError,
    MissingFieldError,
    NotAMapError,
    UnencodableCommandError,
)

DEFAULT_MAX_FRAME_BYTES = 16 * 1024 * 1024
_LEN = struct.Struct(">I")
LENGTH_PREFIX_BYTES = _LEN.size


def encode_frame(cmd: RemotingCommand, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> bytes:
    """The frame bytes of ``cmd``. Raises FrameTooLargeError rather than emit a frame peers must reject, and
    UnencodableCommandError naming the field that msgpack cannot encode."""
    try:
        payload = msgpack.packb(cmd.to_map(), use_bin_type=True)
    except (OverflowError, TypeError, ValueError) as exc:
        what = "response" if cmd.is_response else "request"
        raise UnencodableCommandError(f"{what} code {cmd.code} cannot be encoded: "
                                      f"{_unencodable(cmd.to_map(), '') or exc}") from None
    if len(payload) > max_frame_bytes:
        raise FrameTooLargeError(len(payload), max_frame_bytes)
    return _LEN.pack(len(payload)) + payload


_MSGPACK_INTS = (-(2**63), 2**64 - 1)


def _unencodable(value: Any, path: str) -> str | None:
    """Where in a command's map the first value msgpack cannot encode is, and why (None: not found)."""
    if isinstance(value, bool) or value is None or isinstance(value, str | bytes | bytearray | memoryview | float):
        return None
    if isinstance(value, int):
        low, high = _MSGPACK_INTS
        return None if low <= value <= high else f"{path} = {value} is outside msgpack's 64-bit integers"
    if isinstance(value, dict):
        for key, item in value.items():
            found = _unencodable(item, f"{path}.{key}" if path else str(key))
            if found:
                return found
        return None
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            found = _unencodable(item, f"{path}[{i}]")
            if found:
                return found
        return None
    return f"{path} holds a {type(value).__name__}, which msgpack does not encode"


def _int_field(m: dict[Any, Any], key: str, default: int | None) -> int:
    value = m.get(key, default)
    if value is None:
        raise MissingFieldError(f"frame map has no {key!r}")
    if type(value) is not int:  # bool is an int subclass but never a valid code
        raise FieldTypeError(f"{key!r} must be an integer, got {type(value).__name__}")
    return value


_is_str = str.__instancecheck__


def command_from_map(m: Any) -> RemotingCommand:
    """Validate a decoded msgpack value and build the command it describes."""
    if type(m) is dict:
        # the well-formed case in a few checks; anything else goes the long way for its precise error
        get = m.get
        code = get("code")
        opaque = get("opaque")
        flag = get("flag", 0)
        version = get("version", 0)
        remark = get("remark")
        ext = get("ext")
        if ext is None:
            ext = {}
        if (type(code) is int and type(opaque) is int and type(flag) is int and type(version) is int
                and (remark is None or type(remark) is str) and type(ext) is dict and all(map(_is_str, ext))):
            return RemotingCommand(code, opaque, flag, version, remark, ext, get("body"))
    return _command_from_map_checked(m)


def _command_from_map_checked(m: Any) -> RemotingCommand:
    if not isinstance(m, dict):
        raise NotAMapError(f"frame payload must be a msgpack map, got {type(m).__name__}")
    code = _int_field(m, "code", None)
    opaque = _int_field(m, "opaque", None)
    flag = _int_field(m, "flag", 0)
    version = _int_field(m, "version", 0)
    remark = m.get("remark")
    if remark is not None and not isinstance(remark, str):
        raise FieldTypeError(f"'remark' must be a string or nil, got {type(remark).__name__}")
    ext = m.get("ext")
    if ext is None:
        ext = {}
    elif not isinstance(ext, dict) or not all(isinstance(k, str) for k in ext):
        raise FieldTypeError("'ext' must be a map with string keys")
    return RemotingCommand(
        code=code, opaque=opaque, flag=flag, version=version, remark=remark, ext=ext, body=m.get("body")
    )


def decode_payload(payload: bytes | memoryview) -> RemotingCommand:
    """Decode one frame payload (the bytes after the length prefix)."""
    try:
        value = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise MalformedPayloadError(f"frame payload is not one msgpack value: {exc}") from None
    return command_from_map(value)


class FrameDecoder:
    """Incremental decoder: ``feed`` bytes as they arrive, get back the complete commands.

    After a ProtocolError the stream is unusable (frame boundaries are lost): close the connection.
    """

    __slots__ = ("_buf", "max_frame_bytes")

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self.max_frame_bytes = max_frame_bytes
        self._buf = bytearray()

    @property
    def buffered(self) -> int:
        """Bytes held for an incomplete frame."""
        return len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> list[RemotingCommand]:
        """Add received bytes; return every command completed by them, in order."""
        buf = self._buf
        buf += data
        out: list[RemotingCommand] = []
        pos = 0
        end = len(buf)
        limit = self.max_frame_bytes
        while end - pos >= LENGTH_PREFIX_BYTES:
            (length,) = _LEN.unpack_from(buf, pos)
            if length > limit:
                buf.clear()
                raise FrameTooLargeError(length, limit)
            if length == 0:
                buf.clear()
                raise EmptyFrameError("frame length is 0; a frame holds one msgpack map")
            start = pos + LENGTH_PREFIX_BYTES
            if end - start < length:
                break
            try:
                # A copy, not a memoryview: an exception's traceback could keep a view alive and
                # forbid resizing the buffer.
                out.append(decode_payload(bytes(buf[start : start + length])))
            except Exception:
                buf.clear()
                raise
            pos = start + length
        if pos:
            del buf[:pos]
        return out
