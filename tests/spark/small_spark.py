"""Spark settings for the tests: tiny stores read by short-lived JVMs.

The tests' JVMs live for seconds on stores of a few KB, so nearly all their CPU goes to warming up:
C1 alone compiles what a short run needs (C2's compiler threads cost more than they save here: the cluster
test took 72 s instead of 84 s on 2 cores), whole-stage code generation compiles more code than the tiny stages run, and
adaptive execution turns each shuffle into a job of its own (twice the jobs). The audit's defaults for
real stores are not these.
"""

from __future__ import annotations

#: JVM options of every JVM a test starts: the driver, a standalone cluster's daemons, its executors.
TEST_JAVA_OPTIONS = "-XX:TieredStopAtLevel=1"

#: Spark settings for the tests' tiny stores (the shared local session and every trimq-audit the tests run).
SMALL_STORE_CONF = {
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
    "spark.sql.adaptive.enabled": "false",
    "spark.driver.extraJavaOptions": TEST_JAVA_OPTIONS,
    "spark.executor.extraJavaOptions": TEST_JAVA_OPTIONS,
}


def conf_args(conf: dict[str, str] | None = None) -> list[str]:
    """``--conf KEY=VALUE`` arguments for trimq-audit: SMALL_STORE_CONF updated with ``conf``."""
    args: list[str] = []
    for key, value in {**SMALL_STORE_CONF, **(conf or {})}.items():
        args += ["--conf", f"{key}={value}"]
    return args
