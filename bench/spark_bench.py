"""Commit-log read benchmark: the trimq-commitlog data source on Spark vs a plain single-process parser.

    python -m bench.spark_bench [--size-gib 1] [--master local[2]] [--split-size 64m] [--dir DIR] [--keep]

Generates a commit log of ``--size-gib`` GiB (1 GiB segments, RocketMQ's default) with
``protocol.record.encode_record``: a block of a few MB of varied records (8 topics x 8 queues, keys, tags,
a unique key, bodies of 200-1800 bytes, IPv4 and IPv6 born hosts) is encoded once and replicated with
patched queue and physical offsets, so generation costs little more than writing the bytes.

Then it reads the same files twice, side by side in one run:

* plain: ``trimq.spark_jobs.parser`` in this one process, whole segments, rows as tuples (CRC checked);
* spark: ``spark.read.format("trimq-commitlog")`` on ``--master`` (local[2] by default), byte-range
  partitions of ``--split-size``, Arrow batches, aggregated on the JVM side (count, bytes, CRC failures).

It prints rows/s for both and their ratio (the goal on 2 cores is >= 1.7x), checks that both saw the same
rows, and reports the peak RSS of the Spark Python workers (sampled with psutil every 50 ms; the sum
counts pages shared between forked workers more than once). The Spark time excludes session start and a
warm-up query (the first Data Source query of a session pays for starting its Python workers).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from trimq.protocol.message import encode_properties
from trimq.protocol.record import encode_blank, encode_record

SEGMENT_SIZE = 1 << 30
BLOCK_TARGET = 4 << 20
TOPICS = [f"BenchTopic{i}" for i in range(8)]
QUEUES = 8


def build_block(seed: int = 7) -> tuple[bytes, list[tuple[int, int, int]]]:
    """Records of varied shape; returns the bytes and, per record, (position, queue index, offset in it)."""
    rnd = random.Random(seed)
    parts: list[bytes] = []
    meta: list[tuple[int, int, int]] = []
    counts = [0] * (len(TOPICS) * QUEUES)
    pos = 0
    i = 0
    while pos < BLOCK_TARGET:
        t = rnd.randrange(len(TOPICS))
        key = f"order-{rnd.randrange(100_000)}"
        q = int(key[6:]) % QUEUES
        qi = t * QUEUES + q
        props = {"KEYS": key, "TAGS": rnd.choice(["created", "paid", "shipped"]), "WAIT": "true",
                 "UNIQ_KEY": f"0A0000010000{i:020X}"}
        body = rnd.randbytes(rnd.randrange(200, 1800))
        rec = encode_record(
            topic=TOPICS[t], body=body, queue_id=q, queue_offset=counts[qi], physical_offset=pos,
            properties=encode_properties(props), born_timestamp=1_700_000_000_000 + i,
            born_host=("2001:db8::1", 50000) if i % 5 == 0 else ("192.168.1.20", 50000),
            store_timestamp=1_700_000_000_005 + i, store_host=("10.0.0.1", 10911),
        )
        parts.append(rec)
        meta.append((pos, qi, counts[qi]))
        counts[qi] += 1
        pos += len(rec)
        i += 1
    return b"".join(parts), meta


def generate(directory: Path, size_bytes: int) -> tuple[int, int]:
    """Write the commit log; returns (records, bytes of records).

    Copy c of the block gives the k-th record of a queue the offset (records of that queue in the
    copies before) + k, so every queue stays contiguous; physical offsets are patched to the position.
    """
    block, meta = build_block()
    ends = [m[0] for m in meta[1:]] + [len(block)]
    seg_size = min(SEGMENT_SIZE, size_bytes)
    n_segments = max(1, -(-size_bytes // seg_size))
    cl = directory / "commitlog"
    cl.mkdir(parents=True, exist_ok=True)
    buf = bytearray(block)
    done = [0] * (len(TOPICS) * QUEUES)  # records written so far per queue
    records = data_bytes = 0
    pack_q = struct.Struct(">q").pack_into
    for s in range(n_segments):
        base = s * seg_size
        with open(cl / f"{base:020d}", "wb") as f:
            pos = 0
            while True:
                n_rec = len(meta)
                while n_rec and pos + ends[n_rec - 1] + 8 > seg_size:
                    n_rec -= 1  # the last copy: only the records that still fit (with room for the filler)
                if n_rec == 0:
                    break
                for rpos, qi, k in meta[:n_rec]:
                    pack_q(buf, rpos + 20, done[qi] + k)
                    pack_q(buf, rpos + 28, base + pos + rpos)
                n = ends[n_rec - 1]
                f.write(memoryview(buf)[:n])
                for _, qi, _ in meta[:n_rec]:
                    done[qi] += 1
                records += n_rec
                data_bytes += n
                pos += n
                if n_rec < len(meta):
                    break
            f.write(encode_blank(seg_size - pos))
            f.truncate(seg_size)
    return records, data_bytes


class RssSampler:
    """Peak RSS of the Spark Python workers (children of our JVM), and CPU time of them and the JVM."""

    def __init__(self, interval: float = 0.05) -> None:
        import psutil

        self.psutil = psutil
        self.interval = interval
        self.peak_sum = 0
        self.peak_one = 0
        self.workers_seen: set[int] = set()
        self.cpu: dict[int, tuple[str, float]] = {}  # pid -> (kind, user+system seconds at last sample)
        self._cpu_start: dict[int, float] = {}
        self._stop = threading.Event()
        self._started = False
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _python_workers(self) -> Iterator[object]:
        me = self.psutil.Process()
        for child in me.children(recursive=True):
            try:
                # The read workers (forked by "pyspark.daemon pyspark.worker"), not the planners.
                if "pyspark.worker" in " ".join(child.cmdline()):
                    yield child
            except self.psutil.Error:
                continue

    def _sample_cpu(self) -> None:
        for p in self.psutil.Process().children(recursive=True):
            try:
                t = p.cpu_times()
                kind = "jvm" if p.name() == "java" else "python"
            except self.psutil.Error:
                continue
            used = t.user + t.system
            self._cpu_start.setdefault(p.pid, 0.0 if self._started else used)
            self.cpu[p.pid] = (kind, used)

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds used during the sampled interval, per kind of process (jvm, python)."""
        out = {"jvm": 0.0, "python": 0.0}
        for pid, (kind, used) in self.cpu.items():
            out[kind] += used - self._cpu_start.get(pid, 0.0)
        return out

    def _run(self) -> None:
        self._sample_cpu()
        self._started = True
        while not self._stop.is_set():
            self._sample_cpu()
            total = 0
            for p in self._python_workers():
                try:
                    rss = p.memory_info().rss  # type: ignore[attr-defined]
                except self.psutil.Error:
                    continue
                self.workers_seen.add(p.pid)  # type: ignore[attr-defined]
                total += rss
                self.peak_one = max(self.peak_one, rss)
            self.peak_sum = max(self.peak_sum, total)
            self._stop.wait(self.interval)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample_cpu()


def run_plain(store: Path) -> tuple[float, int, int, int]:
    """Single process: every segment whole, rows as tuples. Returns (seconds, rows, bytes, crc failures)."""
    from trimq.spark_jobs.parser import COLUMN_INDEX, scan_paths

    i_size, i_crc = COLUMN_INDEX["total_size"], COLUMN_INDEX["crc_ok"]
    rows = size = bad = 0
    t0 = time.perf_counter()
    c0 = time.process_time()
    for batch in scan_paths(str(store)):
        rows += len(batch.rows)
        for r in batch.rows:
            size += r[i_size]
            if r[i_crc] is False:
                bad += 1
    global PLAIN_CPU
    PLAIN_CPU = time.process_time() - c0
    return time.perf_counter() - t0, rows, size, bad


PLAIN_CPU = 0.0


def run_spark(
    store: Path, warmup: Path, master: str, split_size: str, runs: int
) -> tuple[list[float], int, int, int, RssSampler, float]:
    """Time ``runs`` full reads (after a warm-up read of a small log). Returns the times, the last run's
    rows/bytes/CRC failures, the sampler of all timed runs and the session start time."""
    from pyspark.sql import functions as F

    from trimq.spark_jobs.commitlog_source import FORMAT_NAME, register
    from trimq.spark_jobs.session import build_session, stop_session

    t0 = time.perf_counter()
    spark = build_session(master, app_name="trimq-spark-bench", conf={"spark.driver.memory": "2g"})
    startup = time.perf_counter() - t0
    try:
        register(spark)
        # Warm-up: start the Python workers and let the JVM compile the read path.
        spark.read.format(FORMAT_NAME).option("splitSize", "4m").load(str(warmup)).count()
        times = []
        with RssSampler() as sampler:
            for _ in range(runs):
                # A new DataFrame each time: re-running one would reuse its finished shuffle stage.
                df = spark.read.format(FORMAT_NAME).option("splitSize", split_size).load(str(store))
                agg = df.agg(
                    F.count(F.lit(1)).alias("rows"),
                    F.sum("total_size").alias("bytes"),
                    F.sum(F.when(~F.col("crc_ok"), 1).otherwise(0)).alias("bad"),
                )
                t1 = time.perf_counter()
                row = agg.collect()[0]
                times.append(time.perf_counter() - t1)
        return times, int(row["rows"]), int(row["bytes"]), int(row["bad"]), sampler, startup
    finally:
        stop_session(spark)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.spark_bench", description=__doc__.split("\n")[0])
    ap.add_argument("--size-gib", type=float, default=1.0, help="commit-log size to generate (default 1)")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--split-size", default="64m")
    ap.add_argument("--dir", help="where to generate (default: a temp dir, removed afterwards)")
    ap.add_argument("--keep", action="store_true", help="keep the generated files")
    ap.add_argument("--runs", type=int, default=2, help="timed runs of each reader; the best counts (default 2)")
    args = ap.parse_args(argv)
    if args.size_gib <= 0:
        ap.error("--size-gib must be positive")
    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="trimq-spark-bench-"))
    try:
        t0 = time.perf_counter()
        records, data_bytes = generate(root, int(args.size_gib * (1 << 30)))
        gen = time.perf_counter() - t0
        print(f"generated {records:,} records, {data_bytes / (1 << 20):,.0f} MiB in {gen:.1f} s under {root}")
        # Read once so both runs start from the page cache.
        for p in sorted((root / "commitlog").iterdir()):
            with open(p, "rb") as f:
                while f.read(16 << 20):
                    pass
        generate(root / "warmup", 32 << 20)
        p_times = []
        for _ in range(max(args.runs, 1)):
            p_time, p_rows, p_bytes, p_bad = run_plain(root)
            p_times.append(p_time)
        p_best = min(p_times)
        print(f"plain parser (1 process):         {p_rows:>10,} rows, best of {len(p_times)} "
              f"{p_best:6.2f} s = {p_rows / p_best:>9,.0f} rows/s  (runs: {_fmt(p_times)})")
        s_times, s_rows, s_bytes, s_bad, sampler, startup = run_spark(
            root, root / "warmup", args.master, args.split_size, max(args.runs, 1)
        )
        s_best = min(s_times)
        print(f"spark data source ({args.master}):   {s_rows:>10,} rows, best of {len(s_times)} "
              f"{s_best:6.2f} s = {s_rows / s_best:>9,.0f} rows/s  (runs: {_fmt(s_times)}; "
              f"session start {startup:.1f} s not counted)")
        ratio = (s_rows / s_best) / (p_rows / p_best)
        print(f"ratio spark/plain: {ratio:.2f}x (goal >= 1.7x on 2 cores)")
        cpu = sampler.cpu_seconds()
        total_cpu = cpu["jvm"] + cpu["python"]
        runs = len(s_times)
        print(f"cpu per run: plain {PLAIN_CPU:.1f} s ({p_rows / max(PLAIN_CPU, 1e-9):,.0f} rows/cpu-s); "
              f"spark python workers {cpu['python'] / runs:.1f} s + jvm {cpu['jvm'] / runs:.1f} s "
              f"({s_rows * runs / max(total_cpu, 1e-9):,.0f} rows/cpu-s)")
        print(f"python workers: peak RSS {sampler.peak_one / (1 << 20):,.0f} MiB for one, "
              f"{sampler.peak_sum / (1 << 20):,.0f} MiB summed over {len(sampler.workers_seen)} process(es)")
        same = (p_rows, p_bytes, p_bad) == (s_rows, s_bytes, s_bad) == (records, data_bytes, 0)
        print(f"same rows, bytes and CRC failures in both: {'yes' if same else 'NO'} "
              f"(plain {p_rows}/{p_bytes}/{p_bad}, spark {s_rows}/{s_bytes}/{s_bad})")
        print(f"load average during the run: {', '.join(f'{x:.1f}' for x in os.getloadavg())}")
        return 0 if same else 1
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)


def _fmt(times: list[float]) -> str:
    return ", ".join(f"{t:.2f}" for t in times)


if __name__ == "__main__":
    sys.exit(main())
