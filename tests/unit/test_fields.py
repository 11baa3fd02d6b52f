"""protocol/fields.py: the Java-type range of every numeric wire field, and the table against docs/PROTOCOL.md."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from trimq.protocol.codes import RequestCode
from trimq.protocol.fields import (
    BODY_FIELD_TYPES,
    FIELD_TYPES,
    JAVA_INT,
    JAVA_LONG,
    JAVA_RANGES,
    check_field_ranges,
    flag_field,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "PROTOCOL.md"
INT_MIN, INT_MAX = -(2**31), 2**31 - 1
LONG_MIN, LONG_MAX = -(2**63), 2**63 - 1


def test_java_ranges() -> None:
    assert JAVA_RANGES[JAVA_INT] == (INT_MIN, INT_MAX)
    assert JAVA_RANGES[JAVA_LONG] == (LONG_MIN, LONG_MAX)


@pytest.mark.parametrize(("field", "lo", "hi", "java"), [
    ("queueId", INT_MIN, INT_MAX, "int"),
    ("commitOffset", LONG_MIN, LONG_MAX, "long"),
])
def test_bounds_pass_and_one_beyond_is_refused(field: str, lo: int, hi: int, java: str) -> None:
    code = RequestCode.UPDATE_CONSUMER_OFFSET
    for ok in (lo, hi, 0, str(hi), f" {lo} "):
        assert check_field_ranges(code, {field: ok}) is None, ok
    for bad in (hi + 1, lo - 1, str(hi + 1), 2**64 - 1):
        remark = check_field_ranges(code, {field: bad})
        assert remark == (f"header field {field!r} = {int(bad)} is outside the range of a Java {java} "
                          f"(int{32 if java == 'int' else 64}): [{lo}, {hi}]")


def test_a_pulls_master_epoch_is_a_java_int() -> None:
    assert check_field_ranges(RequestCode.PULL_MESSAGE, {"masterEpoch": INT_MAX}) is None
    assert check_field_ranges(RequestCode.PULL_MESSAGE, {"masterEpoch": INT_MAX + 1}) == (
        f"header field 'masterEpoch' = {INT_MAX + 1} is outside the range of a Java int (int32): "
        f"[{INT_MIN}, {INT_MAX}]")


def test_values_that_are_no_number_are_left_to_the_handler() -> None:
    code = RequestCode.PULL_MESSAGE
    for value in (True, "abc", "9" * 5000, [2**63], {"x": 1}, 1.5e300, b"123"):
        assert check_field_ranges(code, {"queueOffset": value}) is None, value


def test_a_huge_value_is_shown_cut_in_the_remark() -> None:
    remark = check_field_ranges(RequestCode.PULL_MESSAGE, {"queueOffset": "9" * 4000})
    assert remark is not None and len(remark) < 250 and "(4000 characters)" in remark


def test_flag_fields_read_as_javas_parse_boolean() -> None:
    ext = {"a": True, "b": "true", "c": "TRUE", "d": "yes", "e": 1, "f": False, "g": "false", "h": None}
    assert [flag_field(ext, n) for n in "abcdefghz"] == [True, True, True, False, False, False, False, False, False]


def test_codes_without_numeric_fields_and_unknown_codes_pass() -> None:
    assert check_field_ranges(RequestCode.HEART_BEAT, {"queueId": 2**40}) is None  # not a HEART_BEAT field
    assert check_field_ranges(123456, {"queueId": 2**40}, {"x": 2**63}) is None


def test_body_fields() -> None:
    mq = {"topic": "t", "brokerName": "b", "queueId": 0}
    body = {"consumerGroup": "g", "clientId": "c", "mqSet": [mq, {**mq, "queueId": 2**31}]}
    assert check_field_ranges(RequestCode.LOCK_BATCH_MQ, {}, body) == (
        "body field 'mqSet[1].queueId' = 2147483648 is outside the range of a Java int (int32): "
        "[-2147483648, 2147483647]")
    assert check_field_ranges(RequestCode.LOCK_BATCH_MQ, {}, {"mqSet": [mq]}) is None
    assert check_field_ranges(RequestCode.LOCK_BATCH_MQ, {}, {"mqSet": "nonsense"}) is None
    hb = {"clientID": "c", "consumerDataSet": [{"groupName": "g", "subscriptionDataSet": [
        {"topic": "t", "subVersion": 2**63, "codeSet": [1]}]}]}
    assert "consumerDataSet[0].subscriptionDataSet[0].subVersion" in (
        check_field_ranges(RequestCode.HEART_BEAT, {}, hb) or "")
    hb["consumerDataSet"][0]["subscriptionDataSet"][0].update(subVersion=1, codeSet=[1, 2**31])  # type: ignore[index]
    assert "codeSet[1]" in (check_field_ranges(RequestCode.HEART_BEAT, {}, hb) or "")
    table = {"topicConfigTable": {"T": {"readQueueNums": 2**31}}}
    assert "topicConfigTable[T].readQueueNums" in (check_field_ranges(RequestCode.REGISTER_BROKER, {}, table) or "")
    assert check_field_ranges(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {},
                              {"groupName": "g", "retryMaxTimes": -(2**31) - 1}) is not None


def test_every_code_in_the_tables_is_a_request_code() -> None:
    for code in (*FIELD_TYPES, *BODY_FIELD_TYPES):
        assert RequestCode(code)
    for fields in FIELD_TYPES.values():
        assert set(fields.values()) <= {JAVA_INT, JAVA_LONG}


def _documented_rows() -> dict[int, tuple[str, str]]:
    """code -> (ext column, body column) of docs/PROTOCOL.md §4."""
    rows: dict[int, tuple[str, str]] = {}
    for line in DOC.read_text().splitlines():
        m = re.match(r"^\| (\d+) \| (\w+) \| (.*?) \| (.*?) \| .* \|$", line)
        if m:
            rows[int(m.group(1))] = (m.group(3), m.group(4))
    return rows


def test_the_table_covers_every_numeric_field_docs_protocol_lists() -> None:
    """A field name that is numeric for some code must be in the table of every code whose documented ext
    fields name it (the table is derived from docs/PROTOCOL.md §4)."""
    numeric = {name for fields in FIELD_TYPES.values() for name in fields}
    rows = _documented_rows()
    assert len(rows) > 30
    missing = []
    for code, (ext, body) in rows.items():
        for name in re.findall(r"`(\w+)`", ext):
            if name in numeric and name not in FIELD_TYPES.get(code, {}):
                missing.append((code, name))
        if "mqSet" in body:
            assert any(path[0] == "mqSet" for path, _ in BODY_FIELD_TYPES.get(code, [])), code
    assert not missing, missing
