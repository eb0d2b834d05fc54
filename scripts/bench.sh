#!/usr/bin/env bash
# The full `dlock bench` run of docs/BENCHMARKS.md: builds dlock in release mode, starts what the
# machine does not already run — three private redis-servers for Redlock, a three-server
# ZooKeeper ensemble, a three-member etcd cluster and, when asked for, a Redis Sentinel topology
# and a Redis Cluster (scripts/redis-ha.sh), on free loopback ports — and benchmarks the stores
# side by side:
#
#   scripts/bench.sh                      # the seven stores, output in bench-out/ (git ignores it)
#   scripts/bench.sh --only u1,c1,h1      # extra arguments go to `dlock bench`
#   scripts/bench.sh --stores ha --only u1,c1,h1
#                                         # only the four Redis rows with fail-over
#
# --stores LIST (or --stores=LIST; the first argument) picks the rows, comma-separated:
#   sqlite, redis, redlock, postgres, mysql, zk, etcd   the default seven (about 25 minutes)
#   sentinel        redis+sentinel://S1,S2,S3/dlockmaster: 1 master, 2 replicas, 3 sentinels
#   sentinel+wait   the same with ?replicas=1 (every grant and renewal, and the raw floor's SET,
#                   followed by WAIT 1 500 in the same pipeline)
#   cluster         redis+cluster://N1,...,N6: 3 masters with 1 replica each (no rslock or
#                   redis-py peer: the bench drives them on single servers)
#   cluster+wait    the same with ?replicas=1
#   ha              the four above; all: the seven and the four (about 40 minutes)
# The Redis rows with fail-over are not in the default: each adds about 4 minutes to a full run.
# Only the servers of the chosen rows are started (and only their machine servers must run).
#
# The machine's PostgreSQL (DLOCK_BENCH_POSTGRES, default postgres://postgres@127.0.0.1:5432/test),
# MariaDB (DLOCK_BENCH_MYSQL, default mysql://root@127.0.0.1:3306/test) and Redis
# (DLOCK_BENCH_REDIS, default redis://127.0.0.1:6379/) must be running. The servers this script
# starts are stopped when it exits: the redis-servers by pid, the rest by their scripts' `stop`.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/dlock-target}"
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

DEFAULT_STORES=sqlite,redis,redlock,postgres,mysql,zk,etcd
HA_STORES=sentinel,sentinel+wait,cluster,cluster+wait
STORES=$DEFAULT_STORES
case "${1:-}" in
  --stores) [ $# -ge 2 ] || { echo "bench.sh: --stores needs a list" >&2; exit 2; }
            STORES=$2; shift 2 ;;
  --stores=*) STORES=${1#--stores=}; shift ;;
esac
declare -A WANT=()
IFS=, read -r -a _stores <<<"$STORES"
_expanded=()
for s in "${_stores[@]}"; do
  case "$s" in
    ha) IFS=, read -r -a _more <<<"$HA_STORES"; _expanded+=("${_more[@]}") ;;
    all) IFS=, read -r -a _more <<<"$DEFAULT_STORES,$HA_STORES"; _expanded+=("${_more[@]}") ;;
    *) _expanded+=("$s") ;;
  esac
done
for s in "${_expanded[@]}"; do
  case "$s" in
    sqlite|redis|redlock|postgres|mysql|zk|etcd|sentinel|sentinel+wait|cluster|cluster+wait) WANT[$s]=1 ;;
    "") ;;
    *) echo "bench.sh: unknown store '$s' in --stores (known: $DEFAULT_STORES,$HA_STORES, ha, all)" >&2; exit 2 ;;
  esac
done
[ ${#WANT[@]} -gt 0 ] || { echo "bench.sh: --stores chose no store" >&2; exit 2; }
want() { [ -n "${WANT[$1]:-}" ]; }

SCRATCH=$(mktemp -d /tmp/dlock-bench.XXXXXX)
STARTED_PIDS=()
cleanup() {
  for p in "${STARTED_PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
  [ -d "$SCRATCH/zk" ] && scripts/zk-ensemble.sh stop "$SCRATCH/zk" >/dev/null 2>&1 || true
  [ -d "$SCRATCH/etcd" ] && scripts/etcd-cluster.sh stop "$SCRATCH/etcd" >/dev/null 2>&1 || true
  [ -d "$SCRATCH/redis-sentinel" ] && scripts/redis-ha.sh stop "$SCRATCH/redis-sentinel" >/dev/null 2>&1 || true
  [ -d "$SCRATCH/redis-cluster" ] && scripts/redis-ha.sh stop "$SCRATCH/redis-cluster" >/dev/null 2>&1 || true
  rm -rf "$SCRATCH"
}
trap cleanup EXIT

log "building dlock (release)"
cargo build --release --locked -p dlock-cli

URLS=()
if want sqlite; then
  mkdir -p "$SCRATCH/sqlite"
  URLS+=(--url "sqlite://$SCRATCH/sqlite/locks.db")
fi
want redis && URLS+=(--url "${DLOCK_BENCH_REDIS:-redis://127.0.0.1:6379/}")
if want redlock; then
  need_pkg redis-server redis-server
  log "starting three redis-servers for Redlock"
  start_redis_servers 3 "$SCRATCH/redlock"
  URLS+=(--url "redlock://$(IFS=,; echo "${REDIS_HOSTS[*]}")")
fi
want postgres && URLS+=(--url "${DLOCK_BENCH_POSTGRES:-postgres://postgres@127.0.0.1:5432/test}")
want mysql && URLS+=(--url "${DLOCK_BENCH_MYSQL:-mysql://root@127.0.0.1:3306/test}")
if want zk; then
  log "starting a ZooKeeper ensemble"
  URLS+=(--url "zk://$(scripts/zk-ensemble.sh start "$SCRATCH/zk")/dlockbench")
fi
if want etcd; then
  log "starting an etcd cluster"
  URLS+=(--url "etcd://$(scripts/etcd-cluster.sh start "$SCRATCH/etcd")/dlockbench")
fi
if want sentinel || want sentinel+wait; then
  log "starting a Redis Sentinel topology (scripts/redis-ha.sh)"
  SENTINELS=$(scripts/redis-ha.sh sentinel-start "$SCRATCH/redis-sentinel")
  want sentinel && URLS+=(--url "redis+sentinel://$SENTINELS/dlockmaster")
  want sentinel+wait && URLS+=(--url "redis+sentinel://$SENTINELS/dlockmaster?replicas=1")
fi
if want cluster || want cluster+wait; then
  log "starting a Redis Cluster (scripts/redis-ha.sh)"
  NODES=$(scripts/redis-ha.sh cluster-start "$SCRATCH/redis-cluster")
  want cluster && URLS+=(--url "redis+cluster://$NODES")
  want cluster+wait && URLS+=(--url "redis+cluster://$NODES/?replicas=1")
fi

# The peers that run in processes of their own (docs/BENCHMARKS.md): redis-py's Lock on the Redis
# rows, kazoo's Lock and Curator's InterProcessMutex (a JDK and Debian's jars) on ZooKeeper.
# Installed when missing; one that still cannot run is a line of the report, not a failed run.
NO_PEERS=
for a in "$@"; do [ "$a" = --no-peers ] && NO_PEERS=1; done
pip_peer() { # pip_peer MODULE SPEC
  python3 -c "import $1" 2>/dev/null && return 0
  log "installing $2 (PyPI)"
  python3 -m pip install --quiet "$2" || log "could not install $2: the report will say so"
}
if [ -z "$NO_PEERS" ]; then
  if want redis || want sentinel; then pip_peer redis 'redis>=5,<6'; fi
  if want zk; then
    pip_peer kazoo 'kazoo>=2.10,<3'
    need_pkg javac default-jdk-headless || log "could not install a JDK: the report will say so"
    if ! ls /usr/share/java/curator-recipes*.jar >/dev/null 2>&1; then
      log "installing Curator (Debian packages)"
      apt_get="apt-get"; [ "$(id -u)" = 0 ] || apt_get="sudo apt-get"
      { $apt_get update -qq && DEBIAN_FRONTEND=noninteractive $apt_get install -y -qq \
          libcurator-recipes-java libcurator-framework-java >/dev/null; } \
        || log "could not install Curator: the report will say so"
    fi
  fi
fi

mkdir -p bench-out
log "running dlock bench on ${#WANT[@]} stores (a full run: about 4 minutes each)"
"$CARGO_TARGET_DIR/release/dlock" bench --plot --out bench-out "${URLS[@]}" "$@"
