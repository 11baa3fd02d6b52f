"""bench.run_all's report renders the result files it finds (the benchmarks themselves never run in tests)."""

from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path

from bench.run_all import curve_points, machine_text, paced_cpu_text, ratios_text, report, runs_order


def _row(peer: str, mode: str, rate: float, p99: float, total: float) -> dict[str, object]:
    return {"peer": peer, "mode": mode, "n_ok": 3, "sum_violations": 0, "sum_lost": 0, "sum_dups": 0,
            "median": {"produce_msgs_per_s": rate, "consume_msgs_per_s": rate, "p50_ms": 1.0, "p99_ms": p99},
            "range": {"produce_msgs_per_s": [rate * 0.9, rate * 1.1]},
            "cpu_us_per_msg": {"server": 1.0, "producer": 2.0, "consumers": 3.0, "total": total},
            "cpu_us_per_msg_after_ready": {"producer": 1.5, "consumers": 2.5},
            "runs": [{"assignment": {"0": [0, 1], "1": [2, 3]}}]}


def test_report_and_ratios(tmp_path: Path) -> None:
    (tmp_path / "redis-live.json").write_text(json.dumps(_row("redis", "live", 100.0, 10.0, 50.0)))
    (tmp_path / "trimq-live.json").write_text(json.dumps(_row("trimq", "live", 150.0, 5.0, 40.0)))
    (tmp_path / "takeover-graceful.json").write_text(json.dumps(
        {"scenario": "graceful", "victim_queues": [2, 3], "takeover_s_median": 0.15, "takeover_s_max": 0.2,
         "per_queue": {"2": {"takeover_s": 0.1}, "3": {"takeover_s": 0.2}}, "target_s": 0.2, "target_met": True,
         "sent": 10, "lost": 0, "replays": 0, "order_violations": 0, "started_after_lease": 0,
         "stale_commits_refused": 0}))
    (tmp_path / "takeover-cost.json").write_text(json.dumps(
        {"scenario": "cost", "clients": 1000, "queues_per_client": 8, "connections": 50, "renewals_per_s": 1500.0,
         "broker_cpu_s_per_s": 0.3, "idle_broker_cpu_s_per_s": 0.01, "broker_cpu_us_per_renewal": 193.3,
         "p99_ms": 4.0}))
    text = report(tmp_path, {"argv": ["--runs", "3"], "redis_parser": "hiredis parser"})
    assert "| trimq (ASYNC_FLUSH) | live | 150 (135-165)" in text
    assert "| live | 1.50 | 1.50 | 0.50 | 0.80 |" in text
    assert "| graceful | 2 | 0.15 / 0.2 s | 0.2 s met | 0 | 0 | 0 | 0 | 0 |" in text
    assert "1500.0 renewals/s cost the broker 0.3 CPU-s/s" in text
    assert ratios_text(tmp_path) == "trimq/redis live: produce 1.50, consume 1.50, p99 0.50, CPU/msg 0.80"
    assert "Runs of the two systems" not in text  # a run stored before the runs alternated says nothing of it
    text = report(tmp_path, {"argv": [], "runs_order": "alternating, one of each per round (Redis, trimq, Redis, ...)"})
    assert "Runs of the two systems at each rate and in the backlog: alternating, one of each per round" in text


def _curve_row(peer: str, p50: float, p99: float, total: float, rate: float, lag: float | None) -> dict[str, object]:
    row = _row(peer, "live", rate, p99, total)
    row["median"] = {**row["median"], "p50_ms": p50, "p999_ms": p99 * 2, "pace_lag_s": lag}  # type: ignore[dict-item]
    row["range"] = {"produce_msgs_per_s": [rate, rate], "pace_lag_s": [0.0, lag or 0.0]}
    return row


def test_latency_curve_ratios_and_targets(tmp_path: Path) -> None:
    """Issue 22's curve: per rate both systems, the trimq/Redis ratios, and the targets judged only at paced rates
    up to 0.9x Redis's own flat-out rate."""
    rows = {
        "redis-live.json": _curve_row("redis", 3.0, 6.0, 40.0, 30_000, None),
        "trimq-live.json": _curve_row("trimq", 4.0, 12.0, 38.0, 48_000, None),
        "redis-live-rate10000.json": _curve_row("redis", 2.0, 5.0, 50.0, 10_000, 0.001),
        "trimq-live-rate10000.json": _curve_row("trimq", 1.0, 4.0, 36.0, 10_000, 0.002),
        "redis-live-rate20000.json": _curve_row("redis", 2.0, 5.0, 50.0, 20_000, 0.001),
        "trimq-live-rate20000.json": _curve_row("trimq", 3.0, 10.0, 45.0, 20_000, 0.004),
        "redis-live-rate40000.json": _curve_row("redis", 20.0, 50.0, 50.0, 29_000, 1.5),
        "trimq-live-rate40000.json": _curve_row("trimq", 10.0, 40.0, 40.0, 40_000, 0.3),
    }
    for name, row in rows.items():
        (tmp_path / name).write_text(json.dumps(row))
    (tmp_path / "trimq-live-stages.json").write_text(json.dumps(
        {"rate": 20_000, "stages_ms": {"stored->pulled": {"p50": 1.5, "p90": 2.0, "p99": 3.0, "p999": 4.0,
                                                          "mean": 1.6}}}))
    rates = [10_000, 20_000, 40_000, 0]
    text = report(tmp_path, {"argv": [], "rates": rates})
    assert ("| 10,000 msg/s | trimq (ASYNC_FLUSH) | 10,000 | 1.0 | 4.0 | 8.0 | 1.0 / 2.0 / 3.0 = 36.0 | "
            "0.002 (0.002) | 0 / 0 / 0 | 3 |") in text
    assert "| 10,000 msg/s | 1.00 | 0.50 | 0.80 | 0.80 | 0.72 | yes | met | met |" in text
    assert "| 20,000 msg/s | 1.00 | 1.50 | 2.00 | 2.00 | 0.90 | yes | **missed** | **missed** |" in text
    # 40k is above 0.9 x Redis's 30k flat out: shown, not judged
    assert "| 40,000 msg/s | 1.38 | 0.50 | 0.80 | 0.80 | 0.80 | no (above 0.9x Redis flat out) | - | - |" in text
    assert "| flat out | 1.60 (met vs 1.5) |" in text
    assert "| stored->pulled | 1.50 | 2.00 | 3.00 | 4.00 | 1.60 |" in text
    # each system's paced CPU against its own flat-out CPU of the same run
    assert ("CPU per message at 10,000 / 20,000 / 40,000 msg/s against the same system flat out: "
            "Redis Streams 1.25 / 1.25 / 1.25; trimq 0.95 / 1.18 / 1.05 (paced,") in text
    lines = ratios_text(tmp_path, rates).splitlines()
    assert "trimq/redis live at 20,000 msg/s: p50 1.50, p99 2.00, p999 2.00, CPU/msg 0.90" in lines
    assert lines[-1].endswith("(above 0.9x Redis flat out: outside the targets)")


def test_the_runs_order_the_header_states() -> None:
    assert runs_order(["redis", "trimq"]) == "alternating, one of each per round (Redis, trimq, Redis, ...)"
    assert runs_order(["trimq"]) == "trimq's alone (redis-server was not available)"  # no Redis: nothing alternates


def test_no_paced_against_flat_out_line_without_both(tmp_path: Path) -> None:
    (tmp_path / "trimq-live-rate10000.json").write_text(json.dumps(_curve_row("trimq", 1.0, 4.0, 36.0, 10_000, 0.0)))
    assert paced_cpu_text(curve_points(tmp_path, [10_000, 0])) is None  # no flat-out row to compare with
    (tmp_path / "trimq-live.json").write_text(json.dumps(_curve_row("trimq", 1.0, 4.0, 30.0, 40_000, None)))
    assert paced_cpu_text(curve_points(tmp_path, [0])) is None  # no paced row
    text = paced_cpu_text(curve_points(tmp_path, [10_000, 0]))
    assert text is not None and "at 10,000 msg/s against the same system flat out: trimq 1.20 (" in text
    assert "Redis" not in text  # a system without rows is left out


def test_machine_text_names_the_interpreter_file() -> None:
    """Two builds of one CPython version cost different CPU, so the header names the interpreter's file."""
    text = machine_text()
    assert f"Python {platform.python_version()}" in text
    path = text[text.rindex("(") + 1:-1]
    assert Path(path).is_file() and path == os.path.realpath(sys.executable)
