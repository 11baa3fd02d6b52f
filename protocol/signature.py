"""ACL request signatures (docs/SECURITY.md §5): a wire format shared by the client that signs and the broker
that verifies. Pure: no I/O.

The signature is base64 HMAC-SHA1 over unambiguous bytes: the request code, the ext entries except
``Signature`` sorted by key with typed values, then the body's msgpack bytes.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import struct
from collections.abc import Iterable, Mapping
from typing import Any

import msgpack

from trimq.protocol.command import RemotingCommand

ACCESS_KEY = "AccessKey"
SIGNATURE = "Signature"


def _netstring(b: bytes) -> bytes:
    return b"%d:%b," % (len(b), b)


def canonical_value(value: Any) -> bytes:
    """The typed canonical bytes of one ext value (docs/SECURITY.md §signature)."""
    if isinstance(value, str):
        return b"s" + value.encode()
    if isinstance(value, bool):
        return b"btrue" if value else b"bfalse"
    if isinstance(value, int):
        return b"i%d" % value
    if value is None:
        return b"n"
    if isinstance(value, float):
        return b"f" + struct.pack(">d", value).hex().encode()
    if isinstance(value, bytes | bytearray | memoryview):
        return b"x" + bytes(value)
    return b"m" + msgpack.packb(value, use_bin_type=True)


def _bin_header(n: int) -> bytes:
    if n < 1 << 8:
        return b"\xc4" + bytes((n,))
    if n < 1 << 16:
        return b"\xc5" + n.to_bytes(2, "big")
    return b"\xc6" + n.to_bytes(4, "big")


def _content_parts(code: int, ext: Mapping[str, Any], body: Any) -> Iterable[bytes | bytearray | memoryview]:
    yield _netstring(b"%d" % code)
    for key in sorted(k for k in ext if k != SIGNATURE):
        yield _netstring(key.encode())
        yield _netstring(canonical_value(ext[key]))
    if isinstance(body, bytes | bytearray | memoryview):
        # msgpack bin, without copying a large message body into a new buffer.
        yield _bin_header(memoryview(body).nbytes)
        yield body
    else:
        yield msgpack.packb(body, use_bin_type=True)


def canonical_content(code: int, ext: Mapping[str, Any], body: Any) -> bytes:
    """The bytes a request signature covers: code, sorted ext entries but ``Signature``, body (msgpack)."""
    return b"".join(_content_parts(code, ext, body))


def calc_signature(code: int, ext: Mapping[str, Any], body: Any, secret_key: str) -> str:
    """Base64 (standard, padded) of HMAC-SHA1(secret_key, canonical_content(code, ext, body))."""
    mac = hmac.new(secret_key.encode(), digestmod=hashlib.sha1)
    for part in _content_parts(code, ext, body):
        mac.update(part)
    return base64.b64encode(mac.digest()).decode("ascii")


def sign_command(cmd: RemotingCommand, access_key: str, secret_key: str) -> RemotingCommand:
    """Add ``AccessKey`` and ``Signature`` to ``cmd.ext`` (a new dict: callers' dicts stay untouched)."""
    ext = {k: v for k, v in cmd.ext.items() if k != SIGNATURE}
    ext[ACCESS_KEY] = access_key
    ext[SIGNATURE] = calc_signature(cmd.code, ext, cmd.body, secret_key)
    cmd.ext = ext
    return cmd
