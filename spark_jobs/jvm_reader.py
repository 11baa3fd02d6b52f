"""The commit log's record schema read in the JVM where the segments are clean, by the Python data source elsewhere.

The Python data source (``trimq-commitlog``) is bounded by what Spark does around a Python reader: a worker per
task, Arrow batches over a socket, every row of every batch turned into an ``UnsafeRow`` (docs/AUDIT.md). A reader in
the JVM (``jvm/CommitLogSource.java``, built into ``jvm/trimq-commitlog.jar`` by ``make``) has none of that, and
Spark prunes its columns. It reads only what it can read exactly as the Python readers do; the audit must read what
is broken too, so :func:`read_records` splits the work by segment:

1. a Spark job scans every segment in the JVM, one task per segment (``CommitLogSource.scanSegments``): a segment
   is *clean* when every record is a message of IPv4 hosts that the Python readers take as regular (magic, size
   within ``maxRecordSize``, field lengths adding up, topic and properties well-formed UTF-8, no property named
   twice) and its records end in the end-of-file filler, in zeros up to the end, or at the end. For a clean
   segment the scan returns its record-boundary split cuts;
2. clean segments are read by the JVM source, every other one by the Python data source (planned in the driver over
   the whole segment list, so a torn tail is still a torn tail of the last segment);
3. the parts are united in segment order (a union keeps its children's partition order), so the rows and their
   order are those of ``spark.read.format("trimq-commitlog").load(path)``.

Without the jar on the session's class path (``build_session`` adds it when it is built) everything goes to the
Python data source.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from functools import reduce
from pathlib import Path
from typing import Any

from trimq.spark_jobs.commitlog_source import (
    RECORD_SCHEMA,
    CommitLogDataSource,
    SplitPartition,
    parse_size,
    read_planned,
    read_planned_where,
)
from trimq.spark_jobs.parser import DEFAULT_MAX_RECORD_SIZE, DEFAULT_SPLIT_SIZE, ordered_segments, resolve_segments
from trimq.spark_jobs.session import JVM_READER_JAR

__all__ = ["JAR_PATH", "JVM_SOURCE", "build_jar", "jvm_reader_loaded", "read_records", "scan_segments"]

JVM_SOURCE = "org.trimq.spark.CommitLogSource"
SOURCE_PATH = Path(__file__).with_name("jvm") / "CommitLogSource.java"
JAR_PATH = JVM_READER_JAR


def javac() -> str:
    """The Java compiler: ``$JAVA_HOME/bin/javac``, else the one on PATH. RuntimeError saying what is missing."""
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "javac").is_file():
        return str(Path(home) / "bin" / "javac")
    found = shutil.which("javac")
    if found is None:
        raise RuntimeError("no javac (a JDK, not only a JRE) in $JAVA_HOME/bin or on PATH")
    return found


def build_jar(jar: Path = JAR_PATH) -> Path:
    """Compile ``CommitLogSource.java`` against the installed pyspark's jars into ``jar``; returns its path."""
    import pyspark

    classpath = f"{Path(pyspark.__file__).parent / 'jars'}/*"
    compiler = javac()
    with tempfile.TemporaryDirectory(prefix="trimq-jvm-") as classes:
        done = subprocess.run([compiler, "-nowarn", "--release", "17", "-d", classes, "-cp", classpath,
                               str(SOURCE_PATH)], capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"javac failed on {SOURCE_PATH}:\n{done.stderr}")
        tmp = jar.with_suffix(".tmp")
        subprocess.run([str(Path(compiler).with_name("jar")), "cf", str(tmp), "-C", classes, "."], check=True,
                       capture_output=True)
        tmp.replace(jar)
    return jar


def jvm_reader_loaded(spark: Any) -> bool:
    """Whether the session's JVM can load the JVM source (its jar was on ``spark.jars`` when the session started)."""
    try:
        loader = spark._jvm.java.lang.Thread.currentThread().getContextClassLoader()
        spark._jvm.java.lang.Class.forName(JVM_SOURCE, True, loader)
    except Exception:  # py4j raises its own error for ClassNotFoundException
        return False
    return True


def scan_segments(spark: Any, files: list[str], *, split_size: int = DEFAULT_SPLIT_SIZE,
                  max_record_size: int = DEFAULT_MAX_RECORD_SIZE) -> list[list[int] | None]:
    """Per segment of ``files``: None when it is not clean, else its split cuts (record boundaries from 0 to where
    its records end). One Spark job, a segment per task."""
    if not files:
        return []
    answer = spark._jvm.org.trimq.spark.CommitLogSource.scanSegments(
        spark._jsparkSession, "\n".join(files), max_record_size, split_size)
    return [None if line == "-" else [int(x) for x in line.split()] for line in str(answer).split("\n")]


def read_records(spark: Any, path: str, *, split_size: str | int = DEFAULT_SPLIT_SIZE, include_body: bool = False,
                 max_record_size: int = DEFAULT_MAX_RECORD_SIZE, prune_columns: bool = True) -> Any:
    """The DataFrame of ``spark.read.format("trimq-commitlog").load(path)`` with these options (the record schema,
    its rows in its order), clean segments read in the JVM (the module docstring). ``prune_columns=False`` makes the
    JVM reader fill every column whatever Spark reads (to measure the reader itself)."""
    split_bytes = parse_size(split_size, "split size")
    options = {"splitSize": str(split_bytes), "includeBody": str(include_body).lower(),
               "maxRecordSize": str(max_record_size)}
    files = ordered_segments(resolve_segments(path))
    # (the scan and the splits name files one per line)
    if not files or any("\n" in f for f in files) or not jvm_reader_loaded(spark):
        return read_planned(spark, CommitLogDataSource, path, **options)
    cuts = scan_segments(spark, files, split_size=split_bytes, max_record_size=max_record_size)
    frames = []
    i = 0
    while i < len(files):
        clean = cuts[i] is not None
        j = i
        while j < len(files) and (cuts[j] is not None) == clean:
            j += 1
        if clean:
            splits = [f"{files[k]} {a} {b}" for k in range(i, j)
                      for a, b in zip(cuts[k] or [], (cuts[k] or [])[1:], strict=False)]
            if splits:
                frames.append(spark.read.format(JVM_SOURCE).option("splits", "\n".join(splits))
                              .option("includeBody", options["includeBody"])
                              .option("maxRecordSize", options["maxRecordSize"])
                              .option("pruneColumns", str(prune_columns).lower()).load())
        else:
            frames.append(read_planned_where(spark, CommitLogDataSource, path, _in_segments(set(files[i:j])),
                                             options))
        i = j
    if not frames:
        return spark.createDataFrame([], RECORD_SCHEMA)
    return reduce(_union, frames)


def _union(a: Any, b: Any) -> Any:
    return a.union(b)


def _in_segments(segments: set[str]) -> Callable[[Any], bool]:
    """Whether a partition of the Python data source reads one of ``segments``."""
    return lambda p: isinstance(p, SplitPartition) and p.split is not None and p.split.path in segments
