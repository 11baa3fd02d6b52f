"""Check what consumers consumed against what producers had acknowledged, from record files.

Inputs are the JSON-line record files of ``trimq-producer --record`` and ``trimq-consumer --record``
(formats in trimq/tools/records.py), plus what the test did to the consumers: :class:`Stop` events (a graceful
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
  to consume there), the delay from the signal to the first record on that queue by another consumer, of a
  listener call begun after the signal (another paused consumer's late completion, below, is no takeover).
  (It includes waiting for a message to arrive, so measure while producing.) A queue with no acknowledged
  message beyond what was consumed before the stop, and no record after it, is **idle**: no takeover can be seen.
  A paused consumer that consumed the queue itself after SIGCONT, before anybody else did, counts as the
  queue's next owner (**resumed**) only when the queue's broker was killed during the pause (its restart grace
  held the queue for the lease's length, so the resumed consumer could be the first to lock it afterwards); one
  that took the queue over later, in a rebalance, is then no takeover of the pause.
* Every produced message must be consumed at least once (**missing** otherwise).
* **Weaker answers** (a producer record's ``status``; none means SEND_OK): a SYNC_MASTER answers FLUSH_SLAVE_TIMEOUT
  or SLAVE_NOT_AVAILABLE (and any master FLUSH_DISK_TIMEOUT) for a message it stored without its promise, which
  a failover may lose (docs/OPERATIONS.md, "What a send's answer promises"). Such a message is **unsafe**: when it
  was never consumed, or a later acknowledged message took its queue offset (a promoted slave that never had it
  reused the offset), it is left out of "produced" (counted in ``unsafe_lost``; consumed copies of it count as
  unacknowledged). A SEND_OK message whose offset a later message took is a violation (an acknowledged message
  was cut).
* :class:`AsyncFailover`: an ASYNC_MASTER's SEND_OK promises nothing about its slave, so a promotion after its
  master was SIGKILLed may lose the tail the slave never had (docs/OPERATIONS.md). A SEND_OK message of that
  broker acknowledged before the kill and stored at or past the commit-log offset the promoted slave wrote from
  (``offset_msg_id`` in the producer record) is unsafe as above; every other one must survive. Such a tail message
  that was read before the failover is not judged either (``tail_read``): its offset belonged to the cut log, and
  the new master may have given it to a message whose send it never answered (long ASYNC seed 79).

Extras for the chaos suite (tests/chaos/; all optional, the rules above are unchanged without them):

* :class:`Pause` (SIGSTOP .. SIGCONT): for the group a paused consumer is like a crashed one, so it counts
  as a non-graceful stop at SIGSTOP (replays allowed, takeover measured, ``kind="pause"``); having lost its
  locks, the resumed consumer itself may also replay a queue from its committed offset. One thing is
  new: the batch that was inside its listener when it was stopped completes after SIGCONT, although another
  consumer may already have taken the queue over — a **late completion**. Up to ``late_batch`` records of
  the paused consumer on such a queue, right after SIGCONT (within ``late_window_ms``) and continuing exactly
  where it had stopped, are counted as late completions and left out of the order rules (they are
  duplicates the lock protocol cannot prevent; their offset commits must be fenced). Records that carry
  ``start_time`` (when their listener call began) are also judged exactly: every record of the paused consumer
  whose call began before SIGCONT and completed after it, once another consumer consumed the queue (or, in key
  scope, the key) after the SIGSTOP, is a late completion, however many keys were in flight. In both rules,
  "another consumer consumed the queue after the SIGSTOP" means in a call it began after the SIGSTOP: another
  paused consumer's own late completion, begun earlier, is no takeover (long ASYNC seed 215). (The rule before
  still applies to them: a SIGSTOP between the client's lease check and its listener call gives a call stamped
  after SIGCONT.) Anything more is judged normally (a resumed consumer re-consuming a queue it lost is a
  violation).
* :class:`BrokerCrash`: a broker restarted after SIGKILL reloads the committed offsets it had persisted
  (``persisted``), possibly older than the last commits. On each of its queues, the first redelivery after
  the crash (by any consumer, within ``broker_replay_window_ms`` of the restart) is an allowed replay when it
  starts at or above the persisted offset.
* ``committed_samples`` (queue -> [(wall ms, committed offset)], read from the broker over time): the
  committed floor of a replay is raised to the highest offset sampled before the replay began (since the
  broker's last restart), and within one broker lifetime sampled offsets must never decrease (an
  **offset regression** is a violation: someone rewound the queue).
* A replay handed over mid-way (gracefully) continues with its next owner: an owner change that starts
  exactly after the previous record of a replay continues that replay.
* ``lease_ms`` (issue 14: queue locks are leases): **started after lease** counts the records of a paused
  consumer whose listener call began (``start_time``, else ``consume_time``) after its lease had surely run out
  (its last renewal was sent before SIGSTOP, so after ``stop_ms + lease_ms``) while another consumer held the
  same queue — other than late completions, which were started before the pause. Holding is read from the
  offsets: the other consumer had already consumed that offset or a later one since the pause began, or it
  consumed that offset or an earlier one within ``lease_ms`` after the record (unless one of the two crashed in
  between, or the queue's broker restarted — it forgets its locks — which explains a replay); a clean handover
  back and forth never does either. The client starts no batch after its own deadline, so this must be 0; each
  one is also reported as a violation.

Key scope (issue 17; ``key_scope_clients``: the client ids of consumers with ``order_scope="key"``): such a consumer
consumes a queue's keys in parallel, so its records are in queue order *per key* only, and it commits the contiguous
completed prefix, so whoever consumes a queue after it — after a crash or a graceful move alike — may replay from
that prefix. A queue any of them consumed is judged **per key**: the rules above apply to each key's records and
acknowledged offsets of the queue (its "next offset" is the key's next one), a move away from a key-scope owner
counts as a crash for the replay rule (the replay must still start at or above the committed floor), and the late
completions of a pause are counted per key. "Started after lease" then also asks, of a key-scope consumer taken as
the queue's holder, that it consumed the queue within a lease after the record (it still held it), and of a paused
key-scope consumer, that the holder had consumed the queue since the pause.

Use :func:`check` (returns a :class:`Report`; ``report.ok``, ``report.text()``), or from a shell
``python -m tests.e2e.checker --producer P.jsonl --consumer C1.jsonl --consumer C2.jsonl --crashed ID``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trimq.protocol.record import parse_message_id

Queue = tuple[str, str, int]

__all__ = ["BrokerCrash", "Pause", "Report", "Stop", "Takeover", "check", "client_id_of", "read_records"]

#: A stop's time is taken just before the signal is sent: records stamped this little later are still "before".
STOP_TOLERANCE_MS = 100


@dataclass(frozen=True)
class Stop:
    """A consumer stopped by the test: ``graceful`` (SIGTERM) or not (SIGKILL), at wall-clock ``time_ms``."""

    client_id: str
    time_ms: int
    graceful: bool
    kind: str = ""  # for the report: "" (graceful / crash) or e.g. "pause"


@dataclass(frozen=True)
class Pause:
    """A consumer paused by the test: SIGSTOP at wall-clock ``stop_ms``, SIGCONT at ``cont_ms``."""

    client_id: str
    stop_ms: int
    cont_ms: int


@dataclass(frozen=True)
class BrokerCrash:
    """A broker SIGKILLed at ``time_ms`` and serving again from ``restart_ms``; ``persisted`` holds the committed
    offsets its store had on disk (what it reloads), per queue."""

    broker: str
    time_ms: int
    restart_ms: int
    persisted: Mapping[Queue, int] = field(default_factory=dict)


@dataclass(frozen=True)
class AsyncFailover:
    """``broker``'s ASYNC_MASTER SIGKILLed at ``kill_ms``; its slave, promoted (done at ``promoted_ms``), writes from
    commit-log offset ``kept``: what its old master (listening on ``master_addr``) stored from there on is gone."""

    broker: str
    kill_ms: int
    kept: int
    master_addr: str = ""
    promoted_ms: int = 0


def async_tail(record: Mapping[str, Any], failovers: Iterable[AsyncFailover]) -> bool:
    """Whether a producer record is in the tail an ASYNC failover may have lost (module documentation): stored by the
    old master (its store address, in the offset message id, and acknowledged before the promotion: an answer the
    dying master sent can arrive after the kill's timestamp) at or past ``kept``."""
    offset_id = record.get("offset_msg_id") or ""
    ack_ms = int(record["ack_time"])
    for f in failovers:
        if record["broker"] != f.broker:
            continue
        try:
            (host, port), offset = parse_message_id(offset_id)
        except ValueError:
            if ack_ms <= f.kill_ms:
                return True  # no position known: it may be in the tail
            continue
        if f.master_addr and f.promoted_ms:
            by_old_master = f"{host}:{port}" == f.master_addr and ack_ms < f.promoted_ms
        else:
            by_old_master = ack_ms <= f.kill_ms
        if by_old_master and offset >= f.kept:
            return True
    return False


@dataclass(frozen=True)
class Takeover:
    client_id: str
    queue: Queue
    graceful: bool
    new_owner: str | None
    ms: int | None  # None: nobody consumed that queue after the stop
    kind: str = ""
    # nobody had anything to take over: no acknowledged message on the queue beyond what was consumed before the stop
    # (then ``ms`` is None, and no takeover can be seen in the records)
    idle: bool = False
    # a paused consumer went on with the queue itself after SIGCONT, nobody else having consumed it meanwhile, and
    # the queue's broker restarted during the pause: its restart grace (a lease) kept the queue from the others, so
    # the first to lock it after the grace could be the resumed consumer (chaos seed 24); ``ms`` counts to its record
    resumed: bool = False


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
    consumed_cut: int = 0  # of those, read from a tail a failover cut (their offsets hold other messages now)
    unsafe_acked: int = 0  # acknowledged with a weaker answer than SEND_OK (FLUSH_SLAVE_TIMEOUT, ...)
    unsafe_lost: int = 0  # of those, lost (never consumed, or their offset reused): allowed
    tail_read: int = 0  # ASYNC failover tail messages read before the cut (not judged: their offsets were cut)
    missing: list[dict[str, Any]] = field(default_factory=list)
    duplicates: int = 0
    replayed: int = 0
    replays: list[Replay] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    first_offending_key: str | None = None
    key_detail: str = ""
    takeovers: list[Takeover] = field(default_factory=list)
    late_completions: int = 0
    started_after_lease: int = 0
    broker_replays: int = 0  # replays allowed by a broker crash (stale persisted offsets)
    offset_regressions: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.missing and not self.violations

    def takeover_ms(self, *, graceful: bool) -> list[int | None]:
        return [t.ms for t in self.takeovers if t.graceful == graceful and not t.idle]

    def max_takeover_ms(self, *, graceful: bool) -> int | None:
        vals = self.takeover_ms(graceful=graceful)
        if not vals or any(v is None for v in vals):
            return None
        return max(v for v in vals if v is not None)

    def text(self) -> str:
        lines = [
            f"produced (acknowledged): {self.produced}",
            f"consumed: {self.consumed_records} records, {self.consumed_distinct} distinct acknowledged messages"
            + (f", {self.consumed_unacknowledged} unacknowledged" if self.consumed_unacknowledged else "")
            + (f" ({self.consumed_cut} of them read from a tail a failover cut)" if self.consumed_cut else ""),
            f"missing: {len(self.missing)}",
            *([f"acknowledged without SEND_OK or in an ASYNC failover's tail: {self.unsafe_acked} (lost, as allowed: "
               f"{self.unsafe_lost}" + (f"; read before the cut: {self.tail_read}" if self.tail_read else "") + ")"]
              if self.unsafe_acked else []),
            f"duplicates: {self.duplicates} (replayed after crashes: {self.replayed}, in {len(self.replays)} replays)",
        ]
        if self.started_after_lease:
            lines.append(f"started after lease: {self.started_after_lease}")
        if self.late_completions or self.broker_replays or self.offset_regressions:
            lines.append(f"late completions after a pause: {self.late_completions}; replays after broker crashes: "
                         f"{self.broker_replays}; committed-offset regressions: {len(self.offset_regressions)}")
        groups: dict[tuple[str, bool, str], list[Takeover]] = {}
        for t in self.takeovers:
            groups.setdefault((t.client_id, t.graceful, t.kind), []).append(t)
        for (cid, graceful, kind), ts in groups.items():
            label = kind or ("graceful" if graceful else "crash")
            vals = ", ".join(f"{'' if len({x.queue[1] for x in ts}) == 1 else x.queue[1] + '/'}q{x.queue[2]}="
                             f"{('idle' if x.idle else '-') if x.ms is None else x.ms}{' resumed' if x.resumed else ''}"
                             for x in ts)
            known = [x.ms for x in ts if x.ms is not None]
            worst = max(known) if known and len(known) == len([x for x in ts if not x.idle]) else None
            lines.append(f"takeover after {label} stop of {cid}: max {worst} ms ({vals})")
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
    pauses: Iterable[Pause] = (),
    broker_crashes: Iterable[BrokerCrash] = (),
    committed_samples: Mapping[Queue, Sequence[tuple[int, int]]] | None = None,
    late_batch: int = 1,
    late_window_ms: int = 2000,
    broker_replay_window_ms: int = 20_000,
    lease_ms: int | None = None,
    key_scope_clients: Iterable[str] = (),
    async_failovers: Iterable[AsyncFailover] = (),
) -> Report:
    """Judge the record files; see the module documentation for the rules."""
    key_scope = set(key_scope_clients)
    pauses = sorted(pauses, key=lambda p: p.stop_ms)
    stops = sorted([*stops, *(Stop(p.client_id, p.stop_ms, graceful=False, kind="pause") for p in pauses)],
                   key=lambda s: s.time_ms)
    crash_times: dict[str, list[int]] = defaultdict(list)
    for s in stops:
        if not s.graceful:
            crash_times[s.client_id].append(s.time_ms)
    crashes = sorted(broker_crashes, key=lambda c: c.time_ms)
    report = Report()

    consumer_recs = read_records(consumer_files)
    produced: dict[str, dict[str, Any]] = {}
    acked_offsets: dict[Queue, list[int]] = defaultdict(list)
    key_seqs: dict[str, list[int]] = defaultdict(list)
    failovers = list(async_failovers)
    producer_recs = [{**r, "status": "ASYNC_TAIL"} if failovers and async_tail(r, failovers) else r
                     for recs in read_records(producer_files) for r in recs if topic is None or r["topic"] == topic]
    tail_ids = {r["msg_id"] for r in producer_recs if r.get("status") == "ASYNC_TAIL"}
    for r in _safe_records(producer_recs, {c["msg_id"] for recs in consumer_recs for c in recs}, report):
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
    for fi, recs in enumerate(consumer_recs):
        for li, r in enumerate(recs):
            if topic is not None and r["topic"] != topic:
                continue
            consumed.append((int(r["consume_time"]), fi, li, r))
    consumed.sort(key=lambda t: t[:3])
    report.consumed_records = len(consumed)

    # A record read at an offset that an acknowledged message of another id holds was read from a tail that a
    # failover cut (an ASYNC master's, or a record stored without its promise): the log it belonged to is gone,
    # so it is not part of the queue's order (counted as unacknowledged; in one log an offset holds one record).
    # So is a message of an ASYNC failover's tail, whatever took its offset in the new log (long ASYNC seed 79: a
    # send the new master stored but never answered, so no acknowledged message marked the offset as taken).
    acked_at = {(_queue(p), int(p["queue_offset"])): mid for mid, p in produced.items()}
    by_queue: dict[Queue, list[dict[str, Any]]] = defaultdict(list)
    seen: set[str] = set()
    for _, _, _, r in consumed:
        p = produced.get(r["msg_id"])
        if p is None:
            report.consumed_unacknowledged += 1
            taken = acked_at.get((_queue(r), int(r["queue_offset"])), r["msg_id"]) != r["msg_id"]
            if taken or r["msg_id"] in tail_ids:
                report.consumed_cut += 1
                continue
        by_queue[_queue(r, p["broker"] if p else "")].append(r)
        if p is None:
            continue
        if r["msg_id"] in seen:
            report.duplicates += 1
        else:
            seen.add(r["msg_id"])
    report.consumed_distinct = len(seen)
    report.missing = sorted((p for mid, p in produced.items() if mid not in seen),
                            key=lambda p: (p["queue_id"], p["queue_offset"]))

    # Queues a key-scope consumer consumed are judged per key (module documentation): (records, acked, successor)
    # of each key of such a queue; one part (the whole queue) for the others.
    Part = tuple[list[dict[str, Any]], list[int], Any]
    parts: dict[Queue, list[Part]] = {}
    for q, recs in by_queue.items():
        acked_q = acked_offsets.get(q, [])
        if not key_scope or not any(r["client_id"] in key_scope for r in recs):
            parts[q] = [(recs, acked_q, None)]
            continue
        key_recs: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for r in recs:
            p = produced.get(r["msg_id"])
            key_recs[str(p["key"] if p else r.get("keys"))].append(r)
        key_acked: dict[str, list[int]] = defaultdict(list)
        for p in produced.values():
            if _queue(p) == q:
                key_acked[str(p["key"])].append(int(p["queue_offset"]))
        parts[q] = []
        for key, krecs in sorted(key_recs.items()):
            acked_k = sorted(key_acked.get(key, []))
            parts[q].append((krecs, acked_k, _successor(sorted({*acked_k, *(int(r["queue_offset"]) for r in krecs)}))))

    late: set[int] = set()  # id() of late completions (left out of the order rules)
    if pauses:
        # a paused key-scope consumer is followed per key, a queue-scope one in queue order even where the queue is
        # judged per key (chaos seed 14: a queue-scope consumer's in-flight message of a queue the key-scope one
        # had consumed, whose key's previous message another consumer had)
        key_pauses = [p for p in pauses if p.client_id in key_scope]
        queue_pauses = [p for p in pauses if p.client_id not in key_scope]
        for q, q_parts in parts.items():
            for recs, _, succ in q_parts:
                late |= _late_completions(recs, key_pauses if succ is not None else pauses, late_batch,
                                          late_window_ms, succ)
            if q_parts[0][2] is not None:  # judged per key
                late |= _late_completions(by_queue[q], queue_pauses, late_batch, late_window_ms)
        report.late_completions = len(late)
    allowed_replay: set[int] = set()  # id() of records that are allowed replays
    bad: dict[int, str] = {}  # id() of records -> violation text
    samples = committed_samples or {}
    for q, q_parts in sorted(parts.items()):
        q_crashes = [c for c in crashes if c.broker == q[1]]
        q_samples = sorted(samples.get(q, ()))
        for recs, acked_q, succ in q_parts:
            _walk_queue(q, [r for r in recs if id(r) not in late], acked_q, crash_times, committed or {}, report,
                        allowed_replay, bad, q_crashes, q_samples, broker_replay_window_ms, succ,
                        key_scope if succ is not None else frozenset())
    for q, qs in sorted(samples.items()):
        _check_monotonic(q, sorted(qs), [c for c in crashes if c.broker == q[1]], report)

    if pauses and lease_ms is not None:
        for q, recs in sorted(by_queue.items()):
            _started_after_lease(q, recs, pauses, late, lease_ms, crash_times, report, key_scope,
                                 [(c.time_ms, max(c.time_ms, c.restart_ms)) for c in crashes if c.broker == q[1]])
    _check_keys([c for c in consumed if id(c[3]) not in late], produced, key_seqs, allowed_replay, bad, report)
    report.takeovers = _takeovers(stops, by_queue, acked_offsets, pauses, crashes)
    return report


def _safe_records(recs: list[dict[str, Any]], consumed_ids: set[str], report: Report) -> list[dict[str, Any]]:
    """The producer records to judge: all but the unsafe ones (not SEND_OK) that were lost and those in an ASYNC
    failover's lost tail (status ``ASYNC_TAIL``, set by the caller; module documentation: their offsets belong to the
    cut log); a SEND_OK record whose queue offset a later acknowledged message took is a violation (and left out
    too)."""
    at: dict[tuple[Queue, int], list[dict[str, Any]]] = defaultdict(list)
    for r in recs:
        at[(_queue(r), int(r["queue_offset"]))].append(r)
    superseded: set[int] = set()  # id() of records whose offset a later acknowledged message took
    for (q, o), rs in at.items():
        if len(rs) > 1:
            rs.sort(key=lambda r: int(r["ack_time"]))
            for r in rs[:-1]:
                superseded.add(id(r))
                if r.get("status", "SEND_OK") == "SEND_OK":
                    report.violations.append(f"{_qname(q)} offset {o}: SEND_OK message {r['msg_id']} (key {r['key']} "
                                             f"seq {r['seq']}) was cut, its offset reused by {rs[-1]['msg_id']}")
    kept = []
    for r in recs:
        unsafe = r.get("status", "SEND_OK") != "SEND_OK"
        report.unsafe_acked += unsafe
        if unsafe and (id(r) in superseded or r["msg_id"] not in consumed_ids):
            report.unsafe_lost += 1
        elif r.get("status") == "ASYNC_TAIL":
            report.tail_read += 1
        elif id(r) not in superseded:
            kept.append(r)
    return kept


def _successor(universe: list[int]) -> Any:
    """The next offset after ``o`` among ``universe`` (sorted: a key's offsets in its queue), else ``o + 1``."""
    import bisect

    def succ(o: int) -> int:
        i = bisect.bisect_right(universe, o)
        return universe[i] if i < len(universe) else o + 1

    return succ


def _late_completions(recs: list[dict[str, Any]], pauses: list[Pause], late_batch: int, window_ms: int,
                      succ: Any = None) -> set[int]:
    """The records of one queue (or one key of a key-scope queue, ``succ`` giving its next offset) that complete,
    after SIGCONT, a batch a paused consumer had started before SIGSTOP while another consumer took the queue over
    (module documentation)."""
    nxt = succ or (lambda o: o + 1)
    out: set[int] = set()
    for p in pauses:

        def taken_over(t: int, p: Pause = p) -> bool:
            """Another consumer consumed the queue between the SIGSTOP and ``t`` in a call it began after the SIGSTOP:
            a call begun before it is no takeover (long ASYNC seed 215: a key-scope consumer's own late completion,
            begun before its pause, returned during this one's, which then went on with the queue in a call begun
            after SIGCONT; that call was taken for a late completion and left out, and the key's order broke)."""
            return any(x["client_id"] != p.client_id and p.stop_ms < _start(x) and int(x["consume_time"]) <= t
                       for x in recs)

        after = [r for r in recs if r["client_id"] == p.client_id and int(r["consume_time"]) >= p.cont_ms]
        # a record that says when its listener call began is exact: one begun before SIGCONT was begun before the
        # SIGSTOP (the process did not run in between), however many keys were in flight
        for r in after:
            if _start(r) < p.cont_ms and taken_over(int(r["consume_time"])):
                out.add(id(r))
        before = [r for r in recs if r["client_id"] == p.client_id and int(r["consume_time"]) <= p.stop_ms]
        if not before:
            continue
        expected = nxt(int(before[-1]["queue_offset"]))
        for r in after[:late_batch]:
            t = int(r["consume_time"])
            # also for stamped records: the client checks its lease before it calls the listener, and a SIGSTOP
            # between the two makes a call whose stamp follows SIGCONT (chaos seed 14: start_time == cont_ms)
            if t > p.cont_ms + window_ms or int(r["queue_offset"]) != expected or not taken_over(t):
                break
            out.add(id(r))
            expected = nxt(expected)
    return out


def _started_after_lease(q: Queue, recs: list[dict[str, Any]], pauses: list[Pause], late: set[int], lease_ms: int,
                         crash_times: Mapping[str, list[int]], report: Report,
                         key_scope: set[str] | frozenset[str] = frozenset(),
                         broker_down: Sequence[tuple[int, int]] = ()) -> None:
    """Records of a paused consumer on ``q`` started after its lease ran out while another consumer held ``q``
    (module documentation). ``broker_down``: when the queue's broker was killed and when it (or its promoted
    slave) served again."""

    def crashed(client: str, lo: int, hi: int) -> bool:
        # a consumer crash in between explains a replay; so does a restart of the queue's broker, which forgets its
        # locks and reloads the offsets it had persisted (chaos seed 22: the resumed consumer locked the queue after
        # the restart and replayed what the holder before the crash had consumed). The holder may go on consuming
        # what it had pulled after the kill, so a broker down at any time in between counts (long ASYNC seed 24: its
        # last record 163 ms after the kill, the promoted master's first grant of the queue to the resumed consumer)
        return (any(lo - STOP_TOLERANCE_MS <= s <= hi for s in crash_times.get(client, ()))
                or any(down <= hi and lo - STOP_TOLERANCE_MS <= up for down, up in broker_down))

    for p in pauses:
        expired = p.stop_ms + lease_ms
        # another consumer's late completions are no sign it holds the queue (it finishes what it started before its
        # own pause, whoever holds the queue now)
        others = [r for r in recs if r["client_id"] != p.client_id and int(r["consume_time"]) > p.stop_ms
                  and id(r) not in late]
        p_times = [int(r["consume_time"]) for r in recs if r["client_id"] == p.client_id]

        def still_consuming(at: int, p_times: list[int] = p_times) -> bool:
            return any(at <= pt <= at + lease_ms for pt in p_times)  # it consumed the queue within a lease of ``at``

        for r in recs:
            t, o = int(r["consume_time"]), int(r["queue_offset"])
            # judged by when its listener call began, where the record says (a call begun before the pause and
            # completed after SIGCONT is no start after the lease)
            if r["client_id"] != p.client_id or id(r) in late or _start(r) <= expired or t < p.cont_ms:
                continue
            # a broker crash counts from where each listener call began: one inside a call (long ASYNC seed 180) lost
            # the caller's lock and its uncommitted offset, which explains the next owner's replay as well
            holder = next((x for x in others if (
                (int(x["consume_time"]) <= t and int(x["queue_offset"]) >= o
                 and not crashed(x["client_id"], _start(x), t)
                 # a key-scope consumer hands a queue over from its committed prefix, below what it consumed: it
                 # held the queue at t only if it still consumed it afterwards
                 and (x["client_id"] not in key_scope
                      or any(y["client_id"] == x["client_id"] and t < int(y["consume_time"]) <= t + lease_ms
                             for y in others)))
                or (t < int(x["consume_time"]) <= t + lease_ms and int(x["queue_offset"]) <= o
                    and not crashed(p.client_id, _start(r), int(x["consume_time"]))
                    # a successor replays from the committed offset, below what was consumed: a sign of holding
                    # only while the paused one still consumed (long seeds 11 and ASYNC 22: it took the queue
                    # again seconds after SIGCONT, gave it back, and the next owner replayed its last offsets)
                    and still_consuming(int(x["consume_time"]))
                    and (p.client_id not in key_scope
                         or any(y["client_id"] == x["client_id"] and int(y["consume_time"]) <= t
                                for y in others))))), None)
            if holder is not None:
                report.started_after_lease += 1
                report.violations.append(f"{_qname(q)}: {p.client_id} consumed offset {o} at {t}, after its lease ran "
                                         f"out (paused at {p.stop_ms}), while {holder['client_id']} held the queue")


def _start(r: dict[str, Any]) -> int:
    """When the listener call that consumed ``r`` began: its ``start_time``, or for records without one (older record
    files) its ``consume_time``."""
    return int(r.get("start_time", r["consume_time"]))


def _check_monotonic(q: Queue, samples: list[tuple[int, int]], crashes: list[BrokerCrash], report: Report) -> None:
    """Within one broker lifetime, the committed offsets sampled over time never decrease."""
    prev: tuple[int, int] | None = None
    for t, off in samples:
        if prev is not None and any(prev[0] <= c.time_ms <= t for c in crashes):
            prev = None  # the broker restarted in between: it reloaded its persisted offsets
        if prev is not None and off < prev[1]:
            text = (f"{_qname(q)}: committed offset went back from {prev[1]} (at {prev[0]}) to {off} (at {t}) "
                    "without a broker restart")
            report.offset_regressions.append(text)
            report.violations.append(text)
        prev = (t, off)


def _walk_queue(q: Queue, recs: list[dict[str, Any]], acked: list[int], crash_times: Mapping[str, list[int]],
                committed: Mapping[Queue, int], report: Report, allowed_replay: set[int], bad: dict[int, str],
                broker_crashes: Sequence[BrokerCrash] = (), samples: Sequence[tuple[int, int]] = (),
                broker_replay_window_ms: int = 20_000, succ: Any = None,
                replays_after: set[str] | frozenset[str] = frozenset()) -> None:
    """The queue rules over ``recs`` (one queue, or one key of a key-scope queue: ``succ`` gives the key's next
    offset, and owners in ``replays_after`` may be replayed after as after a crash)."""
    import bisect

    nxt = succ or (lambda o: o + 1)

    frontier: int | None = None
    owner: str | None = None
    owner_start = 0  # offset the current owner started its ownership from
    owner_since = 0  # and when
    prev_off: int | None = None
    prev_time = 0
    in_replay = False
    replay: Replay | None = None
    crash_used: set[int] = set()  # broker crashes that already started a replay on this queue

    def acked_between(lo: int, hi: int) -> bool:
        i = bisect.bisect_left(acked, lo)
        return i < len(acked) and acked[i] < hi

    def crashed_between(client: str | None, lo: int, hi: int) -> bool:
        if client in replays_after:
            return True  # key scope: the next owner (or itself, after a lapsed lease) replays from the prefix
        return any(lo - STOP_TOLERANCE_MS <= s <= hi for s in crash_times.get(client or "", ()))

    def sampled_floor(t: int) -> int:
        since = max((c.time_ms for c in broker_crashes if c.time_ms < t), default=-1)
        return max((off for ts, off in samples if since < ts < t), default=0)

    def crash_floor(t: int) -> int:
        """The committed floor of a replay at ``t`` after the owner crashed: where it started, unless the
        broker restarted since (then what the broker had persisted), raised to the offsets sampled since."""
        restarts = [c for c in broker_crashes if owner_since < c.time_ms < t]
        base = (int(restarts[-1].persisted.get(q, 0)) if restarts
                else max(owner_start, committed.get(q, owner_start)))
        return max(base, sampled_floor(t))

    def broker_crash_floor(t: int) -> tuple[int, int] | None:
        """(index, floor) of a broker crash that may explain a redelivery at ``t``, None if none: of several, the one
        with the lowest floor (long ASYNC seed 76: a restart that persisted 178, then an ASYNC failover whose promoted
        master had no offset for the queue at all; the replay from 0 follows the second)."""
        found = [(i, int(c.persisted.get(q, 0))) for i, c in enumerate(broker_crashes)
                 if i not in crash_used and c.time_ms < t <= max(c.restart_ms, c.time_ms) + broker_replay_window_ms]
        return min(found, key=lambda f: (f[1], -f[0]), default=None)  # equal floors: the later crash

    for r in recs:
        o, c, t = int(r["queue_offset"]), str(r["client_id"]), int(r["consume_time"])
        owner_changed = c != owner
        if frontier is None:
            frontier, owner, owner_start, owner_since, prev_off, prev_time = nxt(o), c, o, t, o, t
            if acked and acked[0] < o:
                _bad(bad, report, r, f"{_qname(q)}: consumption started at offset {o}, after acknowledged offset "
                                     f"{acked[0]}")
            continue
        by_broker = broker_crash_floor(t) if o < frontier and not (in_replay and o == nxt(prev_off or 0)) else None
        if owner_changed:
            previous, owner = owner, c
            assert previous is not None
            if o < frontier:
                if in_replay and prev_off is not None and o == nxt(prev_off):
                    allowed_replay.add(id(r))  # a replay handed over mid-way continues with the new owner
                    report.replayed += 1
                elif crashed_between(previous, prev_time, t) and (by_broker is None or o >= crash_floor(t)):
                    in_replay = False
                    floor = crash_floor(t)
                    if o < floor:
                        _bad(bad, report, r, f"{_qname(q)}: replay by {c} starts at offset {o}, below the committed "
                                             f"floor {floor}")
                    else:
                        in_replay = True
                        allowed_replay.add(id(r))
                        replay = Replay(q, previous, c, o, frontier, floor)
                        report.replays.append(replay)
                        report.replayed += 1
                elif by_broker is not None:
                    in_replay = _broker_replay(q, r, previous, frontier, by_broker, crash_used, report,
                                               allowed_replay, bad)
                else:
                    in_replay = False
                    _bad(bad, report, r, f"{_qname(q)}: offsets {o}..{frontier - 1} consumed again by {c} after "
                                         f"{previous} (which did not crash) had consumed them")
            else:
                in_replay = False
                if o > frontier and acked_between(frontier, o):
                    _bad(bad, report, r, f"{_qname(q)}: {c} took over at offset {o}, skipping acknowledged offsets "
                                         f"from {frontier}")
            owner_start, owner_since = o, t
        elif o < frontier:
            if in_replay and prev_off is not None and o == nxt(prev_off):
                allowed_replay.add(id(r))
                report.replayed += 1
            elif crashed_between(c, prev_time, t) and (by_broker is None or o >= crash_floor(t)):
                # a paused consumer whose lock lapsed starts again from the committed offset
                floor = crash_floor(t)
                if o < floor:
                    _bad(bad, report, r, f"{_qname(q)}: replay by {c} after its pause starts at offset {o}, below "
                                         f"the committed floor {floor}")
                    in_replay = False
                else:
                    in_replay = True
                    allowed_replay.add(id(r))
                    report.replays.append(Replay(q, c, c, o, frontier, floor))
                    report.replayed += 1
            elif by_broker is not None:
                in_replay = _broker_replay(q, r, c, frontier, by_broker, crash_used, report, allowed_replay, bad)
            else:
                _bad(bad, report, r, f"{_qname(q)}: {c} consumed offset {o} again (frontier {frontier}, previous "
                                     f"{prev_off})")
        elif o > frontier and acked_between(frontier, o):
            _bad(bad, report, r, f"{_qname(q)}: {c} consumed offset {o} before acknowledged offset(s) from {frontier}")
        if o >= frontier:
            in_replay = False
        frontier = max(frontier, nxt(o))
        prev_off, prev_time = o, t


def _broker_replay(q: Queue, r: dict[str, Any], previous: str, frontier: int, by_broker: tuple[int, int],
                   crash_used: set[int], report: Report, allowed_replay: set[int], bad: dict[int, str]) -> bool:
    """A redelivery explained by a broker crash (stale persisted offsets): allowed from the persisted floor."""
    o, c = int(r["queue_offset"]), str(r["client_id"])
    index, floor = by_broker
    crash_used.add(index)
    if o < floor:
        _bad(bad, report, r, f"{_qname(q)}: replay by {c} after the broker restart starts at offset {o}, below the "
                             f"offset it had persisted ({floor})")
        return False
    allowed_replay.add(id(r))
    report.replays.append(Replay(q, previous, c, o, frontier, floor))
    report.replayed += 1
    report.broker_replays += 1
    return True


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


def _takeovers(stops: list[Stop], by_queue: Mapping[Queue, list[dict[str, Any]]],
               acked: Mapping[Queue, list[int]], pauses: Sequence[Pause] = (),
               crashes: Sequence[BrokerCrash] = ()) -> list[Takeover]:
    out = []
    for s in stops:
        pause = next((p for p in pauses if s.kind == "pause" and p.client_id == s.client_id
                      and p.stop_ms == s.time_ms), None)
        for q, recs in sorted(by_queue.items()):
            before = [r for r in recs if int(r["consume_time"]) <= s.time_ms]
            if not before or before[-1]["client_id"] != s.client_id:
                continue
            # a call begun before the stop is none (another paused consumer's late completion: long ASYNC seed 215)
            after = next((r for r in recs if _start(r) >= s.time_ms and r["client_id"] != s.client_id), None)
            resumed = False
            # the queue's broker lost its lock table during the pause: killed then, or served again then (a promoted
            # slave, or a restart, after a kill just before the pause: an ASYNC kill_master); the paused consumer may
            # then be the first to lock it again, before anyone else does (who may get it seconds later, in a
            # rebalance: long ASYNC seed 215, where that delay had been reported as an 11.5 s takeover)
            if pause is not None and any(
                    c.broker == q[1] and (pause.stop_ms < c.time_ms < pause.cont_ms
                                          or pause.stop_ms < c.restart_ms < pause.cont_ms) for c in crashes):
                back = next((r for r in recs if int(r["consume_time"]) >= pause.cont_ms), None)
                if back is not None and back["client_id"] == s.client_id and (
                        after is None or int(back["consume_time"]) < int(after["consume_time"])):
                    after, resumed = back, True
            # an idle queue shows no takeover (chaos seed 11: the producer's last seconds all went to the other
            # broker, whose queues the survivor locked but had nothing to consume from)
            idle = after is None and max(acked.get(q, [-1])) <= max(int(r["queue_offset"]) for r in before)
            out.append(Takeover(s.client_id, q, s.graceful, after["client_id"] if after else None,
                                int(after["consume_time"]) - s.time_ms if after else None, s.kind, idle, resumed))
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
