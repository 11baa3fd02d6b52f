"""Vectorised commit-log reader: Arrow RecordBatches built column-wise (no pyspark; numpy + pyarrow).

``VectorScanner(split).batches()`` yields exactly the rows of ``parser.SplitScanner(split)`` (same
ownership of records across splits, same malformed regions, same values), as ``pa.RecordBatch`` of
``ARROW_RECORD_SCHEMA`` or of a projection of it (``columns``), with optional derived columns
(``DERIVED_COLUMNS``, ``prop_<NAME>``) that the audit uses instead of the properties map.

How. A read window (``pread``, 8 MiB by default, bounded whatever the segment size) is walked along the
record chain by a tight loop over the 8-byte size+magic headers only. The positions of a run of
well-formed message records are then decoded all at once:

* fixed header fields are gathered with numpy from big-endian strided views of the window (the IPv6 bits
  of SYSFLAG shift the fields after the born host by 12 bytes each, per record);
* the body/topic/properties lengths are checked vectorised; the first record whose lengths do not add up
  ends the run;
* topics, properties and bodies become Arrow string/binary arrays by one ``take`` over an array whose
  offsets interleave the wanted slices with the bytes between them (no Python per record); property
  maps are split with Arrow compute kernels; host strings are formatted once per distinct host;
  message ids are hex-encoded with a lookup table;
* only the body CRC costs one call per record (ISA-L's ``crc32`` from the ``isal`` package, zlib's where it
  is missing: the same CRC-32);
* record starts come from the consume queues where they have them (``cq_positions``), checked against the
  bytes, instead of a walk over every size field.

Anything else (a bad magic, zeros, a filler, an overrun, lengths that do not add up, text that is not
UTF-8, a property map with a repeated name) goes to the sequential walker for exactly one record or
region (``SplitScanner._walk(one_item=True)``): it produces the same malformed row as before and says
where the chain resumes, and the fast path takes over again there.
"""

from __future__ import annotations

import os
import socket
import struct
import zlib
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from trimq.protocol.message import MessageConst
from trimq.protocol.record import MESSAGE_MAGIC_CODE
from trimq.protocol.validation import DLQ_GROUP_TOPIC_PREFIX, RETRY_GROUP_TOPIC_PREFIX, SCHEDULE_TOPIC
from trimq.spark_jobs.cq_positions import ConsumeQueuePositions, consume_queue_root
from trimq.spark_jobs.parser import (
    COLUMN_INDEX,
    DEFAULT_MAX_RECORD_SIZE,
    MIN_RECORD_SIZE,
    RowBatch,
    SegmentPathError,
    SegmentSplit,
    SplitScanner,
)

DEFAULT_VECTOR_WINDOW = 8 * 1024 * 1024
#: Rows per batch: the per-batch costs (the derived columns' per-queue and per-key state, Arrow kernels' setup)
#: are amortised over more rows than the sequential parser's 8192 (measured: -10% CPU per row at 32768).
DEFAULT_VECTOR_BATCH_SIZE = 32768

try:  # ISA-L's CRC-32: zlib's polynomial, ~60 ns instead of ~200 ns for a 256-byte body (one call per record)
    from isal.isal_zlib import crc32 as _crc32
except ImportError:  # pragma: no cover - an executor without isal reads the same, slower
    _crc32 = zlib.crc32

MAP_TYPE = pa.map_(pa.string(), pa.string())
ARROW_RECORD_SCHEMA = pa.schema(
    [
        ("segment", pa.string()),
        ("file_position", pa.int64()),
        ("physical_offset", pa.int64()),
        ("total_size", pa.int64()),
        ("magic", pa.int64()),
        ("body_crc", pa.int32()),
        ("crc_ok", pa.bool_()),
        ("queue_id", pa.int32()),
        ("flag", pa.int32()),
        ("queue_offset", pa.int64()),
        ("sys_flag", pa.int32()),
        ("born_timestamp", pa.int64()),
        ("born_host", pa.string()),
        ("store_timestamp", pa.int64()),
        ("store_host", pa.string()),
        ("reconsume_times", pa.int32()),
        ("prepared_transaction_offset", pa.int64()),
        ("topic", pa.string()),
        ("properties", MAP_TYPE),
        ("keys", pa.string()),
        ("tags", pa.string()),
        ("body_size", pa.int32()),
        ("msg_id", pa.string()),
        ("body", pa.binary()),
        ("malformed", pa.bool_()),
        ("error", pa.string()),
    ]
)
RECORD_COLUMNS = tuple(ARROW_RECORD_SCHEMA.names)

# Derived columns (computed in record order within a split; see the audit's use in spark_jobs.checks):
DERIVED_COLUMNS = {
    # the first space-separated KEYS entry (java's ^\s*(\S+)), null when none
    "shard_key": pa.string(),
    # file position where the planned split starts (with ``segment``: which split read the row)
    "split_start": pa.int64(),
    # queue_offset minus that of the previous record of the same (topic, queue_id) in this split, for
    # records that take a queue offset; null for the first one in the split and for the others
    "queue_step": pa.int64(),
    # born_timestamp minus that of the previous keyed record (ordinary topic, takes a queue offset, has a
    # shard key) of the same (topic, shard_key) in this split; null for the first one and the others
    "born_step": pa.int64(),
    # two 31-bit halves of unit_hashes(queue_offset, physical_offset, total_size) for records that take a
    # queue offset (null for the others): summed per queue they compare the records with the consume queue
    "unit_h1": pa.int64(),
    "unit_h2": pa.int64(),
}
PROP_PREFIX = "prop_"  # prop_<NAME>: the value of property NAME (string, null when absent)

_SPACE = r"[ \t\n\x0b\f\r]"
_SHARD_KEY_RE = rf"^{_SPACE}*(?P<k>[^ \t\n\x0b\f\r]+)"
_SYSFLAG_TX_MASK = 0xC
_HEX = np.frombuffer(b"0123456789ABCDEF", dtype=np.uint8)
_HEX_PAIRS = np.stack([_HEX[np.arange(256) >> 4], _HEX[np.arange(256) & 15]], axis=1)  # (256, 2)
_SIZE_MAGIC = struct.Struct(">iI")


def column_type(name: str) -> pa.DataType:
    """Arrow type of a record column, a derived column or ``prop_<NAME>``. Raises KeyError for others."""
    if name in RECORD_COLUMNS:
        return ARROW_RECORD_SCHEMA.field(name).type
    if name in DERIVED_COLUMNS:
        return DERIVED_COLUMNS[name]
    if name.startswith(PROP_PREFIX) and len(name) > len(PROP_PREFIX):
        return pa.string()
    raise KeyError(name)


def projection_schema(columns: Sequence[str] | None) -> pa.Schema:
    """The Arrow schema of ``columns`` (None: every record column, ``ARROW_RECORD_SCHEMA``)."""
    if columns is None:
        return ARROW_RECORD_SCHEMA
    return pa.schema([(c, column_type(c)) for c in columns])


def batch_to_arrow(batch: RowBatch, schema: pa.Schema = ARROW_RECORD_SCHEMA) -> pa.RecordBatch:
    """A sequential-parser RowBatch as a RecordBatch of ``schema`` (record columns only)."""
    cols = batch.columns()
    arrays = []
    n = len(batch.rows)
    for field in schema:
        if field.name == "segment" and n and cols[0].count(cols[0][0]) == n:
            arrays.append(pa.repeat(pa.scalar(cols[0][0], pa.string()), n))
        elif field.name == "properties":
            arrays.append(
                pa.MapArray.from_arrays(
                    pa.array(batch.prop_offsets, pa.int32()),
                    pa.array(batch.prop_keys, pa.string()),
                    pa.array(batch.prop_values, pa.string()),
                    type=field.type,
                    mask=pa.array(batch.prop_null, pa.bool_()),
                )
            )
        else:
            arrays.append(pa.array(cols[COLUMN_INDEX[field.name]], type=field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def _format_host(raw: bytes) -> str:
    if len(raw) == 8:
        return f"{socket.inet_ntop(socket.AF_INET, raw[:4])}:{int.from_bytes(raw[4:8], 'big', signed=True)}"
    return f"[{socket.inet_ntop(socket.AF_INET6, raw[:16])}]:{int.from_bytes(raw[16:20], 'big', signed=True)}"


def _hex16(x: np.ndarray) -> np.ndarray:
    """uint64 values -> (n, 16) ASCII upper-case hex digits (big-endian)."""
    b = x.astype(">u8").view(np.uint8).reshape(-1, 8)
    return _HEX_PAIRS[b].reshape(-1, 16)


_IS_SPACE = np.zeros(256, dtype=bool)
_IS_SPACE[list(b" \t\n\x0b\f\r")] = True


def _shard_keys(keys: pa.Array) -> pa.Array:
    """The first token of each KEYS value (``_SHARD_KEY_RE``; null for a null, empty or blank value). Without
    a whitespace byte anywhere in the batch (the usual single key) that is the value itself, or null when
    empty: one pass over the bytes instead of a regex per row."""
    bufs = keys.buffers()
    if len(keys) and keys.type == pa.string() and bufs[2] is not None:  # 32-bit offsets
        offs = np.frombuffer(bufs[1], dtype=np.int32, count=len(keys) + 1, offset=keys.offset * 4)
        if not _IS_SPACE[np.frombuffer(bufs[2], dtype=np.uint8)[offs[0] : offs[-1]]].any():
            return pc.if_else(pc.equal(pc.binary_length(keys), 0), pa.scalar(None, pa.string()), keys)
    return pc.struct_field(pc.extract_regex(keys, _SHARD_KEY_RE), [0])


def _slices(data: pa.Buffer, starts: np.ndarray, ends: np.ndarray, typ: pa.DataType) -> pa.Array:
    """``data[starts[i]:ends[i]]`` for each i as one string/binary array, copied by a single ``take``.

    The slices are in increasing, non-overlapping order (fields of consecutive records), so one array
    whose offsets are ``s0, e0, s1, e1, ...`` has slice i at index 2i (and the bytes between at 2i+1).
    """
    n = len(starts)
    if n == 0:
        return pa.array([], typ)
    offs = np.empty(2 * n, dtype=np.int32)
    offs[0::2] = starts
    offs[1::2] = ends
    inter = pa.Array.from_buffers(typ, 2 * n - 1, [None, pa.py_buffer(offs), data])
    return inter.take(pa.array(np.arange(0, 2 * n, 2, dtype=np.int64)))


def _valid_utf8(arr: pa.Array) -> bool:
    try:
        arr.validate(full=True)
    except pa.ArrowInvalid:
        return False
    return True


def _first_invalid_utf8(arr: pa.Array) -> int | None:
    """Index of the first string that is not valid UTF-8, None if all are (bisection over prefixes)."""
    if _valid_utf8(arr):
        return None
    lo, hi = 0, len(arr) - 1  # arr[:hi + 1] is invalid
    while lo < hi:
        mid = (lo + hi) // 2
        if _valid_utf8(arr.slice(0, mid + 1)):
            lo = mid + 1
        else:
            hi = mid
    return lo


_MASK31 = np.uint64((1 << 31) - 1)


def unit_hashes(
    queue_offset: np.ndarray, physical_offset: np.ndarray, size: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Two 31-bit hashes of (queue offset, commit-log offset, size) (splitmix64 of a mix of the three).

    The consume-queue summary (``commitlog_source``, ``summary`` option) hashes each unit the same way,
    so per queue the sums over the records and over the units are equal when both hold the same
    (offset, position, size) triples; a difference means a missing, extra or different unit. Two
    independent 31-bit sums make a false match about 2^-62 likely.
    """
    with np.errstate(over="ignore"):
        x = (queue_offset.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)) ^ (
            physical_offset.astype(np.uint64) * np.uint64(0xC2B2AE3D27D4EB4F)
        ) ^ (size.astype(np.uint64) * np.uint64(0x165667B19E3779F9))
        x ^= x >> np.uint64(30)
        x *= np.uint64(0xBF58476D1CE4E5B9)
        x ^= x >> np.uint64(27)
        x *= np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return (x & _MASK31).astype(np.int64), ((x >> np.uint64(31)) & _MASK31).astype(np.int64)


class _Irregular(Exception):
    """A run the vectorised decoder does not reproduce exactly: hand it to the sequential walker."""


class VectorScanner:
    """Reads the records a split owns as Arrow RecordBatches. Use ``batches()``.

    ``columns``: the columns to produce, in order (None: ``RECORD_COLUMNS``). Record columns, the
    derived columns of ``DERIVED_COLUMNS`` and ``prop_<NAME>`` may be mixed. ``include_body`` fills
    ``body`` (else null). A task holds one read window and one batch at a time; the per-split state of
    ``queue_step``/``born_step`` holds one entry per queue / key seen in the split.
    """

    def __init__(
        self,
        split: SegmentSplit,
        *,
        columns: Sequence[str] | None = None,
        include_body: bool = False,
        batch_size: int = DEFAULT_VECTOR_BATCH_SIZE,
        max_record_size: int = DEFAULT_MAX_RECORD_SIZE,
        window: int = DEFAULT_VECTOR_WINDOW,
        use_consume_queues: bool = True,
    ) -> None:
        if batch_size <= 0:
            raise ValueError(f"batch size must be positive, got {batch_size}")
        self.split = split
        self.columns = tuple(RECORD_COLUMNS if columns is None else columns)
        self.schema = projection_schema(self.columns)
        self.include_body = include_body
        self.batch_size = batch_size
        self.max_record_size = max_record_size
        self.window = max(window, 64 * 1024)
        want = set(self.columns)
        self._props_wanted = sorted(
            {c[len(PROP_PREFIX):] for c in want if c.startswith(PROP_PREFIX) and c not in RECORD_COLUMNS}
        )
        # What the derived columns need from the record columns.
        need = set(want)
        if "born_step" in need:
            need |= {"topic", "shard_key", "born_timestamp", "sys_flag", "malformed"}
        if "queue_step" in need:
            need |= {"topic", "queue_id", "queue_offset", "sys_flag", "malformed"}
        if "unit_h1" in need or "unit_h2" in need:
            need |= {"queue_offset", "physical_offset", "total_size", "sys_flag", "malformed"}
        if "shard_key" in need:
            need.add("keys")
        self._need = need
        self._hosts: dict[bytes, str] = {}
        self._queue_state: dict[tuple[str, int], int] = {}
        self._key_state: dict[tuple[str, str], int] = {}
        self.use_consume_queues = use_consume_queues
        self.walked_records = 0  # record starts found by walking the size fields (not proposed by a consume queue)
        self.fast_records = 0  # records decoded vectorised (for tests and the benchmark)
        self.slow_items = 0  # records or regions handed to the sequential walker

    # -- driver --------------------------------------------------------------------------------------

    def batches(self) -> Iterator[pa.RecordBatch]:
        """Yield RecordBatches of at most ``batch_size`` rows covering the records this split owns."""
        split = self.split
        if split.start >= split.end or split.file_size <= 0:
            return
        try:
            fd = os.open(split.path, os.O_RDONLY)
        except OSError as exc:
            raise SegmentPathError(f"{split.path}: cannot open segment: {exc.strerror}") from None
        try:
            size_f = min(split.file_size, os.fstat(fd).st_size)
            if size_f <= 0:
                return
            slow = SplitScanner(split, include_body=self.include_body, batch_size=self.batch_size,
                                max_record_size=self.max_record_size)
            slow._fd = fd
            slow._size = size_f
            cq = None
            root = consume_queue_root(split.path) if self.use_consume_queues else None
            if root is not None and split.base_offset is not None:
                cq = ConsumeQueuePositions(root, split.base_offset, size_f)
            yield from self._run(fd, size_f, slow, cq)
        finally:
            os.close(fd)

    def _run(self, fd: int, size_f: int, slow: SplitScanner,
             cq: ConsumeQueuePositions | None = None) -> Iterator[pa.RecordBatch]:
        split = self.split
        pos: int | None = 0 if split.start == 0 else slow._sync(split.start, split.end)
        if pos is None:
            return
        owned_end = split.end
        end_checked = False
        buf = b""
        wstart = 0
        unpack = _SIZE_MAGIC.unpack_from
        msg_magic = MESSAGE_MAGIC_CODE
        batch_size = self.batch_size
        while True:
            if pos >= owned_end:
                if end_checked:
                    break
                end_checked = True
                nxt = slow._sync(split.end, None)
                owned_end = size_f if nxt is None else nxt
                continue
            if pos >= size_f:
                break
            rel = pos - wstart
            if rel < 0 or rel + 8 > len(buf):
                buf = os.pread(fd, min(self.window, size_f - pos), pos)
                wstart, rel = pos, 0
            blen = len(buf)
            fast = False
            if blen - rel >= 8:
                size, magic = unpack(buf, rel)
                if magic == msg_magic and size >= MIN_RECORD_SIZE and pos + size <= size_f:
                    if rel + size > blen:
                        # The record does not fit in the window: read one starting at it (at least its size).
                        buf = os.pread(fd, min(max(self.window, size), size_f - pos), pos)
                        wstart = pos
                        continue
                    fast = True
            if fast:
                lim = min(owned_end - wstart, blen)
                positions: np.ndarray | list[int] = []
                if cq is not None:
                    positions, p = self._proposed_run(buf, wstart, rel, lim, cq)
                if not len(positions):
                    # The tight walk: size fields only, within the window and the owned range, up to the next
                    # start a consume queue proposes (where the proposals take over again).
                    stop = lim
                    if cq is not None:
                        nxt = cq.next_after(wstart + rel)
                        if nxt is not None:
                            stop = min(stop, nxt - wstart)
                    walked: list[int] = []
                    app = walked.append
                    p = rel
                    n = 0
                    while p < stop and n < batch_size and p + 8 <= blen:
                        size, magic = unpack(buf, p)
                        if magic != msg_magic or size < MIN_RECORD_SIZE or p + size > blen:
                            break
                        app(p)
                        p += size
                        n += 1
                    self.walked_records += n
                    positions = walked
                done = self._decode_run(buf, wstart, positions)
                if done:
                    yield self._finish(done[0], done[1])
                if done is not None and done[1] == len(positions):
                    pos = wstart + p
                    continue
                pos = wstart + int(positions[0 if done is None else done[1]])
            # One record or region the fast path does not take: the sequential walker decides.
            self.slow_items += 1
            walk = slow._walk(start=pos, owned_end=owned_end, end_checked=end_checked, one_item=True)
            while True:
                try:
                    rb = next(walk)
                except StopIteration as stop:
                    nxt_pos, owned_end, end_checked = stop.value
                    break
                if len(rb):
                    yield self._finish(self._arrow_from_rows(rb), len(rb))
            if nxt_pos is None:
                break
            pos = nxt_pos
            buf = b""  # the walker may have moved far (resynchronised): read afresh

    def _proposed_run(self, buf: bytes, wstart: int, rel: int, lim: int,
                      cq: ConsumeQueuePositions) -> tuple[np.ndarray, int]:
        """The record starts the consume queues propose from ``rel`` on (window-relative), as far as the bytes
        confirm them exactly as the walk would: each has the message magic, a plausible size that fits the window,
        and ends where the next one starts. At most ``batch_size``, below ``lim``. Returns the starts and where
        the last one ends (empty when ``rel`` itself is not proposed)."""
        prop = cq.at_or_after(wstart + rel, wstart + lim)
        if not len(prop) or int(prop[0]) != wstart + rel:
            return prop[:0], rel
        r = prop[: self.batch_size] - wstart
        blen = len(buf)
        r = r[r + 8 <= blen]
        size = np.ndarray((blen - 3,), dtype=">i4", buffer=buf, strides=(1,))[r].astype(np.int64)
        magic = np.ndarray((blen - 7,), dtype=">u4", buffer=buf, offset=4, strides=(1,))[r]
        good = (magic == MESSAGE_MAGIC_CODE) & (size >= MIN_RECORD_SIZE) & (r + size <= blen)
        good[1:] &= r[1:] == r[:-1] + size[:-1]  # the chain: a gap (an unlisted record) ends the run
        k = len(r) if good.all() else int(np.argmin(good))
        if k == 0:
            return r[:0], rel
        return r[:k], int(r[k - 1] + size[k - 1])

    # -- vectorised decoding ---------------------------------------------------------------------------

    def _decode_run(
        self, buf: bytes, wstart: int, positions: np.ndarray | list[int]
    ) -> tuple[dict[str, pa.Array], int] | None:
        """Decode the records at ``positions`` (relative to the window). Returns the columns of the first
        k records and k (the records after the first irregular one are not decoded), or None when k = 0."""
        n = len(positions)
        if n == 0:
            return None
        blen = len(buf)
        a8 = np.frombuffer(buf, dtype=np.uint8)
        i32 = np.ndarray((blen - 3,), dtype=">i4", buffer=buf, strides=(1,))
        i64 = np.ndarray((blen - 7,), dtype=">i8", buffer=buf, strides=(1,))
        i16 = np.ndarray((blen - 1,), dtype=">i2", buffer=buf, strides=(1,))
        P = np.asarray(positions, dtype=np.int64)
        size = i32[P].astype(np.int64)
        end = P + size
        sysflag = i32[P + 36].astype(np.int32)
        e1 = np.where(sysflag & 0x10, 12, 0).astype(np.int64)
        e2 = np.where(sysflag & 0x20, 12, 0).astype(np.int64)
        top = blen - 4
        body_len = i32[np.minimum(P + 84 + e1 + e2, top)].astype(np.int64)
        b0 = P + 88 + e1 + e2
        b1 = b0 + body_len
        ok = (body_len >= 0) & (b1 + 3 <= end)
        b1c = np.where(ok, b1, P)
        t0 = b1c + 1
        t1 = t0 + a8[b1c].astype(np.int64)
        ok &= t1 + 2 <= end
        t1c = np.where(ok, t1, P)
        plen = i16[t1c].astype(np.int64)
        ok &= (plen >= 0) & (t1c + 2 + plen == end)
        k = n if ok.all() else int(np.argmin(ok))
        while k > 0:
            try:
                cols = self._columns(buf, wstart, P[:k], size[:k], end[:k], sysflag[:k], e1[:k], e2[:k],
                                     body_len[:k], b0[:k], t0[:k], t1[:k], a8, i32, i64)
            except _Irregular as exc:
                # Keep the records before the irregular one; the walker takes it from there.
                k = min(int(exc.args[0]), k - 1)
                continue
            self.fast_records += k
            return cols, k
        return None

    def _columns(
        self,
        buf: bytes,
        wstart: int,
        P: np.ndarray,
        size: np.ndarray,
        end: np.ndarray,
        sysflag: np.ndarray,
        e1: np.ndarray,
        e2: np.ndarray,
        body_len: np.ndarray,
        b0: np.ndarray,
        t0: np.ndarray,
        t1: np.ndarray,
        a8: np.ndarray,
        i32: np.ndarray,
        i64: np.ndarray,
    ) -> dict[str, pa.Array]:
        need = self._need
        n = len(P)
        data = pa.py_buffer(buf)
        cols: dict[str, pa.Array] = {}
        if "segment" in need:
            cols["segment"] = pa.repeat(pa.scalar(self.split.segment, pa.string()), n)
        if "file_position" in need:
            cols["file_position"] = pa.array(P + wstart)
        phys = i64[P + 28].astype(np.int64)
        if "physical_offset" in need:
            cols["physical_offset"] = pa.array(phys)
        if "total_size" in need:
            cols["total_size"] = pa.array(size)
        if "magic" in need:
            cols["magic"] = pa.array(np.full(n, MESSAGE_MAGIC_CODE, dtype=np.int64))
        crc = i32[P + 8].astype(np.int32)
        if "body_crc" in need:
            cols["body_crc"] = pa.array(crc)
        if "crc_ok" in need:
            crc32 = _crc32
            got = np.fromiter(
                map(crc32, map(buf.__getitem__, map(slice, b0.tolist(), (b0 + body_len).tolist()))),
                dtype=np.int64, count=n,
            )
            cols["crc_ok"] = pa.array((got & 0x7FFFFFFF) == crc)
        for name, off, typ in (("queue_id", 12, np.int32), ("flag", 16, np.int32)):
            if name in need:
                cols[name] = pa.array(i32[P + off].astype(typ))
        if "queue_offset" in need:
            cols["queue_offset"] = pa.array(i64[P + 20].astype(np.int64))
        if "sys_flag" in need:
            cols["sys_flag"] = pa.array(sysflag)
        if "born_timestamp" in need:
            cols["born_timestamp"] = pa.array(i64[P + 40].astype(np.int64))
        if "born_host" in need:
            cols["born_host"] = self._host_column(buf, i64, P + 48, e1 > 0)
        sh = P + 64 + e1
        if "store_timestamp" in need:
            cols["store_timestamp"] = pa.array(i64[P + 56 + e1].astype(np.int64))
        if "store_host" in need:
            cols["store_host"] = self._host_column(buf, i64, sh, e2 > 0)
        if "reconsume_times" in need:
            cols["reconsume_times"] = pa.array(i32[P + 72 + e1 + e2].astype(np.int32))
        if "prepared_transaction_offset" in need:
            cols["prepared_transaction_offset"] = pa.array(i64[P + 76 + e1 + e2].astype(np.int64))
        if "body_size" in need:
            cols["body_size"] = pa.array(body_len.astype(np.int32))
        if "msg_id" in need:
            cols["msg_id"] = self._msg_id_column(buf, i64, sh, e2 > 0, phys)
        if "body" in need:
            if self.include_body:
                cols["body"] = _slices(data, b0, b0 + body_len, pa.binary())
            else:
                cols["body"] = pa.nulls(n, pa.binary())
        if "topic" in need:
            topic = _slices(data, t0, t1, pa.string())
            bad = _first_invalid_utf8(topic)
            if bad is not None:
                raise _Irregular(bad)  # the walker decodes it with replacement characters
            cols["topic"] = topic
        if need & {"properties", "keys", "tags", "shard_key"} or self._props_wanted:
            self._properties(cols, _slices(data, t1 + 2, end, pa.string()))
        if "malformed" in need:
            cols["malformed"] = pa.array(np.zeros(n, dtype=bool))
        if "error" in need:
            cols["error"] = pa.nulls(n, pa.string())
        return cols

    def _host_column(self, buf: bytes, i64: np.ndarray, at: np.ndarray, v6: np.ndarray) -> pa.Array:
        """``ip:port`` strings of the host fields at ``at`` (8 bytes, or 20 where ``v6``), formatted once
        per distinct host."""
        hosts = self._hosts
        if not v6.any():
            raw = i64[at].astype(np.int64)
            uniq, inverse = np.unique(raw, return_inverse=True)
            names = []
            for u in uniq.tolist():
                key = int(u).to_bytes(8, "big", signed=True)
                name = hosts.get(key)
                if name is None:
                    name = hosts[key] = _format_host(key)
                names.append(name)
            return pa.array(names, pa.string()).take(pa.array(inverse.astype(np.int32).ravel()))
        out = []
        for p, six in zip(at.tolist(), v6.tolist(), strict=True):
            key = buf[p : p + (20 if six else 8)]
            name = hosts.get(key)
            if name is None:
                name = hosts[key] = _format_host(key)
            out.append(name)
        return pa.array(out, pa.string())

    @staticmethod
    def _msg_id_column(buf: bytes, i64: np.ndarray, sh: np.ndarray, v6: np.ndarray, phys: np.ndarray) -> pa.Array:
        """MessageDecoder.createMessageId: upper-case hex of the store host bytes and the commit-log offset."""
        n = len(sh)
        if not v6.any():
            digits = np.empty((n, 32), dtype=np.uint8)
            hosts, inverse = np.unique(i64[sh].astype(np.int64), return_inverse=True)
            digits[:, :16] = _hex16(hosts.view(np.uint64))[inverse.ravel()]
            digits[:, 16:] = _hex16(phys.view(np.uint64))
            offs = np.arange(0, 32 * n + 1, 32, dtype=np.int32)
            return pa.StringArray.from_buffers(n, pa.py_buffer(offs), pa.py_buffer(digits.tobytes()))
        out = []
        for p, six, off in zip(sh.tolist(), v6.tolist(), phys.tolist(), strict=True):
            out.append(f"{buf[p : p + (20 if six else 8)].hex().upper()}{off & 0xFFFFFFFFFFFFFFFF:016X}")
        return pa.array(out, pa.string())

    def _properties(self, cols: dict[str, pa.Array], props: pa.Array) -> None:
        """``properties``, ``keys``, ``tags`` and ``prop_<NAME>`` from the raw property strings.

        ``name\x01value\x02`` entries as RocketMQ's MessageDecoder.string2messageProperties (and the
        sequential parser): split on \x02, then at the first \x01; entries without \x01 are skipped; a
        name given twice keeps its last value (at its first position in the map).
        """
        need = self._need
        if "properties" in need:
            cols["properties"] = self._property_map(props)
        names = [(c, n) for c, n in (("keys", MessageConst.KEYS), ("tags", MessageConst.TAGS)) if c in need]
        names += [(PROP_PREFIX + n, n) for n in self._props_wanted]
        if not names:
            return
        n = len(props)
        bufs = props.buffers()
        offs = np.frombuffer(bufs[1], dtype=np.int32, count=n + 1, offset=props.offset * 4).astype(np.int64)
        data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, dtype=np.uint8)
        rec_start, rec_end = offs[:-1], offs[1:]
        seps = np.flatnonzero(data[: offs[-1]] == 2)
        # Entry starts: each record's first byte and each byte after a \x02 (before the record's end). Both
        # lists are in order; matches are merged back into record order below.
        nonempty = np.flatnonzero(rec_end > rec_start)
        after = seps + 1
        after_rec = np.minimum(np.searchsorted(offs, after, side="right") - 1, max(n - 1, 0))
        keep = after < rec_end[after_rec]
        starts = np.concatenate([rec_start[nonempty], after[keep]])
        rec_of = np.concatenate([nonempty, after_rec[keep]])
        # Compare names 8 bytes at a time through a big-endian strided view of the (padded) bytes.
        padded = np.zeros(len(data) + 16, dtype=np.uint8)
        padded[: len(data)] = data
        words = np.ndarray((len(data) + 9,), dtype=">u8", buffer=padded, strides=(1,))
        first_words = words[starts]  # one gather: the first 8 bytes of every entry
        room = rec_end[rec_of] - starts
        for col, name in names:
            pat = name.encode() + b"\x01"
            chunk = pat[:8]
            shift = 8 * (8 - len(chunk))
            want = np.uint64(int.from_bytes(chunk, "big") << shift)
            got = first_words & np.uint64(((1 << 64) - 1) ^ ((1 << shift) - 1)) if shift else first_words
            hit = np.flatnonzero((got == want) & (room >= len(pat)))
            for j in range(8, len(pat), 8):  # the rest of a longer name, on the candidates only
                chunk = pat[j : j + 8]
                shift = 8 * (8 - len(chunk))
                want = np.uint64(int.from_bytes(chunk, "big") << shift)
                got = words[starts[hit] + j]
                if shift:
                    got = got & np.uint64(((1 << 64) - 1) ^ ((1 << shift) - 1))
                hit = hit[got == want]
            take = np.full(n, -1, dtype=np.int64)
            if len(hit):
                hit = hit[np.argsort(starts[hit], kind="stable")]
                recs = rec_of[hit]
                vstart = starts[hit] + len(pat)
                k = np.searchsorted(seps, vstart)
                nxt = np.where(k < len(seps), seps[np.minimum(k, max(len(seps) - 1, 0))] if len(seps) else 0, 0)
                vend = np.where((k < len(seps)) & (nxt < rec_end[recs]), nxt, rec_end[recs])
                # The last entry of a name wins (dict semantics): keep one hit per record, the last.
                last = np.ones(len(recs), dtype=bool)
                last[:-1] = recs[1:] != recs[:-1]
                recs, vstart, vend = recs[last], vstart[last], vend[last]
                vals = _slices(bufs[2], vstart, vend, pa.string())
                bad = _first_invalid_utf8(vals)
                if bad is not None:
                    raise _Irregular(int(recs[bad]))
                if len(recs) == n:  # every record has it: the values are already in record order
                    cols[col] = vals
                    continue
                take[recs] = np.arange(len(recs))
                cols[col] = vals.take(pa.array(take, mask=take < 0))
            else:
                cols[col] = pa.nulls(n, pa.string())

    @staticmethod
    def _property_map(props: pa.Array) -> pa.Array:
        """The properties as a MapArray, split with Arrow kernels; a record whose map would differ from the
        sequential parser's (text that is not UTF-8, a name twice) is irregular."""
        bad = _first_invalid_utf8(props)
        if bad is not None:
            raise _Irregular(bad)
        n = len(props)
        entries = pc.split_pattern(props, "\x02")
        parents = np.asarray(pc.list_parent_indices(entries))
        kv = pc.split_pattern(entries.flatten(), "\x01", max_splits=1)
        has_sep = np.asarray(pc.equal(pc.list_value_length(kv), 2))
        kv = kv.take(pa.array(np.flatnonzero(has_sep)))
        keys = pc.list_element(kv, 0)
        values = pc.list_element(kv, 1)
        parents = parents[has_sep]
        if len(parents):
            enc = pc.dictionary_encode(keys)
            width = len(enc.dictionary)
            code = parents * width + np.asarray(enc.indices).astype(np.int64)
            # A name twice in one record: count per (record, name), cheaper than a sort while the counters stay
            # small (at most 8 MiB: a batch's memory must not grow with the number of distinct names).
            if n * width <= 1 << 20:
                counts = np.bincount(code, minlength=n * width)
                if counts.max(initial=0) > 1:
                    raise _Irregular(int(np.flatnonzero(counts > 1)[0] // width))
            else:
                uniq, counts = np.unique(code, return_counts=True)
                if len(uniq) != len(code):
                    raise _Irregular(int(uniq[counts > 1].min() // width))
        counts = np.bincount(parents, minlength=n) if len(parents) else np.zeros(n, dtype=np.int64)
        offs = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(counts, out=offs[1:])
        return pa.MapArray.from_arrays(pa.array(offs), keys, values, type=MAP_TYPE)

    # -- rows from the sequential walker ----------------------------------------------------------------

    def _arrow_from_rows(self, rb: RowBatch) -> dict[str, pa.Array]:
        full = batch_to_arrow(rb)
        cols = {name: full.column(name) for name in RECORD_COLUMNS if name in self._need}
        if self._props_wanted:
            props = full.column("properties")
            for name in self._props_wanted:
                cols[PROP_PREFIX + name] = pc.map_lookup(props, name, "last")
        return cols

    # -- derived columns and the final batch -------------------------------------------------------------

    def _finish(self, cols: dict[str, pa.Array], n: int) -> pa.RecordBatch:
        need = self._need
        if "shard_key" in need:
            cols["shard_key"] = _shard_keys(cols["keys"])
        if "split_start" in need:
            cols["split_start"] = pa.array(np.full(n, self.split.start, dtype=np.int64))
        if "queue_step" in need or "born_step" in need or "unit_h1" in need or "unit_h2" in need:
            malformed = np.asarray(cols["malformed"].fill_null(True), dtype=bool)
            sysflag = np.asarray(cols["sys_flag"].fill_null(0), dtype=np.int64)
            tx = sysflag & _SYSFLAG_TX_MASK
            takes = ~malformed & (tx != 0x4) & (tx != 0xC)
        if "unit_h1" in need or "unit_h2" in need:
            h1, h2 = unit_hashes(np.asarray(cols["queue_offset"].fill_null(0)),
                                 np.asarray(cols["physical_offset"].fill_null(0)),
                                 np.asarray(cols["total_size"].fill_null(0)))
            cols["unit_h1"] = pa.array(h1, mask=~takes)
            cols["unit_h2"] = pa.array(h2, mask=~takes)
        if "queue_step" in need or "born_step" in need:
            topic = cols["topic"]
            tenc = pc.dictionary_encode(topic)
            tidx = np.asarray(tenc.indices.fill_null(0), dtype=np.int64)
            tnames = tenc.dictionary.to_pylist()
            if "queue_step" in need:
                qid = np.asarray(cols["queue_id"].fill_null(0), dtype=np.int64)
                codes = np.where(takes, tidx * (1 << 32) + (qid & 0xFFFFFFFF), -1)
                qoff = np.asarray(cols["queue_offset"].fill_null(0), dtype=np.int64)

                def qname(c: int) -> tuple[str, int]:
                    q = c & 0xFFFFFFFF
                    return tnames[c >> 32], q - (1 << 32) if q & 0x80000000 else q

                cols["queue_step"] = _steps(codes, qoff, qname, self._queue_state)
            if "born_step" in need:
                special = np.ones(max(len(tnames), 1), dtype=bool)  # a batch of malformed rows has no topic
                for i, t in enumerate(tnames):
                    special[i] = t is None or _is_special_topic(t)
                kenc = pc.dictionary_encode(cols["shard_key"])
                kidx = np.asarray(kenc.indices.fill_null(-1), dtype=np.int64)
                knames = kenc.dictionary.to_pylist()
                nk = max(len(knames), 1)
                keyed = takes & ~special[tidx] & (kidx >= 0)
                codes = np.where(keyed, tidx * nk + kidx, -1)
                born = np.asarray(cols["born_timestamp"].fill_null(0), dtype=np.int64)
                cols["born_step"] = _steps(codes, born, lambda c: (tnames[c // nk], knames[c % nk]),
                                           self._key_state)
        return pa.RecordBatch.from_arrays([cols[c] for c in self.columns], schema=self.schema)


def _is_special_topic(topic: str) -> bool:
    """checks.is_special_topic in Python: retry, DLQ, schedule and RMQ_SYS_ topics."""
    return (
        topic.startswith(RETRY_GROUP_TOPIC_PREFIX)
        or topic.startswith(DLQ_GROUP_TOPIC_PREFIX)
        or topic == SCHEDULE_TOPIC
        or topic.startswith("RMQ_SYS_")
    )


def _steps(codes: np.ndarray, values: np.ndarray, name_of: object, state: dict) -> pa.Array:
    """Per row with ``codes >= 0``: value minus the previous value of the same code (in row order), the
    previous batches of the split included through ``state`` (keyed by ``name_of(code)``); else null."""
    n = len(codes)
    step = np.zeros(n, dtype=np.int64)
    valid = np.zeros(n, dtype=bool)
    sel = np.flatnonzero(codes >= 0)
    if len(sel):
        order = sel[np.argsort(codes[sel], kind="stable")]
        cs = codes[order]
        vs = values[order]
        first = np.ones(len(cs), dtype=bool)
        first[1:] = cs[1:] != cs[:-1]
        last = np.ones(len(cs), dtype=bool)
        last[:-1] = first[1:]
        prev = np.empty_like(vs)
        prev[1:] = vs[:-1]
        has = ~first
        for j in np.flatnonzero(first).tolist():
            key = name_of(int(cs[j]))  # type: ignore[operator]
            if key in state:
                prev[j] = state[key]
                has[j] = True
        for j in np.flatnonzero(last).tolist():
            state[name_of(int(cs[j]))] = int(vs[j])  # type: ignore[operator]
        step[order] = vs - prev
        valid[order] = has
    return pa.array(step, mask=~valid)


def scan_split_arrow(split: SegmentSplit, **kwargs: object) -> Iterator[pa.RecordBatch]:
    """Shorthand for ``VectorScanner(split, **kwargs).batches()``."""
    return VectorScanner(split, **kwargs).batches()  # type: ignore[arg-type]


def scan_splits(splits: Iterable[SegmentSplit], **kwargs: object) -> Iterator[pa.RecordBatch]:
    """Every batch of every split, in order (the single-process use of the reader)."""
    for split in splits:
        yield from VectorScanner(split, **kwargs).batches()  # type: ignore[arg-type]
