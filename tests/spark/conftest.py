"""One SparkSession for every Spark test of the run (starting one costs 5-10 s and ~0.5 GB)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

PLANTED_EXAMPLES = 5


def _java_available() -> bool:
    home = os.environ.get("JAVA_HOME")
    return bool(shutil.which("java") or (home and os.path.exists(os.path.join(home, "bin", "java"))))


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """local[2], UI off, quiet, loopback only, temp dirs outside the cwd, with the settings for tiny stores
    and short-lived JVMs (small_spark.SMALL_STORE_CONF, which says why)."""
    if not _java_available():
        pytest.skip("no Java runtime: the Spark tests need one (JAVA_HOME or java on PATH)")
    from small_spark import SMALL_STORE_CONF

    from trimq.spark_jobs.session import build_session, stop_session

    session = build_session("local[2]", app_name="trimq-tests", conf=SMALL_STORE_CONF)
    yield session
    stop_session(session)


class PlantedAudit(NamedTuple):
    """The planted-defect store (audit_stores.build_planted_store), audited once on the shared local
    session with ``split_size=audit_stores.SPLIT_SIZE, example_limit=PLANTED_EXAMPLES``."""

    planted: dict[str, Any]
    store: Path
    out: Path
    summary: dict[str, Any]
    example_limit: int


@pytest.fixture(scope="session")
def planted_audit(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> PlantedAudit:
    """Shared by the test of the planted findings and the cluster test (which compares its run with this
    one): one local audit of the store instead of two."""
    from audit_stores import SPLIT_SIZE, build_planted_store

    from trimq.spark_jobs.audit import audit_store

    root = tmp_path_factory.mktemp("planted")
    planted = build_planted_store(root / "store")
    summary = audit_store(spark, root / "store", root / "out", split_size=SPLIT_SIZE,
                          example_limit=PLANTED_EXAMPLES)
    return PlantedAudit(planted, root / "store", root / "out", summary, PLANTED_EXAMPLES)
