"""The audit on a real Spark standalone cluster (master + worker on loopback, from deploy/spark/), compared
with the same audit on local[*] (the shared ``planted_audit``, tests/spark/conftest.py): the same summary,
finding for finding. It is also the test of the console script as a user runs it: its own driver JVM,
``--since``, nothing written to the cwd, no log noise."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from small_spark import TEST_JAVA_OPTIONS, conf_args

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.xdist_group("spark")]

REPO = Path(__file__).resolve().parents[2]
START = REPO / "deploy" / "spark" / "start-local-cluster.sh"
STOP = REPO / "deploy" / "spark" / "stop-local-cluster.sh"
AUDIT_BIN = Path(sys.executable).with_name("trimq-audit")
VOLATILE = ("generated_at", "elapsed_s", "out", "outputs", "spark", "since", "since_iso")
SINCE = "2000-01-01T00:00:00Z"


def _comparable(summary: dict) -> dict:
    return {k: v for k, v in json.loads(json.dumps(summary)).items() if k not in VOLATILE}


@pytest.mark.skipif(not AUDIT_BIN.exists(), reason="trimq-audit console script not installed in this venv")
def test_audit_on_a_standalone_cluster_equals_local(planted_audit, tmp_path: Path) -> None:
    store, local = planted_audit.store, planted_audit.summary
    env = {k: v for k, v in os.environ.items()
           if k not in ("SPARK_HOME", "SPARK_CONF_DIR", "PYTHONPATH", "PYSPARK_GATEWAY_PORT")}
    env.update({"STATE_DIR": str(tmp_path / "cluster"), "SPARK_MASTER_PORT": "0", "WORKER_CORES": "2",
                "WORKER_MEMORY": "1g", "PYTHON": sys.executable,
                "SPARK_DAEMON_JAVA_OPTS": TEST_JAVA_OPTIONS})
    starter = subprocess.Popen([str(START)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = starter.communicate(timeout=120)
        assert starter.returncode == 0, err[-3000:]
        master = out.strip().splitlines()[-1]
        # Port 0: the master binds a free port itself (no window for another process to take one picked here).
        assert re.fullmatch(r"spark://127\.0\.0\.1:[1-9][0-9]*", master), out
        cli_env = {k: v for k, v in env.items() if k not in ("STATE_DIR", "SPARK_MASTER_PORT")}
        cli_env["SPARK_LOCAL_IP"] = "127.0.0.1"  # the driver, like the cluster, on loopback
        # Default splits here, 2000-byte ones in the local run: the report must not depend on them. A window
        # that starts before every record changes nothing but the summary's "since".
        cmd = [str(AUDIT_BIN), "--store", str(store), "--out", str(tmp_path / "remote"), "--master", master,
               "--since", SINCE, "--examples", str(planted_audit.example_limit), "--json", "-q"]
        cmd += conf_args({"spark.executor.memory": "1g"})
        cwd = tmp_path / "cwd"
        cwd.mkdir()
        proc = subprocess.run(cmd, env=cli_env, cwd=cwd, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 1, proc.stderr[-3000:]  # the planted defects, as locally
        remote = json.loads(proc.stdout)
        assert list(cwd.iterdir()) == []
        # Only the JDK's one unavoidable line; no Spark log banner.
        noise = [ln for ln in proc.stderr.splitlines() if ln.strip() and "incubator" not in ln]
        assert noise == [], proc.stderr[-2000:]
    finally:
        if starter.poll() is None:
            starter.kill()
            starter.wait()
        subprocess.run([str(STOP)], env=env, timeout=60, check=False)
    assert remote["spark"]["master"] == master and local["spark"]["master"].startswith("local")
    assert (remote["since"], remote["since_iso"]) == (946_684_800_000, SINCE) and local["since"] is None
    assert _comparable(remote) == _comparable(local)
    assert remote["defects"] == 6 and remote["records"]["messages"] == local["records"]["messages"] > 0
    # The executors ran the shipped zip (trimq/...): the cluster's work dir holds it for the application.
    assert any(p.name.endswith(".zip") for p in (tmp_path / "cluster" / "work").rglob("*"))
