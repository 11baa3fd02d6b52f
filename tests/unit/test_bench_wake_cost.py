"""bench.wake_cost measures the CPU of one unit of work back to back and after idle gaps (a diagnostic of the
machine; the benchmarks never run in tests, and nothing here asserts a timing)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bench import wake_cost


def test_every_mode_of_both_works_is_measured_and_reported() -> None:
    results = wake_cost.run(reps=2, calls=3, calls_slow=2)
    assert set(results) == {"python", "C"}
    for modes in results.values():
        assert list(modes) == [label for label, _, _ in wake_cost.MODES]
        assert all(len(blocks) == 2 and all(b >= 0 for b in blocks) for blocks in modes.values())
    table = wake_cost.report(results)
    assert "| python | after 10 ms asleep |" in table and "| C | back to back |" in table
    assert table.count("\n") == 2 * len(wake_cost.MODES) + 1


def test_the_python_work_is_a_pull_answer_decoded_and_a_pull_encoded() -> None:
    # 12 records read, and the next PULL_MESSAGE frame's length on top
    assert wake_cost.python_work()() > 12


def test_main_writes_the_blocks_as_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wake_cost, "run", lambda reps: {"C": {label: [1.0] * reps for label, _, _ in wake_cost.MODES}})
    out = tmp_path / "wake.json"
    assert wake_cost.main(["--reps", "2", "--cpu", "-1", "--json", str(out)]) == 0
    saved = json.loads(out.read_text())
    assert saved["results"]["C"]["back to back"] == [1.0, 1.0]


@pytest.mark.parametrize("argv, said", [(["--reps", "0"], "--reps 0: at least one round"),
                                        (["--cpu", "4096"], "--cpu 4096: cannot pin this process there")])
def test_bad_arguments_are_refused_before_anything_runs(argv: list[str], said: str, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(wake_cost, "run", lambda reps: pytest.fail("ran with bad arguments"))
    before = os.sched_getaffinity(0)
    with pytest.raises(SystemExit) as stop:
        wake_cost.main(argv)
    assert stop.value.code == 2
    assert said in capsys.readouterr().err
    assert os.sched_getaffinity(0) == before  # the test process is not pinned by a refused call
