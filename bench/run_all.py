"""``make bench``: every benchmark of the project, bounded in time, with trimq/Redis ratios from one run.

    python -m bench.run_all [--runs 5] [--rates 10000,20000,30000,40000,0] [--stages 20000] [--no-spark]
                            [--spark-messages N] [--no-storage] [--no-takeover] [--no-variants] [--messages N]

1. ``bench.storage_bench`` in quick mode (raw append / pull through the real transport).
2. The shared peer workload (``../shared/bench/peers``: 8 queues, 1000 keys, 100k x 256 B, one ordered
   producer, two orderly consumers) on Redis Streams and on trimq, ``--runs`` runs each (medians quoted), via
   ``bench.peer_bench``: the **latency curve** (issue 22), ``live`` at each of ``--rates`` (10k, 20k, 30k,
   40k msg/s and flat out; the producer paced by the harness's ``--rate``, latency counted from each message's
   scheduled send time), the two systems' runs alternating at each rate (one of each per round); ``backlog``
   (alternating too); one trimq live run with per-stage timestamps (``--stages`` rate); plus a
   throughput-tuned trimq consumer row (``pull_interval`` 20 ms) unless ``--no-variants``.
3. Takeover of an orderly consumer's queues (``bench.takeover``): graceful, SIGKILL, SIGSTOP for 10 s, a
   10 s network partition, a broker restart; and the broker's cost of lease renewals (1000 clients x 8 queues).
4. High availability (``bench.ha``, issue 15): send throughput and p99 of an ASYNC_MASTER and a SYNC_MASTER
   with their slaves against a single broker (ratios), replication lag under load, and a master's SIGKILL under
   an unordered producer and concurrent consumers (acknowledged lost, time to the slave, time to sends on
   another broker name, duplicates), with a stand-alone name server.
5. The SDK on asyncio against the SDK on trio (``bench.sdk_loops``, issue 18): the consumer process's CPU per
   message at a paced 20k msg/s, live, with the peer workload's consumer settings and with the SDK's defaults
   (target: asyncio <= 1.2x trio); ``--no-sdk-loops`` skips it.
7. Order per key (``bench.key_scope``, issue 17; run before the audit benchmark): an orderly group of two
   consumers with a 10 ms listener (and a 1 ms CPU-burning one) in queue scope and in key scope, and the Redis
   Streams peer with the same listener: msg/s, the key/queue ratio, p99, per-key order violations;
   ``--no-key-scope`` skips it.
6. ``bench.spark_bench``: the audit's data source, the record schema through the JVM reader and ``trimq-audit``
   against the frozen reference (``bench.audit_reference``) on a generated store of
   ``--spark-messages`` messages (default 10M, about 4.3 GB of disk and several minutes; ``--no-spark`` skips it).

Everything is written under ``bench/results/`` (one JSON per row, ``summary.json``) and summarised in
``bench/results/REPORT.md``, tables ready for bench/RESULTS.md. Servers listen on 127.0.0.1 and are stopped
by PID. Redis: ``redis-server`` from the Debian package (installed the harness's way, with a policy-rc.d that
keeps it from starting as a service, when missing and running as root); without it trimq runs alone and the
report says so.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.harness import REPO, RESULTS, HarnessMissingError, load_harness
from bench.stop_signals import children_ended_on_error, end_child, raise_on_stop_signals, start_recorded

STEP_TIMEOUT_S = 1500


def log(msg: str) -> None:
    print(f"== {msg}", flush=True)


def ensure_redis() -> str | None:
    """Path of redis-server, installing the Debian package when missing (root only); None if unavailable."""
    path = shutil.which("redis-server")
    if path or os.geteuid() != 0 or not shutil.which("apt-get"):
        return path
    log("installing redis-server (apt-get; no service is started)")
    policy = Path("/usr/sbin/policy-rc.d")
    created = False
    try:
        if not policy.exists():
            policy.write_text("#!/bin/sh\nexit 101\n")
            policy.chmod(0o755)
            created = True
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run(["apt-get", "update", "-y"], env=env, check=False, timeout=300,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", "redis-server"], env=env,
                       check=False, timeout=600, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as exc:
        log(f"redis-server install failed: {exc}")
    finally:
        if created:
            policy.unlink(missing_ok=True)
    return shutil.which("redis-server")


#: How long a step told to stop (SIGTERM) may take to end what it started before it is killed.
STEP_STOP_GRACE_S = 60.0


def run_step(name: str, cmd: list[str], timeout: float = STEP_TIMEOUT_S) -> int:
    log(f"{name}: {' '.join(cmd)}")
    # this run told to stop (SIGTERM, hang-up, ^C): the step is told to stop too, and ends what it started first
    with children_ended_on_error(STEP_STOP_GRACE_S) as started:
        step = start_recorded(started, lambda: subprocess.Popen(cmd, cwd=str(REPO)))
        try:
            return step.wait(timeout)
        except subprocess.TimeoutExpired:
            log(f"{name}: timed out after {timeout:.0f} s")
            end_child(step, STEP_STOP_GRACE_S)
            return -1
        except KeyboardInterrupt:  # the terminal's ^C reached the step too: let it end what it started undisturbed
            with contextlib.suppress(subprocess.TimeoutExpired):
                step.wait(STEP_STOP_GRACE_S)
            raise


def py(*args: str) -> list[str]:
    return [sys.executable, "-m", *args]


# ---------------------------------------------------------------------------------------------- report

def load_json(results: Path, name: str) -> Any:
    """The parsed file ``results/name``; None when it is missing or not JSON."""
    try:
        return json.loads((results / name).read_text())
    except (OSError, ValueError):
        return None


def load(results: Path, name: str) -> dict[str, Any] | None:
    """A result object (a peer's summary, a benchmark's report); None when missing or not an object."""
    got = load_json(results, name)
    return got if isinstance(got, dict) else None


def _fmt_rate(v: float | None) -> str:
    return "-" if v is None else f"{v:,.0f}"


def _rng(row: dict[str, Any], key: str) -> str:
    r = row.get("range", {}).get(key)
    return f" ({r[0]:,.0f}-{r[1]:,.0f})" if r else ""


def redis_parser() -> str:
    try:
        import hiredis  # noqa: F401

        return "hiredis parser"
    except ImportError:
        return "pure-Python parser (hiredis not installed: Redis's client CPU is then ~2-3x the harness's)"


ROWS = [("redis", "live", ""), ("trimq", "live", ""), ("trimq", "live", "pull20"),
        ("redis", "backlog", ""), ("trimq", "backlog", "")]
LABEL = {"redis": "Redis Streams (AOF everysec)", "trimq": "trimq (ASYNC_FLUSH)"}


def report(results: Path, meta: dict[str, Any]) -> str:
    lines: list[str] = []
    add = lines.append
    add(f"Generated by `python -m bench.run_all {' '.join(meta.get('argv', []))}` on {meta.get('date', '?')}"
        f" ({meta.get('machine', '')}; load average at start {meta.get('load', '?')}).")
    if meta.get("runs_order"):
        add(f"Runs of the two systems at each rate and in the backlog: {meta['runs_order']}.")
    add("")
    add("### Throughput, latency, delivery (median of runs; min-max in brackets)")
    add("")
    add("| system | mode | produce msg/s | consume msg/s | p50 ms | p99 ms | violations | lost | dups | runs |")
    add("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    rows = {}
    for peer, mode, tag in ROWS:
        name = f"{peer}-{mode}" + (f"-{tag}" if tag else "") + ".json"
        row = load(results, name)
        if row is None or not row.get("median"):
            continue
        rows[(peer, mode, tag)] = row
        m = row["median"]
        label = LABEL[peer] + (" pull_interval 20 ms" if tag == "pull20" else "")
        add(f"| {label} | {mode} | {_fmt_rate(m.get('produce_msgs_per_s'))}{_rng(row, 'produce_msgs_per_s')} | "
            f"{_fmt_rate(m.get('consume_msgs_per_s'))}{_rng(row, 'consume_msgs_per_s')} | "
            f"{m.get('p50_ms', float('nan')):,.1f} | {m.get('p99_ms', float('nan')):,.1f} | "
            f"{row.get('sum_violations')} | {row.get('sum_lost')} | {row.get('sum_dups')} | {row.get('n_ok')} |")
    add("")
    add("### CPU microseconds per message (process CPU time / messages; median of runs)")
    add("")
    add("| system | mode | broker/server | producer | consumers | total | producer after start-up | "
        "consumers after start-up |")
    add("|---|---|---:|---:|---:|---:|---:|---:|")
    for (peer, mode, tag), row in rows.items():
        c = row.get("cpu_us_per_msg", {})
        a = row.get("cpu_us_per_msg_after_ready", {})
        label = LABEL[peer] + (" pull_interval 20 ms" if tag == "pull20" else "")
        add(f"| {label} | {mode} | {c.get('server', 0):.1f} | {c.get('producer', 0):.1f} | "
            f"{c.get('consumers', 0):.1f} | {c.get('total', 0):.1f} | {a.get('producer', 0):.1f} | "
            f"{a.get('consumers', 0):.1f} |")
    add("")
    add("### trimq / Redis (same run)")
    add("")
    add("| mode | produce | consume | p99 (lower is better) | CPU total (lower is better) |")
    add("|---|---:|---:|---:|---:|")
    for mode in ("live", "backlog"):
        ra = mode_ratios(rows.get(("trimq", mode, "")), rows.get(("redis", mode, "")))
        if ra is None:
            continue
        add(f"| {mode} | {fmt_ratio(ra['produce'])} | {fmt_ratio(ra['consume'])} | {fmt_ratio(ra['p99'])} | "
            f"{fmt_ratio(ra['cpu'])} |")
    add("")
    add(f"Redis client: redis-py {meta.get('redis_py', '?')} with the {meta.get('redis_parser', '?')}. "
        "trimq settings: broker max_transfer_count_on_message_in_memory 256 (1 MiB), consumer pull_batch_size 256, "
        "consume_message_batch_max_size 64, producer windows sent with Producer.send_batches.")
    assign = sorted({json.dumps(run.get("assignment")) for row in rows.values() for run in row.get("runs", [])
                     if row.get("peer") == "trimq" and run.get("assignment")})
    if assign:
        add(f"trimq consumer assignments seen (consumer -> queues, by rebalance): {', '.join(assign)}.")
    add("")
    lines.extend(curve_report(results, meta.get("rates") or list(DEFAULT_RATES)))
    tk = [load(results, f"takeover-{s}.json") for s in TAKEOVER_SCENARIOS]
    if any(tk):
        add("### Takeover of an orderly consumer's queues (2 consumers, paced producer, 2 s leases)")
        add("")
        add("| scenario | queues | takeover median / max (broker-restart: from listening) | target | lost | "
            "replays | order violations | started after lease | stale commits refused |")
        add("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        for t in tk:
            if not t:
                continue
            extra = f" (recovery {t.get('broker_recovery_s')} s)" if t["scenario"] == "broker-restart" else ""
            add(f"| {t['scenario']} | {len(t.get('per_queue', {}))} | "
                f"{t.get('takeover_s_median')} / {t.get('takeover_s_max')} s{extra} | "
                f"{t.get('target_s')} s {'met' if t.get('target_met') else 'NOT met'} | {t.get('lost')} | "
                f"{t.get('replays')} | {t.get('order_violations')} | {t.get('started_after_lease')} | "
                f"{t.get('stale_commits_refused')} |")
        add("")
    lines.extend(ha_report(load(results, "ha.json")))
    lines.extend(sdk_loops_report(load(results, "sdk-loops.json")))
    from bench.key_scope import report_lines as key_scope_report  # imports the harness: main checked it is there

    lines.extend(key_scope_report(load(results, "key_scope.json")))
    cost = load(results, "takeover-cost.json")
    if cost:
        add(f"Lease renewals: {cost.get('clients')} client ids x {cost.get('queues_per_client')} queues over "
            f"{cost.get('connections')} connections: {cost.get('renewals_per_s')} renewals/s cost the broker "
            f"{cost.get('broker_cpu_s_per_s')} CPU-s/s (idle {cost.get('idle_broker_cpu_s_per_s')}), "
            f"{cost.get('broker_cpu_us_per_renewal')} µs per renewal; renewal p99 {cost.get('p99_ms')} ms.")
        add("")
    st: list[dict[str, Any]] | None = load_json(results, "storage.json")
    if st:
        add("### Storage (bench.storage_bench, quick)")
        add("")
        add("| system | case | body | msgs/s | server µs/msg | client µs/msg |")
        add("|---|---|---:|---:|---:|---:|")
        for row in st:
            add(f"| {row['system']} | {row['case']} | {row['body']} | {row['msgs_s']:,.0f} | "
                f"{row['server_us_per_msg']:.1f} | {row['client_us_per_msg']:.1f} |")
        add("")
    return "\n".join(lines)


def ratios_text(results: Path, rates: list[int] | None = None) -> str:
    out = []
    for mode in ("live", "backlog"):
        ra = mode_ratios(load(results, f"trimq-{mode}.json"), load(results, f"redis-{mode}.json"))
        if ra is None:
            continue
        parts = [f"{what} {v:.2f}" for what, v in (("produce", ra["produce"]), ("consume", ra["consume"]),
                                                    ("p99", ra["p99"]), ("CPU/msg", ra["cpu"])) if v is not None]
        out.append(f"trimq/redis {mode}: " + ", ".join(parts))
    for point in curve_points(results, rates or list(DEFAULT_RATES)):
        ra = point.get("ratios")
        if ra and point["rate"]:
            out.append(f"trimq/redis live at {rate_label(point['rate'])}: p50 {fmt_ratio(ra['p50'])}, "
                       f"p99 {fmt_ratio(ra['p99'])}, p999 {fmt_ratio(ra['p999'])}, CPU/msg {fmt_ratio(ra['cpu'])}"
                       + ("" if point["in_scope"] else " (above 0.9x Redis flat out: outside the targets)"))
    return "\n".join(out)


def _ratio(a: Any, b: Any) -> float | None:
    return a / b if isinstance(a, int | float) and isinstance(b, int | float) and b else None


def fmt_ratio(v: float | None) -> str:
    """A ratio as the reports print it: two decimals, "-" when there is none."""
    return "-" if v is None else f"{v:.2f}"


def mode_ratios(trimq: dict[str, Any] | None, redis: dict[str, Any] | None) -> dict[str, float | None] | None:
    """trimq / Redis for one mode's rows (``trimq-backlog.json``...): produce and consume rates and p99 from the
    medians, and total CPU per message; None unless both rows have medians. A figure that is missing or zero on
    either side gives None."""
    if not trimq or not redis or not trimq.get("median") or not redis.get("median"):
        return None
    tm, rm = trimq["median"], redis["median"]
    tc, rc = trimq.get("cpu_us_per_msg", {}), redis.get("cpu_us_per_msg", {})

    def of(a: Any, b: Any) -> float | None:
        return a / b if a and b else None

    return {"produce": of(tm.get("produce_msgs_per_s"), rm.get("produce_msgs_per_s")),
            "consume": of(tm.get("consume_msgs_per_s"), rm.get("consume_msgs_per_s")),
            "p99": of(tm.get("p99_ms"), rm.get("p99_ms")), "cpu": of(tc.get("total"), rc.get("total"))}


def curve_points(results: Path, rates: list[int]) -> list[dict[str, Any]]:
    """One entry per offered rate with both systems' medians and the trimq/Redis ratios, and whether the rate
    is in the targets' scope (paced, at most 0.9x Redis's own flat-out live rate in the same run)."""
    return curve_points_of(lambda name: load(results, f"{name}.json"), rates)


def curve_points_of(row: Callable[[str], dict[str, Any] | None], rates: list[int]) -> list[dict[str, Any]]:
    """``curve_points`` over rows found by name (``trimq-live-rate10000``...): a results folder's files, or the
    copies a run's summary.json keeps (``bench.history``)."""
    redis_flat = (row("redis-live") or {}).get("median", {}).get("produce_msgs_per_s")
    out = []
    for rate in rates:
        name = "live" + (f"-{rate_tag(rate)}" if rate else "")
        t, r = row(f"trimq-{name}"), row(f"redis-{name}")
        point: dict[str, Any] = {"rate": rate, "trimq": t, "redis": r}
        if t and r and t.get("median") and r.get("median"):
            tm, rm = t["median"], r["median"]
            point["ratios"] = {
                "throughput": _ratio(tm.get("produce_msgs_per_s"), rm.get("produce_msgs_per_s")),
                "p50": _ratio(tm.get("p50_ms"), rm.get("p50_ms")),
                "p99": _ratio(tm.get("p99_ms"), rm.get("p99_ms")),
                "p999": _ratio(tm.get("p999_ms"), rm.get("p999_ms")),
                "cpu": _ratio(_cpu_total(t), _cpu_total(r)),
            }
        point["in_scope"] = bool(rate and redis_flat and rate <= 0.9 * redis_flat)
        if point["in_scope"] and "ratios" in point:
            ra = point["ratios"]
            point["p99_met"] = ra["p99"] is not None and ra["p99"] <= 1.0
            point["cpu_met"] = ra["cpu"] is not None and ra["cpu"] <= 0.8
        out.append(point)
    return out


def _cpu_total(row: dict[str, Any] | None) -> Any:
    """A result row's total CPU per message (µs), or None when the row or the figure is missing."""
    return ((row or {}).get("cpu_us_per_msg") or {}).get("total")


def paced_cpu_text(points: list[dict[str, Any]]) -> str | None:
    """Each system's CPU per message at each paced rate against its own flat-out figure of the same run: what
    being woken once or twice per window costs it (bench/RESULTS.md, *The cost of waking up*); None without a
    flat-out row or a paced one."""
    flat = next((p for p in points if not p["rate"]), None)
    paced = [p for p in points if p["rate"]]
    if flat is None or not paced:
        return None
    parts = []
    for peer in ("redis", "trimq"):
        base = _cpu_total(flat.get(peer))
        got = [_ratio(_cpu_total(p.get(peer)), base) for p in paced]
        if base and any(g is not None for g in got):
            parts.append(f"{LABEL[peer].split(' (')[0]} {' / '.join(fmt_ratio(g) for g in got)}")
    if not parts:
        return None
    rates = " / ".join(rate_label(p["rate"]).removesuffix(" msg/s") for p in paced)
    return (f"CPU per message at {rates} msg/s against the same system flat out: {'; '.join(parts)} (paced, every "
            "process sleeps between windows and pays for waking up: bench/RESULTS.md, *The cost of waking up*).")


def _met(point: dict[str, Any], key: str) -> str:
    return "-" if key not in point else ("met" if point[key] else "**missed**")


def curve_report(results: Path, rates: list[int]) -> list[str]:
    """The latency curve's tables (issue 22): per rate and system p50/p99/p999, CPU per message, pace lag;
    the trimq/Redis ratios and the targets."""
    points = [p for p in curve_points(results, rates) if p["trimq"] or p["redis"]]
    if not points:
        return []
    lines = ["### Latency at equal offered load (live; latency from each message's scheduled send time)", "",
             "| offered | system | produce msg/s | p50 ms | p99 ms | p999 ms | CPU µs/msg (server / producer / "
             "consumers = total) | pace lag s (max) | violations / lost / dups | runs |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for p in points:
        for peer in ("redis", "trimq"):
            row = p[peer]
            if not row or not row.get("median"):
                continue
            m, c = row["median"], row.get("cpu_us_per_msg", {})
            lag = m.get("pace_lag_s")
            lag_range = row.get("range", {}).get("pace_lag_s")
            lag_txt = "-" if lag is None else f"{lag:.3f}" + (f" ({lag_range[1]:.3f})" if lag_range else "")
            lines.append(
                f"| {rate_label(p['rate'])} | {LABEL[peer]} | {_fmt_rate(m.get('produce_msgs_per_s'))} | "
                f"{m.get('p50_ms', float('nan')):,.1f} | {m.get('p99_ms', float('nan')):,.1f} | "
                f"{m.get('p999_ms', float('nan')):,.1f} | {c.get('server', 0):.1f} / {c.get('producer', 0):.1f} / "
                f"{c.get('consumers', 0):.1f} = {c.get('total', 0):.1f} | {lag_txt} | "
                f"{row.get('sum_violations')} / {row.get('sum_lost')} / {row.get('sum_dups')} | {row.get('n_ok')} |")
    lines += ["", "trimq / Redis at each offered rate (targets, issue 22: at every paced rate up to 0.9x Redis's "
              "flat-out live rate, p99 <= 1.0 and CPU <= 0.8; flat out, throughput >= 1.5):", "",
              "| offered | throughput | p50 | p99 | p999 | CPU total | in the targets' scope | p99 target | "
              "CPU target |", "|---|---:|---:|---:|---:|---:|---|---|---|"]
    for p in points:
        ra = p.get("ratios")
        if not ra:
            continue

        if not p["rate"]:
            scope = "flat out"
            tput = ra["throughput"]
            tp_met = "-" if tput is None else ("met" if tput >= 1.5 else "**missed**")
            lines.append(f"| flat out | {fmt_ratio(tput)} ({tp_met} vs 1.5) | {fmt_ratio(ra['p50'])} | "
                         f"{fmt_ratio(ra['p99'])} | {fmt_ratio(ra['p999'])} | {fmt_ratio(ra['cpu'])} | {scope} | "
                         "- | - |")
            continue
        lines.append(f"| {rate_label(p['rate'])} | {fmt_ratio(ra['throughput'])} | {fmt_ratio(ra['p50'])} | "
                     f"{fmt_ratio(ra['p99'])} | {fmt_ratio(ra['p999'])} | {fmt_ratio(ra['cpu'])} | "
                     f"{'yes' if p['in_scope'] else 'no (above 0.9x Redis flat out)'} | {_met(p, 'p99_met')} | "
                     f"{_met(p, 'cpu_met')} |")
    lines.append("")
    paced = paced_cpu_text(points)
    if paced:
        lines += [paced, ""]
    st = load(results, "trimq-live-stages.json")
    if st and st.get("stages_ms"):
        lines += [f"Where trimq's latency goes (live at {rate_label(st.get('rate') or 0)}, `--trimq-stages 1`, "
                  "median of runs; born and stored are whole milliseconds):", "",
                  "| stage | p50 ms | p90 ms | p99 ms | p999 ms | mean ms |", "|---|---:|---:|---:|---:|---:|"]
        for name, q in st["stages_ms"].items():
            lines.append(f"| {name} | {q.get('p50', 0):.2f} | {q.get('p90', 0):.2f} | {q.get('p99', 0):.2f} | "
                         f"{q.get('p999', 0):.2f} | {q.get('mean', 0):.2f} |")
        lines.append("")
    return lines


#: The package's layer folders (setup.py maps them to trimq.*).
LAYERS = ("trimq", "protocol", "runtime", "namesrv", "broker", "client", "tools", "spark_jobs")

#: The latency curve's offered rates (msgs/s); 0 is flat out (the plain live row).
DEFAULT_RATES = (10_000, 20_000, 30_000, 40_000, 0)


def parse_rates(text: str) -> list[int]:
    return [int(float(x)) for x in text.split(",") if x.strip()]


def rate_tag(rate: float) -> str:
    """The results-file tag of a curve point: ``rate20000``; flat out has none (``<peer>-live.json``)."""
    return f"rate{int(rate)}" if rate else ""


def rate_label(rate: float) -> str:
    return f"{int(rate):,} msg/s" if rate else "flat out"


def machine_text() -> str:
    """The machine line of REPORT.md's header: CPUs, the Python version and the interpreter's own file.

    The file tells builds apart: each Python process of both peers spent 9-24% less CPU per message on Debian's
    build of CPython 3.11 (PGO and LTO) than on pyenv's default one (a shared libpython, neither) (bench/RESULTS.md,
    the levers table).
    """
    return f"{os.cpu_count()} CPUs, Python {platform.python_version()} ({os.path.realpath(sys.executable)})"


def runs_order(peers: list[str]) -> str:
    """How the curve's and the backlog's runs were ordered, as REPORT.md's header says it (``meta["runs_order"]``)."""
    if len(peers) > 1:
        return "alternating, one of each per round (Redis, trimq, Redis, ...)"
    return f"{peers[0]}'s alone (redis-server was not available)"


def ha_report(ha: Any) -> list[str]:
    """REPORT.md's high-availability section (bench.ha's ha.json), or nothing."""
    if not ha:
        return []
    out = ["### High availability (bench.ha: master/slave on loopback, stand-alone name server)", "",
           "| broker | msgs/s | x single | p50 ms | p99 ms | replication lag max (bytes / s) |",
           "|---|---:|---:|---:|---:|---:|"]
    names = {"single": "single broker", "async": "ASYNC_MASTER + slave", "sync": "SYNC_MASTER + slave"}
    for r in ha.get("throughput", []):
        lag = f"{r.get('lag_bytes_max')} / {r.get('lag_s_max')}" if r.get("lag_samples") else "-"
        out.append(f"| {names.get(r['mode'], r['mode'])} | {r['msgs_s']:,.0f} | {r.get('ratio_to_single')} | "
                   f"{r['p50_ms']} | {r['p99_ms']} | {lag} |")
    out += ["", "| master SIGKILLed | acknowledged lost | first pull to slave | consumed from slave | "
            "sends on another broker | longest send | duplicates (redelivered) | targets (<= 2 s; 0 lost under SYNC) |",
            "|---|---:|---:|---:|---:|---:|---:|---|"]
    for f in ha.get("failover", []):
        out.append(f"| {f['role']} | {f['acknowledged_lost']} | {f['first_pull_to_slave_s']} s | "
                   f"{f['consumption_from_slave_s']} s | {f['sends_on_other_broker_s']} s | "
                   f"{f['longest_send_around_kill_s']} s | {f['duplicates']} ({f.get('redelivered')}) | "
                   f"{'met' if f.get('target_met') else 'NOT met'} |")
    out.append("")
    return out


def sdk_loops_report(data: Any) -> list[str]:
    """REPORT.md's asyncio-vs-trio section (bench.sdk_loops' sdk-loops.json), or nothing."""
    if not data:
        return []
    out = [f"### The SDK on asyncio and on trio (bench.sdk_loops: one consumer, live at {data['rate']:,} msg/s, "
           f"median of {data['runs_per_loop']} runs each)", "",
           "| consumer settings | trio µs CPU/msg | asyncio µs CPU/msg | asyncio / trio | target <= 1.2 |",
           "|---|---:|---:|---:|---|"]
    labels = {"peer": "peer workload (orderly, pull 256, 64 per listener call)",
              "defaults": "SDK defaults (concurrently, 1 per listener call)"}
    for name, p in data.get("profiles", {}).items():
        out.append(f"| {labels.get(name, name)} | {p['trio']['cpu_us_per_msg']} | {p['asyncio']['cpu_us_per_msg']} | "
                   f"{p['ratio']} | {'met' if p.get('target_met') else '**missed**'} |")
    out.append("")
    return out


#: bench.takeover's scenarios, in report order (plus ``cost``, the lease renewals' price).
TAKEOVER_SCENARIOS = ("graceful", "sigkill", "sigstop", "partition", "broker-restart")


# ---------------------------------------------------------------------------------------------- main

def main(argv: list[str] | None = None) -> int:
    """``make bench``. A SIGTERM or hang-up stops it as a ^C does: the running step is told to stop (``run_step``)
    and ends the brokers and clients it started."""
    with raise_on_stop_signals(SystemExit):
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.run_all", description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=5, help="runs per peer, mode and rate (medians are quoted)")
    p.add_argument("--rates", default=",".join(str(r) for r in DEFAULT_RATES),
                   help="offered rates of the latency curve, msgs/s, comma-separated (0: flat out)")
    p.add_argument("--stages", type=int, default=20_000,
                   help="offered rate of the trimq run with per-stage timestamps (0: skip it)")
    p.add_argument("--messages", type=int, default=100_000)
    p.add_argument("--spark", action="store_true", help=argparse.SUPPRESS)  # the default now
    p.add_argument("--no-spark", action="store_true", help="skip bench.spark_bench (minutes, ~4.3 GB of disk)")
    p.add_argument("--spark-messages", type=int, default=10_000_000,
                   help="messages in the audit benchmark's store (default 10M)")
    p.add_argument("--no-storage", action="store_true")
    p.add_argument("--no-takeover", action="store_true")
    p.add_argument("--no-ha", action="store_true", help="skip bench.ha (master/slave replication, failover)")
    p.add_argument("--no-sdk-loops", action="store_true", help="skip bench.sdk_loops (asyncio vs trio consumer CPU)")
    p.add_argument("--no-variants", action="store_true", help="skip the pull_interval 20 ms trimq row")
    p.add_argument("--no-key-scope", action="store_true", help="skip bench.key_scope (order per key, issue 17)")
    p.add_argument("--results", default=str(RESULTS))
    args = p.parse_args(argv)
    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    meta: dict[str, Any] = {"argv": argv if argv is not None else sys.argv[1:],
                            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                            "machine": machine_text(),
                            "load": ", ".join(f"{x:.1f}" for x in os.getloadavg())}
    try:
        from importlib.metadata import version

        meta["redis_py"] = version("redis")
    except Exception:
        meta["redis_py"] = "not installed"
    meta["redis_parser"] = redis_parser()
    try:
        load_harness()
    except HarnessMissingError as exc:
        print(f"bench.run_all: {exc}", file=sys.stderr)
        return 2
    rc = 0
    if not args.no_storage:
        out = results / "storage.json"
        if run_step("storage (quick)", py("bench.storage_bench", "--messages", "50000", "--no-profile",
                                          "--json", str(out))) != 0:
            rc = 1
    # The layer folders are an editable install: byte-compile them as a regular install does, so that every
    # client process does not compile the SDK from source (PYTHONDONTWRITEBYTECODE environments) while the Redis
    # peer's client library comes precompiled with its package; __pycache__ is ignored by git.
    subprocess.run([sys.executable, "-m", "compileall", "-q", *LAYERS], cwd=str(REPO), check=False,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    redis = ensure_redis()
    meta["redis_server"] = redis or "not available"
    peers = (["redis"] if redis else []) + ["trimq"]
    if not redis:
        log("redis-server is not available: trimq runs alone (no ratios)")
    common_flags = ["--runs", str(args.runs), "--messages", str(args.messages), "--results", str(results)]
    meta["rates"] = rates = parse_rates(args.rates)
    # The latency curve: live mode at each offered rate, the two systems' runs alternating (one of each per
    # round) so that both see the same machine, however its load drifts; rate 0 (flat out) is the plain live row.
    both, label = ",".join(peers), " and ".join(peers)
    meta["runs_order"] = runs_order(peers)
    for rate in rates:
        if run_step(f"{label} live {rate_label(rate)}",
                    py("bench.peer_bench", "run", "--peer", both, "--mode", "live", "--rate", str(rate),
                       "--tag", rate_tag(rate), *common_flags), timeout=STEP_TIMEOUT_S * len(peers)) != 0:
            rc = 1
    if run_step(f"{label} backlog", py("bench.peer_bench", "run", "--peer", both, "--mode", "backlog",
                                    *common_flags), timeout=STEP_TIMEOUT_S * len(peers)) != 0:
        rc = 1
    if args.stages:
        run_step(f"trimq live {rate_label(args.stages)}, per-stage timestamps",
                 py("bench.peer_bench", "run", "--peer", "trimq", "--mode", "live", "--rate", str(args.stages),
                    "--trimq-stages", "1", "--tag", "stages", *common_flags))
    if not args.no_variants:
        run_step("trimq live, pull_interval 20 ms", py("bench.peer_bench", "run", "--peer", "trimq", "--mode",
                                                       "live", "--trimq-pull-interval", "20", "--tag", "pull20",
                                                       *common_flags))
    if not args.no_takeover:
        for scenario in (*TAKEOVER_SCENARIOS, "cost"):
            if run_step(f"takeover {scenario}", py("bench.takeover", "--scenario", scenario, "--results",
                                                   str(results)), timeout=400) != 0:
                rc = 1
    if not args.no_ha and run_step("ha (replication, failover)", py("bench.ha", "--results", str(results)),
                                   timeout=900) != 0:
        rc = 1
    if not args.no_sdk_loops and run_step("sdk loops (asyncio vs trio)",
                                          py("bench.sdk_loops", "--results", str(results)), timeout=900) != 0:
        rc = 1
    if not args.no_key_scope and run_step("key scope vs queue scope", py("bench.key_scope", "--results",
                                                                          str(results)), timeout=1500) != 0:
        rc = 1
    if not args.no_spark and run_step("spark_bench", py("bench.spark_bench", "--messages", str(args.spark_messages),
                                                        "--results", str(results)), timeout=3600) != 0:
        rc = 1
    meta["wall_s"] = round(time.monotonic() - t_start, 1)
    text = report(results, meta)
    (results / "REPORT.md").write_text(text + "\n")
    summary: dict[str, Any] = {"meta": meta, "ratios": ratios_text(results, rates)}
    for f in sorted(results.glob("*.json")):
        if f.name not in ("summary.json",):
            summary[f.stem] = {k: v for k, v in (load(results, f.name) or {}).items() if k != "runs"} \
                if f.name != "storage.json" else load_json(results, f.name)
    (results / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    print()
    print(text)
    print()
    print(ratios_text(results, rates))
    log(f"done in {meta['wall_s']:.0f} s; results in {results}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
