"""The audit's checks as DataFrame transformations (no I/O, no actions).

Every check returns findings in one schema, ``FINDINGS_COLUMNS``, so that all of them go to one Parquet
table partitioned by ``check``. docs/AUDIT.md explains each check and kind.

Inputs are DataFrames of ``commitlog_source.RECORD_SCHEMA`` rows (``records``: the audited window;
``all_records``: the whole store, for things that need the true end of a queue) and of
``commitlog_source.CQ_SCHEMA`` units.
"""

from __future__ import annotations

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
DEFECT_CHECKS = ("integrity", "offsets", "consume_queue", "key_queues", "born_order", "consumer_offsets")
ALL_FINDING_CHECKS = (*DEFECT_CHECKS, "dead_letters")

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
        "key": shard_key(F.col("keys")),
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
    j = u.join(recs, u["commitlog_offset"] == recs["r_offset"], "left")
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
    missing = want.join(units, want["physical_offset"] == units["commitlog_offset"], "left_anti")
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
        .withColumn("key", shard_key(F.col("keys")))
        .where(F.col("key").isNotNull())
    )


def key_queues(records: DataFrame) -> DataFrame:
    """Per (topic, sharding key): every message in one queue."""
    km = keyed_messages(records)
    per_queue = km.groupBy("topic", "key", "queue_id").agg(
        F.count(F.lit(1)).alias("messages"), F.min("physical_offset").alias("first_physical_offset")
    )
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

    Columns: group, origin (ORIGIN_MESSAGE_ID, or the record's own id), stage (scheduled|retry|dlq),
    key, retry_topic (the original topic), delay_level, and the record's position and times.
    """
    props = F.col("properties")
    real_topic = props.getItem(MessageConst.REAL_TOPIC)
    topic = F.col("topic")
    effective = F.when(topic == SCHEDULE_TOPIC, real_topic).otherwise(topic)
    r = messages(records).where(
        effective.startswith(RETRY_GROUP_TOPIC_PREFIX) | effective.startswith(DLQ_GROUP_TOPIC_PREFIX)
    )
    origin = props.getItem(MessageConst.ORIGIN_MESSAGE_ID)
    return r.select(
        _group_of(effective).alias("group"),
        F.when((origin.isNull()) | (F.trim(origin) == ""), F.col("msg_id")).otherwise(origin).alias("origin"),
        F.when(topic == SCHEDULE_TOPIC, "scheduled")
        .when(topic.startswith(DLQ_GROUP_TOPIC_PREFIX), "dlq")
        .otherwise("retry")
        .alias("stage"),
        shard_key(F.col("keys")).alias("key"),
        props.getItem(MessageConst.RETRY_TOPIC).alias("retry_topic"),
        F.expr(f"try_cast(properties['{MessageConst.DELAY_TIME_LEVEL}'] AS INT)").alias("delay_level"),
        "topic", "queue_id", "queue_offset", "physical_offset", "reconsume_times", "store_timestamp",
        "born_timestamp", "msg_id",
    )


def lineage(records: DataFrame, all_records: DataFrame) -> DataFrame:
    """One row per (group, ORIGIN_MESSAGE_ID): the chain of scheduled/retry/DLQ records in store order.

    ``steps[i].delay_ms`` is the store-time distance from the previous step (from the original message
    for the first step, when the original is in the store).
    """
    red = redeliveries(records)
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
    )
    orig = messages(all_records).select(
        F.col("msg_id").alias("o_msg_id"),
        F.col("topic").alias("origin_topic"),
        F.col("queue_id").alias("origin_queue_id"),
        F.col("queue_offset").alias("origin_queue_offset"),
        F.col("store_timestamp").alias("origin_store_timestamp"),
    )
    j = chains.join(orig, chains["origin"] == orig["o_msg_id"], "left")
    steps = F.expr(
        "transform(steps0, (s, i) -> named_struct("
        "'stage', s.stage, 'topic', s.topic, 'queue_id', s.queue_id, 'queue_offset', s.queue_offset, "
        "'physical_offset', s.physical_offset, 'reconsume_times', s.reconsume_times, "
        "'delay_level', s.delay_level, 'store_timestamp', s.store_timestamp, 'msg_id', s.msg_id, "
        "'delay_ms', s.store_timestamp - IF(i = 0, origin_store_timestamp, steps0[i - 1].store_timestamp)))"
    )
    return j.select(
        "group",
        "origin",
        F.coalesce(F.col("origin_topic"), F.col("retry_topic")).alias("origin_topic"),
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
        detail=F.struct("origin", "retry_topic", "reconsume_times", "msg_id"),
    )


def group_retry_stats(records: DataFrame) -> DataFrame:
    """Per consumer group: retry deliveries, scheduled copies, DLQ arrivals, retried messages (distinct
    origins) and how many of them reached the DLQ."""
    return (
        redeliveries(records)
        .groupBy("group")
        .agg(
            F.sum(F.when(F.col("stage") == "retry", 1).otherwise(0)).alias("retries"),
            F.sum(F.when(F.col("stage") == "scheduled", 1).otherwise(0)).alias("scheduled"),
            F.sum(F.when(F.col("stage") == "dlq", 1).otherwise(0)).alias("dlq_arrivals"),
            F.countDistinct("origin").alias("messages"),
            F.countDistinct(F.when(F.col("stage") == "dlq", F.col("origin"))).alias("dead_lettered"),
        )
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
