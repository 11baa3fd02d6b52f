"""The audit's checks as DataFrame transformations (no I/O, no actions), and the small driver-side
decisions that keep them cheap.

Every check returns findings in one schema, ``FINDINGS_COLUMNS``, so that all of them go to one Parquet
table partitioned by ``check``. docs/AUDIT.md explains each check and kind.

Inputs are DataFrames of ``commitlog_source.RECORD_SCHEMA`` rows or of the audit's projection
(``AUDIT_COLUMNS``: no property map, the properties it needs as ``prop_<NAME>`` columns, the shard key,
and the reader's in-split steps), ``records`` being the audited window and ``all_records`` the whole
store, and of ``commitlog_source.CQ_SCHEMA`` units.

Scaling. The exact checks that sort (offsets, born order) or join the consume queue with the commit log
run only on the queues and keys that aggregates cannot clear: ``queue_runs`` (per queue and split:
offset range, count, steps that are not +1, unit hashes) certifies a queue's offsets contiguous and,
compared with the consume-queue summary, its units; ``key_runs`` (per key, queue and split: first and
last born timestamp, in-split inversions) certifies a key in one queue and in born order. A queue or key
that is not certified goes through the exact check, so findings are the same as checking everything.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from itertools import pairwise
from typing import Any

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from trimq.protocol.message import MessageConst
from trimq.protocol.validation import DLQ_GROUP_TOPIC_PREFIX, RETRY_GROUP_TOPIC_PREFIX, SCHEDULE_TOPIC

FINDINGS_COLUMNS = (
    "check",
    "kind",
    "topic",
    "queue_id",
    "queue_offset",
    "physical_offset",
    "segment",
    "file_position",
    "key",
    "group",
    "detail",
)
FINDINGS_DDL = (
    "check string, kind string, topic string, queue_id int, queue_offset bigint, physical_offset bigint, "
    "segment string, file_position bigint, key string, `group` string, detail string"
)

# Checks whose findings are defects (exit code 1). ``dead_letters`` only with --fail-on-dlq.
DEFECT_CHECKS = (
    "integrity", "offsets", "consume_queue", "key_queues", "born_order", "consumer_offsets", "retry_lineage",
)
ALL_FINDING_CHECKS = (*DEFECT_CHECKS, "dead_letters")

# The properties the audit reads (as prop_<NAME> columns of the projection).
AUDIT_PROPERTIES = (
    MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    MessageConst.ORIGIN_MESSAGE_ID,
    MessageConst.REAL_TOPIC,
    MessageConst.RETRY_TOPIC,
    MessageConst.DELAY_TIME_LEVEL,
)
# What the audit reads from the commit log (trimq-commitlog's ``columns`` option).
AUDIT_COLUMNS = (
    "segment", "file_position", "physical_offset", "total_size", "magic", "body_crc", "crc_ok", "queue_id",
    "queue_offset", "sys_flag", "born_timestamp", "born_host", "store_timestamp", "reconsume_times", "topic",
    "keys", "shard_key", "body_size", "msg_id", "malformed", "error",
    *(f"prop_{p}" for p in AUDIT_PROPERTIES),
    "split_start", "queue_step", "born_step", "unit_h1", "unit_h2",
)
# Reader bookkeeping, not written to the records table.
INTERNAL_COLUMNS = ("split_start", "queue_step", "born_step", "unit_h1", "unit_h2")

SYSTEM_TOPIC_PREFIX = "RMQ_SYS_"
SYSFLAG_TRANSACTION_MASK = 0xC
SYSFLAG_PREPARED = 0x4
SYSFLAG_ROLLBACK = 0xC


def _finding(
    df: DataFrame,
    check: str,
    kind: Column | str,
    *,
    detail: Column,
    topic: Column | None = None,
    queue_id: Column | None = None,
    queue_offset: Column | None = None,
    physical_offset: Column | None = None,
    segment: Column | None = None,
    file_position: Column | None = None,
    key: Column | None = None,
    group: Column | None = None,
) -> DataFrame:
    def col(c: Column | None, typ: str) -> Column:
        return (F.lit(None) if c is None else c).cast(typ)

    return df.select(
        F.lit(check).alias("check"),
        (F.lit(kind) if isinstance(kind, str) else kind).alias("kind"),
        col(topic, "string").alias("topic"),
        col(queue_id, "int").alias("queue_id"),
        col(queue_offset, "bigint").alias("queue_offset"),
        col(physical_offset, "bigint").alias("physical_offset"),
        col(segment, "string").alias("segment"),
        col(file_position, "bigint").alias("file_position"),
        col(key, "string").alias("key"),
        col(group, "string").alias("group"),
        F.to_json(detail).alias("detail"),
    )


def shard_key(keys: Column) -> Column:
    """The sharding key: the first of the space-separated KEYS (null when there is none)."""
    k = F.regexp_extract(keys, r"^\s*(\S+)", 1)
    return F.when(k == "", None).otherwise(k)


def is_special_topic(topic: Column) -> Column:
    """Retry, DLQ, schedule and RMQ_SYS_ topics: not ordinary business topics."""
    return (
        topic.startswith(RETRY_GROUP_TOPIC_PREFIX)
        | topic.startswith(DLQ_GROUP_TOPIC_PREFIX)
        | (topic == SCHEDULE_TOPIC)
        | topic.startswith(SYSTEM_TOPIC_PREFIX)
    )


def takes_queue_offset(sys_flag: Column) -> Column:
    """Prepared and rolled-back transactional records get no queue offset and no consume-queue unit."""
    t = sys_flag.bitwiseAND(SYSFLAG_TRANSACTION_MASK)
    return (t != SYSFLAG_PREPARED) & (t != SYSFLAG_ROLLBACK)


def messages(records: DataFrame) -> DataFrame:
    return records.where(~F.col("malformed"))


def key_column(df: DataFrame) -> Column:
    """The sharding key: the projection's ``shard_key``, else computed from ``keys``."""
    return F.col("shard_key") if "shard_key" in df.columns else shard_key(F.col("keys"))


def prop(df: DataFrame, name: str) -> Column:
    """Property ``name``: the projection's ``prop_<name>`` column, else a lookup in the ``properties`` map."""
    col = f"prop_{name}"
    return F.col(col) if col in df.columns else F.col("properties").getItem(name)


def segment_base(segment: Column) -> Column:
    return F.when(segment.rlike("^[0-9]{20}$"), segment.cast("bigint"))


# ---------------------------------------------------------------------------------------------------


def integrity(records: DataFrame) -> DataFrame:
    """Malformed regions (by kind), CRC mismatches, physical offsets that disagree with the position."""
    mal = records.where(F.col("malformed"))
    malformed = _finding(
        mal,
        "integrity",
        F.substring_index(F.col("error"), ":", 1),
        segment=F.col("segment"),
        file_position=F.col("file_position"),
        physical_offset=F.col("physical_offset"),
        detail=F.struct(F.col("total_size").alias("region_bytes"), F.col("magic"), F.col("error")),
    )
    msgs = messages(records)
    common = {
        "topic": F.col("topic"),
        "queue_id": F.col("queue_id"),
        "queue_offset": F.col("queue_offset"),
        "physical_offset": F.col("physical_offset"),
        "segment": F.col("segment"),
        "file_position": F.col("file_position"),
        "key": key_column(records),
    }
    crc = _finding(
        msgs.where(~F.col("crc_ok")),
        "integrity",
        "crc_mismatch",
        detail=F.struct("body_crc", "body_size", "total_size", "msg_id", "store_timestamp"),
        **common,
    )
    expected = segment_base(F.col("segment")) + F.col("file_position")
    offset = _finding(
        msgs.where(expected.isNotNull() & (F.col("physical_offset") != expected)),
        "integrity",
        "offset_mismatch",
        detail=F.struct(expected.alias("expected_physical_offset"), F.col("total_size")),
        **common,
    )
    return malformed.unionByName(crc).unionByName(offset)


def offsets(records: DataFrame) -> DataFrame:
    """Per (topic, queue): offsets contiguous from the first seen to the last; no offset twice."""
    q = messages(records).where(takes_queue_offset(F.col("sys_flag")))
    w = Window.partitionBy("topic", "queue_id").orderBy("queue_offset", "physical_offset")
    q = q.select(
        "topic", "queue_id", "queue_offset", "physical_offset", "segment", "file_position", "msg_id",
        F.lag("queue_offset").over(w).alias("prev_offset"),
        F.lag("physical_offset").over(w).alias("prev_physical_offset"),
    )
    gaps = _finding(
        q.where(F.col("queue_offset") - F.col("prev_offset") > 1),
        "offsets",
        "gap",
        topic=F.col("topic"),
        queue_id=F.col("queue_id"),
        queue_offset=F.col("prev_offset") + 1,
        physical_offset=F.col("physical_offset"),
        segment=F.col("segment"),
        file_position=F.col("file_position"),
        detail=F.struct(
            (F.col("prev_offset") + 1).alias("first_missing"),
            (F.col("queue_offset") - F.col("prev_offset") - 1).alias("missing"),
            F.col("queue_offset").alias("next_offset"),
            F.col("prev_physical_offset"),
        ),
    )
    dups = _finding(
        q.where(F.col("queue_offset") == F.col("prev_offset")),
        "offsets",
        "duplicate",
        topic=F.col("topic"),
        queue_id=F.col("queue_id"),
        queue_offset=F.col("queue_offset"),
        physical_offset=F.col("physical_offset"),
        segment=F.col("segment"),
        file_position=F.col("file_position"),
        detail=F.struct(F.col("prev_physical_offset").alias("first_physical_offset"), F.col("msg_id")),
    )
    return gaps.unionByName(dups)


def consume_queue(
    records: DataFrame,
    all_records: DataFrame,
    units: DataFrame,
    *,
    commitlog_min_offset: int,
    window_min_offset: int | None,
    broadcast_units: bool = False,
) -> DataFrame:
    """Consume-queue units agree with the commit log.

    ``dangling_unit``: no record starts at the unit's commit-log offset; ``unit_mismatch``: the record
    there has another topic, queue, size or queue offset; ``missing_unit``: a record no unit points at.
    Units below the commit log's first offset point at deleted segments and are not checked; with
    ``--since``, units below the window's first record are not checked either.
    """
    recs = messages(all_records).select(
        F.col("physical_offset").alias("r_offset"),
        F.col("topic").alias("r_topic"),
        F.col("queue_id").alias("r_queue_id"),
        F.col("queue_offset").alias("r_queue_offset"),
        F.col("total_size").alias("r_size"),
        F.col("segment").alias("r_segment"),
        F.col("file_position").alias("r_file_position"),
    )
    floor = max(commitlog_min_offset, window_min_offset or 0)
    u = units.where(F.col("commitlog_offset") >= F.lit(floor))
    j = (F.broadcast(u) if broadcast_units else u).join(recs, u["commitlog_offset"] == recs["r_offset"], "left")
    unit_detail = F.struct(
        F.col("file").alias("cq_file"),
        F.col("file_position").alias("cq_file_position"),
        F.col("size").alias("unit_size"),
        F.col("tags_code"),
    )
    dangling = _finding(
        j.where(F.col("r_offset").isNull()),
        "consume_queue",
        "dangling_unit",
        topic=F.col("topic"),
        queue_id=F.col("queue_id"),
        queue_offset=F.col("cq_offset"),
        physical_offset=F.col("commitlog_offset"),
        detail=unit_detail,
    )
    differs = (
        (F.col("r_topic") != F.col("topic"))
        | (F.col("r_queue_id") != F.col("queue_id"))
        | (F.col("r_queue_offset") != F.col("cq_offset"))
        | (F.col("r_size") != F.col("size"))
    )
    mismatch = _finding(
        j.where(F.col("r_offset").isNotNull() & differs),
        "consume_queue",
        "unit_mismatch",
        topic=F.col("topic"),
        queue_id=F.col("queue_id"),
        queue_offset=F.col("cq_offset"),
        physical_offset=F.col("commitlog_offset"),
        segment=F.col("r_segment"),
        file_position=F.col("r_file_position"),
        detail=F.struct(
            F.col("file").alias("cq_file"),
            F.col("size").alias("unit_size"),
            F.col("r_topic").alias("record_topic"),
            F.col("r_queue_id").alias("record_queue_id"),
            F.col("r_queue_offset").alias("record_queue_offset"),
            F.col("r_size").alias("record_size"),
        ),
    )
    want = messages(records).where(takes_queue_offset(F.col("sys_flag")))
    # A record's own unit: the same commit-log offset AND topic, queue and queue offset. A unit of another
    # queue that points at the record (a unit_mismatch) does not make the record's own unit present.
    own = units.select(
        F.col("commitlog_offset").alias("u_offset"), F.col("topic").alias("u_topic"),
        F.col("queue_id").alias("u_queue_id"), F.col("cq_offset").alias("u_cq_offset"),
    )
    if broadcast_units:
        own = F.broadcast(own)
    missing = want.join(
        own,
        (want["physical_offset"] == own["u_offset"]) & (want["topic"] == own["u_topic"])
        & (want["queue_id"] == own["u_queue_id"]) & (want["queue_offset"] == own["u_cq_offset"]),
        "left_anti",
    )
    missing_f = _finding(
        missing,
        "consume_queue",
        "missing_unit",
        topic=F.col("topic"),
        queue_id=F.col("queue_id"),
        queue_offset=F.col("queue_offset"),
        physical_offset=F.col("physical_offset"),
        segment=F.col("segment"),
        file_position=F.col("file_position"),
        detail=F.struct("total_size", "msg_id"),
    )
    return dangling.unionByName(mismatch).unionByName(missing_f)


def keyed_messages(records: DataFrame) -> DataFrame:
    """Ordinary-topic messages with a sharding key, with the key in column ``key``."""
    return (
        messages(records)
        .where(~is_special_topic(F.col("topic")) & takes_queue_offset(F.col("sys_flag")))
        .withColumn("key", key_column(records))
        .where(F.col("key").isNotNull())
    )


def key_queues(records: DataFrame) -> DataFrame:
    """Per (topic, sharding key): every message in one queue."""
    km = keyed_messages(records)
    per_queue = km.groupBy("topic", "key", "queue_id").agg(
        F.count(F.lit(1)).alias("messages"), F.min("physical_offset").alias("first_physical_offset")
    )
    return _key_spread_finding(per_queue)


def _key_spread_finding(per_queue: DataFrame) -> DataFrame:
    """``key_in_many_queues`` from per (topic, key, queue_id) counts (``messages``, ``first_physical_offset``):
    one finding per key stored in more than one queue."""
    spread = (
        per_queue.groupBy("topic", "key")
        .agg(
            F.count(F.lit(1)).alias("queues"),
            F.sort_array(F.collect_list(F.struct("queue_id", "messages", "first_physical_offset"))).alias(
                "per_queue"
            ),
            F.min("first_physical_offset").alias("first_physical_offset"),
        )
        .where(F.col("queues") > 1)
    )
    return _finding(
        spread,
        "key_queues",
        "key_in_many_queues",
        topic=F.col("topic"),
        key=F.col("key"),
        physical_offset=F.col("first_physical_offset"),
        detail=F.struct("queues", "per_queue"),
    )


def born_order(records: DataFrame) -> DataFrame:
    """Per (topic, sharding key), in store order: a message born before the one stored before it."""
    km = keyed_messages(records)
    w = Window.partitionBy("topic", "key").orderBy("physical_offset")
    km = km.select(
        "topic", "key", "queue_id", "queue_offset", "physical_offset", "segment", "file_position",
        "born_timestamp", "born_host", "msg_id",
        F.lag("born_timestamp").over(w).alias("prev_born_timestamp"),
        F.lag("physical_offset").over(w).alias("prev_physical_offset"),
        F.lag("queue_id").over(w).alias("prev_queue_id"),
        F.lag("born_host").over(w).alias("prev_born_host"),
    )
    return _finding(
        km.where(F.col("born_timestamp") < F.col("prev_born_timestamp")),
        "born_order",
        "born_order_inversion",
        topic=F.col("topic"),
        queue_id=F.col("queue_id"),
        queue_offset=F.col("queue_offset"),
        physical_offset=F.col("physical_offset"),
        segment=F.col("segment"),
        file_position=F.col("file_position"),
        key=F.col("key"),
        detail=F.struct(
            "born_timestamp", "prev_born_timestamp", "prev_physical_offset", "prev_queue_id", "born_host",
            "prev_born_host", "msg_id",
        ),
    )


# ---------------------------------------------------------------------------------------------------
# Retry / DLQ lineage


def _group_of(topic: Column) -> Column:
    return F.regexp_extract(topic, r"^%(?:RETRY|DLQ)%(.*)$", 1)


def redeliveries(records: DataFrame) -> DataFrame:
    """Records of the retry machinery: scheduled copies, %RETRY% deliveries, %DLQ% arrivals.

    Columns: group, ``ref`` and ``ref_kind`` (how the record names its original: ``origin`` =
    ORIGIN_MESSAGE_ID, an offset message id or, since RocketMQ 4.9.3's orderly path and trimq's, a unique
    key; ``uniq_key`` = no ORIGIN_MESSAGE_ID but a UNIQ_KEY, as the retry RocketMQ's client produces
    itself when CONSUMER_SEND_MSG_BACK fails (DefaultMQPushConsumerImpl.sendMessageBack sets
    ORIGIN_MESSAGE_ID, then replaces the whole property map with the original's, so only the original's
    UNIQ_KEY is left); ``self`` = neither: the record's own id), stage (scheduled|retry|dlq), key,
    retry_topic (the original topic), delay_level, and the record's position and times.
    """
    real_topic = prop(records, MessageConst.REAL_TOPIC)
    topic = F.col("topic")
    effective = F.when(topic == SCHEDULE_TOPIC, real_topic).otherwise(topic)
    r = messages(records).where(
        effective.startswith(RETRY_GROUP_TOPIC_PREFIX) | effective.startswith(DLQ_GROUP_TOPIC_PREFIX)
    )
    origin = F.trim(prop(records, MessageConst.ORIGIN_MESSAGE_ID))
    uniq = F.trim(prop(records, MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX))
    has_origin = origin.isNotNull() & (origin != "")
    has_uniq = uniq.isNotNull() & (uniq != "")
    delay = prop(records, MessageConst.DELAY_TIME_LEVEL)
    return r.select(
        _group_of(effective).alias("group"),
        F.when(has_origin, origin).when(has_uniq, uniq).otherwise(F.col("msg_id")).alias("ref"),
        F.when(has_origin, "origin").when(has_uniq, "uniq_key").otherwise("self").alias("ref_kind"),
        F.when(topic == SCHEDULE_TOPIC, "scheduled")
        .when(topic.startswith(DLQ_GROUP_TOPIC_PREFIX), "dlq")
        .otherwise("retry")
        .alias("stage"),
        key_column(records).alias("key"),
        prop(records, MessageConst.RETRY_TOPIC).alias("retry_topic"),
        delay.try_cast("int").alias("delay_level"),
        "topic", "queue_id", "queue_offset", "physical_offset", "reconsume_times", "store_timestamp",
        "born_timestamp", "msg_id",
    )


def resolve_origins(red: DataFrame, all_records: DataFrame, *, broadcast_refs: bool = True) -> DataFrame:
    """Per ``ref`` of ``red`` (not ``self``): the original message, found by its offset message id or, among
    the records of ordinary topics (retry copies carry the original's UNIQ_KEY too), by its unique key;
    an offset-id match wins, then the first record. Columns: ref, o_msg_id, origin_topic, origin_queue_id,
    origin_queue_offset, origin_store_timestamp."""
    refs = red.where(F.col("ref_kind") != "self").select("ref").distinct()
    if broadcast_refs:
        refs = F.broadcast(refs)
    msgs = messages(all_records)
    cols = [
        F.col("msg_id").alias("o_msg_id"), F.col("topic").alias("origin_topic"),
        F.col("queue_id").alias("origin_queue_id"), F.col("queue_offset").alias("origin_queue_offset"),
        F.col("store_timestamp").alias("origin_store_timestamp"), F.col("physical_offset").alias("o_phys"),
    ]
    by_id = msgs.join(refs, msgs["msg_id"] == refs["ref"]).select("ref", F.lit(0).alias("prio"), *cols)
    ordinary = msgs.where(~is_special_topic(F.col("topic")))
    uk = prop(ordinary, MessageConst.UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
    by_uk = ordinary.join(refs, uk == refs["ref"]).select("ref", F.lit(1).alias("prio"), *cols)
    both = by_id.unionByName(by_uk)
    best = F.min_by(
        F.struct("o_msg_id", "origin_topic", "origin_queue_id", "origin_queue_offset", "origin_store_timestamp"),
        F.struct("prio", "o_phys"),
    )
    return both.groupBy("ref").agg(best.alias("o")).select("ref", "o.*")


def lineage(records: DataFrame, all_records: DataFrame, *, broadcast_refs: bool = True) -> DataFrame:
    """One row per (group, origin): the chain of scheduled/retry/DLQ records in store order.

    ``origin`` is the original's offset message id when it is in the store (found by ORIGIN_MESSAGE_ID
    or UNIQ_KEY, see ``redeliveries``), else the reference itself. ``origin_found`` says which; with
    ``ref_kind``, ``retry_without_origin`` uses it. ``steps[i].delay_ms`` is the store-time distance
    from the previous step (from the original message for the first step, when it is in the store).
    """
    red = redeliveries(records)
    res = resolve_origins(red, all_records, broadcast_refs=broadcast_refs)
    red = red.join(F.broadcast(res) if broadcast_refs else res, "ref", "left").withColumn(
        "origin", F.coalesce(F.col("o_msg_id"), F.col("ref"))
    )
    first_step = F.min_by(
        F.struct("topic", "queue_id", "queue_offset", "physical_offset", "msg_id"), F.col("physical_offset")
    )
    chains = red.groupBy("group", "origin").agg(
        F.sort_array(
            F.collect_list(
                F.struct(
                    "physical_offset", "stage", "topic", "queue_id", "queue_offset", "reconsume_times",
                    "delay_level", "store_timestamp", "msg_id",
                )
            )
        ).alias("steps0"),
        F.sum(F.when(F.col("stage") == "retry", 1).otherwise(0)).alias("retries"),
        F.sum(F.when(F.col("stage") == "dlq", 1).otherwise(0)).alias("dlq_arrivals"),
        F.max("reconsume_times").alias("max_reconsume_times"),
        F.first("key", ignorenulls=True).alias("key"),
        F.first("retry_topic", ignorenulls=True).alias("retry_topic"),
        F.min("store_timestamp").alias("first_store_timestamp"),
        F.max("store_timestamp").alias("last_store_timestamp"),
        F.min("born_timestamp").alias("born_timestamp"),
        F.first("ref").alias("ref"),
        F.max(F.when(F.col("ref_kind") == "origin", 2).when(F.col("ref_kind") == "uniq_key", 1).otherwise(0))
        .alias("ref_rank"),
        F.max(F.col("o_msg_id").isNotNull()).alias("origin_found"),
        F.first("origin_topic", ignorenulls=True).alias("origin_topic0"),
        F.first("origin_queue_id", ignorenulls=True).alias("origin_queue_id"),
        F.first("origin_queue_offset", ignorenulls=True).alias("origin_queue_offset"),
        F.first("origin_store_timestamp", ignorenulls=True).alias("origin_store_timestamp"),
        first_step.alias("first_step"),
    )
    steps = F.expr(
        "transform(steps0, (s, i) -> named_struct("
        "'stage', s.stage, 'topic', s.topic, 'queue_id', s.queue_id, 'queue_offset', s.queue_offset, "
        "'physical_offset', s.physical_offset, 'reconsume_times', s.reconsume_times, "
        "'delay_level', s.delay_level, 'store_timestamp', s.store_timestamp, 'msg_id', s.msg_id, "
        "'delay_ms', s.store_timestamp - IF(i = 0, origin_store_timestamp, steps0[i - 1].store_timestamp)))"
    )
    return chains.select(
        "group",
        "origin",
        F.coalesce(F.col("origin_topic0"), F.col("retry_topic")).alias("origin_topic"),
        "origin_queue_id",
        "origin_queue_offset",
        "origin_store_timestamp",
        "key",
        "retries",
        "dlq_arrivals",
        (F.col("dlq_arrivals") > 0).alias("dead_lettered"),
        "max_reconsume_times",
        "first_store_timestamp",
        "last_store_timestamp",
        steps.alias("steps"),
        "origin_found",
        F.element_at(F.array(F.lit("self"), F.lit("uniq_key"), F.lit("origin")), F.col("ref_rank") + 1)
        .alias("ref_kind"),
        "ref",
        "born_timestamp",
        "first_step",
    )


def retry_without_origin(
    chains: DataFrame, *, commitlog_min_offset: int, first_store_timestamp: int | None
) -> DataFrame:
    """Chains whose ORIGIN_MESSAGE_ID names a message that is not in the store although it should be.

    Not reported: chains linked by UNIQ_KEY only (the client's own retries, see ``redeliveries``) or with
    no reference at all; and originals evidently removed by retention: an offset message id of this
    store's host pointing below the first segment, or (for a unique-key reference) a retry born before
    the oldest record of the store (retries keep the original's born timestamp).
    """
    ref = F.col("ref")
    own_prefix = F.expr("substring(first_step.msg_id, 1, length(first_step.msg_id) - 16)")
    is_offset_id = (F.length(ref) == F.length(F.col("first_step.msg_id"))) & (
        F.substring(ref, 1, F.length(ref) - 16) == own_prefix
    ) & ref.rlike("^[0-9A-Fa-f]+$")
    offset = F.conv(F.expr("substring(ref, -16, 16)"), 16, 10).cast("decimal(20,0)")
    deleted = F.when(is_offset_id, offset < F.lit(commitlog_min_offset)).otherwise(
        F.lit(False) if first_store_timestamp is None else F.col("born_timestamp") < F.lit(first_store_timestamp)
    )
    bad = chains.where((F.col("ref_kind") == "origin") & ~F.col("origin_found") & ~deleted)
    return _finding(
        bad,
        "retry_lineage",
        "retry_without_origin",
        topic=F.col("first_step.topic"),
        queue_id=F.col("first_step.queue_id"),
        queue_offset=F.col("first_step.queue_offset"),
        physical_offset=F.col("first_step.physical_offset"),
        key=F.col("key"),
        group=F.col("group"),
        detail=F.struct(
            F.col("ref").alias("origin_message_id"), F.when(is_offset_id, "offset_id").otherwise("unique_key")
            .alias("reference"), "retries", "dlq_arrivals", "first_store_timestamp", "born_timestamp",
            F.col("first_step.msg_id").alias("msg_id"),
        ),
    )


def dead_letters(records: DataFrame) -> DataFrame:
    """Every arrival in a %DLQ% topic, as a finding (a defect only with --fail-on-dlq)."""
    red = redeliveries(records).where(F.col("stage") == "dlq")
    return _finding(
        red,
        "dead_letters",
        "dlq_arrival",
        topic=F.col("topic"),
        queue_id=F.col("queue_id"),
        queue_offset=F.col("queue_offset"),
        physical_offset=F.col("physical_offset"),
        key=F.col("key"),
        group=F.col("group"),
        detail=F.struct(F.col("ref").alias("origin"), "retry_topic", "reconsume_times", "msg_id"),
    )


def group_retry_stats(chains: DataFrame) -> DataFrame:
    """Per consumer group, from ``lineage`` chains: retry deliveries, scheduled copies, DLQ arrivals,
    retried messages (chains, i.e. distinct origins) and how many of them reached the DLQ."""
    return chains.groupBy("group").agg(
        F.sum("retries").alias("retries"),
        F.sum(F.size(F.filter("steps", lambda s: s["stage"] == "scheduled"))).alias("scheduled"),
        F.sum("dlq_arrivals").alias("dlq_arrivals"),
        F.count(F.lit(1)).alias("messages"),
        F.count(F.when(F.col("dlq_arrivals") > 0, 1)).alias("dead_lettered"),
    )


def poison_keys(records: DataFrame, top: int) -> DataFrame:
    """Per group, the sharding keys with the most DLQ arrivals (top ``top``)."""
    d = redeliveries(records).where((F.col("stage") == "dlq") & F.col("key").isNotNull())
    c = d.groupBy("group", "key").agg(F.count(F.lit(1)).alias("dlq_arrivals"))
    w = Window.partitionBy("group").orderBy(F.desc("dlq_arrivals"), "key")
    return c.withColumn("rank", F.row_number().over(w)).where(F.col("rank") <= top)


# ---------------------------------------------------------------------------------------------------
# Volume


def throughput(records: DataFrame, bucket_ms: int = 60_000) -> DataFrame:
    """Per topic and store-time bucket: messages, bytes and record-size distribution."""
    m = messages(records).where(F.col("store_timestamp").isNotNull())
    bucket = (F.floor(F.col("store_timestamp") / bucket_ms) * bucket_ms).cast("bigint")
    return m.groupBy("topic", bucket.alias("minute_ms")).agg(
        F.count(F.lit(1)).alias("messages"),
        F.sum("total_size").alias("bytes"),
        F.min("total_size").alias("min_size"),
        F.avg("total_size").alias("avg_size"),
        F.max("total_size").alias("max_size"),
    )


def size_distribution(records: DataFrame) -> DataFrame:
    """Per topic: message count, bytes, record-size percentiles, first and last store time."""
    m = messages(records)
    return m.groupBy("topic").agg(
        F.count(F.lit(1)).alias("messages"),
        F.sum("total_size").alias("bytes"),
        F.min("total_size").alias("min_size"),
        F.percentile_approx("total_size", [0.5, 0.9, 0.99], 1000).alias("p50_p90_p99"),
        F.max("total_size").alias("max_size"),
        F.min("store_timestamp").alias("first_store_timestamp"),
        F.max("store_timestamp").alias("last_store_timestamp"),
        F.countDistinct("queue_id").alias("queues"),
    )


def queue_ends(all_records: DataFrame) -> DataFrame:
    """Per (topic, queue): the max offset by the commit log (last queue offset + 1)."""
    m = messages(all_records).where(takes_queue_offset(F.col("sys_flag")))
    return m.groupBy("topic", "queue_id").agg((F.max("queue_offset") + 1).alias("max_offset"))


# ---------------------------------------------------------------------------------------------------
# Scaling: certify what is clean with aggregates, run the exact checks on the rest


def queue_runs(all_records: DataFrame, in_window: Column) -> DataFrame:
    """Per (topic, queue, segment, split_start), over the records that take a queue offset: the window's
    count, offset range and steps that are not +1 (the reader's ``queue_step``: the offset minus that of
    the previous record of the queue in the split, in store order), the sums of the unit hashes, the
    first commit-log offset and store time of the window, and the last queue offset of the whole store."""
    q = messages(all_records).where(takes_queue_offset(F.col("sys_flag")))
    w = in_window
    step = F.col("queue_step")
    return q.groupBy("topic", "queue_id", "segment", "split_start").agg(
        F.count(F.when(w, 1)).alias("n"),
        F.min(F.when(w, F.col("queue_offset"))).alias("lo"),
        F.max(F.when(w, F.col("queue_offset"))).alias("hi"),
        F.count(F.when(w & step.isNotNull() & (step != 1), 1)).alias("bad"),
        F.sum(F.when(w, F.col("unit_h1"))).alias("h1"),
        F.sum(F.when(w, F.col("unit_h2"))).alias("h2"),
        F.min(F.when(w, F.col("physical_offset"))).alias("first_offset"),
        F.min(F.when(w, F.col("store_timestamp"))).alias("first_store_timestamp"),
        F.max("queue_offset").alias("hi_all"),
    )


def certify_queues(runs: Iterable[Mapping[str, Any]]) -> dict[tuple[str, int], dict[str, Any]]:
    """Per queue from ``queue_runs`` rows: ``clean`` (the window's offsets are contiguous without repeats:
    within each split every step is +1 and the count fills the range, and the splits' ranges follow one
    another), ``max_offset`` (whole store), ``n``/``h1``/``h2`` (window sums for the consume-queue check)."""
    by_q: dict[tuple[str, int], list[Mapping[str, Any]]] = {}
    for r in runs:
        by_q.setdefault((r["topic"], r["queue_id"]), []).append(r)
    out: dict[tuple[str, int], dict[str, Any]] = {}
    for qk, rs in by_q.items():
        live = sorted((r for r in rs if r["n"]), key=lambda r: r["lo"])
        clean = all(r["bad"] == 0 and r["n"] == r["hi"] - r["lo"] + 1 for r in live) and all(
            b["lo"] == a["hi"] + 1 for a, b in pairwise(live)
        )
        out[qk] = {
            "clean": clean,
            "max_offset": max(r["hi_all"] for r in rs) + 1,
            "n": sum(r["n"] for r in rs),
            "h1": sum(r["h1"] or 0 for r in rs),
            "h2": sum(r["h2"] or 0 for r in rs),
        }
    return out


def key_runs(all_records: DataFrame, in_window: Column) -> DataFrame:
    """Per (topic, key, queue, segment, split_start) of keyed messages: the window's count and first
    offset (for ``key_queues``), and over the whole store the first and last offset and born timestamp
    and the in-split inversions (the reader's ``born_step`` < 0) that ``suspicious_keys`` uses."""
    km = keyed_messages(all_records)
    w = in_window
    return km.groupBy("topic", "key", "queue_id", "segment", "split_start").agg(
        F.count(F.when(w, 1)).alias("n_w"),
        F.min(F.when(w, F.col("physical_offset"))).alias("first_w"),
        F.min("physical_offset").alias("first_phys"),
        F.min_by("born_timestamp", "physical_offset").alias("first_born"),
        F.max_by("born_timestamp", "physical_offset").alias("last_born"),
        F.count(F.when(F.col("born_step") < 0, 1)).alias("inversions"),
    )


def key_queues_from_runs(runs: DataFrame) -> DataFrame:
    """``key_queues`` computed from ``key_runs`` (the same findings, without another pass over records)."""
    per_queue = (
        runs.where(F.col("n_w") > 0)
        .groupBy("topic", "key", "queue_id")
        .agg(F.sum("n_w").alias("messages"), F.min("first_w").alias("first_physical_offset"))
    )
    return _key_spread_finding(per_queue)


def suspicious_keys(runs: DataFrame) -> DataFrame:
    """(topic, key) pairs that ``key_runs`` cannot certify in born order over the whole store: in more
    than one queue (runs of two queues interleave), an inversion inside a split, or a split whose first
    born timestamp is below the previous split's last. Every other key has non-decreasing born timestamps
    in store order, so no window of it has an inversion either."""
    w = Window.partitionBy("topic", "key").orderBy("first_phys")
    r = runs.select(
        "topic", "key", "queue_id", "inversions",
        (F.col("first_born") < F.lag("last_born").over(w)).alias("boundary"),
    )
    return (
        r.groupBy("topic", "key")
        .agg(
            F.countDistinct("queue_id").alias("queues"),
            F.sum("inversions").alias("inversions"),
            F.max(F.coalesce(F.col("boundary"), F.lit(False))).alias("boundary"),
        )
        .where((F.col("queues") > 1) | (F.col("inversions") > 0) | F.col("boundary"))
        .select("topic", "key")
    )


def size_histogram(records: DataFrame) -> DataFrame:
    """Per (topic, queue, record size): messages and first/last store time (for ``sizes``; small)."""
    return messages(records).groupBy("topic", "queue_id", "total_size").agg(
        F.count(F.lit(1)).alias("messages"),
        F.min("store_timestamp").alias("first_store_timestamp"),
        F.max("store_timestamp").alias("last_store_timestamp"),
    )


def sizes_from_histogram(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per topic: messages, bytes, queues, min/max and exact p50/p90/p99 record size (the size at rank
    ceil(p * n) in size order), first/last store time."""
    by_topic: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        by_topic.setdefault(r["topic"], []).append(r)
    out = []
    for topic, rs in by_topic.items():
        n = sum(int(r["messages"]) for r in rs)
        hist: dict[int, int] = {}
        for r in rs:
            hist[int(r["total_size"])] = hist.get(int(r["total_size"]), 0) + int(r["messages"])
        sizes = sorted(hist)
        pct = []
        for p in (0.5, 0.9, 0.99):
            rank = max(1, -(-int(p * 1000) * n // 1000))
            acc = 0
            for sz in sizes:
                acc += hist[sz]
                if acc >= rank:
                    pct.append(sz)
                    break
        firsts = [r["first_store_timestamp"] for r in rs if r["first_store_timestamp"] is not None]
        lasts = [r["last_store_timestamp"] for r in rs if r["last_store_timestamp"] is not None]
        out.append({
            "topic": topic, "messages": n, "bytes": sum(sz * c for sz, c in hist.items()),
            "min_size": sizes[0], "max_size": sizes[-1],
            "first_store_timestamp": min(firsts) if firsts else None,
            "last_store_timestamp": max(lasts) if lasts else None,
            "queues": len({r["queue_id"] for r in rs}), "p50_size": pct[0], "p90_size": pct[1], "p99_size": pct[2],
        })
    return out
