"""Consume queues: per topic/queue index files of RocketMQ's 20-byte units (docs/STORAGE.md).

A unit is ``commit-log offset (int64) | record size (int32) | tags code (int64)``, big-endian; the unit for
queue offset ``k`` lives at byte ``k * 20`` of the queue's logical byte space. That space is cut into files
of ``file_size`` bytes named by their first logical byte offset (20 digits), like RocketMQ's. As in RocketMQ,
every file has exactly ``file_size`` bytes (RocketMQ's MappedFileQueue.load refuses any other length): a new
file is created at its full size as a sparse file (``ftruncate``: no block is written), and the zero tail is
unused space. Loading finds the end of the data with RocketMQ's rule (``ConsumeQueue.recover``): the first
unit without ``offset >= 0 and size > 0`` ends the queue. Shorter files of older trimq stores are extended
on load.

Blocking file I/O only (``pwrite``/``pread``/``fdatasync``), no trio: the store calls ``append`` and the
read methods inline (they hit the page cache) and ``flush`` from a worker thread.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import struct
from pathlib import Path

__all__ = [
    "BLANK_UNIT",
    "CQ_STORE_UNIT_SIZE",
    "UNIT",
    "ConsumeQueue",
    "first_invalid_unit",
    "tags_string_to_tags_code",
]

CQ_STORE_UNIT_SIZE = 20
UNIT = struct.Struct(">qiq")
#: RocketMQ's ``ConsumeQueue.fillPreBlank`` unit: stands for a message that is no longer in the commit log
#: (offset 0, size Integer.MAX_VALUE), so the units after it stay reachable by the recovery rule.
BLANK_UNIT = UNIT.pack(0, 0x7FFFFFFF, 0)
_FILE_NAME = re.compile(r"^\d{20}$")
_SIGN_BIT = re.compile(rb"[\x80-\xff]")
_SCAN_CHUNK = CQ_STORE_UNIT_SIZE * 13_107  # ~256 KiB of units per read while looking for the end


@functools.lru_cache(maxsize=4096)
def tags_string_to_tags_code(tags: str | None) -> int:
    """RocketMQ's ``MessageExtBrokerInner.tagsString2tagsCode``: Java ``String.hashCode()`` of the TAGS
    property (computed over UTF-16 code units, as a signed 32-bit int); 0 when there are no tags."""
    if not tags:
        return 0
    h = 0
    data = tags.encode("utf-16-be", "surrogatepass")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - 0x100000000 if h & 0x80000000 else h


def file_name(offset: int) -> str:
    """RocketMQ's ``UtilAll.offset2FileName``: the offset zero-padded to 20 digits."""
    return f"{offset:020d}"


def first_invalid_unit(data: bytes) -> int | None:
    """Index of the first whole unit of ``data`` that fails RocketMQ's recovery rule (``offset >= 0 and
    size > 0``; an all-zero unit fails it), or None when every unit passes.

    O(len(data)) in C: byte-strided slices pick the sign bytes of the offsets and sizes and the four bytes
    of each size, so a 6 MB file is checked without a Python loop per unit.
    """
    n = len(data) // CQ_STORE_UNIT_SIZE
    if n == 0:
        return None
    data = data[: n * CQ_STORE_UNIT_SIZE]
    first = n
    for sign in (data[0::CQ_STORE_UNIT_SIZE], data[8::CQ_STORE_UNIT_SIZE]):  # offset < 0, size < 0
        m = _SIGN_BIT.search(sign)
        if m is not None:
            first = min(first, m.start())
    # size == 0: the OR of the size's four bytes is zero
    ored = 0
    for k in range(8, 12):
        ored |= int.from_bytes(data[k::CQ_STORE_UNIT_SIZE], "big")
    zero = ored.to_bytes(n, "big").find(0)
    if zero != -1:
        first = min(first, zero)
    return first if first < n else None


class ConsumeQueue:
    """The index of one queue of one topic.

    ``min_offset`` and ``max_offset`` are logical queue offsets: units ``[min_offset, max_offset)`` are
    readable (``max_offset`` is the offset the next message gets). ``min_offset`` follows the commit log:
    the first unit whose record is still there (``correct_min_offset``). Appends must come in order; the
    store's single writer guarantees it.
    """

    def __init__(self, directory: str | os.PathLike[str], topic: str, queue_id: int, file_size: int) -> None:
        if file_size % CQ_STORE_UNIT_SIZE or file_size <= 0:
            raise ValueError(f"consume-queue file size {file_size} is not a positive multiple of {CQ_STORE_UNIT_SIZE}")
        self.directory = Path(directory)
        self.topic = topic
        self.queue_id = queue_id
        self.file_size = file_size
        self.min_offset = 0
        self.max_offset = 0
        self._files: list[int] = []  # logical byte offsets of the files, ascending
        self._fds: dict[int, int] = {}
        self._dirty: set[int] = set()  # files written since the last flush

    def __repr__(self) -> str:
        return f"<ConsumeQueue {self.topic}/{self.queue_id} [{self.min_offset}, {self.max_offset})>"

    # -- loading ----------------------------------------------------------------------------------------
    def load(self) -> None:
        """Read the directory: find the files, pre-size short ones, find the end of the units.

        Files must be contiguous; a gap drops every file after it (the store rebuilds the units from the
        commit log). A file that is not the last one is taken as full when its last unit is valid (RocketMQ
        checks only its last three files; reading every unit of every file would cost 6 MB per file). The
        first invalid unit ends the queue: everything after it is zeroed and later files are deleted, so no
        stale unit can come back once new units fill the gap.
        """
        self.close()
        self._files = []
        self.min_offset = self.max_offset = 0
        if not self.directory.is_dir():
            return
        fs = self.file_size
        starts = sorted(int(p.name) for p in self.directory.iterdir() if _FILE_NAME.match(p.name))
        for i, start in enumerate(starts):
            if start % fs or (self._files and start != self._files[-1] + fs):
                for later in starts[i:]:
                    (self.directory / file_name(later)).unlink(missing_ok=True)
                break
            path = self.directory / file_name(start)
            size = path.stat().st_size
            if size != fs:
                # Older trimq files grew unit by unit (a torn unit at the end is cut); RocketMQ wants every
                # file at its full size. Extending adds zero units, i.e. unused space.
                os.truncate(path, min(size - size % CQ_STORE_UNIT_SIZE, fs))
                os.truncate(path, fs)
            self._files.append(start)
        if not self._files:
            return
        self.min_offset = self._files[0] // CQ_STORE_UNIT_SIZE
        for idx, start in enumerate(self._files):
            if idx < len(self._files) - 1:
                rfd = os.open(self.directory / file_name(start), os.O_RDONLY)
                try:
                    tail = os.pread(rfd, CQ_STORE_UNIT_SIZE, fs - CQ_STORE_UNIT_SIZE)
                finally:
                    os.close(rfd)
                if len(tail) == CQ_STORE_UNIT_SIZE and first_invalid_unit(tail) is None:
                    continue  # full
            fd = self._fd(start, create=False)
            assert fd is not None
            end = _find_end(fd, fs)
            if end < fs:
                os.ftruncate(fd, end)  # zero whatever follows the end (sparse again), keep the full size
                os.ftruncate(fd, fs)
            for later in self._files[idx + 1 :]:
                self._drop_file(later)
            self.max_offset = (start + end) // CQ_STORE_UNIT_SIZE
            return

    # -- writing ----------------------------------------------------------------------------------------
    def append(self, offset: int, units: bytes) -> None:
        """Write ``units`` (a whole number of 20-byte units) at queue offset ``offset`` (== ``max_offset``)."""
        if offset != self.max_offset:
            raise ValueError(f"{self}: append at {offset}, expected {self.max_offset}")
        pos = offset * CQ_STORE_UNIT_SIZE
        fs = self.file_size
        start = pos - pos % fs
        if pos + len(units) <= start + fs:  # the common case: all in the current file
            fd = self._fds.get(start)
            if fd is None:
                fd = self._fd(start, create=True)
                assert fd is not None
            self._dirty.add(start)
            _pwrite_all(fd, units, pos - start)
            self.max_offset = offset + len(units) // CQ_STORE_UNIT_SIZE
            return
        view = memoryview(units)
        while view:
            start = pos - pos % self.file_size
            room = start + self.file_size - pos
            chunk = view[:room]
            fd = self._fd(start, create=True)
            assert fd is not None
            _pwrite_all(fd, chunk, pos - start)
            self._dirty.add(start)
            pos += len(chunk)
            view = view[len(chunk) :]
        self.max_offset = pos // CQ_STORE_UNIT_SIZE

    def fill_blank(self, until: int) -> int:
        """Make the next append land at queue offset ``until`` by writing BLANK_UNITs up to it (RocketMQ's
        ``fillPreBlank``); for recovery, when the records before ``until`` are gone from the commit log.

        A queue with no units starts at the file holding ``until`` instead of at its old end, so a lost queue
        of a cleaned log does not write blanks for every message ever deleted. Returns the blanks written.
        """
        if until <= self.max_offset:
            return 0
        if self.max_offset == self.min_offset:
            pos = until * CQ_STORE_UNIT_SIZE
            file_start = (pos - pos % self.file_size) // CQ_STORE_UNIT_SIZE
            if file_start > self.max_offset:
                for start in list(self._files):
                    self._drop_file(start)
                self.min_offset = self.max_offset = file_start
        n = until - self.max_offset
        self.append(self.max_offset, BLANK_UNIT * n)
        return n

    def truncate(self, new_max: int) -> None:
        """Forget units at ``new_max`` and after (recovery): they are zeroed, files wholly past are deleted."""
        new_max = max(new_max, self.min_offset)
        if new_max >= self.max_offset:
            return
        pos = new_max * CQ_STORE_UNIT_SIZE
        first = self._files[0] if self._files else 0
        for start in list(self._files):
            if start >= pos and start != first:
                self._drop_file(start)  # wholly past the new end
            elif pos < start + self.file_size:
                path = self.directory / file_name(start)
                os.truncate(path, max(0, pos - start))
                os.truncate(path, self.file_size)
                self._dirty.add(start)
        self.max_offset = new_max

    def correct_min_offset(self, min_phys_offset: int) -> None:
        """RocketMQ's ``correctMinOffset``: ``min_offset`` becomes the first unit whose record starts at or
        after ``min_phys_offset`` (the commit log's first offset), or ``max_offset`` when none does.

        Units point at increasing log offsets, so this is a binary search; it never moves ``min_offset``
        back. (RocketMQ looks only in the first file and keeps the old value when no unit there qualifies.)
        """
        lo, hi = self.min_offset, self.max_offset
        first = self.get_unit(lo)
        if first is not None and first[0] >= min_phys_offset and first != (0, 0x7FFFFFFF, 0):
            return  # the common case on every pass: nothing of this queue was deleted
        while lo < hi:
            mid = (lo + hi) // 2
            unit = self.get_unit(mid)
            if unit is not None and unit[0] >= min_phys_offset and unit != (0, 0x7FFFFFFF, 0):
                hi = mid
            else:
                lo = mid + 1
        self.min_offset = lo

    def delete_expired_files(self, min_phys_offset: int) -> tuple[int, list[int]]:
        """RocketMQ's ``ConsumeQueue.deleteExpiredFile``: delete files, oldest first and never the last one,
        whose last unit points below ``min_phys_offset``; stop at the first that does not. Then
        ``correct_min_offset``.

        Returns ``(files deleted, their open file descriptors)``: the caller closes the descriptors once no
        flush thread can be using them (the files themselves are already unlinked).
        """
        deleted = 0
        fds: list[int] = []
        while len(self._files) > 1:
            start = self._files[0]
            fd = self._fd(start, create=False)
            tail = os.pread(fd, CQ_STORE_UNIT_SIZE, self.file_size - CQ_STORE_UNIT_SIZE) if fd is not None else b""
            if len(tail) == CQ_STORE_UNIT_SIZE and UNIT.unpack(tail)[0] >= min_phys_offset:
                break
            fd = self._fds.pop(start, None)
            if fd is not None:
                fds.append(fd)
            self._dirty.discard(start)
            (self.directory / file_name(start)).unlink(missing_ok=True)
            self._files.pop(0)
            deleted += 1
        if self._files:
            self.min_offset = min(max(self.min_offset, self._files[0] // CQ_STORE_UNIT_SIZE), self.max_offset)
        self.correct_min_offset(min_phys_offset)
        return deleted, fds

    def flush(self) -> None:
        """fdatasync every file written since the last flush (blocking: call from a worker thread)."""
        dirty, self._dirty = self._dirty, set()
        for start in sorted(dirty):
            fd = self._fds.get(start)
            if fd is not None:
                os.fdatasync(fd)

    @property
    def dirty(self) -> bool:
        return bool(self._dirty)

    def take_dirty_fds(self) -> list[int]:
        """File descriptors written since the last call (the caller fsyncs them, e.g. in a worker thread)."""
        dirty, self._dirty = self._dirty, set()
        return [self._fds[s] for s in sorted(dirty) if s in self._fds]

    # -- reading ----------------------------------------------------------------------------------------
    def read_units(self, offset: int, max_units: int) -> bytes:
        """Up to ``max_units`` units from ``offset``, stopping at the end of the file holding ``offset``
        (RocketMQ's ``getIndexBuffer`` does the same) and at ``max_offset``. Empty outside the queue."""
        if offset < self.min_offset or offset >= self.max_offset or max_units <= 0:
            return b""
        pos = offset * CQ_STORE_UNIT_SIZE
        start = pos - pos % self.file_size
        end = min(start + self.file_size, self.max_offset * CQ_STORE_UNIT_SIZE, pos + max_units * CQ_STORE_UNIT_SIZE)
        fd = self._fd(start, create=False)
        if fd is None:
            return b""
        data = os.pread(fd, end - pos, pos - start)
        return data[: len(data) - len(data) % CQ_STORE_UNIT_SIZE]

    def get_unit(self, offset: int) -> tuple[int, int, int] | None:
        """``(commit-log offset, size, tags code)`` of the unit at ``offset``, or None."""
        data = self.read_units(offset, 1)
        if len(data) < CQ_STORE_UNIT_SIZE:
            return None
        phys, size, tags = UNIT.unpack(data)
        return phys, size, tags

    # -- internals --------------------------------------------------------------------------------------
    def _fd(self, start: int, *, create: bool) -> int | None:
        fd = self._fds.get(start)
        if fd is not None:
            return fd
        path = self.directory / file_name(start)
        if create:
            if start not in self._files:
                self.directory.mkdir(parents=True, exist_ok=True)
                self._files.append(start)
                self._files.sort()
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                if os.fstat(fd).st_size != self.file_size:
                    os.ftruncate(fd, self.file_size)  # full size at once, sparse: no block is written
            except OSError:
                os.close(fd)
                raise
        else:
            if start not in self._files:
                return None
            try:
                fd = os.open(path, os.O_RDWR)
            except FileNotFoundError:
                return None
        self._fds[start] = fd
        return fd

    def _drop_file(self, start: int) -> None:
        fd = self._fds.pop(start, None)
        if fd is not None:
            os.close(fd)
        self._dirty.discard(start)
        (self.directory / file_name(start)).unlink(missing_ok=True)
        self._files.remove(start)

    def close(self) -> None:
        for fd in self._fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()
        self._dirty.clear()

    @property
    def files(self) -> list[int]:
        """Logical byte offsets of the files, ascending."""
        return list(self._files)


def _find_end(fd: int, file_size: int) -> int:
    """Byte position (a multiple of 20) of the first unit of the file that fails the recovery rule, or
    ``file_size`` when all pass. Reads in chunks, so a nearly empty 6 MB file costs one 256 KiB read."""
    pos = 0
    while pos < file_size:
        data = os.pread(fd, min(_SCAN_CHUNK, file_size - pos), pos)
        k = first_invalid_unit(data)
        if k is not None:
            return pos + k * CQ_STORE_UNIT_SIZE
        whole = len(data) - len(data) % CQ_STORE_UNIT_SIZE
        if whole < min(_SCAN_CHUNK, file_size - pos):
            return pos + whole  # the file is shorter than it should be: what is missing is unused
        pos += whole
    return file_size


def _pwrite_all(fd: int, data: bytes | memoryview, pos: int) -> None:
    n = os.pwrite(fd, data, pos)
    if n == len(data):
        return
    view = memoryview(data)[n:]
    pos += n
    while view:
        n = os.pwrite(fd, view, pos)
        view = view[n:]
        pos += n
