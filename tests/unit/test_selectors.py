"""Queue selectors: Java-compatible SelectMessageQueueByHash, stable select_by_hash, select_random.

The Java figures below were produced by a real JVM (``String.hashCode()``, ``Math.abs(h % n)``).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trimq.client.selectors import (
    SelectMessageQueueByHash,
    java_hash_code,
    java_string_hash,
    select_by_hash,
    select_random,
)
from trimq.protocol.message_queue import MessageQueue

ROOT = str(Path(__file__).resolve().parents[2])

# string, String.hashCode(), abs(h % 3), abs(h % 8), abs(h % 7) -- from OpenJDK
JAVA_GOLDEN = [
    ("", 0, 0, 0, 0),
    ("a", 97, 1, 1, 6),
    ("abc", 96354, 0, 2, 6),
    ("hello", 99162322, 1, 2, 0),
    ("Hello World", -862545276, 0, 4, 5),
    ("polygenelubricants", -2147483648, 2, 0, 2),  # Integer.MIN_VALUE: abs() of MIN_VALUE % n
    ("中文", 646394, 2, 2, 0),
    ("\U0001F600", 1772899, 1, 3, 2),  # one code point, two UTF-16 units
    ("order-12345", 478832884, 1, 4, 5),
    ("ÄÖÜ straße", -1500598772, 2, 4, 1),
    ("z" * 30, -291400512, 0, 0, 4),
    ("key-with-emoji-\U0001F680", -202746109, 1, 5, 6),
    ("TagA", 2598919, 1, 7, 1),
]


def queues(n: int) -> list[MessageQueue]:
    return [MessageQueue("T", "broker-a", i) for i in range(n)]


@pytest.mark.parametrize(("text", "h", "m3", "m8", "m7"), JAVA_GOLDEN)
def test_java_string_hash_matches_jvm(text: str, h: int, m3: int, m8: int, m7: int) -> None:
    assert java_string_hash(text) == h


@pytest.mark.parametrize(("text", "h", "m3", "m8", "m7"), JAVA_GOLDEN)
def test_select_by_java_hash_matches_rocketmq(text: str, h: int, m3: int, m8: int, m7: int) -> None:
    sel = SelectMessageQueueByHash()
    assert sel(queues(3), None, text).queue_id == m3
    assert sel(queues(8), None, text).queue_id == m8
    assert sel(queues(7), None, text).queue_id == m7


def test_java_hash_code_of_boxed_numbers() -> None:
    # Integer.hashCode is the value; Long's folds the halves; Boolean's are constants (JVM figures).
    assert java_hash_code(-7) == -7
    assert SelectMessageQueueByHash()(queues(4), None, -7).queue_id == 3
    assert java_hash_code(2**40) == 256
    assert java_hash_code(-5_000_000_000) == 705032702
    assert java_hash_code(True) == 1231
    assert java_hash_code(False) == 1237
    assert java_hash_code(3.5) == java_string_hash("3.5")


@settings(max_examples=200, deadline=None)
@given(st.text(), st.integers(min_value=1, max_value=64))
def test_java_hash_selector_in_range_and_int32(text: str, n: int) -> None:
    h = java_string_hash(text)
    assert -(2**31) <= h < 2**31
    mq = SelectMessageQueueByHash()(queues(n), None, text)
    assert 0 <= mq.queue_id < n
    assert mq.queue_id == abs(h) % n  # Java's abs(h % n) equals abs(h) % n, MIN_VALUE included


def test_select_by_hash_is_stable_across_processes() -> None:
    """Unlike hash(), the CRC-32 choice does not depend on the interpreter's hash seed."""
    keys = ["order-1", "order-2", "user:42", "中文", ""]
    here = [select_by_hash(queues(8), None, k).queue_id for k in keys]
    code = (
        "from client.selectors import select_by_hash\n"
        "from protocol.message_queue import MessageQueue\n"
        "qs=[MessageQueue('T','broker-a',i) for i in range(8)]\n"
        f"print([select_by_hash(qs, None, k).queue_id for k in {keys!r}])\n"
    )
    for seed in ("1", "12345"):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env={"PYTHONHASHSEED": seed, "PATH": ""}, cwd=ROOT)
        assert out.stdout.strip() == str(here)


def test_select_by_hash_known_values() -> None:
    import zlib

    assert select_by_hash(queues(5), None, "order-1").queue_id == zlib.crc32(b"order-1") % 5
    assert select_by_hash(queues(5), None, b"raw").queue_id == zlib.crc32(b"raw") % 5
    assert select_by_hash(queues(5), None, 42).queue_id == zlib.crc32(b"42") % 5


def test_select_random_and_empty_lists() -> None:
    qs = queues(4)
    for _ in range(20):
        assert select_random(qs, None, None) in qs
    for sel in (select_random, select_by_hash, SelectMessageQueueByHash()):
        with pytest.raises(ValueError, match="no message queues"):
            sel([], None, "k")
