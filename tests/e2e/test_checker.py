"""The record-file checker on small hand-made histories (no broker): each rule flags what it should."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .checker import Stop, check

T = "Orders"


def write(path: Path, recs: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def produced(n: int, keys: int = 2) -> list[dict[str, Any]]:
    """n messages on queue 0, key i % keys, seq i // keys, offset i."""
    return [{"topic": T, "broker": "b", "queue_id": 0, "queue_offset": i, "key": f"k{i % keys}", "seq": i // keys,
             "msg_id": f"m{i}", "send_time": 0, "ack_time": 0} for i in range(n)]


def consumed(offsets: list[int], client: str, t0: int, reconsume: int = 0) -> list[dict[str, Any]]:
    return [{"topic": T, "broker": "b", "queue_id": 0, "queue_offset": o, "keys": None, "msg_id": f"m{o}",
             "reconsume_times": reconsume, "body_sha1": "", "consume_time": t0 + i, "client_id": client}
            for i, o in enumerate(offsets)]


def run(tmp_path: Path, n: int, *parts: list[dict[str, Any]], **kw: Any) -> Any:
    p = write(tmp_path / "p.jsonl", produced(n))
    cs = [write(tmp_path / f"c{i}.jsonl", part) for i, part in enumerate(parts)]
    return check([p], cs, **kw)


def test_clean_history_with_graceful_handoff(tmp_path: Path) -> None:
    r = run(tmp_path, 10, consumed([0, 1, 2, 3], "A", 100), consumed([4, 5, 6, 7, 8, 9], "B", 300),
            stops=[Stop("A", 200, graceful=True)])
    assert r.ok, r.text()
    assert r.produced == 10 and r.consumed_distinct == 10 and r.duplicates == 0
    assert [t.ms for t in r.takeovers] == [100] and r.takeovers[0].new_owner == "B"


def test_missing_message_names_the_key(tmp_path: Path) -> None:
    r = run(tmp_path, 6, consumed([0, 1, 2, 3, 4], "A", 100))
    assert not r.ok and len(r.missing) == 1
    assert r.first_offending_key == "k1" and "never consumed" in r.key_detail


def test_duplicate_after_graceful_stop_is_a_violation(tmp_path: Path) -> None:
    r = run(tmp_path, 6, consumed([0, 1, 2, 3], "A", 100), consumed([2, 3, 4, 5], "B", 300),
            stops=[Stop("A", 200, graceful=True)])
    assert not r.ok and r.duplicates == 2
    assert "did not crash" in r.violations[0] and r.first_offending_key == "k0"


def test_replay_after_crash_is_allowed_above_the_committed_floor(tmp_path: Path) -> None:
    r = run(tmp_path, 8, consumed([0, 1, 2, 3, 4, 5], "A", 100), consumed([3, 4, 5, 6, 7], "B", 300),
            stops=[Stop("A", 200, graceful=False)], committed={(T, "b", 0): 3})
    assert r.ok, r.text()
    assert r.duplicates == 3 and r.replayed == 3 and r.replays[0].start_offset == 3
    assert r.takeover_ms(graceful=False) == [100]


def test_replay_below_the_committed_floor_is_a_violation(tmp_path: Path) -> None:
    r = run(tmp_path, 8, consumed([0, 1, 2, 3, 4, 5], "A", 100), consumed([2, 3, 4, 5, 6, 7], "B", 300),
            stops=[Stop("A", 200, graceful=False)], committed={(T, "b", 0): 3})
    assert not r.ok and "below the committed floor 3" in r.violations[0]


def test_replay_never_rewinds_below_where_the_crashed_owner_started(tmp_path: Path) -> None:
    # A took over from a graceful X at offset 2: offset 2 was committed then; B may not restart at 1.
    r = run(tmp_path, 6, consumed([0, 1], "X", 10), consumed([2, 3, 4], "A", 100), consumed([1, 2, 3, 4, 5], "B", 300),
            stops=[Stop("X", 50, graceful=True), Stop("A", 200, graceful=False)])
    assert not r.ok and "below the committed floor 2" in r.violations[0]


def test_out_of_order_and_self_rereads_are_violations(tmp_path: Path) -> None:
    r = run(tmp_path, 6, consumed([0, 1, 3, 2, 4, 5], "A", 100))
    assert not r.ok and "before acknowledged" in r.violations[0]
    r = run(tmp_path, 4, consumed([0, 1, 2, 1, 2, 3], "A", 100))
    assert not r.ok and "again" in r.violations[0]


def test_unacknowledged_messages_and_gaps_of_them_are_tolerated(tmp_path: Path) -> None:
    p = produced(6)
    del p[2]  # offset 2 was stored but its send was never acknowledged
    prod = write(tmp_path / "p.jsonl", p)
    c = write(tmp_path / "c.jsonl", consumed([0, 1, 3, 4, 5], "A", 100))
    r = check([prod], [c])
    assert r.ok, r.text()
    c = write(tmp_path / "c.jsonl", consumed([0, 1, 2, 3, 4, 5], "A", 100))
    r = check([prod], [c])
    assert r.ok and r.consumed_unacknowledged == 1


def test_torn_last_line_is_skipped(tmp_path: Path) -> None:
    prod = write(tmp_path / "p.jsonl", produced(2))
    c = tmp_path / "c.jsonl"
    c.write_text("".join(json.dumps(r) + "\n" for r in consumed([0, 1], "A", 1)) + '{"topic": "Ord')
    assert check([prod], [c]).ok
