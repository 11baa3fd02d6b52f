"""The nightly audit of a trimq (or RocketMQ 4.x) store: checks, Parquet tables, summary.json, report.html.

Use ``run_audit(spark, AuditOptions(...))`` from Python, ``trimq-audit`` from a shell, or
``spark-submit .../spark_jobs/cli.py --store DIR --out DIR`` on a cluster (with
``--py-files trimq-deps.zip``, see docs/AUDIT.md). The checks and their meaning are in
``trimq.spark_jobs.checks`` and docs/AUDIT.md.

Outputs under ``--out``:

* ``records/`` -- the audited records (no bodies), Parquet;
* ``findings/check=<name>/`` -- every finding of every check, Parquet, one schema (``checks.FINDINGS_DDL``);
* ``lineage/`` -- one row per retried message (ORIGIN_MESSAGE_ID) with its chain, Parquet;
* ``throughput/``, ``sizes/``, ``lag/``, ``group_retries/``, ``poison_keys/`` -- Parquet;
* ``summary.json`` -- counts and the first examples of each check, and the exit code;
* ``report.html`` -- the same for people, with inline SVG charts (no external assets).
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F

if __name__ == "__main__" and __package__ in (None, ""):
    # Run as a script by spark-submit: import the package from this checkout, not from spark_jobs/.
    _here = str(Path(__file__).resolve().parent)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _here]
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trimq.spark_jobs import checks
from trimq.spark_jobs.commitlog_source import CommitLogDataSource, ConsumeQueueDataSource, read_planned
from trimq.spark_jobs.parser import DEFAULT_SPLIT_SIZE, SegmentPathError, resolve_segments
from trimq.spark_jobs.report import render_report

EXIT_CLEAN = 0
EXIT_DEFECTS = 1
EXIT_USAGE = 2
EXIT_ERROR = 3

SUMMARY_VERSION = 1
CHART_TOPICS = 8
CHART_BUCKETS = 360


class UsageError(ValueError):
    """Bad command-line input (exit code 2)."""


@dataclass
class AuditOptions:
    """What to audit and how. ``offsets`` None means ``<store>/config/consumerOffset.json`` if present."""

    store: str
    out: str
    offsets: str | None = None
    since_ms: int | None = None
    split_size: int = DEFAULT_SPLIT_SIZE
    example_limit: int = 20
    top_keys: int = 10
    fail_on_dlq: bool = False
    write_records: bool = False
    now_ms: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------------
# Input parsing


_REL = re.compile(r"^\s*(\d+)\s*([smhdw])\s*$")
_UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}


def parse_since(text: str, now_ms: int | None = None) -> int:
    """``--since``: epoch milliseconds, an ISO-8601 time (UTC if no zone), or a duration before now
    (``90m``, ``24h``, ``7d``). Raises UsageError otherwise."""
    s = text.strip()
    if s.isdigit():
        return int(s)
    m = _REL.match(s)
    if m:
        now = int(time.time() * 1000) if now_ms is None else now_ms
        return now - int(m.group(1)) * _UNIT_MS[m.group(2)]
    try:
        dt = datetime.fromisoformat(s)
    except ValueError:
        raise UsageError(
            f"--since {text!r}: expected epoch milliseconds, an ISO time (2024-05-01T00:00:00Z) or a duration (24h)"
        ) from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return int(dt.timestamp() * 1000)


def load_consumer_offsets(path: str) -> list[dict[str, Any]]:
    """Rows (group, topic, queue_id, consumer_offset) from RocketMQ's consumerOffset.json layout."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except FileNotFoundError:
        raise UsageError(f"--offsets {path}: no such file") from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"--offsets {path}: not readable JSON ({exc})") from None
    table = doc.get("offsetTable") if isinstance(doc, dict) else None
    if not isinstance(table, dict):
        raise UsageError(f"--offsets {path}: no 'offsetTable' object (RocketMQ consumerOffset.json layout)")
    rows = []
    for topic_group, queues in table.items():
        topic, sep, group = str(topic_group).rpartition("@")
        if not sep or not topic or not group or not isinstance(queues, dict):
            raise UsageError(f"--offsets {path}: entry {topic_group!r} is not '<topic>@<group>': {{qid: offset}}")
        for qid, off in queues.items():
            try:
                rows.append({"group": group, "topic": topic, "queue_id": int(qid), "consumer_offset": int(off)})
            except (TypeError, ValueError):
                raise UsageError(
                    f"--offsets {path}: {topic_group} queue {qid!r} offset {off!r} is not an integer"
                ) from None
    return rows


def validate(opts: AuditOptions) -> list[str]:
    """Check the options before starting Spark; returns the segment files. Raises UsageError."""
    store = Path(opts.store).expanduser()
    if not store.is_dir():
        raise UsageError(f"--store {opts.store}: not a directory")
    try:
        segments = resolve_segments(str(store))
    except SegmentPathError as exc:
        raise UsageError(f"--store: {exc}") from None
    out = Path(opts.out).expanduser().resolve()
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {opts.out}: exists and is not a directory")
    store_r = store.resolve()
    for sub in ("commitlog", "consumequeue", "config", "index"):
        protected = store_r / sub
        if out in (store_r, protected) or protected in out.parents:
            raise UsageError(f"--out {opts.out}: refusing to write inside the store's {sub}/ (or the store itself)")
    if opts.split_size <= 0:
        raise UsageError(f"--split-size must be positive, got {opts.split_size}")
    if opts.example_limit < 0:
        raise UsageError("--examples must be >= 0")
    if opts.offsets is not None and not Path(opts.offsets).is_file():
        raise UsageError(f"--offsets {opts.offsets}: no such file")
    return segments


# ---------------------------------------------------------------------------------------------------
# Helpers


def _jsonable(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if hasattr(v, "asDict"):
        return _jsonable(v.asDict(recursive=True))
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return None
    if isinstance(v, (bytes, bytearray)):
        return v.hex()
    return v


def _rows(df: DataFrame) -> list[dict[str, Any]]:
    return [_jsonable(r.asDict(recursive=True)) for r in df.collect()]


def _write_small(rows: Sequence[dict[str, Any]], schema: pa.Schema, path: Path) -> None:
    """Write a small driver-side table as one Parquet file in a directory (Spark reads it as a table)."""
    path.mkdir(parents=True, exist_ok=True)
    for old in path.glob("*.parquet"):
        old.unlink()
    table = pa.Table.from_pylist(list(rows), schema=schema)
    pq.write_table(table, path / "part-00000.parquet")


def _offset_of(ref: str) -> int | None:
    """The commit-log offset in an offset message id (32 or 56 hex digits), None for anything else."""
    if len(ref) not in (32, 56):
        return None
    try:
        value = int(ref[-16:], 16)
    except ValueError:
        return None
    return value - (1 << 64) if value >= 1 << 63 else value


def _iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat().replace("+00:00", "Z")


def _chart_bucket_ms(first: int | None, last: int | None) -> int:
    if first is None or last is None or last <= first:
        return 60_000
    minutes = math.ceil((last - first) / 60_000 / CHART_BUCKETS)
    return max(1, minutes) * 60_000


# ---------------------------------------------------------------------------------------------------
# The audit


def run_audit(spark: SparkSession, opts: AuditOptions) -> dict[str, Any]:
    """Run every check on ``opts.store`` and write the outputs to ``opts.out``. Returns the summary."""
    started = time.time()
    segments = validate(opts)
    store = Path(opts.store).expanduser().resolve()
    out = Path(opts.out).expanduser().resolve()
    out.mkdir(parents=True, exist_ok=True)
    now_ms = opts.now_ms if opts.now_ms is not None else int(time.time() * 1000)
    offsets_path = opts.offsets
    if offsets_path is None and (store / "config" / "consumerOffset.json").is_file():
        offsets_path = str(store / "config" / "consumerOffset.json")
    consumer_offsets = load_consumer_offsets(offsets_path) if offsets_path else None
    cq_dir = store / "consumequeue"
    has_cq = cq_dir.is_dir() and any(cq_dir.iterdir())
    first_base = min((int(os.path.basename(s)) for s in segments if os.path.basename(s).isdigit()), default=0)

    spark.sparkContext.setJobGroup("trimq-audit", f"audit of {store}")
    limit = opts.example_limit
    outputs: dict[str, str] = {}
    cached: list[DataFrame] = []

    def progress(msg: str) -> None:
        if opts.extra.get("progress"):
            print(f"[{time.time() - started:6.1f}s] {msg}", file=sys.stderr, flush=True)

    def keep(df: DataFrame) -> DataFrame:
        cached.append(df.persist(StorageLevel.MEMORY_AND_DISK))
        return cached[-1]

    def read(**extra: str) -> DataFrame:
        """The commit log with the audit's projection (spark_jobs.checks.AUDIT_COLUMNS)."""
        return read_planned(spark, CommitLogDataSource, str(store), splitSize=str(opts.split_size),
                            columns=",".join(checks.AUDIT_COLUMNS), **extra)

    if opts.since_ms is not None:
        def in_window(df: DataFrame) -> DataFrame:
            return df.where(F.col("malformed") | (F.col("store_timestamp") >= F.lit(opts.since_ms)))
    else:
        def in_window(df: DataFrame) -> DataFrame:
            return df

    try:
        # 1. One pass over the commit log. The Python readers compute the aggregates of every record for
        # their split (queue runs, key runs, per-minute throughput, the size histogram: spark_jobs.partials)
        # and send only those partial rows and the records the checks report or follow (malformed regions,
        # CRC and offset mismatches, retry/schedule/DLQ records): the JVM never converts every record.
        progress("reading the commit log")
        part_opts = {"partials": "true"}
        if opts.since_ms is not None:
            part_opts["sinceMs"] = str(opts.since_ms)
        partials = keep(read(**part_opts))
        rec_cols = list(checks.AUDIT_COLUMNS)
        noted = partials.where(F.col("kind") == "record").select(*rec_cols)  # already in the window
        run_rows = _rows(partials.where(F.col("kind") == "queue_run").select(
            "topic", "queue_id", "segment", "split_start", "n", "lo", "hi", "bad", "h1", "h2",
            F.col("first_offset"), F.col("first_ts").alias("first_store_timestamp"), "first_ts_all", "hi_all"))
        queues = checks.certify_queues(run_rows)
        window_min_offset = None
        if opts.since_ms is not None:
            window_min_offset = min((r["first_offset"] for r in run_rows if r["first_offset"] is not None),
                                    default=None)
        store_first_ts = min((r["first_ts_all"] for r in run_rows if r["first_ts_all"] is not None), default=None)
        progress(f"records read; {sum(1 for q in queues.values() if not q['clean'])} queue(s) to check in full")
        if opts.write_records:
            in_window(read()).drop(*checks.INTERNAL_COLUMNS).write.mode("overwrite").parquet(str(out / "records"))
            outputs["records"] = str(out / "records")
            progress("records written")

        # 2. Decide what needs the exact checks: queues whose runs are not contiguous, keys not certified in
        # one queue and born order, queues whose consume-queue hash sums differ.
        progress("running the checks")
        kruns = keep(partials.where(F.col("kind") == "key_run").select(
            "topic", F.col("shard_key").alias("key"), "queue_id", "segment", "split_start", "n_w", "first_w",
            "first_phys", "first_born", "last_born", "inversions"))
        susp_q = sorted(k for k, q in queues.items() if not q["clean"])
        susp_k = [(r["topic"], r["key"]) for r in checks.suspicious_keys(kruns).collect()]
        progress(f"{len(susp_k)} key(s) to check in full")
        differ: list[tuple[str, int]] = []
        cq_ends: dict[tuple[str, int], int] = {}
        units = None
        if has_cq:
            floor = max(first_base, window_min_offset or 0)
            summary_rows = _rows(read_planned(spark, ConsumeQueueDataSource, str(store), summary="true",
                                              minCommitlogOffset=str(floor)))
            cq_q: dict[tuple[str, int], list[int]] = {}
            for r in summary_rows:
                acc = cq_q.setdefault((r["topic"], r["queue_id"]), [0, 0, 0, 0, -1])
                acc[0] += r["checked_units"]
                acc[1] += r["h1"]
                acc[2] += r["h2"]
                acc[3] += r["units"]
                if r["max_cq_offset"] is not None:
                    acc[4] = max(acc[4], r["max_cq_offset"])
            cq_ends = {k: v[4] + 1 for k, v in cq_q.items() if v[4] >= 0}
            zero = {"n": 0, "h1": 0, "h2": 0}
            differ = sorted(
                k for k in set(cq_q) | set(queues)
                if tuple(cq_q.get(k, [0, 0, 0])[:3]) != tuple(queues.get(k, zero)[f] for f in ("n", "h1", "h2"))
            )
            progress(f"consume queues summarised; {len(differ)} queue(s) to compare unit by unit")
            if differ:
                units = keep(read_planned(spark, ConsumeQueueDataSource, str(store),
                                          queues=",".join(f"{t}:{q}" for t, q in differ)))

        # 3. Lineage references, then one targeted read (only when something needs it) of the records of
        # the uncertified queues and keys, at the units' offsets, and the originals the retries name.
        red_rows = checks.redeliveries(noted).where(F.col("ref_kind") != "self").select("ref").distinct().collect()
        refs = [r["ref"] for r in red_rows]
        ref_offsets = [o for o in (_offset_of(r) for r in refs) if o is not None]
        unit_offsets: list[int] = []
        if units is not None:
            floor = max(first_base, window_min_offset or 0)
            unit_offsets = [r[0] for r in units.where(F.col("commitlog_offset") >= floor)
                            .select("commitlog_offset").collect()]
        spec = {"queues": [list(k) for k in sorted(set(susp_q) | set(differ))], "keys": [list(k) for k in susp_k],
                "offsets": sorted(set(ref_offsets) | set(unit_offsets)), "uniq_keys": refs}
        if any(spec.values()):
            progress("reading the records to check in full")
            subset = keep(read(filter=json.dumps(spec)))
        else:
            subset = spark.createDataFrame([], noted.schema)
        sub_window = in_window(subset)
        parts = [checks.integrity(noted), checks.dead_letters(noted), checks.key_queues_from_runs(kruns)]
        if susp_q:
            qdf = F.broadcast(spark.createDataFrame(susp_q, "topic string, queue_id int"))
            parts.append(checks.offsets(sub_window.join(qdf, ["topic", "queue_id"])))
        if susp_k:
            kdf = F.broadcast(spark.createDataFrame(susp_k, "topic string, key string"))
            keyed = sub_window.withColumn("key", checks.key_column(sub_window)).join(kdf, ["topic", "key"])
            parts.append(checks.born_order(keyed.drop("key")))
        if units is not None and differ:
            qdf = F.broadcast(spark.createDataFrame(differ, "topic string, queue_id int"))
            parts.append(
                checks.consume_queue(
                    sub_window.join(qdf, ["topic", "queue_id"]), subset, units,
                    commitlog_min_offset=first_base, window_min_offset=window_min_offset,
                    broadcast_units=True,
                )
            )
        queue_end_rows: list[dict[str, Any]] = []
        if consumer_offsets is not None:
            for (topic, qid) in sorted(set(queues) | set(cq_ends)):
                q = queues.get((topic, qid))
                queue_end_rows.append({"topic": topic, "queue_id": qid,
                                       "max_offset": q["max_offset"] if q else None,
                                       "cq_max_offset": cq_ends.get((topic, qid)) if has_cq else None})
        lag_rows, ahead = _lag(consumer_offsets, queue_end_rows)
        if ahead:
            schema = spark.createDataFrame([], checks.FINDINGS_DDL).schema
            ahead_rows = [tuple(a.get(c) for c in checks.FINDINGS_COLUMNS) for a in ahead]
            parts.append(spark.createDataFrame(ahead_rows, schema))

        # 3. Lineage (before the findings: retry_without_origin comes from it), groups, poison keys.
        progress("retry and dead-letter lineage")
        chains = keep(checks.lineage(noted, subset))
        parts.append(checks.retry_without_origin(chains, commitlog_min_offset=first_base,
                                                 first_store_timestamp=store_first_ts))
        findings = parts[0]
        for part in parts[1:]:
            findings = findings.unionByName(part)
        # The union has a partition per part's partition (30 tasks for a tiny store); findings are few, so
        # the write runs as default-parallelism tasks instead (no shuffle).
        findings = findings.coalesce(max(1, spark.sparkContext.defaultParallelism))
        findings.write.mode("overwrite").partitionBy("check").parquet(str(out / "findings"))
        outputs["findings"] = str(out / "findings")
        progress("findings written")
        written = spark.read.schema(checks.FINDINGS_DDL).parquet(str(out / "findings"))
        check_results = _summarise_findings(written, limit)

        lineage_cols = [c for c in chains.columns if c not in ("origin_found", "ref_kind", "ref", "born_timestamp",
                                                                 "first_step")]
        chains.select(*lineage_cols).write.mode("overwrite").parquet(str(out / "lineage"))
        outputs["lineage"] = str(out / "lineage")
        lin_examples = _rows(
            chains.select(*lineage_cols)
            .orderBy(F.desc("dead_lettered"), F.desc("retries"), "group", "origin").limit(limit)
        )
        group_rows = sorted(_rows(checks.group_retry_stats(chains)), key=lambda r: r["group"])
        poison_rows = sorted(_rows(checks.poison_keys(noted, opts.top_keys)), key=lambda r: (r["group"], r["rank"]))
        _write_small(group_rows, _GROUP_SCHEMA, out / "group_retries")
        _write_small(poison_rows, _POISON_SCHEMA, out / "poison_keys")
        outputs["group_retries"] = str(out / "group_retries")
        outputs["poison_keys"] = str(out / "poison_keys")
        progress("lineage written")

        # 4. Volume: per-minute throughput (Parquet) and exact per-topic sizes from a size histogram.
        progress("throughput and sizes")
        minutes = partials.where(F.col("kind") == "minute").groupBy("topic", "minute_ms").agg(
            F.sum("messages").alias("messages"), F.sum("bytes").alias("bytes"), F.min("min_size").alias("min_size"),
            (F.sum("bytes") / F.sum("messages")).alias("avg_size"), F.max("max_size").alias("max_size"),
        )
        minutes.write.mode("overwrite").parquet(str(out / "throughput"))
        outputs["throughput"] = str(out / "throughput")
        hist = _rows(partials.where(F.col("kind") == "size").groupBy("topic", "queue_id", "total_size").agg(
            F.sum("messages").alias("messages"), F.min("first_store_ts").alias("first_store_timestamp"),
            F.max("last_store_ts").alias("last_store_timestamp"),
        ))
        size_rows = checks.sizes_from_histogram(hist)
        size_rows.sort(key=lambda r: (-r["messages"], r["topic"]))
        _write_small(size_rows, _SIZE_SCHEMA, out / "sizes")
        outputs["sizes"] = str(out / "sizes")
        first_ts = min((r["first_store_timestamp"] for r in size_rows if r["first_store_timestamp"] is not None),
                       default=None)
        last_ts = max((r["last_store_timestamp"] for r in size_rows if r["last_store_timestamp"] is not None),
                      default=None)
        bucket_ms = _chart_bucket_ms(first_ts, last_ts)
        top_topics = [r["topic"] for r in size_rows[:CHART_TOPICS]]
        # The chart's buckets are whole minutes: add up the per-minute rows just written (small).
        chart: dict[tuple[str, int], int] = {}
        if top_topics:
            minute_rows = (
                spark.read.parquet(str(out / "throughput")).where(F.col("topic").isin(top_topics))
                .select("topic", "minute_ms", "messages").collect()
            )
            for mr in minute_rows:
                k = (mr["topic"], mr["minute_ms"] // bucket_ms * bucket_ms)
                chart[k] = chart.get(k, 0) + int(mr["messages"])
        chart_rows = [{"topic": t, "minute_ms": m, "messages": c} for (t, m), c in sorted(chart.items())]
        _write_small(lag_rows, _LAG_SCHEMA, out / "lag")
        outputs["lag"] = str(out / "lag")
    finally:
        for cached_df in cached:
            cached_df.unpersist()

    # 5. Summary. Totals come from the per-topic sizes, the malformed kinds and the per-group counts.
    messages = sum(int(r["messages"]) for r in size_rows)
    integrity_kinds = check_results["integrity"]["by_kind"]
    malformed_rows = sum(n for k, n in integrity_kinds.items() if k not in ("crc_mismatch", "offset_mismatch"))
    dlq_count = check_results["dead_letters"]["count"]
    defect_checks = list(checks.DEFECT_CHECKS) + (["dead_letters"] if opts.fail_on_dlq else [])
    for name, res in check_results.items():
        res["severity"] = "defect" if name in defect_checks else "info"
    check_results["consume_queue"]["checked"] = has_cq
    check_results["consumer_offsets"]["checked"] = consumer_offsets is not None
    defects = sum(check_results[c]["count"] for c in defect_checks)
    exit_code = EXIT_DEFECTS if defects else EXIT_CLEAN
    lag_total = sum(r["lag"] or 0 for r in lag_rows)
    summary: dict[str, Any] = {
        "version": SUMMARY_VERSION,
        "store": str(store),
        "out": str(out),
        "generated_at": _iso(now_ms),
        "since": opts.since_ms,
        "since_iso": _iso(opts.since_ms),
        "offsets_file": offsets_path,
        "spark": {"master": spark.sparkContext.master, "version": spark.version},
        "elapsed_s": None,
        "records": {
            "segments": len(segments),
            "segment_bytes": sum(os.path.getsize(s) for s in segments),
            "rows": messages + malformed_rows,
            "messages": messages,
            "malformed_rows": malformed_rows,
            "message_bytes": sum(int(r["bytes"] or 0) for r in size_rows),
            "topics": len(size_rows),
            "first_store_timestamp": first_ts,
            "last_store_timestamp": last_ts,
            "first_store_time": _iso(first_ts),
            "last_store_time": _iso(last_ts),
        },
        "checks": check_results,
        "lineage": {
            "chains": sum(int(r["messages"] or 0) for r in group_rows),
            "dead_lettered": sum(int(r["dead_lettered"] or 0) for r in group_rows),
            "retry_deliveries": sum(int(r["retries"] or 0) for r in group_rows),
            "dlq_arrivals": dlq_count,
            "per_group": group_rows,
            "top_poison_keys": poison_rows,
            "examples": lin_examples,
        },
        "lag": {
            "checked": consumer_offsets is not None,
            "total_lag": lag_total,
            "rows": len(lag_rows),
            "queues": lag_rows[: max(limit, 0) * 10],
        },
        "throughput": {"bucket_ms": bucket_ms, "per_topic": size_rows},
        "defects": defects,
        "clean": defects == 0,
        "exit_code": exit_code,
        "outputs": outputs,
    }
    summary["elapsed_s"] = round(time.time() - started, 2)
    (out / "summary.json").write_text(json.dumps(_jsonable(summary), indent=2, sort_keys=False) + "\n")
    outputs["summary"] = str(out / "summary.json")
    html = render_report(summary, chart_rows=chart_rows, lag_rows=lag_rows, group_rows=group_rows)
    (out / "report.html").write_text(html, encoding="utf-8")
    outputs["report"] = str(out / "report.html")
    progress(f"done: {defects} defect(s)")
    return summary


_BROADCAST_ROWS = 2_000_000  # suspicious queues/keys/units up to this many rows are broadcast (no shuffle)

_GROUP_SCHEMA = pa.schema(
    [("group", pa.string()), ("retries", pa.int64()), ("scheduled", pa.int64()), ("dlq_arrivals", pa.int64()),
     ("messages", pa.int64()), ("dead_lettered", pa.int64())]
)
_POISON_SCHEMA = pa.schema(
    [("group", pa.string()), ("key", pa.string()), ("dlq_arrivals", pa.int64()), ("rank", pa.int32())]
)
_SIZE_SCHEMA = pa.schema(
    [("topic", pa.string()), ("messages", pa.int64()), ("bytes", pa.int64()), ("min_size", pa.int64()),
     ("max_size", pa.int64()), ("first_store_timestamp", pa.int64()), ("last_store_timestamp", pa.int64()),
     ("queues", pa.int64()), ("p50_size", pa.int64()), ("p90_size", pa.int64()), ("p99_size", pa.int64())]
)
_LAG_SCHEMA = pa.schema(
    [("group", pa.string()), ("topic", pa.string()), ("queue_id", pa.int32()), ("consumer_offset", pa.int64()),
     ("max_offset", pa.int64()), ("max_offset_source", pa.string()), ("lag", pa.int64())]
)


def _lag(
    consumer_offsets: list[dict[str, Any]] | None, queue_ends: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Lag rows per (group, topic, queue) and ``consumer_offsets`` findings for offsets past the end."""
    if consumer_offsets is None:
        return [], []
    ends = {(r["topic"], r["queue_id"]): r for r in queue_ends}
    rows, ahead = [], []
    for co in sorted(consumer_offsets, key=lambda r: (r["group"], r["topic"], r["queue_id"])):
        end = ends.get((co["topic"], co["queue_id"]))
        max_off, source = None, None
        if end is not None:
            if end.get("cq_max_offset") is not None:
                max_off, source = end["cq_max_offset"], "consumequeue"
            elif end.get("max_offset") is not None:
                max_off, source = end["max_offset"], "commitlog"
        lag = None if max_off is None else max(max_off - co["consumer_offset"], 0)
        rows.append({**co, "max_offset": max_off, "max_offset_source": source, "lag": lag})
        if max_off is not None and co["consumer_offset"] > max_off:
            ahead.append({
                "check": "consumer_offsets", "kind": "offset_ahead", "topic": co["topic"],
                "queue_id": co["queue_id"], "queue_offset": co["consumer_offset"], "group": co["group"],
                "detail": json.dumps({"consumer_offset": co["consumer_offset"], "max_offset": max_off,
                                      "max_offset_source": source}),
            })
    return rows, ahead


def _summarise_findings(findings: DataFrame, limit: int) -> dict[str, dict[str, Any]]:
    """Counts per check and kind, and the first ``limit`` examples per check (in store order)."""
    results: dict[str, dict[str, Any]] = {
        name: {"count": 0, "by_kind": {}, "examples": []} for name in checks.ALL_FINDING_CHECKS
    }
    order: list[Column | str] = [
        F.col("physical_offset").asc_nulls_last(), "topic", "queue_id", "queue_offset", "key", "kind", "detail"
    ]
    ranked = (
        findings.withColumn("rank", F.row_number().over(Window.partitionBy("check").orderBy(*order)))
        .withColumn("kind_rank", F.row_number().over(Window.partitionBy("check", "kind").orderBy(*order)))
        .withColumn("kind_count", F.count(F.lit(1)).over(Window.partitionBy("check", "kind")))
    )
    # One job: the first ``limit`` findings of each check, plus one row per kind to carry its count.
    wanted = ranked.where((F.col("rank") <= F.lit(limit)) | (F.col("kind_rank") == 1))
    for r in sorted(wanted.collect(), key=lambda r: (r["check"], r["rank"])):
        d = r.asDict()
        res = results.setdefault(d["check"], {"count": 0, "by_kind": {}, "examples": []})
        if d["kind_rank"] == 1:
            res["by_kind"][d["kind"]] = d["kind_count"]
            res["count"] += d["kind_count"]
        if d["rank"] > limit:
            continue
        for k in ("rank", "kind_rank", "kind_count"):
            d.pop(k)
        try:
            d["detail"] = json.loads(d["detail"]) if d.get("detail") else None
        except ValueError:
            pass
        res["examples"].append({k: v for k, v in d.items() if v is not None})
    return results


def audit_store(
    spark: SparkSession, store_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str], **opts: Any
) -> dict[str, Any]:
    """One-line audit for tests and notebooks: ``audit_store(spark, store, out, since_ms=...)``."""
    return run_audit(spark, AuditOptions(store=os.fspath(store_dir), out=os.fspath(out_dir), **opts))

