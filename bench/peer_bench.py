"""The shared ordered workload on trimq and on Redis Streams, side by side (issue 10 item 5).

    python -m bench.peer_bench run --peer trimq --runs 3 --mode live [workload flags]
    python -m bench.peer_bench run --peer redis --runs 3 --mode backlog
    python -m bench.peer_bench run --peer redis,trimq --runs 5 --mode live --rate 10000

The orchestration is the harness's ``bench.py`` (``../shared/bench/peers``) with two peers, ``redis`` (the
harness's own ``peer_redis.py``) and ``trimq`` (``bench/peer_trimq.py``): per run a fresh server and data
dir on 127.0.0.1, consumers started first (``live``) or after the producer (``backlog``), one producer
process, bounded waits, the server stopped by PID, then aggregation exactly as the harness does it
(consume rate = received / (last receive - first receive), p50/p99 over all messages, violations, lost,
duplicates, process CPU). Added: CPU at the moment each client process became ready (so start-up cost can
be told apart) and each trimq consumer's queue assignment. Per-peer medians go to
``bench/results/<peer>-<mode>.json``.

With several peers (``--peer redis,trimq``) the runs alternate, one of each peer per round, so that a change in
the machine's load between rounds reaches both systems alike instead of only the one whose runs came later.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import importlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from array import array
from typing import Any

from bench.harness import REPO, RESULTS, load_harness
from bench.own_redis import start_harness_redis
from bench.stop_signals import kill_children, raise_on_stop_signals, start_recorded

common = load_harness()

PEERS = ["redis", "trimq"]


REDIS_PORT_ENV = "TRIMQ_BENCH_REDIS_PORT"


def peer_mod(name: str) -> Any:
    mod: Any = importlib.import_module(f"peer_{name}")
    if name == "redis" and os.environ.get(REDIS_PORT_ENV):
        # The harness's Redis peer listens on a fixed port; another benchmark running it at the same time would
        # share the server and mix both runs' streams. Each run gets a port of its own (start_server below).
        mod.PORT = int(os.environ[REDIS_PORT_ENV])
    return mod


def cpu_now() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def peer_names(text: str) -> str:
    """``--peer``: one peer, or several separated by commas (``run`` alternates their runs)."""
    names = text.split(",")
    unknown = [name for name in names if name not in PEERS]
    if unknown or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected one or more of {', '.join(PEERS)}, separated by commas, each at most once")
    return text


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.peer_bench")
    p.add_argument("cmd", choices=["run", "role"])
    p.add_argument("--peer", required=True, type=peer_names,
                   help=f"one of {', '.join(PEERS)}, or (run) several separated by commas: their runs alternate")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--mode", default="live", choices=["live", "backlog"])
    p.add_argument("--tag", default="", help="suffix for the results file")
    p.add_argument("--workroot", default="/tmp/trimq-peerbench")
    p.add_argument("--results", default=str(RESULTS))
    p.add_argument("--role", choices=["produce", "consume"])
    p.add_argument("--cid", type=int, default=0)
    p.add_argument("--outdir")
    common.add_workload_args(p)
    for name in PEERS:
        peer_mod(name).add_args(p)
    return p


# ---------------------------------------------------------------- roles (subprocesses)

def role_main(args: argparse.Namespace) -> None:
    if "," in args.peer:
        raise SystemExit(f"--peer {args.peer}: a role process runs one peer")
    mod = peer_mod(args.peer)
    os.makedirs(args.outdir, exist_ok=True)
    if args.role == "produce":
        work = common.gen_workload(args)
        maker = common.PayloadMaker(args)
        cpu0 = cpu_now()
        res = asyncio.run(asyncio.wait_for(mod.produce(args, work, maker), args.deadline_s))
        res["msgs_per_s"] = res["sent"] / res["seconds"]
        res["cpu_s"] = common.cpu_self()
        res["cpu_before_produce_s"] = round(cpu0, 3)
        common.write_json(os.path.join(args.outdir, "producer.json"), res)
        return
    queues = common.owned_queues(args.cid, args.consumers, args.queues)
    rec = common.Recorder(common.expected_for(args, queues))
    readyf = os.path.join(args.outdir, f"c{args.cid}.ready")
    marks: dict[str, float] = {}

    def ready() -> None:
        marks["cpu_at_ready_s"] = round(cpu_now(), 3)
        common.touch(readyf)

    async def go() -> None:
        await asyncio.wait_for(mod.consume(args, args.cid, queues, rec, ready), args.deadline_s + 30)

    err = None
    try:
        asyncio.run(go())
    except Exception as e:  # record what we have
        err = repr(e)
    extra: dict[str, Any] = dict(queues=queues, error=err, cpu_s=common.cpu_self(), **marks)
    peer_info = getattr(rec, "peer_info", None)
    if peer_info:
        extra["peer"] = peer_info
        extra["queues"] = peer_info.get("steady_queues", queues)  # as assigned by the rebalance
    rec.write(args.outdir, args.cid, extra)


# ---------------------------------------------------------------- orchestration

def passthrough(args: argparse.Namespace) -> list[str]:
    out = ["--peer", args.peer]
    for a in build_parser()._actions:
        if not a.option_strings or a.dest in ("help", "peer", "runs", "mode", "tag", "role", "cid", "outdir",
                                              "results", "workroot"):
            continue
        out += [a.option_strings[0], str(getattr(args, a.dest))]
    return out


def spawn(args: argparse.Namespace, role: str, outdir: str, cid: int = 0) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "bench.peer_bench", "role", "--role", role, "--cid", str(cid),
           "--outdir", outdir, *passthrough(args)]
    log = open(os.path.join(outdir, f"{role}{cid if role == 'consume' else ''}.log"), "wb")  # noqa: SIM115
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=str(REPO))


def wait_proc(p: subprocess.Popen[bytes], timeout: float) -> int | str:
    try:
        return p.wait(timeout)
    except subprocess.TimeoutExpired:
        p.kill()  # our own child, by PID
        p.wait(5)
        return "killed-timeout"


def pct(sorted_vals: Any, q: float) -> float:
    if not sorted_vals:
        return float("nan")
    i = min(len(sorted_vals) - 1, max(0, round(q * (len(sorted_vals) - 1))))
    return float(sorted_vals[i])


def start_server(args: argparse.Namespace, mod: Any, server_dir: str) -> Any:
    """The peer's server for one run. Redis gets a free port of its own, checked to be served by the process
    started (bench.own_redis), and passes it to the role processes in the environment."""
    if args.peer != "redis":
        return mod.start_server(server_dir, args)

    def hand_to_roles(port: int) -> None:
        os.environ[REDIS_PORT_ENV] = str(port)  # inherited by the role processes

    srv, _ = start_harness_redis(mod, server_dir, args, on_port=hand_to_roles)
    return srv


def one_run(args: argparse.Namespace, mod: Any, i: int) -> dict[str, Any]:
    workdir = os.path.join(args.workroot, args.peer, f"run{i}")
    shutil.rmtree(workdir, ignore_errors=True)
    os.makedirs(workdir)
    outdir = os.path.join(workdir, "out")
    os.makedirs(outdir)
    servers: list[Any] = []
    res: dict[str, Any] = dict(run=i)
    procs: list[subprocess.Popen[bytes]] = []
    try:
        srv = start_recorded(servers, lambda: start_server(args, mod, os.path.join(workdir, "server")))
        asyncio.run(asyncio.wait_for(mod.setup(args), 60))
        srv.start_sampling()
        consumers: list[subprocess.Popen[bytes]] = []

        def start_consumers() -> bool:
            for c in range(args.consumers):
                consumers.append(start_recorded(procs, functools.partial(spawn, args, "consume", outdir, c)))
            end = time.monotonic() + 60
            while time.monotonic() < end:
                if all(os.path.exists(os.path.join(outdir, f"c{c}.ready")) for c in range(args.consumers)):
                    return True
                if any(p.poll() is not None for p in consumers):
                    return False
                time.sleep(0.05)
            return False

        if args.mode == "live":
            res["consumers_ready"] = start_consumers()
        prod = start_recorded(procs, lambda: spawn(args, "produce", outdir))
        res["producer_rc"] = wait_proc(prod, args.deadline_s + 60)
        if args.mode == "backlog":
            res["consumers_ready"] = start_consumers()
        res["consumer_rc"] = [wait_proc(c, args.deadline_s + 60) for c in consumers]
        res.update(srv.stop_sampling())
    finally:
        kill_children(procs)
        for server in servers:
            server.stop()
    try:
        with open(os.path.join(outdir, "producer.json")) as f:
            pr = json.load(f)
        res["produce_msgs_per_s"] = pr["msgs_per_s"]
        res["producer"] = pr
    except OSError:
        res["produce_msgs_per_s"] = 0.0
    gids = array("I")
    lats = array("q")
    cons: list[dict[str, Any]] = []
    for c in range(args.consumers):
        try:
            with open(os.path.join(outdir, f"c{c}.json")) as f:
                cons.append(json.load(f))
            with open(os.path.join(outdir, f"c{c}.gids"), "rb") as fb:
                gids.frombytes(fb.read())
            with open(os.path.join(outdir, f"c{c}.lats"), "rb") as fb:
                lats.frombytes(fb.read())
        except OSError as e:
            cons.append(dict(cid=c, error=f"missing output: {e}"))
    received = len(gids)
    unique = len(set(gids))
    firsts = [c["first_ns"] for c in cons if c.get("first_ns")]
    lasts = [c["last_ns"] for c in cons if c.get("last_ns")]
    span = (max(lasts) - min(firsts)) / 1e9 if firsts and lasts else float("nan")
    sl = sorted(lats)
    n = args.messages
    producer_cpu = res.get("producer", {}).get("cpu_s")
    consumers_cpu = round(sum(c.get("cpu_s", 0) for c in cons), 2)
    server_cpu = res.get("server_cpu_s")
    res.update(
        consume_msgs_per_s=received / span if span and span > 0 else 0.0,
        consume_span_s=span,
        p50_ms=pct(sl, 0.50) / 1e6,
        p99_ms=pct(sl, 0.99) / 1e6,
        p999_ms=pct(sl, 0.999) / 1e6,
        max_ms=(sl[-1] / 1e6) if sl else float("nan"),
        # how far the paced producer fell behind its schedule (latency counts from the schedule: no
        # coordinated omission); None when unpaced
        pace_lag_s=res.get("producer", {}).get("pace_lag_s") if args.rate else None,
        violations=sum(c.get("violations", 0) for c in cons),
        received=received,
        unique=unique,
        lost=n - unique,
        dups=received - unique,
        consumers=cons,
        producer_cpu_s=producer_cpu,
        consumers_cpu_s=consumers_cpu,
        assignment={str(c.get("cid")): c.get("queues") for c in cons},
    )
    stage_rows = array("q")
    for c in range(args.consumers):
        try:
            with open(os.path.join(outdir, f"c{c}.stages"), "rb") as fh:
                stage_rows.frombytes(fh.read())
        except OSError:
            pass
    if stage_rows:
        res["stages_ms"] = mod.stage_breakdown(stage_rows)
    # CPU per message (the harness's definition: process CPU time / messages, start-up included), and the
    # part spent after each client process was ready (start-up, imports and workload generation excluded).
    us = 1e6 / n
    pr = res.get("producer", {})
    res["cpu_us_per_msg"] = {
        "server": round((server_cpu or 0) * us, 2),
        "producer": round((producer_cpu or 0) * us, 2),
        "consumers": round(consumers_cpu * us, 2),
    }
    res["cpu_us_per_msg"]["total"] = round(sum(res["cpu_us_per_msg"].values()), 2)
    if pr.get("cpu_before_produce_s") is not None and all("cpu_at_ready_s" in c for c in cons):
        steady_p = (producer_cpu or 0) - pr["cpu_before_produce_s"]
        steady_c = sum(c["cpu_s"] - c["cpu_at_ready_s"] for c in cons)
        res["cpu_us_per_msg_after_ready"] = {
            "producer": round(steady_p * us, 2), "consumers": round(steady_c * us, 2),
        }
    return res


MEDIAN_KEYS = ["produce_msgs_per_s", "consume_msgs_per_s", "p50_ms", "p99_ms", "p999_ms", "max_ms", "pace_lag_s",
               "violations", "lost", "dups",
               "server_rss_peak_tree_mb", "server_vmhwm_main_mb", "server_cpu_s", "producer_cpu_s",
               "consumers_cpu_s"]


def summarize(args: argparse.Namespace, mod: Any, runs: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in runs if "error" not in r]
    med: dict[str, Any] = {}
    rng: dict[str, Any] = {}
    for k in MEDIAN_KEYS:
        vals = [r[k] for r in ok if isinstance(r.get(k), int | float)]
        if vals:
            med[k] = statistics.median(vals)
            rng[k] = [min(vals), max(vals)]
    cpu: dict[str, Any] = {}
    for part in ("server", "producer", "consumers", "total"):
        vals = [r["cpu_us_per_msg"][part] for r in ok if "cpu_us_per_msg" in r]
        if vals:
            cpu[part] = statistics.median(vals)
    after: dict[str, Any] = {}
    for part in ("producer", "consumers"):
        vals = [r["cpu_us_per_msg_after_ready"][part] for r in ok if "cpu_us_per_msg_after_ready" in r]
        if vals:
            after[part] = statistics.median(vals)
    stages = [r["stages_ms"] for r in ok if r.get("stages_ms")]
    stages_med: dict[str, Any] = {}
    if stages:
        for name, qs in stages[0].items():
            if isinstance(qs, dict):
                stages_med[name] = {q: statistics.median(s[name][q] for s in stages if name in s) for q in qs}
    return dict(
        peer=args.peer, mode=args.mode, tag=args.tag, version=mod.version(), argv=sys.argv, rate=args.rate,
        stages_ms=stages_med,
        params={k: v for k, v in vars(args).items() if k not in ("cmd", "role", "cid", "outdir")},
        median=med, range=rng, cpu_us_per_msg=cpu, cpu_us_per_msg_after_ready=after, runs=runs, n_ok=len(ok),
        sum_violations=sum(r.get("violations", 0) for r in ok), sum_lost=sum(r.get("lost", 0) for r in ok),
        sum_dups=sum(r.get("dups", 0) for r in ok),
    )


def run_main(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """``--runs`` runs of each peer named, alternating (run i of every peer, then run i + 1); one summary per
    peer, written to ``<results>/<peer>-<mode>[-<tag>].json`` and returned by peer name."""
    peers = args.peer.split(",")
    per_peer = {name: argparse.Namespace(**{**vars(args), "peer": name}) for name in peers}
    mods = {name: peer_mod(name) for name in peers}
    os.makedirs(args.results, exist_ok=True)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in peers}
    for i in range(args.runs):
        for name in peers:
            t = time.monotonic()
            try:
                r = one_run(per_peer[name], mods[name], i)
            except Exception as e:
                r = dict(run=i, error=repr(e))
            r["wall_s"] = time.monotonic() - t
            runs[name].append(r)
            print(name, json.dumps({k: v for k, v in r.items() if k not in ("consumers", "producer")}, default=str),
                  flush=True)
    summaries: dict[str, dict[str, Any]] = {}
    for name in peers:
        summary = summaries[name] = summarize(per_peer[name], mods[name], runs[name])
        file_name = f"{name}-{args.mode}" + (f"-{args.tag}" if args.tag else "") + ".json"
        common.write_json(os.path.join(args.results, file_name), summary)
        print("MEDIAN", name, args.mode, args.tag, json.dumps(summary["median"]),
              json.dumps(summary["cpu_us_per_msg"]), flush=True)
    return summaries


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.cmd == "role":
        role_main(args)
    else:
        with raise_on_stop_signals(SystemExit):  # a SIGTERM or hang-up ends the run's server and roles too
            run_main(args)


if __name__ == "__main__":
    main()
