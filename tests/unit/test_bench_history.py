"""bench.history: one row per stored run, with the ratios bench.run_all's report gives for that run."""

from __future__ import annotations

import json
from pathlib import Path

from bench.history import history_table
from tests.unit.test_bench_report import _curve_row


def _summary(date: str, redis_flat: float, trimq_p99_10k: float, machine: str | None = None) -> dict[str, object]:
    backlog_t = _curve_row("trimq", 1.0, 1.0, 30.0, 60_000, None)
    backlog_t["median"] = {**backlog_t["median"], "consume_msgs_per_s": 300_000}  # type: ignore[dict-item]
    backlog_r = _curve_row("redis", 1.0, 1.0, 25.0, 60_000, None)
    backlog_r["median"] = {**backlog_r["median"], "consume_msgs_per_s": 200_000}  # type: ignore[dict-item]
    meta = {"date": f"{date} UTC", "load": "0.5, 0.7, 0.9"}
    if machine is not None:
        meta["machine"] = machine
    return {
        "meta": meta,
        "ratios": "(text)",
        "redis-live": _curve_row("redis", 3.0, 6.0, 40.0, redis_flat, None),
        "trimq-live": _curve_row("trimq", 4.0, 12.0, 38.0, 48_000, None),
        "redis-live-rate10000": _curve_row("redis", 2.0, 5.0, 50.0, 10_000, 0.001),
        "trimq-live-rate10000": _curve_row("trimq", 1.0, trimq_p99_10k, 40.0, 10_000, 0.002),
        "redis-live-rate40000": _curve_row("redis", 20.0, 50.0, 50.0, 29_000, 1.5),
        "trimq-live-rate40000": _curve_row("trimq", 10.0, 40.0, 40.0, 40_000, 0.3),
        "redis-backlog": backlog_r,
        "trimq-backlog": backlog_t,
    }


def test_one_row_per_run_oldest_first(tmp_path: Path) -> None:
    for name, summary in (("later", _summary("2026-12-07 05:00:00", 30_000, 10.0,
                                             "2 CPUs, Python 3.11.2 (/usr/bin/python3.11)")),
                          ("earlier", _summary("2026-12-06 04:00:00", 48_000, 4.0))):
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(json.dumps(summary))
    (tmp_path / "no-summary").mkdir()
    lines = history_table(sorted(tmp_path.iterdir())).splitlines()
    assert lines[0].startswith("| run | date (UTC) | load | Python | Redis flat out | 10k p99 / CPU |")
    assert len(lines) == 4  # header, rule, two runs: the folder without a summary is left out
    # 40k is within 0.9 x 48k in the earlier run, above 0.9 x 30k (bracketed) in the later one; 20k and 30k
    # were not run; flat out 48k / 48k and 30k; drain 300k / 200k at 30 / 25 µs
    # a summary without a machine line shows "-"; the later one names its Python and the interpreter's file
    assert lines[2] == ("| earlier/ | 2026-12-06 04:00:00 | 0.5 | - | 48.0k | 0.80 / 0.80 | - / - | - / - | "
                        "0.80 / 0.80 | 1.00 / 0.95 | 1.50 / 1.20 |")
    assert lines[3] == ("| later/ | 2026-12-07 05:00:00 | 0.5 | 3.11.2 (/usr/bin/python3.11) | 30.0k | 2.00 / 0.80 | "
                        "- / - | - / - | (0.80 / 0.80) | 1.60 / 0.95 | 1.50 / 1.20 |")
