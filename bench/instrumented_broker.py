"""``trimq-broker`` under one of the benchmark's instruments, for the diagnostic runs of bench.peer_trimq.

    python -m bench.instrumented_broker sample OUT BROKER_FLAGS...     # stack samples on CPU time -> OUT (text)
    python -m bench.instrumented_broker profile OUT BROKER_FLAGS...    # cProfile on CPU time -> OUT (pstats)
    python -m bench.instrumented_broker taskstats NAME BROKER_FLAGS... # a recorder module of bench: install()
    python -m bench.instrumented_broker gcstats NAME BROKER_FLAGS...   #   before the broker, write(NAME) after

The broker runs in this process's main thread, as ``trimq-broker`` would; the instrument's output is written when
it stops (the harness stops it with SIGTERM, a clean shutdown).
"""

from __future__ import annotations

import importlib
import sys
import threading
import time

#: bench modules with ``install()`` (before ``trio.run``) and ``write(name)`` (after it)
RECORDERS = ("taskstats", "gcstats")
INSTRUMENTS = ("sample", "profile", *RECORDERS)


def main(argv: list[str] | None = None) -> None:
    instrument, out, *flags = sys.argv[1:] if argv is None else argv
    if instrument not in INSTRUMENTS:
        raise SystemExit(f"unknown instrument {instrument!r}: one of {', '.join(INSTRUMENTS)}")
    sys.argv = ["trimq-broker", *flags]
    recorder = importlib.import_module(f"bench.{instrument}") if instrument in RECORDERS else None
    if recorder is not None:
        recorder.install()  # before the broker's modules: every trio.run from here on carries it
    from trimq.tools.broker import main as broker_main

    if instrument == "sample":
        from bench.sampler import CpuSampler

        sampler = CpuSampler(threading.get_ident()).__enter__()
        try:
            broker_main(standalone_mode=False)
        finally:
            sampler.__exit__()
            with open(out, "w") as fh:
                fh.write(sampler.report(70))
    elif instrument == "profile":
        import cProfile

        profile = cProfile.Profile(time.process_time)
        try:
            profile.runcall(broker_main, standalone_mode=False)
        finally:
            profile.dump_stats(out)
    else:
        assert recorder is not None
        try:
            broker_main(standalone_mode=False)
        finally:
            recorder.write(out)


if __name__ == "__main__":
    main()
