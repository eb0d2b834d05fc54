#!/usr/bin/env bash
# A three-server ZooKeeper ensemble on loopback, for dlock's tests.
#
#   scripts/zk-ensemble.sh start DIR      start servers 1..3 (data, configs, logs, pids under DIR);
#                                         prints the connect string 127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3
#   scripts/zk-ensemble.sh stop DIR       kill exactly the servers recorded in DIR (by pid)
#   scripts/zk-ensemble.sh leader DIR     print the index (1..3) of the current leader
#   scripts/zk-ensemble.sh kill N DIR     kill server N (SIGKILL, by its recorded pid)
#   scripts/zk-ensemble.sh start-one N DIR  start server N again (same ports and data)
#   scripts/zk-ensemble.sh url DIR        print the connect string of an ensemble started in DIR
#
# Installs the Debian package `zookeeper` with apt-get when it is missing. Every port (client,
# quorum, election) is a free port on 127.0.0.1 chosen at `start`; tickTime is 200 ms so sessions
# of 1-4 s are accepted (minSessionTimeout 400 ms, maxSessionTimeout 20 s). The admin server is
# off; the four-letter words `srvr`/`ruok`/`stat`/`mntr`/`cons` are on (to find the leader) and `srst`
# (the bench resets the servers' statistics before a run to read their fsync times over it).
# Every wait is bounded (ZK_WAIT_SECS, default 60); errors go to stderr with the log's tail.
set -euo pipefail

ZK_JAR=${ZK_JAR:-/usr/share/java/zookeeper.jar}
WAIT_SECS=${ZK_WAIT_SECS:-60}
N=3

die() {
    echo "zk-ensemble: $*" >&2
    exit 1
}

usage() {
    sed -n '2,10p' "$0" >&2
    exit 2
}

ensure_installed() {
    if [[ -f $ZK_JAR ]] && command -v java >/dev/null; then
        return
    fi
    command -v apt-get >/dev/null || die "ZooKeeper ($ZK_JAR) is missing and apt-get is not available"
    echo "zk-ensemble: installing the Debian package zookeeper" >&2
    local sudo=""
    [[ $(id -u) -eq 0 ]] || sudo="sudo"
    $sudo apt-get update -qq >&2 || die "apt-get update failed"
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends zookeeper >&2 ||
        die "apt-get install zookeeper failed"
    [[ -f $ZK_JAR ]] || die "zookeeper installed but $ZK_JAR is missing"
}

# free_ports N (below the ephemeral port range).
. "$(dirname "${BASH_SOURCE[0]}")/ports.sh"

# Sends a four-letter word to 127.0.0.1:PORT and prints the answer (empty if no answer).
four() {
    local port=$1 word=$2
    timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$port && printf %s '$word' >&3 && cat <&3" 2>/dev/null || true
}

client_port() {
    local dir=$1 i=$2
    sed -n 's/^clientPort=//p' "$dir/s$i/zoo.cfg"
}

connect_string() {
    local dir=$1 i out=()
    for i in $(seq 1 $N); do
        out+=("127.0.0.1:$(client_port "$dir" "$i")")
    done
    local IFS=,
    echo "${out[*]}"
}

pid_alive() {
    local f=$1
    [[ -f $f ]] && kill -0 "$(cat "$f")" 2>/dev/null
}

start_server() {
    local dir=$1 i=$2
    local sdir="$dir/s$i"
    [[ -f $sdir/zoo.cfg ]] || die "no server $i configured in $dir (run start first)"
    if pid_alive "$sdir/pid"; then
        return
    fi
    # -XX:+UseSerialGC and a small heap: three JVMs on a small test machine.
    (
        cd "$sdir"
        exec java -Xms32m -Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
            -Dzookeeper.log.dir="$sdir" -Dzookeeper.root.logger=INFO,CONSOLE \
            -Dzookeeper.admin.enableServer=false \
            -cp "$ZK_JAR:/usr/share/java/slf4j-simple.jar" \
            org.apache.zookeeper.server.quorum.QuorumPeerMain "$sdir/zoo.cfg" \
            >"$sdir/server.log" 2>&1 </dev/null
    ) &
    echo $! >"$sdir/pid"
}

# Waits until server I answers srvr with a mode (leader/follower); prints the mode.
wait_server() {
    local dir=$1 i=$2 deadline=$((SECONDS + WAIT_SECS)) port mode
    port=$(client_port "$dir" "$i")
    while ((SECONDS < deadline)); do
        pid_alive "$dir/s$i/pid" || {
            tail -n 30 "$dir/s$i/server.log" >&2 || true
            die "server $i (pid $(cat "$dir/s$i/pid")) exited; log: $dir/s$i/server.log"
        }
        mode=$(four "$port" srvr | sed -n 's/^Mode: //p')
        if [[ $mode == leader || $mode == follower ]]; then
            echo "$mode"
            return
        fi
        sleep 0.2
    done
    tail -n 30 "$dir/s$i/server.log" >&2 || true
    die "server $i (port $port) did not join a quorum within ${WAIT_SECS}s; log: $dir/s$i/server.log"
}

cmd_start() {
    local dir=$1
    ensure_installed
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    local i
    for i in $(seq 1 $N); do
        if pid_alive "$dir/s$i/pid"; then
            die "server $i of $dir is already running (pid $(cat "$dir/s$i/pid")); stop it first"
        fi
    done
    local ports
    read -r -a ports <<<"$(free_ports $((3 * N)))"
    ((${#ports[@]} == 3 * N)) || die "could not find free ports"
    for i in $(seq 1 $N); do
        local sdir="$dir/s$i"
        rm -rf "$sdir"
        mkdir -p "$sdir/data"
        echo "$i" >"$sdir/data/myid"
        {
            echo "tickTime=200"
            echo "initLimit=50"
            echo "syncLimit=10"
            echo "minSessionTimeout=400"
            echo "maxSessionTimeout=20000"
            echo "dataDir=$sdir/data"
            echo "clientPortAddress=127.0.0.1"
            echo "clientPort=${ports[$((i - 1))]}"
            echo "admin.enableServer=false"
            echo "4lw.commands.whitelist=srvr,ruok,stat,mntr,cons,srst"
            echo "maxClientCnxns=0"
            # Empty container nodes are removed after a minute by default; a second here.
            echo "znode.container.checkIntervalMs=1000"
            echo "quorumListenOnAllIPs=false"
            local j
            for j in $(seq 1 $N); do
                echo "server.$j=127.0.0.1:${ports[$((N + 2 * (j - 1)))]}:${ports[$((N + 2 * (j - 1) + 1))]}"
            done
        } >"$sdir/zoo.cfg"
    done
    for i in $(seq 1 $N); do
        start_server "$dir" "$i"
    done
    local leaders=0 mode
    for i in $(seq 1 $N); do
        mode=$(wait_server "$dir" "$i")
        [[ $mode == leader ]] && leaders=$((leaders + 1))
    done
    ((leaders == 1)) || die "expected exactly one leader, found $leaders"
    connect_string "$dir"
}

cmd_stop() {
    local dir=$1 i pids=()
    for i in $(seq 1 $N); do
        if pid_alive "$dir/s$i/pid"; then
            pids+=("$(cat "$dir/s$i/pid")")
        fi
    done
    if ((${#pids[@]})); then
        kill "${pids[@]}" 2>/dev/null || true
        for _ in $(seq 1 30); do
            kill -0 "${pids[@]}" 2>/dev/null || break
            sleep 0.1
        done
        kill -9 "${pids[@]}" 2>/dev/null || true
    fi
    for i in $(seq 1 $N); do
        rm -f "$dir/s$i/pid"
    done
}

cmd_leader() {
    local dir=$1 i deadline=$((SECONDS + WAIT_SECS))
    while ((SECONDS < deadline)); do
        for i in $(seq 1 $N); do
            pid_alive "$dir/s$i/pid" || continue
            if four "$(client_port "$dir" "$i")" srvr | grep -q '^Mode: leader'; then
                echo "$i"
                return
            fi
        done
        sleep 0.2
    done
    die "no leader in $dir within ${WAIT_SECS}s"
}

cmd_kill() {
    local i=$1 dir=$2 pid
    [[ $i =~ ^[1-3]$ ]] || die "server index must be 1, 2 or 3"
    pid_alive "$dir/s$i/pid" || die "server $i of $dir is not running"
    pid=$(cat "$dir/s$i/pid")
    kill -9 "$pid"
    for _ in $(seq 1 100); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.05
    done
    rm -f "$dir/s$i/pid"
}

cmd_start_one() {
    local i=$1 dir=$2
    [[ $i =~ ^[1-3]$ ]] || die "server index must be 1, 2 or 3"
    ensure_installed
    start_server "$dir" "$i"
    wait_server "$dir" "$i" >/dev/null
}

case "${1:-}" in
start) [[ $# -eq 2 ]] || usage; cmd_start "$2" ;;
stop) [[ $# -eq 2 ]] || usage; cmd_stop "$2" ;;
leader) [[ $# -eq 2 ]] || usage; cmd_leader "$2" ;;
kill) [[ $# -eq 3 ]] || usage; cmd_kill "$2" "$3" ;;
start-one) [[ $# -eq 3 ]] || usage; cmd_start_one "$2" "$3" ;;
url) [[ $# -eq 2 ]] || usage; connect_string "$2" ;;
*) usage ;;
esac
