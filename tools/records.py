"""The body format and record files of ``trimq-producer`` and ``trimq-consumer``, which a checker
(tests/e2e/checker.py) compares.

**Body format of trimq-producer.** Every body starts with one line of JSON, ``{"key": "key-0007",
"seq": 42}``, ended by ``\\n``; the rest is padding (``.`` bytes) up to ``--body-size`` (a body is never
shorter than its header line). ``seq`` counts a key's messages from 0 in send order. :func:`encode_body`
and :func:`decode_body` are the codec; any other body decodes to None.

**Producer record** (``--record``): one JSON line per *acknowledged* message, written and flushed as its send
returns: ``topic, broker, queue_id, queue_offset, key, seq, msg_id`` (the producer's unique key),
``offset_msg_id`` (the broker's offset message id: where the record is in its commit log), ``send_time`` and
``ack_time`` (wall-clock ms), ``status`` (the send's SendStatus: ``SEND_OK``, or
``FLUSH_SLAVE_TIMEOUT``/``SLAVE_NOT_AVAILABLE``/``FLUSH_DISK_TIMEOUT`` for a message stored with a weaker
promise). A message whose send failed is not recorded (it may still have been stored: a checker must tolerate
extra, unrecorded messages).

**Consumer record** (``--record``): one JSON line per successfully consumed message: ``topic, broker,
queue_id, queue_offset, keys, msg_id`` (unique key), ``offset_msg_id, reconsume_times, body_sha1,
consume_time`` (wall-clock ms, when the listener call that consumed it returned), ``start_time`` (wall-clock ms,
when that listener call began: a call that straddles a SIGSTOP is told apart from one begun after it),
``client_id``, and ``key``/``seq`` when the body is a trimq-producer body.
Lines are written and flushed inside the listener, before it returns success, so before the offset can be
committed: once an offset is committed its line is in the kernel and survives the consumer's SIGKILL.
``--record-fsync`` also fsyncs each listener call's lines, which only matters if the machine itself may
crash (power loss); it costs one disk flush per listener call.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections.abc import Sequence
from typing import IO, Any

from trimq.protocol.message import MessageExt

__all__ = ["RecordWriter", "consumer_record", "decode_body", "encode_body", "key_name", "wall_ms"]


def key_name(index: int, keys: int) -> str:
    """The name of key ``index`` of ``keys``: ``key-0000`` ... (at least 4 digits)."""
    return f"key-{index:0{max(4, len(str(keys - 1)))}d}"


def encode_body(key: str, seq: int, size: int = 0) -> bytes:
    """A trimq-producer body: ``{"key":...,"seq":...}\\n`` padded with ``.`` to ``size`` bytes."""
    head = json.dumps({"key": key, "seq": seq}, separators=(",", ":")).encode() + b"\n"
    return head + b"." * max(0, size - len(head))


def decode_body(body: bytes) -> tuple[str, int] | None:
    """``(key, seq)`` of a trimq-producer body, None for any other body."""
    if not body.startswith(b'{"key":'):
        return None
    head, sep, _ = bytes(body[:4096]).partition(b"\n")
    if not sep:
        return None
    try:
        obj = json.loads(head)
        key, seq = obj["key"], obj["seq"]
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(key, str) or isinstance(seq, bool) or not isinstance(seq, int):
        return None
    return key, seq


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


class RecordWriter:
    """Appends JSON lines to a file; every :meth:`write` is flushed (and fsynced with ``fsync=True``)
    before it returns. Thread-safe: sync listeners run in worker threads."""

    def __init__(self, path: str, *, fsync: bool = False) -> None:
        self.path = path
        self.fsync = fsync
        self._lock = threading.Lock()
        self._fh: IO[str] = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed by close()
        self.lines = 0

    def write(self, records: Sequence[dict[str, Any]]) -> None:
        if not records:
            return
        text = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records)
        with self._lock:
            self._fh.write(text)
            self._fh.flush()
            if self.fsync:
                os.fsync(self._fh.fileno())
            self.lines += len(records)

    def close(self) -> None:
        with self._lock:
            if not self._fh.closed:
                self._fh.flush()
                self._fh.close()


def consumer_record(msg: MessageExt, *, broker: str, client_id: str, now_ms: int | None = None,
                    start_ms: int | None = None) -> dict[str, Any]:
    """The record line of one consumed message (see the module documentation); ``start_ms`` is when the listener
    call began (default: ``now_ms``)."""
    now = wall_ms() if now_ms is None else now_ms
    rec: dict[str, Any] = {
        "topic": msg.topic,
        "broker": broker,
        "queue_id": msg.queue_id,
        "queue_offset": msg.queue_offset,
        "keys": msg.keys,
        "msg_id": msg.unique_id,
        "offset_msg_id": msg.msg_id,
        "reconsume_times": msg.reconsume_times,
        "body_sha1": hashlib.sha1(msg.body).hexdigest(),
        "consume_time": now,
        "start_time": now if start_ms is None else start_ms,
        "client_id": client_id,
    }
    decoded = decode_body(msg.body)
    if decoded is not None:
        rec["key"], rec["seq"] = decoded
    return rec
