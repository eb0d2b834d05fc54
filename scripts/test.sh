#!/usr/bin/env bash
# The whole test suite of dlock, from a fresh machine: installs what is missing, starts every
# server the suite needs on loopback ports (none yet beyond the embedded stores: the mem:// and
# sqlite:// backends need no server), runs formatting and lint checks, every test (unit,
# conformance, CLI, doctests), and stops what it started.
#
#   scripts/test.sh            # everything
#   scripts/test.sh -E 'test(/^sqlite::/)'   # extra arguments go to `cargo nextest run`
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/dlock-target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
# Conformance tests of a backend whose URL is not configured fail instead of skipping.
export DLOCK_TEST_REQUIRE_ALL=1
mkdir -p "$CARGO_TARGET_DIR"

log() { printf '\n== %s\n' "$*" >&2; }

# --- tools ---------------------------------------------------------------------------------------
if ! cargo nextest --version >/dev/null 2>&1; then
  log "installing cargo-nextest (from crates.io, built from source)"
  cargo install cargo-nextest --locked
fi
rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt clippy

# --- servers -------------------------------------------------------------------------------------
# Servers this script starts are recorded here and stopped on exit (only ours, by pid).
STARTED_PIDS=()
cleanup() {
  for pid in "${STARTED_PIDS[@]:-}"; do
    [ -n "$pid" ] && kill "$pid" 2>/dev/null || true
  done
}
trap cleanup EXIT
# (Redis, PostgreSQL, MariaDB and ZooKeeper start here when their backends land.)

# --- checks --------------------------------------------------------------------------------------
log "cargo fmt --check"
cargo fmt --all -- --check

log "cargo clippy -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings

log "build"
cargo build --workspace --all-targets --locked

log "tests (nextest)"
cargo nextest run --workspace --locked --no-fail-fast "$@"

log "doctests"
cargo test --workspace --doc --locked
