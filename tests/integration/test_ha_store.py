"""Replication at the store level (broker/store/ha): a master store's HAService and a slave store's HAClient
over loopback TCP. The slave's commit log is byte-identical to the master's over the range it holds (segment
roll-overs and fillers included), its consume queues are rebuilt from the received records, a fresh slave starts
on the master's last segment boundary, and a slave holding a tail the new master never had cuts it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from trimq.broker.store.ha.history import HAState
from trimq.broker.store.ha.master import HAService
from trimq.broker.store.ha.slave import HAClient
from trimq.broker.store.message_store import MessageStore
from trimq.broker.store.store_base import GetMessageStatus, PutMessageStatus, StoreConfig

SEGMENT = 4096  # tiny segments: every test rolls over several times


def _store(path: Path) -> MessageStore:
    cfg = StoreConfig(store_dir=str(path), segment_size=SEGMENT, consume_queue_file_size=64 * 20,
                      max_message_size=2048, message_index_enable=False)
    return MessageStore(cfg, store_host=lambda: ("127.0.0.1", 10911))


@asynccontextmanager
async def _running(store: MessageStore) -> AsyncIterator[trio.Nursery]:
    await store.start()
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(store.run)
            yield nursery
            nursery.cancel_scope.cancel()
    finally:
        await store.stop()


async def _put(store: MessageStore, n: int, *, topic: str = "T", body: bytes = b"x" * 300) -> None:
    for i in range(n):
        res = await store.put_message(topic, i % 3, body + str(i).encode(), {"KEYS": f"k{i}"},
                                      born_timestamp=1, born_host=("127.0.0.1", 1))
        assert res.status is PutMessageStatus.PUT_OK


async def _caught_up(master: MessageStore, slave: MessageStore, client: HAClient) -> None:
    with trio.fail_after(10):
        while not client.connected or slave.commitlog.max_offset != master.commitlog.max_offset or \
                client.writer.reput_offset < slave.commitlog.max_offset:
            await trio.sleep(0.01)


def _log_bytes(store: MessageStore, start: int, end: int) -> bytes:
    out = bytearray()
    for seg in store.commitlog.segments:
        lo, hi = max(start, seg.start), min(end, seg.end)
        if lo < hi:
            out += seg.path.read_bytes()[lo - seg.start : hi - seg.start]
    return bytes(out)


def _pair(master: MessageStore, slave: MessageStore, mstate: HAState, sstate: HAState
          ) -> tuple[HAService, HAClient]:
    service = HAService(master, mstate, batch_size=1000, master_addr=lambda: "127.0.0.1:10911")
    client = HAClient(slave, sstate, master_ha_address=lambda: service.address, reconnect_interval_ms=50)
    return service, client


async def test_replication_is_byte_identical_across_segment_roll_over(tmp_path: Path) -> None:
    master, slave = _store(tmp_path / "m"), _store(tmp_path / "s")
    mstate = HAState(None, history=[(1, 0)])
    async with _running(master) as mn, _running(slave) as sn:
        service, client = _pair(master, slave, mstate, HAState(None))
        await mn.start(service.serve)
        await _put(master, 20)  # before the slave connects: it starts on the last segment boundary
        boundary = master.commitlog.max_offset - master.commitlog.max_offset % SEGMENT
        await sn.start(client.run)
        with trio.fail_after(10):
            while not client.connected:
                await trio.sleep(0.01)
        assert client.master is not None
        first = client.master.start_offset
        assert first == boundary > 0
        await _put(master, 40)  # while connected: streamed, across several roll-overs
        await _caught_up(master, slave, client)
        assert len(master.commitlog.segments) >= 4
        assert slave.commitlog.min_offset == first > 0
        end = master.commitlog.max_offset
        assert _log_bytes(slave, first, end) == _log_bytes(master, first, end)
        # whole segment files are identical, fillers included
        for seg in slave.commitlog.segments[:-1]:
            assert seg.path.read_bytes() == (tmp_path / "m" / "commitlog" / seg.path.name).read_bytes()
        assert service.push_slave_max_offset == end and service.lag_bytes() == 0
        # consume queues rebuilt: every queue ends where the master's does; the messages it has are readable
        for qid in range(3):
            mq, sq = master.find_consume_queue("T", qid), slave.find_consume_queue("T", qid)
            assert mq is not None and sq is not None
            assert sq.max_offset == mq.max_offset
            assert sq.min_offset > 0  # the fresh slave's queues start at its first record
            got = slave.get_message("T", qid, sq.min_offset, 32)
            want = master.get_message("T", qid, sq.min_offset, 32)
            assert got.status is GetMessageStatus.FOUND and got.body == want.body
        assert sstate_history(client) == [(1, 0)]


def sstate_history(client: HAClient) -> list[tuple[int, int]]:
    return client.state.history


async def test_slave_cuts_a_tail_the_new_master_never_had(tmp_path: Path) -> None:
    """The old master (epoch 1) wrote past the point where the slave was promoted (epoch 2 from offset X): when
    it follows the new master, its log is cut back to X and then holds the new master's bytes."""
    old, new = _store(tmp_path / "old"), _store(tmp_path / "new")
    async with _running(old) as on, _running(new) as nn:
        old_state, new_state = HAState(None, history=[(1, 0)]), HAState(None)
        service, client = _pair(old, new, old_state, new_state)
        await on.start(service.serve)
        await nn.start(client.run)
        await _put(old, 5)
        await _caught_up(old, new, client)
        nn.cancel_scope.cancel()
    # the slave is gone; the old master writes a tail it never replicates
    async with _running(old) as on, _running(new) as nn:
        promoted_at = new.commitlog.max_offset
        await _put(old, 7, body=b"old-tail")
        old_end = old.commitlog.max_offset
        assert old_end > promoted_at
        new_state.begin_epoch(2, promoted_at)  # promotion
        new.writable = True
        await _put(new, 3, body=b"new-master")
        service2, client2 = _pair(new, old, new_state, old_state)
        # What a reader of the old master sees while the cut is made durable: the log already cut, and the new epoch
        # (a consumer moved back to a cut queue's end under the old one waited RocketMQ's 10 s for an illegal offset)
        seen: list[tuple[int, int]] = []
        real_flush = old.flush

        async def observed_flush() -> None:
            seen.append((old.commitlog.max_offset, old_state.master_epoch))
            await real_flush()

        old.flush = observed_flush  # type: ignore[method-assign]
        await nn.start(service2.serve)
        await on.start(client2.run)
        await _caught_up(new, old, client2)
        assert (promoted_at, 2) in seen and (promoted_at, 1) not in seen, seen
        end = new.commitlog.max_offset
        assert old.commitlog.max_offset == end
        assert _log_bytes(old, 0, end) == _log_bytes(new, 0, end)
        assert old_state.history == [(1, 0), (2, promoted_at)]
        for qid in range(3):  # no unit of the cut tail survives
            oq, nq = old.find_consume_queue("T", qid), new.find_consume_queue("T", qid)
            assert oq is not None and nq is not None and oq.max_offset == nq.max_offset
            res = old.get_message("T", qid, 0, 32)
            assert res.body == new.get_message("T", qid, 0, 32).body
            assert b"old-tail" not in res.body


async def test_a_restarted_slave_whose_log_starts_late_keeps_dispatching(tmp_path: Path) -> None:
    """Regressions: a slave whose log starts on the master's segment boundary (not 0) restarts. Its reput position
    started at 0, before its first segment, so no record received afterwards got a unit; and the segment file
    prepared at 0 before the first frame arrived was left on disk, so the store refused to open ("does not
    follow")."""
    master = _store(tmp_path / "m")
    async with _running(master) as mn:
        service = HAService(master, HAState(None, history=[(1, 0)]), batch_size=1000)
        await mn.start(service.serve)
        await _put(master, 20)
        for _ in range(2):  # a fresh slave, then the same store restarted
            slave = _store(tmp_path / "s")
            async with _running(slave) as sn:
                client = HAClient(slave, HAState(None), master_ha_address=lambda: service.address,
                                  reconnect_interval_ms=50)
                await sn.start(client.run)
                await _put(master, 10)
                await _caught_up(master, slave, client)
                assert slave.commitlog.min_offset > 0
                for qid in range(3):
                    mq, sq = master.find_consume_queue("T", qid), slave.find_consume_queue("T", qid)
                    assert mq is not None and sq is not None and sq.max_offset == mq.max_offset
                sn.cancel_scope.cancel()


async def test_a_slave_reporting_more_than_the_master_has_is_dropped_and_believed_in_nothing(tmp_path: Path) -> None:
    """A "slave" that reports an offset past the master's log end (a hostile peer, or a bug) would make a SYNC_MASTER
    answer every later send as replicated: the master closes that connection, saying why, believes nothing of the
    report, and goes on serving an honest slave."""
    from trimq.broker.store.ha.codec import Hello, StreamBuffer, encode_hello, encode_offset_report

    master, slave = _store(tmp_path / "master"), _store(tmp_path / "slave")
    async with _running(master) as mn, _running(slave) as sn:
        service, client = _pair(master, slave, HAState(None, history=[(1, 0)]), HAState(None))
        await mn.start(service.serve)
        await _put(master, 3)
        host, port = service.address.rsplit(":", 1)
        liar = await trio.open_tcp_stream(host, int(port))
        await liar.send_all(encode_hello(Hello(1, 0)))
        buf = StreamBuffer()
        with trio.fail_after(5):
            while buf.next_hello_ack() is None:
                buf.feed(await liar.receive_some(4096))
        await liar.send_all(encode_offset_report(master.commitlog.max_offset + 10**9))
        with trio.fail_after(5):  # the master closes the connection (after the frames it had queued)
            while await liar.receive_some(65536):
                pass
        await liar.aclose()
        assert service.push_slave_max_offset <= master.commitlog.max_offset and not service.connections
        await sn.start(client.run)
        await _put(master, 2)
        await _caught_up(master, slave, client)
        with trio.fail_after(10):  # and its report arrives
            while service.push_slave_max_offset != master.commitlog.max_offset:
                await trio.sleep(0.01)
