#!/usr/bin/env bash
# A three-member etcd cluster on loopback, for dlock's tests.
#
#   scripts/etcd-cluster.sh start DIR        start members 1..3 (data, logs, pids, ports under DIR/mI);
#                                            prints the endpoints 127.0.0.1:c1,127.0.0.1:c2,127.0.0.1:c3
#   scripts/etcd-cluster.sh stop DIR         stop exactly the members recorded in DIR (by pid)
#   scripts/etcd-cluster.sh url DIR          print the endpoints of a cluster started in DIR
#   scripts/etcd-cluster.sh endpoint N DIR   print member N's client endpoint 127.0.0.1:port
#   scripts/etcd-cluster.sh leader DIR       print the index (1..3) of the current leader
#   scripts/etcd-cluster.sh kill N DIR       kill member N (SIGKILL, by its recorded pid)
#   scripts/etcd-cluster.sh start-one N DIR  start member N again (same ports and data), wait until healthy
#   scripts/etcd-cluster.sh pause N DIR      SIGSTOP member N
#   scripts/etcd-cluster.sh resume N DIR     SIGCONT member N
#
# Installs the Debian packages etcd-server and etcd-client with apt-get when etcd or etcdctl is
# missing. Every port (client, peer) is a free port on 127.0.0.1 chosen at `start`; nothing listens
# elsewhere and there is no metrics listener. Raft timing is fast for fail-over tests: heartbeat
# 50 ms, election timeout 500 ms. Members run in their own session (setsid) and outlive this
# script; each one's pid is in DIR/mI/pid and only a pid whose command line names etcd and DIR is
# ever signalled. Every wait is bounded (ETCD_WAIT_SECS, default 60); errors go to stderr with the
# logs' tails.
set -euo pipefail

WAIT_SECS=${ETCD_WAIT_SECS:-60}
N=3
export ETCDCTL_API=3

die() {
    echo "etcd-cluster: $*" >&2
    exit 1
}

usage() {
    sed -n '2,13p' "$0" >&2
    exit 2
}

ensure_installed() {
    if command -v etcd >/dev/null && command -v etcdctl >/dev/null; then
        return
    fi
    command -v apt-get >/dev/null || die "etcd or etcdctl is missing and apt-get is not available"
    echo "etcd-cluster: installing the Debian packages etcd-server and etcd-client" >&2
    local sudo=""
    [[ $(id -u) -eq 0 ]] || sudo="sudo"
    $sudo apt-get update -qq >&2 || die "apt-get update failed"
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends etcd-server etcd-client >&2 ||
        die "apt-get install etcd-server etcd-client failed"
    if ! command -v etcd >/dev/null || ! command -v etcdctl >/dev/null; then
        die "etcd-server and etcd-client installed but etcd or etcdctl is missing"
    fi
}

# free_ports N (below the ephemeral port range).
. "$(dirname "${BASH_SOURCE[0]}")/ports.sh"

check_index() {
    [[ $1 =~ ^[1-3]$ ]] || die "member index must be 1, 2 or 3"
}

# DIR/mI/ports holds "CLIENT_PORT PEER_PORT".
client_port() {
    local c
    read -r c _ <"$1/m$2/ports"
    echo "$c"
}

peer_port() {
    local p
    read -r _ p <"$1/m$2/ports"
    echo "$p"
}

# Prints DIR as an absolute path (the form start recorded in the members' command lines) after
# checking that start configured a cluster there.
cluster_dir() {
    local dir i
    [[ -d $1 ]] || die "no cluster in $1 (run start first)"
    dir=$(cd "$1" && pwd)
    for i in $(seq 1 $N); do
        [[ -f $dir/m$i/ports ]] || die "no member $i configured in $dir (run start first)"
    done
    echo "$dir"
}

endpoint() {
    echo "127.0.0.1:$(client_port "$1" "$2")"
}

endpoints() {
    local dir=$1 i out=()
    for i in $(seq 1 $N); do
        out+=("$(endpoint "$dir" "$i")")
    done
    local IFS=,
    echo "${out[*]}"
}

# Prints member I's pid when it is running and is our etcd (its command line names etcd and DIR,
# so a reused pid is never taken for it); fails otherwise.
member_pid() {
    local dir=$1 i=$2 pid cmdline
    [[ -f $dir/m$i/pid ]] || return 1
    pid=$(cat "$dir/m$i/pid")
    [[ $pid =~ ^[0-9]+$ ]] || return 1
    cmdline=$(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline") || return 1
    [[ $cmdline == *etcd* && $cmdline == *"$dir/m$i/"* ]] || return 1
    echo "$pid"
}

ctl() {
    etcdctl --dial-timeout=1s --command-timeout=2s "$@"
}

logs_tail() {
    local dir=$1 i
    for i in "${@:2}"; do
        echo "--- member $i: $dir/m$i/etcd.log (and stderr.log)" >&2
        tail -n 20 "$dir/m$i/stderr.log" >&2 2>/dev/null || true
        tail -n 30 "$dir/m$i/etcd.log" >&2 2>/dev/null || true
    done
}

start_member() {
    local dir=$1 i=$2
    local mdir="$dir/m$i" c p j cluster=() initial token
    member_pid "$dir" "$i" >/dev/null && return
    c=$(client_port "$dir" "$i")
    p=$(peer_port "$dir" "$i")
    for j in $(seq 1 $N); do
        cluster+=("m$j=http://127.0.0.1:$(peer_port "$dir" "$j")")
    done
    initial=$(IFS=,; echo "${cluster[*]}")
    token=$(cat "$dir/token")
    rm -f "$mdir/pid"
    # etcd 3.4 refuses to run on architectures other than amd64 and ppc64le unless told to.
    case $(uname -m) in
    x86_64 | ppc64le) ;;
    aarch64) export ETCD_UNSUPPORTED_ARCH=arm64 ;;
    *) ETCD_UNSUPPORTED_ARCH=$(uname -m) && export ETCD_UNSUPPORTED_ARCH ;;
    esac
    # etcd takes every ETCD_* variable for a flag (ETCD_WAIT_SECS included): the members get none
    # but ETCD_UNSUPPORTED_ARCH, so only the flags below configure them.
    local unset_env=() v
    for v in $(compgen -e); do
        [[ $v == ETCD_* && $v != ETCD_UNSUPPORTED_ARCH ]] && unset_env+=(-u "$v")
    done
    # The child writes its own pid, then becomes etcd: the recorded pid is etcd's whether or not
    # setsid had to fork. An existing data dir ignores the --initial-cluster* flags.
    # shellcheck disable=SC2016 # expanded by the child
    env "${unset_env[@]}" setsid bash -c 'echo $$ >"$1.tmp" && mv "$1.tmp" "$1" && shift && exec "$@"' _ "$mdir/pid" \
        etcd --name "m$i" --data-dir "$mdir/data" \
        --listen-client-urls "http://127.0.0.1:$c" --advertise-client-urls "http://127.0.0.1:$c" \
        --listen-peer-urls "http://127.0.0.1:$p" --initial-advertise-peer-urls "http://127.0.0.1:$p" \
        --initial-cluster "$initial" --initial-cluster-state new --initial-cluster-token "$token" \
        --heartbeat-interval 50 --election-timeout 500 \
        --logger zap --log-outputs "$mdir/etcd.log" \
        </dev/null >>"$mdir/stderr.log" 2>&1 &
    disown $!
    local deadline=$((SECONDS + 10))
    until [[ -s $mdir/pid ]]; do
        ((SECONDS < deadline)) || die "member $i did not record its pid in $mdir/pid"
        sleep 0.05
    done
}

# Waits until every member in I... answers `endpoint health` (a quorum read: needs a leader).
wait_healthy() {
    local dir=$1 i eps=() deadline=$((SECONDS + WAIT_SECS))
    for i in "${@:2}"; do
        eps+=("$(endpoint "$dir" "$i")")
    done
    local list
    list=$(IFS=,; echo "${eps[*]}")
    while ((SECONDS < deadline)); do
        for i in "${@:2}"; do
            member_pid "$dir" "$i" >/dev/null || {
                logs_tail "$dir" "$i"
                echo "etcd-cluster: member $i exited; log: $dir/m$i/etcd.log" >&2
                return 1
            }
        done
        if ctl --endpoints="$list" endpoint health >/dev/null 2>&1 && find_leader "$dir" >/dev/null; then
            return 0
        fi
        sleep 0.2
    done
    logs_tail "$dir" "${@:2}"
    echo "etcd-cluster: members ${*:2} of $dir not healthy within ${WAIT_SECS}s" >&2
    return 1
}

# Prints the index of the member that answers with itself as leader (the highest term wins, in
# case a resumed old leader has not yet heard of the new term); fails if there is none. A paused
# (stopped) member is skipped: it cannot answer, and asking it would only wait for the timeout.
find_leader() {
    local dir=$1 i pid state fields id lead term best=0 best_term=-1
    for i in $(seq 1 $N); do
        pid=$(member_pid "$dir" "$i") || continue
        state=$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1) || continue
        [[ $state == [TtZ] ]] && continue
        fields=$(etcdctl --dial-timeout=1s --command-timeout=1s --endpoints="$(endpoint "$dir" "$i")" \
            endpoint status -w fields 2>/dev/null) || continue
        id=$(awk -F' : ' '$1 == "\"MemberID\"" { print $2; exit }' <<<"$fields")
        lead=$(awk -F' : ' '$1 == "\"Leader\"" { print $2; exit }' <<<"$fields")
        term=$(awk -F' : ' '$1 == "\"RaftTerm\"" { print $2; exit }' <<<"$fields")
        [[ -n $id && $id != 0 && $id == "$lead" && $term =~ ^[0-9]+$ ]] || continue
        if ((term > best_term)); then
            best=$i
            best_term=$term
        fi
    done
    ((best > 0)) || return 1
    echo "$best"
}

cmd_start() {
    local dir=$1
    ensure_installed
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    local i
    for i in $(seq 1 $N); do
        if member_pid "$dir" "$i" >/dev/null; then
            die "member $i of $dir is already running (pid $(cat "$dir/m$i/pid")); stop it first"
        fi
    done
    # A free port can be taken by another process between free_ports and etcd's bind, and a member
    # then exits at once: a failed start is retried on fresh ports and a fresh data dir (the logs
    # of each failed try are printed first).
    local ports try
    for try in 1 2 3; do
        read -r -a ports <<<"$(free_ports $((2 * N)))"
        ((${#ports[@]} == 2 * N)) || die "could not find free ports"
        echo "dlock-test-$(date +%s%N)-$$-$RANDOM" >"$dir/token"
        for i in $(seq 1 $N); do
            rm -rf "$dir/m$i"
            mkdir -p "$dir/m$i"
            echo "${ports[$((2 * (i - 1)))]} ${ports[$((2 * (i - 1) + 1))]}" >"$dir/m$i/ports"
        done
        for i in $(seq 1 $N); do
            start_member "$dir" "$i"
        done
        if wait_healthy "$dir" 1 2 3; then
            endpoints "$dir"
            return
        fi
        cmd_stop "$dir"
        echo "etcd-cluster: start try $try of 3 failed (ports ${ports[*]})" >&2
    done
    exit 1
}

cmd_stop() {
    local dir=$1 i pid pids=()
    [[ -d $dir ]] || return 0
    dir=$(cd "$dir" && pwd)
    for i in $(seq 1 $N); do
        if pid=$(member_pid "$dir" "$i"); then
            pids+=("$pid")
        fi
    done
    if ((${#pids[@]})); then
        kill -TERM "${pids[@]}" 2>/dev/null || true
        # A paused member gets the TERM only once it runs again.
        kill -CONT "${pids[@]}" 2>/dev/null || true
        local alive
        for _ in $(seq 1 50); do
            alive=0
            for i in $(seq 1 $N); do
                member_pid "$dir" "$i" >/dev/null && alive=1
            done
            ((alive)) || break
            sleep 0.1
        done
        for i in $(seq 1 $N); do
            if pid=$(member_pid "$dir" "$i"); then
                kill -KILL "$pid" 2>/dev/null || true
            fi
        done
    fi
    for i in $(seq 1 $N); do
        rm -f "$dir/m$i/pid"
    done
}

cmd_leader() {
    local dir deadline=$((SECONDS + WAIT_SECS))
    dir=$(cluster_dir "$1")
    while ((SECONDS < deadline)); do
        find_leader "$dir" && return
        sleep 0.1
    done
    die "no leader in $dir within ${WAIT_SECS}s"
}

cmd_kill() {
    local i=$1 dir pid
    check_index "$i"
    dir=$(cluster_dir "$2")
    pid=$(member_pid "$dir" "$i") || die "member $i of $dir is not running"
    kill -KILL "$pid"
    for _ in $(seq 1 100); do
        member_pid "$dir" "$i" >/dev/null || break
        sleep 0.05
    done
    rm -f "$dir/m$i/pid"
}

cmd_signal() {
    local sig=$1 i=$2 dir pid
    check_index "$i"
    dir=$(cluster_dir "$3")
    pid=$(member_pid "$dir" "$i") || die "member $i of $dir is not running"
    kill "-$sig" "$pid"
}

cmd_start_one() {
    local i=$1 dir
    check_index "$i"
    dir=$(cluster_dir "$2")
    ensure_installed
    start_member "$dir" "$i"
    wait_healthy "$dir" "$i" || exit 1
}

case "${1:-}" in
start) [[ $# -eq 2 ]] || usage; cmd_start "$2" ;;
stop) [[ $# -eq 2 ]] || usage; cmd_stop "$2" ;;
url) [[ $# -eq 2 ]] || usage; dir=$(cluster_dir "$2"); endpoints "$dir" ;;
endpoint) [[ $# -eq 3 ]] || usage; check_index "$2"; dir=$(cluster_dir "$3"); endpoint "$dir" "$2" ;;
leader) [[ $# -eq 2 ]] || usage; cmd_leader "$2" ;;
kill) [[ $# -eq 3 ]] || usage; cmd_kill "$2" "$3" ;;
start-one) [[ $# -eq 3 ]] || usage; cmd_start_one "$2" "$3" ;;
pause) [[ $# -eq 3 ]] || usage; cmd_signal STOP "$2" "$3" ;;
resume) [[ $# -eq 3 ]] || usage; cmd_signal CONT "$2" "$3" ;;
*) usage ;;
esac
