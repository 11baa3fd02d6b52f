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
        {"scenario": "graceful", "victim_queues": [2, 3], "takeover_s_min": 0.1, "takeover_s_max": 0.2,
         "per_queue": {"2": {"gap_s": 0.2}}, "sent": 10, "lost": 0, "duplicates": 0, "order_violations": 0}))
    text = report(tmp_path, {"argv": ["--runs", "3"], "redis_parser": "hiredis parser"})
    assert "| trimq (ASYNC_FLUSH) | live | 150 (135-165)" in text
    assert "| live | 1.50 | 1.50 | 0.50 | 0.80 |" in text
    assert "| graceful | 2 | 0.1-0.2 s |" in text
    assert ratios_text(tmp_path) == "trimq/redis live: produce 1.50, consume 1.50, p99 0.50, CPU/msg 0.80"
