"""Fuzz the frame decoder and the commit-log record decoder (``make fuzz``).

    python -m tests.fuzz.fuzz_decoders [--seconds 60] [--seed N] [--target frame|record|both]
    python -m tests.fuzz.fuzz_decoders --replay crash-file.bin --target frame

With atheris importable (it is not a dependency) the run is coverage-guided by libFuzzer; otherwise a
seeded random-mutation driver runs over a corpus of valid frames and records (tests/fuzz/mutators.py).
Both stop after ``--seconds``. Invariants checked on every input:

* frame (``protocol.frame.FrameDecoder``), the input fed in random chunk sizes:
  only ProtocolError is ever raised; after a ProtocolError nothing stays buffered; after a successful feed
  at most one incomplete frame is buffered (``buffered < 4 + max_frame_bytes``, so a peer cannot make the
  decoder hold more than its limit); every command returned has int code/opaque/flag/version, a str-keyed
  ext, and survives re-encoding (encode → decode gives the same msgpack map).
* record (``protocol.record.decode_record`` / ``iter_records``), with and without CRC checks, at offset 0
  and at a random offset: only RecordError is ever raised and a decoded record fits in the buffer.

On a violation the input is written to ``--crash-dir`` (default ./fuzz-crashes) and the run exits 1.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import msgpack

from trimq.protocol.errors import ProtocolError, RecordError
from trimq.protocol.frame import LENGTH_PREFIX_BYTES, FrameDecoder, decode_payload, encode_frame
from trimq.protocol.record import decode_record, iter_records

from .mutators import Mutator, seed_frames, seed_records

FUZZ_MAX_FRAME_BYTES = 4096  # small, so mutated length prefixes hit both sides of the limit


class InvariantViolation(AssertionError):
    """A decoder broke one of the fuzz invariants."""


@dataclass
class Stats:
    executions: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)
    max_buffered: int = 0


def check_frame_input(data: bytes, splits: list[int], stats: Stats | None = None,
                      max_frame_bytes: int = FUZZ_MAX_FRAME_BYTES) -> None:
    """Feed ``data`` to a FrameDecoder in chunks of ``splits``; raise InvariantViolation on a broken rule."""
    dec = FrameDecoder(max_frame_bytes)
    pos = 0
    outcome = "ok"
    for size in splits:
        chunk = data[pos : pos + size]
        pos += size
        try:
            cmds = dec.feed(chunk)
        except ProtocolError as exc:
            if dec.buffered:
                raise InvariantViolation(f"{dec.buffered} bytes still buffered after {exc!r}") from exc
            outcome = type(exc).__name__
            break
        except Exception as exc:
            raise InvariantViolation(f"FrameDecoder.feed raised {exc!r}, not a ProtocolError") from exc
        if dec.buffered >= LENGTH_PREFIX_BYTES + max_frame_bytes:
            raise InvariantViolation(f"{dec.buffered} bytes buffered, limit {max_frame_bytes} + prefix")
        if stats is not None:
            stats.max_buffered = max(stats.max_buffered, dec.buffered)
        for cmd in cmds:
            _check_command(cmd)
    if stats is not None:
        stats.outcomes["frame:" + outcome] += 1


def _check_command(cmd: object) -> None:
    from trimq.protocol.command import RemotingCommand

    if not isinstance(cmd, RemotingCommand):
        raise InvariantViolation(f"decoder returned {type(cmd).__name__}")
    for name in ("code", "opaque", "flag", "version"):
        if type(getattr(cmd, name)) is not int:
            raise InvariantViolation(f"decoded {name} is {type(getattr(cmd, name)).__name__}")
    if not isinstance(cmd.ext, dict) or not all(isinstance(k, str) for k in cmd.ext):
        raise InvariantViolation("decoded ext is not a str-keyed map")
    try:
        frame = encode_frame(cmd, 2**31)
    except (ValueError, OverflowError, TypeError):
        return  # nested deeper than the packer allows: not a decoder property
    again = decode_payload(frame[LENGTH_PREFIX_BYTES:])
    if msgpack.packb(again.to_map()) != msgpack.packb(cmd.to_map()):
        raise InvariantViolation(f"command changed across encode/decode: {cmd!r} -> {again!r}")


def check_record_input(data: bytes, offset: int, stats: Stats | None = None) -> None:
    """Decode ``data`` as records; raise InvariantViolation when anything but RecordError escapes."""
    outcome = "RecordError"
    for check_crc in (True, False):
        for pos in {0, offset}:
            try:
                msg = decode_record(data, pos, check_crc=check_crc)
                if msg.store_size > len(data) - pos:
                    raise InvariantViolation(f"record at {pos} claims {msg.store_size} bytes of {len(data) - pos}")
                if check_crc or outcome == "RecordError":
                    outcome = "decoded" if check_crc else "decoded-without-crc"
            except RecordError:
                pass
            except InvariantViolation:
                raise
            except Exception as exc:
                raise InvariantViolation(f"decode_record(pos={pos}, check_crc={check_crc}) raised {exc!r}") from exc
        try:
            for msg in iter_records(data, check_crc=check_crc):
                if msg.store_size <= 0:
                    raise InvariantViolation("iter_records yielded a record of size <= 0")
        except RecordError:
            pass
        except InvariantViolation:
            raise
        except Exception as exc:
            raise InvariantViolation(f"iter_records(check_crc={check_crc}) raised {exc!r}") from exc
    if stats is not None:
        stats.outcomes["record:" + outcome] += 1


# -- the random-mutation driver --------------------------------------------------------------------------------


def _save_crash(crash_dir: str, target: str, data: bytes) -> str:
    os.makedirs(crash_dir, exist_ok=True)
    path = os.path.join(crash_dir, f"{target}-{hashlib.sha1(data).hexdigest()[:16]}.bin")
    with open(path, "wb") as fh:
        fh.write(data)
    return path


def run_random(*, seconds: float, seed: int, targets: list[str], iterations: int | None = None,
               crash_dir: str = "fuzz-crashes", log: Callable[[str], None] = print) -> Stats:
    """Mutate the seed corpus until ``seconds`` pass (or ``iterations`` ran). Raises InvariantViolation."""
    rng = random.Random(seed)
    mut = Mutator(rng)
    corpora = {"frame": seed_frames(), "record": seed_records()}
    stats = Stats()
    deadline = time.monotonic() + seconds
    next_report = time.monotonic() + 10
    i = 0
    while (iterations is None or i < iterations) and (iterations is not None or time.monotonic() < deadline):
        target = targets[i % len(targets)]
        corpus = corpora[target]
        r = rng.random()
        if r < 0.05:
            data = mut.random_bytes(512)
        elif r < 0.1:
            data = rng.choice(corpus)  # unmodified: the valid path must keep working
        else:
            data = mut.mutate_bytes(rng.choice(corpus), corpus)
        try:
            if target == "frame":
                check_frame_input(data, mut.splits(len(data)), stats)
            else:
                check_record_input(data, rng.randrange(len(data) + 1), stats)
        except InvariantViolation:
            path = _save_crash(crash_dir, target, data)
            log(f"INVARIANT VIOLATED (target={target}, seed={seed}, iteration={i}); input saved to {path}")
            log(f"input (hex, first 2 KiB): {data[:2048].hex()}")
            raise
        stats.executions[target] += 1
        i += 1
        if time.monotonic() >= next_report:
            next_report += 10
            log(f"... {sum(stats.executions.values())} inputs, outcomes {dict(stats.outcomes)}")
    return stats


# -- atheris ---------------------------------------------------------------------------------------------------


def run_atheris(*, seconds: float, targets: list[str], extra: list[str]) -> None:
    """Coverage-guided fuzzing with atheris (libFuzzer). Crashes are reported and saved by libFuzzer."""
    import atheris  # type: ignore[import-not-found]

    if hasattr(atheris, "instrument_all"):
        atheris.instrument_all()

    def one_input(data: bytes) -> None:
        fdp = atheris.FuzzedDataProvider(data)
        target = targets[fdp.ConsumeIntInRange(0, len(targets) - 1)]
        cut_seed = fdp.ConsumeIntInRange(0, 2**16)
        payload = fdp.ConsumeBytes(fdp.remaining_bytes())
        if target == "frame":
            check_frame_input(payload, Mutator(random.Random(cut_seed)).splits(len(payload)))
        else:
            check_record_input(payload, cut_seed % (len(payload) + 1))

    atheris.Setup([sys.argv[0], f"-max_total_time={int(seconds)}", *extra], one_input)
    atheris.Fuzz()


def _have_atheris() -> bool:
    try:
        import atheris  # noqa: F401
    except ImportError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz.fuzz_decoders", description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="stop after this long (default 60)")
    parser.add_argument("--seed", type=int, default=None, help="random driver seed (default: time-based)")
    parser.add_argument("--iterations", type=int, default=None, help="random driver: stop after N inputs")
    parser.add_argument("--target", choices=("frame", "record", "both"), default="both")
    parser.add_argument("--engine", choices=("auto", "atheris", "random"), default="auto")
    parser.add_argument("--crash-dir", default="fuzz-crashes")
    parser.add_argument("--replay", metavar="FILE", help="run one saved input and report")
    args, extra = parser.parse_known_args(argv)
    targets = ["frame", "record"] if args.target == "both" else [args.target]
    if args.replay:
        with open(args.replay, "rb") as fh:
            data = fh.read()
        try:
            for t in targets:
                if t == "frame":
                    check_frame_input(data, [len(data)])
                    check_frame_input(data, [1] * len(data))
                else:
                    check_record_input(data, 0)
        except InvariantViolation:
            traceback.print_exc()
            return 1
        print(f"{args.replay}: no invariant violated")
        return 0
    engine = args.engine
    if engine == "auto":
        engine = "atheris" if _have_atheris() else "random"
    if engine == "atheris":
        print(f"fuzz: atheris, targets {targets}, {args.seconds:.0f}s")
        run_atheris(seconds=args.seconds, targets=targets, extra=extra)
        return 0
    seed = args.seed if args.seed is not None else int(time.time())
    print(f"fuzz: random-mutation driver (atheris not installed), seed {seed}, targets {targets}, "
          f"{args.seconds:.0f}s")
    started = time.monotonic()
    try:
        stats = run_random(seconds=args.seconds, seed=seed, targets=targets, iterations=args.iterations,
                           crash_dir=args.crash_dir)
    except InvariantViolation:
        traceback.print_exc()
        return 1
    took = time.monotonic() - started
    total = sum(stats.executions.values())
    print(f"fuzz: {total} inputs in {took:.1f}s ({total / max(took, 1e-9):.0f}/s), no invariant violated; "
          f"outcomes {dict(stats.outcomes)}; largest partial frame buffered {stats.max_buffered} bytes "
          f"(limit {FUZZ_MAX_FRAME_BYTES})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
