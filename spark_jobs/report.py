"""report.html for the audit: one self-contained page, charts drawn as inline SVG (no scripts, no CDN).

Pure functions of the summary and a few small row lists; no Spark.
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
           "#17becf"]
CHECK_TITLES = {
    "integrity": "Integrity (malformed regions, CRC, torn tail, overruns)",
    "offsets": "Queue offsets (gaps, duplicates)",
    "consume_queue": "Consume queue vs commit log",
    "key_queues": "Sharding key in more than one queue",
    "born_order": "Born-timestamp order inversions per key",
    "consumer_offsets": "Consumer offsets past the end of a queue",
    "retry_lineage": "Retries whose original message is missing",
    "dead_letters": "Dead-letter arrivals",
}


def esc(v: Any) -> str:
    return html.escape("" if v is None else str(v))


def _fmt_ms(ms: int | None, with_date: bool = True, seconds: bool = False) -> str:
    if ms is None:
        return ""
    dt = datetime.fromtimestamp(ms / 1000, tz=UTC)
    clock = "%H:%M:%S" if seconds else "%H:%M"
    return dt.strftime(f"%Y-%m-%d {clock}" if with_date else clock)


def _nice_max(v: float) -> float:
    if v <= 0:
        return 1.0
    exp = 10 ** (len(str(int(v))) - 1)
    for m in (1, 2, 2.5, 5, 10):
        if m * exp >= v:
            return m * exp
    return 10 * exp


def _num(v: float) -> str:
    if v >= 1e6:
        return f"{v / 1e6:.1f}M"
    if v >= 1e4:
        return f"{v / 1e3:.0f}k"
    if v == int(v):
        return f"{int(v)}"
    return f"{v:.1f}"


def line_chart(series: Mapping[str, Sequence[tuple[int, float]]], title: str, y_label: str,
               width: int = 860, height: int = 280) -> str:
    """Lines over time (x in epoch ms), one per series, with a legend."""
    pts = [p for s in series.values() for p in s]
    if not pts:
        return f'<p class="empty">{esc(title)}: no data.</p>'
    left, right, top, bottom = 56, 170, 28, 34
    pw, ph = width - left - right, height - top - bottom
    x0 = min(p[0] for p in pts)
    x1 = max(p[0] for p in pts)
    if x1 == x0:
        x1 = x0 + 60_000
    ymax = _nice_max(max(p[1] for p in pts))

    def sx(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * pw

    def sy(y: float) -> float:
        return top + ph - y / ymax * ph

    out = [f'<svg class="chart" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
           f'aria-label="{esc(title)}"><title>{esc(title)}</title>',
           f'<text x="{left}" y="16" class="ct">{esc(title)}</text>']
    for i in range(5):
        y = ymax * i / 4
        out.append(f'<line x1="{left}" x2="{left + pw}" y1="{sy(y):.1f}" y2="{sy(y):.1f}" class="grid"/>')
        out.append(f'<text x="{left - 6}" y="{sy(y) + 4:.1f}" class="yl">{_num(y)}</text>')
    same_day = _fmt_ms(x0)[:10] == _fmt_ms(x1)[:10]
    short = x1 - x0 < 20 * 60_000  # tick labels would repeat minutes
    for i in range(5):
        x = x0 + (x1 - x0) * i / 4
        label = _fmt_ms(int(x), not same_day, short)
        out.append(f'<text x="{sx(x):.1f}" y="{top + ph + 16}" class="xl">{esc(label)}</text>')
    out.append(f'<text x="12" y="{top + ph / 2:.0f}" class="al" transform="rotate(-90 12 {top + ph / 2:.0f})">'
               f'{esc(y_label)}</text>')
    for idx, (name, s) in enumerate(series.items()):
        color = PALETTE[idx % len(PALETTE)]
        s = sorted(s)
        if len(s) == 1:
            out.append(f'<circle cx="{sx(s[0][0]):.1f}" cy="{sy(s[0][1]):.1f}" r="3" fill="{color}"/>')
        else:
            d = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in s)
            out.append(f'<polyline points="{d}" fill="none" stroke="{color}" stroke-width="1.6"/>')
        ly = top + 14 * idx + 6
        out.append(f'<rect x="{left + pw + 12}" y="{ly - 8}" width="10" height="10" fill="{color}"/>')
        out.append(f'<text x="{left + pw + 26}" y="{ly + 1}" class="lg">{esc(name[:22])}</text>')
    out.append("</svg>")
    return "".join(out)


def bar_chart(categories: Sequence[str], series: Mapping[str, Sequence[float]], title: str,
              width: int = 860, height: int = 260) -> str:
    """Grouped vertical bars: one group per category, one bar per series."""
    if not categories:
        return f'<p class="empty">{esc(title)}: no data.</p>'
    left, right, top, bottom = 56, 150, 28, 60
    pw, ph = width - left - right, height - top - bottom
    ymax = _nice_max(max((v for s in series.values() for v in s), default=0))
    n, k = len(categories), max(len(series), 1)
    gw = pw / n
    bw = max(min(gw * 0.8 / k, 40), 1)
    out = [f'<svg class="chart" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
           f'aria-label="{esc(title)}"><title>{esc(title)}</title>',
           f'<text x="{left}" y="16" class="ct">{esc(title)}</text>']
    for i in range(5):
        y = top + ph - ph * i / 4
        out.append(f'<line x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>')
        out.append(f'<text x="{left - 6}" y="{y + 4:.1f}" class="yl">{_num(ymax * i / 4)}</text>')
    for ci, cat in enumerate(categories):
        gx = left + gw * ci + (gw - bw * k) / 2
        for si, (name, vals) in enumerate(series.items()):
            v = vals[ci]
            h = v / ymax * ph
            out.append(f'<rect x="{gx + si * bw:.1f}" y="{top + ph - h:.1f}" width="{bw - 1:.1f}" height="{h:.1f}" '
                       f'fill="{PALETTE[si % len(PALETTE)]}"><title>{esc(cat)} {esc(name)}: {_num(v)}</title></rect>')
        cx = left + gw * ci + gw / 2
        out.append(f'<text x="{cx:.1f}" y="{top + ph + 14}" class="xl">{esc(cat[:16])}</text>')
    for si, name in enumerate(series):
        ly = top + 14 * si + 6
        color = PALETTE[si % len(PALETTE)]
        out.append(f'<rect x="{left + pw + 12}" y="{ly - 8}" width="10" height="10" fill="{color}"/>')
        out.append(f'<text x="{left + pw + 26}" y="{ly + 1}" class="lg">{esc(name)}</text>')
    out.append("</svg>")
    return "".join(out)


def hbar_chart(labels: Sequence[str], values: Sequence[float], title: str, width: int = 860) -> str:
    """Horizontal bars, one per label (e.g. lag per group/topic/queue)."""
    if not labels:
        return f'<p class="empty">{esc(title)}: no data.</p>'
    left, right, top, row = 300, 70, 28, 16
    height = top + row * len(labels) + 10
    pw = width - left - right
    vmax = _nice_max(max(values, default=0))
    out = [f'<svg class="chart" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
           f'aria-label="{esc(title)}"><title>{esc(title)}</title>',
           f'<text x="8" y="16" class="ct">{esc(title)}</text>']
    for i, (label, v) in enumerate(zip(labels, values, strict=True)):
        y = top + i * row
        w = v / vmax * pw
        out.append(f'<text x="{left - 6}" y="{y + 11}" class="yl">{esc(label[:48])}</text>')
        out.append(f'<rect x="{left}" y="{y + 2}" width="{max(w, 0.5):.1f}" height="{row - 4}" fill="{PALETTE[0]}"/>')
        out.append(f'<text x="{left + w + 4:.1f}" y="{y + 11}" class="vl">{_num(v)}</text>')
    out.append("</svg>")
    return "".join(out)


def _table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> str:
    if not rows:
        return '<p class="empty">none</p>'
    cols = list(columns) if columns else list(dict.fromkeys(k for r in rows for k in r))
    head = "".join(f"<th>{esc(c)}</th>" for c in cols)
    body = []
    for r in rows:
        cells = []
        for c in cols:
            v = r.get(c)
            if isinstance(v, (dict, list)):
                v = json.dumps(v, separators=(", ", ": "))
            cells.append(f"<td>{esc(v)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f'<table><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'


_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:24px auto;max-width:1100px;color:#222}
h1{font-size:22px;margin-bottom:4px} h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ddd}
h3{font-size:15px;margin-bottom:4px}
.meta{color:#555} .verdict{font-size:17px;font-weight:600;padding:8px 12px;border-radius:6px;display:inline-block}
.clean{background:#e6f4ea;color:#1e6b34} .defects{background:#fce8e6;color:#a50e0e}
table{border-collapse:collapse;margin:6px 0 14px;font-size:12.5px} th,td{border:1px solid #ddd;padding:3px 6px;
text-align:left;vertical-align:top;max-width:520px;overflow-wrap:anywhere} th{background:#f5f5f5}
.chart{display:block;margin:8px 0 18px;max-width:100%;height:auto}
.chart .grid{stroke:#eee} .chart text{font-size:11px;fill:#444} .chart .ct{font-size:13px;font-weight:600;fill:#222}
.chart .yl{text-anchor:end} .chart .xl{text-anchor:middle} .chart .al{text-anchor:middle}
.empty{color:#888;font-style:italic} .sev-defect{color:#a50e0e;font-weight:600} .sev-info{color:#555}
"""


def render_report(
    summary: Mapping[str, Any],
    *,
    chart_rows: Sequence[Mapping[str, Any]] = (),
    lag_rows: Sequence[Mapping[str, Any]] = (),
    group_rows: Sequence[Mapping[str, Any]] = (),
    max_lag_bars: int = 40,
) -> str:
    """The whole page as a string."""
    rec = summary.get("records", {})
    checks = summary.get("checks", {})
    defects = summary.get("defects", 0)
    parts = [
        "<!doctype html><html lang=en><head><meta charset=utf-8>",
        f"<title>trimq audit: {esc(summary.get('store'))}</title><style>{_CSS}</style></head><body>",
        f"<h1>trimq audit</h1><p class=meta>Store <code>{esc(summary.get('store'))}</code>, "
        f"generated {esc(summary.get('generated_at'))}"
        + (f", window from {esc(summary.get('since_iso'))}" if summary.get("since") is not None else "")
        + "</p>",
    ]
    if defects:
        parts.append(f'<p class="verdict defects">{defects} defect(s) found (exit code {summary.get("exit_code")})</p>')
    else:
        parts.append('<p class="verdict clean">Clean: no defects found (exit code 0)</p>')
    parts.append(
        f"<p>{esc(rec.get('segments'))} segment(s), {esc(rec.get('messages'))} message(s), "
        f"{esc(rec.get('malformed_rows'))} malformed region(s), {esc(rec.get('topics'))} topic(s); "
        f"stored from {esc(rec.get('first_store_time'))} to {esc(rec.get('last_store_time'))}.</p>"
    )

    parts.append("<h2>Checks</h2>")
    rows = []
    for name, res in checks.items():
        kinds = ", ".join(f"{k}: {v}" for k, v in sorted(res.get("by_kind", {}).items()))
        checked = res.get("checked", True)
        rows.append(
            f"<tr><td>{esc(CHECK_TITLES.get(name, name))}</td><td class=sev-{esc(res.get('severity'))}>"
            f"{esc(res.get('severity'))}</td><td>{esc(res.get('count') if checked else 'not checked')}</td>"
            f"<td>{esc(kinds)}</td></tr>"
        )
    parts.append("<table><thead><tr><th>check</th><th>severity</th><th>findings</th><th>by kind</th></tr></thead>"
                 f"<tbody>{''.join(rows)}</tbody></table>")

    parts.append("<h2>Throughput</h2>")
    tp = summary.get("throughput", {})
    bucket = int(tp.get("bucket_ms") or 60_000)
    per_min = bucket / 60_000
    series: dict[str, list[tuple[int, float]]] = {}
    for r in chart_rows:
        series.setdefault(str(r["topic"]), []).append((int(r["minute_ms"]), float(r["messages"]) / per_min))
    label = "messages per minute" + (f" (averaged over {int(per_min)}-minute buckets)" if per_min > 1 else "")
    parts.append(line_chart(series, "Throughput per minute per topic", label))
    parts.append("<h3>Record sizes per topic (bytes)</h3>")
    parts.append(_table(tp.get("per_topic", []), ["topic", "messages", "bytes", "queues", "min_size", "p50_size",
                                                  "p90_size", "p99_size", "max_size"]))

    parts.append("<h2>Retries and dead letters</h2>")
    groups = [str(r["group"]) for r in group_rows]
    parts.append(bar_chart(groups, {"retries": [float(r["retries"] or 0) for r in group_rows],
                                    "dead letters": [float(r["dlq_arrivals"] or 0) for r in group_rows]},
                           "Retries and dead letters per group"))
    lin = summary.get("lineage", {})
    parts.append(f"<p>{esc(lin.get('chains'))} retried message(s), {esc(lin.get('retry_deliveries'))} retry "
                 f"deliveries, {esc(lin.get('dlq_arrivals'))} dead-letter arrival(s).</p>")
    parts.append("<h3>Top poison keys per group</h3>")
    parts.append(_table(lin.get("top_poison_keys", []), ["group", "rank", "key", "dlq_arrivals"]))
    parts.append("<h3>Retry chains (first examples)</h3>")
    chain_rows = []
    for c in lin.get("examples", []):
        steps = "; ".join(
            f"{s.get('stage')} rt={s.get('reconsume_times')}"
            + (f" level={s.get('delay_level')}" if s.get("delay_level") is not None else "")
            + (f" +{s.get('delay_ms')}ms" if s.get("delay_ms") is not None else "")
            for s in c.get("steps") or []
        )
        chain_rows.append({"group": c.get("group"), "origin": c.get("origin"), "topic": c.get("origin_topic"),
                           "key": c.get("key"), "retries": c.get("retries"), "dead lettered": c.get("dead_lettered"),
                           "chain": steps})
    parts.append(_table(chain_rows))

    parts.append("<h2>Consumer lag</h2>")
    lag_sorted = sorted((r for r in lag_rows if r.get("lag") is not None), key=lambda r: -int(r["lag"]))
    if not summary.get("lag", {}).get("checked"):
        parts.append('<p class="empty">No consumerOffset.json given or found: lag not computed.</p>')
    else:
        top = lag_sorted[:max_lag_bars]
        parts.append(hbar_chart([f"{r['group']} / {r['topic']} / q{r['queue_id']}" for r in top],
                                [float(r["lag"]) for r in top],
                                f"Lag per group / topic / queue (largest {len(top)} of {len(lag_rows)})"))
        parts.append(_table(lag_rows[:200], ["group", "topic", "queue_id", "consumer_offset", "max_offset",
                                            "max_offset_source", "lag"]))

    parts.append("<h2>Findings (first examples per check)</h2>")
    for name, res in checks.items():
        if not res.get("examples"):
            continue
        parts.append(f"<h3>{esc(CHECK_TITLES.get(name, name))}: {esc(res.get('count'))}</h3>")
        parts.append(_table(res["examples"], ["kind", "topic", "queue_id", "queue_offset", "key", "group",
                                              "segment", "file_position", "physical_offset", "detail"]))
    parts.append("<p class=meta>Tables: " + ", ".join(
        f"<code>{esc(k)}</code>" for k in summary.get("outputs", {})) + ". See docs/AUDIT.md for each check.</p>")
    parts.append("</body></html>\n")
    return "".join(parts)
