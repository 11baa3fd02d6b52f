"""``trimq-admin allocate`` (the click command; the lead attaches it to the trimq-admin group)."""

from __future__ import annotations

import json
import math

from click.testing import CliRunner

from trimq.tools.admin_allocate import allocate_command


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(allocate_command, list(args))
    return result.exit_code, result.output


def test_table_output_shows_shares_and_moves() -> None:
    code, out = run("--strategy", "AVG", "--queues", "8", "--consumers", "3", "--join", "1")
    assert code == 0, out
    assert "strategy AVG: 8 queues, 3 consumers, +1 joining" in out
    assert "CID-0000     3  0, 1, 2" in out  # AVG: the first n % c members get one extra
    assert "after:" in out and "moved:" in out


def test_json_output_and_counts() -> None:
    code, out = run("--strategy", "avg_by_circle", "--queues", "10", "--consumers", "4", "--leave", "1", "--json")
    assert code == 0, out
    doc = json.loads(out)
    assert doc["strategy"] == "AVG_BY_CIRCLE"
    assert [[q["queueId"] for q in qs] for qs in doc["before"].values()] == [[0, 4, 8], [1, 5, 9], [2, 6], [3, 7]]
    assert doc["consumers_after"] == ["CID-0001", "CID-0002", "CID-0003"]
    assert doc["unassigned_after"] == 0 and doc["moved"] > 0


def test_bounded_strategy_parameters_and_brokers() -> None:
    code, out = run("--strategy", "CONSISTENT_HASH_BOUNDED", "--queues", "16", "--consumers", "5", "--join", "2",
                    "--epsilon", "0.1", "--brokers", "broker-a,broker-b", "--json")
    assert code == 0, out
    doc = json.loads(out)
    assert doc["queues"] == 32
    assert doc["max_load_after"] <= math.ceil(32 / 7 * 1.1)  # the bounded-load cap


def test_bad_input_is_a_usage_error() -> None:
    code, out = run("--strategy", "ROUND_ROBIN", "--queues", "4", "--consumers", "2")
    assert code == 2 and "unknown allocation strategy" in out
    code, out = run("--strategy", "AVG", "--queues", "0", "--consumers", "2")
    assert code == 2
    code, out = run("--strategy", "AVG", "--queues", "4", "--consumers", "2", "--leave", "2")
    assert code == 2 and "leave" in out
