#!/usr/bin/env bash
# A network file system on loopback, for the test that the SQLite store refuses one: an sshd on a
# free 127.0.0.1 port (its own host key, config and pid file under DIR) and an sshfs mount of
# DIR/export at DIR/mnt (FUSE, type fuse.sshfs).
#
#   scripts/netfs.sh start DIR    mount; prints the mount point (DIR/mnt)
#   scripts/netfs.sh stop DIR     unmount and stop exactly the sshd recorded in DIR (by pid)
#
# Installs the Debian packages sshfs and openssh-server when they are missing.
set -euo pipefail

die() {
    echo "netfs: $*" >&2
    exit 1
}

[[ $# -eq 2 ]] || die "usage: $0 start|stop DIR"
cmd=$1
dir=$2

install() {
    command -v sshfs >/dev/null && [[ -x /usr/sbin/sshd ]] && return
    echo "netfs: installing the Debian packages sshfs and openssh-server" >&2
    local sudo=""
    [[ $(id -u) -eq 0 ]] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq sshfs openssh-server >/dev/null
}

start() {
    install
    [[ -e /dev/fuse ]] || die "no /dev/fuse: this machine cannot mount FUSE file systems"
    mkdir -p "$dir/export" "$dir/mnt"
    rm -f "$dir/host_key" "$dir/client_key"
    ssh-keygen -q -t ed25519 -N '' -f "$dir/host_key"
    ssh-keygen -q -t ed25519 -N '' -f "$dir/client_key"
    cp "$dir/client_key.pub" "$dir/authorized_keys"
    local port
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')
    cat >"$dir/sshd_config" <<EOF
ListenAddress 127.0.0.1
Port $port
HostKey $dir/host_key
AuthorizedKeysFile $dir/authorized_keys
PidFile $dir/sshd.pid
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
PermitRootLogin prohibit-password
StrictModes no
Subsystem sftp internal-sftp
EOF
    # sshd insists on its privilege-separation directory.
    [[ -d /run/sshd ]] || mkdir -p /run/sshd 2>/dev/null || sudo mkdir -p /run/sshd
    /usr/sbin/sshd -f "$dir/sshd_config" -E "$dir/sshd.log" || die "sshd did not start: $(tail -5 "$dir/sshd.log")"
    local i
    for i in $(seq 1 100); do
        [[ -s $dir/sshd.pid ]] && break
        sleep 0.05
    done
    sshfs -p "$port" \
        -o "IdentityFile=$dir/client_key,StrictHostKeyChecking=no,UserKnownHostsFile=/dev/null,BatchMode=yes,ConnectTimeout=10" \
        "$(id -un)@127.0.0.1:$dir/export" "$dir/mnt" || die "sshfs did not mount: $(tail -5 "$dir/sshd.log")"
    grep -q " $dir/mnt .* - fuse.sshfs " /proc/self/mountinfo || die "$dir/mnt is not an sshfs mount"
    echo "$dir/mnt"
}

stop() {
    if grep -q " $dir/mnt " /proc/self/mountinfo 2>/dev/null; then
        fusermount -u "$dir/mnt" 2>/dev/null || fusermount3 -u "$dir/mnt" 2>/dev/null || umount "$dir/mnt" || true
    fi
    if [[ -s $dir/sshd.pid ]]; then
        kill "$(cat "$dir/sshd.pid")" 2>/dev/null || true
        rm -f "$dir/sshd.pid"
    fi
}

case $cmd in
start) start ;;
stop) stop ;;
*) die "usage: $0 start|stop DIR" ;;
esac
