"""bench.peer_bench's run order: with several peers the runs alternate, so that load drifting during a rate's runs
reaches both systems alike (the latency curve used to run one system's five runs, then the other's)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from bench import peer_bench


class _Peer:
    def __init__(self, name: str) -> None:
        self.name = name

    def version(self) -> str:
        return f"{self.name} 1.0"


def _parse(*argv: str) -> argparse.Namespace:
    return peer_bench.build_parser().parse_args(["run", *argv])


def test_runs_alternate_one_of_each_peer_per_round(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    args = _parse("--peer", "redis,trimq", "--runs", "3", "--mode", "live", "--tag", "rate10000",
                  "--results", str(tmp_path))
    order: list[tuple[str, int]] = []

    def one_run(run_args: argparse.Namespace, mod: Any, i: int) -> dict[str, Any]:
        assert mod.name == run_args.peer  # each run gets its own peer's arguments and module
        order.append((run_args.peer, i))
        p99 = 10.0 + i if run_args.peer == "redis" else 20.0 + i
        return {"run": i, "p99_ms": p99, "cpu_us_per_msg": {"server": 1.0, "producer": 1.0, "consumers": 1.0,
                                                            "total": 3.0}}

    monkeypatch.setattr(peer_bench, "one_run", one_run)
    monkeypatch.setattr(peer_bench, "peer_mod", _Peer)
    summaries = peer_bench.run_main(args)

    assert order == [("redis", 0), ("trimq", 0), ("redis", 1), ("trimq", 1), ("redis", 2), ("trimq", 2)]
    assert sorted(summaries) == ["redis", "trimq"]
    for name, median_p99 in (("redis", 11.0), ("trimq", 21.0)):
        written = json.loads((tmp_path / f"{name}-live-rate10000.json").read_text())
        assert written["peer"] == name and written["version"] == f"{name} 1.0"
        assert written["median"]["p99_ms"] == median_p99 == summaries[name]["median"]["p99_ms"]
        assert [r["run"] for r in written["runs"]] == [0, 1, 2]


def test_one_peer_runs_as_before(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    args = _parse("--peer", "trimq", "--runs", "2", "--mode", "backlog", "--results", str(tmp_path))
    order: list[tuple[str, int]] = []

    def one_run(run_args: argparse.Namespace, mod: Any, i: int) -> dict[str, Any]:
        order.append((run_args.peer, i))
        return {"run": i}

    monkeypatch.setattr(peer_bench, "one_run", one_run)
    monkeypatch.setattr(peer_bench, "peer_mod", _Peer)
    peer_bench.run_main(args)
    assert order == [("trimq", 0), ("trimq", 1)]
    assert (tmp_path / "trimq-backlog.json").is_file()


@pytest.mark.parametrize("value", ["kafka", "redis,redis", "redis,", ""])
def test_peer_list_is_checked(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        _parse("--peer", value)
    assert "expected one or more of redis, trimq" in capsys.readouterr().err


def test_a_role_process_runs_one_peer() -> None:
    args = peer_bench.build_parser().parse_args(["role", "--peer", "redis,trimq", "--role", "produce",
                                                 "--outdir", "/nonexistent"])
    with pytest.raises(SystemExit, match="a role process runs one peer"):
        peer_bench.role_main(args)
