"""Check what consumers consumed against what producers had acknowledged, from record files.

Inputs are the JSON-line record files of ``trimq-producer --record`` and ``trimq-consumer --record``
(formats in client/cli.py), plus what the test did to the consumers: :class:`Stop` events (a graceful
SIGTERM or a SIGKILL crash, with the wall-clock time the signal was sent) and, optionally, the committed
offsets read from the broker right after a crash. Reused by the chaos suite.

Definitions (all per message queue = topic, broker, queue id; records are put in consumption order by
their ``consume_time``, ties kept in file order):

* **Produced** = the acknowledged messages (producer records). A consumed message is matched to its
  producer record by ``msg_id`` (the producer's unique key, new for every send attempt); consumed
  messages with no producer record (stored but never acknowledged) are counted, not judged.
* **Frontier** of a queue = 1 + the highest offset consumed on it so far.
* A record is **progress** when its offset is at the frontier, or beyond it with no acknowledged message
  in between (a gap holding only unacknowledged or filtered messages).
* A record below the frontier is a **redelivery**. It is an allowed **replay** only when
    - it is the first record after the queue's owner changed, the previous owner *crashed* (a Stop with
      ``graceful=False`` sent before this record) — a replay *starts*; the replay must start at or above
      the **committed floor**: the offset the crashed owner itself started its ownership from (what had
      been committed when it took the queue), raised to the broker's committed offset read after the
      crash when the test passes ``committed`` — so a replay never rewinds below what was committed;
    - or it directly continues a replay (the previous record's offset + 1, same consumer).
  Every other redelivery is a violation: a duplicate after a graceful stop, or a consumer re-reading
  what it had already consumed.
* A record beyond the frontier that skips an acknowledged message is a violation (out of order).
* **Per key**: walking a key's consumed acknowledged messages in consumption order, each one is either
  the key's next acknowledged seq, or an allowed replay. Since a key lives in one queue, this follows
  from the queue rules; it is checked separately to name the **first offending key** on failure.
* **Takeover time** of a Stop = for each queue the stopped consumer owned at the signal (it was the last
  to consume there), the delay from the signal to the first record on that queue by another consumer.
  (It includes waiting for a message to arrive, so measure while producing.)
* Every produced message must be consumed at least once (**missing** otherwise).

Use :func:`check` (returns a :class:`Report`; ``report.ok``, ``report.text()``), or from a shell
``python -m tests.e2e.checker --producer P.jsonl --consumer C1.jsonl --consumer C2.jsonl --crashed ID``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Queue = tuple[str, str, int]

__all__ = ["Report", "Stop", "Takeover", "check", "client_id_of", "read_records"]


@dataclass(frozen=True)
class Stop:
    """A consumer stopped by the test: ``graceful`` (SIGTERM) or not (SIGKILL), at wall-clock ``time_ms``."""

    client_id: str
    time_ms: int
    graceful: bool


@dataclass(frozen=True)
class Takeover:
    client_id: str
    queue: Queue
    graceful: bool
    new_owner: str | None
    ms: int | None  # None: nobody consumed that queue after the stop


@dataclass
class Replay:
    queue: Queue
    from_client: str
    to_client: str
    start_offset: int
    frontier: int  # the replay re-consumed [start_offset, frontier)
    floor: int


@dataclass
class Report:
    produced: int = 0
    consumed_records: int = 0
    consumed_distinct: int = 0
    consumed_unacknowledged: int = 0
    missing: list[dict[str, Any]] = field(default_factory=list)
    duplicates: int = 0
    replayed: int = 0
    replays: list[Replay] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    first_offending_key: str | None = None
    key_detail: str = ""
    takeovers: list[Takeover] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.missing and not self.violations

    def takeover_ms(self, *, graceful: bool) -> list[int | None]:
        return [t.ms for t in self.takeovers if t.graceful == graceful]

    def max_takeover_ms(self, *, graceful: bool) -> int | None:
        vals = self.takeover_ms(graceful=graceful)
        if not vals or any(v is None for v in vals):
            return None
        return max(v for v in vals if v is not None)

    def text(self) -> str:
        lines = [
            f"produced (acknowledged): {self.produced}",
            f"consumed: {self.consumed_records} records, {self.consumed_distinct} distinct acknowledged messages"
            + (f", {self.consumed_unacknowledged} unacknowledged" if self.consumed_unacknowledged else ""),
            f"missing: {len(self.missing)}",
            f"duplicates: {self.duplicates} (replayed after crashes: {self.replayed}, in {len(self.replays)} replays)",
        ]
        for graceful in (True, False):
            ts = [t for t in self.takeovers if t.graceful == graceful]
            if ts:
                kind = "graceful" if graceful else "crash"
                vals = ", ".join(f"q{t.queue[2]}={'-' if t.ms is None else t.ms}" for t in ts)
                lines.append(f"takeover after {kind} stop of {ts[0].client_id}: max "
                             f"{self.max_takeover_ms(graceful=graceful)} ms ({vals})")
        if self.missing:
            m = self.missing[0]
            lines.append(f"first missing: key {m.get('key')} seq {m.get('seq')} queue {m.get('queue_id')} "
                         f"offset {m.get('queue_offset')}")
        lines += [f"VIOLATION: {v}" for v in self.violations[:20]]
        if len(self.violations) > 20:
            lines.append(f"... and {len(self.violations) - 20} more violations")
        if self.first_offending_key:
            lines.append(f"first offending key: {self.first_offending_key}\n{self.key_detail}")
        lines.append("OK" if self.ok else "FAILED")
        return "\n".join(lines)


def read_records(paths: Iterable[str | Path]) -> list[list[dict[str, Any]]]:
    """The records of each file (a torn last line, from a process killed mid-write, is skipped)."""
    out = []
    for p in paths:
        recs = []
        text = Path(p).read_text(encoding="utf-8") if Path(p).exists() else ""
        for line in text.splitlines():
            try:
                recs.append(json.loads(line))
            except ValueError:
                continue
        out.append(recs)
    return out


def client_id_of(path: str | Path) -> str | None:
    """The consumer client id written in a consumer record file (None when it has no record yet)."""
    for recs in read_records([path]):
        for r in recs:
            return str(r["client_id"])
    return None


def _queue(rec: Mapping[str, Any], fallback_broker: str = "") -> Queue:
    return (str(rec["topic"]), str(rec.get("broker") or fallback_broker), int(rec["queue_id"]))


def check(
    producer_files: Iterable[str | Path],
    consumer_files: Iterable[str | Path],
    *,
    stops: Iterable[Stop] = (),
    committed: Mapping[Queue, int] | None = None,
    topic: str | None = None,
) -> Report:
    """Judge the record files; see the module documentation for the rules."""
    stops = sorted(stops, key=lambda s: s.time_ms)
    crash_time = {s.client_id: s.time_ms for s in stops if not s.graceful}
    report = Report()

    produced: dict[str, dict[str, Any]] = {}
    acked_offsets: dict[Queue, list[int]] = defaultdict(list)
    key_seqs: dict[str, list[int]] = defaultdict(list)
    for recs in read_records(producer_files):
        for r in recs:
            if topic is not None and r["topic"] != topic:
                continue
            produced[r["msg_id"]] = r
            acked_offsets[_queue(r)].append(int(r["queue_offset"]))
            key_seqs[r["key"]].append(int(r["seq"]))
    for offs in acked_offsets.values():
        offs.sort()
    for seqs in key_seqs.values():
        seqs.sort()
    report.produced = len(produced)

    # Consumption records in consumption order (stable across files for equal times).
    consumed: list[tuple[int, int, int, dict[str, Any]]] = []
    for fi, recs in enumerate(read_records(consumer_files)):
        for li, r in enumerate(recs):
            if topic is not None and r["topic"] != topic:
                continue
            consumed.append((int(r["consume_time"]), fi, li, r))
    consumed.sort(key=lambda t: t[:3])
    report.consumed_records = len(consumed)

    by_queue: dict[Queue, list[dict[str, Any]]] = defaultdict(list)
    seen: set[str] = set()
    for _, _, _, r in consumed:
        p = produced.get(r["msg_id"])
        by_queue[_queue(r, p["broker"] if p else "")].append(r)
        if p is None:
            report.consumed_unacknowledged += 1
        elif r["msg_id"] in seen:
            report.duplicates += 1
        else:
            seen.add(r["msg_id"])
    report.consumed_distinct = len(seen)
    report.missing = sorted((p for mid, p in produced.items() if mid not in seen),
                            key=lambda p: (p["queue_id"], p["queue_offset"]))

    allowed_replay: set[int] = set()  # id() of records that are allowed replays
    bad: dict[int, str] = {}  # id() of records -> violation text
    for q, recs in sorted(by_queue.items()):
        _walk_queue(q, recs, acked_offsets.get(q, []), crash_time, committed or {}, report, allowed_replay, bad)

    _check_keys(consumed, produced, key_seqs, allowed_replay, bad, report)
    report.takeovers = _takeovers(stops, by_queue)
    return report


def _walk_queue(q: Queue, recs: list[dict[str, Any]], acked: list[int], crash_time: Mapping[str, int],
                committed: Mapping[Queue, int], report: Report, allowed_replay: set[int], bad: dict[int, str]) -> None:
    import bisect

    frontier: int | None = None
    owner: str | None = None
    owner_start = 0  # offset the current owner started its ownership from
    prev_off: int | None = None
    in_replay = False
    replay: Replay | None = None

    def acked_between(lo: int, hi: int) -> bool:
        i = bisect.bisect_left(acked, lo)
        return i < len(acked) and acked[i] < hi

    for r in recs:
        o, c, t = int(r["queue_offset"]), str(r["client_id"]), int(r["consume_time"])
        owner_changed = c != owner
        if frontier is None:
            frontier, owner, owner_start, prev_off = o + 1, c, o, o
            if acked and acked[0] < o:
                _bad(bad, report, r, f"{_qname(q)}: consumption started at offset {o}, after acknowledged offset "
                                     f"{acked[0]}")
            continue
        if owner_changed:
            in_replay = False
            previous, owner = owner, c
            assert previous is not None
            if o < frontier:
                crashed_at = crash_time.get(previous)
                if crashed_at is None or crashed_at > t:
                    _bad(bad, report, r, f"{_qname(q)}: offsets {o}..{frontier - 1} consumed again by {c} after "
                                         f"{previous} (which did not crash) had consumed them")
                else:
                    floor = max(owner_start, committed.get(q, owner_start))
                    if o < floor:
                        _bad(bad, report, r, f"{_qname(q)}: replay by {c} starts at offset {o}, below the committed "
                                             f"floor {floor}")
                    else:
                        in_replay = True
                        allowed_replay.add(id(r))
                        replay = Replay(q, previous, c, o, frontier, floor)
                        report.replays.append(replay)
                        report.replayed += 1
            elif o > frontier and acked_between(frontier, o):
                _bad(bad, report, r, f"{_qname(q)}: {c} took over at offset {o}, skipping acknowledged offsets from "
                                     f"{frontier}")
            owner_start = o
        elif o < frontier:
            if in_replay and prev_off is not None and o == prev_off + 1:
                allowed_replay.add(id(r))
                report.replayed += 1
            else:
                _bad(bad, report, r, f"{_qname(q)}: {c} consumed offset {o} again (frontier {frontier}, previous "
                                     f"{prev_off})")
        elif o > frontier and acked_between(frontier, o):
            _bad(bad, report, r, f"{_qname(q)}: {c} consumed offset {o} before acknowledged offset(s) from {frontier}")
        if o >= frontier:
            in_replay = False
        frontier = max(frontier, o + 1)
        prev_off = o


def _check_keys(consumed: list[tuple[int, int, int, dict[str, Any]]], produced: Mapping[str, dict[str, Any]],
                key_seqs: Mapping[str, list[int]], allowed_replay: set[int], bad: dict[int, str],
                report: Report) -> None:
    pos: dict[str, int] = defaultdict(int)  # index into key_seqs[key] of the next expected seq
    history: dict[str, list[str]] = defaultdict(list)
    for _, _, _, r in consumed:
        p = produced.get(r["msg_id"])
        if p is None:
            continue
        key, seq = p["key"], int(p["seq"])
        seqs = key_seqs[key]
        i = pos[key]
        history[key].append(f"seq {seq} off {r['queue_offset']} by {r['client_id']} at {r['consume_time']}"
                            + (" (replay)" if id(r) in allowed_replay else ""))
        problem = bad.get(id(r))
        if i < len(seqs) and seq == seqs[i]:
            pos[key] = i + 1
        elif i > 0 and seq <= seqs[i - 1]:
            if id(r) not in allowed_replay:
                problem = problem or f"key {key}: seq {seq} consumed again after seq {seqs[i - 1]} (not a replay)"
        else:
            expected = seqs[i] if i < len(seqs) else None
            problem = problem or f"key {key}: seq {seq} consumed while seq {expected} was expected"
        if problem and report.first_offending_key is None:
            report.first_offending_key = key
            report.key_detail = (f"  acknowledged seqs {seqs[:3]}...{seqs[-3:]} ({len(seqs)})\n  problem: {problem}\n"
                                 "  consumed so far (last 10):\n    " + "\n    ".join(history[key][-10:]))
            if problem not in report.violations:
                report.violations.append(problem)
    if report.first_offending_key is None and report.missing:
        m = report.missing[0]
        key = m["key"]
        report.first_offending_key = key
        report.key_detail = (f"  seq {m['seq']} (queue {m['queue_id']} offset {m['queue_offset']}) was never consumed"
                             "\n  consumed (last 10):\n    " + "\n    ".join(history[key][-10:]))


def _takeovers(stops: list[Stop], by_queue: Mapping[Queue, list[dict[str, Any]]]) -> list[Takeover]:
    out = []
    for s in stops:
        for q, recs in sorted(by_queue.items()):
            before = [r for r in recs if int(r["consume_time"]) <= s.time_ms]
            if not before or before[-1]["client_id"] != s.client_id:
                continue
            after = next((r for r in recs if int(r["consume_time"]) >= s.time_ms and r["client_id"] != s.client_id),
                         None)
            out.append(Takeover(s.client_id, q, s.graceful, after["client_id"] if after else None,
                                int(after["consume_time"]) - s.time_ms if after else None))
    return out


def _bad(bad: dict[int, str], report: Report, r: dict[str, Any], text: str) -> None:
    bad[id(r)] = text
    report.violations.append(text)


def _qname(q: Queue) -> str:
    return f"{q[0]}/{q[1]}/{q[2]}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Check consumer record files against producer record files.")
    ap.add_argument("--producer", action="append", default=[], help="producer record file (repeatable)")
    ap.add_argument("--consumer", action="append", default=[], help="consumer record file (repeatable)")
    ap.add_argument("--crashed", action="append", default=[], metavar="CLIENT_ID@MS",
                    help="a consumer killed at wall-clock ms (repeatable)")
    ap.add_argument("--stopped", action="append", default=[], metavar="CLIENT_ID@MS",
                    help="a consumer stopped gracefully at wall-clock ms (repeatable)")
    ap.add_argument("--topic")
    args = ap.parse_args(argv)

    def stop(spec: str, graceful: bool) -> Stop:
        cid, _, ms = spec.rpartition("@")
        return Stop(cid, int(ms), graceful)

    stops = [stop(s, False) for s in args.crashed] + [stop(s, True) for s in args.stopped]
    report = check(args.producer, args.consumer, stops=stops, topic=args.topic)
    print(report.text())
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
