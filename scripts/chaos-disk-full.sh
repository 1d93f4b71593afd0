#!/usr/bin/env bash
# Real-process chaos with the lock directory's filesystem full now and
# then (docs/work-ledger.md, "A full or failing disk"): `nip-le-lab chaos`
# keeps its lock directories (lock files, ledgers, presence) on a small
# tmpfs (`--locks-on`) and fills it for FULL_S seconds every GAP_S
# seconds (`--fill-locks-fs-s`); the feed and the replies stay off it.
# Needs root (it mounts the tmpfs) and a built `nip-le-lab`. Not part of the
# test command: a measurement, reported in the docs. Extra arguments go
# to `nip-le-lab chaos`.
#
#   sudo bash scripts/chaos-disk-full.sh --seconds 90 --turn-ms 60
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${NIP_LE_BIN:-target/debug/nip-le-lab}"
mnt=$(mktemp -d)
mount -t tmpfs -o size=32m tmpfs "$mnt"
trap 'umount -l "$mnt" 2>/dev/null || true; rmdir "$mnt" 2>/dev/null || true' EXIT
"$bin" chaos --locks-on "$mnt" --fill-locks-fs-s "${FULL_S:-6}" --fill-every-s "${GAP_S:-16}" "$@"
