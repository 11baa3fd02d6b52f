"""The checker and the producer record's send status: under SYNC_MASTER a message answered SEND_OK must never be
lost, one answered SLAVE_NOT_AVAILABLE or FLUSH_SLAVE_TIMEOUT may be (a failover to a slave that never had it,
which then reuses its queue offset). Found by the chaos suite's kill_master step (seeds 11 and 13): the old master
answered SLAVE_NOT_AVAILABLE while its slave was not following, the producer recorded those as acknowledged, and
the checker demanded them after the promotion."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.e2e.checker import BrokerCrash, check

T = "Orders"
Q = (T, "b", 0)


def write(path: Path, recs: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def sent(mid: str, offset: int, seq: int, ack: int, status: str | None = "SEND_OK") -> dict[str, Any]:
    r = {"topic": T, "broker": "b", "queue_id": 0, "queue_offset": offset, "key": "k", "seq": seq, "msg_id": mid,
         "send_time": ack, "ack_time": ack}
    if status is not None:
        r["status"] = status
    return r


def got(pairs: list[tuple[int, str]], t0: int, client: str = "A") -> list[dict[str, Any]]:
    return [{"topic": T, "broker": "b", "queue_id": 0, "queue_offset": o, "keys": "k", "msg_id": mid,
             "reconsume_times": 0, "body_sha1": "", "consume_time": t0 + i, "client_id": client}
            for i, (o, mid) in enumerate(pairs)]


def history(tmp_path: Path, cut_status: str | None) -> tuple[list[Path], list[Path], list[BrokerCrash]]:
    # m0..m2 safe; m3x, m4x (status cut_status) stored on the old master at offsets 3, 4, m3x consumed; the
    # master is killed at 50 and its slave, which had neither, promoted at 60 with the committed offset 3; the
    # key's next messages m3, m4 take offsets 3, 4 on it and are consumed (a replay of offset 3 after the crash).
    prod = [sent("m0", 0, 0, 1), sent("m1", 1, 1, 2), sent("m2", 2, 2, 3), sent("m3x", 3, 3, 4, cut_status),
            sent("m4x", 4, 4, 5, cut_status), sent("m3", 3, 5, 70), sent("m4", 4, 6, 71)]
    cons = got([(0, "m0"), (1, "m1"), (2, "m2"), (3, "m3x")], 10) + got([(3, "m3"), (4, "m4")], 100)
    return ([write(tmp_path / "p.jsonl", prod)], [write(tmp_path / "c.jsonl", cons)],
            [BrokerCrash("b", 50, 60, {Q: 3})])


def test_messages_answered_slave_not_available_may_be_lost_in_a_failover(tmp_path: Path) -> None:
    p, c, crashes = history(tmp_path, "SLAVE_NOT_AVAILABLE")
    r = check(p, c, broker_crashes=crashes)
    assert r.ok, r.text()
    assert (r.produced, r.unsafe_acked, r.unsafe_lost, r.consumed_unacknowledged, r.consumed_cut) == (5, 2, 2, 1, 1)
    assert "acknowledged without SEND_OK or in an ASYNC failover's tail: 2 (lost, as allowed: 2)" in r.text()


def test_a_send_ok_message_whose_offset_is_reused_is_a_violation(tmp_path: Path) -> None:
    for status in ("SEND_OK", None):  # no status (an older record file): SEND_OK
        p, c, crashes = history(tmp_path, status)
        r = check(p, c, broker_crashes=crashes)
        assert not r.ok
        assert any("offset 3: SEND_OK message m3x (key k seq 3) was cut, its offset reused by m3" in v
                   for v in r.violations), r.text()


def test_an_unsafe_message_never_consumed_is_allowed_lost_a_send_ok_one_is_missing(tmp_path: Path) -> None:
    prod = [sent("m0", 0, 0, 1), sent("m1", 1, 1, 2, "FLUSH_SLAVE_TIMEOUT")]
    c = [write(tmp_path / "c.jsonl", got([(0, "m0")], 10))]
    r = check([write(tmp_path / "p.jsonl", prod)], c)
    assert r.ok and r.unsafe_lost == 1, r.text()
    prod[1]["status"] = "SEND_OK"
    r = check([write(tmp_path / "p.jsonl", prod)], c)
    assert not r.ok and [m["msg_id"] for m in r.missing] == ["m1"]
    # a consumed unsafe message is judged like any other
    c = [write(tmp_path / "c.jsonl", got([(0, "m0"), (1, "m1")], 10))]
    prod[1]["status"] = "SLAVE_NOT_AVAILABLE"
    r = check([write(tmp_path / "p.jsonl", prod)], c)
    assert r.ok and (r.produced, r.unsafe_acked, r.unsafe_lost) == (2, 1, 0), r.text()
