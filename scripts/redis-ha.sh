#!/usr/bin/env bash
# Redis with fail-over on loopback, for dlock's tests: a Sentinel topology or a Redis Cluster.
#
#   scripts/redis-ha.sh sentinel-start DIR     1 master + 2 replicas (DIR/n1..n3) and 3 sentinels (DIR/s1..s3)
#                                              watching master "dlockmaster"; prints the sentinels 127.0.0.1:p1,...,:p3
#   scripts/redis-ha.sh cluster-start DIR      a 6-node Redis Cluster (DIR/c1..c6), 3 masters with 1 replica each;
#                                              prints the nodes 127.0.0.1:p1,...,127.0.0.1:p6
#   scripts/redis-ha.sh stop DIR               stop exactly the processes recorded in DIR (by pid)
#   scripts/redis-ha.sh url DIR                print the list that the start printed
#   scripts/redis-ha.sh master DIR             sentinel: host:port of the current master (cluster: use master-of)
#   scripts/redis-ha.sh master-of KEY DIR      cluster: host:port of the master serving KEY's slot
#   scripts/redis-ha.sh node-of ADDR DIR       the node (n1, s2, c4, ...) whose port is ADDR's port
#   scripts/redis-ha.sh kill NODE DIR          SIGKILL node NODE (n1..n3, s1..s3 or c1..c6, by its recorded pid)
#   scripts/redis-ha.sh start-one NODE DIR     start NODE again (same port, config and dir), wait until it answers PING
#   scripts/redis-ha.sh pause NODE DIR         SIGSTOP NODE
#   scripts/redis-ha.sh resume NODE DIR        SIGCONT NODE
#   scripts/redis-ha.sh wait-failover OLD DIR  sentinel: wait until the sentinels report a master other than OLD
#                                              (host:port) that answers ROLE as master, print it; cluster: wait until
#                                              every live node says cluster_state:ok and none gives OLD a slot
#   scripts/redis-ha.sh migrate-slot KEY DIR   cluster: move KEY's slot and its keys to another master;
#                                              prints "SLOT FROM TO"
#
# Installs the Debian package redis-server with apt-get when redis-server or redis-cli is missing.
# Every server listens on 127.0.0.1 only, on free ports chosen at the start (cluster nodes get a
# free bus port too, set with cluster-port), with no persistence (save "", appendonly no) and
# diskless replication without delay (repl-diskless-sync-delay 0). Each node's config (redis.conf,
# or sentinel.conf for a sentinel), log, pid and port are in its directory under DIR; sentinels and
# CONFIG REWRITE change those configs in place, so start-one brings a node back as the sentinels or
# the cluster (nodes.conf) made it. Sentinel: quorum 2, down-after-milliseconds 1000,
# failover-timeout 5000, parallel-syncs 1. Cluster: cluster-node-timeout 1000. Nodes run in their
# own session (setsid) and outlive this script; only a pid whose command line names redis and the
# node's directory is ever signalled. Every wait is bounded (REDIS_HA_WAIT_SECS, default 60);
# errors go to stderr with the logs' tails.
set -euo pipefail

WAIT_SECS=${REDIS_HA_WAIT_SECS:-60}
MASTER_NAME=dlockmaster
DATA_NODES=(n1 n2 n3)
SENTINELS=(s1 s2 s3)
CLUSTER_NODES=(c1 c2 c3 c4 c5 c6)
ALL_NODES=("${DATA_NODES[@]}" "${SENTINELS[@]}" "${CLUSTER_NODES[@]}")
# The process title redis gives itself: the config file's path (so the node's directory) stays in
# the command line that node_pid checks.
PROC_TITLE='{title} {config-file} {listen-addr} {server-mode}'

die() {
    echo "redis-ha: $*" >&2
    exit 1
}

usage() {
    sed -n '2,21p' "$0" >&2
    exit 2
}

[[ $WAIT_SECS =~ ^[0-9]+$ ]] || die "REDIS_HA_WAIT_SECS must be a whole number of seconds"

ensure_installed() {
    if command -v redis-server >/dev/null && command -v redis-cli >/dev/null; then
        return
    fi
    command -v apt-get >/dev/null || die "redis-server or redis-cli is missing and apt-get is not available"
    echo "redis-ha: installing the Debian package redis-server" >&2
    local sudo=""
    [[ $(id -u) -eq 0 ]] || sudo="sudo"
    $sudo apt-get update -qq >&2 || die "apt-get update failed"
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends redis-server >&2 ||
        die "apt-get install redis-server failed"
    if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
        die "redis-server installed but redis-server or redis-cli is missing"
    fi
}

# free_ports N (below the ephemeral port range).
. "$(dirname "${BASH_SOURCE[0]}")/ports.sh"

# redis-cli against 127.0.0.1:PORT, bounded in time (a paused server never answers); -e makes an
# error reply a failure.
rcli() {
    local port=$1
    shift
    timeout 5 redis-cli -e -h 127.0.0.1 -p "$port" "$@" 2>/dev/null
}

# Runs a command on 127.0.0.1:PORT whose reply must be one of the words WANT; dies otherwise.
expect_reply() {
    local want=$1 port=$2 reply
    shift 2
    # An error reply (-e) goes to stderr: keep it for the message.
    reply=$(timeout 5 redis-cli -e -h 127.0.0.1 -p "$port" "$@" 2>&1) || true
    [[ -n $reply && " $want " == *" $reply "* ]] ||
        die "${*:1:5}... on 127.0.0.1:$port answered ${reply:-nothing} (wanted: $want)"
}

# Prints DIR as an absolute path (the form recorded in the nodes' command lines) after checking
# that a start configured a topology there.
ha_dir() {
    local dir node
    [[ -f $1/topology ]] || die "no Redis topology in $1 (run sentinel-start or cluster-start first)"
    dir=$(cd "$1" && pwd)
    for node in $(topology_nodes "$dir"); do
        [[ -f $dir/$node/port ]] || die "node $node is not configured in $dir (start the topology again)"
    done
    echo "$dir"
}

topology() {
    local t
    t=$(cat "$1/topology")
    [[ $t == sentinel || $t == cluster ]] || die "$1/topology names no known topology: $t"
    echo "$t"
}

# The nodes of DIR's topology, data nodes first.
topology_nodes() {
    case $(topology "$1") in
    sentinel) echo "${DATA_NODES[*]} ${SENTINELS[*]}" ;;
    cluster) echo "${CLUSTER_NODES[*]}" ;;
    esac
}

check_node() {
    local dir=$1 node=$2
    [[ $node =~ ^[nsc][0-9]$ && " $(topology_nodes "$dir") " == *" $node "* ]] ||
        die "no node $node in the $(topology "$dir") topology of $dir (nodes: $(topology_nodes "$dir"))"
}

need_topology() {
    [[ $(topology "$1") == "$2" ]] || die "$1 holds a $(topology "$1") topology; $3 needs a $2 one"
}

is_sentinel() {
    [[ $1 == s[0-9] ]]
}

node_port() {
    cat "$1/$2/port"
}

addr_of() {
    echo "127.0.0.1:$(node_port "$1" "$2")"
}

# The node whose recorded port is PORT; fails when there is none.
node_with_port() {
    local dir=$1 port=$2 node
    for node in $(topology_nodes "$dir"); do
        if [[ $(node_port "$dir" "$node") == "$port" ]]; then
            echo "$node"
            return 0
        fi
    done
    return 1
}

# Prints NODE's pid when it is running and is our redis (its command line names redis and the
# node's directory, so a reused pid is never taken for it); fails otherwise.
node_pid() {
    local dir=$1 node=$2 pid cmdline
    [[ -f $dir/$node/pid ]] || return 1
    pid=$(cat "$dir/$node/pid")
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    cmdline=$(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline") || return 1
    [[ $cmdline == *redis* && $cmdline == *"$dir/$node/"* ]] || return 1
    echo "$pid"
}

# Succeeds when NODE runs and is not stopped (paused): only such a node can answer.
node_live() {
    local pid state
    pid=$(node_pid "$1" "$2") || return 1
    state=$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1) || return 1
    [[ -n $state && $state != [TtZX] ]]
}

logs_tail() {
    local dir=$1 node f
    for node in "${@:2}"; do
        for f in redis.log sentinel.log stderr.log; do
            [[ -s $dir/$node/$f ]] || continue
            echo "--- $node: $dir/$node/$f" >&2
            tail -n 25 "$dir/$node/$f" >&2 2>/dev/null || true
        done
    done
}

# Prints the failure with the logs of NODE... and fails.
fail_with_logs() {
    local dir=$1 msg=$2
    logs_tail "$dir" "${@:3}"
    echo "redis-ha: $msg" >&2
    return 1
}

# Lines shared by every node's config. The paths are double-quoted in the config, so DIR may hold
# spaces but no double quote, backslash or newline (checked at the start).
common_conf() {
    local ndir=$1 port=$2 log=$3
    cat <<EOF
bind 127.0.0.1
port $port
protected-mode no
daemonize no
dir "$ndir"
logfile "$ndir/$log"
proc-title-template "$PROC_TITLE"
EOF
}

data_conf() {
    local ndir=$1 port=$2
    common_conf "$ndir" "$port" redis.log
    cat <<EOF
save ""
appendonly no
repl-diskless-sync-delay 0
EOF
}

start_node() {
    local dir=$1 node=$2 ndir args=()
    ndir="$dir/$node"
    node_pid "$dir" "$node" >/dev/null && return
    if is_sentinel "$node"; then
        args=(redis-server "$ndir/sentinel.conf" --sentinel)
    else
        args=(redis-server "$ndir/redis.conf")
    fi
    rm -f "$ndir/pid"
    # The child writes its own pid, then becomes redis-server: the recorded pid is redis's whether
    # or not setsid had to fork.
    # shellcheck disable=SC2016 # expanded by the child
    setsid bash -c 'echo $$ >"$1.tmp" && mv "$1.tmp" "$1" && shift && exec "$@"' _ "$ndir/pid" "${args[@]}" \
        </dev/null >>"$ndir/stderr.log" 2>&1 &
    disown $!
    local deadline=$((SECONDS + 10))
    until [[ -s $ndir/pid ]]; do
        ((SECONDS < deadline)) || die "node $node did not record its pid in $ndir/pid"
        sleep 0.05
    done
}

# Waits until every node in NODE... answers PING.
wait_ping() {
    local dir=$1 node ok deadline=$((SECONDS + WAIT_SECS))
    while ((SECONDS < deadline)); do
        ok=1
        for node in "${@:2}"; do
            node_pid "$dir" "$node" >/dev/null ||
                fail_with_logs "$dir" "node $node of $dir exited (log: $dir/$node)" "$node" || return 1
            [[ $(rcli "$(node_port "$dir" "$node")" PING) == PONG ]] || ok=0
        done
        ((ok)) && return 0
        sleep 0.1
    done
    fail_with_logs "$dir" "nodes ${*:2} of $dir did not answer PING within ${WAIT_SECS}s" "${@:2}"
}

# Fails unless no node is running in DIR.
check_nothing_running() {
    local dir=$1 node
    for node in "${ALL_NODES[@]}"; do
        if node_pid "$dir" "$node" >/dev/null; then
            die "node $node of $dir is already running (pid $(cat "$dir/$node/pid")); stop it first"
        fi
    done
}

# Makes DIR and prints its absolute path, checked for the characters the configs cannot quote.
prepare_dir() {
    local dir=$1
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    [[ $dir != *[\"\\$'\n']* ]] || die "DIR must not contain a double quote, backslash or newline: $dir"
    echo "$dir"
}

# Set while a start runs: the EXIT trap stops what it had started when it fails.
STARTING_DIR=""
on_exit() {
    local rc=$?
    if [[ -n $STARTING_DIR && $rc -ne 0 ]]; then
        echo "redis-ha: start failed; stopping the nodes started in $STARTING_DIR" >&2
        cmd_stop "$STARTING_DIR" || true
    fi
}
trap on_exit EXIT

# The list the start printed: the sentinels, or the cluster's nodes.
url_list() {
    local dir=$1 node out=()
    case $(topology "$dir") in
    sentinel) for node in "${SENTINELS[@]}"; do out+=("$(addr_of "$dir" "$node")"); done ;;
    cluster) for node in "${CLUSTER_NODES[@]}"; do out+=("$(addr_of "$dir" "$node")"); done ;;
    esac
    local IFS=,
    echo "${out[*]}"
}

# --- Sentinel topology -------------------------------------------------------------------------

# Field NAME of `SENTINEL master dlockmaster` as SENTINEL answers it (name and value alternate).
sentinel_master_field() {
    local port=$1 name=$2 out
    out=$(rcli "$port" SENTINEL master "$MASTER_NAME") || return 1
    awk -v k="$name" 'NR % 2 == 1 { key = $0; next } key == k { print; found = 1; exit } END { exit !found }' <<<"$out"
}

# host:port of the master as the sentinel on PORT reports it.
sentinel_master_addr() {
    local port=$1 out host mport
    out=$(rcli "$port" SENTINEL get-master-addr-by-name "$MASTER_NAME") || return 1
    { read -r host && read -r mport; } <<<"$out" || return 1
    [[ -n $host && $mport =~ ^[0-9]+$ ]] || return 1
    echo "$host:$mport"
}

# Waits until the master on port MPORT lists WANT replicas with state=online.
wait_replicas_online() {
    local dir=$1 mport=$2 want=$3 n deadline=$((SECONDS + WAIT_SECS))
    while ((SECONDS < deadline)); do
        n=$(rcli "$mport" INFO replication | tr -d '\r' | grep -c '^slave[0-9]*:.*state=online' || true)
        ((n >= want)) && return 0
        sleep 0.2
    done
    fail_with_logs "$dir" "the master (port $mport) did not have $want online replicas within ${WAIT_SECS}s" "${DATA_NODES[@]}"
}

# Waits until every sentinel reports the master at MADDR and knows 2 replicas and 2 other sentinels.
wait_sentinels_ready() {
    local dir=$1 maddr=$2 node port ok deadline=$((SECONDS + WAIT_SECS))
    while ((SECONDS < deadline)); do
        ok=1
        for node in "${SENTINELS[@]}"; do
            node_pid "$dir" "$node" >/dev/null ||
                fail_with_logs "$dir" "sentinel $node of $dir exited" "$node" || return 1
            port=$(node_port "$dir" "$node")
            if [[ $(sentinel_master_addr "$port") != "$maddr" ]] ||
                [[ $(sentinel_master_field "$port" num-slaves) != 2 ]] ||
                [[ $(sentinel_master_field "$port" num-other-sentinels) != 2 ]]; then
                ok=0
                break
            fi
        done
        ((ok)) && return 0
        sleep 0.2
    done
    fail_with_logs "$dir" "the sentinels of $dir did not all see master $maddr with 2 replicas and 2 other sentinels within ${WAIT_SECS}s" \
        "${SENTINELS[@]}"
}

cmd_sentinel_start() {
    local dir
    ensure_installed
    dir=$(prepare_dir "$1")
    check_nothing_running "$dir"
    local ports node i
    read -r -a ports <<<"$(free_ports 6)"
    ((${#ports[@]} == 6)) || die "could not find free ports"
    for node in "${ALL_NODES[@]}"; do
        rm -rf "${dir:?}/$node"
    done
    rm -f "$dir/cluster-create.log"
    echo sentinel >"$dir/topology"
    STARTING_DIR=$dir
    local mport=${ports[0]}
    for i in 0 1 2; do
        node=${DATA_NODES[$i]}
        mkdir -p "$dir/$node"
        echo "${ports[$i]}" >"$dir/$node/port"
        {
            data_conf "$dir/$node" "${ports[$i]}"
            ((i == 0)) || echo "replicaof 127.0.0.1 $mport"
        } >"$dir/$node/redis.conf"
    done
    for i in 0 1 2; do
        node=${SENTINELS[$i]}
        mkdir -p "$dir/$node"
        echo "${ports[$((3 + i))]}" >"$dir/$node/port"
        {
            common_conf "$dir/$node" "${ports[$((3 + i))]}" sentinel.log
            cat <<EOF
sentinel resolve-hostnames no
sentinel announce-hostnames no
sentinel monitor $MASTER_NAME 127.0.0.1 $mport 2
sentinel down-after-milliseconds $MASTER_NAME 1000
sentinel failover-timeout $MASTER_NAME 5000
sentinel parallel-syncs $MASTER_NAME 1
EOF
        } >"$dir/$node/sentinel.conf"
    done
    for node in "${DATA_NODES[@]}"; do
        start_node "$dir" "$node"
    done
    wait_ping "$dir" "${DATA_NODES[@]}"
    # The replicas are online before the sentinels start, so that each sentinel's first INFO of
    # the master already lists them (the next one comes 10 s later).
    wait_replicas_online "$dir" "$mport" 2
    for node in "${SENTINELS[@]}"; do
        start_node "$dir" "$node"
    done
    wait_ping "$dir" "${SENTINELS[@]}"
    wait_sentinels_ready "$dir" "127.0.0.1:$mport"
    STARTING_DIR=""
    url_list "$dir"
}

# host:port of the master that the live sentinels report; with ALL, only when every live sentinel
# reports the same one. Fails when no sentinel answers (or, with ALL, they disagree).
sentinels_master() {
    local dir=$1 all=${2:-} node addr seen=""
    for node in "${SENTINELS[@]}"; do
        node_live "$dir" "$node" || continue
        addr=$(sentinel_master_addr "$(node_port "$dir" "$node")") || continue
        if [[ -z $all ]]; then
            echo "$addr"
            return 0
        fi
        [[ -z $seen || $seen == "$addr" ]] || return 1
        seen=$addr
    done
    [[ -n $seen ]] || return 1
    echo "$seen"
}

cmd_master() {
    local dir addr deadline=$((SECONDS + WAIT_SECS))
    dir=$(ha_dir "$1")
    [[ $(topology "$dir") == sentinel ]] ||
        die "a cluster has one master per slot: use \`master-of KEY $1\`"
    while ((SECONDS < deadline)); do
        if addr=$(sentinels_master "$dir"); then
            echo "$addr"
            return 0
        fi
        sleep 0.2
    done
    fail_with_logs "$dir" "no sentinel of $dir reported the master within ${WAIT_SECS}s" "${SENTINELS[@]}"
}

# Succeeds when 127.0.0.1:PORT (a host:port) answers ROLE as a master.
answers_master() {
    local port=${1##*:} role
    role=$(rcli "$port" ROLE) || return 1
    [[ ${role%%$'\n'*} == master ]]
}

wait_failover_sentinel() {
    local dir=$1 old=$2 addr deadline=$((SECONDS + WAIT_SECS))
    while ((SECONDS < deadline)); do
        # All on 127.0.0.1: the port tells the nodes apart, however OLD names the host.
        if addr=$(sentinels_master "$dir" all) && [[ ${addr##*:} != "${old##*:}" ]] && answers_master "$addr"; then
            echo "$addr"
            return 0
        fi
        sleep 0.2
    done
    fail_with_logs "$dir" "the sentinels of $dir did not agree on a master other than $old within ${WAIT_SECS}s" \
        "${SENTINELS[@]}" "${DATA_NODES[@]}"
}

# --- Redis Cluster -----------------------------------------------------------------------------

# CLUSTER NODES as the node on PORT sees it.
cluster_nodes() {
    rcli "$1" CLUSTER NODES
}

# From CLUSTER NODES on stdin: "ID ADDR" of the master that owns SLOT (addr without @busport).
owner_of_slot() {
    awk -v slot="$1" '
        $3 ~ /(^|,)master(,|$)/ && $3 !~ /fail/ {
            for (i = 9; i <= NF; i++) {
                if ($i ~ /^\[/) continue
                n = split($i, r, "-")
                lo = r[1] + 0; hi = (n > 1 ? r[2] : r[1]) + 0
                if (slot >= lo && slot <= hi) { split($2, a, "[@,]"); print $1, a[1]; exit }
            }
        }'
}

key_slot() {
    local dir=$1 key=$2 node slot
    for node in "${CLUSTER_NODES[@]}"; do
        node_live "$dir" "$node" || continue
        if slot=$(rcli "$(node_port "$dir" "$node")" CLUSTER KEYSLOT "$key") && [[ $slot =~ ^[0-9]+$ ]]; then
            echo "$slot"
            return 0
        fi
    done
    return 1
}

# "ID ADDR" of the master that serves SLOT: one that a live node names and that, asked itself,
# says it is that master and owns SLOT. Fails when there is none now.
slot_master() {
    local dir=$1 slot=$2 node view id addr own
    for node in "${CLUSTER_NODES[@]}"; do
        node_live "$dir" "$node" || continue
        view=$(cluster_nodes "$(node_port "$dir" "$node")") || continue
        read -r id addr < <(owner_of_slot "$slot" <<<"$view") || continue
        [[ -n ${addr:-} ]] || continue
        own=$(cluster_nodes "${addr##*:}" | awk '$3 ~ /myself/') || continue
        [[ $(owner_of_slot "$slot" <<<"$own") == "$id $addr" ]] || continue
        echo "$id $addr"
        return 0
    done
    return 1
}

wait_slot_master() {
    local dir=$1 slot=$2 out deadline=$((SECONDS + WAIT_SECS))
    while ((SECONDS < deadline)); do
        if out=$(slot_master "$dir" "$slot"); then
            echo "$out"
            return 0
        fi
        sleep 0.2
    done
    fail_with_logs "$dir" "no master of $dir served slot $slot within ${WAIT_SECS}s" "${CLUSTER_NODES[@]}"
}

cmd_master_of() {
    local key=$1 dir slot deadline=$((SECONDS + WAIT_SECS))
    dir=$(ha_dir "$2")
    need_topology "$dir" cluster master-of
    until slot=$(key_slot "$dir" "$key"); do
        ((SECONDS < deadline)) || die "no live node of $dir answered CLUSTER KEYSLOT"
        sleep 0.2
    done
    local out
    out=$(wait_slot_master "$dir" "$slot")
    echo "${out#* }"
}

# Succeeds when the cluster looks ready from every live node: cluster_state:ok, every master with
# slots has a replica that is not failing, and (with OLD, a host:port) OLD owns no slot.
cluster_ready() {
    local dir=$1 old=${2:-} node port view role
    local live=0
    for node in "${CLUSTER_NODES[@]}"; do
        node_live "$dir" "$node" || continue
        live=$((live + 1))
        port=$(node_port "$dir" "$node")
        rcli "$port" CLUSTER INFO | tr -d '\r' | grep -x 'cluster_state:ok' >/dev/null || return 1
        view=$(cluster_nodes "$port") || return 1
        if [[ -n $old ]]; then
            # OLD's entry (matched by port: all nodes are on 127.0.0.1) lists no slot.
            awk -v port="${old##*:}" '{ split($2, a, "[@,]"); n = split(a[1], hp, ":") }
                hp[n] == port && NF > 8 { bad = 1 } END { exit bad }' <<<"$view" || return 1
        else
            awk '
                $3 ~ /(^|,)master(,|$)/ && NF > 8 { masters[$1] = 1 }
                $3 ~ /(^|,)slave(,|$)/ && $3 !~ /fail/ { replicated[$4] = 1 }
                END {
                    n = 0
                    for (m in masters) { n++; if (!(m in replicated)) exit 1 }
                    exit n == 0
                }' <<<"$view" || return 1
            role=$(rcli "$port" ROLE) || return 1
            if [[ ${role%%$'\n'*} == slave ]]; then
                rcli "$port" INFO replication | tr -d '\r' | grep -x 'master_link_status:up' >/dev/null || return 1
            fi
        fi
    done
    ((live > 0))
}

wait_cluster_ready() {
    local dir=$1 old=${2:-} deadline=$((SECONDS + WAIT_SECS))
    while ((SECONDS < deadline)); do
        cluster_ready "$dir" "$old" && return 0
        sleep 0.2
    done
    local what="every live node of $dir to say cluster_state:ok"
    if [[ -n $old ]]; then
        what+=" with no slot on $old"
    else
        what+=" with a replica for every master"
    fi
    fail_with_logs "$dir" "timed out after ${WAIT_SECS}s waiting for $what" "${CLUSTER_NODES[@]}"
}

cmd_cluster_start() {
    local dir
    ensure_installed
    dir=$(prepare_dir "$1")
    check_nothing_running "$dir"
    local ports node i addrs=()
    read -r -a ports <<<"$(free_ports 12)"
    ((${#ports[@]} == 12)) || die "could not find free ports"
    for node in "${ALL_NODES[@]}"; do
        rm -rf "${dir:?}/$node"
    done
    rm -f "$dir/cluster-create.log"
    echo cluster >"$dir/topology"
    STARTING_DIR=$dir
    for i in 0 1 2 3 4 5; do
        node=${CLUSTER_NODES[$i]}
        mkdir -p "$dir/$node"
        echo "${ports[$i]}" >"$dir/$node/port"
        echo "${ports[$((6 + i))]}" >"$dir/$node/bus-port"
        {
            data_conf "$dir/$node" "${ports[$i]}"
            cat <<EOF
cluster-enabled yes
cluster-config-file "$dir/$node/nodes.conf"
cluster-node-timeout 1000
cluster-port ${ports[$((6 + i))]}
EOF
        } >"$dir/$node/redis.conf"
        addrs+=("127.0.0.1:${ports[$i]}")
    done
    for node in "${CLUSTER_NODES[@]}"; do
        start_node "$dir" "$node"
    done
    wait_ping "$dir" "${CLUSTER_NODES[@]}"
    if ! timeout "$WAIT_SECS" redis-cli --cluster create "${addrs[@]}" --cluster-replicas 1 --cluster-yes \
        </dev/null >"$dir/cluster-create.log" 2>&1; then
        echo "--- $dir/cluster-create.log" >&2
        tail -n 40 "$dir/cluster-create.log" >&2
        fail_with_logs "$dir" "redis-cli --cluster create failed (log: $dir/cluster-create.log)" "${CLUSTER_NODES[@]}"
    fi
    wait_cluster_ready "$dir"
    STARTING_DIR=""
    url_list "$dir"
}

wait_failover_cluster() {
    local dir=$1 old=$2
    wait_cluster_ready "$dir" "$old"
}

cmd_migrate_slot() {
    local key=$1 dir slot deadline=$((SECONDS + WAIT_SECS))
    dir=$(ha_dir "$2")
    need_topology "$dir" cluster migrate-slot
    until slot=$(key_slot "$dir" "$key"); do
        ((SECONDS < deadline)) || die "no live node of $dir answered CLUSTER KEYSLOT"
        sleep 0.2
    done
    local src_id src dst_id="" dst="" view node sm
    sm=$(wait_slot_master "$dir" "$slot")
    read -r src_id src <<<"$sm"
    local sport=${src##*:}
    view=$(cluster_nodes "$sport") || die "source master $src did not answer CLUSTER NODES"
    # The destination: the first other live master with slots, in node order.
    local masters
    masters=$(awk '$3 ~ /(^|,)master(,|$)/ && $3 !~ /fail/ && NF > 8 { split($2, a, "[@,]"); print $1, a[1] }' <<<"$view")
    local id addr
    for node in "${CLUSTER_NODES[@]}"; do
        node_live "$dir" "$node" || continue
        while read -r id addr; do
            if [[ $addr == "$(addr_of "$dir" "$node")" && $id != "$src_id" ]]; then
                dst_id=$id
                dst=$addr
            fi
        done <<<"$masters"
        [[ -n $dst ]] && break
    done
    [[ -n $dst ]] || die "no other live master to move slot $slot to (masters seen by $src: $masters)"
    local dport=${dst##*:}
    expect_reply OK "$dport" CLUSTER SETSLOT "$slot" IMPORTING "$src_id"
    expect_reply OK "$sport" CLUSTER SETSLOT "$slot" MIGRATING "$dst_id"
    local keys out moved=0
    while :; do
        ((SECONDS < deadline)) || die "moving the keys of slot $slot from $src to $dst took over ${WAIT_SECS}s ($moved moved)"
        # One key a line: a key with a newline in it would not survive this.
        out=$(rcli "$sport" CLUSTER GETKEYSINSLOT "$slot" 100) || die "CLUSTER GETKEYSINSLOT $slot on $src failed"
        [[ -n $out ]] || break
        mapfile -t keys <<<"$out"
        expect_reply "OK NOKEY" "$sport" MIGRATE 127.0.0.1 "$dport" "" 0 2000 KEYS "${keys[@]}"
        moved=$((moved + ${#keys[@]}))
    done
    # The destination first, then the source, then the other masters.
    expect_reply OK "$dport" CLUSTER SETSLOT "$slot" NODE "$dst_id"
    expect_reply OK "$sport" CLUSTER SETSLOT "$slot" NODE "$dst_id"
    while read -r id addr; do
        [[ $id == "$src_id" || $id == "$dst_id" ]] && continue
        # A master that is down or paused learns it from the destination's new epoch.
        node=$(node_with_port "$dir" "${addr##*:}") || continue
        node_live "$dir" "$node" || continue
        expect_reply OK "${addr##*:}" CLUSTER SETSLOT "$slot" NODE "$dst_id"
    done <<<"$masters"
    # Replicas learn it by gossip: wait until every live node names the destination.
    local agreed
    while :; do
        agreed=1
        for node in "${CLUSTER_NODES[@]}"; do
            node_live "$dir" "$node" || continue
            [[ $(cluster_nodes "$(node_port "$dir" "$node")" | owner_of_slot "$slot") == "$dst_id $dst" ]] || agreed=0
        done
        ((agreed)) && break
        ((SECONDS < deadline)) ||
            fail_with_logs "$dir" "not every live node of $dir named $dst as slot $slot's owner within ${WAIT_SECS}s" \
                "${CLUSTER_NODES[@]}" || exit 1
        sleep 0.1
    done
    echo "$slot $src $dst"
}

# --- Both --------------------------------------------------------------------------------------

cmd_stop() {
    local dir=$1 node pid pids=()
    [[ -d $dir ]] || return 0
    dir=$(cd "$dir" && pwd)
    for node in "${ALL_NODES[@]}"; do
        if pid=$(node_pid "$dir" "$node"); then
            pids+=("$pid")
        fi
    done
    if ((${#pids[@]})); then
        kill -TERM "${pids[@]}" 2>/dev/null || true
        # A paused node gets the TERM only once it runs again.
        kill -CONT "${pids[@]}" 2>/dev/null || true
        local alive
        for _ in $(seq 1 50); do
            alive=0
            for node in "${ALL_NODES[@]}"; do
                node_pid "$dir" "$node" >/dev/null && alive=1
            done
            ((alive)) || break
            sleep 0.1
        done
        for node in "${ALL_NODES[@]}"; do
            if pid=$(node_pid "$dir" "$node"); then
                kill -KILL "$pid" 2>/dev/null || true
            fi
        done
    fi
    for node in "${ALL_NODES[@]}"; do
        rm -f "$dir/$node/pid"
    done
}

cmd_node_of() {
    local addr=$1 dir port node
    dir=$(ha_dir "$2")
    port=${addr##*:}
    [[ $port =~ ^[0-9]+$ ]] || die "not a host:port: $addr"
    node=$(node_with_port "$dir" "$port") || die "no node of $dir has port $port"
    echo "$node"
}

cmd_kill() {
    local node=$1 dir pid
    dir=$(ha_dir "$2")
    check_node "$dir" "$node"
    pid=$(node_pid "$dir" "$node") || die "node $node of $dir is not running"
    kill -KILL "$pid"
    for _ in $(seq 1 100); do
        node_pid "$dir" "$node" >/dev/null || break
        sleep 0.05
    done
    rm -f "$dir/$node/pid"
}

cmd_signal() {
    local sig=$1 node=$2 dir pid
    dir=$(ha_dir "$3")
    check_node "$dir" "$node"
    pid=$(node_pid "$dir" "$node") || die "node $node of $dir is not running"
    kill "-$sig" "$pid"
}

cmd_start_one() {
    local node=$1 dir
    dir=$(ha_dir "$2")
    check_node "$dir" "$node"
    ensure_installed
    start_node "$dir" "$node"
    wait_ping "$dir" "$node" || exit 1
}

cmd_wait_failover() {
    local old=$1 dir
    dir=$(ha_dir "$2")
    [[ ${old##*:} =~ ^[0-9]+$ ]] || die "OLD must be host:port: $old"
    case $(topology "$dir") in
    sentinel) wait_failover_sentinel "$dir" "$old" ;;
    cluster) wait_failover_cluster "$dir" "$old" ;;
    esac
}

case "${1:-}" in
sentinel-start) [[ $# -eq 2 ]] || usage; cmd_sentinel_start "$2" ;;
cluster-start) [[ $# -eq 2 ]] || usage; cmd_cluster_start "$2" ;;
stop) [[ $# -eq 2 ]] || usage; cmd_stop "$2" ;;
url) [[ $# -eq 2 ]] || usage; dir=$(ha_dir "$2"); url_list "$dir" ;;
master) [[ $# -eq 2 ]] || usage; cmd_master "$2" ;;
master-of) [[ $# -eq 3 ]] || usage; cmd_master_of "$2" "$3" ;;
node-of) [[ $# -eq 3 ]] || usage; cmd_node_of "$2" "$3" ;;
kill) [[ $# -eq 3 ]] || usage; cmd_kill "$2" "$3" ;;
start-one) [[ $# -eq 3 ]] || usage; cmd_start_one "$2" "$3" ;;
pause) [[ $# -eq 3 ]] || usage; cmd_signal STOP "$2" "$3" ;;
resume) [[ $# -eq 3 ]] || usage; cmd_signal CONT "$2" "$3" ;;
wait-failover) [[ $# -eq 3 ]] || usage; cmd_wait_failover "$2" "$3" ;;
migrate-slot) [[ $# -eq 3 ]] || usage; cmd_migrate_slot "$2" "$3" ;;
*) usage ;;
esac
