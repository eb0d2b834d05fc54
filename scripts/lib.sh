# Shared by scripts/test.sh and scripts/chaos.sh (sourced, not run).

log() { printf '\n== %s\n' "$*" >&2; }

# A free loopback TCP port.
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

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
