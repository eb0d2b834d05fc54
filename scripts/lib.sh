# Shared by scripts/test.sh and scripts/chaos.sh (sourced, not run).

# Each line says how long the script has run (bash SECONDS), so a log shows where the time went.
log() { printf '\n== [+%ss] %s\n' "$SECONDS" "$*" >&2; }

# A free loopback TCP port, below the ephemeral range (scripts/ports.sh).
. "$(dirname "${BASH_SOURCE[0]}")/ports.sh"
free_port() { free_ports 1; }

need_pkg() { # need_pkg COMMAND DEBIAN-PACKAGE
  command -v "$1" >/dev/null 2>&1 && return 0
  log "installing $2 (Debian package)"
  if [ "$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null
  else sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null; fi
}

# The server programs the fault tests and the chaos harness start privately: redis-server and
# redis-cli, PostgreSQL's initdb/postgres and psql, mariadbd/mariadb-install-db and the mariadb
# client. (ZooKeeper is installed by scripts/zk-ensemble.sh when it first starts an ensemble.)
need_private_servers() {
  need_pkg redis-server redis-server
  need_pkg psql postgresql-client
  ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need_pkg pg_ctlcluster postgresql
  ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || { log "PostgreSQL's initdb is missing"; exit 1; }
  need_pkg mariadbd mariadb-server
  need_pkg mariadb mariadb-client
}

# start_redis_servers N DIR: N private redis-servers without persistence on free loopback ports,
# data and logs under DIR/redisI. Appends their pids to STARTED_PIDS (the caller stops them) and
# sets REDIS_HOSTS to their 127.0.0.1:PORT addresses; fails with the log's tail if one does not
# answer within 10 s.
start_redis_servers() {
  local n=$1 dir=$2 i port h
  REDIS_HOSTS=()
  for i in $(seq 1 "$n"); do
    port=$(free_port)
    mkdir -p "$dir/redis$i"
    redis-server --bind 127.0.0.1 --port "$port" --save '' --appendonly no \
      --dir "$dir/redis$i" --logfile "$dir/redis$i/redis.log" &
    STARTED_PIDS+=("$!")
    REDIS_HOSTS+=("127.0.0.1:$port")
  done
  i=0
  for h in "${REDIS_HOSTS[@]}"; do
    i=$((i + 1))
    for _ in $(seq 1 100); do
      redis-cli -p "${h##*:}" ping >/dev/null 2>&1 && break
      sleep 0.1
    done
    redis-cli -p "${h##*:}" ping >/dev/null 2>&1 || {
      log "redis-server $h did not start"; tail -20 "$dir/redis$i/redis.log" >&2; return 1; }
  done
}
