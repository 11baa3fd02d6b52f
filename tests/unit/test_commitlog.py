"""The commit log and the MessageStore on a real directory: roll-over and fillers, byte-exact records,
reads, flush modes, recovery from torn tails / garbage / lost consume-queue units, checkpoints."""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from trimq.broker.store.checkpoint import ROCKETMQ_CHECKPOINT_SIZE, Checkpoint, CheckpointError, read_checkpoint
from trimq.broker.store.commitlog import StoreError, file_name
from trimq.broker.store.consume_queue import tags_string_to_tags_code
from trimq.broker.store.message_store import MessageStore
from trimq.broker.store.recovery import first_store_timestamp, scan_commit_log
from trimq.broker.store.store_base import GetMessageStatus, PutMessageStatus, PutRequest, StoreConfig
from trimq.protocol.message import encode_properties, get_property
from trimq.protocol.record import BLANK_MAGIC_CODE, MESSAGE_MAGIC_CODE, decode_record, encode_record, iter_records

SEG = 4096
CQ_FILE = 20 * 16
HOST = ("10.0.0.1", 10911)
BORN = ("192.168.0.7", 40001)


def make_store(path: Path, **kw: Any) -> MessageStore:
    cfg = StoreConfig(str(path), segment_size=SEG, consume_queue_file_size=CQ_FILE, **kw)
    return MessageStore(cfg, store_host=lambda: HOST)


@asynccontextmanager
async def running(path: Path, *, crash: bool = False, **kw: Any) -> AsyncIterator[MessageStore]:
    """A started store; ``crash=True`` leaves without the clean stop (no final flush, abort marker kept)."""
    st = make_store(path, **kw)
    await st.start()
    async with trio.open_nursery() as nursery:
        await nursery.start(st.run)
        try:
            yield st
        finally:
            nursery.cancel_scope.cancel()
    if crash:
        for qs in st.queues.values():
            for cq in qs.values():
                cq.close()
        st.commitlog.close()
        st._unlock_store()  # the kernel would drop the lock of a dead process
    else:
        await st.stop()


async def put(st: MessageStore, topic: str, qid: int, body: bytes, **props: str) -> Any:
    res = await st.put_message(topic, qid, body, props, born_timestamp=1_700_000_000_000, born_host=BORN)
    assert res.status is PutMessageStatus.PUT_OK, res
    return res


def pull_all(st: MessageStore, topic: str, qid: int) -> list[Any]:
    out: list[Any] = []
    offset = 0
    while True:
        r = st.get_message(topic, qid, offset, 32)
        if r.status is not GetMessageStatus.FOUND:
            break
        out.extend(iter_records(r.body))
        offset = r.next_begin_offset
    return out


def segment_walk(path: Path) -> list[tuple[int, int]]:
    """(magic, size) of every entry of a segment file, up to the first zero header."""
    data = path.read_bytes()
    out = []
    pos = 0
    while pos + 8 <= len(data):
        size, magic = struct.unpack_from(">iI", data, pos)
        if magic == 0:
            break
        out.append((magic, size))
        pos += size
    return out


async def test_roll_over_with_mixed_sizes_writes_fillers_and_reads_back(tmp_path: Path) -> None:
    sizes = [0, 1, 700, 3000, 50, 3900, 10, 2000, 2000, 2000, 5, 3500, 1, 1, 1]
    async with running(tmp_path) as st:
        for i, n in enumerate(sizes):
            await put(st, "Mixed", i % 2, bytes([i]) * n, TAGS=f"t{i}")
        files = sorted(os.listdir(tmp_path / "commitlog"))
        assert len(files) >= 6
        assert all(len(f) == 20 and int(f) % SEG == 0 for f in files)
        msgs = pull_all(st, "Mixed", 0) + pull_all(st, "Mixed", 1)
    assert sorted(m.body for m in msgs) == sorted(bytes([i]) * n for i, n in enumerate(sizes))
    # Every full segment ends with the filler, sized to the bytes left; no record crosses a segment end.
    full = sorted(int(f) for f in files)[:-2]  # the last is being written, the one after may be prepared
    for start in full:
        walk = segment_walk(tmp_path / "commitlog" / file_name(start))
        assert walk[-1][0] == BLANK_MAGIC_CODE
        assert sum(size for _, size in walk) == SEG
        assert all(magic == MESSAGE_MAGIC_CODE for magic, _ in walk[:-1])


async def test_store_writes_records_byte_identical_to_the_reference_codec(tmp_path: Path) -> None:
    async with running(tmp_path) as st:
        r1 = await put(st, "Exact", 2, b"payload", TAGS="TagA", KEYS="k1 k2")
        r2 = await st.put_messages("Exact", 2, [(b"b1", "", 3), (b"b2", encode_properties({"X": "y"}), 0)],
                                   born_timestamp=5, born_host=("::1", 7))
        assert r2.ok and r2.queue_offset == 1 and len(r2.msg_ids) == 2
        raw = st.read_record(r1.commit_log_offset)
        assert raw is not None
        m = decode_record(raw)
        ref = encode_record(
            topic="Exact", body=b"payload", queue_id=2, queue_offset=0, physical_offset=r1.commit_log_offset,
            properties=encode_properties({"TAGS": "TagA", "KEYS": "k1 k2"}), born_timestamp=1_700_000_000_000,
            born_host=BORN, store_timestamp=m.store_timestamp, store_host=HOST,
        )
        assert raw == ref
        assert r1.msg_id == m.msg_id and m.store_host == HOST
        batch = pull_all(st, "Exact", 2)[1:]
        assert [(x.body, x.flag, x.queue_offset, x.born_host, x.properties) for x in batch] == [
            (b"b1", 3, 1, ("::1", 7), {}), (b"b2", 0, 2, ("::1", 7), {"X": "y"})]
        assert [x.msg_id for x in batch] == r2.msg_ids
        looked = st.lookup_message_by_offset(r2.commit_log_offset + batch[0].store_size)
        assert looked is not None and looked.body == b"b2"
        assert st.lookup_message_by_offset(r2.commit_log_offset + 1) is None


async def test_get_message_statuses_filters_and_caps(tmp_path: Path) -> None:
    async with running(tmp_path, max_transfer_count=4, max_transfer_bytes=600) as st:
        assert st.get_message("Nope", 0, 0, 32).status is GetMessageStatus.NO_MATCHED_LOGIC_QUEUE
        for i in range(10):
            await put(st, "G", 0, b"m%d" % i, TAGS="A" if i in (0, 7) else "B")
        await put(st, "G", 1, b"x" * 1000)
        r = st.get_message("G", 0, 10, 32)
        assert (r.status, r.next_begin_offset, r.max_offset) == (GetMessageStatus.OFFSET_OVERFLOW_ONE, 10, 10)
        r = st.get_message("G", 0, 99, 32)
        assert (r.status, r.next_begin_offset) == (GetMessageStatus.OFFSET_OVERFLOW_BADLY, 10)
        # Count cap (config 4) and the requested count.
        r = st.get_message("G", 0, 0, 32)
        assert r.message_count == 4 and r.next_begin_offset == 4
        r = st.get_message("G", 0, 0, 2)
        assert r.message_count == 2 and r.next_begin_offset == 2
        # Tag filtering by hash: skipped units count towards nextBeginOffset.
        a = frozenset({tags_string_to_tags_code("A")})
        r = st.get_message("G", 0, 1, 32, a)
        assert r.status is GetMessageStatus.FOUND and r.next_begin_offset == 10  # scanning goes on past m7
        assert [m.body for m in iter_records(r.body)] == [b"m7"]
        r = st.get_message("G", 0, 8, 32, a)
        assert (r.status, r.next_begin_offset, r.body) == (GetMessageStatus.NO_MATCHED_MESSAGE, 10, b"")
        # Byte cap: the first message always goes, even when it alone is over the cap.
        r = st.get_message("G", 1, 0, 32)
        assert r.message_count == 1
        assert st.get_message("G", 2, 0, 32).status is GetMessageStatus.NO_MATCHED_LOGIC_QUEUE


async def test_a_read_gate_hides_records_past_its_limit_and_passes_arrivals_on_once_readable(tmp_path: Path) -> None:
    # SYNC_MASTER's high watermark (ReadGate): pulls stop at the first record past the limit, long polling hears of
    # an arrival once the limit covers it; no limit (None) is no gate.
    arrivals: list[tuple[str, int, int]] = []
    limit: list[int | None] = [None]
    async with running(tmp_path) as st:
        st.read_gate.listeners.append(lambda topic, qid, new_max: arrivals.append((topic, qid, new_max)))
        st.read_gate.follow(lambda: limit[0])
        for i in range(2):
            await put(st, "G", 0, b"open%d" % i)
        assert arrivals == [("G", 0, 1), ("G", 0, 2)]
        limit[0] = st.commitlog.max_offset  # what a slave acknowledged so far
        for i in range(3):
            await put(st, "G", 0, b"hidden%d" % i)
        await put(st, "H", 1, b"other")
        assert arrivals == [("G", 0, 1), ("G", 0, 2)]  # held
        r = st.get_message("G", 0, 0, 32)
        assert (r.status, r.next_begin_offset, r.max_offset) == (GetMessageStatus.FOUND, 2, 5)
        assert [m.body for m in iter_records(r.body)] == [b"open0", b"open1"]
        r = st.get_message("G", 0, 2, 32)
        assert (r.status, r.next_begin_offset, r.body) == (GetMessageStatus.OFFSET_OVERFLOW_ONE, 2, b"")
        assert not st.has_readable("G", 0, 2) and st.has_readable("G", 0, 1)
        # the slave acknowledges the first two hidden records: they are readable and long polling hears of it
        cq = st.find_consume_queue("G", 0)
        third = cq.get_unit(4) if cq is not None else None
        assert third is not None
        limit[0] = third[0]
        st.read_gate.release()
        assert arrivals[2:] == [("G", 0, 4)]
        r = st.get_message("G", 0, 2, 32)
        assert [m.body for m in iter_records(r.body)] == [b"hidden0", b"hidden1"] and r.next_begin_offset == 4
        assert not st.has_readable("G", 0, 4)
        # the gate opens (no slave left): everything, and every held arrival once, with its queue's newest max
        limit[0] = None
        st.read_gate.release()
        assert sorted(arrivals[3:]) == [("G", 0, 5), ("H", 1, 1)]
        assert [m.body for m in iter_records(st.get_message("G", 0, 4, 32).body)] == [b"hidden2"]
        assert st.has_readable("G", 0, 4)


def test_a_read_gates_held_arrivals_are_bounded_one_per_queue() -> None:
    from trimq.broker.store.read import ReadGate

    end = [0]
    told: list[tuple[str, int, int]] = []
    gate = ReadGate(lambda: end[0], held_max=4)
    gate.follow(lambda: 0)
    gate.listeners.append(lambda topic, qid, new_max: told.append((topic, qid, new_max)))
    for i in range(1, 10):  # a slave that never acknowledges: arrivals to two queues pile up
        end[0] = 100 * i
        gate.on_arrival("T", i % 2, i)
    assert told == [] and gate.held <= 4
    gate.follow(lambda: 1000)
    assert sorted(told) == [("T", 0, 8), ("T", 1, 9)]  # each queue's latest arrival, once


async def test_offset_by_time_and_store_timestamps(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    async with running(tmp_path) as st:
        stamps = []
        for i in range(6):
            r = await put(st, "Time", 0, b"%d" % i)
            stamps.append(r.store_timestamp)
        assert stamps == sorted(stamps)  # store times never go backwards
        for k, ts in enumerate(stamps):
            assert st.get_store_timestamp("Time", 0, k) == ts
            first = stamps.index(ts)
            assert st.get_offset_in_queue_by_time("Time", 0, ts) == first
        assert st.get_offset_in_queue_by_time("Time", 0, 0) == 0
        assert st.get_offset_in_queue_by_time("Time", 0, stamps[-1] + 1) == 6
        assert st.get_earliest_msg_store_time("Time", 0) == stamps[0]
        assert st.get_offset_in_queue_by_time("Nope", 0, 5) == 0


async def test_bad_input_leaves_the_store_as_it_was(tmp_path: Path) -> None:
    async with running(tmp_path, max_message_size=2048) as st:
        await put(st, "Ok", 0, b"first")
        before = (st.commitlog.max_offset, st.get_max_offset_in_queue("Ok", 0))
        cases = [
            ("Ok", 0, b"x" * 3000, "", PutMessageStatus.MESSAGE_ILLEGAL),
            ("Ok", 0, b"x", "K\x01" + "v" * 40000 + "\x02", PutMessageStatus.PROPERTIES_SIZE_EXCEEDED),
            ("bad/topic", 0, b"x", "", PutMessageStatus.MESSAGE_ILLEGAL),
            ("", 0, b"x", "", PutMessageStatus.MESSAGE_ILLEGAL),
            ("Ok", -1, b"x", "", PutMessageStatus.MESSAGE_ILLEGAL),
        ]
        for topic, qid, body, props, status in cases:
            res = await st.put_message(topic, qid, body, props, born_timestamp=0, born_host=BORN)
            assert res.status is status, (topic, res)
            assert res.remark
        res = await st.put_messages("Ok", 0, [(b"a", "", 0), (b"b" * 3000, "", 0)], born_timestamp=0,
                                    born_host=BORN)
        assert res.status is PutMessageStatus.MESSAGE_ILLEGAL
        assert (st.commitlog.max_offset, st.get_max_offset_in_queue("Ok", 0)) == before
        assert "bad/topic" not in st.queues


async def test_sync_flush_shares_fsyncs_between_concurrent_puts(tmp_path: Path) -> None:
    async with running(tmp_path, flush_disk_type="SYNC_FLUSH", flush_interval_ms=60_000) as st:
        calls = 0
        real = st.commitlog.flush

        def counting(target: int) -> None:
            nonlocal calls
            calls += 1
            real(target)

        st.commitlog.flush = counting  # type: ignore[method-assign]
        results: list[Any] = []

        async def one(i: int) -> None:
            results.append(await st.put_message("Sync", i % 4, b"%d" % i, {}, born_timestamp=0, born_host=BORN))

        async with trio.open_nursery() as nursery:
            for i in range(200):
                nursery.start_soon(one, i)
        assert all(r.status is PutMessageStatus.PUT_OK for r in results)
        assert st.commitlog.flushed_offset == st.commitlog.max_offset
        assert 1 <= calls < 100  # group commit: far fewer fsyncs than puts


async def test_clean_restart_needs_no_scan(tmp_path: Path) -> None:
    async with running(tmp_path) as st:
        for i in range(50):
            await put(st, "Clean", i % 3, b"%d" % i)
        end = st.commitlog.max_offset
    assert not (tmp_path / "abort").exists()
    cp = read_checkpoint(tmp_path / "checkpoint")
    assert cp is not None and cp.physic_offset == end and cp.queue_table["Clean"] == {0: 17, 1: 17, 2: 16}
    async with running(tmp_path) as st:
        rep = st.recovery
        assert not rep.abnormal and rep.scan_from == end and rep.records_verified == 0 and rep.units_rebuilt == 0
        assert [st.get_max_offset_in_queue("Clean", q) for q in range(3)] == [17, 17, 16]
        r = await put(st, "Clean", 0, b"next")
        assert r.queue_offset == 17


async def test_crash_recovery_cuts_garbage_and_torn_records_and_rebuilds_units(tmp_path: Path) -> None:
    async with running(tmp_path, crash=True, flush_interval_ms=60_000) as st:
        for i in range(30):
            await put(st, "Crash", i % 2, b"body-%d" % i, TAGS=f"T{i % 3}")
        # A checkpoint from before the last 10 messages (what a crash mid-interval leaves).
        await st.flush()
        mid_cp = read_checkpoint(tmp_path / "checkpoint")
        for i in range(30, 40):
            await put(st, "Crash", i % 2, b"body-%d" % i, TAGS=f"T{i % 3}")
        end = st.commitlog.max_offset
    assert (tmp_path / "abort").exists() and mid_cp is not None and mid_cp.physic_offset < end
    seg_path = tmp_path / "commitlog" / file_name(end - end % SEG)
    # A torn copy of a real record (its first 60 bytes, physical offset patched) then garbage.
    first = (tmp_path / "commitlog" / file_name(0)).read_bytes()
    size = struct.unpack_from(">i", first, 0)[0]
    torn = bytearray(first[:size])
    struct.pack_into(">q", torn, 28, end)
    with open(seg_path, "r+b") as fh:
        fh.seek(end % SEG)
        fh.write(bytes(torn[:60]) + os.urandom(200))
    # Lose consume-queue units: queue 0 cut at a unit boundary, queue 1 cut mid-unit.
    q0 = tmp_path / "consumequeue" / "Crash" / "0" / file_name(0)
    q1 = tmp_path / "consumequeue" / "Crash" / "1" / file_name(0)
    os.truncate(q0, 3 * 20)
    os.truncate(q1, 5 * 20 + 7)
    async with running(tmp_path) as st:
        rep = st.recovery
        assert rep.abnormal and rep.checkpoint == "ok"
        assert rep.end_offset == end and rep.stop_reason.startswith("record at")
        assert rep.units_rebuilt == (20 - 3) + (20 - 5)
        msgs = pull_all(st, "Crash", 0) + pull_all(st, "Crash", 1)
        assert sorted(m.body for m in msgs) == sorted(b"body-%d" % i for i in range(40))
        for q in (0, 1):
            got = pull_all(st, "Crash", q)
            assert [m.queue_offset for m in got] == list(range(20))
            assert all(m.queue_id == q for m in got)
            assert [m.tags for m in got] == [f"T{i % 3}" for i in range(q, 40, 2)]
        # The garbage is gone for good: zeros after the end, and the next record goes there.
        data = seg_path.read_bytes()
        assert data[end % SEG :] == bytes(SEG - end % SEG)
        r = await put(st, "Crash", 0, b"after")
        assert (r.commit_log_offset, r.queue_offset) == (end, 20)


async def test_crc_damage_past_the_checkpoint_truncates_there(tmp_path: Path) -> None:
    async with running(tmp_path, crash=True, flush_interval_ms=60_000) as st:
        for i in range(5):
            await put(st, "Crc", 0, b"early-%d" % i)
        await st.flush()
        cut = st.commitlog.max_offset
        for i in range(5):
            await put(st, "Crc", 0, b"late-%d" % i)
    path = tmp_path / "commitlog" / file_name(cut - cut % SEG)
    with open(path, "r+b") as fh:
        fh.seek(cut % SEG + 89)  # inside the body of the first record after the checkpoint
        b = fh.read(1)
        fh.seek(cut % SEG + 89)
        fh.write(bytes([b[0] ^ 0xFF]))
    async with running(tmp_path) as st:
        assert st.recovery.end_offset == cut and "CRC" in st.recovery.stop_reason
        assert [m.body for m in pull_all(st, "Crc", 0)] == [b"early-%d" % i for i in range(5)]


async def test_damaged_checkpoint_means_a_full_verifying_scan(tmp_path: Path) -> None:
    async with running(tmp_path, crash=True) as st:
        for i in range(20):
            await put(st, "Cp", 0, b"%d" % i)
        end = st.commitlog.max_offset
    (tmp_path / "checkpoint").write_bytes(b"garbage")
    with pytest.raises(CheckpointError):
        read_checkpoint(tmp_path / "checkpoint")
    os.unlink(tmp_path / "consumequeue" / "Cp" / "0" / file_name(0))
    async with running(tmp_path) as st:
        rep = st.recovery
        assert rep.checkpoint.startswith("damaged") and rep.scan_from == 0 and rep.records_verified == 20
        assert rep.end_offset == end and st.get_max_offset_in_queue("Cp", 0) == 20


async def test_deleted_consume_queue_after_clean_stop_is_rebuilt_from_the_checkpoint_table(tmp_path: Path) -> None:
    async with running(tmp_path) as st:
        for i in range(40):
            await put(st, "Del", i % 2, b"%d" % i)
            await put(st, "Other", 0, b"o%d" % i)
    for f in (tmp_path / "consumequeue" / "Del" / "1").iterdir():
        f.unlink()
    async with running(tmp_path) as st:
        assert st.recovery.units_rebuilt == 20
        assert [m.body for m in pull_all(st, "Del", 1)] == [b"%d" % i for i in range(1, 40, 2)]
        assert st.get_max_offset_in_queue("Other", 0) == 40


async def test_put_hook_sees_delayed_messages_only(tmp_path: Path) -> None:
    async with running(tmp_path) as st:
        seen: list[PutRequest] = []

        def hook(req: PutRequest) -> None:
            seen.append(req)
            props = req.property_map()
            props["REAL_TOPIC"], props["REAL_QID"] = req.topic, str(req.queue_id)
            req.set_properties(props)
            req.topic, req.queue_id, req.tags_code = "SCHEDULE_TOPIC_XXXX", int(props["DELAY"]) - 1, 12345

        st.put_hook = hook
        await put(st, "Plain", 0, b"now")
        r = await put(st, "Plain", 0, b"later", DELAY="3")
        assert len(seen) == 1 and r.topic == "SCHEDULE_TOPIC_XXXX" and r.queue_id == 2
        unit = st.find_consume_queue("SCHEDULE_TOPIC_XXXX", 2).get_unit(0)  # type: ignore[union-attr]
        assert unit is not None and unit[2] == 12345
        m = st.lookup_message_by_offset(r.commit_log_offset)
        assert m is not None and m.properties["REAL_TOPIC"] == "Plain"
        res = await st.put_messages("Plain", 0, [(b"a", "DELAY\x012\x02", 0), (b"b", "", 0)], born_timestamp=0,
                                    born_host=BORN)
        assert res.status is PutMessageStatus.MESSAGE_ILLEGAL


def test_checkpoint_codec() -> None:
    cp = Checkpoint(1, 2, 0, 4096, 4000, {"T": {0: 5, 3: 9}, "%RETRY%g": {0: 1}})
    raw = cp.encode()
    assert raw[:24] == struct.pack(">qqq", 1, 2, 0)  # RocketMQ's three timestamps first
    assert raw[24:32] == b"TQCP" + struct.pack(">i", 2)
    assert struct.unpack(">I", raw[-4:])[0] == zlib.crc32(raw[24:-4])  # version 2: the CRC skips RocketMQ's part
    assert Checkpoint.decode(raw) == cp
    for bad in (raw[:-1], raw[:10], raw[:35] + bytes([raw[35] ^ 1]) + raw[36:], raw[:24] + b"XXXX" + raw[28:],
                raw + b"\x01", raw + bytes(100)[:-1] + b"\x01", bytes(100)):
        with pytest.raises(CheckpointError):
            Checkpoint.decode(bad)
    # After RocketMQ 4.9.3 opened the store: the file is one zero-padded 4096-byte page (StoreCheckpoint maps
    # MappedFile.OS_PAGE_SIZE) and RocketMQ has rewritten the three timestamps.
    page = raw.ljust(ROCKETMQ_CHECKPOINT_SIZE, b"\0")
    assert Checkpoint.decode(page) == cp
    visited = struct.pack(">qqq", 7, 8, 9) + page[24:]
    assert Checkpoint.decode(visited) == Checkpoint(7, 8, 9, 4096, 4000, cp.queue_table)
    # RocketMQ's own checkpoint: one page, three timestamps, nothing of trimq's.
    own = struct.pack(">qqq", 5, 6, 0).ljust(ROCKETMQ_CHECKPOINT_SIZE, b"\0")
    assert Checkpoint.decode(own) == Checkpoint(5, 6, 0, rocketmq=True)
    with pytest.raises(CheckpointError, match="negative"):
        Checkpoint.decode(struct.pack(">qqq", -5, 6, 0).ljust(ROCKETMQ_CHECKPOINT_SIZE, b"\0"))


def test_version_1_checkpoints_still_read() -> None:
    """trimq before this version: the CRC covered the timestamps too. Once RocketMQ has rewritten them the
    trimq part can no longer be verified, and only RocketMQ's part is used."""
    table = b'{"T":{"0":5}}'
    head = struct.pack(">qqq4siqqI", 1, 2, 0, b"TQCP", 1, 4096, 4000, len(table)) + table
    v1 = head + struct.pack(">I", zlib.crc32(head))
    assert Checkpoint.decode(v1) == Checkpoint(1, 2, 0, 4096, 4000, {"T": {0: 5}})
    assert Checkpoint.decode(v1.ljust(ROCKETMQ_CHECKPOINT_SIZE, b"\0")) == Checkpoint(1, 2, 0, 4096, 4000,
                                                                                      {"T": {0: 5}})
    visited = struct.pack(">qqq", 7, 8, 0) + v1[24:].ljust(ROCKETMQ_CHECKPOINT_SIZE - 24, b"\0")
    assert Checkpoint.decode(visited) == Checkpoint(7, 8, 0, rocketmq=True)
    with pytest.raises(CheckpointError, match="CRC"):
        Checkpoint.decode(struct.pack(">qqq", 7, 8, 0) + v1[24:])  # not a RocketMQ page: damaged


def rocketmq_would_load(store: Path, segment_size: int, cq_file_size: int) -> list[str]:
    """RocketMQ 4.9.3's MappedFileQueue.doLoad: every commit-log and consume-queue file must have exactly the
    configured size, else DefaultMessageStore.load() fails. Returns the files it would refuse."""
    bad = [p for p in (store / "commitlog").iterdir() if p.stat().st_size != segment_size]
    bad += [p for p in (store / "consumequeue").glob("*/*/*") if p.stat().st_size != cq_file_size]
    return [str(p) for p in bad]


async def test_a_store_rocketmq_has_opened_opens_without_a_rescan(tmp_path: Path) -> None:
    async with running(tmp_path) as st:
        for i in range(30):
            await put(st, "Rq", i % 3, b"m%d" % i)
        end = st.commitlog.max_offset
    assert rocketmq_would_load(tmp_path, SEG, CQ_FILE) == []
    cpath = tmp_path / "checkpoint"
    # RocketMQ maps the checkpoint as one 4096-byte page and, having stored messages, rewrites the timestamps.
    page = bytearray(cpath.read_bytes().ljust(ROCKETMQ_CHECKPOINT_SIZE, b"\0"))
    page[0:24] = struct.pack(">qqq", 1_800_000_000_000, 1_800_000_000_000, 0)
    cpath.write_bytes(page)
    async with running(tmp_path) as st:
        rep = st.recovery
        assert rep.checkpoint == "ok" and rep.scan_from == end
        assert rep.records_verified == 0 and rep.units_rebuilt == 0
        assert [st.get_max_offset_in_queue("Rq", q) for q in range(3)] == [10, 10, 10]


async def test_rocketmqs_own_checkpoint_starts_where_rocketmq_recovers(tmp_path: Path) -> None:
    """A checkpoint of RocketMQ's alone (a store RocketMQ wrote, or a version-1 one it rewrote): after a clean
    stop the scan starts at the third-last segment (recoverNormally); after a crash at the last segment whose
    first record is older than the checkpoint's timestamps minus 3 s (recoverAbnormally)."""
    async with running(tmp_path, crash=True) as st:
        for _ in range(24):
            await put(st, "Own", 0, bytes(1500))
            await trio.sleep(0.002)  # distinct store times
        await st.flush()
        end = st.commitlog.max_offset
    starts = sorted(int(f) for f in os.listdir(tmp_path / "commitlog"))
    starts = [s for s in starts if s < end]
    assert len(starts) >= 5
    cpath = tmp_path / "checkpoint"
    ts1 = first_store_timestamp(tmp_path / "commitlog" / file_name(starts[1]))
    cpath.write_bytes(struct.pack(">qqq", ts1 + 3000, ts1 + 3000, 0).ljust(ROCKETMQ_CHECKPOINT_SIZE, b"\0"))
    async with running(tmp_path) as st:  # the abort marker is there: abnormal
        rep = st.recovery
        assert rep.abnormal and rep.checkpoint == "rocketmq" and rep.scan_from == starts[1]
        assert rep.end_offset == end and rep.units_rebuilt == 0
        assert len(pull_all(st, "Own", 0)) == 24
    cpath.write_bytes(struct.pack(">qqq", ts1, ts1, 0).ljust(ROCKETMQ_CHECKPOINT_SIZE, b"\0"))
    async with running(tmp_path) as st:
        rep = st.recovery
        assert not rep.abnormal and rep.checkpoint == "rocketmq" and rep.scan_from == starts[-3]
        assert rep.units_rebuilt == 0 and st.get_max_offset_in_queue("Own", 0) == 24


async def test_older_store_with_short_queue_files_opens_and_is_pre_sized(tmp_path: Path) -> None:
    """Queue files written before pre-sizing were as long as their units; they open as they are, nothing is
    rescanned, and they come out at RocketMQ's length."""
    async with running(tmp_path) as st:
        for i in range(40):
            await put(st, "Old", i % 2, b"o%d" % i)
    for f in (tmp_path / "consumequeue" / "Old").glob("*/*"):
        data = f.read_bytes()
        units = [u for u in struct.iter_unpack(">qiq", data) if u != (0, 0, 0)]
        f.write_bytes(data[: 20 * len(units)])
    assert rocketmq_would_load(tmp_path, SEG, CQ_FILE)
    async with running(tmp_path) as st:
        rep = st.recovery
        assert rep.records_verified == 0 and rep.units_rebuilt == 0 and not rep.queues_trimmed
        assert [len(pull_all(st, "Old", q)) for q in (0, 1)] == [20, 20]
    assert rocketmq_would_load(tmp_path, SEG, CQ_FILE) == []


def test_get_property() -> None:
    props = encode_properties({"TAGS": "a", "XTAGS": "b", "KEYS": "k"})
    assert get_property(props, "TAGS") == "a"
    assert get_property(props, "KEYS") == "k"
    assert get_property(props, "AGS") is None
    assert get_property("", "TAGS") is None
    assert get_property("TAGS\x01last", "TAGS") == "last"


async def test_a_second_store_on_the_same_directory_is_refused(tmp_path: Path) -> None:
    async with running(tmp_path):
        other = make_store(tmp_path)
        with pytest.raises(StoreError, match="in use"):
            await other.start()
    async with running(tmp_path) as st:  # released by the clean stop
        assert st.running


def test_scan_of_an_empty_directory(tmp_path: Path) -> None:
    assert scan_commit_log(tmp_path, SEG, 0, check_crc=True) == (0, "end", 0)


def test_atomic_json_files(tmp_path: Path) -> None:
    from trimq.broker.store.atomic import read_json, write_json_atomic

    path = tmp_path / "config" / "x.json"
    assert read_json(path, {"default": 1}) == {"default": 1}
    write_json_atomic(path, {"b": 2, "a": [1, "ü"]})
    assert read_json(path) == {"a": [1, "ü"], "b": 2}
    assert [p.name for p in path.parent.iterdir()] == ["x.json"]  # no temp file left behind
    path.write_text("{not json")
    with pytest.raises(ValueError, match=r"x\.json"):
        read_json(path)


def test_threads_replacing_the_same_json_file_at_once_each_write_a_whole_file(tmp_path: Path) -> None:
    import threading

    from trimq.broker.store.atomic import read_json, write_json_atomic

    path = tmp_path / "config" / "x.json"
    failures: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            for i in range(30):
                write_json_atomic(path, {"writer": n, "i": i, "pad": "x" * 4096 * n})
        except BaseException as exc:  # (a thread's exception would otherwise only be printed)
            failures.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in (1, 2, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    last = read_json(path)
    assert last["i"] == 29 and last["pad"] == "x" * 4096 * last["writer"]
    assert [p.name for p in path.parent.iterdir()] == ["x.json"]
