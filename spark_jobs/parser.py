"""Column-oriented scanner for commit-log segments (RocketMQ 4.x record layout, ROCKETMQ_FACTS.md §9).

Pure Python, no pyspark: the Spark data source (``commitlog_source``) and the single-process baseline of
the benchmark both run this module. It reads a byte range of a segment file with bounded ``os.pread``
windows (no mmap, so a file that shrinks under us cannot SIGBUS the worker) and produces batches of row
tuples in the order of ``COLUMNS``; the properties map travels beside them as flattened lists, ready for
an Arrow ``MapArray``.

Splitting. A split ``[start, end)`` of a file owns the records whose start offset lies in
``[first(start), first(end))`` where ``first(x)`` is the first *plausible* record start at or after ``x``
(``first(0) = 0``). A position is plausible when it holds the message magic, a sane total size that fits
the file, a PHYSICALOFFSET equal to segment base + position (when the file is named by its base offset)
and the next header is plausible too (message or blank magic, or zeros = end of data); or when it holds
the blank filler reaching the end of the segment. ``first`` depends only on the file's bytes, so every
split computes the same boundaries: a reader walks the record chain from ``first(start)`` until it
reaches ``first(end)``, even past ``end``, and each record is read by exactly one split whatever the
split size. A false sync point would need bytes inside a body that carry both magic codes in the right
places and the exact physical offset of that position; the physical offset check makes that practically
impossible unless a body embeds a record crafted for that very position.

Malformed bytes. Where the chain breaks (bad magic, impossible size, field lengths that do not add up,
a record overrunning the file, zeros followed by more data), one row with ``malformed=True`` covers the
region up to the next plausible record (or up to the last non-zero byte of the file) and the walk
resumes there. ``error`` is ``"<kind>: <detail>"`` with kind in ``MALFORMED_KINDS``. A region that
reaches the end of the data of the last segment is a ``torn_tail``.
"""

from __future__ import annotations

import errno
import os
import socket
import struct
import zlib
from collections.abc import Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from trimq.protocol.record import (
    BLANK_MAGIC_CODE,
    DEFAULT_MAX_MESSAGE_SIZE,
    END_FILE_MIN_BLANK_LENGTH,
    MESSAGE_MAGIC_CODE,
    SYSFLAG_BORNHOST_V6,
    SYSFLAG_STOREHOST_V6,
)

# Row layout. ``properties`` is not in the tuple; see RowBatch.
COLUMNS: tuple[str, ...] = (
    "segment",
    "file_position",
    "physical_offset",
    "total_size",
    "magic",
    "body_crc",
    "crc_ok",
    "queue_id",
    "flag",
    "queue_offset",
    "sys_flag",
    "born_timestamp",
    "born_host",
    "store_timestamp",
    "store_host",
    "reconsume_times",
    "prepared_transaction_offset",
    "topic",
    "keys",
    "tags",
    "body_size",
    "msg_id",
    "body",
    "malformed",
    "error",
)
COLUMN_INDEX = {name: i for i, name in enumerate(COLUMNS)}

MALFORMED_KINDS = (
    "bad_magic",  # the 4 bytes after the size are neither message nor blank magic
    "bad_size",  # message magic with a total size below the 91-byte minimum
    "overrun",  # a record whose total size runs past the end of the segment file
    "bad_fields",  # body/topic/properties lengths that do not add up to the total size
    "bad_filler",  # a blank filler whose size does not reach the end of the segment
    "zero_gap",  # zeros where a record should start, with records after them
    "torn_tail",  # any of the above reaching the end of the data of the last segment
)

MIN_RECORD_SIZE = 91
# A record holds at most maxMessageSize (4 MiB by default) plus a topic and properties.
DEFAULT_MAX_RECORD_SIZE = DEFAULT_MAX_MESSAGE_SIZE + 32767 + 127 + 200
DEFAULT_SPLIT_SIZE = 64 * 1024 * 1024
DEFAULT_BATCH_SIZE = 8192
DEFAULT_WINDOW = 4 * 1024 * 1024
SEGMENT_NAME_DIGITS = 20

_MSG_MAGIC_BYTES = struct.pack(">I", MESSAGE_MAGIC_CODE)
_BLANK_MAGIC_BYTES = struct.pack(">I", BLANK_MAGIC_CODE)
_SIZE_MAGIC = struct.Struct(">iI")
_I64 = struct.Struct(">q")
_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")
# Fixed part up to and including the body length, for each (born v6, store v6) combination.
_FIXED = {
    (False, False): struct.Struct(">iIiiiqqiq8sq8siqi"),
    (True, False): struct.Struct(">iIiiiqqiq20sq8siqi"),
    (False, True): struct.Struct(">iIiiiqqiq8sq20siqi"),
    (True, True): struct.Struct(">iIiiiqqiq20sq20siqi"),
}
_FIXED_V4 = _FIXED[(False, False)]
_SEEK_DATA: int | None = getattr(os, "SEEK_DATA", None)
_PROP_SEP = "\x02"
_NAME_SEP = "\x01"


class SegmentPathError(ValueError):
    """A load path names nothing readable as commit-log segments."""


@dataclass(frozen=True, slots=True)
class SegmentSplit:
    """A byte range ``[start, end)`` of one segment file, planned on the driver.

    ``file_size`` is the size seen at planning time; every split of the file reads up to it and no
    further, so a file that grows meanwhile is read consistently. ``base_offset`` is the commit-log
    offset of byte 0 (from a 20-digit file name; None otherwise). ``segment_size`` is the distance to
    the next segment's base offset when known (a filler must reach it). ``last_segment`` marks the
    segment that may end with a torn tail.
    """

    path: str
    start: int
    end: int
    file_size: int
    base_offset: int | None
    segment_size: int | None
    last_segment: bool

    @property
    def segment(self) -> str:
        return os.path.basename(self.path)


@dataclass(slots=True)
class RowBatch:
    """Rows as tuples in ``COLUMNS`` order, plus the properties map of each row flattened.

    Row i's properties are ``prop_keys[prop_offsets[i]:prop_offsets[i+1]]`` (and the same slice of
    ``prop_values``); ``prop_null[i]`` is true for malformed rows, which have no map.
    """

    rows: list[tuple] = field(default_factory=list)
    prop_offsets: list[int] = field(default_factory=lambda: [0])
    prop_keys: list[str] = field(default_factory=list)
    prop_values: list[str] = field(default_factory=list)
    prop_null: list[bool] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.rows)

    def columns(self) -> list[tuple]:
        """The rows transposed: one tuple per column of ``COLUMNS``."""
        if not self.rows:
            return [() for _ in COLUMNS]
        return list(zip(*self.rows, strict=True))

    def properties(self, i: int) -> dict[str, str] | None:
        if self.prop_null[i]:
            return None
        a, b = self.prop_offsets[i], self.prop_offsets[i + 1]
        return dict(zip(self.prop_keys[a:b], self.prop_values[a:b], strict=True))

    def as_dicts(self) -> list[dict[str, object]]:
        """Rows as dicts including ``properties`` (for tests and small tools; slow)."""
        out = []
        for i, row in enumerate(self.rows):
            d = dict(zip(COLUMNS, row, strict=True))
            d["properties"] = self.properties(i)
            out.append(d)
        return out


# ---------------------------------------------------------------------------------------------------
# Path resolution and split planning (driver side)


def _is_segment_name(name: str) -> bool:
    return len(name) == SEGMENT_NAME_DIGITS and name.isdigit()


def resolve_segments(spec: str | Sequence[str]) -> list[str]:
    """Segment files named by ``spec``: a store dir (its ``commitlog/``), a commit-log dir, or files.

    ``spec`` is a path, a comma-separated string of paths or a sequence of them. In a directory only
    files with 20-digit names count. Raises SegmentPathError naming the offending path.
    """
    items = [s.strip() for s in spec.split(",")] if isinstance(spec, str) else [str(s).strip() for s in spec]
    items = [s for s in items if s]
    if not items:
        raise SegmentPathError("no commit-log path given: pass a store dir, a commitlog/ dir or segment files")
    out: list[str] = []
    for item in items:
        path = os.path.abspath(os.path.expanduser(item))
        if os.path.isdir(path):
            cl = os.path.join(path, "commitlog")
            folder = cl if os.path.isdir(cl) else path
            names = sorted(n for n in os.listdir(folder) if _is_segment_name(n))
            files = [os.path.join(folder, n) for n in names if os.path.isfile(os.path.join(folder, n))]
            if not files and folder == path and not os.path.isdir(cl):
                raise SegmentPathError(
                    f"{path}: no commitlog/ folder and no segment files (20-digit names) in it"
                )
            out.extend(files)
        elif os.path.isfile(path):
            out.append(path)
        else:
            raise SegmentPathError(f"{path}: no such file or directory")
    return out


def _sort_key(path: str) -> tuple[int, int, str]:
    name = os.path.basename(path)
    if _is_segment_name(name):
        return (0, int(name), path)
    return (1, 0, path)


def _starts_with_data(path: str) -> bool:
    """Whether a segment's first header is non-zero (a spare segment created ahead of need is all zeros)."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError:
        return True  # let the scan report it
    return bool(head.strip(b"\0"))


_EXTENT_BLOCK = 64 * 1024
_SEEK_HOLE: int | None = getattr(os, "SEEK_HOLE", None)


def written_extent(path: str, size: int | None = None) -> int:
    """Where the written data of a segment ends, estimated cheaply: the end of the last non-zero 64 KiB
    block, found by bisection (after skipping the trailing hole of a sparse file with SEEK_DATA/SEEK_HOLE).

    A preallocated segment is data followed by zeros; the bisection assumes that shape, so a long run of
    zeros inside the data can make the estimate low. ``plan_splits`` only uses it to place split
    boundaries: its last split of a file always reaches the end of the file, so no record is missed.
    """
    if size is None:
        size = os.path.getsize(path)
    if size <= 0:
        return 0
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return size  # let the scan report it
    try:
        hi = size
        if _SEEK_DATA is not None and _SEEK_HOLE is not None:
            end = 0
            pos = 0
            try:
                while pos < size:
                    data = os.lseek(fd, pos, _SEEK_DATA)
                    end = pos = os.lseek(fd, data, _SEEK_HOLE)
            except OSError as exc:
                if exc.errno != errno.ENXIO:  # ENXIO: no data after pos; anything else: no hole support
                    end = size
            hi = min(end, size)
        zeros = bytes(_EXTENT_BLOCK)
        lo_blk, hi_blk = 0, -(-hi // _EXTENT_BLOCK)  # blocks >= hi_blk are known to be zero (or absent)
        while lo_blk < hi_blk:
            mid = (lo_blk + hi_blk) // 2
            chunk = os.pread(fd, _EXTENT_BLOCK, mid * _EXTENT_BLOCK)
            if chunk == zeros[: len(chunk)]:
                hi_blk = mid
            else:
                lo_blk = mid + 1
        return min(lo_blk * _EXTENT_BLOCK, size)
    finally:
        os.close(fd)


def ordered_segments(paths: Iterable[str]) -> list[str]:
    """``paths`` without repeats, in the order the readers read them: by base offset (20-digit names), then by path."""
    return sorted(dict.fromkeys(paths), key=_sort_key)


def plan_splits(paths: Iterable[str], split_size: int = DEFAULT_SPLIT_SIZE) -> list[SegmentSplit]:
    """Cut the written part of each segment into ``split_size`` byte ranges; the last range of a file
    reaches the end of the file. Empty files get none; a file with no data gets one range.

    Planning by data, not by file size: a preallocated 1 GiB segment holding 20 MB of records gives about
    20 MB / ``split_size`` ranges, not 1 GiB / ``split_size`` (``written_extent``). The last range walks
    the record chain to the end of the data and checks the zeros after it as before.

    Files are ordered by base offset (20-digit names) and then by path. ``last_segment`` is set on the
    last file whose first header is not zero and on any (empty, spare) file after it: the data of the
    log ends there, so a malformed tail there is a torn tail.
    """
    if split_size <= 0:
        raise ValueError(f"split size must be positive, got {split_size}")
    files = ordered_segments(paths)
    bases = []
    for p in files:
        name = os.path.basename(p)
        bases.append(int(name) if _is_segment_name(name) else None)
    last_data = len(files) - 1
    while last_data > 0 and not _starts_with_data(files[last_data]):
        last_data -= 1
    splits: list[SegmentSplit] = []
    for i, path in enumerate(files):
        size = os.path.getsize(path)
        base = bases[i]
        nxt = bases[i + 1] if i + 1 < len(files) else None
        seg_size = nxt - base if base is not None and nxt is not None and nxt > base else None
        last = i >= last_data
        if size <= 0:
            continue
        extent = max(written_extent(path, size), 1)
        starts = list(range(0, extent, split_size))
        for k, start in enumerate(starts):
            end = size if k == len(starts) - 1 else start + split_size
            splits.append(SegmentSplit(path, start, end, size, base, seg_size, last))
    return splits


# ---------------------------------------------------------------------------------------------------
# Scanning (worker side)


def _format_host(raw: bytes) -> str:
    if len(raw) == 8:
        return f"{socket.inet_ntop(socket.AF_INET, raw[:4])}:{_I32.unpack_from(raw, 4)[0]}"
    return f"[{socket.inet_ntop(socket.AF_INET6, raw[:16])}]:{_I32.unpack_from(raw, 16)[0]}"


class SplitScanner:
    """Reads the records a split owns. Use ``batches()``; the file is opened and closed inside it."""

    def __init__(
        self,
        split: SegmentSplit,
        *,
        include_body: bool = False,
        batch_size: int = DEFAULT_BATCH_SIZE,
        max_record_size: int = DEFAULT_MAX_RECORD_SIZE,
        window: int = DEFAULT_WINDOW,
    ) -> None:
        if batch_size <= 0:
            raise ValueError(f"batch size must be positive, got {batch_size}")
        self.split = split
        self.include_body = include_body
        self.batch_size = batch_size
        self.max_record_size = max(max_record_size, MIN_RECORD_SIZE)
        self.window = max(window, 64 * 1024)
        self._fd = -1
        self._size = split.file_size
        self._hosts: dict[bytes, str] = {}
        self._store_hosts: dict[bytes, tuple[str, str]] = {}  # raw -> (ip:port, hex for the msg id)

    # -- low-level reads -------------------------------------------------------------------------

    def _pread(self, n: int, pos: int) -> bytes:
        n = min(n, self._size - pos)
        if n <= 0:
            return b""
        return os.pread(self._fd, n, pos)

    def _next_data(self, pos: int) -> int | None:
        """The first offset >= pos that may hold non-zero bytes, None if the rest is a hole (sparse)."""
        if _SEEK_DATA is None:
            return pos
        try:
            return os.lseek(self._fd, pos, _SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:
                return None
            return pos  # SEEK_DATA unsupported here: assume data

    def _plausible(self, p: int) -> bool:
        """Could a record (or the end-of-segment filler) start at ``p``? See the module docstring."""
        hdr = self._pread(36, p)
        if len(hdr) < 8:
            return False
        size, magic = _SIZE_MAGIC.unpack_from(hdr)
        if magic == BLANK_MAGIC_CODE:
            return size >= END_FILE_MIN_BLANK_LENGTH and (
                p + size == self._size or p + size == self.split.segment_size
            )
        if magic != MESSAGE_MAGIC_CODE or size < MIN_RECORD_SIZE or size > self.max_record_size:
            return False
        if len(hdr) < 36 or p + size > self._size:
            return False
        base = self.split.base_offset
        if base is not None and _I64.unpack_from(hdr, 28)[0] != base + p:
            return False
        n = p + size
        if n == self._size:
            return True
        nxt = self._pread(8, n)
        if len(nxt) < 8:
            return not nxt.strip(b"\0")
        nsize, nmagic = _SIZE_MAGIC.unpack_from(nxt)
        return nmagic in (MESSAGE_MAGIC_CODE, BLANK_MAGIC_CODE) or (nsize == 0 and nmagic == 0)

    def _sync(self, lo: int, hi: int | None = None) -> int | None:
        """The first plausible record start in ``[lo, hi)`` (``hi`` None = end of file), or None."""
        limit = self._size if hi is None else min(hi, self._size)
        chunk_len = self.window
        w = max(lo, 0)
        while w < limit:
            data = self._next_data(w + 4)
            if data is None:
                return None  # only a hole follows: no magic can be there
            # A candidate p has its (non-zero) magic at p+4: skip the hole before ``data``.
            w = max(w, data - 4)
            if w >= limit:
                break
            wend = min(w + chunk_len, limit)
            # Candidate p has its magic at p+4; read the bytes holding magics for p in [w, wend).
            chunk = self._pread(wend - w + 7, w + 4)
            span = wend - w
            i1 = chunk.find(_MSG_MAGIC_BYTES)
            i2 = chunk.find(_BLANK_MAGIC_BYTES)
            while True:
                if i1 < 0 and i2 < 0:
                    break
                if i2 < 0 or (0 <= i1 < i2):
                    i = i1
                    i1 = chunk.find(_MSG_MAGIC_BYTES, i + 1)
                else:
                    i = i2
                    i2 = chunk.find(_BLANK_MAGIC_BYTES, i + 1)
                if i >= span:
                    break
                if self._plausible(w + i):
                    return w + i
            w = wend
        return None

    def _data_end(self, lo: int) -> int:
        """End of the last non-zero byte in ``[lo, file end)`` (``lo`` if there is none)."""
        last = lo
        w = lo
        zeros = bytes(self.window)
        while w < self._size:
            data = self._next_data(w)
            if data is None or data >= self._size:
                break
            w = max(w, data - data % 4096)
            chunk = self._pread(self.window, w)
            if not chunk:
                break
            if chunk != zeros[: len(chunk)]:
                last = w + len(chunk.rstrip(b"\0"))
            w += len(chunk)
        return last

    # -- the walk --------------------------------------------------------------------------------

    def batches(self) -> Iterator[RowBatch]:
        """Yield RowBatches of at most ``batch_size`` rows covering the records this split owns."""
        split = self.split
        if split.start >= split.end or self._size <= 0:
            return
        try:
            self._fd = os.open(split.path, os.O_RDONLY)
        except OSError as exc:
            raise SegmentPathError(f"{split.path}: cannot open segment: {exc.strerror}") from None
        try:
            self._size = min(split.file_size, os.fstat(self._fd).st_size)
            yield from self._walk()
        finally:
            os.close(self._fd)
            self._fd = -1

    def _walk(
        self,
        start: int | None = None,
        owned_end: int | None = None,
        end_checked: bool = False,
        one_item: bool = False,
    ) -> Generator[RowBatch, None, tuple[int | None, int, bool]]:
        """Walk the record chain; yield RowBatches. Returns ``(next position or None, owned_end, end_checked)``.

        By default it walks the whole split. The vectorised reader (``spark_jobs.vectorized``) calls it with
        ``start`` (a position on the chain), the ``owned_end`` state it already computed and ``one_item``:
        then it handles exactly one record or malformed region and returns where the chain resumes (None
        when nothing follows in this split), so the fast path can take over again.
        """
        split = self.split
        size_f = self._size
        pos: int | None = start
        if pos is None:
            pos = 0 if split.start == 0 else self._sync(split.start, split.end)
        if pos is None:
            return None, split.end, end_checked
        if owned_end is None:
            owned_end = split.end
        segment = split.segment
        include_body = self.include_body
        batch_size = self.batch_size
        hosts = self._hosts
        store_hosts = self._store_hosts
        fixed_v4 = _FIXED_V4
        i16 = _I16
        crc32 = zlib.crc32
        msg_magic = MESSAGE_MAGIC_CODE

        batch = RowBatch()
        rows = batch.rows
        poffs = batch.prop_offsets
        pkeys = batch.prop_keys
        pvals = batch.prop_values
        pnull = batch.prop_null

        buf = b""
        mv = memoryview(buf)
        known_next: int | None = -1  # a resync point already computed for the current position
        wstart = 0
        wend = 0

        while True:
            if pos >= owned_end:
                if end_checked:
                    break
                end_checked = True
                nxt = self._sync(split.end, None)
                owned_end = size_f if nxt is None else nxt
                if pos >= owned_end:
                    break
                continue
            if pos >= size_f:
                break
            # Make sure the window holds at least the fixed part of the record at pos.
            if pos < wstart or (pos + 256 > wend and wend < size_f):
                mv.release()
                buf = self._pread(self.window, pos)
                mv = memoryview(buf)
                wstart, wend = pos, pos + len(buf)
            o = pos - wstart
            avail = wend - pos
            if avail < 8:
                if not buf[o:].strip(b"\0"):
                    break  # a few zero bytes at the very end: end of data
                kind, detail = "bad_size", f"{avail} stray bytes at the end of the segment"
            else:
                size, magic = _SIZE_MAGIC.unpack_from(buf, o)
                if magic == msg_magic and size >= MIN_RECORD_SIZE:
                    if pos + size > size_f:
                        kind = "overrun"
                        detail = f"total size {size} at {pos} runs {pos + size - size_f} bytes past the file end"
                    else:
                        if pos + size > wend:
                            mv.release()
                            buf = self._pread(max(self.window, size), pos)
                            mv = memoryview(buf)
                            wstart, wend = pos, pos + len(buf)
                            o = 0
                        end = o + size
                        try:
                            (
                                _s, _m, crc, qid, flag, qoff, phys, sysflag, born_ts,
                                born_raw, store_ts, store_raw, reconsume, prepared, body_len,
                            ) = fixed_v4.unpack_from(buf, o)
                            if sysflag & 0x30:
                                st = _FIXED[(bool(sysflag & SYSFLAG_BORNHOST_V6), bool(sysflag & SYSFLAG_STOREHOST_V6))]
                                (
                                    _s, _m, crc, qid, flag, qoff, phys, sysflag, born_ts,
                                    born_raw, store_ts, store_raw, reconsume, prepared, body_len,
                                ) = st.unpack_from(buf, o)
                                b0 = o + st.size
                            else:
                                b0 = o + 88
                            b1 = b0 + body_len
                            if body_len < 0 or b1 + 3 > end:
                                raise ValueError(f"body length {body_len} overruns the record")
                            tlen = buf[b1]
                            t1 = b1 + 1 + tlen
                            if t1 + 2 > end:
                                raise ValueError(f"topic length {tlen} overruns the record")
                            (plen,) = i16.unpack_from(buf, t1)
                            if plen < 0 or t1 + 2 + plen != end:
                                raise ValueError(
                                    f"field lengths add up to {t1 + 2 + plen - o} bytes, total size says {size}"
                                )
                            topic = buf[b1 + 1 : t1].decode("utf-8", "replace")
                            pstr = buf[t1 + 2 : end].decode("utf-8", "replace")
                        except (ValueError, struct.error, IndexError) as exc:
                            kind, detail = "bad_fields", f"record at {pos} (size {size}): {exc}"
                        else:
                            crc_ok = (crc32(mv[b0:b1]) & 0x7FFFFFFF) == crc
                            keys = tags = None
                            if pstr:
                                props = {}
                                for item in pstr.split(_PROP_SEP):
                                    k, sep, v = item.partition(_NAME_SEP)
                                    if sep:
                                        props[k] = v
                                pkeys.extend(props)
                                pvals.extend(props.values())
                                keys = props.get("KEYS")
                                tags = props.get("TAGS")
                            poffs.append(len(pkeys))
                            pnull.append(False)
                            bh = hosts.get(born_raw)
                            if bh is None:
                                bh = hosts[born_raw] = _format_host(born_raw)
                            sh_hx = store_hosts.get(store_raw)
                            if sh_hx is None:
                                sh_hx = store_hosts[store_raw] = (_format_host(store_raw), store_raw.hex().upper())
                            rows.append((
                                segment, pos, phys, size, magic, crc, crc_ok, qid, flag, qoff, sysflag,
                                born_ts, bh, store_ts, sh_hx[0], reconsume, prepared, topic, keys, tags, body_len,
                                f"{sh_hx[1]}{phys & 0xFFFFFFFFFFFFFFFF:016X}",
                                bytes(mv[b0:b1]) if include_body else None,
                                False, None,
                            ))
                            pos += size
                            if one_item:
                                mv.release()
                                yield batch
                                return pos, owned_end, end_checked
                            if len(rows) >= batch_size:
                                yield batch
                                batch = RowBatch()
                                rows, poffs, pkeys, pvals, pnull = (
                                    batch.rows, batch.prop_offsets, batch.prop_keys, batch.prop_values,
                                    batch.prop_null,
                                )
                            continue
                elif magic == msg_magic:
                    kind, detail = "bad_size", f"total size {size} at {pos} is below the {MIN_RECORD_SIZE}-byte minimum"
                elif magic == BLANK_MAGIC_CODE:
                    reach = pos + size
                    if size >= END_FILE_MIN_BLANK_LENGTH and (
                        reach == size_f
                        or reach == split.segment_size
                        or (split.segment_size is None and reach > size_f)
                    ):
                        break  # the end-of-segment filler: no more records in this file
                    kind = "bad_filler"
                    detail = f"blank filler at {pos} with size {size} ends at {reach}, not at the segment end"
                elif size == 0 and magic == 0:
                    known_next = self._sync(pos + 1, None)
                    if known_next is None:
                        data_end = self._data_end(pos)
                        if data_end <= pos:
                            break  # zeros up to the end: the unwritten tail
                        kind, detail = "bad_fields", f"non-zero bytes after the end of data at {pos}"
                    else:
                        kind, detail = "zero_gap", f"{known_next - pos} zero bytes at {pos} with records after them"
                else:
                    kind, detail = "bad_magic", f"magic {magic:#010x} at {pos} is neither message nor blank magic"
            # Malformed: report the region once, then resynchronise on the next plausible record.
            nxt = known_next if known_next != -1 else self._sync(pos + 1, None)
            known_next = -1
            if nxt is not None:
                region_end = nxt
            elif kind == "overrun":
                region_end = size_f
            else:
                region_end = max(self._data_end(pos), min(pos + 8, size_f))
            magic_val = _SIZE_MAGIC.unpack_from(buf, o)[1] if avail >= 8 else None
            self._append_malformed(batch, pos, region_end, kind, detail, nxt is None, magic_val)
            if one_item:
                mv.release()
                yield batch
                return nxt, owned_end, end_checked
            if len(rows) >= batch_size:
                yield batch
                batch = RowBatch()
                rows, poffs, pkeys, pvals, pnull = (
                    batch.rows, batch.prop_offsets, batch.prop_keys, batch.prop_values, batch.prop_null,
                )
            if nxt is None:
                break
            pos = nxt
        mv.release()
        if batch.rows:
            yield batch
        return None, owned_end, end_checked

    def _append_malformed(
        self,
        batch: RowBatch,
        pos: int,
        region_end: int,
        kind: str,
        detail: str,
        to_end: bool,
        magic: int | None,
    ) -> None:
        """Append the row for a malformed region ``[pos, region_end)``."""
        split = self.split
        if to_end and split.last_segment:
            detail = f"{kind}: {detail}; nothing valid follows up to the end of the last segment"
            kind = "torn_tail"
        elif to_end:
            detail = f"{detail}; nothing valid follows up to the end of the segment"
        base = split.base_offset
        batch.rows.append((
            split.segment, pos, None if base is None else base + pos, region_end - pos, magic,
            None, None, None, None, None, None, None, None, None, None, None, None, None, None, None,
            None, None, None, True, f"{kind}: {detail}",
        ))
        batch.prop_offsets.append(len(batch.prop_keys))
        batch.prop_null.append(True)


def scan_split(split: SegmentSplit, **kwargs: object) -> Iterator[RowBatch]:
    """Shorthand for ``SplitScanner(split, **kwargs).batches()``."""
    return SplitScanner(split, **kwargs).batches()  # type: ignore[arg-type]


def scan_paths(
    spec: str | Sequence[str],
    *,
    split_size: int | None = None,
    include_body: bool = False,
    batch_size: int = DEFAULT_BATCH_SIZE,
) -> Iterator[RowBatch]:
    """The single-process reader: every split of every segment in order (whole files by default)."""
    files = resolve_segments(spec)
    size = split_size or max([os.path.getsize(f) for f in files] + [1])
    for split in plan_splits(files, size):
        yield from SplitScanner(split, include_body=include_body, batch_size=batch_size).batches()
