"""Record starts from the consume queues, so the vectorised reader need not walk the commit log record by record.

Every message record that takes a queue offset has a consume-queue unit (commit-log offset, size, tag hash):
merged over all queues of all topics, the units of one segment list the record starts of that segment in order.
:class:`ConsumeQueuePositions` loads them for a byte range of one segment (a chunk at a time, so memory is
bounded by the chunk, not by the segment), sorted and without duplicates. The reader still validates every
position against the bytes (size field, magic, and that each record ends where the next one starts): the units
only propose where records are, the commit log decides. Where they disagree or say nothing (no unit for a
prepared transaction's half message, a filler at a segment's end, a damaged region, a store without
consume queues), the reader walks the size fields as before.

Pure numpy over memory-mapped unit files; no pyspark.
"""

from __future__ import annotations

import bisect
import mmap
import os
from dataclasses import dataclass

import numpy as np

from trimq.spark_jobs.parser import SegmentPathError

CQ_UNIT_SIZE = 20
#: Commit-log bytes whose record starts are loaded at once (64 MiB of records: at most ~740k starts, ~6 MB).
DEFAULT_CHUNK = 64 << 20


@dataclass(frozen=True)
class CqFile:
    path: str
    topic: str
    queue_id: int
    base: int  # byte offset of the file's first unit in the queue's logical file sequence


def list_consume_queue_files(path: str) -> list[CqFile]:
    """The unit files under a store dir's ``consumequeue/`` (or a consumequeue dir itself)."""
    root = os.path.abspath(os.path.expanduser(path))
    cq = os.path.join(root, "consumequeue")
    if os.path.isdir(cq):
        root = cq
    if not os.path.isdir(root):
        raise SegmentPathError(f"{root}: no consumequeue directory")
    out: list[CqFile] = []
    for topic in sorted(os.listdir(root)):
        tdir = os.path.join(root, topic)
        if not os.path.isdir(tdir):
            continue
        for qname in sorted(os.listdir(tdir)):
            qdir = os.path.join(tdir, qname)
            if not (qname.isdigit() and os.path.isdir(qdir)):
                continue
            for fname in sorted(os.listdir(qdir)):
                if len(fname) == 20 and fname.isdigit():
                    out.append(CqFile(os.path.join(qdir, fname), topic, int(qname), int(fname)))
    return out


@dataclass
class _UnitFile:
    path: str
    written: int  # units before the zero-filled tail
    first: int  # commit-log offset of the first written unit
    last: int  # ... and of the last


def consume_queue_root(segment_path: str) -> str | None:
    """``<store>/consumequeue`` for a segment at ``<store>/commitlog/<name>``, None when there is none."""
    commitlog = os.path.dirname(os.path.abspath(segment_path))
    if os.path.basename(commitlog) != "commitlog":
        return None
    root = os.path.join(os.path.dirname(commitlog), "consumequeue")
    return root if os.path.isdir(root) else None


def _offsets_view(mm: mmap.mmap | bytes, count: int) -> np.ndarray:
    """The commit-log offset (first 8 bytes, big-endian) of each of ``count`` units, as a strided view. Searched
    with ``bisect`` (element reads only: ``np.searchsorted`` on a big-endian view would convert the whole file)."""
    return np.ndarray((count,), dtype=">i8", buffer=mm, strides=(CQ_UNIT_SIZE,))


def _written_units(mm: mmap.mmap, total: int) -> int:
    """Units before the zero-filled tail (offset and size both zero): a preallocated file is written from the front."""
    sizes = np.ndarray((total,), dtype=">i4", buffer=mm, offset=8, strides=(CQ_UNIT_SIZE,))
    offs = _offsets_view(mm, total)
    return bisect.bisect_left(range(total), True, key=lambda i: offs[i] == 0 and sizes[i] == 0)


_DESCRIBED: dict[tuple[str, int, int], _UnitFile | None] = {}


class ConsumeQueuePositions:
    """Record starts (file positions) of one segment proposed by the consume queues under ``root``.

    ``segment_base`` is the segment's commit-log base offset (its 20-digit name). Use :meth:`at_or_after`.
    """

    def __init__(self, root: str, segment_base: int, segment_end: int, *, chunk: int = DEFAULT_CHUNK) -> None:
        self.base = segment_base
        self.end = segment_end  # file positions at or beyond it are not this segment's
        if chunk <= 0:
            raise ValueError(f"chunk must be positive, got {chunk}")
        self.chunk = chunk
        self._files = self._scan(root)
        self._lo = self._hi = -1  # the loaded chunk: file positions [lo, hi)
        self._pos = np.empty(0, dtype=np.int64)

    def _scan(self, root: str) -> list[_UnitFile]:
        lo_abs, hi_abs = self.base, self.base + self.end
        found = (self._describe(f.path) for f in list_consume_queue_files(root))
        return [f for f in found if f is not None and f.last >= lo_abs and f.first < hi_abs]

    @staticmethod
    def _describe(path: str) -> _UnitFile | None:
        try:
            st = os.stat(path)
        except OSError:
            return None
        key = (path, st.st_size, st.st_mtime_ns)
        if key in _DESCRIBED:  # a Python worker reads many splits: describe each unit file once
            return _DESCRIBED[key]
        if len(_DESCRIBED) > 100_000:
            _DESCRIBED.clear()
        _DESCRIBED[key] = found = ConsumeQueuePositions._read_description(path)
        return found

    @staticmethod
    def _read_description(path: str) -> _UnitFile | None:
        try:
            with open(path, "rb") as fh:
                total = os.fstat(fh.fileno()).st_size // CQ_UNIT_SIZE
                if total == 0:
                    return None
                with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                    n = _written_units(mm, total)
                    if n == 0:
                        return None
                    offs = _offsets_view(mm, n)
                    first, last = int(offs[0]), int(offs[n - 1])
        except (OSError, ValueError):
            return None  # unreadable: the walk covers what it would have proposed
        return _UnitFile(path, n, first, last)

    def _load(self, lo: int) -> None:
        """Load the starts in file positions ``[lo, lo + chunk)``."""
        hi = min(lo + self.chunk, self.end)
        lo_abs, hi_abs = self.base + lo, self.base + hi
        parts = []
        for f in self._files:
            if f.last < lo_abs or f.first >= hi_abs:
                continue
            try:
                with open(f.path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                    offs = _offsets_view(mm, f.written)
                    # A queue's units rise with the commit log (a damaged file may not: then the search finds less,
                    # and the walk covers the rest).
                    i0, i1 = bisect.bisect_left(offs, lo_abs), bisect.bisect_left(offs, hi_abs)
                    if i1 > i0:
                        parts.append(offs[i0:i1].astype(np.int64))
            except (OSError, ValueError):
                continue
        if parts:
            pos = np.sort(np.concatenate(parts)) - self.base  # (np.unique hashes: slower than a sort here)
            if len(pos) > 1:
                pos = pos[np.concatenate(([True], pos[1:] != pos[:-1]))]
        else:
            pos = np.empty(0, dtype=np.int64)
        self._pos = pos[(pos >= lo) & (pos < hi)]
        self._lo, self._hi = lo, hi

    def _loaded(self, pos: int) -> np.ndarray:
        """The starts of the chunk holding ``pos``, loading it (from ``pos`` on) when it is not the loaded one."""
        if not self._lo <= pos < self._hi:
            self._load(pos)
        return self._pos

    def at_or_after(self, pos: int, limit: int) -> np.ndarray:
        """The proposed starts in ``[pos, min(limit, end of the loaded chunk))``, loading the chunk holding ``pos``
        when needed. Empty when none; the first element is ``pos`` itself when the units propose it."""
        arr = self._loaded(pos)
        i = int(np.searchsorted(arr, pos))
        j = int(np.searchsorted(arr, limit)) if limit < self._hi else len(arr)
        return arr[i:j]

    def next_after(self, pos: int) -> int | None:
        """The first proposed start after ``pos`` within the loaded chunk (None: none there)."""
        arr = self._loaded(pos)
        i = int(np.searchsorted(arr, pos, side="right"))
        return int(arr[i]) if i < len(arr) else None
