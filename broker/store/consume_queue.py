"""Consume queues: per topic/queue index files of RocketMQ's 20-byte units (docs/STORAGE.md).

A unit is ``commit-log offset (int64) | record size (int32) | tags code (int64)``, big-endian; the unit for
queue offset ``k`` lives at byte ``k * 20`` of the queue's logical byte space. That space is cut into files
of ``file_size`` bytes named by their first logical byte offset (20 digits), like RocketMQ's. Unlike
RocketMQ's, the files are not preallocated: they grow as units are appended, so a file's length says how
many units it holds (a torn trailing unit is cut off on load).

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
    "CQ_STORE_UNIT_SIZE",
    "UNIT",
    "ConsumeQueue",
    "tags_string_to_tags_code",
]

CQ_STORE_UNIT_SIZE = 20
UNIT = struct.Struct(">qiq")
_FILE_NAME = re.compile(r"^\d{20}$")


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


class ConsumeQueue:
    """The index of one queue of one topic.

    ``min_offset`` and ``max_offset`` are logical queue offsets: units ``[min_offset, max_offset)`` exist
    (``max_offset`` is the offset the next message gets). Appends must come in order; the store's single
    writer guarantees it.
    """

    def __init__(self, directory: str | os.PathLike[str], topic: str, queue_id: int, file_size: int) -> None:
        if file_size % CQ_STORE_UNIT_SIZE:
            raise ValueError(f"consume-queue file size {file_size} is not a multiple of {CQ_STORE_UNIT_SIZE}")
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
        """Read the directory: find the files, cut a torn trailing unit, compute min/max offsets.

        Files must be contiguous; a gap drops every file after it (the store rebuilds the units from the
        commit log). Trailing all-zero units (a file length that reached disk before its data) are cut.
        """
        self.close()
        self._files = []
        if not self.directory.is_dir():
            self.min_offset = self.max_offset = 0
            return
        starts = sorted(int(p.name) for p in self.directory.iterdir() if _FILE_NAME.match(p.name))
        expected = None
        for i, start in enumerate(starts):
            if start % self.file_size or (expected is not None and start != expected):
                for later in starts[i:]:
                    (self.directory / file_name(later)).unlink(missing_ok=True)
                break
            self._files.append(start)
            path = self.directory / file_name(start)
            size = path.stat().st_size
            if size > self.file_size:
                os.truncate(path, self.file_size)
                size = self.file_size
            if size % CQ_STORE_UNIT_SIZE:
                size -= size % CQ_STORE_UNIT_SIZE
                os.truncate(path, size)
            expected = start + self.file_size
            if size < self.file_size:
                # Only the last file may be partly filled; anything after it would leave a hole.
                for later in starts[i + 1 :]:
                    (self.directory / file_name(later)).unlink(missing_ok=True)
                break
        if not self._files:
            self.min_offset = self.max_offset = 0
            return
        last = self._files[-1]
        last_size = (self.directory / file_name(last)).stat().st_size
        self.max_offset = (last + last_size) // CQ_STORE_UNIT_SIZE
        self.min_offset = self._files[0] // CQ_STORE_UNIT_SIZE
        # Drop trailing empty units: a valid unit always has a positive size.
        while self.max_offset > self.min_offset:
            unit = self.get_unit(self.max_offset - 1)
            if unit is not None and unit[1] > 0:
                break
            self.truncate(self.max_offset - 1)

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

    def truncate(self, new_max: int) -> None:
        """Forget units at ``new_max`` and after (recovery)."""
        new_max = max(new_max, self.min_offset)
        if new_max >= self.max_offset:
            return
        pos = new_max * CQ_STORE_UNIT_SIZE
        first = self._files[0] if self._files else 0
        for start in list(self._files):
            if start >= pos and start != first:
                self._drop_file(start)  # wholly past the new end
            elif pos < start + self.file_size:
                os.truncate(self.directory / file_name(start), max(0, pos - start))
                self._dirty.add(start)
        self.max_offset = new_max

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
