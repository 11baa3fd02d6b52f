"""Errors raised by the sans-IO protocol layer. Every malformed frame raises a ProtocolError subclass; a request
that is well framed but cannot be served is refused with a RequestError (a response code and a remark)."""

from __future__ import annotations


class ProtocolError(Exception):
    """Base class: the peer sent bytes that are not a valid frame. The connection cannot continue."""


class FrameTooLargeError(ProtocolError):
    """The length prefix announces more than ``max_frame_bytes``."""

    def __init__(self, length: int, limit: int) -> None:
        super().__init__(f"frame length {length} exceeds max_frame_bytes {limit}")
        self.length = length
        self.limit = limit


class EmptyFrameError(ProtocolError):
    """The length prefix is zero: a frame must hold one msgpack map."""


class MalformedPayloadError(ProtocolError):
    """The frame's payload is not exactly one msgpack value."""


class NotAMapError(ProtocolError):
    """The frame's msgpack value is not a map."""


class MissingFieldError(ProtocolError):
    """A required key (``code`` or ``opaque``) is absent."""


class FieldTypeError(ProtocolError):
    """A key holds a value of the wrong type (e.g. ``code`` is a string)."""


class UnencodableCommandError(ValueError):
    """A command holds a value msgpack cannot encode (an integer outside 64 bits, an object of no msgpack type):
    raised by ``encode_frame`` naming the field, before anything is sent."""


class RecordError(ValueError):
    """A commit-log record could not be decoded (bad magic, truncated, sizes that do not add up)."""


class RequestError(Exception):
    """Refuse a request with a specific response code and remark: raised by a handler (or a field helper of
    protocol/fields.py), answered by the server (runtime/server.py), the connection stays open."""

    def __init__(self, code: int, remark: str) -> None:
        super().__init__(remark)
        self.code = int(code)
        self.remark = remark
