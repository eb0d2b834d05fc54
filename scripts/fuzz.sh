#!/usr/bin/env bash
# Fuzzes dlock's input parsing with cargo-fuzz (libFuzzer, nightly): store URLs (`url`), lock
# names and their ZooKeeper escaping (`name`), and URL redaction (`redact`). The properties are in
# fuzz/checks.rs; crates/dlock/tests/fuzz_checks.rs runs them on stable over the seed corpus.
#
#   scripts/fuzz.sh            # every target, 60 s each
#   scripts/fuzz.sh 300 url    # one target, 5 minutes
#
# What it runs, per target:
#   cargo +nightly fuzz run -O TARGET SCRATCH/TARGET fuzz/corpus/TARGET -- -max_total_time=SECONDS
# New inputs go to a scratch corpus (fuzz/corpus/ stays a small, committed seed set; copy an
# input there by hand when it is worth keeping). A crash is saved under fuzz/artifacts/TARGET/
# and makes this script fail; reproduce it with `cargo +nightly fuzz run TARGET FILE`, fix it,
# and add the file to fuzz/corpus/TARGET/ so the stable test keeps checking it.
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_PER_TARGET="${1:-60}"
shift || true
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || TARGETS=(url name redact)

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/dlock-target}"
rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
cargo fuzz --version >/dev/null 2>&1 || cargo install cargo-fuzz --locked

SCRATCH="${DLOCK_FUZZ_CORPUS:-${TMPDIR:-/tmp}/dlock-fuzz-corpus}"
cd fuzz
cargo +nightly fuzz build -O
for t in "${TARGETS[@]}"; do
  mkdir -p "$SCRATCH/$t"
  printf '\n== fuzz %s for %ss\n' "$t" "$SECONDS_PER_TARGET" >&2
  cargo +nightly fuzz run -O "$t" "$SCRATCH/$t" "corpus/$t" -- \
    -max_total_time="$SECONDS_PER_TARGET" -max_len=4096 -timeout=10 -print_final_stats=1
done
