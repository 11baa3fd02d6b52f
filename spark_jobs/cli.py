"""``trimq-audit``: audit a store directory with Spark and write Parquet tables, summary.json, report.html.

Exit codes: 0 clean, 1 defects found, 2 usage error, 3 the audit itself failed (e.g. Spark could not
start). See docs/AUDIT.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

import trimq
from trimq.spark_jobs.parser import DEFAULT_SPLIT_SIZE

EXIT_CLEAN, EXIT_DEFECTS, EXIT_USAGE, EXIT_ERROR = 0, 1, 2, 3

#: The audit's driver JVM compiles with C1 alone, unless it writes the records table. The audit's JVM work is planning
#: and some twenty small jobs (the readers aggregate in Python), which a JVM that lives a minute or two runs mostly
#: before C2 has paid for its compiles: on 2 cores, local[2], 10M records 94.6 -> 80.1 s and 1M 49.4 -> 39.8 s. Turning
#: every record into a row is the hot loop C2 is for: ``--write-records`` on 3M records took 96.4 s with C1 against
#: 83.9 s with C2 (docs/AUDIT.md). On a cluster only the driver is affected.
AUDIT_CONF = {"spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1"}


def audit_conf(user_conf: Mapping[str, str], *, write_records: bool = False) -> dict[str, str]:
    """The settings trimq-audit's session starts with: :data:`AUDIT_CONF` (not with ``write_records``), then the
    user's ``--conf``. JVM options add after ours, so ``--conf spark.driver.extraJavaOptions=-XX:TieredStopAtLevel=4``
    takes C2 back."""
    from trimq.spark_jobs.session import merge_conf

    return merge_conf({} if write_records else AUDIT_CONF, user_conf)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="trimq-audit",
        description="Audit a trimq / RocketMQ 4.x store: integrity, queue offsets, consume queues, per-key "
        "order, retry/DLQ lineage, consumer lag, throughput. Exit 0 clean, 1 defects, 2 usage error.",
    )
    p.add_argument("--version", action="version", version=f"trimq-audit {trimq.__version__}")
    p.add_argument("--store", help="store directory (holding commitlog/, consumequeue/, config/)")
    p.add_argument("--out", help="output directory for the Parquet tables, summary.json and report.html")
    p.add_argument("--master", default=None,
                   help="Spark master (default local[*]; under spark-submit, what spark-submit was given)")
    p.add_argument("--offsets", help="consumerOffset.json (default: <store>/config/consumerOffset.json if present)")
    p.add_argument("--since", help="audit records stored from this time: epoch ms, ISO time, or a duration "
                   "before now such as 24h")
    p.add_argument("--split-size", default=str(DEFAULT_SPLIT_SIZE),
                   help="bytes of commit log per Spark partition (default 64m; k/m/g suffixes)")
    p.add_argument("--examples", type=int, default=20, help="examples kept per check (default 20)")
    p.add_argument("--top-keys", type=int, default=10, help="poison keys listed per group (default 10)")
    p.add_argument("--fail-on-dlq", action="store_true", help="count dead-letter arrivals as defects (exit 1)")
    p.add_argument("--write-records", action="store_true",
                   help="also write the records table (the audited records, no bodies; off by default: it costs "
                   "about as much as the checks)")
    p.add_argument("--no-records", action="store_true", help=argparse.SUPPRESS)  # the default now; kept for scripts
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="extra Spark setting")
    p.add_argument("--py-files", dest="py_files", action="store_true",
                   help="ship the audit code (trimq/spark_jobs, trimq/protocol) to the executors as a zip "
                   "(default for non-local masters)")
    p.add_argument("--write-py-files", metavar="ZIP",
                   help="only write that zip (for spark-submit --py-files), then exit")
    p.add_argument("--json", action="store_true", help="print summary.json to stdout instead of a table")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    return p


def _print_table(summary: dict[str, Any]) -> None:
    rec = summary["records"]
    print(f"store   {summary['store']}")
    print(f"records {rec['messages']} messages, {rec['malformed_rows']} malformed region(s) in "
          f"{rec['segments']} segment(s)")
    print(f"{'check':<18} {'severity':<8} {'findings':>9}  by kind")
    for name, res in summary["checks"].items():
        kinds = ", ".join(f"{k}={v}" for k, v in sorted(res["by_kind"].items()))
        count = res["count"] if res.get("checked", True) else "-"
        print(f"{name:<18} {res['severity']:<8} {count!s:>9}  {kinds}")
    lin = summary["lineage"]
    print(f"lineage {lin['chains']} retried message(s), {lin['dlq_arrivals']} dead letter(s); "
          f"lag total {summary['lag']['total_lag']}")
    verdict = "CLEAN" if summary["clean"] else f"{summary['defects']} DEFECT(S)"
    print(f"result  {verdict}; report {summary['outputs'].get('report')}")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the audit; returns the exit code (the console script exits with it)."""
    args = _parser().parse_args(argv)
    from trimq.spark_jobs.audit import AuditOptions, UsageError, parse_since, run_audit, validate
    from trimq.spark_jobs.commitlog_source import OptionError, parse_size

    if args.write_py_files:
        from trimq.spark_jobs.session import build_deps_zip

        print(build_deps_zip(args.write_py_files))
        return EXIT_CLEAN
    try:
        if not args.store or not args.out:
            raise UsageError("--store and --out are required")
        try:
            split_size = parse_size(args.split_size, "--split-size")
        except OptionError as exc:
            raise UsageError(str(exc)) from None
        conf: dict[str, str] = {}
        for item in args.conf:
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                raise UsageError(f"--conf {item!r}: expected KEY=VALUE")
            conf[key.strip()] = value
        opts = AuditOptions(
            store=args.store,
            out=args.out,
            offsets=args.offsets,
            since_ms=parse_since(args.since) if args.since else None,
            split_size=split_size,
            example_limit=args.examples,
            top_keys=args.top_keys,
            fail_on_dlq=args.fail_on_dlq,
            write_records=args.write_records and not args.no_records,
            extra={"progress": not args.quiet},
        )
        validate(opts)
    except UsageError as exc:
        print(f"trimq-audit: error: {exc}", file=sys.stderr)
        return EXIT_USAGE

    from trimq.spark_jobs.session import build_deps_zip, build_session, is_local_master, stop_session

    py_files: list[str] = []
    tmp = None
    if args.py_files or (args.master is not None and not is_local_master(args.master)):
        tmp = tempfile.TemporaryDirectory(prefix="trimq-audit-")
        py_files.append(build_deps_zip(os.path.join(tmp.name, "trimq-deps.zip")))
    spark = None
    try:
        spark = build_session(args.master, conf=audit_conf(conf, write_records=opts.write_records),
                              py_files=py_files)
        summary = run_audit(spark, opts)
    except UsageError as exc:
        print(f"trimq-audit: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as exc:  # the job failed: say what, and exit 3 rather than pretend "clean"
        print(f"trimq-audit: the audit failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_ERROR
    finally:
        if spark is not None:
            stop_session(spark)
        if tmp is not None:
            tmp.cleanup()
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        _print_table(summary)
    return int(summary["exit_code"])


def console_main() -> None:
    sys.exit(main())


if __name__ == "__main__":
    sys.exit(main())
