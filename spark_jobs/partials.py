"""Map-side partial aggregates of the audit, per split (no pyspark; numpy + pyarrow).

The audit's aggregates over every record (queue runs, key runs, per-minute throughput, the size
histogram) are computed by the Python reader for the records of its split, and only the partial rows
travel to the JVM, with the few records a check reports or follows (malformed regions, CRC and offset
mismatches, retry/schedule/DLQ records). Spark then combines partials of a few thousand rows instead of
converting and caching every record: at 10M records the JVM's share of a row (about 1.3 us of CPU to
turn Arrow into rows, several more to cache it) was most of the audit's time.

``PARTIALS_SCHEMA`` is one schema for all kinds: ``kind`` says which columns are set. ``record`` rows carry
``checks.AUDIT_COLUMNS``; ``queue_run``, ``key_run``, ``minute`` and ``size`` rows carry the grouping keys
(``topic``, ``queue_id``, ``shard_key``, ``minute_ms``, ``total_size``, ``segment``, ``split_start``) and the
columns below. The definitions are those of ``checks.queue_runs`` / ``checks.key_runs`` (which compute
the same over a DataFrame), per split, so ``certify_queues`` and ``suspicious_keys`` work on either.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from trimq.spark_jobs.parser import SegmentSplit
from trimq.spark_jobs.vectorized import DEFAULT_VECTOR_BATCH_SIZE, VectorScanner, column_type

PARTIAL_FIELDS = (
    ("kind", pa.string()),
    ("minute_ms", pa.int64()),
    # queue_run (takes-a-queue-offset records, per topic/queue/split; n..first_ts over the window)
    ("n", pa.int64()), ("lo", pa.int64()), ("hi", pa.int64()), ("bad", pa.int64()), ("h1", pa.int64()),
    ("h2", pa.int64()), ("first_offset", pa.int64()), ("first_ts", pa.int64()), ("first_ts_all", pa.int64()),
    ("hi_all", pa.int64()),
    # key_run (keyed records per topic/shard_key/queue/split: the window's count and first offset; first and
    # last born timestamp and in-split inversions over the whole store)
    ("n_w", pa.int64()), ("first_w", pa.int64()), ("first_phys", pa.int64()), ("first_born", pa.int64()),
    ("last_born", pa.int64()), ("inversions", pa.int64()),
    # minute (topic/minute) and size (topic/queue/total_size) over the window's messages
    ("messages", pa.int64()), ("bytes", pa.int64()), ("min_size", pa.int64()), ("max_size", pa.int64()),
    ("first_store_ts", pa.int64()), ("last_store_ts", pa.int64()),
)
_SCHEDULE = "SCHEDULE_TOPIC_XXXX"


def partials_schema(record_columns: Sequence[str]) -> pa.Schema:
    """The Arrow schema of the partial rows: ``record_columns`` then ``PARTIAL_FIELDS``."""
    return pa.schema([(c, column_type(c)) for c in record_columns] + list(PARTIAL_FIELDS))


class SplitPartials:
    """Reads one split with ``VectorScanner(columns=record_columns)`` and yields partial rows."""

    def __init__(self, split: SegmentSplit, record_columns: Sequence[str], *, since_ms: int | None = None,
                 batch_size: int = DEFAULT_VECTOR_BATCH_SIZE, max_record_size: int | None = None) -> None:
        self.split = split
        self.cols = tuple(record_columns)
        self.schema = partials_schema(self.cols)
        self.since_ms = since_ms
        kw = {"columns": self.cols, "batch_size": batch_size}
        if max_record_size is not None:
            kw["max_record_size"] = max_record_size
        self.scanner = VectorScanner(split, **kw)  # type: ignore[arg-type]
        base = split.segment
        self.base = int(base) if len(base) == 20 and base.isdigit() else None

    def _rows(self, table: pa.Table, kind: str) -> pa.RecordBatch:
        n = table.num_rows
        arrays = []
        for field in self.schema:
            if field.name == "kind":
                arrays.append(pa.array([kind] * n, pa.string()))
            elif field.name in table.column_names:
                arrays.append(table.column(field.name).cast(field.type).combine_chunks())
            else:
                arrays.append(pa.nulls(n, field.type))
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)

    def batches(self) -> Iterator[pa.RecordBatch]:
        q_parts: list[pa.Table] = []
        k_parts: list[pa.Table] = []
        m_parts: list[pa.Table] = []
        since = self.since_ms
        for b in self.scanner.batches():
            n = b.num_rows
            malformed = np.asarray(b.column("malformed"), dtype=bool)
            store_ts = np.asarray(b.column("store_timestamp").fill_null(0), dtype=np.int64)
            window = malformed | (True if since is None else store_ts >= since)
            if not isinstance(window, np.ndarray):
                window = np.ones(n, dtype=bool)
            msg = ~malformed
            crc_bad = msg & ~np.asarray(b.column("crc_ok").fill_null(True), dtype=bool)
            phys = np.asarray(b.column("physical_offset").fill_null(0), dtype=np.int64)
            interesting = malformed | crc_bad
            if self.base is not None:
                pos = np.asarray(b.column("file_position"), dtype=np.int64)
                interesting |= msg & (phys != self.base + pos)
            topic = b.column("topic")
            eff = pc.if_else(pc.equal(topic, _SCHEDULE), b.column("prop_REAL_TOPIC"), topic)
            red = np.asarray(pc.fill_null(pc.or_(pc.starts_with(eff, "%RETRY%"), pc.starts_with(eff, "%DLQ%")),
                                          False), dtype=bool)
            interesting = (interesting | (red & msg)) & window
            tb = pa.Table.from_batches([b])
            if interesting.any():
                yield self._rows(tb.filter(pa.array(interesting)), "record")
            sysflag = np.asarray(b.column("sys_flag").fill_null(0), dtype=np.int64) & 0xC
            takes = msg & (sysflag != 0x4) & (sysflag != 0xC)
            win = pa.array(window)
            if takes.any():
                q = tb.select(["topic", "queue_id", "queue_offset", "queue_step", "unit_h1", "unit_h2",
                               "physical_offset", "store_timestamp"]).append_column("w", win)
                q_parts.append(q.filter(pa.array(takes)))
            keyed = takes & np.asarray(pc.is_valid(b.column("shard_key")), dtype=bool) & _ordinary(topic)
            if keyed.any():
                k = tb.select(["topic", "shard_key", "queue_id", "physical_offset", "born_timestamp",
                               "born_step"]).append_column("w", win)
                k_parts.append(k.filter(pa.array(keyed)))
            wm = msg & window
            if wm.any():
                m = tb.select(["topic", "queue_id", "total_size", "store_timestamp"]).filter(pa.array(wm))
                m_parts.append(m)
        seg = self.split.segment
        start = self.split.start
        if q_parts:
            yield self._with_split(_queue_runs(pa.concat_tables(q_parts)), "queue_run", seg, start)
        if k_parts:
            yield self._with_split(_key_runs(pa.concat_tables(k_parts)), "key_run", seg, start)
        if m_parts:
            mt = pa.concat_tables(m_parts)
            yield self._rows(_minutes(mt), "minute")
            yield self._rows(_sizes(mt), "size")

    def _with_split(self, table: pa.Table, kind: str, seg: str, start: int) -> pa.RecordBatch:
        n = table.num_rows
        table = table.append_column("segment", pa.array([seg] * n, pa.string()))
        table = table.append_column("split_start", pa.array(np.full(n, start, dtype=np.int64)))
        return self._rows(table, kind)


def _ordinary(topic: pa.Array) -> np.ndarray:
    special = pc.or_(
        pc.or_(pc.starts_with(topic, "%RETRY%"), pc.starts_with(topic, "%DLQ%")),
        pc.or_(pc.equal(topic, _SCHEDULE), pc.starts_with(topic, "RMQ_SYS_")),
    )
    return ~np.asarray(pc.fill_null(special, True), dtype=bool)


def _where(mask: pa.Array, values: pa.Array) -> pa.Array:
    return pc.if_else(mask, values, pa.scalar(None, values.type))


def _queue_runs(t: pa.Table) -> pa.Table:
    w = t.column("w")
    step = t.column("queue_step")
    bad = pc.and_(w, pc.and_(pc.is_valid(step), pc.not_equal(pc.fill_null(step, 1), 1)))
    t = t.append_column("nw", pc.cast(w, pa.int64()))
    t = t.append_column("lo_", _where(w, t.column("queue_offset")))
    t = t.append_column("bad_", pc.cast(bad, pa.int64()))
    t = t.append_column("h1_", _where(w, t.column("unit_h1")))
    t = t.append_column("h2_", _where(w, t.column("unit_h2")))
    t = t.append_column("fo_", _where(w, t.column("physical_offset")))
    t = t.append_column("ft_", _where(w, t.column("store_timestamp")))
    g = t.group_by(["topic", "queue_id"], use_threads=False).aggregate([
        ("nw", "sum"), ("lo_", "min"), ("lo_", "max"), ("bad_", "sum"), ("h1_", "sum"), ("h2_", "sum"),
        ("fo_", "min"), ("ft_", "min"), ("store_timestamp", "min"), ("queue_offset", "max"),
    ])
    return _reorder(g, {"nw_sum": "n", "lo__min": "lo", "lo__max": "hi", "bad__sum": "bad", "h1__sum": "h1",
                        "h2__sum": "h2", "fo__min": "first_offset", "ft__min": "first_ts",
                        "store_timestamp_min": "first_ts_all", "queue_offset_max": "hi_all"})


def _reorder(g: pa.Table, names: dict[str, str]) -> pa.Table:
    return g.rename_columns([names.get(c, c) for c in g.column_names])


def _key_runs(t: pa.Table) -> pa.Table:
    w = t.column("w")
    t = t.append_column("nw", pc.cast(w, pa.int64()))
    t = t.append_column("fw_", _where(w, t.column("physical_offset")))
    t = t.append_column("inv_", pc.cast(pc.fill_null(pc.less(t.column("born_step"), 0), False), pa.int64()))
    g = t.group_by(["topic", "shard_key", "queue_id"], use_threads=False).aggregate([
        ("nw", "sum"), ("fw_", "min"), ("physical_offset", "min"), ("born_timestamp", "first"),
        ("born_timestamp", "last"), ("inv_", "sum"),
    ])
    return _reorder(g, {"nw_sum": "n_w", "fw__min": "first_w", "physical_offset_min": "first_phys",
                        "born_timestamp_first": "first_born", "born_timestamp_last": "last_born",
                        "inv__sum": "inversions"})


def _minutes(t: pa.Table) -> pa.Table:
    ts = t.column("store_timestamp")
    minute = pc.multiply(pc.divide(ts, 60_000), 60_000)  # integer division: store times are positive
    t = t.append_column("minute_ms", minute)
    g = t.group_by(["topic", "minute_ms"], use_threads=False).aggregate([
        ([], "count_all"), ("total_size", "sum"), ("total_size", "min"), ("total_size", "max"),
    ])
    return _reorder(g, {"count_all": "messages", "total_size_sum": "bytes", "total_size_min": "min_size",
                        "total_size_max": "max_size"})


def _sizes(t: pa.Table) -> pa.Table:
    g = t.group_by(["topic", "queue_id", "total_size"], use_threads=False).aggregate([
        ([], "count_all"), ("store_timestamp", "min"), ("store_timestamp", "max"),
    ])
    return _reorder(g, {"count_all": "messages", "store_timestamp_min": "first_store_ts",
                        "store_timestamp_max": "last_store_ts"})
