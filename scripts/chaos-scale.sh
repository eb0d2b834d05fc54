#!/usr/bin/env bash
# The scale run of dlock's fault injection (docs/RELIABILITY.md, "The scale run"): every backend ×
# fault with at least 10 000 acquisitions and 100 injected faults per scenario. Each scenario runs
# 24 lanes (SQLite 8; independent lock names, each with its own fenced resource and 2 client
# processes); a fault of a client process is injected by an eighth of the lanes per round, in
# turn, a fault of the store once and seen by every lane. In the store-side fault scenarios a
# quarter of the holds last 1-3 s (the rest 50-150 ms), and a fault aimed at a holder picks one of
# those. The backends run in groups, DLOCK_SCALE_JOBS (2) at a time, each group its own
# dlock-chaos with its own private servers; then scripts/check-history.py checks every raw record
# independently.
#
#   scripts/chaos-scale.sh                     # everything, into chaos-scale/ (4-5 hours)
#   scripts/chaos-scale.sh --fault kill        # extra arguments go to every dlock-chaos
#   DLOCK_SCALE_GROUPS="sqlite redis;postgres" scripts/chaos-scale.sh   # these groups only
#   DLOCK_SCALE_DIR=/tmp/scale scripts/chaos-scale.sh
#
# Writes DIR/scale-report.md (every group's rows in one table, then each group's notes and
# fail-over tables), DIR/GROUP.{json,md,log}, DIR/check-GROUP.md and the raw records in
# DIR/events-GROUP/. Exits 1 if a promised property failed or the checker disagreed.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/dlock-target}"
# shellcheck source=scripts/lib.sh
. scripts/lib.sh

OUT="${DLOCK_SCALE_DIR:-chaos-scale}"
# Groups of backends that run at once, each in its own dlock-chaos process (";" between groups).
GROUPS_SPEC="${DLOCK_SCALE_GROUPS:-sqlite sqlite-tmpfs lanes=8;redis;postgres;mysql;zookeeper;etcd;postgres-session;mysql-session;redis-aof redlock;redis-sentinel;redis-sentinel-wait;redis-cluster;redis-cluster-wait}"
# A group's word lanes=N runs its scenarios with N lanes instead (SQLite: one file, one writer).
# The private servers' directories (data and logs) outlive the run, for reading after a failure;
# each group's log names them ("data and logs kept in ..."); remove them by hand.
export DLOCK_KEEP_SERVER_DIRS=1
SCALE=(--workers 2 --faults-per-scenario 100 --min-acquisitions 10000 --gap-ms 1000 --long-share 25)
LANES=24

need_private_servers
need_pkg faketime faketime
log "building dlock-chaos and dlock (release)"
cargo build --release --locked -p dlock-chaos -p dlock-cli
rm -rf "$OUT"
mkdir -p "$OUT"
IFS=';' read -r -a groups <<<"$GROUPS_SPEC"
start=$(date +%s)
# At most JOBS groups at a time (the client processes of one group can keep a core busy; four
# at a time starved clients of CPU past their lease).
JOBS="${DLOCK_SCALE_JOBS:-2}"
names=()
running=0
for g in "${groups[@]}"; do
  read -r -a backends <<<"$g"
  [ "${#backends[@]}" -gt 0 ] || continue
  if [ "$running" -ge "$JOBS" ]; then
    wait -n || true
    running=$((running - 1))
  fi
  name="${backends[0]}"
  args=()
  lanes=$LANES
  for b in "${backends[@]}"; do
    case "$b" in
      lanes=*) lanes="${b#lanes=}" ;;
      *) args+=(--backend "$b") ;;
    esac
  done
  args+=(--lanes "$lanes")
  log "group $name (${backends[*]}) starts after $(($(date +%s) - start)) s"
  (
    if "$CARGO_TARGET_DIR/release/dlock-chaos" "${args[@]}" "${SCALE[@]}" "$@" \
      --json "$OUT/$name.json" --markdown "$OUT/$name.md" --events "$OUT/events-$name" \
      >"$OUT/$name.log" 2>&1; then
      log "group $name: done after $(($(date +%s) - start)) s"
    else
      log "group $name: FAILED after $(($(date +%s) - start)) s (see $OUT/$name.log)"
      touch "$OUT/$name.failed"
    fi
  ) &
  running=$((running + 1))
  names+=("$name")
done
wait
rc=0
for name in "${names[@]}"; do
  [ -e "$OUT/$name.failed" ] && rc=1
done
elapsed=$(($(date +%s) - start))
for name in "${names[@]}"; do
  [ -f "$OUT/$name.json" ] || { rc=1; continue; }
  python3 scripts/check-history.py --report "$OUT/$name.json" --out "$OUT/check-$name.md" \
    "$OUT/events-$name" >/dev/null || rc=1
  log "check-history.py $name: $(tail -n1 "$OUT/check-$name.md")"
done
# One table: the first group's header, every group's rows; then each group's notes.
{
  echo "scripts/chaos-scale.sh: ${#names[@]} groups, $JOBS at a time, $elapsed s ($((elapsed / 60)) min) in all"
  echo
  first=1
  for name in "${names[@]}"; do
    [ -f "$OUT/$name.md" ] || continue
    if [ "$first" = 1 ]; then
      awk '/^\| backend \| fault \| resource/ {t=1} t && /^\|/ {print} t && !/^\|/ {exit}' "$OUT/$name.md"
      first=0
    else
      awk '/^\| backend \| fault \| resource/ {t=1; n=0} t && /^\|/ {if (++n > 2) print} t && !/^\|/ {exit}' "$OUT/$name.md"
    fi
  done
  for name in "${names[@]}"; do
    [ -f "$OUT/$name.md" ] || continue
    echo
    echo "### $name"
    echo
    head -n1 "$OUT/$name.md"
    awk '/^\| backend \| fault \| resource/ {t=1} t && !/^\|/ {r=1} r {print}' "$OUT/$name.md"
    echo
    echo "check-history.py: $(tail -n1 "$OUT/check-$name.md" 2>/dev/null || echo 'not run')"
  done
} >"$OUT/scale-report.md"
log "scale run: $elapsed s; the table is in $OUT/scale-report.md"
exit "$rc"
