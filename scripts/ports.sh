# shellcheck shell=bash
# free_ports N: prints N distinct free TCP ports on 127.0.0.1, chosen below the kernel's ephemeral
# range (net.ipv4.ip_local_port_range), where outgoing connections take their local ports: a
# server restarted on its port (a fault test's restart) must not find it taken by some client's
# connection. Sourced by scripts/lib.sh, etcd-cluster.sh, zk-ensemble.sh and redis-ha.sh.
free_ports() {
  local want=$1 low=32768 out=() p tries=0
  read -r low _ </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || low=32768
  ((low > 11000)) || low=60000
  python3 - "$want" "$low" <<'PY' 2>/dev/null && return
import random, socket, sys
want, low = int(sys.argv[1]), int(sys.argv[2])
socks, ports = [], []
for _ in range(10000):
    if len(ports) == want:
        break
    p = random.randrange(10000, low)
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", p))
    except OSError:
        s.close()
        continue
    socks.append(s)
    ports.append(p)
if len(ports) < want:
    sys.exit(1)
print(" ".join(map(str, ports)))
PY
  # No python3: random ports in that range that nothing listens on.
  while ((${#out[@]} < want)); do
    ((tries++ < 1000)) || { echo "could not find $want free ports" >&2; return 1; }
    p=$((10000 + (RANDOM * 32768 + RANDOM) % (low - 10000)))
    [[ " ${out[*]} " == *" $p "* ]] && continue
    ss -ltnH "sport = :$p" 2>/dev/null | grep -q . && continue
    out+=("$p")
  done
  echo "${out[*]}"
}
