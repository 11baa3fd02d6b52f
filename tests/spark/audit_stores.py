"""Build broker-shaped stores on disk for the audit tests, with defects planted on purpose.

The layout is the storage contract (DESIGN.md §4, ROCKETMQ_FACTS.md §9): ``commitlog/`` segments named by
their 20-digit base offset, preallocated (zeros after the data) and closed with the blank filler when
the next record does not fit; ``consumequeue/<topic>/<qid>/`` files of 20-byte units;
``config/consumerOffset.json`` and ``config/topics.json``. Retries follow RocketMQ's broker: a send-back
goes to ``SCHEDULE_TOPIC_XXXX`` (queue = delay level - 1, REAL_TOPIC/REAL_QID set) and is re-stored in
``%RETRY%group`` when due; the last one goes straight to ``%DLQ%group``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trimq.protocol.message import MessageConst, encode_properties
from trimq.protocol.record import encode_blank, encode_record, message_id
from trimq.protocol.validation import SCHEDULE_TOPIC, dlq_topic, retry_topic

STORE_HOST = ("10.1.2.3", 10911)
BORN_HOST = ("192.168.7.8", 54321)
#: The split size the audit tests read these stores with: a few partitions per 4 KiB segment.
SPLIT_SIZE = 2000
DELAY_LEVEL_MS = [1000, 5000, 10000, 30000, 60000, 120000, 180000, 240000, 300000, 360000, 420000,
                  480000, 540000, 600000, 1200000, 1800000, 3600000, 7200000]


def java_string_hash(s: str) -> int:
    """java.lang.String.hashCode as a signed int32 (the consume-queue tags code)."""
    h = 0
    for ch in s.encode("utf-16-be").decode("utf-16-be"):
        h = (31 * h + ord(ch)) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


@dataclass(frozen=True)
class Stored:
    """What the builder stored for one message."""

    topic: str
    queue_id: int
    queue_offset: int
    physical_offset: int
    size: int
    msg_id: str
    properties: dict[str, str]
    reconsume_times: int
    born_timestamp: int
    store_timestamp: int
    body: bytes


class StoreBuilder:
    """Writes a store directory; call ``close()`` to write the consume queues and config files."""

    def __init__(
        self,
        root: Path | str,
        *,
        segment_size: int = 16 * 1024,
        cq_units_per_file: int = 8,
        start_ms: int = 1_700_000_000_000,
        step_ms: int = 1000,
        write_consume_queue: bool = True,
    ) -> None:
        self.root = Path(root)
        self.segment_size = segment_size
        self.cq_units_per_file = cq_units_per_file
        self.now = start_ms
        self.step_ms = step_ms
        self.write_consume_queue = write_consume_queue
        (self.root / "commitlog").mkdir(parents=True, exist_ok=True)
        (self.root / "config").mkdir(parents=True, exist_ok=True)
        self.base = 0
        self.pos = 0
        self._open_segment()
        self.next_offset: dict[tuple[str, int], int] = {}
        self.units: dict[tuple[str, int], dict[int, tuple[int, int, int]]] = {}
        self.consumer_offsets: dict[str, dict[str, int]] = {}
        self.topics: dict[str, int] = {}
        self.records: list[Stored] = []

    # -- commit log ------------------------------------------------------------------------------

    def _segment_path(self, base: int) -> Path:
        return self.root / "commitlog" / f"{base:020d}"

    def _open_segment(self) -> None:
        path = self._segment_path(self.base)
        with open(path, "wb") as f:
            f.truncate(self.segment_size)  # preallocated: zeros after the data, like a mapped file

    def _write_at(self, base: int, pos: int, data: bytes) -> None:
        with open(self._segment_path(base), "r+b") as f:
            f.seek(pos)
            f.write(data)

    def _append(self, record_len: int) -> tuple[int, int]:
        """Reserve room for a record, rolling to a new segment (after a filler) when it does not fit."""
        if record_len + 8 > self.segment_size:
            raise ValueError("record larger than a test segment")
        if self.pos + record_len + 8 > self.segment_size:
            self._write_at(self.base, self.pos, encode_blank(self.segment_size - self.pos))
            self.base += self.segment_size
            self.pos = 0
            self._open_segment()
        return self.base, self.pos

    def tick(self, ms: int | None = None) -> int:
        self.now += self.step_ms if ms is None else ms
        return self.now

    def store(
        self,
        topic: str,
        body: bytes,
        *,
        queue_id: int = 0,
        keys: str | None = None,
        tags: str | None = None,
        properties: dict[str, str] | None = None,
        born_timestamp: int | None = None,
        reconsume_times: int = 0,
        sys_flag: int = 0,
        tags_code: int | None = None,
        born_host: tuple[str, int] = BORN_HOST,
    ) -> Stored:
        """Append one message the way the broker does: next queue offset, its unit, its record."""
        store_ts = self.tick()
        props = dict(properties or {})
        if tags:
            props[MessageConst.TAGS] = tags
        if keys:
            props[MessageConst.KEYS] = keys
        qkey = (topic, queue_id)
        qoff = self.next_offset.get(qkey, 0)
        probe = encode_record(
            topic=topic, body=body, queue_id=queue_id, queue_offset=qoff, physical_offset=0,
            properties=encode_properties(props), born_host=born_host, store_host=STORE_HOST,
        )
        base, pos = self._append(len(probe))
        phys = base + pos
        born = store_ts - 3 if born_timestamp is None else born_timestamp
        rec = encode_record(
            topic=topic, body=body, queue_id=queue_id, queue_offset=qoff, physical_offset=phys,
            properties=encode_properties(props), sys_flag=sys_flag, born_timestamp=born,
            born_host=born_host, store_timestamp=store_ts, store_host=STORE_HOST,
            reconsume_times=reconsume_times,
        )
        self._write_at(base, pos, rec)
        self.pos += len(rec)
        self.next_offset[qkey] = qoff + 1
        self.topics[topic] = max(self.topics.get(topic, 0), queue_id + 1)
        code = tags_code if tags_code is not None else (java_string_hash(tags) if tags else 0)
        self.units.setdefault(qkey, {})[qoff] = (phys, len(rec), code)
        stored = Stored(topic, queue_id, qoff, phys, len(rec), message_id(STORE_HOST, phys), props,
                        reconsume_times, born, store_ts, body)
        self.records.append(stored)
        return stored

    def send_back(self, msg: Stored, group: str, *, max_reconsume_times: int = 16) -> Stored:
        """CONSUMER_SEND_MSG_BACK with delay level 0: schedule copy then retry copy, or the DLQ."""
        props = dict(msg.properties)
        props.setdefault(MessageConst.RETRY_TOPIC, msg.topic)
        props[MessageConst.ORIGIN_MESSAGE_ID] = props.get(MessageConst.ORIGIN_MESSAGE_ID) or msg.msg_id
        props.pop(MessageConst.DELAY_TIME_LEVEL, None)
        tags = props.pop(MessageConst.TAGS, None)
        keys = props.pop(MessageConst.KEYS, None)
        rt = msg.reconsume_times + 1
        if msg.reconsume_times >= max_reconsume_times:
            self.topics[dlq_topic(group)] = 1
            return self.store(dlq_topic(group), msg.body, queue_id=0, tags=tags, keys=keys, properties=props,
                              born_timestamp=msg.born_timestamp, reconsume_times=rt)
        level = 3 + msg.reconsume_times
        sched = dict(props)
        sched[MessageConst.DELAY_TIME_LEVEL] = str(level)
        sched[MessageConst.REAL_TOPIC] = retry_topic(group)
        sched[MessageConst.REAL_QUEUE_ID] = "0"
        delay = DELAY_LEVEL_MS[level - 1]
        self.store(SCHEDULE_TOPIC, msg.body, queue_id=level - 1, tags=tags, keys=keys, properties=sched,
                   born_timestamp=msg.born_timestamp, reconsume_times=rt, tags_code=self.now + delay)
        self.tick(delay)
        sched.pop(MessageConst.DELAY_TIME_LEVEL)
        return self.store(retry_topic(group), msg.body, queue_id=0, tags=tags, keys=keys, properties=sched,
                          born_timestamp=msg.born_timestamp, reconsume_times=rt)

    # -- planted defects -------------------------------------------------------------------------

    def skip_offset(self, topic: str, queue_id: int) -> int:
        """Lose one queue offset (the next message of the queue gets the one after). Returns it."""
        qkey = (topic, queue_id)
        lost = self.next_offset.get(qkey, 0)
        self.next_offset[qkey] = lost + 1
        return lost

    def flip_body_byte(self, msg: Stored, index: int = 0) -> None:
        """Corrupt one byte of a stored body (the record stays well-formed; its CRC no longer matches)."""
        if not msg.body:
            raise ValueError("message has no body")
        base = msg.physical_offset - msg.physical_offset % self.segment_size
        plen = len(encode_properties(msg.properties).encode())
        tlen = len(msg.topic.encode())
        pos = msg.physical_offset - base + msg.size - plen - 2 - tlen - 1 - len(msg.body) + index
        with open(self._segment_path(base), "r+b") as f:
            f.seek(pos)
            b = f.read(1)
            f.seek(pos)
            f.write(bytes([b[0] ^ 0xFF]))

    def torn_tail(self, topic: str, body: bytes, keep: int, queue_id: int = 0) -> int:
        """Write only the first ``keep`` bytes of the next record (a crash mid-write). Returns its offset."""
        qoff = self.next_offset.get((topic, queue_id), 0)
        rec = encode_record(topic=topic, body=body, queue_id=queue_id, queue_offset=qoff,
                            physical_offset=self.base + self.pos, born_host=BORN_HOST, store_host=STORE_HOST,
                            store_timestamp=self.tick(), born_timestamp=self.now - 3)
        base, pos = self._append(len(rec))
        self._write_at(base, pos, rec[:keep])
        return base + pos

    def raw(self, data: bytes) -> int:
        """Append arbitrary bytes to the commit log (garbage). Returns where they start."""
        base, pos = self._append(len(data))
        self._write_at(base, pos, data)
        self.pos += len(data)
        return base + pos

    # -- config ----------------------------------------------------------------------------------

    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        self.consumer_offsets.setdefault(f"{topic}@{group}", {})[str(queue_id)] = offset

    def close(self, *, spare_segment: bool = True) -> Path:
        """Write consume queues and config files; return the store root.

        ``spare_segment`` also creates the next segment, all zeros, as the broker does ahead of need.
        """
        if spare_segment:
            with open(self._segment_path(self.base + self.segment_size), "wb") as f:
                f.truncate(self.segment_size)
        if self.write_consume_queue:
            upf = self.cq_units_per_file
            for (topic, qid), units in self.units.items():
                qdir = self.root / "consumequeue" / topic / str(qid)
                qdir.mkdir(parents=True, exist_ok=True)
                last = max(units)
                for file_no in range(last // upf + 1):
                    data = bytearray(upf * 20)
                    for k in range(upf):
                        unit = units.get(file_no * upf + k)
                        if unit is not None:
                            data[k * 20 : k * 20 + 20] = unit[0].to_bytes(8, "big", signed=True) + unit[
                                1
                            ].to_bytes(4, "big", signed=True) + unit[2].to_bytes(8, "big", signed=True)
                    (qdir / f"{file_no * upf * 20:020d}").write_bytes(bytes(data))
        cfg = self.root / "config"
        (cfg / "consumerOffset.json").write_text(json.dumps({"offsetTable": self.consumer_offsets}, indent=1))
        table = {
            t: {"topicName": t, "readQueueNums": n, "writeQueueNums": n, "perm": 6} for t, n in self.topics.items()
        }
        (cfg / "topics.json").write_text(json.dumps({"topicConfigTable": table}, indent=1))
        return self.root


def segment_files(root: Path | str) -> list[str]:
    d = Path(root) / "commitlog"
    return sorted(str(p) for p in d.iterdir() if p.name.isdigit())


def file_size_total(root: Path | str) -> int:
    return sum(os.path.getsize(p) for p in segment_files(root))


# ---------------------------------------------------------------------------------------------------
# The stores the audit tests use


GROUP = "order-audit"


def _order_traffic(b: StoreBuilder, n: int = 48) -> list[Stored]:
    """Keyed orders over 4 queues (a key always to the same queue) and unkeyed payments over 2."""
    out = []
    for i in range(n):
        key = f"order-{i % 12}"
        out.append(b.store("Orders", f"order {i} body".encode() * 3, queue_id=(i % 12) % 4, keys=f"{key} extra",
                           tags="created"))
        if i % 3 == 0:
            out.append(b.store("Payments", b"p" * (40 + i), queue_id=i % 2, tags="paid"))
    return out


def build_clean_store(root: Path | str) -> dict[str, Any]:
    """A store with nothing wrong: several segments with fillers, a spare segment, consume queues, one
    message retried once (no dead letter), consumer offsets behind the queue ends."""
    b = StoreBuilder(root, segment_size=4096, cq_units_per_file=8)
    msgs = _order_traffic(b)
    retry = b.send_back(msgs[5], GROUP)
    for m in _order_traffic(b, 24):
        msgs.append(m)
    for q in range(4):
        b.commit_offset(GROUP, "Orders", q, 3 + q)
    b.commit_offset(GROUP, f"%RETRY%{GROUP}", 0, 1)
    b.close()
    return {"messages": len(b.records), "retry": retry, "builder": b}


def build_planted_store(root: Path | str) -> dict[str, Any]:
    """A store with exactly these defects: a flipped body byte, a torn tail, an offset gap, a key sent to
    two queues, two born-order inversions, and a message retried 3 times into the DLQ."""
    b = StoreBuilder(root, segment_size=4096, cq_units_per_file=8)
    msgs = _order_traffic(b, 24)
    flipped = msgs[7]
    b.flip_body_byte(flipped, 2)
    lost = b.skip_offset("Payments", 1)
    _order_traffic(b, 12)
    # One key, two queues (born order fine).
    split_a = b.store("Orders", b"split a", queue_id=0, keys="order-split")
    split_b = b.store("Orders", b"split b", queue_id=2, keys="order-split")
    # Two born-order inversions, on two keys.
    t = b.now
    b.store("Orders", b"inv1 a", queue_id=1, keys="order-inv1", born_timestamp=t + 10)
    b.store("Orders", b"inv1 b", queue_id=1, keys="order-inv1", born_timestamp=t + 50)
    inv1 = b.store("Orders", b"inv1 c", queue_id=1, keys="order-inv1", born_timestamp=t + 20)
    b.store("Orders", b"inv1 d", queue_id=1, keys="order-inv1", born_timestamp=t + 60)
    b.store("Orders", b"inv2 a", queue_id=3, keys="order-inv2", born_timestamp=t + 500)
    inv2 = b.store("Orders", b"inv2 b", queue_id=3, keys="order-inv2", born_timestamp=t + 100)
    # A poison message: three retries, then the DLQ.
    poison = b.store("Orders", b"poison pill", queue_id=0, keys="poison-1", tags="created")
    m = poison
    retries = []
    for _ in range(3):
        m = b.send_back(m, GROUP, max_reconsume_times=3)
        retries.append(m)
    dead = b.send_back(m, GROUP, max_reconsume_times=3)
    _order_traffic(b, 6)
    for q in range(4):
        b.commit_offset(GROUP, "Orders", q, 2)
    b.commit_offset(GROUP, f"%RETRY%{GROUP}", 0, 3)
    torn_at = b.torn_tail("Orders", b"torn" * 30, 68, queue_id=1)  # ends in the store host ip
    b.close()
    return {
        "builder": b, "flipped": flipped, "lost_offset": lost, "split": (split_a, split_b),
        "inversions": (inv1, inv2), "poison": poison, "retries": retries, "dead": dead, "torn_at": torn_at,
    }


# ---------------------------------------------------------------------------------------------------
# An encoder written from ROCKETMQ_FACTS.md §9 alone (not protocol.record), for RocketMQ-format stores.


def rocketmq_record(
    *,
    topic: str,
    body: bytes,
    queue_id: int,
    queue_offset: int,
    physical_offset: int,
    properties: dict[str, str],
    born_host: tuple[bytes, int],
    store_host: tuple[bytes, int],
    born_timestamp: int,
    store_timestamp: int,
    flag: int = 0,
    sys_flag: int = 0,
    reconsume_times: int = 0,
    prepared_transaction_offset: int = 0,
) -> bytes:
    """CommitLog.encode, field by field: big-endian, MAGICCODE -626843481, BODYCRC = crc32 & 0x7FFFFFFF,
    hosts as raw address bytes + int32 port (16-byte addresses set sysflag 0x10 / 0x20)."""
    import struct
    import zlib

    born_ip, born_port = born_host
    store_ip, store_port = store_host
    if len(born_ip) == 16:
        sys_flag |= 0x10
    if len(store_ip) == 16:
        sys_flag |= 0x20
    props = "".join(f"{k}\x01{v}\x02" for k, v in properties.items()).encode("utf-8")
    topic_b = topic.encode("utf-8")
    parts = [
        struct.pack(">i", -626843481),
        struct.pack(">i", zlib.crc32(body) & 0x7FFFFFFF),
        struct.pack(">i", queue_id),
        struct.pack(">i", flag),
        struct.pack(">q", queue_offset),
        struct.pack(">q", physical_offset),
        struct.pack(">i", sys_flag),
        struct.pack(">q", born_timestamp),
        born_ip + struct.pack(">i", born_port),
        struct.pack(">q", store_timestamp),
        store_ip + struct.pack(">i", store_port),
        struct.pack(">i", reconsume_times),
        struct.pack(">q", prepared_transaction_offset),
        struct.pack(">i", len(body)) + body,
        struct.pack(">b", len(topic_b)) + topic_b,
        struct.pack(">h", len(props)) + props,
    ]
    rest = b"".join(parts)
    return struct.pack(">i", 4 + len(rest)) + rest


def write_rocketmq_segments(root: Path | str, segment_size: int = 2048) -> list[dict[str, Any]]:
    """A RocketMQ-style commitlog/ of hand-encoded records (IPv6 and IPv4 born hosts, multi-key
    messages, a transactional flag), with the -875286124 filler at segment ends. Returns what was
    written, one dict per record, for comparison."""
    import socket
    import struct

    d = Path(root) / "commitlog"
    d.mkdir(parents=True, exist_ok=True)
    v6 = (socket.inet_pton(socket.AF_INET6, "2001:db8::7"), 40001)
    v4 = (socket.inet_pton(socket.AF_INET, "172.16.0.9"), 40002)
    store = (socket.inet_pton(socket.AF_INET, "10.9.8.7"), 10911)
    written: list[dict[str, Any]] = []
    segments: dict[int, bytearray] = {0: bytearray(segment_size)}
    base, pos = 0, 0
    offsets: dict[int, int] = {}
    for i in range(30):
        qid = i % 3
        props = {"KEYS": f"biz-{i} alt-{i}", "TAGS": "TagA" if i % 2 else "TagB",
                 "UNIQ_KEY": f"7F00000100002A9F0000{i:012X}", "WAIT": "true"}
        body = bytes(range(i % 7, 60 + i))
        born = v6 if i % 2 == 0 else v4
        sys_flag = 0x8 if i == 5 else 0  # a committed transactional message
        fields = dict(topic="RmqTopic", body=body, queue_id=qid, queue_offset=offsets.get(qid, 0),
                      properties=props, born_host=born, store_host=store, born_timestamp=1_600_000_000_000 + i,
                      store_timestamp=1_600_000_000_100 + i, flag=i, sys_flag=sys_flag, reconsume_times=0)
        size = len(rocketmq_record(physical_offset=0, **fields))  # type: ignore[arg-type]
        if pos + size + 8 > segment_size:
            segments[base][pos : pos + 8] = struct.pack(">ii", segment_size - pos, -875286124)
            base += segment_size
            pos = 0
            segments[base] = bytearray(segment_size)
        rec = rocketmq_record(physical_offset=base + pos, **fields)  # type: ignore[arg-type]
        segments[base][pos : pos + len(rec)] = rec
        offsets[qid] = offsets.get(qid, 0) + 1
        written.append({**fields, "physical_offset": base + pos, "segment": f"{base:020d}", "file_position": pos,
                        "total_size": len(rec)})
        pos += len(rec)
    for b, data in segments.items():
        (d / f"{b:020d}").write_bytes(bytes(data))
    return written


def build_gaps_store(root: Path | str) -> dict[str, Any]:
    """The correctness gaps of issue 21, planted: (a) a record whose own unit is missing while another
    queue's wrong unit points at it; (b) retries linked by the unique key (RocketMQ 4.9.3's client
    fallback, and ORIGIN_MESSAGE_ID = UNIQ_KEY); (c) a retry whose original is missing, next to one whose
    original's segment was deleted by retention. Expected: consume_queue unit_mismatch 1, missing_unit 2;
    retry_lineage retry_without_origin 1; nothing else."""
    from trimq.protocol.message import MessageConst as MC
    from trimq.protocol.record import message_id
    from trimq.protocol.validation import SCHEDULE_TOPIC, retry_topic

    b = StoreBuilder(root, segment_size=4096, cq_units_per_file=8)
    early = b.store("Orders", b"early", queue_id=0, keys="order-0")
    _order_traffic(b, 48)  # fills segment 0, which is deleted below
    b.send_back(early, GROUP)  # ORIGIN_MESSAGE_ID -> a record of the deleted segment

    def client_fallback(msg: Stored) -> Stored:
        """DefaultMQPushConsumerImpl.sendMessageBack when the RPC fails: the original's whole property map
        (its UNIQ_KEY, no ORIGIN_MESSAGE_ID) plus RETRY_TOPIC etc., sent with delay level 3."""
        props = dict(msg.properties)
        props.update({MC.RETRY_TOPIC: msg.topic, MC.RECONSUME_TIME: "1", MC.MAX_RECONSUME_TIMES: "16"})
        sched = {**props, MC.DELAY_TIME_LEVEL: "3", MC.REAL_TOPIC: retry_topic(GROUP), MC.REAL_QUEUE_ID: "0"}
        b.store(SCHEDULE_TOPIC, msg.body, queue_id=2, properties=sched, reconsume_times=0)
        return b.store(retry_topic(GROUP), msg.body, queue_id=0, properties=props, reconsume_times=1)

    orig1 = b.store("Orders", b"o1", queue_id=1, keys="order-1", properties={MC.UNIQ_CLIENT_MESSAGE_ID_KEYIDX: "U1"})
    client_fallback(orig1)
    orig2 = b.store("Orders", b"o2", queue_id=2, keys="order-2", properties={MC.UNIQ_CLIENT_MESSAGE_ID_KEYIDX: "U2"})
    b.store(retry_topic(GROUP), b"o2", queue_id=0, reconsume_times=1, born_timestamp=orig2.born_timestamp,
            properties={MC.UNIQ_CLIENT_MESSAGE_ID_KEYIDX: "U2", MC.ORIGIN_MESSAGE_ID: "U2", MC.RETRY_TOPIC: "Orders"})
    ghost = message_id(STORE_HOST, orig2.physical_offset + 1)  # inside the store, no record starts there
    lost = b.store(retry_topic(GROUP), b"lost", queue_id=0, reconsume_times=1,
                   properties={MC.ORIGIN_MESSAGE_ID: ghost, MC.RETRY_TOPIC: "Orders"})
    # (a): Payments q1's record loses its unit; Payments q0's unit for `other` points at it instead.
    mine = b.store("Payments", b"mine", queue_id=1)
    other = b.store("Payments", b"other", queue_id=0)
    del b.units[("Payments", 1)][mine.queue_offset]
    b.units[("Payments", 0)][other.queue_offset] = (mine.physical_offset, mine.size, 0)
    _order_traffic(b, 6)
    b.close()
    (Path(root) / "commitlog" / f"{0:020d}").unlink()  # retention removed the first segment
    return {"builder": b, "early": early, "orig1": orig1, "orig2": orig2, "lost": lost, "ghost": ghost,
            "mine": mine, "other": other}
