"""The index in a real store (broker/store/index_dispatch.py): written by its own task as messages are stored,
lookups that check every record, recovery past the index's newest entry (behind, ahead of a cut log, missing
altogether), deletion with the commit log, and the index switched off. Tiny geometry throughout."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio

from trimq.broker.store.message_store import MessageStore
from trimq.broker.store.store_base import PutResult, StoreConfig

SEG = 4096
HOST = ("10.0.0.1", 10911)
BORN = ("192.168.0.7", 40001)
FOREVER = 2**62


def config(path: Path, **kw: Any) -> StoreConfig:
    return StoreConfig(str(path), segment_size=SEG, consume_queue_file_size=20 * 8, max_hash_slot_num=16,
                       max_index_num=kw.pop("max_index_num", 64), **kw)


@asynccontextmanager
async def running(path: Path, **kw: Any) -> AsyncIterator[MessageStore]:
    st = MessageStore(config(path, **kw), store_host=lambda: HOST)
    await st.start()
    async with trio.open_nursery() as nursery:
        await nursery.start(st.run)
        try:
            yield st
        finally:
            nursery.cancel_scope.cancel()
    await st.stop()


async def put(st: MessageStore, topic: str, body: bytes, keys: str | None = None, uniq: str | None = None) -> PutResult:
    props = {k: v for k, v in (("KEYS", keys), ("UNIQ_KEY", uniq)) if v is not None}
    res = await st.put_message(topic, 0, body, props, born_timestamp=0, born_host=BORN)
    assert res.ok, res
    return res


async def caught_up(st: MessageStore) -> None:
    assert await st.index_dispatcher.wait_dispatched(st.commitlog.max_offset, 5)


def bodies(st: MessageStore, topic: str, key: str, *, unique: bool = False, max_num: int = 64,
           begin: int = 0, end: int = FOREVER) -> list[bytes]:
    return [m.body for m in st.index_dispatcher.query_messages(topic, key, max_num, begin, end, unique=unique).messages]


async def test_indexed_by_its_task_and_checked_on_lookup(tmp_path: Path) -> None:
    async with running(tmp_path / "s") as st:
        a = await put(st, "T", b"m1", keys="order-1 customer-9", uniq="U1")
        await put(st, "T", b"m2", keys="order-2", uniq="U2")
        c = await put(st, "T", b"m3", keys="order-1", uniq="U3")
        await put(st, "Other", b"o1", keys="order-1", uniq="U4")
        await put(st, "T", b"aa", keys="Aa")  # "T#Aa" and "T#BB" differ, but "Aa"/"BB" collide on their own
        await put(st, "T", b"none")
        await put(st, "T", b"body with KEYS\x01 and UNIQ_KEY\x01 bytes")  # no keys: looked at, not indexed
        await put(st, "T", b"m6", keys="order-6")
        await caught_up(st)
        assert bodies(st, "T", "order-6") == [b"m6"]
        assert bodies(st, "T", "order-1") == [b"m1", b"m3"]  # oldest first, other topics left out
        assert bodies(st, "T", "customer-9") == [b"m1"]
        assert bodies(st, "T", "order-1", max_num=1) == [b"m3"]  # the newest max_num
        assert bodies(st, "Other", "order-1") == [b"o1"]
        assert bodies(st, "T", "U2", unique=True) == [b"m2"]
        assert bodies(st, "T", "U2") == []  # by key: KEYS only (RocketMQ's client filter)
        assert bodies(st, "T", "order-1", unique=True) == []
        assert bodies(st, "T", "order-1", end=a.store_timestamp - 1) == []  # exact store times
        assert bodies(st, "T", "order-1", begin=c.store_timestamp + 1) == []
        assert bodies(st, "T", "order-1", begin=a.store_timestamp, end=c.store_timestamp) == [b"m1", b"m3"]
        assert bodies(st, "T", "missing") == []
        res = st.index_dispatcher.query_messages("T", "order-1", 64, 0, FOREVER)
        assert res.index_last_update_phyoffset == st.index.end_phy_offset > 0
        assert [m.commit_log_offset for m in res.messages] == [a.commit_log_offset, res.messages[1].commit_log_offset]
        assert st.index.entry_count() == 11  # 4 unique keys + 7 key words (the keyless messages: none)
        # every record is indexed once, whatever order the appends and the task ran in
        assert st.index_dispatcher.records_indexed == 6


async def test_restart_resumes_without_duplicates(tmp_path: Path) -> None:
    async with running(tmp_path / "s") as st:
        for i in range(5):
            await put(st, "T", b"a%d" % i, keys="k")
        await caught_up(st)
        entries = st.index.entry_count()
    async with running(tmp_path / "s") as st:
        await caught_up(st)
        assert st.index.entry_count() == entries  # the newest record is not indexed twice
        await put(st, "T", b"b", keys="k")
        await caught_up(st)
        assert bodies(st, "T", "k") == [b"a0", b"a1", b"a2", b"a3", b"a4", b"b"]


async def test_rebuilt_when_missing_or_behind(tmp_path: Path) -> None:
    store = tmp_path / "s"
    async with running(store) as st:
        for i in range(3):
            await put(st, "T", b"a%d" % i, keys="k", uniq=f"U{i}")
        await caught_up(st)
        st.index.flush()
        shutil.copytree(store / "index", tmp_path / "older")
        for i in range(3, 6):
            await put(st, "T", b"a%d" % i, keys="k", uniq=f"U{i}")
    # the index lost its newest entries (a crash before they were synced): rebuilt past what survived
    shutil.rmtree(store / "index")
    shutil.copytree(tmp_path / "older", store / "index")
    async with running(store) as st:
        await caught_up(st)
        assert bodies(st, "T", "k") == [b"a%d" % i for i in range(6)]
        assert bodies(st, "T", "U5", unique=True) == [b"a5"]
    # no index at all (a store from before the index): built from the log's first record
    shutil.rmtree(store / "index")
    async with running(store) as st:
        await caught_up(st)
        assert bodies(st, "T", "k") == [b"a%d" % i for i in range(6)]


async def test_index_ahead_of_a_cut_log(tmp_path: Path) -> None:
    store = tmp_path / "s"
    async with running(store) as st:
        await put(st, "T", b"m1", keys="k")
        m2 = await put(st, "T", b"m2", keys="k")
        await put(st, "T", b"m3", keys="k")
        await caught_up(st)
    # The log loses m2 and m3 (their bytes never reached the disk), the index kept their entries.
    seg = store / "commitlog" / f"{0:020d}"
    with open(seg, "r+b") as fh:
        fh.seek(m2.commit_log_offset)
        fh.write(bytes(SEG - m2.commit_log_offset))
    os.unlink(store / "checkpoint")  # recovery scans the whole log and cuts it after m1
    async with running(store) as st:
        assert st.commitlog.max_offset == m2.commit_log_offset
        assert bodies(st, "T", "k") == [b"m1"]  # the stale entries find nothing
        await put(st, "T", b"m4", keys="k")  # written where m2 was
        await put(st, "T", b"m5", keys="other")
        await caught_up(st)
        assert bodies(st, "T", "k") == [b"m1", b"m4"]
        assert bodies(st, "T", "other") == [b"m5"]


async def test_files_deleted_with_the_commit_log(tmp_path: Path) -> None:
    async with running(tmp_path / "s", max_index_num=4) as st:  # 3 entries per index file
        for i in range(12):
            await put(st, "T", b"%04d" % i + bytes(1000), keys=f"k{i}")  # 3 records per 4 KiB segment
        await caught_up(st)
        assert len(st.index.files) == 4
        for _ in range(2):
            st.delete_first_segment()
        await st.cleaner.delete_expired_consume_queues()
        assert len(st.index.files) == 2  # the two whose newest entry is below the log's first offset
        assert sorted(os.listdir(tmp_path / "s" / "index")) == [f.path.name for f in st.index.files]
        assert bodies(st, "T", "k0") == []
        assert [b[:4] for b in bodies(st, "T", "k11")] == [b"0011"]


async def test_switched_off(tmp_path: Path) -> None:
    async with running(tmp_path / "s", message_index_enable=False) as st:
        await put(st, "T", b"m1", keys="k", uniq="U")
        assert await st.index_dispatcher.wait_dispatched(st.commitlog.max_offset, 0)
        assert bodies(st, "T", "k") == []
    assert not (tmp_path / "s" / "index").exists() or os.listdir(tmp_path / "s" / "index") == []


async def test_index_from_the_appends_notes_equals_the_index_read_back_from_the_log(tmp_path: Path) -> None:
    """The append hands the index each keyed record's fields (issue 22: no read back); the files are byte for
    byte those an index rebuilt from the records themselves gets."""
    store = tmp_path / "s"
    async with running(store) as st:
        for i in range(4):
            await put(st, "T", b"a%d" % i, keys="k1 k2" if i % 2 else None, uniq=f"U{i}")
        await put(st, "Other", b"o", keys="k1")
        await st.put_messages("T", 0, [(b"b0", "UNIQ_KEY\x01B0\x02", 0), (b"b1", "__SHARDINGKEY\x01s\x02", 0),
                                       (b"b2", "KEYS\x01k3\x02UNIQ_KEY\x01B2\x02", 0)],
                              born_timestamp=0, born_host=BORN)
        await caught_up(st)
        assert st.index_dispatcher._known == {}
        st.index.flush()
    noted = sorted(p.read_bytes() for p in (store / "index").iterdir())
    shutil.rmtree(store / "index")
    async with running(store) as st:  # no index: rebuilt by reading every record back
        await caught_up(st)
        st.index.flush()
        assert bodies(st, "T", "k3") == [b"b2"] and bodies(st, "T", "B0", unique=True) == [b"b0"]
    assert sorted(p.read_bytes() for p in (store / "index").iterdir()) == noted


async def test_a_pass_mixing_noted_and_read_back_records_indexes_them_in_log_order(tmp_path: Path) -> None:
    """Records the append noted and records the index must read back (a slave's, or notes already dropped) can
    meet in one pass: they are indexed in commit-log order, so none is skipped as older than the index's end."""
    store = tmp_path / "s"
    async with running(store) as st:
        disp = st.index_dispatcher
        note = disp.note_keyed

        def note_every_other(offsets: list[int], known: Any = None) -> None:
            note(offsets, known)
            for offset in offsets[1::2]:
                disp._known.pop(offset, None)  # these are read back from the log

        disp.note_keyed = note_every_other  # type: ignore[method-assign]
        await st.put_messages("T", 0, [(b"m%d" % i, f"KEYS\x01k{i % 2}\x02UNIQ_KEY\x01U{i}\x02", 0)
                                       for i in range(6)], born_timestamp=0, born_host=BORN)
        await caught_up(st)
        assert bodies(st, "T", "k0") == [b"m0", b"m2", b"m4"] and bodies(st, "T", "k1") == [b"m1", b"m3", b"m5"]
        st.index.flush()
    mixed = sorted(p.read_bytes() for p in (store / "index").iterdir())
    shutil.rmtree(store / "index")
    async with running(store) as st:  # rebuilt by reading every record back
        await caught_up(st)
        st.index.flush()
    assert sorted(p.read_bytes() for p in (store / "index").iterdir()) == mixed
