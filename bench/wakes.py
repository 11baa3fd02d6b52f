"""How often each process of a paced run blocks and wakes again, Redis's and trimq's (bench/RESULTS.md, *The
cost of waking up*).

    python -m bench.wakes [--rate 10000] [--rounds 2] [--messages 100000] [--batch 100]

Runs ``bench.peer_bench run --runs 1`` for Redis and trimq alternately and, while each runs, polls ``/proc``
every 10 ms for the run's own server and role processes (the run's process tree, through each thread's
``children`` file, so another Redis on the machine does not count and the poller reads a few processes, not all):
the voluntary context switches of every thread (a thread
switches voluntarily when it blocks: in its event loop's wait, on a lock, in a sleep), kept at the highest value
seen per thread so a thread that ends before the process still counts. Divided by the run's windows (messages /
the harness's batch, 100 unless ``--batch`` says otherwise), that is how many times per window each process went
to sleep and was woken, which on this machine is what a paced window costs beyond its work.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.stop_signals import children_ended_on_error, raise_on_stop_signals, start_recorded

#: Command lines of a run's processes: the servers and the harness's role processes (not the orchestrator).
PROCESS_PATTERN = re.compile(r"redis-server|trimq-broker|instrumented_broker|bench\.peer_bench role")
_ROLE = re.compile(r"--role (produce|consume)\b")
_REPO = Path(__file__).resolve().parents[1]


def role_of(cmdline: str) -> str | None:
    """``server``, ``producer`` or ``consumers`` for a run's process, None for anything else."""
    if not PROCESS_PATTERN.search(cmdline):
        return None
    m = _ROLE.search(cmdline)
    if m is None:
        return "server"
    return "producer" if m.group(1) == "produce" else "consumers"


class SwitchCounter:
    """Voluntary context switches of every thread of the processes :func:`role_of` names, by role."""

    def __init__(self, proc: str = "/proc") -> None:
        self.proc = proc
        self.roles: dict[str, str] = {}  # pid -> role
        self.switches: dict[tuple[str, str], int] = {}  # (pid, tid) -> the most seen

    def descendants(self, root: int) -> dict[str, list[str]]:
        """The pids below ``root`` (children of every thread, recursively), each with the thread ids read on the
        way, so a poll lists each process's threads once; those gone meanwhile are skipped."""
        found: dict[str, list[str]] = {}
        todo = [str(root)]
        while todo:
            pid = todo.pop()
            try:
                tids = os.listdir(os.path.join(self.proc, pid, "task"))
            except OSError:
                continue
            if pid != str(root):
                found[pid] = tids
            for tid in tids:
                try:
                    children = Path(self.proc, pid, "task", tid, "children").read_text().split()
                except OSError:
                    continue
                todo += children
        return found

    def poll(self, root: int) -> None:
        """Read the threads of every process below ``root`` that :func:`role_of` names, once. A process is looked
        at afresh on every poll: a child between its fork and its exec still has its parent's command line."""
        for pid, tids in self.descendants(root).items():
            try:
                cmdline = Path(self.proc, pid, "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue  # gone meanwhile
            role = role_of(cmdline)
            if role is None:
                continue
            self.roles[pid] = role
            for tid in tids:
                got = _voluntary(os.path.join(self.proc, pid, "task", tid, "status"))
                if got is not None and got > self.switches.get((pid, tid), -1):
                    self.switches[(pid, tid)] = got

    def by_role(self) -> dict[str, int]:
        """Total voluntary switches per role."""
        out: dict[str, int] = {}
        for (pid, _), n in self.switches.items():
            role = self.roles[pid]
            out[role] = out.get(role, 0) + n
        return out


def _voluntary(status_path: str) -> int | None:
    try:
        with open(status_path) as f:
            for line in f:
                if line.startswith("voluntary_ctxt_switches:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def count_switches(cmd: list[str], cwd: Path = _REPO) -> dict[str, int]:
    """Run ``cmd`` and poll its process tree until it ends; the switches per role. Raises RuntimeError when it
    exits with an error."""
    counter = SwitchCounter()
    with children_ended_on_error() as runs:  # ^C, SIGTERM or a hang-up: the run ends its brokers and clients first
        run = start_recorded(runs, lambda: subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL,
                                                            stderr=subprocess.DEVNULL))
        while run.poll() is None:
            counter.poll(run.pid)
            time.sleep(0.01)
    if run.returncode:
        raise RuntimeError(f"{' '.join(cmd)} exited with {run.returncode}")
    return counter.by_role()


def run_one(peer: str, rate: int, messages: int, results: str, batch: int = 100) -> dict[str, int]:
    """One ``peer_bench`` run of ``peer`` at ``rate`` in windows of ``batch`` messages; its switches per role."""
    return count_switches([sys.executable, "-m", "bench.peer_bench", "run", "--peer", peer, "--mode", "live",
                           "--rate", str(rate), "--runs", "1", "--messages", str(messages), "--batch", str(batch),
                           "--results", results])


def windows_of(messages: int, batch: int) -> int:
    """How many windows a run of ``messages`` sends in ``batch``-message windows (the last one may be short)."""
    if messages <= 0 or batch <= 0:
        raise ValueError(f"messages ({messages}) and batch ({batch}) must be positive")
    return -(-messages // batch)


def report(rows: dict[str, list[dict[str, int]]], windows: int) -> str:
    """A markdown table: per system, the median over rounds of each role's wakes per window."""
    roles = ("server", "producer", "consumers")
    lines = ["| system | " + " | ".join(f"{r} wakes / window" for r in roles) + " | total | rounds |",
             "|---|" + "---:|" * (len(roles) + 2)]
    for peer, runs in rows.items():
        cells = [statistics.median(run.get(r, 0) for run in runs) / windows for r in roles]
        lines.append(f"| {peer} | " + " | ".join(f"{c:.2f}" for c in cells) + f" | {sum(cells):.2f} | {len(runs)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rate", type=int, default=10_000, help="offered msg/s (the harness's --rate)")
    p.add_argument("--rounds", type=int, default=2, help="runs of each system, alternating")
    p.add_argument("--messages", type=int, default=100_000)
    p.add_argument("--batch", type=int, default=100, help="messages per window (the harness's --batch)")
    p.add_argument("--results", default="/tmp/trimq-wakes", help="where the runs' result files go")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error(f"--rounds {args.rounds}: at least one run of each system is needed for a median")
    try:
        windows = windows_of(args.messages, args.batch)
    except ValueError as exc:
        p.error(str(exc))
    rows: dict[str, list[dict[str, int]]] = {"redis": [], "trimq": []}
    with raise_on_stop_signals(SystemExit):
        for _ in range(args.rounds):
            for peer in rows:
                rows[peer].append(run_one(peer, args.rate, args.messages, os.path.join(args.results, peer),
                                          args.batch))
    print(report(rows, windows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
