"""The replication stream's byte format (docs/PROTOCOL.md "Replication stream"), sans-IO.

RocketMQ 4.9.3's HA stream is two raw byte streams over one TCP connection to the master's HA port: the slave
sends 8-byte big-endian offset reports (its commit-log max offset), the master sends frames of ``phyOffset``
(8) + ``bodySize`` (4) + ``bodySize`` bytes of the commit log, an empty frame being a heartbeat. trimq keeps
both and puts one handshake in front, because a slave that was a master (or followed one) in an older master
epoch must learn where to cut its log before it may append (``history.truncation_point``):

* slave -> master, once: ``HELLO`` = magic ``TQHA`` (4) + version (int32) + the slave's master epoch (int64,
  the newest epoch of its history, 0 when it has none) + its commit-log max offset (int64): 24 bytes;
* master -> slave, once: ``HELLO_ACK`` = magic (4) + version (int32) + master epoch (int64) + the master's
  broker epoch (int64) + start offset (int64; -1: refused) + the master's broker address (int16 length +
  UTF-8) + a remark (int16 length + UTF-8; why it refused) + its epoch history (int32 count, then count x
  (epoch int64, start offset int64)).

Then the slave cuts its log to the start offset when it holds more, and both sides run RocketMQ's streams.
Every integer is big-endian. No trio, no sockets: the decoders take bytes and return values, or None while a
message is incomplete; a malformed stream raises :class:`HAProtocolError` (the connection is closed).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from trimq.broker.store.epoch import MAX_BROKER_EPOCH

__all__ = [
    "HA_MAGIC",
    "HA_VERSION",
    "HELLO_SIZE",
    "MAX_TRANSFER_BODY",
    "TRANSFER_HEADER_SIZE",
    "HAProtocolError",
    "Hello",
    "HelloAck",
    "StreamBuffer",
    "encode_hello",
    "encode_hello_ack",
    "encode_offset_report",
    "encode_transfer_header",
]

HA_MAGIC = b"TQHA"
HA_VERSION = 1
#: A frame's body is at most this many bytes (the master sends at most ``ha_transfer_batch_size``, <= 16 MiB).
MAX_TRANSFER_BODY = 64 * 1024 * 1024
_MAX_HISTORY = 100_000

_HELLO = struct.Struct(">4siqq")
HELLO_SIZE = _HELLO.size  # 24
_ACK_HEAD = struct.Struct(">4siqqq")
_I16 = struct.Struct(">H")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_TRANSFER = struct.Struct(">qi")
TRANSFER_HEADER_SIZE = _TRANSFER.size  # 12
_ENTRY = struct.Struct(">qq")


class HAProtocolError(ValueError):
    """The peer sent bytes that are not the replication stream (the connection is closed)."""


@dataclass(frozen=True, slots=True)
class Hello:
    """The slave's handshake: the newest master epoch it knows and its commit-log max offset."""

    master_epoch: int
    max_offset: int


@dataclass(frozen=True, slots=True)
class HelloAck:
    """The master's answer: where it starts sending (``start_offset``; -1: refused, ``remark`` says why), its
    master epoch and broker epoch, its broker address (for the slave's metadata sync) and epoch history."""

    master_epoch: int
    broker_epoch: int
    start_offset: int
    master_addr: str
    remark: str = ""
    history: tuple[tuple[int, int], ...] = field(default_factory=tuple)

    @property
    def refused(self) -> bool:
        return self.start_offset < 0


def encode_hello(hello: Hello) -> bytes:
    return _HELLO.pack(HA_MAGIC, HA_VERSION, hello.master_epoch, hello.max_offset)


def _short_str(text: str) -> bytes:
    raw = text.encode()[:0xFFFF]
    return _I16.pack(len(raw)) + raw


def encode_hello_ack(ack: HelloAck) -> bytes:
    parts = [_ACK_HEAD.pack(HA_MAGIC, HA_VERSION, ack.master_epoch, ack.broker_epoch, ack.start_offset),
             _short_str(ack.master_addr), _short_str(ack.remark), _I32.pack(len(ack.history))]
    parts += [_ENTRY.pack(epoch, start) for epoch, start in ack.history]
    return b"".join(parts)


def encode_offset_report(offset: int) -> bytes:
    """The slave's report: its commit-log max offset (RocketMQ's ``reportSlaveMaxOffset``)."""
    return _I64.pack(offset)


def encode_transfer_header(phy_offset: int, body_size: int) -> bytes:
    """A transfer frame's header; ``body_size`` bytes of the commit log from ``phy_offset`` follow."""
    return _TRANSFER.pack(phy_offset, body_size)


class StreamBuffer:
    """Bytes received on one side of the stream, parsed as they complete (O(bytes): a consumed prefix is
    dropped once it is more than half of the buffer)."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._pos = 0

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        if self._pos and self._pos * 2 >= len(self._buf):
            del self._buf[: self._pos]
            self._pos = 0
        self._buf += data

    def __len__(self) -> int:
        return len(self._buf) - self._pos

    def _take(self, n: int) -> memoryview | None:
        if len(self._buf) - self._pos < n:
            return None
        view = memoryview(self._buf)[self._pos : self._pos + n]
        self._pos += n
        return view

    def _peek(self, n: int, at: int = 0) -> memoryview | None:
        start = self._pos + at
        if len(self._buf) - start < n:
            return None
        return memoryview(self._buf)[start : start + n]

    def next_hello(self) -> Hello | None:
        view = self._take(HELLO_SIZE)
        if view is None:
            return None
        magic, version, epoch, offset = _HELLO.unpack(view)
        view.release()
        _check_magic(magic, version)
        if epoch < 0 or offset < 0:
            raise HAProtocolError(f"hello with a negative epoch {epoch} or offset {offset}")
        return Hello(epoch, offset)

    def next_hello_ack(self) -> HelloAck | None:
        head = self._peek(_ACK_HEAD.size)
        if head is None:
            return None
        magic, version, master_epoch, broker_epoch, start = _ACK_HEAD.unpack(head)
        head.release()
        _check_magic(magic, version)
        # A slave keeps the broker epoch (and a promotion goes above it): one no broker could have is refused here
        if master_epoch < 0 or not 0 <= broker_epoch <= MAX_BROKER_EPOCH:
            raise HAProtocolError(f"hello answer with master epoch {master_epoch} and broker epoch {broker_epoch} "
                                  f"(expected >= 0 and 0..{MAX_BROKER_EPOCH})")
        at = _ACK_HEAD.size
        texts = []
        for _ in range(2):
            n = self._peek(2, at)
            if n is None:
                return None
            (length,) = _I16.unpack(n)
            n.release()
            raw = self._peek(length, at + 2)
            if raw is None:
                return None
            try:
                texts.append(bytes(raw).decode())
            except UnicodeDecodeError:
                raise HAProtocolError("hello answer with a text that is not UTF-8") from None
            raw.release()
            at += 2 + length
        count_view = self._peek(4, at)
        if count_view is None:
            return None
        (count,) = _I32.unpack(count_view)
        count_view.release()
        if not 0 <= count <= _MAX_HISTORY:
            raise HAProtocolError(f"hello answer with {count} history entries")
        entries = self._peek(count * _ENTRY.size, at + 4)
        if entries is None:
            return None
        history = tuple((int(e), int(s)) for e, s in _ENTRY.iter_unpack(entries))
        entries.release()
        self._pos += at + 4 + count * _ENTRY.size
        return HelloAck(master_epoch, broker_epoch, start, texts[0], texts[1], history)

    def next_offset_report(self) -> int | None:
        """The next 8-byte offset report, or None."""
        view = self._take(8)
        if view is None:
            return None
        (offset,) = _I64.unpack(view)
        view.release()
        if offset < 0:
            raise HAProtocolError(f"negative offset report {offset}")
        return int(offset)

    def next_transfer(self) -> tuple[int, bytes] | None:
        """The next transfer frame as ``(phy_offset, body)`` (an empty body is a heartbeat), or None."""
        head = self._peek(TRANSFER_HEADER_SIZE)
        if head is None:
            return None
        phy, size = _TRANSFER.unpack(head)
        head.release()
        if phy < 0 or not 0 <= size <= MAX_TRANSFER_BODY:
            raise HAProtocolError(f"transfer frame at offset {phy} with body size {size}")
        body = self._peek(size, TRANSFER_HEADER_SIZE)
        if body is None:
            return None
        data = bytes(body)
        body.release()
        self._pos += TRANSFER_HEADER_SIZE + size
        return int(phy), data


def _check_magic(magic: bytes, version: int) -> None:
    if magic != HA_MAGIC:
        raise HAProtocolError(f"not a trimq replication stream (magic {bytes(magic)!r})")
    if version != HA_VERSION:
        raise HAProtocolError(f"replication stream version {version}; this broker speaks {HA_VERSION}")
