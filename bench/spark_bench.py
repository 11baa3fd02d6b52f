"""Audit benchmark: the trimq-commitlog data source and the full ``trimq-audit`` against a frozen reference.

    python -m bench.spark_bench [--messages 10000000] [--master local[2]] [--split-size 64m] [--dir DIR] [--keep]

1. Generates a store of ``--messages`` messages (``bench.audit_store_gen``: 256-byte bodies, one topic of 8
   queues, 1000 keys, 1 GiB segments, consume queues, consumer offsets) and reads it once into the page
   cache.
2. Reference: ``bench.audit_reference`` (a plain single-process struct loop, stdlib only, frozen) writes
   the same report; its record loop (parse + CRC + order/key/offset bookkeeping) gives the reference
   parse rate, and ``--parse-only`` the rate of parse + CRC alone.
3. Data source: ``spark.read.format("trimq-commitlog")`` on ``--master`` with the audit's projection
   (``checks.AUDIT_COLUMNS``) and with the full record schema, aggregated on the JVM side (count, bytes,
   CRC failures), after a warm-up read; rows/s and rows per CPU-second (JVM + Python workers). Beside each,
   the JVM's ceiling: a source replaying one prebuilt batch of the same schema as many times, whose Python
   side costs next to nothing, so it shows what Spark alone spends turning the batches into rows and the
   most any Python reader could reach on the machine. Then the record schema through
   ``spark_jobs.jvm_reader.read_records`` (clean segments read in the JVM): its rows on the warm-up store against
   the data source's, and the same aggregate as Spark plans it and with the JVM reader filling every column.
4. End to end: the ``trimq-audit`` console script in its own process (Spark start-up included), its wall
   time and CPU time against the reference's.
5. The two reports must agree: every check's counts by kind, messages, lineage, lag, per-topic sizes.

Targets (issue 21): data source >= 3x the reference parse rate (>= 1M rows/s on 2 cores); the full audit
>= 1.0x the reference end to end. Results go to ``bench/results/spark_bench.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.stop_signals import children_ended_on_error, raise_on_stop_signals, start_recorded

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"


class ChildCpuMeter:
    """CPU seconds of this process's children (the JVM and its Python workers) over an interval."""

    def __init__(self, interval: float = 0.1) -> None:
        import psutil

        self.psutil = psutil
        self.interval = interval
        self.cpu: dict[int, tuple[str, float]] = {}
        self.start: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._first = True

    def _sample(self) -> None:
        for p in self.psutil.Process().children(recursive=True):
            try:
                t = p.cpu_times()
                kind = "jvm" if p.name() == "java" else "python"
            except self.psutil.Error:
                continue
            used = t.user + t.system
            self.start.setdefault(p.pid, used if self._first else 0.0)
            self.cpu[p.pid] = (kind, used)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._first = False
            self._stop.wait(self.interval)

    def seconds(self) -> dict[str, float]:
        out = {"jvm": 0.0, "python": 0.0}
        for pid, (kind, used) in self.cpu.items():
            out[kind] += used - self.start.get(pid, 0.0)
        return out

    def __enter__(self) -> ChildCpuMeter:
        self._sample()
        self._first = False
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()


def run_timed(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, float, subprocess.CompletedProcess]:
    """Run a command; returns (wall seconds, CPU seconds of it and all its descendants, result).

    The descendants (a JVM, its Python workers) are sampled with psutil while they run: getrusage only
    counts the children that were waited for."""
    import psutil

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    seen: dict[int, float] = {}
    stop = threading.Event()
    # ^C, SIGTERM or a hang-up: the audit is told to stop, and ends its Spark session (and JVM) first
    with children_ended_on_error(30) as procs:
        proc = start_recorded(procs, lambda: subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE,
                                                              stderr=subprocess.PIPE, text=True))

        def sample() -> None:
            while not stop.is_set():
                try:
                    root = psutil.Process(proc.pid)
                    tree = [root, *root.children(recursive=True)]
                except psutil.Error:
                    tree = []
                for p in tree:
                    try:
                        t = p.cpu_times()
                    except psutil.Error:
                        continue
                    seen[p.pid] = max(seen.get(p.pid, 0.0), t.user + t.system)  # each process's own time
                stop.wait(0.2)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            out, err = proc.communicate()
        finally:
            stop.set()
    sampler.join()
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    reaped = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    done = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    # The sampled total misses at most the last 0.2 s of each process; a single process is counted exactly.
    return wall, max(sum(seen.values()), reaped if len(seen) <= 1 else 0.0), done


def warm_page_cache(store: Path) -> None:
    for p in sorted((store / "commitlog").iterdir()):
        with open(p, "rb") as f:
            while f.read(16 << 20):
                pass


def register_replay_source(spark: Any, batch_file: Path, columns: tuple[str, ...] | None, partitions: int,
                           batches_per_partition: int, name: str) -> None:
    """Register a data source that replays one prebuilt batch of the commit-log schema (``columns``).

    Its Python side costs next to nothing (one IPC read per partition, then the same batch again and again),
    so reading it measures what Spark's JVM alone spends on turning Arrow batches of that schema into rows:
    the most any Python reader, however fast, could reach on this machine. The classes are local so that
    cloudpickle ships them by value to workers that cannot import ``bench``."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    from trimq.spark_jobs.commitlog_source import spark_schema

    schema = spark_schema(columns)
    path = str(batch_file)

    class ReplayPartition(InputPartition):
        def __init__(self, index: int) -> None:
            self.index = index

    class ReplayReader(DataSourceReader):
        def partitions(self) -> list[InputPartition]:
            return [ReplayPartition(i) for i in range(partitions)]

        def read(self, partition: InputPartition) -> Any:
            import pyarrow as pa

            with pa.OSFile(path, "rb") as f, pa.ipc.open_stream(f) as stream:
                batch = stream.read_next_batch()
            for _ in range(batches_per_partition):
                yield batch

    class ReplaySource(DataSource):
        @classmethod
        def name(cls) -> str:
            return name

        def schema(self) -> Any:
            return schema

        def reader(self, schema: Any) -> DataSourceReader:
            return ReplayReader()

    spark.dataSource.register(ReplaySource)


def write_sample_batch(split: Any, columns: tuple[str, ...] | None, out: Path) -> int:
    """Write the data source's first batch of ``split`` (``columns``) as Arrow IPC; returns its row count."""
    import pyarrow as pa

    from trimq.spark_jobs.vectorized import VectorScanner

    batch = next(iter(VectorScanner(split, columns=columns).batches()))
    with pa.OSFile(str(out), "wb") as f, pa.ipc.new_stream(f, batch.schema) as writer:
        writer.write_batch(batch)
    return batch.num_rows


def spark_reads(store: Path, warmup: Path, master: str, split_size: str, driver_memory: str,
                messages: int) -> dict[str, Any]:
    """Timed data-source reads: the audit projection and the full schema, each beside the JVM's ceiling, then the
    record schema through the JVM reader (:func:`jvm_reads`)."""
    import math

    from pyspark.sql import functions as F

    from trimq.spark_jobs.checks import AUDIT_COLUMNS
    from trimq.spark_jobs.commitlog_source import FORMAT_NAME, parse_size, plan_splits, register, resolve_segments
    from trimq.spark_jobs.session import build_session, stop_session

    t0 = time.perf_counter()
    spark = build_session(master, app_name="trimq-spark-bench", conf={"spark.driver.memory": driver_memory})
    startup = time.perf_counter() - t0
    out: dict[str, Any] = {"session_start_s": round(startup, 2)}
    def commitlog(split: str, cols: tuple[str, ...] | None) -> Any:
        reader = spark.read.format(FORMAT_NAME).option("splitSize", split)
        return reader.option("columns", ",".join(cols)) if cols else reader

    reads = (("audit_projection", AUDIT_COLUMNS), ("full_schema", None))
    try:
        register(spark)
        splits = plan_splits(resolve_segments(str(store)), parse_size(split_size))
        for name, cols in reads:
            sample = warmup.parent / f"replay-{name}.arrow"
            per_split = math.ceil(messages / write_sample_batch(splits[0], cols, sample) / len(splits))
            register_replay_source(spark, sample, cols, len(splits), per_split, f"trimq-bench-replay-{name}")
            register_replay_source(spark, sample, cols, 2, 1, f"trimq-bench-replay-{name}-warmup")
        for name, cols in reads:
            commitlog("4m", cols).load(str(warmup)).count()  # start the Python workers, compile the read path
            spark.read.format(f"trimq-bench-replay-{name}-warmup").load().count()
        for name, cols in reads:
            out[name] = _timed_read(commitlog(split_size, cols).load(str(store)), F)
            out[name]["jvm_ceiling"] = _timed_read(spark.read.format(f"trimq-bench-replay-{name}").load(), F)
        out["jvm_reader"] = jvm_reads(spark, store, warmup, split_size, F)
    finally:
        stop_session(spark)
    return out


def jvm_reads(spark: Any, store: Path, warmup: Path, split_size: str, F: Any) -> dict[str, Any]:
    """``spark_jobs.jvm_reader.read_records`` (clean segments read in the JVM, the rest by the data source): first
    its rows on the warm-up store against the data source's (the record schema, in order), then the timed aggregate
    twice: as Spark plans it (it prunes the JVM reader to ``total_size`` and ``crc_ok``, as it would Parquet) and
    with the JVM reader filling every column (``prune_columns=False``). Each time includes the scan job that tells
    clean segments from the rest."""
    from trimq.spark_jobs.commitlog_source import FORMAT_NAME
    from trimq.spark_jobs.jvm_reader import jvm_reader_loaded, read_records

    if not jvm_reader_loaded(spark):
        return {"skipped": "the session has no JVM reader (build it with make: it needs a JDK's javac)"}
    mine = read_records(spark, str(warmup)).collect()
    theirs = spark.read.format(FORMAT_NAME).load(str(warmup)).collect()
    out: dict[str, Any] = {"same_rows_as_data_source": mine == theirs, "rows_compared": len(theirs)}
    out["pruned"] = _timed_read(read_records(spark, str(store), split_size=split_size), F)
    out["all_columns"] = _timed_read(read_records(spark, str(store), split_size=split_size, prune_columns=False), F)
    return out


def _timed_read(df: Any, F: Any) -> dict[str, Any]:
    """Aggregate ``df`` on the JVM (count, bytes, CRC failures) and time it, with the CPU of JVM and workers."""
    agg = df.agg(F.count(F.lit(1)).alias("rows"), F.sum("total_size").alias("bytes"),
                 F.sum(F.when(~F.col("crc_ok"), 1).otherwise(0)).alias("bad"))
    with ChildCpuMeter() as cpu:
        t1 = time.perf_counter()
        row = agg.collect()[0]
        wall = time.perf_counter() - t1
    c = cpu.seconds()
    rows = int(row["rows"])
    return {"rows": rows, "bytes": int(row["bytes"]), "crc_failures": int(row["bad"]),
            "wall_s": round(wall, 2), "rows_per_s": round(rows / wall),
            "cpu_s": {k: round(v, 1) for k, v in c.items()},
            "rows_per_cpu_s": round(rows / max(c["jvm"] + c["python"], 1e-9))}


def compare(audit: dict[str, Any], ref: dict[str, Any]) -> list[str]:
    """Differences between the audit's summary and the reference's (empty: the same report)."""
    diffs = []
    for name, res in ref["checks"].items():
        got = audit["checks"].get(name, {}).get("by_kind")
        if got != res["by_kind"]:
            diffs.append(f"checks.{name}: audit {got} reference {res['by_kind']}")
    for key in ("messages", "malformed_rows", "message_bytes", "topics", "first_store_timestamp",
                "last_store_timestamp"):
        if audit["records"][key] != ref["records"][key]:
            diffs.append(f"records.{key}: audit {audit['records'][key]} reference {ref['records'][key]}")
    for key in ("chains", "dead_lettered", "retry_deliveries", "dlq_arrivals", "per_group"):
        if audit["lineage"][key] != ref["lineage"][key]:
            diffs.append(f"lineage.{key} differs")
    if audit["lag"]["total_lag"] != ref["lag"]["total_lag"]:
        diffs.append(f"lag.total_lag: audit {audit['lag']['total_lag']} reference {ref['lag']['total_lag']}")
    fields = ("topic", "messages", "bytes", "queues", "min_size", "p50_size", "p90_size", "p99_size", "max_size",
              "first_store_timestamp", "last_store_timestamp")
    a_sizes = [{k: r.get(k) for k in fields} for r in audit["throughput"]["per_topic"]]
    r_sizes = [{k: r.get(k) for k in fields} for r in ref["throughput"]["per_topic"]]
    if a_sizes != r_sizes:
        diffs.append("throughput.per_topic differs")
    if (audit["defects"], audit["exit_code"]) != (ref["defects"], ref["exit_code"]):
        diffs.append("defects/exit code differ")
    return diffs


def main(argv: list[str] | None = None) -> int:
    """A SIGTERM or hang-up stops the run as a ^C does: the audit that runs is told to stop (``run_timed``)."""
    with raise_on_stop_signals(SystemExit):
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.spark_bench", description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=10_000_000, help="store size in messages (default 10M)")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--split-size", default="64m")
    ap.add_argument("--driver-memory", default="6g", help="spark.driver.memory (local mode: the whole JVM)")
    ap.add_argument("--dir", help="where to generate (default: a temp dir, removed afterwards)")
    ap.add_argument("--keep", action="store_true", help="keep the generated store")
    ap.add_argument("--skip-reads", action="store_true", help="skip the data-source reads (step 3)")
    ap.add_argument("--results", default=str(RESULTS), help="directory for spark_bench.json")
    args = ap.parse_args(argv)
    if args.messages <= 0:
        ap.error("--messages must be positive")
    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="trimq-spark-bench-"))
    store, out = root / "store", root / "audit"
    result: dict[str, Any] = {"messages": args.messages, "master": args.master, "cpus": os.cpu_count()}
    try:
        from bench.audit_store_gen import generate

        if not (store / "commitlog").is_dir():
            t0 = time.perf_counter()
            info = generate(store, args.messages)
            gen = time.perf_counter() - t0
            result["generate"] = {**info, "seconds": round(gen, 1)}
            print(f"generated {args.messages:,} messages, {info['commitlog_bytes'] / (1 << 20):,.0f} MiB of records "
                  f"in {info['segments']} segment(s) in {gen:.1f} s under {store}", flush=True)
        generate(root / "warmup", 50_000)
        warm_page_cache(store)

        # The reference: parse + CRC only, then the whole report.
        py = sys.executable
        _, _, proc = run_timed([py, "-m", "bench.audit_reference", "--store", str(store), "--parse-only"])
        parse_only = json.loads(proc.stdout)
        p_rate = parse_only["records"]["messages"] / parse_only["timing"]["loop_s"]
        ref_json = root / "reference.json"
        r_wall, r_cpu, proc = run_timed([py, "-m", "bench.audit_reference", "--store", str(store), "--out",
                                         str(ref_json)])
        ref = json.loads(ref_json.read_text())
        loop_rate = ref["timing"]["messages_scanned"] / ref["timing"]["loop_s"]
        result["reference"] = {"parse_only_rows_per_s": round(p_rate), "loop_rows_per_s": round(loop_rate),
                               "wall_s": round(r_wall, 1), "cpu_s": round(r_cpu, 1), "timing": ref["timing"]}
        print(f"reference: parse+CRC {p_rate:,.0f} rows/s; record loop with checks {loop_rate:,.0f} rows/s; "
              f"whole report {r_wall:.1f} s wall, {r_cpu:.1f} s CPU", flush=True)

        if not args.skip_reads:
            reads = spark_reads(store, root / "warmup", args.master, args.split_size, args.driver_memory,
                                args.messages)
            result["data_source"] = reads
            for name in ("audit_projection", "full_schema"):
                r = reads[name]
                print(f"data source ({name}, {args.master}): {r['rows']:,} rows in {r['wall_s']:.1f} s = "
                      f"{r['rows_per_s']:,} rows/s ({r['rows_per_s'] / p_rate:.2f}x the reference parse+CRC, "
                      f"{r['rows_per_s'] / loop_rate:.2f}x its record loop); {r['rows_per_cpu_s']:,} rows/CPU-s "
                      f"(JVM {r['cpu_s']['jvm']} s, Python {r['cpu_s']['python']} s)", flush=True)
                c = r["jvm_ceiling"]
                print(f"    JVM ceiling (the same schema's prebuilt batch replayed, Python's cost ~0): "
                      f"{c['rows_per_s']:,} rows/s = {c['rows_per_s'] / p_rate:.2f}x the reference parse+CRC "
                      f"(JVM {c['cpu_s']['jvm']} s, Python {c['cpu_s']['python']} s)", flush=True)
            jvm = reads["jvm_reader"]
            if "skipped" in jvm:
                print(f"record schema through the JVM reader: skipped: {jvm['skipped']}", flush=True)
            else:
                print(f"record schema through the JVM reader (spark_jobs.jvm_reader.read_records, {args.master}): "
                      f"same rows as the data source on the warm-up store ({jvm['rows_compared']:,}): "
                      f"{'yes' if jvm['same_rows_as_data_source'] else 'NO'}", flush=True)
                for name, label in (("pruned", "as Spark plans it (pruned)"), ("all_columns", "every column filled")):
                    r = jvm[name]
                    print(f"    {label}: {r['rows_per_s']:,} rows/s = {r['rows_per_s'] / p_rate:.2f}x the reference "
                          f"parse+CRC; {r['rows_per_cpu_s']:,} rows/CPU-s (JVM {r['cpu_s']['jvm']} s)", flush=True)

        audit_bin = Path(py).with_name("trimq-audit")
        env = {k: v for k, v in os.environ.items() if k not in ("SPARK_CONF_DIR", "PYTHONPATH")}
        a_wall, a_cpu, proc = run_timed([str(audit_bin), "--store", str(store), "--out", str(out), "--master",
                                         args.master, "--split-size", args.split_size, "--json",
                                         "--conf", f"spark.driver.memory={args.driver_memory}"], env=env)
        if proc.returncode not in (0, 1):
            print(proc.stderr[-3000:], file=sys.stderr)
            return 2
        audit = json.loads(proc.stdout)
        phases = [ln.strip() for ln in proc.stderr.splitlines() if ln.lstrip().startswith("[")]
        result["audit"] = {"wall_s": round(a_wall, 1), "cpu_s": round(a_cpu, 1), "elapsed_in_job_s": audit["elapsed_s"],
                           "phases": phases, "rows_per_cpu_s": round(audit["records"]["rows"] / max(a_cpu, 1e-9))}
        print(f"trimq-audit end to end ({args.master}, Spark start-up included): {a_wall:.1f} s wall, "
              f"{a_cpu:.1f} s CPU = {r_wall / a_wall:.2f}x the reference ({r_wall:.1f} s); "
              f"{audit['records']['rows'] / max(a_cpu, 1e-9):,.0f} rows/CPU-s", flush=True)
        for ln in phases:
            print(f"    {ln}")
        diffs = compare(audit, ref)
        result["same_report"] = not diffs
        result["differences"] = diffs
        print(f"same report as the reference: {'yes' if not diffs else 'NO'}" + "".join(f"\n  {d}" for d in diffs))
        result["load_average"] = os.getloadavg()
        print(f"load average: {', '.join(f'{x:.1f}' for x in os.getloadavg())}")
        results = Path(args.results)
        results.mkdir(parents=True, exist_ok=True)
        (results / "spark_bench.json").write_text(json.dumps(result, indent=2) + "\n")
        return 0 if not diffs else 1
    finally:
        if not args.keep and not args.dir:
            shutil.rmtree(root, ignore_errors=True)
        elif not args.keep:
            shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
