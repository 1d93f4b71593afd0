#!/usr/bin/env bash
# Runs every test of the project. The README's test command and .ci/run call
# exactly this script. Prerequisites: Rust (cargo) and Node (npm). Missing
# system packages (Tauri's GTK/WebKit dev libraries, python3 for the interop
# tests) are installed when running as root with apt-get; otherwise the
# script names them and stops.
set -euo pipefail
cd "$(dirname "$0")/.."
# Each step's header names the minutes and seconds since the start, so a
# slow CI run says where its time went.
step() { printf '== [%dm%02ds] %s\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*"; }

# --- system packages -------------------------------------------------------
# Tauri v2 on Linux needs the WebKitGTK 4.1 / GTK 3 / libsoup 3 dev packages,
# even for the mock-runtime tests; python3 runs the independent foreign
# writer of the interop tests; etcd-server is the real etcd of the
# cross-host tests (each test starts its own on loopback and stops it);
# etcd-client's etcdctl fills one with work records for the slow-link test.
. scripts/lib.sh
ensure_packages pkg-config libwebkit2gtk-4.1-dev libgtk-3-dev libsoup-3.0-dev librsvg2-dev python3 etcd-server etcd-client
# Debian's package starts a system etcd on the default ports; the tests
# need none (they pick free ports), so it may stay or go.
export NIP_LE_REQUIRE_ETCD=1
# Line tables are all a failing test's backtrace needs; full debug info
# makes every test binary several times larger and slower to link.
export CARGO_PROFILE_DEV_DEBUG=line-tables-only CARGO_PROFILE_TEST_DEBUG=line-tables-only
for tool in cargo npm node; do
  command -v "$tool" >/dev/null 2>&1 || { echo "missing: $tool (install Rust with rustup, Node 20+ with npm)" >&2; exit 1; }
done

# --- TypeScript: guest-js bindings and the example's frontend ---------------
step "npm ci"
npm ci --no-audit --no-fund
step "guest-js: typecheck, build (ESM, CJS, .d.ts, api-iife.js), vitest"
npm run typecheck
npm run build
# api-iife.js is committed (build.rs hands it to Tauri, and the crate ships
# it): it must be what the build makes of guest-js.
git diff --quiet -- api-iife.js || { echo "api-iife.js is stale: commit the output of npm run build" >&2; exit 1; }
npm test
step "guest-js against the lowest @tauri-apps/api it accepts (^2.0.0): typecheck at 2.0.0, vitest at 2.7.0 (the first whose mocks deliver events)"
npm install --no-save --no-audit --no-fund @tauri-apps/api@2.0.0
npm run typecheck
npm install --no-save --no-audit --no-fund @tauri-apps/api@2.7.0
npm test
npm ci --no-audit --no-fund
step "npm pack: dist-js, types and README, built by prepack"
pack=$(npm pack --dry-run --json 2>/dev/null)
for f in dist-js/index.js dist-js/index.cjs dist-js/index.d.ts dist-js/bindings/LeadershipChange.d.ts README.md CHANGELOG.md LICENSE-MIT LICENSE-APACHE package.json; do
  grep -q "\"path\": \"$f\"" <<<"$pack" || { echo "npm pack is missing $f" >&2; exit 1; }
done
step "example app frontend (installs the API package from this checkout, as the README says)"
npm run build:example
step "the Buzz-shaped example's frontend: pnpm 11, a frozen lockfile, the API package from this checkout (as Buzz's desktop would install it)"
bash scripts/pnpm.sh examples/buzz-app install --frozen-lockfile
bash scripts/pnpm.sh examples/buzz-app run build
step "the README's code blocks are examples/readme-app's files, its TypeScript type-checks against guest-js, its links resolve"
node scripts/readme-check.mjs
npx tsc -p examples/readme-app/tsconfig.json

# --- Rust --------------------------------------------------------------------
# Two kinds of work share the machine (CI has 2 cores): builds, which keep
# every core busy, and real-time suites (real processes, etcd, Wine, chaos),
# which mostly wait on timers. The builds after `cargo test` run `nice`d in
# the foreground while the real-time suites run in the background, one at a
# time, so the cores stay busy and a suite's processes are still scheduled
# first when they wake. A background job's output goes to a file and is
# printed whole when the test command waits for the job; if anything fails,
# the background jobs are stopped.
target_dir=${CARGO_TARGET_DIR:-target}
logs=$target_dir/test-logs
rm -rf "$logs"
mkdir -p "$logs"
declare -A job_pid=() job_began=()
# background NAME WHAT CMD...: runs CMD (a command or a function) in its
# own process group, its output in $logs/NAME.log.
background() {
  local name=$1 what=$2
  shift 2
  set -m
  (trap 'step "$name ended (exit status $?)"' EXIT && "$@") </dev/null >"$logs/$name.log" 2>&1 &
  job_pid[$name]=$!
  set +m
  job_began[$name]=$SECONDS
  step "in the background from now: $what (its output printed when it ends)"
}
# finish NAME: waits for the background job NAME, prints its output, and
# fails if it failed (nothing if that was done already).
finish() {
  local name=$1 rc=0
  [ -n "${job_pid[$name]-}" ] || return 0 # finished early (fail_early)
  wait "${job_pid[$name]}" || rc=$?
  unset "job_pid[$name]"
  step "the background job $name ended (started at $((job_began[$name] / 60))m$(printf %02d $((job_began[$name] % 60)))s); its output:"
  cat "$logs/$name.log"
  ((rc == 0)) || { echo "the background job $name failed (exit status $rc): its output above" >&2; exit 1; }
}
# fail_early: a background job that has failed already fails the run now,
# not after the builds.
fail_early() {
  local name
  for name in "${!job_pid[@]}"; do
    kill -0 "${job_pid[$name]}" 2>/dev/null || finish "$name"
  done
}
stop_background() {
  local pid
  for pid in "${job_pid[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done
}
trap stop_background EXIT
# build CMD...: a build (a command or a function), at the lowest priority:
# the real-time suites first.
build() { (renice -n 19 -p "$BASHPID" >/dev/null && "$@"); }
# await FILE: waits (up to 30 min) for a file the foreground writes when a
# build the background needs is done.
await() {
  local deadline=$((SECONDS + 1800))
  until [ -e "$1" ]; do
    ((SECONDS < deadline)) || { echo "gave up waiting for $1" >&2; return 1; }
    sleep 1
  done
}

# Its own toolchain and target directory: nothing waits for it, and at the
# lowest priority it uses what the foreground leaves of the cores.
command -v rustup >/dev/null 2>&1 || { echo "missing: rustup (the cross-target checks add their targets with it)" >&2; exit 1; }
background lowest-deps "the declared minimum Rust (rust-version) with the lowest Tauri the plugin claims (Buzz's lock): the plugin, the engine and the CLI type-checked, the engine for macOS and Windows" \
  build bash scripts/lowest-deps.sh

step "cargo fmt --check"
if cargo fmt --version >/dev/null 2>&1; then
  cargo fmt --all -- --check
else
  echo "rustfmt not installed; skipping the format check"
fi

step "cargo clippy"
if cargo clippy --version >/dev/null 2>&1; then
  cargo clippy --workspace --all-targets -- -D warnings
else
  echo "clippy not installed; skipping lints"
fi

step "cargo test (engine: state machine, writer, in-process; CLI: multi-process, interop, hostile fs; plugin: IPC, bindings)"
# The three example apps have no tests (checked): a test build of each
# would only link another Tauri binary; they are built below.
examples=(examples/tauri-app/src-tauri examples/readme-app/src-tauri examples/buzz-app/src-tauri)
if grep -rnE '#\[(tokio::)?test' "${examples[@]}" --include=*.rs; then
  echo "an example app has tests (above): run them in cargo test" >&2; exit 1
fi
workspace=(--workspace --exclude leader-election-example --exclude readme-app --exclude buzz-shaped-example)
cargo test "${workspace[@]}"
# Its executables, for the suites run again below (without cargo: see
# test_executables in scripts/lib.sh).
test_executables "${workspace[@]}" >"$logs/tests.list"

step "the teeth: every defect a fix removed, put back alone (nip_le::mutant), fails its guard (the simulator's seeds ran in cargo test, tests/teeth.rs; here the unit tests')"
bash scripts/teeth.sh

step "the docs name every CLI flag, event field, reason, command and permission that exists, and nothing else"
node scripts/docs-check.mjs "$target_dir/debug/nip-le"

# The real-time suites, one at a time. Chaos is the real-process smoke of
# what the simulator's seed budget (cargo test) covers in depth: six runs of
# 30 to 45 s, a fault or mention every 250 ms on average.
realtime_suites() {
  set -euo pipefail
  step "the portable backend (what macOS and Windows run) on this machine: every instance of the multi-process suites runs it"
  # The engine's in-process tests of both backends ran in cargo test
  # (tests/elector.rs, tests/leaks.rs); here every `nip-le run` the suites
  # spawn inherits it.
  pick_tests "$logs/tests.list" multiprocess pauses lock_holds mixed turns children interop hostile_fs agent \
    >"$logs/portable-tests.list"
  NIP_LE_BACKEND=portable run_test_executables "$logs/portable-tests.list"
  # Its own copy: nothing the foreground builds then may change it.
  local lab=$logs/nip-le-lab
  cp "$target_dir/debug/nip-le-lab" "$lab"
  step "chaos: 40 s of random faults on a mixed cluster"
  "$lab" chaos --seconds 40
  step "chaos: 40 s of random faults on extended instances working a queue (exactly once)"
  "$lab" chaos --seconds 40 --turn-ms 60
  step "chaos on the portable backend: the mixed cluster, and the queue worked exactly once"
  "$lab" chaos --seconds 30 --backend portable
  "$lab" chaos --seconds 40 --turn-ms 60 --backend portable
  step "chaos: the same with harness children sharing their windows' instance ids (INTEROP.md's writer)"
  "$lab" chaos --seconds 40 --turn-ms 60 --children
  step "chaos: 45 s across 3 simulated hosts working a queue on a 3-member etcd over TLS with client certificates and users (paused, members restarted and cut off): exactly once but while etcd was unreachable"
  "$lab" chaos --seconds 45 --hosts 3 --extended 6 --turn-ms 60 --etcd-members 3 --etcd-secure
  step "Windows, run under Wine (x86_64-pc-windows-gnu): the engine's tests and the CLI's real-process suites"
  await "$logs/wine-tests.list"
  bash scripts/wine.sh --run "$logs/wine-tests.list"
  step "the etcd suites on the newest etcd release too (3.7.2 from crates.io; Debian's 3.4 ran in cargo test): TLS with client certificates and users together, the contender, a 3-member cluster"
  local etcd
  etcd=$(bash scripts/etcd-newest.sh)
  pick_tests "$logs/tests.list" etcd_security etcd etcd_cluster >"$logs/etcd-tests.list"
  NIP_LE_ETCD=$etcd run_test_executables "$logs/etcd-tests.list"
  step "the plugin with its etcd feature, on a real etcd (Builder::etcd_config, level in status, the gate)"
  await "$logs/plugin-etcd-tests.list"
  run_test_executables "$logs/plugin-etcd-tests.list"
}
background realtime "the real-time suites: the portable backend, chaos, Windows under Wine, the newest etcd, the plugin on etcd" realtime_suites

fail_early
step "the Windows build (x86_64-pc-windows-gnu) of the engine's tests and the CLI's real-process suites, for Wine"
build bash scripts/wine.sh --build "$logs/wine-tests.list"

step "the plugin with its etcd feature: its etcd test built"
build test_executables -p tauri-plugin-leader-election --features etcd --test etcd >"$logs/plugin-etcd-tests.list.part"
mv "$logs/plugin-etcd-tests.list.part" "$logs/plugin-etcd-tests.list"

fail_early
step "cross-target checks: macOS (Apple silicon; Intel compiles the same code) and Windows"
build bash scripts/cross-check.sh

step "cargo doc -D warnings (engine, plugin)"
RUSTDOCFLAGS="-D warnings" build cargo doc --no-deps -p nip-le -p tauri-plugin-leader-election -p nip-le-cli -p nip-le-lab

step "the engine links no CLI dependency, and no etcd client unless asked"
if cargo tree -p tauri-plugin-leader-election -e normal --prefix none | grep -E '^(clap|ctrlc|tracing-subscriber|tempfile|tonic|prost) '; then
  echo "the plugin pulls a CLI-only or etcd-only crate (above)" >&2; exit 1
fi
# Read whole, never piped into `grep -q` under pipefail: grep leaves at its
# first match and the writer then fails on the closed pipe (scripts/etcd-newest.sh).
grep -q '^tonic ' <<<"$(cargo tree -p tauri-plugin-leader-election -e normal --prefix none --features etcd)" \
  || { echo "the plugin's etcd feature does not reach the engine" >&2; exit 1; }
build cargo clippy -p tauri-plugin-leader-election --features etcd --all-targets -- -D warnings
# The defects of the teeth are compiled into test builds only.
if cargo tree -p tauri-plugin-leader-election -p nip-le-cli -p nip-le-lab -e normal --prefix none -f '{p} {f}' | grep -E '^nip-le v.*mutants'; then
  echo "a normal build compiles the teeth's defects in (above): only dev-dependencies may enable mutants" >&2; exit 1
fi
step "one dirs and one windows-sys: the engine's are Tauri's (on every target)"
for c in dirs windows-sys; do
  theirs=$(cargo tree -p tauri --target all -e normal --prefix none | grep -E "^$c v" | sed 's/ (\*)//' | sort -u)
  for v in $(cargo tree -p nip-le --target all -e normal --prefix none | grep -E "^$c v" | sed 's/ (\*)//;s/ /@/' | sort -u); do
    grep -qx "${v/@/ }" <<<"$theirs" || { echo "the engine's ${v/@/ } is not the one Tauri uses: $theirs" >&2; exit 1; }
  done
done
step "etcd's gRPC code in the engine is what scripts/etcd-proto.sh generates from crates/nip-le/proto (no build needs protoc)"
bash scripts/etcd-proto.sh --check

fail_early
step "cargo publish --dry-run (engine and plugin)"
# Cargo extracts the packaged engine into its registry cache, never
# re-extracts the same version and never rebuilds a registry crate, so a
# second run would verify the plugin against a stale engine: drop those
# extractions (the local overlay's directories are the ones named "-<hash>")
# and the fingerprints of the engine built from them.
rm -rf "${CARGO_HOME:-$HOME/.cargo}"/registry/src/-*/nip-le-*
for d in $(grep -l 'registry/src/-' "$target_dir"/debug/deps/nip_le-*.d 2>/dev/null); do
  h=${d##*/nip_le-}
  rm -rf "$target_dir/debug/.fingerprint/nip-le-${h%.d}"
done
build cargo publish --dry-run --allow-dirty -p nip-le -p tauri-plugin-leader-election
step "both crates package their license files (and the plugin its changelog)"
for pkg in nip-le tauri-plugin-leader-election; do
  list=$(cargo package --list --allow-dirty -p "$pkg")
  for f in LICENSE-MIT LICENSE-APACHE; do
    grep -qx "$f" <<<"$list" || { echo "cargo package -p $pkg is missing $f" >&2; exit 1; }
  done
done
grep -qx CHANGELOG.md <<<"$(cargo package --list --allow-dirty -p tauri-plugin-leader-election)" \
  || { echo "cargo package of the plugin is missing CHANGELOG.md" >&2; exit 1; }

fail_early
step "cargo build of the example app"
build cargo build -p leader-election-example
step "cargo build of the README's app (examples/readme-app: its Cargo.toml line, capability and Rust block)"
build cargo build -p readme-app
step "cargo build of the Buzz-shaped example (examples/buzz-app: no core:default, exactly the capability docs/buzz.md names)"
build cargo build -p buzz-shaped-example
step "what the end-to-end run needs installed (tauri-driver, Xvfb, WebKitWebDriver)"
build bash scripts/e2e.sh --setup

finish lowest-deps
finish realtime

step "end-to-end in real webviews, the two backends side by side (w1, w3 native; w2, w4 portable: what macOS and Windows run)"
# One run drives both backends' code and their hand-overs to each other; an
# all-native and an all-portable run cost twice the time and found nothing
# this one cannot (each backend's cluster runs whole in the suites above).
NIP_LE_BACKEND=mixed bash scripts/e2e.sh

step "nip-le demo (the main job, short timings)"
"$target_dir/debug/nip-le" demo --refresh-ms 300 --stand-down-ms 1500 --stale-ms 1500
step "every test passed"
