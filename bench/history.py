"""Every stored latency curve at a glance (issue 22): one row per run, trimq / Redis at each offered rate.

``python -m bench.history`` reads the ``summary.json`` of each folder under bench/results/ (the tables of the
runs RESULTS.md quotes) and that of bench/results/ itself, or the folders given, and prints a Markdown table:
the Python that ran it, then per paced rate the p99 and CPU ratios (marked when the rate is above 0.9x Redis's
flat-out rate of that run, so outside the targets), then flat-out throughput and CPU, and the backlog drain. The
ratios are those of ``bench.run_all``'s own report, computed the same way; comparing rows says how much the box
moved them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from bench.harness import RESULTS
from bench.run_all import DEFAULT_RATES, curve_points_of, fmt_ratio, mode_ratios

__all__ = ["history_table", "main", "run_row"]


def _summary(folder: Path) -> dict[str, Any] | None:
    try:
        got = json.loads((folder / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    return got if isinstance(got, dict) else None


def run_row(name: str, summary: dict[str, Any]) -> str:
    """One Markdown row: the run's folder, date, load at the start, the Python that ran it, Redis's flat-out rate,
    then the ratios."""
    meta = summary.get("meta") or {}

    def row(name: str) -> dict[str, Any] | None:
        got = summary.get(name)
        return got if isinstance(got, dict) else None

    points = curve_points_of(row, list(DEFAULT_RATES))
    cells = [name, str(meta.get("date", "-")).removesuffix(" UTC"), str(meta.get("load", "-")).split(",")[0]]
    # "2 CPUs, Python 3.11.7 (/path/to/python3.11)": two builds of one version differ in CPU per message
    machine = str(meta.get("machine", ""))
    cells.append(machine.split("Python ", 1)[1] if "Python " in machine else "-")
    flat = (summary.get("redis-live") or {}).get("median", {}).get("produce_msgs_per_s")
    cells.append("-" if not flat else f"{flat / 1000:.1f}k")
    for p in points:
        ra = p.get("ratios") or {}
        if p["rate"]:
            text = f"{fmt_ratio(ra.get('p99'))} / {fmt_ratio(ra.get('cpu'))}"
            cells.append(text if p["in_scope"] or not ra else f"({text})")
        else:
            cells.append(f"{fmt_ratio(ra.get('throughput'))} / {fmt_ratio(ra.get('cpu'))}")
    drain = mode_ratios(row("trimq-backlog"), row("redis-backlog")) or {}
    cells.append(f"{fmt_ratio(drain.get('consume'))} / {fmt_ratio(drain.get('cpu'))}")
    return "| " + " | ".join(cells) + " |"


def history_table(folders: list[Path]) -> str:
    """The table over ``folders`` (those without a readable summary.json are left out), oldest run first."""
    runs = [(f, s) for f in folders if (s := _summary(f)) is not None]
    runs.sort(key=lambda fs: str((fs[1].get("meta") or {}).get("date", "")))
    paced = [r for r in DEFAULT_RATES if r]
    head = (["run", "date (UTC)", "load", "Python", "Redis flat out"] + [f"{r // 1000}k p99 / CPU" for r in paced]
            + ["flat out msg/s / CPU", "drain msg/s / CPU"])
    lines = ["| " + " | ".join(head) + " |", "|---|---|---:|---|---:|" + "---:|" * (len(paced) + 2)]
    for folder, summary in runs:
        lines.append(run_row(f"{folder.name}/", summary))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("folders", nargs="*", type=Path,
                   help="results folders holding a summary.json (default: bench/results and each folder in it)")
    args = p.parse_args(argv)
    folders = args.folders or [RESULTS, *sorted(d for d in RESULTS.iterdir() if d.is_dir())]
    print("trimq / Redis, medians of each run (in brackets: a rate above 0.9x that run's Redis flat out, outside "
          "the targets; targets p99 <= 1.00 and CPU <= 0.80 at the paced rates, 1.50 flat out and draining)")
    print()
    print(history_table(folders))
    return 0


if __name__ == "__main__":
    sys.exit(main())
