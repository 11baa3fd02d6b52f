"""One SparkSession for every Spark test of the run (starting one costs 5-10 s and ~0.5 GB)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest


def _java_available() -> bool:
    home = os.environ.get("JAVA_HOME")
    return bool(shutil.which("java") or (home and os.path.exists(os.path.join(home, "bin", "java"))))


@pytest.fixture(scope="session")
def spark() -> Iterator[object]:
    """local[2], UI off, 2 shuffle partitions, quiet, loopback only, temp dirs outside the cwd.

    Whole-stage code generation is off: the test stores are tiny, so compiling generated code for
    every stage costs more than running it interpreted (about 40% of the audit's time here), and
    adaptive execution turns each shuffle into a job of its own (twice the jobs).
    """
    if not _java_available():
        pytest.skip("no Java runtime: the Spark tests need one (JAVA_HOME or java on PATH)")
    from trimq.spark_jobs.session import build_session, stop_session

    session = build_session(
        "local[2]",
        app_name="trimq-tests",
        conf={
            "spark.sql.shuffle.partitions": "2",
            "spark.default.parallelism": "2",
            "spark.sql.codegen.wholeStage": "false",
            "spark.sql.codegen.factoryMode": "NO_CODEGEN",
            "spark.sql.adaptive.enabled": "false",
        },
    )
    yield session
    stop_session(session)
