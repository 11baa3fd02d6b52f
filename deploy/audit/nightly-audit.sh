#!/bin/sh
# Nightly trimq audit: audits the last day of a store into a dated directory and keeps a few weeks.
# Used by trimq-audit.service (systemd) and trimq-audit.cron. Exit status is trimq-audit's:
# 0 clean, 1 defects found (alert on it), 2 usage error, 3 the audit itself failed.
#
# Settings (environment, or /etc/default/trimq-audit for the systemd unit):
#   TRIMQ_STORE        store directory                     (default /var/lib/trimq/store)
#   TRIMQ_AUDIT_DIR    where dated reports go              (default /var/lib/trimq/audit)
#   TRIMQ_AUDIT_BIN    the trimq-audit console script      (default /opt/trimq/.venv/bin/trimq-audit)
#   TRIMQ_AUDIT_SINCE  window; 26h overlaps the previous run (default 26h; "all" for the whole store)
#   TRIMQ_AUDIT_KEEP   days of reports to keep             (default 30)
#   TRIMQ_AUDIT_ARGS   extra arguments, e.g. "--master spark://10.0.0.5:7077 --fail-on-dlq"; add
#                      "--write-records" to keep the records table too (one more pass over the store)
set -eu

STORE=${TRIMQ_STORE:-/var/lib/trimq/store}
AUDIT_DIR=${TRIMQ_AUDIT_DIR:-/var/lib/trimq/audit}
BIN=${TRIMQ_AUDIT_BIN:-/opt/trimq/.venv/bin/trimq-audit}
SINCE=${TRIMQ_AUDIT_SINCE:-26h}
KEEP=${TRIMQ_AUDIT_KEEP:-30}

OUT="$AUDIT_DIR/$(date -u +%Y-%m-%dT%H%MZ)"
mkdir -p "$AUDIT_DIR"
# Spark writes nothing to the cwd, but start somewhere harmless anyway.
cd "$AUDIT_DIR"

set -- --store "$STORE" --out "$OUT" --quiet
if [ "$SINCE" != "all" ]; then
    set -- "$@" --since "$SINCE"
fi
# shellcheck disable=SC2086  # TRIMQ_AUDIT_ARGS is a list of words on purpose
status=0
"$BIN" "$@" ${TRIMQ_AUDIT_ARGS:-} || status=$?

if [ -d "$OUT" ]; then
    ln -sfn "$OUT" "$AUDIT_DIR/latest"
fi
find "$AUDIT_DIR" -mindepth 1 -maxdepth 1 -type d -name '20*' -mtime +"$KEEP" -exec rm -rf {} +
exit "$status"
