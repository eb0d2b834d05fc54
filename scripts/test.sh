#!/usr/bin/env bash
# The whole test suite of dlock, from a fresh machine: installs what is missing, starts every
# server the suite needs on loopback ports (Redis single, Sentinel and Cluster, PostgreSQL, MariaDB, a ZooKeeper
# ensemble, an etcd cluster, an sshfs mount for the network-file-system test; mem:// and sqlite:// need none),
# runs formatting and lint checks, every test (unit, conformance, CLI, fault, doctests), and stops
# what it started.
#
#   scripts/test.sh            # everything
#   scripts/test.sh -E 'test(/^sqlite::/)'   # extra arguments go to `cargo nextest run`
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/dlock-target}"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
mkdir -p "$CARGO_TARGET_DIR"

# shellcheck source=scripts/lib.sh
. scripts/lib.sh

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
  [ -n "${ZK_DIR:-}" ] && scripts/zk-ensemble.sh stop "$ZK_DIR" >/dev/null 2>&1 || true
  [ -n "${ETCD_DIR:-}" ] && scripts/etcd-cluster.sh stop "$ETCD_DIR" >/dev/null 2>&1 || true
  [ -n "${REDIS_SENTINEL_DIR:-}" ] && scripts/redis-ha.sh stop "$REDIS_SENTINEL_DIR" >/dev/null 2>&1 || true
  [ -n "${REDIS_CLUSTER_DIR:-}" ] && scripts/redis-ha.sh stop "$REDIS_CLUSTER_DIR" >/dev/null 2>&1 || true
  # Unmounted before the scratch directory (which holds the mount point) is removed.
  [ -n "${NETFS_DIR:-}" ] && scripts/netfs.sh stop "$NETFS_DIR" >/dev/null 2>&1 || true
  [ -n "${SCRATCH:-}" ] && rm -rf "$SCRATCH"
}
trap cleanup EXIT
# A signal ends the script through its EXIT trap, so the servers stop with it (untrapped, bash
# dies at once and leaves them running).
trap 'exit 130' INT
trap 'exit 143' TERM

SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/dlock-test.XXXXXX")

# Redis: our own server on a free loopback port, no persistence (the fault tests start their own,
# with and without persistence). redis-py is the other ecosystem's client of the interop test.
need_private_servers
need_pkg openssl openssl
if [ -z "${DLOCK_TEST_REDIS_URL:-}" ]; then
  start_redis_servers 1 "$SCRATCH/single"
  export DLOCK_TEST_REDIS_URL="redis://${REDIS_HOSTS[0]}/"
fi
log "redis for tests: $DLOCK_TEST_REDIS_URL"

# Redlock: five more independent redis-servers on free loopback ports, no persistence.
if [ -z "${DLOCK_TEST_REDLOCK_URL:-}" ]; then
  start_redis_servers 5 "$SCRATCH/redlock"
  export DLOCK_TEST_REDLOCK_URL="redlock://$(IFS=,; echo "${REDIS_HOSTS[*]}")"
fi
log "redlock for tests: $DLOCK_TEST_REDLOCK_URL"

# Redis with fail-over: a Sentinel topology (1 master, 2 replicas, 3 sentinels) and a Redis Cluster
# (3 masters with a replica each), on free loopback ports; the conformance suite runs on both with
# every grant and renewal confirmed by one replica (replicas=1).
if [ -z "${DLOCK_TEST_REDIS_SENTINEL_URL:-}" ]; then
  REDIS_SENTINEL_DIR="$SCRATCH/redis-sentinel"
  REDIS_SENTINELS=$(scripts/redis-ha.sh sentinel-start "$REDIS_SENTINEL_DIR")
  export DLOCK_TEST_REDIS_SENTINEL_URL="redis+sentinel://$REDIS_SENTINELS/dlockmaster?replicas=1"
fi
log "redis sentinel for tests: $DLOCK_TEST_REDIS_SENTINEL_URL"
if [ -z "${DLOCK_TEST_REDIS_CLUSTER_URL:-}" ]; then
  REDIS_CLUSTER_DIR="$SCRATCH/redis-cluster"
  REDIS_NODES=$(scripts/redis-ha.sh cluster-start "$REDIS_CLUSTER_DIR")
  export DLOCK_TEST_REDIS_CLUSTER_URL="redis+cluster://$REDIS_NODES/?replicas=1"
fi
log "redis cluster for tests: $DLOCK_TEST_REDIS_CLUSTER_URL"

# PostgreSQL and MariaDB: the machine's own servers (127.0.0.1:5432 trust, 127.0.0.1:3306 root),
# started if they are down and installed if missing. Tests use their own table and lock names.
pg_up() { pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; }
if [ -z "${DLOCK_TEST_POSTGRES_URL:-}" ]; then
  need_pkg pg_ctlcluster postgresql
  if ! pg_up; then
    log "starting PostgreSQL"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | sort -V | tail -n1)" main start || true
    for _ in $(seq 1 100); do pg_up && break; sleep 0.1; done
  fi
  pg_up || { log "PostgreSQL is not reachable on 127.0.0.1:5432"; exit 1; }
  psql -h 127.0.0.1 -U postgres -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = 'test'" | grep -q 1 \
    || psql -h 127.0.0.1 -U postgres -d postgres -qc 'CREATE DATABASE test'
  export DLOCK_TEST_POSTGRES_URL="postgres://postgres@127.0.0.1:5432/test"
fi
my_up() { mariadb -h 127.0.0.1 -P 3306 -u root -e 'SELECT 1' >/dev/null 2>&1; }
if [ -z "${DLOCK_TEST_MYSQL_URL:-}" ]; then
  need_pkg mariadbd mariadb-server
  if ! my_up; then
    log "starting MariaDB"
    start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd || true
    for _ in $(seq 1 150); do my_up && break; sleep 0.2; done
  fi
  my_up || { log "MariaDB is not reachable on 127.0.0.1:3306 as root"; exit 1; }
  mariadb -h 127.0.0.1 -u root -e 'CREATE DATABASE IF NOT EXISTS test'
  export DLOCK_TEST_MYSQL_URL="mysql://root@127.0.0.1:3306/test"
fi

# ZooKeeper: a three-server ensemble on free loopback ports (installs the Debian package when
# missing), with a 2 s session timeout so a dead holder is taken over as fast as a 2 s lease.
# Curator (Java) is the other ecosystem's client of the interop test.
if [ -z "${DLOCK_TEST_ZK_URL:-}" ]; then
  ZK_DIR="$SCRATCH/zk"
  ZK_HOSTS=$(scripts/zk-ensemble.sh start "$ZK_DIR")
  export DLOCK_TEST_ZK_URL="zk://$ZK_HOSTS/dlock-test?session_timeout=2s"
fi
log "zookeeper for tests: $DLOCK_TEST_ZK_URL"
if ! ls /usr/share/java/curator-recipes*.jar >/dev/null 2>&1; then
  log "installing Curator (Debian packages)"
  apt_get="apt-get"; [ "$(id -u)" = 0 ] || apt_get="sudo apt-get"
  $apt_get update -qq && DEBIAN_FRONTEND=noninteractive $apt_get install -y -qq libcurator-recipes-java libcurator-framework-java >/dev/null
fi

# etcd: a three-member cluster on free loopback ports (installs the Debian packages etcd-server and
# etcd-client when missing), heartbeat 50 ms and election timeout 500 ms so a leader's loss is
# over in about a second; leases of 2 s, as fast as the other stores' takeover.
if [ -z "${DLOCK_TEST_ETCD_URL:-}" ]; then
  ETCD_DIR="$SCRATCH/etcd"
  ETCD_HOSTS=$(scripts/etcd-cluster.sh start "$ETCD_DIR")
  export DLOCK_TEST_ETCD_URL="etcd://$ETCD_HOSTS/dlock-test?ttl=2s"
fi
log "etcd for tests: $DLOCK_TEST_ETCD_URL"

# A network file system (sshfs over a private sshd on loopback): the SQLite store must refuse it.
if [ -z "${DLOCK_TEST_NETFS_DIR:-}" ]; then
  NETFS_DIR="$SCRATCH/netfs"
  mkdir -p "$NETFS_DIR"
  DLOCK_TEST_NETFS_DIR=$(scripts/netfs.sh start "$NETFS_DIR")
  export DLOCK_TEST_NETFS_DIR
fi
log "network file system for tests: $DLOCK_TEST_NETFS_DIR"
# faketime: processes whose wall clock is off (the SQLite store's leases must not follow it).
need_pkg faketime faketime

python3 -c 'import redis' 2>/dev/null || { log "installing redis-py (PyPI)"; python3 -m pip install --quiet 'redis>=5,<6'; }
python3 -c 'import redlock' 2>/dev/null || { log "installing redlock-py (PyPI)"; python3 -m pip install --quiet 'redlock-py==1.0.8'; }
python3 -c 'import kazoo' 2>/dev/null || { log "installing kazoo (PyPI)"; python3 -m pip install --quiet 'kazoo>=2.10,<3'; }

# --- checks --------------------------------------------------------------------------------------
log "cargo fmt --check"
cargo fmt --all -- --check

log "check-history.py --self-test (the independent checker of the chaos records)"
python3 scripts/check-history.py --self-test

log "cargo clippy -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings

log "build"
cargo build --workspace --all-targets --locked

log "tests (nextest)"
cargo nextest run --workspace --locked --no-fail-fast "$@"

# Every example of the library, run to its end: each asserts what it shows and finishes by itself
# within seconds on the embedded SQLite store (one that would serve forever takes its run time
# from DLOCK_EXAMPLE_SECONDS; the metrics one serves on a free port). The binaries are named after
# the files, whatever the package is called, so no `-p` here. fenced_write also runs against
# PostgreSQL as its fenced resource.
log "examples"
cargo build --workspace --examples --locked
EXAMPLES_FAILED=()
run_example() { # name, then extra environment assignments
  local name=$1; shift
  local out="$SCRATCH/example-$name.log"
  if env DLOCK_EXAMPLE_SECONDS=1 DLOCK_METRICS_ADDR=127.0.0.1:0 "$@" timeout 20 "$CARGO_TARGET_DIR/debug/examples/$name" >"$out" 2>&1; then
    log "example $name: ok ($(tail -n1 "$out"))"
  else
    log "example $name FAILED (exit $?):"; tail -n 30 "$out" >&2
    EXAMPLES_FAILED+=("$name")
  fi
}
for e in crates/dlock/examples/*.rs; do
  run_example "$(basename "$e" .rs)"
done
if [ -x "$CARGO_TARGET_DIR/debug/examples/fenced_write" ]; then
  run_example fenced_write DLOCK_EXAMPLE_POSTGRES_URL="$DLOCK_TEST_POSTGRES_URL"
fi
[ "${#EXAMPLES_FAILED[@]}" -eq 0 ] || { log "examples failed: ${EXAMPLES_FAILED[*]}"; exit 1; }

log "doctests"
cargo test --workspace --doc --locked

# What a user of the published crates sees: the library with its default features only, and
# with each store alone (no warning there either), the API docs with every feature (docs.rs
# builds them so), and the packages crates.io would get (metadata, files, versions of path
# dependencies).
log "library alone (default features; each store alone), docs, packages"
cargo clippy -p dlock-rs --lib --locked -- -D warnings
# Each store's feature alone: a user who enables one store gets none of the dependency features
# that only the other stores turn on.
for f in redis redlock postgres mysql zookeeper etcd; do
  cargo clippy -p dlock-rs --lib --no-default-features --features "$f" --locked -- -D warnings
done
RUSTDOCFLAGS="-D warnings" cargo doc -p dlock-rs --all-features --no-deps --locked
# (A working tree with uncommitted changes is packaged as it is; a clean checkout, as CI's, needs
# no --allow-dirty.)
dirty=()
[ -n "$(git status --porcelain 2>/dev/null)" ] && dirty=(--allow-dirty)
cargo package -p dlock-rs -p dlock-cli --no-verify --locked "${dirty[@]}"

# The bounded fault-injection run (crates/dlock-chaos; the full run is scripts/chaos.sh). It
# starts its own private servers and exits 1 if a property a store promises did not hold. Left
# out when nextest arguments select a part of the suite. Three backends run at a time (the run waits
# on leases and faults far more than it computes). Its raw records are then checked again by
# an independent analysis (scripts/check-history.py), which must agree with the harness's figures.
if [ "$#" -eq 0 ]; then
  log "chaos (bounded: 4 client processes, 1 fault per scenario, every backend, three at a time)"
  "$CARGO_TARGET_DIR/debug/dlock-chaos" --quick --jobs 3 --json "$SCRATCH/chaos.json" --events "$SCRATCH/chaos-events"
  log "chaos records checked independently (scripts/check-history.py)"
  python3 scripts/check-history.py --report "$SCRATCH/chaos.json" --out "$SCRATCH/chaos-check.md" "$SCRATCH/chaos-events" \
    > /dev/null || { grep -E '^###|MISMATCH|VIOLATED|no raw record|no row|records,' "$SCRATCH/chaos-check.md" || true; log "check-history.py: the checker disagrees with the harness, or a promised property failed"; exit 1; }
  log "check-history.py: $(tail -n1 "$SCRATCH/chaos-check.md")"
fi
