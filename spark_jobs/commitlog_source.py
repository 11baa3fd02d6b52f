"""Spark 4 Python data sources over a store directory: ``trimq-commitlog`` and ``trimq-consumequeue``.

``spark.read.format("trimq-commitlog").load(path)`` reads commit-log segments (RocketMQ 4.x record
layout) as rows; ``path`` is a store dir, a ``commitlog/`` dir or a comma-separated list of segment files.
Options (case-insensitive):

* ``splitSize`` -- bytes per partition (default 64 MiB; suffixes k/m/g accepted). Partitions are byte
  ranges of segments that resynchronise on a record boundary; see ``trimq.spark_jobs.parser``.
* ``includeBody`` -- ``true`` to fill the ``body`` column (default ``false``: it stays null).
* ``batchSize`` -- rows per Arrow batch (default 32768 with the vectorised scanner, whose fixed costs per batch
  it amortises, 8192 with the sequential one). A task holds one batch and one read window (8 MiB, or one record
  if larger) at a time, plus the record starts the consume queues give for 64 MiB of log, whatever the segment
  size.
* ``maxRecordSize`` -- the largest total size taken as plausible when resynchronising (default 4 MiB
  plus topic and properties, RocketMQ's maxMessageSize).
* ``columns`` -- a comma-separated projection (Python data sources get no column pruning from Spark):
  record columns, the derived columns of ``spark_jobs.vectorized.DERIVED_COLUMNS`` (``shard_key``,
  ``split_start``, ``queue_step``, ``born_step``) and ``prop_<NAME>`` (one property as a string
  column). Default: every record column, ``RECORD_SCHEMA``.
* ``scanner`` -- ``vectorized`` (default: ``spark_jobs.vectorized``, column-wise Arrow batches) or
  ``sequential`` (``spark_jobs.parser``, record by record; the same rows, kept as the reference).
* ``partials`` -- ``true``: instead of every record, the audit's map-side partial aggregates per split and
  the records its checks report or follow (``spark_jobs.partials``; needs ``columns``, the audit's
  projection; ``sinceMs`` sets the window).
* ``filter`` -- JSON ``{"queues": [[topic, qid]...], "keys": [[topic, shard_key]...], "offsets": [...],
  "uniq_keys": [...]}``: only the records in one of those queues or keys, at one of those commit-log
  offsets, or with one of those UNIQ_KEYs (the audit's targeted second reads).

``spark.read.format("trimq-consumequeue").load(path)`` reads ``consumequeue/<topic>/<qid>/`` files of
20-byte units (all-zero units, i.e. unwritten ones, are skipped). Options: ``queues`` (``topic:qid,...``:
only those queues); ``summary`` (``true``: one row per file instead of one per unit, ``CQ_SUMMARY_SCHEMA``:
unit count, offset range and the sums of ``vectorized.unit_hashes`` over the units at or above
``minCommitlogOffset``), computed with numpy so the JVM never sees the units one by one.

Call ``register(spark)`` once per session. The workers import this module and ``trimq.spark_jobs.parser``, so
the package must be importable there (PYTHONPATH locally, ``--py-files`` on a cluster).

``read_planned(spark, CommitLogDataSource, path, **options)`` gives the same DataFrame without registering: the
driver plans the partitions itself and the executors read them through ``mapInArrow``. The audit reads this way
(pyspark plans a registered source in Python processes of its own, seconds of start-up per read).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.datasource import CaseInsensitiveDict, DataSource, DataSourceReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
)

from trimq.spark_jobs.cq_positions import CQ_UNIT_SIZE, CqFile, list_consume_queue_files
from trimq.spark_jobs.parser import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_MAX_RECORD_SIZE,
    DEFAULT_SPLIT_SIZE,
    SegmentSplit,
    SplitScanner,
    plan_splits,
    resolve_segments,
)
from trimq.spark_jobs.partials import PARTIAL_FIELDS, SplitPartials
from trimq.spark_jobs.vectorized import (
    DEFAULT_VECTOR_BATCH_SIZE,
    VectorScanner,
    batch_to_arrow,
    column_type,
    unit_hashes,
)

FORMAT_NAME = "trimq-commitlog"
CQ_FORMAT_NAME = "trimq-consumequeue"

RECORD_SCHEMA = StructType(
    [
        StructField("segment", StringType()),
        StructField("file_position", LongType()),
        StructField("physical_offset", LongType()),
        StructField("total_size", LongType()),
        StructField("magic", LongType()),
        StructField("body_crc", IntegerType()),
        StructField("crc_ok", BooleanType()),
        StructField("queue_id", IntegerType()),
        StructField("flag", IntegerType()),
        StructField("queue_offset", LongType()),
        StructField("sys_flag", IntegerType()),
        StructField("born_timestamp", LongType()),
        StructField("born_host", StringType()),
        StructField("store_timestamp", LongType()),
        StructField("store_host", StringType()),
        StructField("reconsume_times", IntegerType()),
        StructField("prepared_transaction_offset", LongType()),
        StructField("topic", StringType()),
        StructField("properties", MapType(StringType(), StringType())),
        StructField("keys", StringType()),
        StructField("tags", StringType()),
        StructField("body_size", IntegerType()),
        StructField("msg_id", StringType()),
        StructField("body", BinaryType()),
        StructField("malformed", BooleanType()),
        StructField("error", StringType()),
    ]
)

CQ_SCHEMA = StructType(
    [
        StructField("topic", StringType()),
        StructField("queue_id", IntegerType()),
        StructField("cq_offset", LongType()),
        StructField("commitlog_offset", LongType()),
        StructField("size", IntegerType()),
        StructField("tags_code", LongType()),
        StructField("file", StringType()),
        StructField("file_position", LongType()),
    ]
)

_SIZE_RE = re.compile(r"^\s*(\d+)\s*([kmgKMG]?)i?[bB]?\s*$")
_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off", ""}


class OptionError(ValueError):
    """A data source option has a value we cannot use."""


def parse_size(value: str | int, what: str = "size") -> int:
    """``67108864``, ``64m``, ``64MiB``, ``1g`` -> bytes. Raises OptionError for anything else."""
    if isinstance(value, int):
        n = value
    else:
        m = _SIZE_RE.match(str(value))
        if not m:
            raise OptionError(f"{what} {value!r} is not a byte count (e.g. 67108864, 64m, 1g)")
        n = int(m.group(1)) * {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[m.group(2).lower()]
    if n <= 0:
        raise OptionError(f"{what} must be positive, got {value!r}")
    return n


def _bool_option(options: Mapping[str, str], name: str, default: bool) -> bool:
    if name not in options:
        return default
    v = str(options[name]).strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise OptionError(f"option {name} must be true or false, got {options[name]!r}")


def _path_option(options: Mapping[str, str]) -> str:
    if "path" in options and str(options["path"]).strip():
        return str(options["path"])
    if "paths" in options:  # Spark's encoding of load([a, b])
        import json

        try:
            paths = json.loads(options["paths"])
        except ValueError:
            paths = [options["paths"]]
        if paths:
            return ",".join(str(p) for p in paths)
    raise OptionError(
        f"{FORMAT_NAME}: give a path: load(store_dir), load(commitlog_dir) or load('seg1,seg2,...')"
    )


class SplitPartition(InputPartition):
    """One byte range of one segment (pickled to the worker that reads it); None for an empty store."""

    def __init__(self, split: SegmentSplit | None) -> None:
        super().__init__(split)
        self.split = split


_SPARK_TYPES = {
    pa.string(): StringType(),
    pa.int64(): LongType(),
    pa.int32(): IntegerType(),
    pa.bool_(): BooleanType(),
    pa.binary(): BinaryType(),
}


def columns_option(options: Mapping[str, str]) -> tuple[str, ...] | None:
    """The ``columns`` option as a tuple of names (None when absent). Raises OptionError for unknown names."""
    raw = options.get("columns")
    if raw is None or not str(raw).strip():
        return None
    names = tuple(c.strip() for c in str(raw).split(",") if c.strip())
    for c in names:
        try:
            column_type(c)
        except KeyError:
            raise OptionError(
                f"{FORMAT_NAME}: unknown column {c!r} in option columns (record columns, shard_key, split_start, "
                "queue_step, born_step, prop_<NAME>)"
            ) from None
    if len(set(names)) != len(names):
        raise OptionError(f"{FORMAT_NAME}: option columns names a column twice: {raw!r}")
    return names


def spark_schema(columns: Sequence[str] | None, partials: bool = False) -> StructType:
    """The Spark schema of a projection (None: ``RECORD_SCHEMA``), with the partial-aggregate columns."""
    if columns is None:
        if partials:
            raise OptionError("option partials needs option columns (the audit's projection)")
        return RECORD_SCHEMA
    fields = []
    for c in columns:
        if c in RECORD_SCHEMA.names:
            fields.append(StructField(c, RECORD_SCHEMA[c].dataType))
        else:
            fields.append(StructField(c, _SPARK_TYPES[column_type(c)]))
    if partials:
        fields += [StructField(name, _SPARK_TYPES[typ]) for name, typ in PARTIAL_FIELDS]
    return StructType(fields)


def _filter_option(options: Mapping[str, str]) -> dict | None:
    raw = options.get("filter")
    if raw is None:
        return None
    import json

    try:
        spec = json.loads(str(raw))
    except ValueError as exc:
        raise OptionError(f"option filter is not JSON: {exc}") from None
    if not isinstance(spec, dict):
        raise OptionError("option filter must be a JSON object")
    return {
        "queues": {(str(t), int(q)) for t, q in spec.get("queues", [])},
        "keys": {(str(t), str(k)) for t, k in spec.get("keys", [])},
        "offsets": {int(o) for o in spec.get("offsets", [])},
        "uniq_keys": {str(u) for u in spec.get("uniq_keys", [])},
    }


def _apply_filter(batch: pa.RecordBatch, spec: dict) -> pa.RecordBatch:
    """The rows of ``batch`` that one of the filter's sets selects."""
    import numpy as np
    import pyarrow.compute as pc

    n = batch.num_rows
    keep = np.zeros(n, dtype=bool)
    names = batch.schema.names
    if spec["offsets"] and "physical_offset" in names:
        keep |= np.asarray(pc.fill_null(pc.is_in(batch.column("physical_offset"),
                                                  pa.array(sorted(spec["offsets"]), pa.int64())), False))
    if spec["uniq_keys"] and "prop_UNIQ_KEY" in names:
        keep |= np.asarray(pc.fill_null(pc.is_in(pc.utf8_trim_whitespace(batch.column("prop_UNIQ_KEY")),
                                                  pa.array(sorted(spec["uniq_keys"]))), False))
    for field, key_col in (("queues", "queue_id"), ("keys", "shard_key")):
        if spec[field] and key_col in names:
            wanted = spec[field]
            tops = batch.column("topic").to_pylist()
            ks = batch.column(key_col).to_pylist()
            keep |= np.fromiter(((t, k) in wanted for t, k in zip(tops, ks, strict=True)), dtype=bool, count=n)
    return batch.filter(pa.array(keep))


class CommitLogReader(DataSourceReader):
    """Plans byte-range partitions on the driver and scans them on the workers."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.path = _path_option(options)
        self.split_size = parse_size(options.get("splitSize", DEFAULT_SPLIT_SIZE), "splitSize")
        self.scanner = str(options.get("scanner", "vectorized")).strip().lower()
        default_batch = DEFAULT_VECTOR_BATCH_SIZE if self.scanner == "vectorized" else DEFAULT_BATCH_SIZE
        self.batch_size = parse_size(options.get("batchSize", default_batch), "batchSize")
        self.max_record_size = parse_size(options.get("maxRecordSize", DEFAULT_MAX_RECORD_SIZE), "maxRecordSize")
        self.include_body = _bool_option(options, "includeBody", False)
        self.columns = columns_option(options)
        self.partials = _bool_option(options, "partials", False)
        self.since_ms = int(options["sinceMs"]) if options.get("sinceMs") not in (None, "") else None
        self.filter = _filter_option(options)
        if self.scanner not in ("vectorized", "sequential"):
            raise OptionError(f"option scanner must be vectorized or sequential, got {options['scanner']!r}")
        if self.scanner == "sequential" and self.columns is not None:
            raise OptionError("option columns needs the vectorized scanner")

    def partitions(self) -> Sequence[InputPartition]:
        splits = plan_splits(resolve_segments(self.path), self.split_size)
        if not splits:
            return [SplitPartition(None)]
        return [SplitPartition(s) for s in splits]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        split = getattr(partition, "split", None)
        if split is None:
            return
        if self.scanner == "sequential":
            schema = to_arrow_schema(RECORD_SCHEMA, timezone="UTC")
            scanner = SplitScanner(
                split,
                include_body=self.include_body,
                batch_size=self.batch_size,
                max_record_size=self.max_record_size,
            )
            for batch in scanner.batches():
                yield batch_to_arrow(batch, schema)
            return
        if self.partials:
            assert self.columns is not None
            yield from SplitPartials(split, self.columns, since_ms=self.since_ms, batch_size=self.batch_size,
                                     max_record_size=self.max_record_size).batches()
            return
        batches = VectorScanner(
            split,
            columns=self.columns,
            include_body=self.include_body,
            batch_size=self.batch_size,
            max_record_size=self.max_record_size,
        ).batches()
        if self.filter is None:
            yield from batches
            return
        for batch in batches:
            kept = _apply_filter(batch, self.filter)
            if kept.num_rows:
                yield kept


class CommitLogDataSource(DataSource):
    """``trimq-commitlog``: commit-log records (RocketMQ 4.x layout) as rows. See the module docstring."""

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> StructType:
        return spark_schema(columns_option(self.options), _bool_option(self.options, "partials", False))

    def reader(self, schema: StructType) -> DataSourceReader:
        if schema != self.schema():
            raise OptionError(
                f"{FORMAT_NAME} has a fixed schema (choose columns with option columns); do not pass .schema(...)"
            )
        return CommitLogReader(self.options)


# ---------------------------------------------------------------------------------------------------
# Consume queues


_CQ_DTYPE = None


def read_cq_units(f: CqFile) -> pa.RecordBatch:
    """All written units of one consume-queue file as a RecordBatch of CQ_SCHEMA."""
    import numpy as np

    global _CQ_DTYPE
    if _CQ_DTYPE is None:
        _CQ_DTYPE = np.dtype([("o", ">i8"), ("s", ">i4"), ("t", ">i8")])
    with open(f.path, "rb") as fh:
        data = fh.read()
    n = len(data) // CQ_UNIT_SIZE
    units = np.frombuffer(data, dtype=_CQ_DTYPE, count=n)
    off = units["o"].astype(np.int64)
    size = units["s"].astype(np.int32)
    tag = units["t"].astype(np.int64)
    idx = np.nonzero((off != 0) | (size != 0))[0]
    pos = idx.astype(np.int64) * CQ_UNIT_SIZE
    schema = to_arrow_schema(CQ_SCHEMA, timezone="UTC")
    k = len(idx)
    return pa.RecordBatch.from_arrays(
        [
            pa.array([f.topic] * k, pa.string()),
            pa.array(np.full(k, f.queue_id, dtype=np.int32)),
            pa.array((f.base + pos) // CQ_UNIT_SIZE),
            pa.array(off[idx]),
            pa.array(size[idx]),
            pa.array(tag[idx]),
            pa.array([os.path.basename(f.path)] * k, pa.string()),
            pa.array(pos),
        ],
        schema=schema,
    )


CQ_SUMMARY_SCHEMA = StructType(
    [
        StructField("topic", StringType()),
        StructField("queue_id", IntegerType()),
        StructField("file", StringType()),
        StructField("units", LongType()),  # written units in the file
        StructField("min_cq_offset", LongType()),
        StructField("max_cq_offset", LongType()),
        StructField("checked_units", LongType()),  # units at or above minCommitlogOffset
        StructField("h1", LongType()),  # sums of unit_hashes over the checked units
        StructField("h2", LongType()),
    ]
)


def summarise_cq_units(f: CqFile, min_commitlog_offset: int = 0) -> pa.RecordBatch:
    """One CQ_SUMMARY_SCHEMA row for a consume-queue file."""
    import numpy as np

    units = read_cq_units(f)
    off = np.asarray(units.column("commitlog_offset"))
    size = np.asarray(units.column("size")).astype(np.int64)
    qoff = np.asarray(units.column("cq_offset"))
    chk = off >= min_commitlog_offset
    h1, h2 = unit_hashes(qoff[chk], off[chk], size[chk])
    n = len(off)
    row = {
        "topic": [f.topic], "queue_id": [f.queue_id], "file": [os.path.basename(f.path)], "units": [n],
        "min_cq_offset": [int(qoff.min()) if n else None], "max_cq_offset": [int(qoff.max()) if n else None],
        "checked_units": [int(chk.sum())], "h1": [int(h1.sum())], "h2": [int(h2.sum())],
    }
    return pa.RecordBatch.from_pydict(row, schema=to_arrow_schema(CQ_SUMMARY_SCHEMA, timezone="UTC"))


def _queues_option(options: Mapping[str, str]) -> set[tuple[str, int]] | None:
    raw = options.get("queues")
    if raw is None:
        return None
    out = set()
    for item in str(raw).split(","):
        topic, sep, qid = item.strip().rpartition(":")
        if not sep or not topic or not qid.isdigit():
            raise OptionError(f"option queues: expected topic:queueId[,topic:queueId...], got {item!r}")
        out.add((topic, int(qid)))
    return out


class CqPartition(InputPartition):
    """A few consume-queue files, read one after the other."""

    def __init__(self, files: tuple[CqFile, ...]) -> None:
        super().__init__(len(files))
        self.files = files


class ConsumeQueueReader(DataSourceReader):
    def __init__(self, options: Mapping[str, str]) -> None:
        self.path = _path_option(options)
        self.files_per_partition = int(options.get("filesPerPartition", "16"))
        self.summary = _bool_option(options, "summary", False)
        self.min_commitlog_offset = int(options.get("minCommitlogOffset", "0"))
        self.queues = _queues_option(options)

    def partitions(self) -> Sequence[InputPartition]:
        files = list_consume_queue_files(self.path)
        if self.queues is not None:
            files = [f for f in files if (f.topic, f.queue_id) in self.queues]
        n = max(self.files_per_partition, 1)
        parts = [CqPartition(tuple(files[i : i + n])) for i in range(0, len(files), n)]
        return parts or [CqPartition(())]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        for f in getattr(partition, "files", ()):
            if self.summary:
                yield summarise_cq_units(f, self.min_commitlog_offset)
                continue
            batch = read_cq_units(f)
            if batch.num_rows:
                yield batch


class ConsumeQueueDataSource(DataSource):
    """``trimq-consumequeue``: consume-queue units (commit-log offset, size, tags code) as rows."""

    @classmethod
    def name(cls) -> str:
        return CQ_FORMAT_NAME

    def schema(self) -> StructType:
        return CQ_SUMMARY_SCHEMA if _bool_option(self.options, "summary", False) else CQ_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return ConsumeQueueReader(self.options)


def register(spark: SparkSession) -> None:
    """Register both data sources with ``spark`` (idempotent)."""
    spark.dataSource.register(CommitLogDataSource)
    spark.dataSource.register(ConsumeQueueDataSource)


def read_planned(spark: SparkSession, source: type[CommitLogDataSource] | type[ConsumeQueueDataSource], path: str,
                 **options: str) -> DataFrame:
    """What ``spark.read.format(source.name()).options(**options).load(path)`` reads, planned here in the driver.

    pyspark 4.3 plans a registered Python data source in fresh Python processes, each starting an interpreter and
    importing pyspark, pyarrow and this module: one looks up the installed sources when the first is registered,
    one creates the source at ``load``, one plans the reader's partitions when a job runs. Before the first read of
    a session that took ~8 s on 2 cores (2026-11-29), most of a small store's audit. Here the driver creates the
    source and plans the partitions, and the executors' Python workers read partition *i* in partition *i* of
    ``spark.range`` with ``mapInArrow``: the same reader, batches and rows, in the same partitions. Bad options
    raise here (OptionError), not in a worker.
    """
    return read_planned_where(spark, source, path, None, options)


def read_planned_where(spark: SparkSession, source: type[CommitLogDataSource] | type[ConsumeQueueDataSource],
                       path: str, keep: Callable[[InputPartition], bool] | None, options: Mapping[str, str]
                       ) -> DataFrame:
    """:func:`read_planned` keeping only the partitions ``keep`` accepts (None: all), planned over the whole ``path``
    all the same (the segments ``jvm_reader`` leaves to this reader: a torn tail stays the last segment's)."""
    opts = CaseInsensitiveDict({**options, "path": path})
    data_source = source(opts)
    schema = data_source.schema()
    reader = data_source.reader(schema)
    partitions = [p for p in reader.partitions() if keep is None or keep(p)]
    if not partitions:
        return spark.createDataFrame([], schema)

    def read_partitions(ids: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in ids:
            for i in batch.column(0).to_pylist():
                yield from reader.read(partitions[i])

    return spark.range(len(partitions), numPartitions=len(partitions)).mapInArrow(read_partitions, schema)
