#!/usr/bin/env bash
# The Windows build's tests, run under Wine: `x86_64-pc-windows-gnu`,
# linked by mingw and run by Debian's wine64. Installs what it needs
# (packages, the rustup target), makes a Wine prefix under the target
# directory, and builds into it the one DLL Debian's Wine 8 lacks
# (scripts/wine/bcryptprimitives.c: without it no Rust program starts).
#
#   bash scripts/wine.sh              the engine's tests and the CLI's
#                                     real-process suites
#   bash scripts/wine.sh --build LIST builds them and lists their executables
#   bash scripts/wine.sh --run LIST   runs what --build listed (the test
#                                     command, scripts/test.sh, runs them
#                                     so, while it builds other things)
#   bash scripts/wine.sh cargo ARGS   any cargo command, set up for Wine
#
# What cannot run under Wine, and why, is listed in docs/platforms.md.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ensure_packages wine64 gcc-mingw-w64-x86-64
target=x86_64-pc-windows-gnu
rustup target list --installed | grep -qx "$target" || rustup target add "$target"

wine=$(command -v wine64 || echo /usr/lib/wine/wine64)
[ -x "$wine" ] || { echo "wine64 not found" >&2; exit 1; }
target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
export WINEPREFIX=${NIP_LE_WINEPREFIX:-$target_dir/wine}
# Wine's own errors are shown (a process that cannot start, an exception),
# its diagnostics of the missing display are not: a test executable that
# ended printing nothing says why (with the exit status,
# run_test_executables).
export WINEDEBUG=${WINEDEBUG:--all,err+all,-winediag,-systray}
if [ ! -f "$WINEPREFIX/system.reg" ]; then
  echo "== a Wine prefix in $WINEPREFIX"
  # It also reports that it has no 32-bit rundll32: nothing here is 32-bit.
  "$wine" wineboot --init >/dev/null 2>&1 || true
  # The registry files are written when the wineserver exits, which may
  # be after wineboot returns (a fresh machine's first boot): wait for it.
  "$(command -v wineserver || echo /usr/lib/wine/wineserver)" -w || true
  [ -f "$WINEPREFIX/system.reg" ] || { echo "wineboot made no prefix in $WINEPREFIX" >&2; exit 1; }
fi
dll=$WINEPREFIX/drive_c/windows/system32/bcryptprimitives.dll
if [ ! -f "$dll" ] || [ scripts/wine/bcryptprimitives.c -nt "$dll" ]; then
  x86_64-w64-mingw32-gcc -O2 -shared -o "$dll" \
    scripts/wine/bcryptprimitives.c scripts/wine/bcryptprimitives.def -ladvapi32
fi
export CARGO_TARGET_X86_64_PC_WINDOWS_GNU_LINKER=x86_64-w64-mingw32-gcc
export CARGO_TARGET_X86_64_PC_WINDOWS_GNU_RUNNER=$wine

# The engine's tests skip the exhaustive model check (the same pure code
# on every target; it runs on Linux, and would cost minutes under Wine).
engine=(--target "$target" -p nip-le --features etcd)
suites=(--target "$target" -p nip-le-lab --test multiprocess --test pauses --test lock_holds --test mixed --test turns)
case "${1-}" in
  "") ;;
  --build)
    # --build LIST: builds both, and lists their executables in LIST (for
    # --run; the test command runs them while it builds other things).
    { test_executables "${engine[@]}" && test_executables "${suites[@]}"; } >"$2.part"
    mv "$2.part" "$2"
    exit ;;
  --run)
    # --run LIST: runs the executables --build listed, under Wine.
    run_test_executables "$2" "$wine" -- --skip model::
    exit ;;
  *) exec "$@" ;;
esac

echo "== Windows under Wine: the engine's unit and integration tests (etcd feature; the exhaustive model check runs on Linux only, for time)"
cargo test "${engine[@]}" -- --skip model::
echo "== Windows under Wine: the CLI's real-process suites (nip-le-lab.exe instances, LockFileEx, TerminateProcess, NtSuspendProcess)"
cargo test "${suites[@]}"
