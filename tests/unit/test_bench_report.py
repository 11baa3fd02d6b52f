"""bench.run_all's report renders the result files it finds (the benchmarks themselves never run in tests)."""

from __future__ import annotations

import json
from pathlib import Path

from bench.run_all import ratios_text, report


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
