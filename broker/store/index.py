"""The message index: RocketMQ 4.9.3's IndexService files, to find messages by key (docs/STORAGE.md §10).

``STORE/index/<yyyyMMddHHmmssSSS>`` files (local time of creation, RocketMQ's ``timeMillisToHumanString``),
each a 40-byte header, ``max_hash_slot_num`` slots of 4 bytes and ``max_index_num`` entries of 20 bytes
(RocketMQ's defaults 5,000,000 and 20,000,000: 420,000,040 bytes, created sparse with ``ftruncate``):

* header: beginTimestamp (8), endTimestamp (8), beginPhyOffset (8), endPhyOffset (8), hashSlotCount (4),
  indexCount (4; starts at 1: entry 0 is never used, so a file holds ``max_index_num - 1`` entries);
* slot ``abs(hash) % max_hash_slot_num``: the position of the newest entry of that slot (0: none);
* entry: keyHash (4), phyOffset (8, the record's commit-log offset), timeDiff (4, seconds since the file's
  beginTimestamp), prevIndex (4, the slot's previous newest entry: a chain, newest first).

A message is indexed under ``topic#key`` for its UNIQ_KEY and for every non-empty word of its KEYS (split on
spaces); the hash is Java's ``String.hashCode`` of that string (UTF-16 code units), made non-negative with
``Math.abs`` (whose ``Integer.MIN_VALUE`` stays negative and becomes 0). A full file is followed by a new one
whose begin offset and timestamp are the full file's end. Lookups walk the files newest first and each
chain newest first, so ``query_offset`` returns the newest matches (then sorted by offset, as RocketMQ does).

The index is derived data: entries carry a hash, not the key, so a hit is only a candidate. Callers check
the record (broker/store/index_dispatch.py reads it back and keeps it only when its topic and key match),
which also makes stale entries harmless — ones written before a crash for records the commit log lost, or
twice for a record indexed again after a restart.

Pure file layout and bookkeeping: blocking ``mmap`` I/O, no trio; the time comes from an injected clock.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from trimq.runtime.logs import get_logger

log = get_logger("trimq.store.index")

__all__ = [
    "DEFAULT_MAX_HASH_SLOT_NUM",
    "DEFAULT_MAX_INDEX_NUM",
    "INDEX_HEADER_SIZE",
    "IndexFile",
    "IndexHeader",
    "IndexRecord",
    "IndexService",
    "QueryOffsetResult",
    "build_key",
    "index_file_size",
    "index_key_hash",
    "java_string_hash",
    "keys_of",
]

INDEX_HEADER_SIZE = 40
HASH_SLOT_SIZE = 4
INDEX_SIZE = 20
INVALID_INDEX = 0
DEFAULT_MAX_HASH_SLOT_NUM = 5_000_000  # RocketMQ's MessageStoreConfig.maxHashSlotNum
DEFAULT_MAX_INDEX_NUM = 5_000_000 * 4  # maxIndexNum
KEY_SEPARATOR = " "  # MessageConst.KEY_SEPARATOR
TRANSACTION_ROLLBACK_TYPE = 0x3 << 2  # MessageSysFlag: rolled-back half messages are not indexed

_HEADER = struct.Struct(">qqqqii")
_ENTRY = struct.Struct(">iqii")
_SLOT = struct.Struct(">i")
_MASK = 0xFFFFFFFF
_KEY_COUNTER = 4  # a UNIQ_KEY ends in a counter of 4 hex digits; before it, the ms of the month and the process
_KEY_HEAD_MIN = 24  # keys longer than this hash their head once (cached) and their last 4 characters each time
_HEAD_CACHE_MAX = 100_000  # heads remembered (a producer's head changes each ms); the cache starts again when full
_POW31_COUNTER = 31**_KEY_COUNTER
_COUNTER_TABLE_MAX = 1 << 17  # hashes of 4-character key ends (65,536 for a UNIQ_KEY's hex counter)
_COUNTER_HASHES: dict[str, int] = {}  # "00A7" -> String.hashCode("00A7"): ASCII ends only
_NO_TAILS: dict[str, int] = {}
_INT_MAX = 0x7FFFFFFF

#: What indexing a record needs: (topic, commit-log offset, store timestamp, sys flag, KEYS, UNIQ_KEY).
IndexRecord = tuple[str, int, int, int, str | None, str | None]


def index_file_size(hash_slot_num: int, index_num: int) -> int:
    """Bytes of one index file: header + slots + entries."""
    return INDEX_HEADER_SIZE + hash_slot_num * HASH_SLOT_SIZE + index_num * INDEX_SIZE


_PAIRS: list[int] = []  # 31 * first + second for every pair of bytes, indexed by the pair read as a native uint16


def _ascii_hash(data: bytes, h: int = 0) -> int:
    """``String.hashCode``'s loop over ASCII ``data``, continuing from ``h`` (unmasked: the caller masks).

    Two characters per step through a table of pairs: the hot part of indexing a message."""
    n = len(data)
    if n > 64:  # long keys: keep the integer small
        for c in data:
            h = (31 * h + c) & _MASK
        return h
    if n & 1:
        h = 31 * h + data[0]
        data = data[1:]
    pairs = _PAIRS or _make_pairs()
    for v in memoryview(data).cast("H"):
        h = h * 961 + pairs[v]
    return h


def _make_pairs() -> list[int]:
    """Fill ``_PAIRS`` (once): the pair read as uint16 ``x`` is ``high * 256 + low``; which byte comes first in
    the key depends on the byte order."""
    if not _PAIRS:
        times31 = [b * 31 for b in range(256)]
        if sys.byteorder == "little":  # low byte first: 31 * low + high
            for high in range(256):
                _PAIRS.extend([t + high for t in times31])
        else:  # high byte first: 31 * high + low
            for high in range(256):
                _PAIRS.extend(range(times31[high], times31[high] + 256))
    return _PAIRS


def _counter_hash(tail: str) -> int | None:
    """``String.hashCode`` of a key's last 4 characters, remembered in ``_COUNTER_HASHES``; None unless ASCII."""
    if not tail.isascii():
        return None
    b = tail.encode()
    c: int = b[0] * 29791 + b[1] * 961 + b[2] * 31 + b[3]
    if len(_COUNTER_HASHES) < _COUNTER_TABLE_MAX:
        _COUNTER_HASHES[tail] = c
    return c


def java_string_hash(s: str) -> int:
    """Java's ``String.hashCode``: ``s[0]*31^(n-1) + ... + s[n-1]`` over UTF-16 code units, as a signed int32."""
    if s.isascii():
        h = _ascii_hash(s.encode()) & _MASK
    else:
        h = 0
        data = s.encode("utf-16-be", "surrogatepass")
        for (c,) in struct.iter_unpack(">H", data):
            h = (31 * h + c) & _MASK
    return h - 0x100000000 if h > _INT_MAX else h


def index_key_hash(key: str) -> int:
    """RocketMQ's ``IndexFile.indexKeyHashMethod``: ``abs(hashCode)``, 0 for ``Integer.MIN_VALUE``."""
    h = java_string_hash(key)
    return 0 if h == -0x80000000 else abs(h)


def build_key(topic: str, key: str) -> str:
    """What is hashed for a key of a topic (IndexService.buildKey)."""
    return f"{topic}#{key}"


def keys_of(keys: str | None, uniq_key: str | None) -> list[str]:
    """The keys a message is indexed under, in RocketMQ's order: UNIQ_KEY first, then each KEYS word."""
    out = [uniq_key] if uniq_key is not None else []
    if keys:
        out += [k for k in keys.split(KEY_SEPARATOR) if k]
    return out


def _human_ms(ms: int) -> str:
    """``yyyyMMddHHmmssSSS`` in local time (RocketMQ's ``UtilAll.timeMillisToHumanString``)."""
    t = time.localtime(ms // 1000)
    return time.strftime("%Y%m%d%H%M%S", t) + f"{ms % 1000:03d}"


@dataclass(slots=True)
class IndexHeader:
    """The 40-byte header (RocketMQ's IndexHeader)."""

    begin_timestamp: int = 0
    end_timestamp: int = 0
    begin_phy_offset: int = 0
    end_phy_offset: int = 0
    hash_slot_count: int = 0
    index_count: int = 1

    def pack_into(self, buf: mmap.mmap) -> None:
        _HEADER.pack_into(buf, 0, self.begin_timestamp, self.end_timestamp, self.begin_phy_offset,
                          self.end_phy_offset, self.hash_slot_count, self.index_count)

    @classmethod
    def unpack_from(cls, buf: mmap.mmap | bytes) -> IndexHeader:
        h = cls(*_HEADER.unpack_from(buf, 0))
        if h.index_count <= 0:
            h.index_count = 1
        return h


class IndexFile:
    """One index file, mapped read-write (RocketMQ's IndexFile). ``end_phy_offset`` / ``end_timestamp``: a new
    file starts where the previous (full) one ended."""

    def __init__(self, path: Path, hash_slot_num: int, index_num: int, *, end_phy_offset: int = 0,
                 end_timestamp: int = 0) -> None:
        self.path = path
        self.hash_slot_num = hash_slot_num
        self.index_num = index_num
        self.size = index_file_size(hash_slot_num, index_num)
        self._entries_at = INDEX_HEADER_SIZE + hash_slot_num * HASH_SLOT_SIZE
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            new = os.fstat(fd).st_size == 0
            if new:
                os.ftruncate(fd, self.size)  # sparse: blocks are allocated as slots and entries are written
            elif os.fstat(fd).st_size != self.size:
                raise ValueError(f"index file {path.name} is {os.fstat(fd).st_size} bytes, not {self.size} "
                                 f"(max_hash_slot_num {hash_slot_num}, max_index_num {index_num})")
            self.mm = mmap.mmap(fd, self.size)
        finally:
            os.close(fd)
        if hasattr(mmap, "MADV_RANDOM"):
            # slots and chains are read and written at random: without this, the first touch of a fresh file
            # faulted in the pages around it too (~3 ms)
            self.mm.madvise(mmap.MADV_RANDOM)
        self.header = IndexHeader() if new else IndexHeader.unpack_from(self.mm)  # a new file is all zeros
        if new:
            if end_phy_offset > 0:
                self.header.begin_phy_offset = self.header.end_phy_offset = end_phy_offset
            if end_timestamp > 0:
                self.header.begin_timestamp = self.header.end_timestamp = end_timestamp
            self.header.pack_into(self.mm)
        self.dirty = new
        self.header_dirty = False

    # -- writing --------------------------------------------------------------------------------------
    @property
    def is_write_full(self) -> bool:
        return self.header.index_count >= self.index_num

    def put_key(self, key: str, phy_offset: int, store_timestamp: int) -> bool:
        """Append an entry for ``key`` (already ``topic#key``); False when the file is full."""
        return self.put_hash(index_key_hash(key), phy_offset, store_timestamp)

    def put_hash(self, key_hash: int, phy_offset: int, store_timestamp: int) -> bool:
        """``put_key`` with the hash computed (RocketMQ's putKey from ``keyHash`` on)."""
        return self.put_hashes((key_hash,), phy_offset, store_timestamp) == 1

    def put_hashes(self, key_hashes: Sequence[int], phy_offset: int, store_timestamp: int) -> int:
        """:meth:`put_hash` for each of one record's key hashes, in order; returns how many were written before
        the file was full."""
        return self.put_entries([(key_hash, phy_offset, store_timestamp) for key_hash in key_hashes])

    def put_entries(self, entries: Sequence[tuple[int, int, int]]) -> int:
        """Append ``(key hash, phy offset, store timestamp)`` entries in order (RocketMQ's putKey from ``keyHash``
        on, for each), with the header in locals; returns how many were written before the file was full."""
        index_num = self.index_num
        h = self.header
        count = h.index_count
        if count >= index_num or not entries:
            return 0
        mm = self.mm
        slot_num = self.hash_slot_num
        entries_at = self._entries_at
        begin_timestamp = h.begin_timestamp
        slot_count = h.hash_slot_count
        slot_unpack = _SLOT.unpack_from
        slot_pack = _SLOT.pack_into
        entry_pack = _ENTRY.pack_into
        n = 0
        phy_offset = store_timestamp = 0
        for key_hash, phy_offset, store_timestamp in entries:
            if count >= index_num:
                break
            abs_slot = INDEX_HEADER_SIZE + (key_hash % slot_num) * HASH_SLOT_SIZE
            (slot_value,) = slot_unpack(mm, abs_slot)
            if slot_value <= INVALID_INDEX or slot_value > count:
                slot_value = INVALID_INDEX
                slot_count += 1
            if count <= 1:
                # RocketMQ measures the first entry of a file against the begin time it inherited from the
                # previous file and then moves the begin time to this entry: its time would read later than it
                # is. trimq measures it against the begin time it is about to get (0 s), the same for a fresh
                # store.
                time_diff = 0
                h.begin_phy_offset = phy_offset
                begin_timestamp = store_timestamp
            elif begin_timestamp <= 0:
                time_diff = 0
            else:
                time_diff = (store_timestamp - begin_timestamp) // 1000
                if time_diff < 0:
                    time_diff = 0
                elif time_diff > _INT_MAX:
                    time_diff = _INT_MAX
            entry_pack(mm, entries_at + count * INDEX_SIZE, key_hash, phy_offset, time_diff, slot_value)
            slot_pack(mm, abs_slot, count)
            count += 1
            n += 1
        if n:
            h.begin_timestamp = begin_timestamp
            h.hash_slot_count = slot_count
            h.index_count = count
            h.end_phy_offset = phy_offset
            h.end_timestamp = store_timestamp
            self.dirty = self.header_dirty = True
        return n

    def sync_header(self) -> None:
        """Write the header to the mapping (puts keep it in memory: one write per batch of puts, not per put;
        entries are always written before the header that counts them)."""
        if self.header_dirty:
            self.header.pack_into(self.mm)
            self.header_dirty = False

    # -- reading --------------------------------------------------------------------------------------
    def is_time_matched(self, begin: int, end: int) -> bool:
        """RocketMQ's isTimeMatched: does ``[begin, end]`` overlap the file's time span?"""
        b, e = self.header.begin_timestamp, self.header.end_timestamp
        return (begin < b and end > e) or (b <= begin <= e) or (b <= end <= e)

    def select_phy_offsets(self, out: list[int], key: str, max_num: int, begin: int, end: int,
                           accept: Callable[[int], bool] | None = None) -> None:
        """Append to ``out`` the offsets of ``key``'s entries whose time is in ``[begin, end]``, newest first,
        until ``out`` holds ``max_num``. ``accept(offset)`` (optional) keeps only the offsets it approves.

        The chain walk is RocketMQ's, with one safeguard: it only ever moves to an older position, so a file
        damaged by a crash can end a walk early but never make it loop."""
        h = self.header
        count = h.index_count
        key_hash = index_key_hash(key)
        mm = self.mm
        (slot_value,) = _SLOT.unpack_from(mm, INDEX_HEADER_SIZE + (key_hash % self.hash_slot_num) * HASH_SLOT_SIZE)
        if slot_value <= INVALID_INDEX or slot_value > count or count <= 1:
            return
        pos = slot_value
        while len(out) < max_num:
            key_hash_read, phy_offset, time_diff, prev = _ENTRY.unpack_from(mm, self._entries_at + pos * INDEX_SIZE)
            if time_diff < 0:
                break
            time_read = h.begin_timestamp + time_diff * 1000
            if key_hash == key_hash_read and begin <= time_read <= end and (accept is None or accept(phy_offset)):
                out.append(phy_offset)
            if prev <= INVALID_INDEX or prev > count or prev >= pos or time_read < begin:
                break
            pos = prev

    # -- files ----------------------------------------------------------------------------------------
    def flush(self) -> None:
        """msync the mapping (blocking; ``sync_header`` first, on the writing thread)."""
        self.dirty = False
        self.mm.flush()

    def close(self) -> None:
        with contextlib.suppress(BufferError, ValueError):
            self.mm.close()

    def __repr__(self) -> str:
        return f"<IndexFile {self.path.name} {self.header}>"


@dataclass(slots=True)
class QueryOffsetResult:
    """Offsets found for a key (ascending) and the index's newest entry (RocketMQ's QueryOffsetResult)."""

    phy_offsets: list[int] = field(default_factory=list)
    index_last_update_timestamp: int = 0
    index_last_update_phyoffset: int = 0


class IndexService:
    """The index files of one store (RocketMQ's IndexService): build, query, delete with the commit log.

    Call ``load`` once before use, ``close`` at the end. Not thread-safe: the store calls it from its event
    loop, except ``flush`` (see there).
    """

    def __init__(self, directory: str | os.PathLike[str], *, max_hash_slot_num: int = DEFAULT_MAX_HASH_SLOT_NUM,
                 max_index_num: int = DEFAULT_MAX_INDEX_NUM, max_msgs_num_batch: int = 64,
                 now_ms: Callable[[], int] | None = None) -> None:
        if max_hash_slot_num < 1 or max_index_num < 2:
            raise ValueError("an index file needs at least one hash slot and two entries")
        self.directory = Path(directory)
        self.hash_slot_num = max_hash_slot_num
        self.index_num = max_index_num
        self.max_msgs_num_batch = max_msgs_num_batch
        self.now_ms: Callable[[], int] = now_ms or (lambda: time.time_ns() // 1_000_000)
        self.files: list[IndexFile] = []
        self.deleted_files = 0
        self._flushing = 0  # flush threads running: deleted files are closed once none is
        self._retired: list[IndexFile] = []
        self._topic_hashes: dict[str, tuple[int, str]] = {}
        # Hash of "topic#" + a long key's head (all but its last 4 characters), by topic hash, then head. A
        # producer's UNIQ_KEYs of one millisecond differ only in their 4-digit counter, so most keys cost two
        # dict lookups and one multiply-add.
        self._heads_by_topic: dict[int, dict[str, int]] = {}
        self._head_count = 0

    # -- lifecycle ------------------------------------------------------------------------------------
    def load(self) -> None:
        """Open the index files in name (= creation) order. A file of another geometry (the slot or entry count
        changed) or that cannot be opened is deleted: the index is rebuilt from the commit log past the last
        file that remains (``end_phy_offset``)."""
        # the hash table of byte pairs (~1.5 ms) is built here, at start-up: built by the first dispatch, it held
        # up the sends of the first windows behind it
        _make_pairs()
        self.directory.mkdir(parents=True, exist_ok=True)
        for f in self.files:
            f.close()
        self.files = []
        names = sorted(p for p in self.directory.iterdir() if p.is_file() and p.name.isdigit())
        for path in names:
            try:
                self.files.append(IndexFile(path, self.hash_slot_num, self.index_num))
            except (OSError, ValueError) as exc:
                # Every later file continues this one: drop them too; the rebuild starts before them.
                later = names[names.index(path):]
                log.warning("index.files_dropped", files=[p.name for p in later], error=str(exc))
                for p in later:
                    with contextlib.suppress(OSError):
                        p.unlink()
                break
        log.info("index.loaded", files=len(self.files), end_phy_offset=self.end_phy_offset)

    def close(self) -> None:
        """msync and unmap every file (blocking)."""
        for f in self.files:
            with contextlib.suppress(OSError, ValueError):
                f.sync_header()
                f.flush()
            f.close()
        self.files = []
        for f in self._retired:
            f.close()
        self._retired = []

    def flush(self, files: Iterable[IndexFile] | None = None) -> None:
        """msync the files that changed (blocking: a worker thread may run it while the event loop writes;
        files deleted meanwhile are closed only after it, see ``close_retired``)."""
        self._flushing += 1
        try:
            for f in list(self.files if files is None else files):
                if f.dirty:
                    with contextlib.suppress(ValueError):  # closed by close(): nothing left to flush
                        f.flush()
        finally:
            self._flushing -= 1

    def dirty_files(self) -> list[IndexFile]:
        """The files changed since their last msync (their headers written to the mapping)."""
        self.sync_headers()
        return [f for f in self.files if f.dirty]

    def sync_headers(self) -> None:
        """Write the newest file's header to its mapping (after a batch of ``build_index``)."""
        if self.files:
            self.files[-1].sync_header()

    def close_retired(self) -> None:
        """Unmap deleted files once no flush thread can be using them."""
        if not self._flushing:
            for f in self._retired:
                f.close()
            self._retired = []

    # -- state ----------------------------------------------------------------------------------------
    @property
    def end_phy_offset(self) -> int:
        """Commit-log offset of the newest record indexed (0: none)."""
        return self.files[-1].header.end_phy_offset if self.files else 0

    @property
    def end_timestamp(self) -> int:
        return self.files[-1].header.end_timestamp if self.files else 0

    def entry_count(self) -> int:
        """Entries over every file (for metrics and tests)."""
        return sum(f.header.index_count - 1 for f in self.files)

    def reset_end_phy_offset(self, offset: int) -> None:
        """Move the newest file's end back to ``offset`` (the commit log ends there after a crash and lost
        records the index has entries for): records written from there on are indexed again."""
        if self.files and self.files[-1].header.end_phy_offset > offset:
            f = self.files[-1]
            f.header.end_phy_offset = offset
            f.dirty = f.header_dirty = True
            f.sync_header()

    # -- building -------------------------------------------------------------------------------------
    def _last_file(self) -> IndexFile:
        """The file to write to, creating the next one when the last is full (RocketMQ's
        getAndCreateLastIndexFile; its name is the creation time, made unique if two fall in one ms)."""
        if self.files and not self.files[-1].is_write_full:
            return self.files[-1]
        prev = self.files[-1] if self.files else None
        if prev is not None:
            prev.sync_header()
        now = self.now_ms()
        name = _human_ms(now)
        while (self.directory / name).exists() or (prev is not None and name <= prev.path.name):
            now += 1
            name = _human_ms(now)
        self.directory.mkdir(parents=True, exist_ok=True)
        f = IndexFile(self.directory / name, self.hash_slot_num, self.index_num,
                      end_phy_offset=prev.header.end_phy_offset if prev else 0,
                      end_timestamp=prev.header.end_timestamp if prev else 0)
        self.files.append(f)
        log.info("index.file_created", file=name, begin_phy_offset=f.header.begin_phy_offset)
        return f

    def _topic_prefix(self, topic: str) -> tuple[int, str]:
        # (hash of "topic#" as Java would carry it on, the prefix): keys are hashed from there on.
        cached = self._topic_hashes.get(topic)
        if cached is None:
            prefix = f"{topic}#"
            cached = (_ascii_hash(prefix.encode()) & _MASK if prefix.isascii() else -1, prefix)
            if len(self._topic_hashes) < 10_000:
                self._topic_hashes[topic] = cached
        return cached

    def build_index(self, topic: str, phy_offset: int, store_timestamp: int, sys_flag: int, keys: str | None,
                    uniq_key: str | None) -> int:
        """Index one record (RocketMQ's buildIndex): skipped when it is older than the newest file's end or a
        rolled-back transaction half. Returns how many entries were written."""
        return self.build_index_batch(((topic, phy_offset, store_timestamp, sys_flag, keys, uniq_key),))[1]

    def build_index_batch(self, records: Iterable[IndexRecord]) -> tuple[int, int]:
        """:meth:`build_index` for each record, in commit-log order, in one loop (the index is the broker's
        largest cost per message after the append). Returns (records indexed, entries written).

        The keys are hashed first, into one list of entries for the whole batch, then written with
        :meth:`IndexFile.put_entries` (the file's header in locals once per batch, not once per record)."""
        files = self.files
        # Records older than the newest file's end are skipped (indexed before a restart). A file created
        # below for a full one starts at that one's end, so the bound holds for the whole batch.
        floor = files[-1].header.end_phy_offset if files else 0
        entries: list[tuple[int, int, int]] = []
        add = entries.append
        indexed = 0
        key_hash = self._key_hash
        last_topic: str | None = None
        prefix_hash, prefix, tails = -1, "", _NO_TAILS
        for topic, phy_offset, store_timestamp, sys_flag, keys, uniq_key in records:
            if sys_flag & TRANSACTION_ROLLBACK_TYPE == TRANSACTION_ROLLBACK_TYPE or phy_offset < floor:
                continue
            if topic is not last_topic:
                prefix_hash, prefix = self._topic_prefix(topic)
                tails = self._tail_hashes(prefix_hash)
                last_topic = topic
            written = len(entries)
            if uniq_key is not None:
                # The common case inline: a UNIQ_KEY's hash is its cached head's carried over its last 4
                # characters (the counter), looked up in a table; see _key_hash for the rest.
                h = tails.get(uniq_key[:-_KEY_COUNTER]) if len(uniq_key) > _KEY_HEAD_MIN else None
                c = None
                if h is not None:
                    c = _COUNTER_HASHES.get(uniq_key[-_KEY_COUNTER:]) or _counter_hash(uniq_key[-_KEY_COUNTER:])
                if c is None:
                    h = key_hash(prefix_hash, prefix, uniq_key)
                else:
                    h = (h * _POW31_COUNTER + c) & _MASK
                    if h > _INT_MAX:
                        h = (0x100000000 - h) & _INT_MAX  # Math.abs of the int32; MIN_VALUE -> 0
                add((h, phy_offset, store_timestamp))
            if keys:
                for word in keys.split(KEY_SEPARATOR):
                    if word:
                        add((key_hash(prefix_hash, prefix, word), phy_offset, store_timestamp))
            if len(entries) > written:
                indexed += 1
        if not entries:
            return indexed, 0
        f = files[-1] if files and files[-1].header.index_count < self.index_num else self._last_file()
        done = f.put_entries(entries)
        while done < len(entries):
            log.warning("index.file_full", file=f.path.name, index_count=f.header.index_count)
            f = self._last_file()
            done += f.put_entries(entries[done:] if done else entries)
        return indexed, done

    def _tail_hashes(self, prefix_hash: int) -> dict[str, int]:
        """The topic's cache of hashes of ``topic#`` + a long key's head (all but its last 4 characters)."""
        tails = self._heads_by_topic.get(prefix_hash)
        if tails is None:
            tails = self._heads_by_topic[prefix_hash] = {}
        return tails

    def _key_hash(self, prefix_hash: int, prefix: str, word: str) -> int:
        """``index_key_hash(prefix + word)``, carried on from the prefix's hash (-1: not ASCII). A long key's head
        (all but its last 4 characters: a UNIQ_KEY's counter) is hashed once per topic and remembered in
        ``_heads_by_topic``, its last 4 characters through a table (``_COUNTER_HASHES``)."""
        if prefix_hash < 0 or not word.isascii():
            return index_key_hash(prefix + word)
        if len(word) > _KEY_HEAD_MIN:
            tails = self._tail_hashes(prefix_hash)
            head = word[:-_KEY_COUNTER]
            head_hash = tails.get(head)
            if head_hash is None:
                if self._head_count >= _HEAD_CACHE_MAX:
                    for cached in self._heads_by_topic.values():
                        cached.clear()  # producers come and go, a UNIQ_KEY's head each ms: start again
                    self._head_count = 0
                head_hash = tails[head] = _ascii_hash(head.encode(), prefix_hash) & _MASK
                self._head_count += 1
            tail = word[-_KEY_COUNTER:]
            c = _COUNTER_HASHES.get(tail) or _counter_hash(tail)
            h = (head_hash * _POW31_COUNTER + (c or 0)) & _MASK
        else:
            h = _ascii_hash(word.encode(), prefix_hash) & _MASK
        h = h - 0x100000000 if h > _INT_MAX else h
        return 0 if h == -0x80000000 else abs(h)

    # -- querying -------------------------------------------------------------------------------------
    def query_offset(self, topic: str, key: str, max_num: int, begin: int, end: int,
                     accept: Callable[[int], bool] | None = None) -> QueryOffsetResult:
        """Commit-log offsets of up to ``max_num`` (capped at ``max_msgs_num_batch``) entries of ``key`` in
        ``topic`` stored in ``[begin, end]`` (ms; the index keeps seconds), the newest ones, ascending
        (RocketMQ's queryOffset). ``accept`` filters candidates (see ``IndexFile.select_phy_offsets``)."""
        max_num = max(0, min(max_num, self.max_msgs_num_batch))
        result = QueryOffsetResult()
        if not self.files or max_num == 0:
            return result
        last = self.files[-1].header
        result.index_last_update_timestamp = last.end_timestamp
        result.index_last_update_phyoffset = last.end_phy_offset
        full_key = build_key(topic, key)
        out: list[int] = []
        for f in reversed(self.files):
            if f.is_time_matched(begin, end):
                f.select_phy_offsets(out, full_key, max_num, begin, end, accept)
            if f.header.begin_timestamp < begin or len(out) >= max_num:
                break
        result.phy_offsets = sorted(set(out))
        return result

    # -- reclaim --------------------------------------------------------------------------------------
    def delete_expired_file(self, offset: int) -> int:
        """Delete the files whose newest entry is below ``offset`` (the commit log's new first offset), oldest
        first, never the last file (RocketMQ's deleteExpiredFile). Returns how many were deleted."""
        deleted = 0
        while len(self.files) > 1 and self.files[0].header.end_phy_offset < offset:
            f = self.files.pop(0)
            with contextlib.suppress(FileNotFoundError):
                f.path.unlink()
            self._retired.append(f)
            deleted += 1
            log.info("index.file_deleted", file=f.path.name, end_phy_offset=f.header.end_phy_offset,
                     commitlog_min_offset=offset)
        self.deleted_files += deleted
        self.close_retired()
        return deleted
