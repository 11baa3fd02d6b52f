"""The ``checkpoint`` file: how far the commit log and the consume queues are known to be durable.

The first 24 bytes are RocketMQ's StoreCheckpoint (physicMsgTimestamp, logicsMsgTimestamp,
indexMsgTimestamp; int64 big-endian), so RocketMQ tools can read them. trimq appends what its recovery
needs (docs/STORAGE.md):

```
offset size field
0      8    physicMsgTimestamp  store time of the last record below physicOffset
8      8    logicsMsgTimestamp  store time of the last record below logicsOffset
16     8    indexMsgTimestamp   0 (trimq keeps no message index)
24     4    magic "TQCP"
28     4    version (2)
32     8    physicOffset  every commit-log byte below it was fsynced (a record boundary)
40     8    logicsOffset  every consume-queue unit of a record below it was fsynced
48     4    L: length of the queue table
52     L    queue table: UTF-8 JSON {topic: {queueId: maxOffset}}, the units fsynced at logicsOffset
52+L   4    CRC32 of bytes [24, 52+L) (version 1: of bytes [0, 52+L))
```

RocketMQ 4.9.3 maps the file's first 4096 bytes (StoreCheckpoint, one OS page): after RocketMQ has opened a
store the file is at least 4096 bytes long, zero-padded, and RocketMQ has rewritten the first 24 bytes. So
the CRC leaves those out (version 2), trailing zero bytes are accepted, and a 4096-byte file without the
trimq part is RocketMQ's own checkpoint (``Checkpoint.rocketmq``: its timestamps only).

The file is replaced atomically (temp file, fsync, rename), so it is always one whole checkpoint.
Pure encoding/decoding plus blocking file helpers; no trio.
"""

from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from trimq.broker.store.atomic import write_bytes_atomic

__all__ = ["ROCKETMQ_CHECKPOINT_SIZE", "Checkpoint", "CheckpointError", "read_checkpoint", "write_checkpoint"]

_MAGIC = b"TQCP"
_VERSION = 2
ROCKETMQ_CHECKPOINT_SIZE = 4096  # RocketMQ's StoreCheckpoint maps MappedFile.OS_PAGE_SIZE bytes
_TIMESTAMPS = struct.Struct(">qqq")
_HEAD = struct.Struct(">qqq4siqqI")  # 52 bytes
_CRC = struct.Struct(">I")


class CheckpointError(ValueError):
    """The checkpoint file exists but is not a whole, valid checkpoint."""


@dataclass(slots=True)
class Checkpoint:
    physic_msg_timestamp: int = 0
    logics_msg_timestamp: int = 0
    index_msg_timestamp: int = 0
    physic_offset: int = 0
    logics_offset: int = 0
    queue_table: dict[str, dict[int, int]] = field(default_factory=dict)
    #: True for RocketMQ's own checkpoint (or one whose trimq part cannot be trusted any more): only the
    #: timestamps are known; the offsets are 0 and recovery picks its scan start the way RocketMQ does.
    rocketmq: bool = False

    def encode(self) -> bytes:
        table = json.dumps(
            {t: {str(q): m for q, m in qs.items()} for t, qs in self.queue_table.items()},
            separators=(",", ":"),
            sort_keys=True,
        ).encode()
        head = _HEAD.pack(
            self.physic_msg_timestamp, self.logics_msg_timestamp, self.index_msg_timestamp, _MAGIC, _VERSION,
            self.physic_offset, self.logics_offset, len(table),
        )
        data = head + table
        return data + _CRC.pack(zlib.crc32(data[24:]))

    @classmethod
    def decode(cls, data: bytes) -> Checkpoint:
        """Parse checkpoint bytes; CheckpointError says what is wrong."""
        if len(data) >= _HEAD.size + _CRC.size and data[24:28] == _MAGIC:
            return cls._decode_trimq(data)
        if len(data) == ROCKETMQ_CHECKPOINT_SIZE:
            return cls._decode_rocketmq(data)
        if len(data) < _HEAD.size + _CRC.size:
            raise CheckpointError(f"checkpoint is {len(data)} bytes, shorter than the {_HEAD.size + 4} minimum")
        raise CheckpointError(f"checkpoint magic {data[24:28]!r} is not {_MAGIC!r}")

    @classmethod
    def _decode_rocketmq(cls, data: bytes) -> Checkpoint:
        p_ts, l_ts, i_ts = _TIMESTAMPS.unpack_from(data)
        if p_ts < 0 or l_ts < 0 or i_ts < 0:
            raise CheckpointError(f"RocketMQ checkpoint has negative timestamps ({p_ts}, {l_ts}, {i_ts})")
        return cls(p_ts, l_ts, i_ts, rocketmq=True)

    @classmethod
    def _decode_trimq(cls, data: bytes) -> Checkpoint:
        p_ts, l_ts, i_ts, _magic, version, p_off, l_off, tlen = _HEAD.unpack_from(data)
        if version not in (1, _VERSION):
            raise CheckpointError(f"checkpoint version {version} is not supported (expected 1 or {_VERSION})")
        end = _HEAD.size + tlen
        if tlen < 0 or len(data) < end + _CRC.size:
            raise CheckpointError(f"checkpoint is {len(data)} bytes, its header says {end + _CRC.size}")
        if any(data[end + _CRC.size :]):
            raise CheckpointError(
                f"checkpoint is {len(data)} bytes, its header says {end + _CRC.size}, and the rest is not zero")
        (crc,) = _CRC.unpack_from(data, end)
        if zlib.crc32(data[24 if version >= 2 else 0 : end]) != crc:
            if version == 1 and len(data) == ROCKETMQ_CHECKPOINT_SIZE:
                # RocketMQ has opened the store and rewritten the timestamps this CRC covers: the trimq part
                # can no longer be checked, RocketMQ's part is still good.
                return cls._decode_rocketmq(data)
            raise CheckpointError("checkpoint CRC mismatch")
        if p_off < 0 or l_off < 0:
            raise CheckpointError(f"checkpoint offsets are negative ({p_off}, {l_off})")
        try:
            raw = json.loads(data[_HEAD.size : end].decode())
            table = {str(t): {int(q): int(m) for q, m in qs.items()} for t, qs in raw.items()}
        except (ValueError, AttributeError, TypeError) as exc:
            raise CheckpointError(f"checkpoint queue table is not valid: {exc}") from None
        return cls(p_ts, l_ts, i_ts, p_off, l_off, table)


def read_checkpoint(path: str | Path) -> Checkpoint | None:
    """The checkpoint at ``path``; None when there is none. Raises CheckpointError when it is damaged."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return None
    return Checkpoint.decode(data)


def write_checkpoint(path: str | Path, cp: Checkpoint) -> None:
    """Replace the checkpoint atomically and durably (blocking: call from a worker thread when serving)."""
    write_bytes_atomic(path, cp.encode())
