"""Crash recovery of a real ``trimq-broker`` process: SIGKILL in the middle of a SYNC_FLUSH send stream,
then garbage appended to the commit log and a consume-queue file that lost its last unit and a half (cut
short, as an older trimq store's files were).

After each restart: every acknowledged message is pulled back intact, in queue order, with no gap and no
partial record, and the consume queues agree with the commit log (checked offline, file by file).
"""

from __future__ import annotations

import json
import os
import random
import struct
from collections import defaultdict
from pathlib import Path
from typing import Any

import trio

from trimq.broker.store.consume_queue import tags_string_to_tags_code
from trimq.protocol.codes import RequestCode, ResponseCode
from trimq.protocol.command import RemotingCommand
from trimq.protocol.message import encode_properties
from trimq.protocol.record import BLANK_MAGIC_CODE, decode_record, iter_records
from trimq.runtime.client import RemotingClient, RemotingError

SEG = 64 * 1024  # the daemons fixture's small store geometry
CQ_FILE = 64 * 20
TOPIC = "Crash"
QUEUES = 3
WORKERS = 8


async def call(rc: RemotingClient, addr: str, code: int, ext: dict[str, Any], body: Any = None
               ) -> RemotingCommand:
    return await rc.invoke(addr, RemotingCommand.request(code, ext, body), timeout_s=10)


def body_for(worker: int, i: int, rng: random.Random) -> bytes:
    head = f"w{worker}-m{i}-".encode()
    return head + bytes(rng.randrange(256) for _ in range(rng.choice((0, 10, 200, 1500, 5000))))


async def send_until_killed(addr: str, daemon: Any, kill_after: int, rng: random.Random
                            ) -> dict[tuple[int, int], bytes]:
    """WORKERS concurrent senders; the broker is SIGKILLed once ``kill_after`` sends were acknowledged."""
    acked: dict[tuple[int, int], bytes] = {}
    async with RemotingClient() as rc:

        async def worker(w: int) -> None:
            i = 0
            while True:
                body = body_for(w, i, rng)
                qid = (w + i) % QUEUES
                ext = {"producerGroup": "p", "topic": TOPIC, "queueId": qid, "bornTimestamp": 0,
                       "properties": encode_properties({"TAGS": f"t{i % 2}", "KEYS": f"w{w}"})}
                try:
                    r = await call(rc, addr, RequestCode.SEND_MESSAGE, ext, body)
                except RemotingError:
                    return  # the broker is gone: this send was never acknowledged
                assert r.code == ResponseCode.SUCCESS, r.remark
                acked[(qid, r.ext["queueOffset"])] = body
                if len(acked) >= kill_after and daemon.proc.poll() is None:
                    daemon.kill()
                i += 1

        async with trio.open_nursery() as nursery:
            for w in range(WORKERS):
                nursery.start_soon(worker, w)
    return acked


async def pull_queue(rc: RemotingClient, addr: str, qid: int) -> list[Any]:
    out: list[Any] = []
    offset = 0
    while True:
        r = await call(rc, addr, RequestCode.PULL_MESSAGE,
                       {"consumerGroup": "check", "topic": TOPIC, "queueId": qid, "queueOffset": offset,
                        "maxMsgNums": 32, "sysFlag": 0})
        if r.code != ResponseCode.SUCCESS:
            assert r.code == ResponseCode.PULL_NOT_FOUND, (r.code, r.remark)
            return out
        msgs = list(iter_records(r.body))  # raises on any partial or corrupt record
        out.extend(msgs)
        offset = r.ext["nextBeginOffset"]


async def check_queues(addr: str, acked: dict[tuple[int, int], bytes]) -> dict[int, int]:
    """Every acknowledged message is there, in order, no gaps; returns the max offset per queue."""
    maxes = {}
    async with RemotingClient() as rc:
        for qid in range(QUEUES):
            msgs = await pull_queue(rc, addr, qid)
            assert [m.queue_offset for m in msgs] == list(range(len(msgs))), f"gap in queue {qid}"
            assert all(m.queue_id == qid and m.topic == TOPIC for m in msgs)
            by_offset = {m.queue_offset: m.body for m in msgs}
            for (q, off), body in acked.items():
                if q == qid:
                    assert by_offset.get(off) == body, f"acknowledged message {qid}/{off} lost or changed"
            maxes[qid] = len(msgs)
    return maxes


def check_store_files(store: Path) -> int:
    """Offline: the consume-queue units and the commit-log records agree one to one. Returns the log end."""
    records: dict[int, Any] = {}
    per_queue: dict[tuple[str, int], int] = defaultdict(int)
    end = 0
    cl = store / "commitlog"
    for name in sorted(os.listdir(cl)):
        start = int(name)
        data = (cl / name).read_bytes()
        pos = 0
        while pos + 8 <= len(data):
            size, magic = struct.unpack_from(">iI", data, pos)
            if magic == BLANK_MAGIC_CODE:
                assert pos + size == SEG
                end = start + SEG
                break
            if magic == 0:
                assert data[pos:] == bytes(len(data) - pos), "non-zero bytes after the end of the log"
                break
            m = decode_record(data, pos)  # verifies the CRC and every length
            assert m.commit_log_offset == start + pos
            records[start + pos] = m
            per_queue[(m.topic, m.queue_id)] += 1
            pos += size
            end = start + pos
    cq_root = store / "consumequeue"
    for topic in os.listdir(cq_root):
        for qid_s in os.listdir(cq_root / topic):
            qdir = cq_root / topic / qid_s
            files = [(qdir / f).read_bytes() for f in sorted(os.listdir(qdir))]
            assert {len(f) for f in files} == {CQ_FILE}, "queue files are pre-sized, as RocketMQ requires"
            units = list(struct.iter_unpack(">qiq", b"".join(files)))
            n = next((k for k, (phys, size, _) in enumerate(units) if not (phys >= 0 and size > 0)), len(units))
            assert set(units[n:]) <= {(0, 0, 0)}, "only zeros after the first invalid unit (RocketMQ's end rule)"
            units = units[:n]
            assert len(units) == per_queue[(topic, int(qid_s))], f"{topic}/{qid_s}: units != records"
            for k, (phys, size, tags) in enumerate(units):
                m = records[phys]
                assert (m.topic, m.queue_id, m.queue_offset, m.store_size) == (topic, int(qid_s), k, size)
                assert tags == tags_string_to_tags_code(m.tags)
    return end


def unit_bytes(path: Path) -> int:
    """Bytes of a pre-sized queue file up to its first all-zero unit."""
    units = list(struct.iter_unpack(">qiq", path.read_bytes()))
    return 20 * next((k for k, u in enumerate(units) if u == (0, 0, 0)), len(units))


def recovery_report(log: str) -> dict[str, Any]:
    lines = [json.loads(line) for line in log.splitlines() if '"store.recovered"' in line]
    assert len(lines) == 1
    return lines[0]  # type: ignore[no-any-return]


async def test_sigkill_during_sync_flush_then_garbage_and_a_truncated_queue(daemons: Any, tmp_path: Path) -> None:
    seed = int(os.environ.get("TRIMQ_CRASH_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    print(f"crash test seed: {seed} (TRIMQ_CRASH_SEED to replay)")
    store = tmp_path / "store"

    # 1. SIGKILL at a random point of a stream of concurrent SYNC_FLUSH sends.
    broker = await daemons.broker(store, "--flush", "sync")
    acked = await send_until_killed(broker.address, broker, rng.randint(40, 400), rng)
    assert broker.proc.returncode == -9 and (store / "abort").exists()
    broker = await daemons.broker(store, "--flush", "sync")
    assert recovery_report(broker.log_text())["abnormal"] is True
    maxes = await check_queues(broker.address, acked)
    assert sum(maxes.values()) >= len(acked)
    assert broker.terminate() == 0
    end = check_store_files(store)

    # 2. Damage while stopped: a torn record plus garbage at the end of the log, and a consume-queue file
    #    that lost one and a half units.
    seg_start = end - end % SEG
    first = (store / "commitlog" / f"{0:020d}").read_bytes()
    torn = bytearray(first[: struct.unpack_from(">i", first, 0)[0]])
    struct.pack_into(">q", torn, 28, end)
    seg_path = store / "commitlog" / f"{seg_start:020d}"
    with open(seg_path, "r+b" if seg_path.exists() else "wb") as fh:
        fh.seek(end - seg_start)
        fh.write(bytes(torn[: len(torn) // 2]) + os.urandom(300))
    qdir = store / "consumequeue" / TOPIC / "0"
    last_cq = qdir / sorted(os.listdir(qdir))[-1]
    size = unit_bytes(last_cq)
    if size < 30:  # the last file holds too little: cut into the previous one instead
        os.unlink(last_cq)
        last_cq = qdir / sorted(os.listdir(qdir))[-1]
        size = unit_bytes(last_cq)
    os.truncate(last_cq, size - 30)

    broker = await daemons.broker(store)
    rep = recovery_report(broker.log_text())
    assert rep["end_offset"] == end and rep["stop_reason"] != "end" and rep["units_rebuilt"] >= 1
    assert await check_queues(broker.address, acked) == maxes
    async with RemotingClient() as rc:
        r = await call(rc, broker.address, RequestCode.SEND_MESSAGE,
                       {"producerGroup": "p", "topic": TOPIC, "queueId": 0, "bornTimestamp": 0}, b"after")
        assert r.code == ResponseCode.SUCCESS and r.ext["queueOffset"] == maxes[0]
    broker.kill()
    assert check_store_files(store) > end
