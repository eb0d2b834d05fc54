#!/usr/bin/env bash
# The full fault-injection run of dlock (docs/RELIABILITY.md): builds crates/dlock-chaos in
# release mode and runs every backend × fault with 6 client processes and 8 faults per scenario on
# private servers it starts itself (installing what is missing). Prints the figures table and
# writes it to target-independent files:
#
#   scripts/chaos.sh                         # everything: chaos-report.md and chaos-report.json
#   scripts/chaos.sh --backend redis --fault pause     # extra arguments go to dlock-chaos
#
# Exits 1 if a property a store promises did not hold.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/dlock-target}"
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

need_private_servers
log "building dlock-chaos (release)"
cargo build --release --locked -p dlock-chaos
log "running (about 30 minutes for every backend, half of it the Redis Sentinel and Cluster fail-overs)"
exec "$CARGO_TARGET_DIR/release/dlock-chaos" --json chaos-report.json --markdown chaos-report.md "$@"
