"""bench.wakes counts the voluntary context switches of a run's processes by role, from /proc (a fake tree here:
the benchmarks never run in tests)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from bench.wakes import SwitchCounter, count_switches, main, report, role_of, windows_of


def _process(proc: Path, pid: int, cmdline: list[str], switches: dict[int, int],
             children: dict[int, list[int]] | None = None) -> None:
    (proc / str(pid) / "task").mkdir(parents=True)
    (proc / str(pid) / "cmdline").write_bytes(b"\0".join(a.encode() for a in cmdline) + b"\0")
    for tid, n in switches.items():
        (proc / str(pid) / "task" / str(tid)).mkdir()
        (proc / str(pid) / "task" / str(tid) / "status").write_text(
            f"Name:\tpython\nvoluntary_ctxt_switches:\t{n}\nnonvoluntary_ctxt_switches:\t7\n")
        kids = (children or {}).get(tid, [])
        (proc / str(pid) / "task" / str(tid) / "children").write_text("".join(f"{k} " for k in kids))


def test_roles_of_a_runs_processes() -> None:
    assert role_of("redis-server 127.0.0.1:6379") == "server"
    assert role_of("/venv/bin/python3 /venv/bin/trimq-broker --listen 127.0.0.1:0") == "server"
    assert role_of("python -m bench.instrumented_broker taskstats broker --listen x") == "server"
    assert role_of("python -m bench.peer_bench role --role produce --cid 0 --peer trimq") == "producer"
    assert role_of("python -m bench.peer_bench role --role consume --cid 1 --peer redis") == "consumers"
    assert role_of("python -m bench.peer_bench run --peer redis,trimq --rate 10000") is None  # the orchestrator
    assert role_of("bash") is None


def test_switches_are_summed_by_role_and_a_thread_that_ended_still_counts(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    # the run's tree: 1 (the orchestrator) started 10 and 20, whose second thread started 21; 30 is not the run's
    _process(proc, 1, ["python", "-m", "bench.peer_bench", "run", "--peer", "trimq"], {1: 4}, {1: [10, 20]})
    _process(proc, 10, ["trimq-broker", "--listen", "x"], {10: 5, 11: 2})
    _process(proc, 20, ["python", "-m", "bench.peer_bench", "role", "--role", "consume", "--cid", "0"], {20: 1, 21: 40},
             {21: [21]})
    _process(proc, 21, ["python", "-m", "bench.peer_bench", "role", "--role", "consume", "--cid", "1"], {21: 30})
    _process(proc, 30, ["redis-server", "another run's"], {30: 99})
    (proc / "self").mkdir()
    counter = SwitchCounter(str(proc))
    counter.poll(1)
    assert counter.by_role() == {"server": 7, "consumers": 71}
    # consumer 0's trio thread ends before the process: its last count is kept
    shutil.rmtree(proc / "20" / "task" / "21")
    (proc / "20" / "task" / "20" / "status").write_text("voluntary_ctxt_switches:\t3\n")
    (proc / "20" / "task" / "20" / "children").write_text("21 ")  # the thread that had started 21 is gone
    counter.poll(1)
    assert counter.by_role() == {"server": 7, "consumers": 73}
    text = report({"trimq": [counter.by_role()]}, windows=10)
    assert "| trimq | 0.70 | 0.00 | 7.30 | 8.00 | 1 |" in text


def test_a_real_process_tree_is_followed_and_a_failed_run_raises(tmp_path: Path) -> None:
    # a child whose command line says it is a consumer role, below a parent that waits for it
    child = "import time; [time.sleep(0.002) for _ in range(100)]"
    parent = ("import subprocess, sys; subprocess.run([sys.executable, '-c', sys.argv[1], 'bench.peer_bench', 'role',"
              " '--role', 'consume'], check=True)")
    got = count_switches([sys.executable, "-c", parent, child], cwd=tmp_path)
    assert set(got) == {"consumers"} and got["consumers"] >= 10  # it slept 100 times; the polls, every 10 ms, see most
    with pytest.raises(RuntimeError, match="exited with 3"):
        count_switches([sys.executable, "-c", "raise SystemExit(3)"], cwd=tmp_path)


def test_windows_follow_the_harness_batch_and_bad_values_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert windows_of(100_000, 100) == 1000
    assert windows_of(100_000, 64) == 1563  # the last window is short, and it still wakes everyone
    for messages, batch in ((100_000, 0), (0, 100), (100, -1)):
        with pytest.raises(ValueError, match="must be positive"):
            windows_of(messages, batch)
    with pytest.raises(SystemExit) as stop:
        main(["--batch", "0"])  # refused before any run starts
    assert stop.value.code == 2
    assert "batch (0) must be positive" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        main(["--rounds", "0"])  # no run, so no median to report
    assert stop.value.code == 2
    assert "--rounds 0: at least one run" in capsys.readouterr().err
