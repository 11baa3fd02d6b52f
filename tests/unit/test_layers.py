"""The layer rules that are cheapest to check by running them (the rest is import-linter's, `make lint`):
the SDK imports without click, and every command-line tool answers ``--version``."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from click.testing import CliRunner

import trimq


def test_the_sdk_does_not_import_click() -> None:
    # A fresh interpreter: this test process has click loaded already.
    code = textwrap.dedent("""
        import importlib, pkgutil, sys
        import trimq.client
        names = sorted(m.name for m in pkgutil.walk_packages(trimq.client.__path__, "trimq.client."))
        for name in names:
            importlib.import_module(name)
        assert len(names) > 20, names
        print(len(names), "click" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    count, loaded = out.stdout.split()
    assert loaded == "False", f"importing the {count} modules of trimq.client loaded click"


@pytest.mark.parametrize("tool", ["broker", "namesrv", "producer", "consumer", "admin"])
def test_every_tool_answers_version(tool: str) -> None:
    import importlib

    main = importlib.import_module(f"trimq.tools.{tool}").main
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.output == f"trimq-{tool} {trimq.__version__}\n"


def test_audit_answers_version(capsys: pytest.CaptureFixture[str]) -> None:
    from trimq.spark_jobs.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"trimq-audit {trimq.__version__}\n"
