"""The audit's yardstick: the same report as ``trimq-audit``, from a plain single-process struct loop.

    python -m bench.audit_reference --store DIR [--out summary.json] [--since MS] [--parse-only]

FROZEN: this file is the benchmark's reference (issue 21). It depends on the standard library only, not
on ``spark_jobs`` (whose speed it measures) nor on ``protocol``; do not optimise it or share code with
the audit. It reads every commit-log segment record by record with one ``struct.unpack_from`` of the
fixed header, checks the body CRC with ``zlib.crc32``, parses the properties, and keeps per-queue and
per-key state for the checks, then reads the consume queues and the consumer offsets. It writes a
summary with the audit's keys and finding kinds (``checks.<name>.by_kind``; examples carry positions,
not ``detail``) and a ``timing`` section: ``loop_s`` (the record loop: parse, CRC, order, key and offset
bookkeeping), ``total_s``. ``--parse-only`` runs the loop with parse and CRC only.

Semantics follow docs/AUDIT.md. Malformed regions are found by a simple resynchronisation (next position
with the message magic, a plausible size and its own physical offset), enough for the kinds and counts.
"""

from __future__ import annotations

import argparse
import json
import mmap
import re
import socket
import struct
import sys
import time
import zlib
from array import array
from bisect import bisect_left
from itertools import pairwise
from pathlib import Path
from typing import Any

MSG_MAGIC = 0xDAA320A7
BLANK_MAGIC = 0xCBD43194
HEAD = struct.Struct(">iIiiiqqiq")  # size magic crc qid flag qoff phys sysflag born_ts
SIZE_MAGIC = struct.Struct(">iI")
I32 = struct.Struct(">i")
I64 = struct.Struct(">q")
I16 = struct.Struct(">h")
UNIT = struct.Struct(">qiq")
DEFECTS = ("integrity", "offsets", "consume_queue", "key_queues", "born_order", "consumer_offsets", "retry_lineage")
ALL_CHECKS = (*DEFECTS, "dead_letters")
SCHEDULE = "SCHEDULE_TOPIC_XXXX"


def special(topic: str) -> bool:
    return topic.startswith(("%RETRY%", "%DLQ%", "RMQ_SYS_")) or topic == SCHEDULE


_KEY = re.compile(r"[ \t\n\x0b\f\r]*([^ \t\n\x0b\f\r]+)")


def shard_key(keys: str | None) -> str | None:
    """The first space-separated KEYS entry (java's ^\\s*(\\S+))."""
    if not keys:
        return None
    m = _KEY.match(keys)
    return m.group(1) if m else None


class Report:
    def __init__(self, limit: int) -> None:
        self.counts: dict[str, dict[str, int]] = {c: {} for c in ALL_CHECKS}
        self.examples: dict[str, list[dict[str, Any]]] = {c: [] for c in ALL_CHECKS}
        self.limit = limit

    def add(self, check: str, kind: str, **where: Any) -> None:
        self.counts[check][kind] = self.counts[check].get(kind, 0) + 1
        self.examples[check].append({"kind": kind, **{k: v for k, v in where.items() if v is not None}})


def segments(store: Path) -> list[Path]:
    d = store / "commitlog"
    return sorted(p for p in d.iterdir() if len(p.name) == 20 and p.name.isdigit())


def host(raw: bytes) -> str:
    if len(raw) == 8:
        return f"{socket.inet_ntop(socket.AF_INET, raw[:4])}:{I32.unpack_from(raw, 4)[0]}"
    return f"[{socket.inet_ntop(socket.AF_INET6, raw[:16])}]:{I32.unpack_from(raw, 16)[0]}"


def unique_keys(segs: list[Path], wanted: set[str]) -> dict[str, int]:
    """UNIQ_KEY -> physical offset of the first ordinary-topic record carrying it, for the keys in ``wanted``."""
    found: dict[str, int] = {}
    for path in segs:
        with open(path, "rb") as fh:
            if not fh.read(8).strip(b"\0"):
                continue
            data = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        pos, size = 0, len(data)
        while pos + 8 <= size:
            tsize, magic = SIZE_MAGIC.unpack_from(data, pos)
            if magic != MSG_MAGIC or tsize < 91 or pos + tsize > size:
                break
            sysflag = I32.unpack_from(data, pos + 36)[0]
            p = pos + 84 + (12 if sysflag & 0x10 else 0) + (12 if sysflag & 0x20 else 0)
            blen = I32.unpack_from(data, p)[0]
            p += 4 + blen
            tlen = data[p]
            topic = data[p + 1 : p + 1 + tlen].decode("utf-8", "replace")
            p += 1 + tlen + 2
            if not special(topic):
                for item in data[p : pos + tsize].decode("utf-8", "replace").split("\x02"):
                    k, sep, v = item.partition("\x01")
                    if sep and k == "UNIQ_KEY" and v.strip() in wanted:
                        found.setdefault(v.strip(), I64.unpack_from(data, pos + 28)[0])
            pos += tsize
        data.close()
    return found


def run(store: Path, *, since: int | None = None, limit: int = 20, parse_only: bool = False) -> dict[str, Any]:
    t0 = time.perf_counter()
    rep = Report(limit)
    segs = segments(store)
    seg_size = {p: p.stat().st_size for p in segs}
    first_base = int(segs[0].name) if segs else 0
    last_data = len(segs) - 1
    while last_data > 0:
        with open(segs[last_data], "rb") as f:
            if f.read(8).strip(b"\0"):
                break
        last_data -= 1
    # Per-record state.
    q_off: dict[tuple[str, int], array] = {}
    q_phys: dict[tuple[str, int], array] = {}
    q_size: dict[tuple[str, int], array] = {}
    q_max: dict[tuple[str, int], int] = {}
    key_q: dict[tuple[str, str], dict[int, list[int]]] = {}
    key_last: dict[tuple[str, str], tuple[int, int]] = {}
    all_phys = array("q")  # every message's physical offset, in store order (sorted)
    rec_topic: list[str] = []
    rec_q = array("i")
    rec_off = array("q")
    rec_size = array("i")
    red: list[dict[str, Any]] = []
    tput: dict[tuple[str, int], list[int]] = {}
    hist: dict[tuple[str, int, int], list[int]] = {}
    messages = malformed = 0
    hosts: dict[bytes, str] = {}

    for si, path in enumerate(segs):
        base = int(path.name)
        seg_name = path.name
        size = seg_size[path]
        if size == 0:
            continue
        with open(path, "rb") as fh:
            data = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        nxt_base = int(segs[si + 1].name) if si + 1 < len(segs) else None
        seg_len = nxt_base - base if nxt_base is not None else None
        pos = 0
        while pos + 8 <= size:
            tsize, magic = SIZE_MAGIC.unpack_from(data, pos)
            kind = None
            if magic == MSG_MAGIC and tsize >= 91 and pos + tsize <= size:
                try:
                    _s, _m, crc, qid, _flag, qoff, phys, sysflag, born = HEAD.unpack_from(data, pos)
                    p = pos + 48
                    bh = 20 if sysflag & 0x10 else 8
                    born_raw = data[p : p + bh]
                    p += bh
                    (store_ts,) = I64.unpack_from(data, p)
                    p += 8
                    sh = 20 if sysflag & 0x20 else 8
                    store_raw = data[p : p + sh]
                    p += sh
                    (reconsume,) = I32.unpack_from(data, p)
                    p += 12
                    (blen,) = I32.unpack_from(data, p)
                    p += 4
                    end = pos + tsize
                    if blen < 0 or p + blen + 3 > end:
                        raise ValueError
                    body_ok = (zlib.crc32(data[p : p + blen]) & 0x7FFFFFFF) == crc
                    p += blen
                    tlen = data[p]
                    topic = data[p + 1 : p + 1 + tlen].decode("utf-8", "replace")
                    p += 1 + tlen
                    (plen,) = I16.unpack_from(data, p)
                    if plen < 0 or p + 2 + plen != end:
                        raise ValueError
                    props: dict[str, str] = {}
                    if plen:
                        for item in data[p + 2 : end].decode("utf-8", "replace").split("\x02"):
                            k, sep, v = item.partition("\x01")
                            if sep:
                                props[k] = v
                except (ValueError, IndexError, struct.error):
                    kind = "bad_fields"
                else:
                    messages += 1
                    pos_here = pos
                    pos = end
                    if parse_only:
                        continue
                    in_win = since is None or store_ts >= since
                    all_phys.append(phys)
                    rec_topic.append(topic)
                    rec_q.append(qid)
                    rec_off.append(qoff)
                    rec_size.append(tsize)
                    key = shard_key(props.get("KEYS"))
                    tx = sysflag & 0xC
                    takes = tx not in (0x4, 0xC)
                    if takes:
                        qk = (topic, qid)
                        if q_max.get(qk, -1) < qoff:
                            q_max[qk] = qoff
                    if not in_win:
                        continue
                    if not body_ok:
                        rep.add("integrity", "crc_mismatch", topic=topic, queue_id=qid, queue_offset=qoff,
                                physical_offset=phys, segment=seg_name, file_position=pos_here, key=key)
                    if phys != base + pos_here:
                        rep.add("integrity", "offset_mismatch", topic=topic, queue_id=qid, queue_offset=qoff,
                                physical_offset=phys, segment=seg_name, file_position=pos_here, key=key)
                    if takes:
                        qk = (topic, qid)
                        if qk not in q_off:
                            q_off[qk], q_phys[qk], q_size[qk] = array("q"), array("q"), array("i")
                        q_off[qk].append(qoff)
                        q_phys[qk].append(phys)
                        q_size[qk].append(tsize)
                        if key is not None and not special(topic):
                            kk = (topic, key)
                            per = key_q.setdefault(kk, {})
                            cnt = per.get(qid)
                            if cnt is None:
                                per[qid] = [1, phys]
                            else:
                                cnt[0] += 1
                            last = key_last.get(kk)
                            if last is not None and born < last[0]:
                                rep.add("born_order", "born_order_inversion", topic=topic, queue_id=qid,
                                        queue_offset=qoff, physical_offset=phys, segment=seg_name,
                                        file_position=pos_here, key=key)
                            key_last[kk] = (born, phys)
                    eff = props.get("REAL_TOPIC") if topic == SCHEDULE else topic
                    if eff and (eff.startswith("%RETRY%") or eff.startswith("%DLQ%")):
                        msg_id = hosts.get(store_raw)
                        if msg_id is None:
                            msg_id = hosts[store_raw] = store_raw.hex().upper()
                        msg_id = f"{msg_id}{phys & 0xFFFFFFFFFFFFFFFF:016X}"
                        group = eff.split("%", 2)[2]
                        stage = "scheduled" if topic == SCHEDULE else ("dlq" if topic.startswith("%DLQ%") else "retry")
                        origin = (props.get("ORIGIN_MESSAGE_ID") or "").strip()
                        uniq = (props.get("UNIQ_KEY") or "").strip()
                        ref, ref_kind = (origin, "origin") if origin else ((uniq, "uniq_key") if uniq else
                                                                          (msg_id, "self"))
                        red.append({"group": group, "ref": ref, "ref_kind": ref_kind, "stage": stage, "key": key,
                                    "topic": topic, "queue_id": qid, "queue_offset": qoff, "physical_offset": phys,
                                    "store_timestamp": store_ts, "born": born, "msg_id": msg_id,
                                    "retry_topic": props.get("RETRY_TOPIC"), "reconsume_times": reconsume})
                        if stage == "dlq":
                            rep.add("dead_letters", "dlq_arrival", topic=topic, queue_id=qid, queue_offset=qoff,
                                    physical_offset=phys, key=key, group=group)
                    minute = store_ts // 60000 * 60000
                    t = tput.get((topic, minute))
                    if t is None:
                        tput[(topic, minute)] = [1, tsize, tsize, tsize]
                    else:
                        t[0] += 1
                        t[1] += tsize
                        t[2] = min(t[2], tsize)
                        t[3] = max(t[3], tsize)
                    h = hist.get((topic, qid, tsize))
                    if h is None:
                        hist[(topic, qid, tsize)] = [1, store_ts, store_ts]
                    else:
                        h[0] += 1
                        h[1] = min(h[1], store_ts)
                        h[2] = max(h[2], store_ts)
                    _ = born_raw
                    continue
            elif magic == BLANK_MAGIC and tsize >= 8 and (pos + tsize == size or pos + tsize == seg_len):
                break
            elif tsize == 0 and magic == 0:
                if not any(data[i : i + (1 << 24)].strip(b"\0") for i in range(pos, size, 1 << 24)):
                    break
                kind = "zero_gap"
            elif magic == MSG_MAGIC and tsize >= 91:
                kind = "overrun"
            elif magic == MSG_MAGIC:
                kind = "bad_size"
            elif magic == BLANK_MAGIC:
                kind = "bad_filler"
            else:
                kind = "bad_magic"
            # Malformed: resynchronise on the next record that says it is where it is.
            nxt = None
            probe = pos + 1
            mb = MSG_MAGIC.to_bytes(4, "big")
            while True:
                i = data.find(mb, probe + 4)
                if i < 0:
                    break
                cand = i - 4
                s2 = I32.unpack_from(data, cand)[0]
                if s2 >= 91 and cand + s2 <= size and I64.unpack_from(data, cand + 28)[0] == base + cand:
                    nxt = cand
                    break
                probe = cand + 1
            if nxt is None and si == last_data:
                kind = "torn_tail"
            malformed += 1
            rep.add("integrity", kind, segment=path.name, file_position=pos, physical_offset=base + pos)
            if nxt is None:
                break
            pos = nxt
        data.close()
    loop_s = time.perf_counter() - t0
    if parse_only:
        return {"records": {"messages": messages, "malformed_rows": malformed},
                "timing": {"loop_s": round(loop_s, 3), "total_s": round(loop_s, 3)}}

    # Offsets: per queue, sorted by (offset, position).
    for (topic, qid), offs in q_off.items():
        phs = q_phys[(topic, qid)]
        if all(offs[i + 1] == offs[i] + 1 for i in range(len(offs) - 1)):
            continue
        pairs = sorted(zip(offs, phs, strict=True))
        for (o0, _p0), (o1, p1) in pairwise(pairs):
            if o1 - o0 > 1:
                rep.add("offsets", "gap", topic=topic, queue_id=qid, queue_offset=o0 + 1, physical_offset=p1)
            elif o1 == o0:
                rep.add("offsets", "duplicate", topic=topic, queue_id=qid, queue_offset=o1, physical_offset=p1)
    # Key queues.
    for (topic, key), per in key_q.items():
        if len(per) > 1:
            rep.add("key_queues", "key_in_many_queues", topic=topic, key=key,
                    physical_offset=min(v[1] for v in per.values()))
    # Consume queues.
    cq_root = store / "consumequeue"
    cq_max: dict[tuple[str, int], int] = {}
    has_cq = cq_root.is_dir() and any(cq_root.iterdir())
    window_min = None
    if since is not None:
        window_min = min((min(v) for v in q_phys.values() if len(v)), default=None)
    floor = max(first_base, window_min or 0)

    def record_at(phys: int) -> int | None:
        i = bisect_left(all_phys, phys)
        return i if i < len(all_phys) and all_phys[i] == phys else None

    if has_cq:
        # Per queue, the commit-log offset of each unit by its queue offset (-1: none at or above the floor).
        own: dict[tuple[str, int], tuple[int, array]] = {}
        for tdir in sorted(cq_root.iterdir()):
            for qdir in sorted(tdir.iterdir()):
                if not qdir.name.isdigit():
                    continue
                qid = int(qdir.name)
                start_off = None
                units = array("q")
                for f in sorted(qdir.iterdir()):
                    if not (len(f.name) == 20 and f.name.isdigit()):
                        continue
                    data = f.read_bytes()
                    fbase = int(f.name) // 20
                    for k, (off, sz, _tag) in enumerate(UNIT.iter_unpack(data[: len(data) - len(data) % 20])):
                        if off == 0 and sz == 0:
                            continue
                        cq_off = fbase + k
                        cq_max[(tdir.name, qid)] = max(cq_max.get((tdir.name, qid), -1), cq_off)
                        if off < floor:
                            continue
                        if start_off is None:
                            start_off = cq_off
                        while len(units) < cq_off - start_off:
                            units.append(-1)
                        if len(units) == cq_off - start_off:
                            units.append(off)
                        i = record_at(off)
                        if i is None:
                            rep.add("consume_queue", "dangling_unit", topic=tdir.name, queue_id=qid,
                                    queue_offset=cq_off, physical_offset=off)
                            continue
                        if (rec_topic[i], rec_q[i], rec_off[i], rec_size[i]) != (tdir.name, qid, cq_off, sz):
                            rep.add("consume_queue", "unit_mismatch", topic=tdir.name, queue_id=qid,
                                    queue_offset=cq_off, physical_offset=off)
                if start_off is not None:
                    own[(tdir.name, qid)] = (start_off, units)
        for (topic, qid), offs in q_off.items():
            phs = q_phys[(topic, qid)]
            first, units = own.get((topic, qid), (0, array("q")))
            n_units = len(units)
            for o, p in zip(offs, phs, strict=True):
                j = o - first
                if not (0 <= j < n_units and units[j] == p):
                    rep.add("consume_queue", "missing_unit", topic=topic, queue_id=qid, queue_offset=o,
                            physical_offset=p)
    # Consumer offsets and lag.
    lag_rows: list[dict[str, Any]] = []
    off_file = store / "config" / "consumerOffset.json"
    if off_file.is_file():
        table = json.loads(off_file.read_text()).get("offsetTable", {})
        for tg, queues in sorted(table.items()):
            topic, _, group = tg.rpartition("@")
            for qid_s, co in sorted(queues.items(), key=lambda kv: int(kv[0])):
                qid = int(qid_s)
                if has_cq and (topic, qid) in cq_max:
                    mx, src = cq_max[(topic, qid)] + 1, "consumequeue"
                elif (topic, qid) in q_max:
                    mx, src = q_max[(topic, qid)] + 1, "commitlog"
                else:
                    mx, src = None, None
                lag_rows.append({"group": group, "topic": topic, "queue_id": qid, "consumer_offset": int(co),
                                 "max_offset": mx, "max_offset_source": src,
                                 "lag": None if mx is None else max(mx - int(co), 0)})
                if mx is not None and int(co) > mx:
                    rep.add("consumer_offsets", "offset_ahead", topic=topic, queue_id=qid, queue_offset=int(co),
                            group=group)
    # Lineage. Unique keys are looked up by a second scan, only when some retry needs one.
    first_ts = min((h[1] for h in hist.values()), default=None)
    uniq_first = unique_keys(segs, {r["ref"] for r in red if r["ref_kind"] != "self"}) if red else {}
    chains: dict[tuple[str, str], dict[str, Any]] = {}
    for r in red:
        o_idx = None
        if r["ref_kind"] != "self":
            ref = r["ref"]
            if len(ref) in (32, 56):
                try:
                    p = int(ref[-16:], 16)
                    if p >= 1 << 63:
                        p -= 1 << 64
                    i = record_at(p)
                    if i is not None and ref == f"{r['msg_id'][:-16]}{p & 0xFFFFFFFFFFFFFFFF:016X}":
                        o_idx = i
                except ValueError:
                    pass
            if o_idx is None and ref in uniq_first:
                o_idx = record_at(uniq_first[ref])
        origin = f"{r['msg_id'][:-16]}{all_phys[o_idx] & 0xFFFFFFFFFFFFFFFF:016X}" if o_idx is not None else r["ref"]
        c = chains.setdefault((r["group"], origin), {"retries": 0, "dlq": 0, "scheduled": 0, "found": o_idx is not None,
                                                    "ref": r["ref"], "ref_kind": r["ref_kind"], "first": r,
                                                    "born": r["born"], "key": r["key"]})
        c["retries"] += r["stage"] == "retry"
        c["dlq"] += r["stage"] == "dlq"
        c["scheduled"] += r["stage"] == "scheduled"
        c["born"] = min(c["born"], r["born"])
        if r["physical_offset"] < c["first"]["physical_offset"]:
            c["first"] = r
    for (group, _origin), c in sorted(chains.items()):
        if c["ref_kind"] != "origin" or c["found"]:
            continue
        ref = c["ref"]
        own_prefix = c["first"]["msg_id"][:-16]
        if len(ref) == len(c["first"]["msg_id"]) and ref[:-16] == own_prefix and all(
                ch in "0123456789abcdefABCDEF" for ch in ref):
            deleted = int(ref[-16:], 16) < first_base
        else:
            deleted = first_ts is not None and c["born"] < first_ts
        if not deleted:
            f = c["first"]
            rep.add("retry_lineage", "retry_without_origin", topic=f["topic"], queue_id=f["queue_id"],
                    queue_offset=f["queue_offset"], physical_offset=f["physical_offset"], key=c["key"], group=group)
    per_group: dict[str, dict[str, int]] = {}
    for (group, _o), c in chains.items():
        g = per_group.setdefault(group, {"group": group, "retries": 0, "scheduled": 0, "dlq_arrivals": 0,
                                         "messages": 0, "dead_lettered": 0})
        g["retries"] += c["retries"]
        g["scheduled"] += c["scheduled"]
        g["dlq_arrivals"] += c["dlq"]
        g["messages"] += 1
        g["dead_lettered"] += c["dlq"] > 0
    poison: dict[tuple[str, str], int] = {}
    for r in red:
        if r["stage"] == "dlq" and r["key"] is not None:
            poison[(r["group"], r["key"])] = poison.get((r["group"], r["key"]), 0) + 1
    # Volume.
    per_topic: dict[str, dict[str, Any]] = {}
    for (topic, qid, sz), (n, lo, hi) in hist.items():
        t = per_topic.setdefault(topic, {"topic": topic, "messages": 0, "bytes": 0, "sizes": {}, "queues": set(),
                                         "first_store_timestamp": lo, "last_store_timestamp": hi})
        t["messages"] += n
        t["bytes"] += n * sz
        t["sizes"][sz] = t["sizes"].get(sz, 0) + n
        t["queues"].add(qid)
        t["first_store_timestamp"] = min(t["first_store_timestamp"], lo)
        t["last_store_timestamp"] = max(t["last_store_timestamp"], hi)
    size_rows = []
    for t in per_topic.values():
        sizes = sorted(t["sizes"])
        pct = []
        for p in (500, 900, 990):
            rank = max(1, -(-p * t["messages"] // 1000))
            acc = 0
            for sz in sizes:
                acc += t["sizes"][sz]
                if acc >= rank:
                    pct.append(sz)
                    break
        size_rows.append({"topic": t["topic"], "messages": t["messages"], "bytes": t["bytes"],
                          "queues": len(t["queues"]),
                          "min_size": sizes[0], "p50_size": pct[0], "p90_size": pct[1], "p99_size": pct[2],
                          "max_size": sizes[-1], "first_store_timestamp": t["first_store_timestamp"],
                          "last_store_timestamp": t["last_store_timestamp"]})
    size_rows.sort(key=lambda r: (-r["messages"], r["topic"]))
    checks: dict[str, Any] = {}
    for name in ALL_CHECKS:
        ex = sorted(rep.examples[name], key=lambda e: (e.get("physical_offset") is None, e.get("physical_offset") or 0))
        checks[name] = {"count": sum(rep.counts[name].values()), "by_kind": rep.counts[name], "examples": ex[:limit],
                        "severity": "defect" if name in DEFECTS else "info"}
    checks["consume_queue"]["checked"] = has_cq
    checks["consumer_offsets"]["checked"] = off_file.is_file()
    defects = sum(checks[c]["count"] for c in DEFECTS)
    total_s = time.perf_counter() - t0
    return {
        "version": 1, "store": str(store), "since": since,
        "records": {"segments": len(segs), "segment_bytes": sum(seg_size.values()),
                    "rows": sum(r["messages"] for r in size_rows) + malformed,
                    "messages": sum(r["messages"] for r in size_rows), "malformed_rows": malformed,
                    "message_bytes": sum(r["bytes"] for r in size_rows), "topics": len(size_rows),
                    "first_store_timestamp": min((r["first_store_timestamp"] for r in size_rows), default=None),
                    "last_store_timestamp": max((r["last_store_timestamp"] for r in size_rows), default=None)},
        "checks": checks,
        "lineage": {"chains": len(chains), "dead_lettered": sum(g["dead_lettered"] for g in per_group.values()),
                    "retry_deliveries": sum(g["retries"] for g in per_group.values()),
                    "dlq_arrivals": checks["dead_letters"]["count"],
                    "per_group": sorted(per_group.values(), key=lambda g: g["group"]),
                    "top_poison_keys": sorted(
                        ({"group": g, "key": k, "dlq_arrivals": n} for (g, k), n in poison.items()),
                        key=lambda r: (r["group"], -r["dlq_arrivals"], r["key"]))},
        "lag": {"checked": off_file.is_file(), "total_lag": sum(r["lag"] or 0 for r in lag_rows),
                "rows": len(lag_rows)},
        "throughput": {"per_topic": size_rows, "minutes": len(tput)},
        "defects": defects, "clean": defects == 0, "exit_code": 1 if defects else 0,
        "timing": {"loop_s": round(loop_s, 3), "total_s": round(total_s, 3), "messages_scanned": messages},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.audit_reference", description=__doc__.split("\n")[0])
    ap.add_argument("--store", required=True)
    ap.add_argument("--out", help="write the summary JSON here (default: stdout)")
    ap.add_argument("--since", type=int, help="epoch ms: audit records stored from then")
    ap.add_argument("--examples", type=int, default=20)
    ap.add_argument("--parse-only", action="store_true", help="only the record loop's parse and CRC")
    args = ap.parse_args(argv)
    summary = run(Path(args.store), since=args.since, limit=args.examples, parse_only=args.parse_only)
    text = json.dumps(summary, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    else:
        print(text)
    return int(summary.get("exit_code", 0))


if __name__ == "__main__":
    sys.exit(main())
