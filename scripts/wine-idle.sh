#!/usr/bin/env bash
# An idle observer under Wine, measured from Linux (the bench's idle row
# reads /proc of a Windows pid, which Wine does not give; each Windows
# process is a Linux process here): a leader, then an observer of the same
# key; after 8 s, for 20 s, the voluntary context switches of each of the
# observer's threads (each wineserver call is one) and how often its writer
# evaluated its key (its debug log).
#
#   bash scripts/wine-idle.sh [path/to/nip-le-lab.exe]
#
# Build it first: bash scripts/wine.sh cargo build --release
#   --target x86_64-pc-windows-gnu -p nip-le-lab
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
exe=${1:-$root/target/x86_64-pc-windows-gnu/release/nip-le-lab.exe}
export WINEPREFIX=${NIP_LE_WINEPREFIX:-${CARGO_TARGET_DIR:-$root/target}/wine} WINEDEBUG=-all
[ -f "$WINEPREFIX/system.reg" ] || { echo "no Wine prefix: run bash scripts/wine.sh once" >&2; exit 1; }
wine=$(command -v wine64 || echo /usr/lib/wine/wine64)
dir=$(mktemp -d)
log=$dir.observer.log
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$dir" "$log"; }
trap cleanup EXIT
pk=$(head -c32 /dev/urandom | od -An -tx1 | tr -d ' \n')
windir="Z:${dir//\//\\}"
"$wine" "$exe" run --pubkey "$pk" --lock-dir "$windir" >/dev/null 2>&1 &
pids+=($!)
sleep 6
NIP_LE_LOG=nip_le=debug "$wine" "$exe" run --pubkey "$pk" --lock-dir "$windir" >/dev/null 2>"$log" &
pids+=($!)
sleep 8
# The observer's Linux process: the newest one running this exe with our key.
pid=$(pgrep -n -f "run --pubkey $pk") || { echo "the observer did not start" >&2; exit 1; }
declare -A before
for t in /proc/"$pid"/task/*; do before[$t]=$(awk '/^voluntary_ctxt_switches/{print $2}' "$t/status"); done
e0=$(grep -c evaluated "$log" || true)
sleep 20
e1=$(grep -c evaluated "$log" || true)
for t in /proc/"$pid"/task/*; do
  n=$(( $(awk '/^voluntary_ctxt_switches/{print $2}' "$t/status") - ${before[$t]:-0} ))
  if [ "$n" -gt 0 ]; then
    awk -v n="$n" -v c="$(cat "$t/comm")" 'BEGIN { printf "%-16s %6.1f switches/s\n", c, n / 20 }'
  fi
done
awk -v n="$((e1 - e0))" 'BEGIN { printf "%-16s %6.2f evaluations/s\n", "writer", n / 20 }'
