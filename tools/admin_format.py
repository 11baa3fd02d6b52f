"""Pure helpers of ``trimq-admin``: aligned text tables, timestamp parsing and display, JSON encoding.

No I/O, no trio: everything takes its input (and the current time, and the time zone) as arguments, so the
unit tests (tests/unit/test_admin_format.py) pin the exact output.

* :func:`render_table` — columns separated by two spaces, numbers right-aligned, ``-`` for missing values.
* :func:`parse_timestamp` — what ``--timestamp`` accepts: epoch milliseconds, ``yyyyMMddHHmmss``,
  ISO 8601, RocketMQ's ``yyyy-MM-dd#HH:mm:ss:SSS``, ``now`` and ``now`` minus a duration (``-30m``).
* :func:`format_timestamp`, :func:`format_age` — cell values (:func:`perm_text` and :func:`body_text` come from
  :mod:`trimq.client.admin_results`, whose documents these renderers show).
* :func:`to_json` — one JSON document; bytes become ``{"hex": ...}`` so nothing is lost.
"""

from __future__ import annotations

import datetime as _dt
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from trimq.client.admin_results import PERM_INHERIT, PERM_READ, PERM_WRITE, perm_text
from trimq.protocol.fields import JAVA_LONG_MAX

__all__ = [
    "TimestampError",
    "format_age",
    "format_timestamp",
    "kv_lines",
    "parse_perm",
    "parse_timestamp",
    "render_table",
    "to_json",
]

MISSING = "-"


# --------------------------------------------------------------------------------------------- tables


def _cell(value: Any) -> str:
    if value is None:
        return MISSING
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def render_table(headers: Sequence[str], rows: Iterable[Sequence[Any]], *, indent: str = "",
                 empty: str = "(none)") -> str:
    """An aligned text table: a header line, then one line per row.

    A column is right-aligned when every value in it is a number (ints, floats) or missing, left-aligned
    otherwise. ``None`` shows as ``-``, booleans as ``yes``/``no``, floats with one decimal. Trailing spaces
    are stripped. With no rows, the header is followed by ``indent + empty``.
    """
    raw = [list(row) for row in rows]
    cells = [[_cell(v) for v in row] for row in raw]
    ncol = len(headers)
    for i, row in enumerate(cells):
        if len(row) != ncol:
            raise ValueError(f"row {i} has {len(row)} cells, the table has {ncol} columns")
    numeric = [bool(raw) and all(_is_number(r[c]) or r[c] is None for r in raw) for c in range(ncol)]
    widths = [max([len(h)] + [len(r[c]) for r in cells]) for c, h in enumerate(headers)]

    def line(values: Sequence[str]) -> str:
        parts = [v.rjust(widths[c]) if numeric[c] else v.ljust(widths[c]) for c, v in enumerate(values)]
        return (indent + "  ".join(parts)).rstrip()

    out = [line(list(headers))]
    out.extend(line(r) for r in cells)
    if not cells:
        out.append(indent + empty)
    return "\n".join(out)


def kv_lines(pairs: Iterable[tuple[str, Any]], *, indent: str = "") -> str:
    """``key: value`` lines with the values aligned after the longest key."""
    items = [(k, _cell(v)) for k, v in pairs]
    width = max((len(k) for k, _ in items), default=0)
    return "\n".join(f"{indent}{k + ':':<{width + 1}} {v}".rstrip() for k, v in items)


# --------------------------------------------------------------------------------------------- time


class TimestampError(ValueError):
    """A ``--timestamp`` value in none of the accepted forms; the message lists them."""


TIMESTAMP_FORMS = ("epoch milliseconds (1714564800000), yyyyMMddHHmmss (20240501120000, local time), "
                   "ISO 8601 (2024-05-01T12:00:00, 2024-05-01 12:00:00+02:00, ...Z), "
                   "yyyy-MM-dd#HH:mm:ss:SSS (RocketMQ's mqadmin form), 'now', or now minus a duration "
                   "(-90s, -30m, -2h, -1d)")

_RELATIVE = re.compile(r"^-\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_COMPACT = re.compile(r"^\d{14}$")
_MQADMIN = re.compile(r"^(\d{4})-(\d{2})-(\d{2})#(\d{2}):(\d{2}):(\d{2}):(\d{3})$")


_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)
_MS = _dt.timedelta(milliseconds=1)


def _epoch_ms(dt: _dt.datetime, tz: _dt.tzinfo | None) -> int:
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=tz) if tz is not None else dt.astimezone()  # naive: local time
    return (dt - _EPOCH) // _MS  # exact integer arithmetic (no float rounding)


def parse_timestamp(text: str, *, now_ms: int, tz: _dt.tzinfo | None = None) -> int:
    """Epoch milliseconds for a ``--timestamp`` value (see :data:`TIMESTAMP_FORMS`).

    Exactly 14 digits is ``yyyyMMddHHmmss`` (RocketMQ's consumeTimestamp form); any other run of digits
    is epoch milliseconds. Times without a zone are in ``tz`` (default: this machine's local zone, as
    RocketMQ's tools). Raises :class:`TimestampError` naming the value and the accepted forms.
    """
    ms = _parse_timestamp(text, now_ms, tz)
    if not 0 <= ms <= JAVA_LONG_MAX:  # the brokers take a Java long: a larger one could not even be sent
        raise TimestampError(f"{text!r} is {ms} epoch milliseconds, outside 0 .. {JAVA_LONG_MAX}")
    return ms


def _parse_timestamp(text: str, now_ms: int, tz: _dt.tzinfo | None) -> int:
    s = text.strip() if isinstance(text, str) else ""
    try:
        if not s:
            raise ValueError("empty")
        if s.lower() == "now":
            return now_ms
        m = _RELATIVE.match(s.lower())
        if m:
            return now_ms - int(float(m.group(1)) * _UNIT_MS[m.group(2)])
        if _COMPACT.match(s):
            return _epoch_ms(_dt.datetime.strptime(s, "%Y%m%d%H%M%S"), tz)
        if s.isdigit():
            return int(s)
        m = _MQADMIN.match(s)
        if m:
            y, mo, d, h, mi, sec, milli = (int(g) for g in m.groups())
            return _epoch_ms(_dt.datetime(y, mo, d, h, mi, sec, milli * 1000), tz)
        return _epoch_ms(_dt.datetime.fromisoformat(s), tz)
    except (ValueError, OverflowError, OSError):
        raise TimestampError(f"{text!r} is not a timestamp; use {TIMESTAMP_FORMS}") from None


def format_timestamp(ms: int | None, *, tz: _dt.tzinfo | None = None) -> str:
    """``2024-05-01 12:00:00.123`` in ``tz`` (default local time); ``-`` for None, 0 or negative."""
    if ms is None or isinstance(ms, bool) or not isinstance(ms, int) or ms <= 0:
        return MISSING
    try:
        dt = (_EPOCH + ms * _MS).astimezone(tz)  # tz None: local time
    except (OverflowError, OSError, ValueError):
        return str(ms)
    return dt.strftime("%Y-%m-%d %H:%M:%S.") + f"{dt.microsecond // 1000:03d}"


def format_age(ms: int | None) -> str:
    """A short duration: ``850ms``, ``12.3s``, ``4m05s``, ``2h03m``, ``3d04h``; ``-`` for None or negative."""
    if ms is None or isinstance(ms, bool) or not isinstance(ms, int | float) or ms < 0:
        return MISSING
    ms = int(ms)
    if ms < 1000:
        return f"{ms}ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f}s"
    s = ms // 1000
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86_400:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86_400}d{(s % 86_400) // 3600:02d}h"


# --------------------------------------------------------------------------------------------- values


def parse_perm(text: str) -> int:
    """A permission as an integer 0..7 or letters (``rw``, ``r``, ``w``, ``RW-``). ValueError otherwise."""
    s = str(text).strip()
    if s.isdigit():
        value = int(s)
        if not 0 <= value <= 7:
            raise ValueError(f"perm {s} is outside 0..7 (4 = read, 2 = write, 6 = read+write)")
        return value
    letters = s.lower().replace("-", "")
    if not letters or any(c not in "rwx" for c in letters):
        raise ValueError(f"perm {text!r} must be 0..7 or letters r, w, x (e.g. rw)")
    return (PERM_READ if "r" in letters else 0) | (PERM_WRITE if "w" in letters else 0) | \
        (PERM_INHERIT if "x" in letters else 0)


def _json_default(value: Any) -> Any:
    if isinstance(value, bytes | bytearray | memoryview):
        return {"hex": bytes(value).hex()}
    if isinstance(value, set | frozenset | tuple):
        return sorted(value) if all(isinstance(v, str) for v in value) else list(value)
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def to_json(document: Any) -> str:
    """The one JSON document a ``--json`` command prints (indented, keys in insertion order)."""
    return json.dumps(document, indent=2, default=_json_default, ensure_ascii=False)


# --------------------------------------------------------------------------------------------- renderers
# One per trimq-admin command: the JSON document in, the text for people out (docs/ADMIN.md shows them).


def _offset(value: Any) -> Any:
    """An offset cell: -1 (none stored / unknown) shows as ``-``."""
    return None if not isinstance(value, int) or isinstance(value, bool) or value < 0 else value


def _queue(mq: Any) -> str:
    m = mq if isinstance(mq, dict) else {}
    return f"{m.get('topic')}@{m.get('brokerName')}:{m.get('queueId')}"


def _errors(doc: Mapping[str, Any]) -> list[str]:
    return [f"error: {e.get('brokerName') or e.get('clientId')}: {e.get('error')}" for e in doc.get("errors") or []]


def render_topic_list(doc: Mapping[str, Any]) -> str:
    rows = []
    for t in doc.get("topics") or []:
        brokers = t.get("brokers") or [{}]
        for b in brokers:
            perm = b.get("perm")
            rows.append([t.get("topic"), b.get("brokerName"), b.get("readQueueNums"), b.get("writeQueueNums"),
                         perm_text(perm) if isinstance(perm, int) else None])
    lines = [render_table(["TOPIC", "BROKER", "READ", "WRITE", "PERM"], rows), f"{len(doc.get('topics') or [])} topics"]
    return "\n".join(lines + _errors(doc))


def render_topic_create(doc: Mapping[str, Any]) -> str:
    where = ", ".join(f"{b['brokerName']} ({b['brokerAddr']})" for b in doc.get("brokers") or [])
    routed = "routed by the name server" if doc.get("routed") else "not yet routed by the name server"
    return (f"topic {doc.get('topic')}: {doc.get('readQueueNums')} read / {doc.get('writeQueueNums')} write queues, "
            f"perm {doc.get('permText')} on {where}; {routed}")


def render_topic_status(doc: Mapping[str, Any], *, tz: _dt.tzinfo | None = None) -> str:
    rows = [[q.get("brokerName"), q.get("queueId"), q.get("minOffset"), q.get("maxOffset"), q.get("messages"),
             format_timestamp(q.get("lastUpdateTimestamp"), tz=tz)] for q in doc.get("queues") or []]
    table = render_table(["BROKER", "QID", "MIN_OFFSET", "MAX_OFFSET", "MESSAGES", "LAST_UPDATED"], rows)
    return "\n".join([table, f"topic {doc.get('topic')}: {doc.get('totalMessages')} messages stored", *_errors(doc)])


def render_consumer_progress(doc: Mapping[str, Any], *, tz: _dt.tzinfo | None = None) -> str:
    rows = [[q.get("topic"), q.get("brokerName"), q.get("queueId"), _offset(q.get("brokerOffset")),
             _offset(q.get("consumerOffset")), _offset(q.get("lag")), q.get("owner"),
             format_timestamp(q.get("lastTimestamp"), tz=tz)] for q in doc.get("queues") or []]
    table = render_table(["TOPIC", "BROKER", "QID", "BROKER_OFFSET", "CONSUMER_OFFSET", "LAG", "OWNER",
                          "LAST_CONSUMED"], rows)
    mode = "orderly" if doc.get("orderly") else "concurrently"
    state = "online" if doc.get("online") else "offline"
    total = f"group {doc.get('consumerGroup')} ({mode}, {state}): total lag {doc.get('totalLag')}"
    return "\n".join([table, total, *_errors(doc)])


def render_consumer_connections(doc: Mapping[str, Any], *, tz: _dt.tzinfo | None = None) -> str:
    consistent = "consistent" if doc.get("consistent", True) else "INCONSISTENT (members subscribe differently)"
    head = (f"group {doc.get('consumerGroup')}: {doc.get('messageModel')}, {doc.get('consumeType')}, "
            f"{'orderly' if doc.get('consumeOrderly') else 'concurrently'}, {doc.get('consumeFromWhere')}; "
            f"subscriptions {consistent}")
    members = render_table(
        ["CLIENT_ID", "ADDRESS", "LANGUAGE", "VERSION", "LAST_HEARTBEAT"],
        [[c.get("clientId"), c.get("clientAddr"), c.get("language"), c.get("version"),
          format_timestamp(c.get("lastUpdateTimestamp"), tz=tz)] for c in doc.get("connectionSet") or []])
    table = doc.get("subscriptionTable") or {}
    subs = render_table(["TOPIC", "EXPRESSION"], [[t, (s or {}).get("subString")] for t, s in sorted(table.items())])
    return "\n".join([head, "", members, "", subs])


def render_consumer_locks(doc: Mapping[str, Any]) -> str:
    rows = [[lk.get("topic"), lk.get("brokerName"), lk.get("queueId"), lk.get("clientId"), format_age(lk.get("ageMs")),
             lk.get("expired")] for lk in doc.get("locks") or []]
    table = render_table(["TOPIC", "BROKER", "QID", "OWNER", "AGE", "EXPIRED"], rows)
    lives = sorted({format_age(b.get("maxLiveMs")) for b in doc.get("brokers") or []})
    tail = (f"group {doc.get('consumerGroup')}: {len(doc.get('locks') or [])} locks "
            f"(expire after {', '.join(lives) or '-'} without renewal); "
            f"fenced offset updates {doc.get('fencedUpdates')}")
    return "\n".join([table, tail, *_errors(doc)])


def render_consumer_status(doc: Mapping[str, Any], *, now_ms: int) -> str:
    out: list[str] = []
    for c in doc.get("clients") or []:
        mode = "orderly" if c.get("consumeOrderly") else "concurrently"
        if c.get("orderScope") == "key":
            mode = "orderly (key scope)"
        running = "running" if c.get("running") else "stopped"
        out.append(f"client {c.get('clientId')}: {mode}, {c.get('messageModel')}, {running}; "
                   f"in flight {c.get('inFlight')}, dead-lettered {c.get('deadLettered')}, skipped {c.get('skipped')}")
        locked = {_queue(m) for m in c.get("lockedQueues") or []}
        rows = []
        for row in c.get("mqTable") or []:
            pq = row.get("processQueueInfo") or {}
            count = pq.get("cachedMsgCount") or 0
            span = f"{pq.get('cachedMsgMinOffset')}..{pq.get('cachedMsgMaxOffset')}" if count else None
            rows.append([_queue(row.get("mq")), count, span, pq.get("transactionMsgCount"),
                         _offset(pq.get("commitOffset")), _queue(row.get("mq")) in locked, pq.get("dropped")])
        out.append(render_table(["QUEUE", "CACHED", "CACHED_OFFSETS", "IN_FLIGHT", "COMMIT_OFFSET", "LOCKED",
                                 "DROPPED"], rows, indent="  "))
        keys = c.get("blockedKeys") or []
        if keys:  # key scope (issue 17): one key retries, the other keys of its queue flow
            out.append(f"  blocked keys: {len(keys)} (each retrying one message; its queue's other keys go on; "
                       "skip it with 'consumer skip'):")
            out.append(render_table(["QUEUE", "KEY", "OFFSET", "MSG_ID", "ATTEMPTS", "BLOCKED_FOR"],
                                    [[_queue(b.get("mq")), b.get("key"), b.get("offset"), b.get("msgId"),
                                      b.get("attempts"), format_age(b.get("blockedMs"))] for b in keys], indent="  "))
        blocked = c.get("blockedQueues") or []
        if blocked:
            out.append("  blocked queues (retrying one message; skip it with 'consumer skip'):")
            out.append(render_table(["QUEUE", "OFFSET", "MSG_ID", "ATTEMPTS", "BLOCKED_FOR"],
                                    [[_queue(b.get("mq")), b.get("offset"), b.get("msgId"), b.get("attempts"),
                                      format_age(b.get("blockedMs"))] for b in blocked], indent="  "))
        paused = (c.get("pull") or {}).get("pausedMasterDown") or []
        if paused:  # HA (issue 15): orderly queues wait for their broker's master, where their locks live
            out.append("  paused orderly queues: the master of their broker is down (their locks live on it); they "
                       "resume when it is back or a slave is promoted:")
            out.append("    " + ", ".join(_queue(m) for m in paused))
        status = c.get("statusTable") or {}
        if status:
            out.append(render_table(
                ["TOPIC", "CONSUMED_OK", "FAILED", "RT_AVG_MS", "RT_MAX_MS", "PULLS", "PULL_RT_MS"],
                [[t, s.get("consumeOK"), s.get("consumeFailed"), s.get("consumeRT"), s.get("consumeRTMax"),
                  s.get("pullCount"), s.get("pullRT")] for t, s in sorted(status.items())], indent="  "))
        out.append("")
    for e in doc.get("errors") or []:
        out.append(f"client {e.get('clientId')}: error: {e.get('error')}")
    if not doc.get("clients") and not doc.get("errors"):
        out.append(f"group {doc.get('consumerGroup')} has no member")
    return "\n".join(out).rstrip()


def render_reset_offset(doc: Mapping[str, Any]) -> str:
    rows = [[q.get("brokerName"), q.get("queueId"), _offset(q.get("previousOffset")), q.get("offset")]
            for q in doc.get("queues") or []]
    if doc.get("dryRun"):
        state = "online: its members will be told" if doc.get("online") else "offline"
        return "\n".join([render_table(["BROKER", "QID", "CURRENT_OFFSET", "NEW_OFFSET"], rows),
                          f"plan for group {doc.get('consumerGroup')} on {doc.get('topic')} ({state}): nothing "
                          f"changed; run again with --execute to apply it", *_errors(doc)])
    lines = [render_table(["BROKER", "QID", "OLD_OFFSET", "NEW_OFFSET"], rows)]
    if doc.get("online"):
        for c in doc.get("clients") or []:
            state = "applied" if c.get("ok") else f"FAILED: {c.get('remark')}"
            lines.append(f"member {c.get('clientId')} (via {c.get('brokerName')}): {state}, "
                         f"{c.get('queues')} queue(s) restarted")
    else:
        lines.append("group offline: offsets written on the brokers; members will start from them")
    return "\n".join(lines + _errors(doc))


def render_consumer_list(doc: Mapping[str, Any]) -> str:
    groups = doc.get("groups") or []
    rows = [[g.get("consumerGroup"), g.get("members"), g.get("consumeMode"), g.get("messageModel"),
             g.get("totalLag"), ", ".join(g.get("brokers") or []) or None] for g in groups]
    table = render_table(["GROUP", "MEMBERS", "MODE", "MODEL", "LAG", "BROKERS"], rows)
    return "\n".join([table, f"{len(groups)} consumer groups", *_errors(doc)])


def render_consumer_delete(doc: Mapping[str, Any]) -> str:
    offsets = "and its stored offsets " if doc.get("offsetsRemoved") else "(its stored offsets kept) "
    members = doc.get("members") or []
    forced = f"; {len(members)} member(s) were online: {', '.join(members)}" if members else ""
    return (f"consumer group {doc.get('consumerGroup')} deleted {offsets}on "
            f"{', '.join(doc.get('brokers') or []) or 'no broker'}{forced}" + "".join(f"\n{e}" for e in _errors(doc)))


def render_topic_delete(doc: Mapping[str, Any]) -> str:
    brokers = ", ".join(f"{b['brokerName']} ({b['brokerAddr']})" for b in doc.get("brokers") or []) or "no broker"
    namesrvs = ", ".join(doc.get("namesrvs") or []) or "no name server"
    return "\n".join([f"topic {doc.get('topic')} deleted on {brokers} and from {namesrvs}", *_errors(doc)])


def render_consumer_skip(doc: Mapping[str, Any]) -> str:
    nxt = doc.get("nextOffset")
    after = f"the queue now continues at offset {nxt}" if nxt is not None else "later messages were already cached"
    return (f"skipped {_queue(doc.get('mq'))} offset {doc.get('queueOffset')} (msg id {doc.get('msgId')}, "
            f"{doc.get('reconsumeTimes')} reconsume times) on client {doc.get('clientId')}: dead-lettered to "
            f"{doc.get('deadLetterTopic')}; {after}")


def render_dlq_list(doc: Mapping[str, Any], *, tz: _dt.tzinfo | None = None) -> str:
    msgs = doc.get("messages") or []
    rows = [[m.get("brokerName"), m.get("queueOffset"), m.get("msgId"), m.get("originTopic"), m.get("originMsgId"),
             m.get("reconsumeTimes"), format_timestamp(m.get("storeTimestamp"), tz=tz), m.get("resent"),
             m.get("skippedBy"), m.get("keys")] for m in msgs]
    table = render_table(["BROKER", "OFFSET", "MSG_ID", "ORIGIN_TOPIC", "ORIGIN_MSG_ID", "RECONSUMED", "STORED",
                          "RESENT", "SKIPPED_BY", "KEYS"], rows)
    lines = [table, f"{doc.get('topic')}: {len(msgs)} dead letters" + (" (truncated)" if doc.get("truncated") else "")]
    for m in msgs:
        if "body" in m:
            lines.append(f"{m.get('msgId')} body ({m.get('bodyEncoding')}): {m.get('body')}")
    return "\n".join(lines + _errors(doc))


def render_dlq_resend(doc: Mapping[str, Any]) -> str:
    rows = [[r.get("brokerName"), r.get("dlqMsgId"), r.get("topic"), r.get("queueId"), r.get("msgId")]
            for r in doc.get("resent") or []]
    lines = [render_table(["BROKER", "DEAD_LETTER", "TOPIC", "QID", "NEW_MSG_ID"], rows),
             f"resent {doc.get('resentCount')}, already resent before {doc.get('skipped')}, "
             f"failed {len(doc.get('failed') or [])}"]
    lines += [f"failed: {f.get('msgId') or f.get('queueOffset')}: {f.get('error')}" for f in doc.get("failed") or []]
    return "\n".join(lines + _errors(doc))


def render_message(doc: Mapping[str, Any], *, tz: _dt.tzinfo | None = None) -> str:
    pairs: list[tuple[str, Any]] = [
        ("msg id", doc.get("msgId")), ("unique key", doc.get("uniqKey")), ("topic", doc.get("topic")),
        ("broker", doc.get("brokerName")), ("queue id", doc.get("queueId")), ("queue offset", doc.get("queueOffset")),
        ("commit-log offset", doc.get("commitLogOffset")), ("tags", doc.get("tags")), ("keys", doc.get("keys")),
        ("born", f"{format_timestamp(doc.get('bornTimestamp'), tz=tz)} from {doc.get('bornHost')}"),
        ("stored", f"{format_timestamp(doc.get('storeTimestamp'), tz=tz)} on {doc.get('storeHost')}"),
        ("reconsume times", doc.get("reconsumeTimes")), ("flag", doc.get("flag")), ("sys flag", doc.get("sysFlag")),
        ("body size", doc.get("bodySize")), ("body CRC", doc.get("bodyCRC")),
    ]
    if doc.get("bodyFile"):
        pairs.append(("body file", doc.get("bodyFile")))
    lines = [kv_lines(pairs), "properties:"]
    lines.append(kv_lines(sorted((doc.get("properties") or {}).items()), indent="  ") or "  (none)")
    lines.append(f"body ({doc.get('bodyEncoding')}):")
    lines.append(str(doc.get("body")))
    return "\n".join(lines)


def render_message_query(doc: Mapping[str, Any], *, tz: _dt.tzinfo | None = None) -> str:
    msgs = doc.get("messages") or []
    rows = [[m.get("brokerName"), m.get("topic"), m.get("queueId"), m.get("queueOffset"), m.get("msgId"),
             m.get("uniqKey"), m.get("keys"), m.get("tags"), format_timestamp(m.get("storeTimestamp"), tz=tz)]
            for m in msgs]
    table = render_table(["BROKER", "TOPIC", "QID", "OFFSET", "MSG_ID", "UNIQ_KEY", "KEYS", "TAGS", "STORED"], rows)
    what = "unique key" if doc.get("uniqueKey") else "key"
    where = f" in topic {doc.get('topic')}" if doc.get("topic") else ""
    return "\n".join([table, f"{len(msgs)} message(s) with {what} {doc.get('key')}{where}", *_errors(doc)])


def render_cluster_list(doc: Mapping[str, Any], *, now_ms: int, tz: _dt.tzinfo | None = None) -> str:
    rows, topic_lines = [], []
    for c in doc.get("clusters") or []:
        for b in c.get("brokers") or []:
            last = b.get("lastUpdateTimestamp")
            age = b.get("ageMs")
            seen = f"{format_timestamp(last, tz=tz)} ({format_age(age)} ago)" if last else None
            rows.append([c.get("cluster"), b.get("brokerName"), b.get("brokerId"), b.get("brokerAddr"),
                         _ha_role(b), b.get("masterEpoch"), _ha_lag(b), b.get("topicCount"), seen])
            if b.get("brokerId") == 0:
                topic_lines.append(f"topics of {b.get('brokerName')}: {', '.join(b.get('topics') or []) or '-'}")
    table = render_table(["CLUSTER", "BROKER", "ID", "ADDRESS", "ROLE", "EPOCH", "REPLICATION", "TOPICS",
                          "LAST_REGISTERED"], rows)
    return "\n".join([table, *topic_lines])


def _ha_role(b: Mapping[str, Any]) -> str | None:
    if b.get("error"):
        return "unreachable"
    return b.get("role")


def _ha_lag(b: Mapping[str, Any]) -> str | None:
    """HA (issue 15): a master's replication lag (its best slave), a slave's link to its master."""
    if b.get("role") == "SLAVE":
        link = "following" if b.get("masterConnected") else "master unreachable"
        age = b.get("offsetsSyncAgeMs")
        return link if age is None else f"{link}, offsets {format_age(age)} old"
    slaves = b.get("slaves")
    if slaves is None:
        return None
    if not slaves:
        return "no slave"
    return f"{slaves} slave(s), lag {b.get('lagBytes')} B / {b.get('lagSeconds')} s"
