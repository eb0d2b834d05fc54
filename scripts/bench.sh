#!/usr/bin/env bash
# The full `dlock bench` run of docs/BENCHMARKS.md: builds dlock in release mode, starts what the
# machine does not already run — three private redis-servers for Redlock, a three-server
# ZooKeeper ensemble and a three-member etcd cluster, on free loopback ports — and benchmarks
# every store side by side:
#
#   scripts/bench.sh                      # all seven stores, output in bench-out/ (git ignores it)
#   scripts/bench.sh --only u1,c1,h1      # extra arguments go to `dlock bench`
#
# The machine's PostgreSQL (DLOCK_BENCH_POSTGRES, default postgres://postgres@127.0.0.1:5432/test),
# MariaDB (DLOCK_BENCH_MYSQL, default mysql://root@127.0.0.1:3306/test) and Redis
# (DLOCK_BENCH_REDIS, default redis://127.0.0.1:6379/) must be running. The servers this script
# starts are stopped by pid when it exits.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/dlock-target}"
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

need_pkg redis-server redis-server
SCRATCH=$(mktemp -d /tmp/dlock-bench.XXXXXX)
STARTED_PIDS=()
cleanup() {
  for p in "${STARTED_PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
  scripts/zk-ensemble.sh stop "$SCRATCH/zk" >/dev/null 2>&1 || true
  scripts/etcd-cluster.sh stop "$SCRATCH/etcd" >/dev/null 2>&1 || true
  rm -rf "$SCRATCH"
}
trap cleanup EXIT

log "building dlock (release)"
cargo build --release --locked -p dlock-cli

log "starting three redis-servers for Redlock, a ZooKeeper ensemble and an etcd cluster"
start_redis_servers 3 "$SCRATCH/redlock"
REDLOCK=$(IFS=,; echo "${REDIS_HOSTS[*]}")
ZK=$(scripts/zk-ensemble.sh start "$SCRATCH/zk")
ETCD=$(scripts/etcd-cluster.sh start "$SCRATCH/etcd")
mkdir -p "$SCRATCH/sqlite"

mkdir -p bench-out
log "running dlock bench (about 25 minutes for seven stores)"
"$CARGO_TARGET_DIR/release/dlock" bench --plot --out bench-out \
  --url "sqlite://$SCRATCH/sqlite/locks.db" \
  --url "${DLOCK_BENCH_REDIS:-redis://127.0.0.1:6379/}" \
  --url "redlock://$REDLOCK" \
  --url "${DLOCK_BENCH_POSTGRES:-postgres://postgres@127.0.0.1:5432/test}" \
  --url "${DLOCK_BENCH_MYSQL:-mysql://root@127.0.0.1:3306/test}" \
  --url "zk://$ZK/dlockbench" \
  --url "etcd://$ETCD/dlockbench" \
  "$@"
