#!/usr/bin/env bash
# The full fault-injection run of dlock (docs/RELIABILITY.md): builds crates/dlock-chaos in
# release mode and runs every backend × fault with 6 client processes and 8 faults per scenario on
# private servers it starts itself (installing what is missing). Prints the figures table and
# writes it to target-independent files. Then it fuzzes every target of fuzz/ for a bounded time
# (scripts/fuzz.sh, hostile input: URLs, names, and the data stores hand back), its table in
# fuzz-report.md:
#
#   scripts/chaos.sh                         # everything: chaos-report.md and chaos-report.json,
#                                            # the raw records in chaos-events/, the independent
#                                            # check's tables in chaos-check.md, fuzz-report.md
#   scripts/chaos.sh --backend redis --fault pause     # extra arguments go to dlock-chaos
#   DLOCK_FUZZ_SECONDS=300 scripts/chaos.sh  # seconds per fuzz target (default 60; 0: no fuzzing)
#
# Exits 1 if a property a store promises did not hold, or a fuzz target found an input that
# breaks its property (a crash: fuzz/artifacts/).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/dlock-target}"
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

need_private_servers
# The clock-step fault runs the workers under libfaketime.
need_pkg faketime faketime
log "building dlock-chaos and dlock (release; the run-kill scenarios run 'dlock run')"
cargo build --release --locked -p dlock-chaos -p dlock-cli
log "running (about 30 minutes for every backend, half of it the Redis Sentinel and Cluster fail-overs)"
rm -rf chaos-events
rc=0
"$CARGO_TARGET_DIR/release/dlock-chaos" --json chaos-report.json --markdown chaos-report.md \
  --events chaos-events "$@" || rc=$?
# The independent check of the raw records (docs/RELIABILITY.md, "An independent check"): its
# table goes to chaos-check.md; it exits 1 if it disagrees with the harness or a promised
# property failed.
log "checking the records independently (scripts/check-history.py > chaos-check.md)"
python3 scripts/check-history.py --report chaos-report.json --out chaos-check.md chaos-events > /dev/null || rc=1
log "check-history.py: $(tail -n1 chaos-check.md)"
FUZZ_SECONDS="${DLOCK_FUZZ_SECONDS:-60}"
if [ "$FUZZ_SECONDS" -gt 0 ]; then
  log "fuzzing every target for ${FUZZ_SECONDS}s (scripts/fuzz.sh > fuzz-report.md)"
  scripts/fuzz.sh --report fuzz-report.md "$FUZZ_SECONDS" >/dev/null || rc=1
  log "fuzzing: $(grep -c '^| [a-z_]* | [0-9]' fuzz-report.md || true) targets, findings: $(awk -F'|' '/^\| [a-z_]+ \| [0-9]/ {n += $8} END {print n + 0}' fuzz-report.md)"
fi
exit "$rc"
