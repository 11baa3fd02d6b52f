"""A short, seeded run of the decoder fuzzer inside ``make test`` (the long one is ``make fuzz``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trimq.protocol.frame import FrameDecoder

from . import fuzz_decoders
from .fuzz_decoders import InvariantViolation, check_frame_input, check_record_input, main, run_random
from .mutators import seed_frames, seed_records


def test_seeded_run_finds_nothing(tmp_path: Path) -> None:
    stats = run_random(seconds=0, seed=20240601, targets=["frame", "record"], iterations=4000,
                       crash_dir=str(tmp_path), log=lambda _m: None)
    assert stats.executions["frame"] == stats.executions["record"] == 2000
    # the corpus reaches both the accepting and the refusing paths of each decoder
    assert stats.outcomes["frame:ok"] and stats.outcomes["frame:MalformedPayloadError"]
    assert stats.outcomes["frame:FrameTooLargeError"]
    assert stats.outcomes["record:decoded"] and stats.outcomes["record:RecordError"]
    assert not any(tmp_path.iterdir())


def test_seeds_are_valid() -> None:
    for frame in seed_frames():
        assert FrameDecoder().feed(frame)
        check_frame_input(frame, [1] * len(frame))
    for rec in seed_records():
        check_record_input(rec, 0)


def test_a_decoder_bug_is_caught_and_saved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken_feed(self: FrameDecoder, data: bytes) -> list[object]:
        raise KeyError("planted")

    monkeypatch.setattr(fuzz_decoders.FrameDecoder, "feed", broken_feed)
    with pytest.raises(InvariantViolation, match="not a ProtocolError"):
        run_random(seconds=0, seed=1, targets=["frame"], iterations=10, crash_dir=str(tmp_path),
                   log=lambda _m: None)
    (saved,) = tmp_path.iterdir()
    assert main(["--replay", str(saved), "--target", "frame"]) == 1


def test_command_line_run(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["--seconds", "0.2", "--seed", "3", "--engine", "random", "--crash-dir", str(tmp_path)]) == 0
    assert "no invariant violated" in capsys.readouterr().out
