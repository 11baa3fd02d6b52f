"""``trimq-broker`` under one of the benchmark's instruments, for the diagnostic runs of bench.peer_trimq.

    python -m bench.instrumented_broker sample OUT BROKER_FLAGS...     # stack samples on CPU time -> OUT (text)
    python -m bench.instrumented_broker profile OUT BROKER_FLAGS...    # cProfile on CPU time -> OUT (pstats)
    python -m bench.instrumented_broker taskstats NAME BROKER_FLAGS... # a recorder module of bench: install()
    python -m bench.instrumented_broker gcstats NAME BROKER_FLAGS...   #   before the broker, write(NAME) after

The broker runs in this process's main thread, as ``trimq-broker`` would; the instrument's output is written when
it stops (the harness stops it with SIGTERM, a clean shutdown). The recorders are bench.recorders', which the
benchmark's client processes (``bench.peer_trimq``) use too.
"""

from __future__ import annotations

import sys
import time

from bench.recorders import RECORDERS, recording

INSTRUMENTS = ("sample", "profile", *RECORDERS)


def _run_broker() -> None:
    """``trimq-broker`` with ``sys.argv``'s flags, in this thread, until it stops. Imported here, not at the top:
    a recorder must be installed before the broker's modules load. A bad flag is the CLI's own message and exit
    code, as ``trimq-broker`` gives it (the instrument still writes what it has)."""
    import click

    from trimq.tools.broker import main as broker_main

    try:
        broker_main(prog_name="trimq-broker", standalone_mode=False)
    except click.ClickException as exc:
        exc.show()
        raise SystemExit(exc.exit_code) from None


def main(argv: list[str] | None = None) -> None:
    instrument, out, *flags = sys.argv[1:] if argv is None else argv
    if instrument not in INSTRUMENTS:
        raise SystemExit(f"unknown instrument {instrument!r}: one of {', '.join(INSTRUMENTS)}")
    sys.argv = ["trimq-broker", *flags]
    if instrument in RECORDERS:
        with recording(instrument, out):
            _run_broker()
    elif instrument == "sample":
        from bench.sampler import sampled_to

        with sampled_to(out, 70):
            _run_broker()
    else:
        import cProfile

        profile = cProfile.Profile(time.process_time)
        try:
            profile.runcall(_run_broker)
        finally:
            profile.dump_stats(out)


if __name__ == "__main__":
    main()
