"""RocketMQ 4.x commit-log record codec (ROCKETMQ_FACTS.md §9, docs/STORAGE.md). Pure: bytes in, bytes out.

Shared by the broker (append), the client (decoding pull responses, which carry raw records) and
spark_jobs (auditing segments). All integers are big-endian.
"""

from __future__ import annotations

import ipaddress
import socket
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

from trimq.protocol.errors import RecordError
from trimq.protocol.message import MAX_PROPERTIES_BYTES, MessageExt, decode_properties

MESSAGE_MAGIC_CODE = 0xDAA320A7
BLANK_MAGIC_CODE = 0xCBD43194
END_FILE_MIN_BLANK_LENGTH = 8  # a segment always keeps room for the filler's size + magic
DEFAULT_MAX_MESSAGE_SIZE = 4 * 1024 * 1024

SYSFLAG_COMPRESSED = 0x1
SYSFLAG_MULTI_TAGS = 0x2
SYSFLAG_TRANSACTION_PREPARED = 0x4
SYSFLAG_TRANSACTION_COMMIT = 0x8
SYSFLAG_TRANSACTION_ROLLBACK = 0xC
SYSFLAG_BORNHOST_V6 = 0x10
SYSFLAG_STOREHOST_V6 = 0x20

# Fixed positions (they do not depend on the host address lengths).
POS_TOTAL_SIZE = 0
POS_MAGIC = 4
POS_BODY_CRC = 8
POS_QUEUE_ID = 12
POS_FLAG = 16
POS_QUEUE_OFFSET = 20
POS_PHYSICAL_OFFSET = 28
POS_SYS_FLAG = 36
POS_BORN_TIMESTAMP = 40
POS_BORN_HOST = 48

_HEAD = struct.Struct(">iIiiiqqiq")  # size, magic, crc, queue id, flag, queue offset, phys offset, sysflag, born ts
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_I16 = struct.Struct(">h")
_SIZE_MAGIC = struct.Struct(">iI")

Host = tuple[str, int]


def body_crc32(body: bytes | memoryview) -> int:
    """RocketMQ's UtilAll.crc32: java.util.zip CRC32 of the body, masked to 31 bits."""
    return zlib.crc32(body) & 0x7FFFFFFF


def host_bytes(host: Host) -> bytes:
    """4+4 bytes for IPv4, 16+4 for IPv6: the address then the port as int32."""
    ip, port = host
    return ipaddress.ip_address(ip).packed + _I32.pack(port)


def _host_from(buf: bytes | bytearray | memoryview, pos: int, v6: bool) -> tuple[Host, int]:
    n = 16 if v6 else 4
    ip = socket.inet_ntop(socket.AF_INET6 if v6 else socket.AF_INET, bytes(buf[pos : pos + n]))
    (port,) = _I32.unpack_from(buf, pos + n)
    return (ip, port), pos + n + 4


def record_length(body_len: int, topic_len: int, props_len: int, born_v6: bool = False, store_v6: bool = False) -> int:
    """Total record size in bytes (CommitLog.calMsgLength)."""
    return 91 + body_len + topic_len + props_len + (12 if born_v6 else 0) + (12 if store_v6 else 0)


def store_timestamp_pos(sys_flag: int) -> int:
    return POS_BORN_HOST + (20 if sys_flag & SYSFLAG_BORNHOST_V6 else 8)


def encode_record(
    *,
    topic: str,
    body: bytes,
    queue_id: int,
    queue_offset: int,
    physical_offset: int,
    properties: str = "",
    flag: int = 0,
    sys_flag: int = 0,
    born_timestamp: int = 0,
    born_host: Host = ("127.0.0.1", 0),
    store_timestamp: int = 0,
    store_host: Host = ("127.0.0.1", 0),
    reconsume_times: int = 0,
    prepared_transaction_offset: int = 0,
    body_crc: int | None = None,
) -> bytes:
    """Encode one record. The host-v6 sys-flag bits are set from the host addresses.

    Raises RecordError for a topic over 127 bytes or properties over 32767 bytes (RocketMQ's limits), and for
    text that has no UTF-8 form (a lone surrogate).
    """
    try:
        topic_b = topic.encode()
        props_b = properties.encode()
    except UnicodeEncodeError as exc:
        raise RecordError(f"topic or properties are not valid text: {exc}") from None
    if len(topic_b) > 127:
        raise RecordError(f"topic is {len(topic_b)} bytes; a record holds at most 127")
    if len(props_b) > MAX_PROPERTIES_BYTES:
        raise RecordError(f"properties are {len(props_b)} bytes; at most {MAX_PROPERTIES_BYTES}")
    born_b = host_bytes(born_host)
    store_b = host_bytes(store_host)
    sys_flag &= ~(SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6)
    if len(born_b) == 20:
        sys_flag |= SYSFLAG_BORNHOST_V6
    if len(store_b) == 20:
        sys_flag |= SYSFLAG_STOREHOST_V6
    total = 91 + len(body) + len(topic_b) + len(props_b) + len(born_b) - 8 + len(store_b) - 8
    crc = body_crc32(body) if body_crc is None else body_crc
    return b"".join(
        (
            _HEAD.pack(
                total, MESSAGE_MAGIC_CODE, crc, queue_id, flag, queue_offset, physical_offset, sys_flag,
                born_timestamp,
            ),
            born_b,
            _I64.pack(store_timestamp),
            store_b,
            struct.pack(">iqi", reconsume_times, prepared_transaction_offset, len(body)),
            body,
            bytes((len(topic_b),)),
            topic_b,
            _I16.pack(len(props_b)),
            props_b,
        )
    )


def encode_blank(remaining: int) -> bytes:
    """The end-of-segment filler: size = bytes left in the segment, blank magic. Only these 8 bytes are
    written; the rest of the segment stays zero."""
    return _SIZE_MAGIC.pack(remaining, BLANK_MAGIC_CODE)


def message_id(store_host: Host, commit_log_offset: int) -> str:
    """RocketMQ's offset message id: upper-case hex of store host bytes + 8-byte commit-log offset."""
    return (host_bytes(store_host) + _I64.pack(commit_log_offset)).hex().upper()


def parse_message_id(msg_id: str) -> tuple[Host, int]:
    """Inverse of ``message_id``; raises ValueError for anything that is not one."""
    try:
        raw = bytes.fromhex(msg_id)
    except ValueError:
        raise ValueError(f"message id {msg_id!r} is not hexadecimal") from None
    if len(raw) not in (16, 28):
        raise ValueError(f"message id {msg_id!r} must be 32 (IPv4) or 56 (IPv6) hex digits")
    (host, _), off = _host_from(raw, 0, len(raw) == 28), len(raw) - 8
    return host, _I64.unpack_from(raw, off)[0]


@dataclass(slots=True, frozen=True)
class RecordHeader:
    """What the first 8 bytes of a record say."""

    total_size: int
    magic: int

    @property
    def is_message(self) -> bool:
        return self.magic == MESSAGE_MAGIC_CODE

    @property
    def is_blank(self) -> bool:
        return self.magic == BLANK_MAGIC_CODE


def read_header(buf: bytes | bytearray | memoryview, pos: int) -> RecordHeader:
    size, magic = _SIZE_MAGIC.unpack_from(buf, pos)
    return RecordHeader(size, magic)


def decode_record(buf: bytes | bytearray | memoryview, pos: int = 0, *, check_crc: bool = True) -> MessageExt:
    """Decode the message record at ``pos``. Raises RecordError when the bytes are not a whole, valid record.

    The body is copied; properties are parsed. The CRC is verified unless ``check_crc`` is false.
    """
    avail = len(buf) - pos
    if avail < 91:
        raise RecordError(f"record at {pos}: {avail} bytes left, a record needs at least 91")
    (size, magic, crc, queue_id, flag, queue_offset, phys, sys_flag, born_ts) = _HEAD.unpack_from(buf, pos)
    if magic != MESSAGE_MAGIC_CODE:
        raise RecordError(f"record at {pos}: magic {magic:#010x} is not the message magic {MESSAGE_MAGIC_CODE:#010x}")
    if size < 91 or size > avail:
        raise RecordError(f"record at {pos}: total size {size} does not fit the {avail} bytes available")
    end = pos + size
    try:
        born_host, p = _host_from(buf, pos + POS_BORN_HOST, bool(sys_flag & SYSFLAG_BORNHOST_V6))
        (store_ts,) = _I64.unpack_from(buf, p)
        store_host, p = _host_from(buf, p + 8, bool(sys_flag & SYSFLAG_STOREHOST_V6))
        reconsume, prepared, body_len = struct.unpack_from(">iqi", buf, p)
        p += 16
        if body_len < 0 or p + body_len > end:
            raise RecordError(f"record at {pos}: body length {body_len} overruns the record")
        body = bytes(buf[p : p + body_len])
        p += body_len
        topic_len = buf[p]
        p += 1
        topic = bytes(buf[p : p + topic_len]).decode()
        p += topic_len
        (props_len,) = _I16.unpack_from(buf, p)
        p += 2
        if props_len < 0 or p + props_len != end:
            raise RecordError(f"record at {pos}: field lengths add up to {p + props_len - pos}, total size says {size}")
        props = decode_properties(bytes(buf[p : p + props_len]).decode())
    except (struct.error, IndexError, UnicodeDecodeError, OSError, ValueError) as exc:
        if isinstance(exc, RecordError):
            raise
        raise RecordError(f"record at {pos}: {exc}") from None
    if check_crc and body_crc32(body) != crc:
        raise RecordError(f"record at {pos}: body CRC {body_crc32(body)} does not match stored {crc}")
    return MessageExt(
        topic=topic,
        body=body,
        flag=flag,
        properties=props,
        queue_id=queue_id,
        queue_offset=queue_offset,
        commit_log_offset=phys,
        sys_flag=sys_flag,
        born_timestamp=born_ts,
        born_host=born_host,
        store_timestamp=store_ts,
        store_host=store_host,
        reconsume_times=reconsume,
        prepared_transaction_offset=prepared,
        body_crc=crc,
        store_size=size,
        msg_id=message_id(store_host, phys),
    )


def iter_records(buf: bytes | bytearray | memoryview, *, check_crc: bool = True) -> Iterator[MessageExt]:
    """Decode consecutive records filling ``buf`` (a pull response body). Raises RecordError on garbage."""
    pos = 0
    n = len(buf)
    while pos < n:
        msg = decode_record(buf, pos, check_crc=check_crc)
        pos += msg.store_size
        yield msg


# Fields 1-14 plus the body length of a record whose two hosts are IPv4 (the common case): one unpack.
_V4_MIDDLE = struct.Struct(">iIiiiqqiq8sq8siqi")
_V4_BODY_POS = _V4_MIDDLE.size  # 88


class RecordDecoder:
    """Decodes the records of pull responses into MessageExt, equal to ``decode_record``'s, at a fraction
    of the cost: one struct unpack per IPv4 record, and the host addresses, topics and message-id prefixes
    (which repeat from record to record) converted once and cached. Anything unusual (IPv6 hosts, a bad
    length) goes through ``decode_record``, so errors are the same RecordError.

    One decoder per consumer process is enough; the caches are bounded.
    """

    __slots__ = ("_hosts", "_id_prefix", "_topics")

    _MAX_CACHED = 4096

    def __init__(self) -> None:
        self._hosts: dict[bytes, Host] = {}
        self._topics: dict[bytes, str] = {}
        self._id_prefix: dict[bytes, str] = {}

    def _host(self, raw: bytes) -> Host:
        host = self._hosts.get(raw)
        if host is None:
            host = (socket.inet_ntop(socket.AF_INET, raw[:4]), _I32.unpack_from(raw, 4)[0])
            if len(self._hosts) >= self._MAX_CACHED:
                self._hosts.clear()
            self._hosts[raw] = host
        return host

    def _prefix(self, store_raw: bytes) -> str:
        prefix = self._id_prefix.get(store_raw)
        if prefix is None:
            prefix = store_raw.hex().upper()
            if len(self._id_prefix) >= self._MAX_CACHED:
                self._id_prefix.clear()
            self._id_prefix[store_raw] = prefix
        return prefix

    def decode_all(self, buf: bytes | bytearray | memoryview, *, check_crc: bool = True) -> list[MessageExt]:
        """Every record filling ``buf``, in order. Raises RecordError on garbage (as ``iter_records``)."""
        if not isinstance(buf, bytes):
            buf = bytes(buf)
        out: list[MessageExt] = []
        append = out.append
        n = len(buf)
        pos = 0
        unpack = _V4_MIDDLE.unpack_from
        v6_bits = SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6
        topics = self._topics
        crc32 = zlib.crc32
        hosts = self._hosts
        host = self._host
        prefixes = self._id_prefix
        prefix = self._prefix
        last_tb, last_tlen, last_topic = b"", -1, ""
        while pos < n:
            if n - pos < 91:
                append(decode_record(buf, pos, check_crc=check_crc))  # raises the precise error
                pos += out[-1].store_size
                continue
            (size, magic, crc, queue_id, flag, queue_offset, phys, sys_flag, born_ts, born_raw, store_ts,
             store_raw, reconsume, prepared, body_len) = unpack(buf, pos)
            end = pos + size
            p = pos + _V4_BODY_POS
            if (magic != MESSAGE_MAGIC_CODE or sys_flag & v6_bits or size < 91 or end > n or body_len < 0
                    or p + body_len + 3 > end):
                msg = decode_record(buf, pos, check_crc=check_crc)  # IPv6 hosts, or the precise error
                append(msg)
                pos += msg.store_size
                continue
            body = buf[p:p + body_len]
            if check_crc and crc32(body) & 0x7FFFFFFF != crc:
                raise RecordError(f"record at {pos}: body CRC {body_crc32(body)} does not match stored {crc}")
            p += body_len
            topic_len = buf[p]
            tstart = p + 1
            p = tstart + topic_len
            if p + 2 > end:
                raise RecordError(f"record at {pos}: topic overruns the record")
            props_len = (buf[p] << 8) | buf[p + 1]
            if props_len & 0x8000 or p + 2 + props_len != end:
                decode_record(buf, pos, check_crc=check_crc)  # raises the precise error
                raise RecordError(f"record at {pos}: field lengths do not add up")  # pragma: no cover
            props: dict[str, str] = {}
            try:
                if topic_len == last_tlen and buf.startswith(last_tb, tstart):
                    topic = last_topic  # the same topic as the record before: the common case
                else:
                    tb = buf[tstart:p]
                    cached = topics.get(tb)
                    if cached is None:
                        cached = tb.decode()
                        if len(topics) >= self._MAX_CACHED:
                            topics.clear()
                        topics[tb] = cached
                    topic = cached
                    last_tb, last_tlen, last_topic = tb, topic_len, topic
                if props_len:
                    for item in buf[p + 2:end].decode().split("\x02"):  # decode_properties, inlined
                        name, sep, value = item.partition("\x01")
                        if sep:
                            props[name] = value
            except UnicodeDecodeError as exc:
                raise RecordError(f"record at {pos}: {exc}") from None
            append(MessageExt(topic, body, flag, props, queue_id, queue_offset, phys, sys_flag, born_ts,
                              hosts.get(born_raw) or host(born_raw), store_ts, hosts.get(store_raw) or host(store_raw),
                              reconsume, prepared, crc, size,
                              f"{prefixes.get(store_raw) or prefix(store_raw)}{phys & 0xFFFFFFFFFFFFFFFF:016X}"))
            pos = end
        return out


def decode_records(buf: bytes | bytearray | memoryview, *, check_crc: bool = True) -> list[MessageExt]:
    """Every record filling ``buf`` (a pull response body), as ``list(iter_records(buf))`` but faster.

    Raises RecordError on garbage. Keep a :class:`RecordDecoder` to reuse its caches across calls.
    """
    return RecordDecoder().decode_all(buf, check_crc=check_crc)
