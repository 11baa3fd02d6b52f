"""What the same work costs in CPU right after the process was idle, against back to back (bench/RESULTS.md,
*The cost of waking up*).

    python -m bench.wake_cost [--reps 4] [--cpu 0] [--json FILE]

A paced benchmark run wakes every process once or twice per window (every 10 ms at 10k msg/s) from an idle
gap, and a flat-out run keeps them busy. This measures, in one process pinned to one CPU, the thread CPU time
of one unit of work done back to back, after sleeping 0.1, 1 or 10 ms (the CPU goes idle), and after spinning
1 ms (the CPU stays busy), in interleaved blocks (so a drift of the machine hits every mode alike), medians of
the blocks' medians. Two units of work:

* ``python``: a consumer's work per queue batch at 10k msg/s without its transport: decode a pull answer of
  12 records (``RecordDecoder.decode_all``), look at each message, encode the next PULL_MESSAGE frame;
* ``C``: SHA-1 of 48 KiB (one C loop over data that fits the caches), which is what "CPU time" means with
  almost no interpreter or memory traffic.

It is a property of the machine, not of trimq: both systems of a paced run pay it in every process.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from trimq.protocol.codes import RequestCode
from trimq.protocol.command import RemotingCommand
from trimq.protocol.frame import encode_frame
from trimq.protocol.record import RecordDecoder, encode_record

# (label, gap in seconds, spin instead of sleep)
MODES: list[tuple[str, float, bool]] = [
    ("back to back", 0.0, False),
    ("after 0.1 ms asleep", 0.0001, False),
    ("after 1 ms asleep", 0.001, False),
    ("after 10 ms asleep", 0.01, False),
    ("after 1 ms spinning", 0.001, True),
]

_PULL_EXT = {"consumerGroup": "bench_orderly", "topic": "Orders", "queueId": 1, "queueOffset": 100,
             "maxMsgNums": 256, "sysFlag": 3, "commitOffset": 90, "suspendTimeoutMillis": 15000,
             "subscription": "*", "subVersion": 1}


def python_work() -> Callable[[], int]:
    """A consumer's per-batch work without transport: decode 12 records, read each, encode the next pull."""
    body = bytes(range(256)) + bytes(18)
    records = b"".join(
        encode_record(topic="Orders", body=body, queue_id=1, queue_offset=i, physical_offset=i * 400,
                      properties="KEYS\x01key-0001\x02UNIQ_KEY\x01AC11000100002A9F0000000000000001\x02",
                      born_timestamp=1700000000000, store_timestamp=1700000000001,
                      born_host=("127.0.0.1", 5555), store_host=("127.0.0.1", 10911))
        for i in range(12))
    decoder = RecordDecoder()

    def work() -> int:
        seen = {}
        for msg in decoder.decode_all(records, check_crc=False):
            seen[msg.queue_offset] = msg.properties.get("KEYS")
        frame = encode_frame(RemotingCommand(RequestCode.PULL_MESSAGE, 7, 0, 0, None, dict(_PULL_EXT), None), 16 << 20)
        return len(frame) + len(seen)

    return work


def c_work() -> Callable[[], int]:
    """SHA-1 of 48 KiB: a C loop with almost no interpreter or memory traffic."""
    blob = b"x" * 16384

    def work() -> int:
        return sum(len(hashlib.sha1(blob).digest()) for _ in range(3))

    return work


def measure(work: Callable[[], object], n: int, gap_s: float, spin: bool) -> float:
    """Median thread CPU time (µs) of ``work`` over ``n`` calls, each after a gap of ``gap_s`` spent asleep or
    spinning."""
    spent = []
    for _ in range(n):
        if gap_s:
            if spin:
                end = time.perf_counter() + gap_s
                while time.perf_counter() < end:
                    pass
            else:
                time.sleep(gap_s)
        started = time.thread_time_ns()
        work()
        spent.append(time.thread_time_ns() - started)
    return statistics.median(spent) / 1000


def run(reps: int, calls: int = 1500, calls_slow: int = 400) -> dict[str, dict[str, list[float]]]:
    """``{work: {mode: [median µs of each block]}}``, modes interleaved in ``reps`` rounds (``calls_slow`` calls
    for gaps of 10 ms and more, ``calls`` for the others)."""
    works: dict[str, Callable[[], int]] = {"python": python_work(), "C": c_work()}
    for work in works.values():
        for _ in range(300):  # warm: imports, caches of the decoder
            work()
    out: dict[str, dict[str, list[float]]] = {name: {label: [] for label, _, _ in MODES} for name in works}
    for _ in range(reps):
        for name, work in works.items():
            for label, gap, spin in MODES:
                out[name][label].append(measure(work, calls_slow if gap >= 0.01 else calls, gap, spin))
    return out


def report(results: dict[str, dict[str, list[float]]]) -> str:
    """A markdown table: per work and mode, the median of the blocks and its ratio to back to back."""
    lines = ["| work | mode | CPU µs per unit (median of blocks) | vs back to back | blocks |",
             "|---|---|---:|---:|---|"]
    for name, modes in results.items():
        base = statistics.median(modes["back to back"])
        for label, blocks in modes.items():
            med = statistics.median(blocks)
            lines.append(f"| {name} | {label} | {med:.1f} | {med / base:.2f}x | "
                         f"{', '.join(f'{b:.1f}' for b in blocks)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=int, default=4, help="rounds of every mode, interleaved")
    p.add_argument("--cpu", type=int, default=0, help="the CPU to pin this process to (-1: no pinning)")
    p.add_argument("--json", help="also write the blocks' medians here")
    args = p.parse_args(argv)
    if args.reps < 1:
        p.error(f"--reps {args.reps}: at least one round is needed for a median")
    if args.cpu >= 0:
        try:
            os.sched_setaffinity(0, {args.cpu})
        except OSError as exc:
            p.error(f"--cpu {args.cpu}: cannot pin this process there ({exc.strerror}); "
                    f"allowed: {sorted(os.sched_getaffinity(0))}")
    results = run(args.reps)
    print(report(results))
    if args.json:
        meta: dict[str, Any] = {"generated": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                                "load_average": os.getloadavg(), "results": results}
        with open(args.json, "w") as f:
            json.dump(meta, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
