#!/usr/bin/env bash
# Fuzzes dlock's input parsing with cargo-fuzz (libFuzzer, nightly): store URLs (`url`), lock
# names and their ZooKeeper escaping (`name`), URL redaction (`redact`), and what dlock reads back
# from a store, which may be corrupted or another program's: ZooKeeper node names and data
# (`zk_node`), etcd keys and values (`etcd_key`), Redis keys, describe answers and hand-off
# messages (`redis_meta`), SQL rows and PostgreSQL hand-off notifications (`sql_rows`). The
# properties are in fuzz/checks.rs; crates/dlock/tests/fuzz_checks.rs runs them on stable over the
# seed corpus.
#
#   scripts/fuzz.sh                              # every target, 60 s each
#   scripts/fuzz.sh 300 url                      # one target, 5 minutes
#   scripts/fuzz.sh --report fuzz-report.md 120  # also write the summary table to a file
#                                                # (or DLOCK_FUZZ_REPORT=FILE)
#
# What it runs, per target:
#   cargo +nightly fuzz run -O TARGET SCRATCH/TARGET fuzz/corpus/TARGET -- -max_total_time=SECONDS
# New inputs go to a scratch corpus (fuzz/corpus/ stays a small, committed seed set; copy an
# input there by hand when it is worth keeping). A crash is saved under fuzz/artifacts/TARGET/
# and ends that target's run (the others still run); reproduce it with
# `cargo +nightly fuzz run TARGET FILE`, fix it, and add the file to fuzz/corpus/TARGET/ so the
# stable test keeps checking it.
#
# At the end it prints a Markdown table, per target: the seconds it ran (a finding ends it early),
# executions, executions per second, corpus size (inputs libFuzzer kept at the end, seeds
# included), new inputs found, and findings (crash, leak, timeout and OOM inputs saved by this
# run). Exits 1 if any target has a finding or did not run.
set -euo pipefail
cd "$(dirname "$0")/.."

REPORT="${DLOCK_FUZZ_REPORT:-}"
if [ "${1:-}" = "--report" ]; then
  REPORT="${2:?--report needs a file}"
  shift 2
fi
SECONDS_PER_TARGET="${1:-60}"
shift || true
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(url name redact zk_node etcd_key redis_meta sql_rows)
case "$REPORT" in "" | /*) ;; *) REPORT="$PWD/$REPORT" ;; esac

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/dlock-target}"
rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
cargo fuzz --version >/dev/null 2>&1 || cargo install cargo-fuzz --locked

SCRATCH="${DLOCK_FUZZ_CORPUS:-${TMPDIR:-/tmp}/dlock-fuzz-corpus}"
LOGS="$SCRATCH/logs"
mkdir -p "$LOGS"
cd fuzz
cargo +nightly fuzz build -O

# The artifacts (crash-*, leak-*, timeout-*, oom-*, slow-unit-*) of a target, one a line.
artifacts() { find "artifacts/$1" -maxdepth 1 -type f 2>/dev/null | sort || true; }
# A libFuzzer final statistic (`stat::NAME: VALUE`) from a log, empty when absent.
stat() { sed -n "s/^stat::$2: *//p" "$1" | tail -n1; }

ROWS=()
FAILED=0
for t in "${TARGETS[@]}"; do
  mkdir -p "$SCRATCH/$t"
  log="$LOGS/$t.log"
  before="$(artifacts "$t")"
  printf '\n== fuzz %s for %ss (log: %s)\n' "$t" "$SECONDS_PER_TARGET" "$log" >&2
  rc=0
  start=$(date +%s)
  cargo +nightly fuzz run -O "$t" "$SCRATCH/$t" "corpus/$t" -- \
    -max_total_time="$SECONDS_PER_TARGET" -max_len=4096 -timeout=10 -print_final_stats=1 \
    >"$log" 2>&1 || rc=$?
  ran=$(($(date +%s) - start))
  tail -n 8 "$log" >&2
  new="$(comm -13 <(printf '%s\n' "$before") <(artifacts "$t") | grep -v '^$' || true)"
  findings=$(printf '%s' "$new" | grep -c . || true)
  execs="$(stat "$log" number_of_executed_units)"
  rate="$(stat "$log" average_exec_per_sec)"
  added="$(stat "$log" new_units_added)"
  # The corpus libFuzzer holds at the end: `corp: N/SIZE` of its last status line.
  corpus="$(grep -o 'corp: [0-9]*' "$log" | tail -n1 | sed 's/corp: //')"
  note=""
  if [ "$findings" -gt 0 ]; then
    note="$(printf '%s' "$new" | sed 's|^|fuzz/|' | paste -sd' ' -)"
    FAILED=1
  elif [ "$rc" -ne 0 ] || [ -z "$execs" ]; then
    note="did not finish (exit $rc; see $log)"
    FAILED=1
  fi
  ROWS+=("| $t | $ran | ${execs:-?} | ${rate:-?} | ${corpus:-?} | ${added:-?} | $findings | $note |")
done

table() {
  printf 'Fuzzing on %s, commit %s%s, %s CPUs, %s s per target (cargo-fuzz %s, libFuzzer).\n\n' \
    "$(date -u '+%Y-%m-%d %H:%M UTC')" "$(git rev-parse --short HEAD)" \
    "$(git diff --quiet HEAD -- .. 2>/dev/null || echo ' (with uncommitted changes)')" \
    "$(nproc)" "$SECONDS_PER_TARGET" "$(cargo fuzz --version | awk '{print $2}')"
  echo '| target | seconds | executions | exec/s | corpus | new inputs | findings | |'
  echo '|---|---:|---:|---:|---:|---:|---:|---|'
  printf '%s\n' "${ROWS[@]}"
}
printf '\n' >&2
table
if [ -n "$REPORT" ]; then
  { echo '# Fuzzing (scripts/fuzz.sh)'; echo; table; } >"$REPORT"
  echo "written to $REPORT" >&2
fi
exit "$FAILED"
