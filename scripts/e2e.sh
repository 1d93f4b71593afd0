#!/usr/bin/env bash
# End-to-end tests in real webviews: three example-app windows driven through
# tauri-driver + WebKitWebDriver under Xvfb. Called by scripts/test.sh after
# the example app is built; installs what it needs on a fresh machine.
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/lib.sh
ensure_packages xvfb webkit2gtk-driver fonts-noto-color-emoji
if ! command -v tauri-driver >/dev/null 2>&1; then
  echo "== cargo install tauri-driver"
  cargo install tauri-driver --version '^2' --locked
fi
export PATH="$HOME/.cargo/bin:$PATH"
# --setup: only what the run needs installed (the test command installs it
# while it builds, so a fresh machine's tauri-driver build is not the last
# minute of the run).
[ "${1-}" = --setup ] && exit 0

[ -x target/debug/leader-election-example ] || { npm run build:example && cargo build -p leader-election-example; }
if [ ! -x target/debug/buzz-shaped-example ] || [ ! -x target/debug/nip-le-lab ]; then
  bash scripts/pnpm.sh examples/buzz-app install --frozen-lockfile
  bash scripts/pnpm.sh examples/buzz-app run build
  cargo build -p buzz-shaped-example -p nip-le-lab
fi

echo "== end-to-end (3 windows of the example, 4 of the Buzz-shaped one; WebKitWebDriver, Xvfb); screenshots in target/e2e-artifacts"
start=$(date +%s)
rm -rf "${E2E_ARTIFACTS:-target/e2e-artifacts}"
# A private display unless the caller provides one.
env -u DISPLAY node --test --test-concurrency=1 e2e/
echo "end-to-end suite took $(( $(date +%s) - start )) s"
