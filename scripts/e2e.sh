#!/usr/bin/env bash
# End-to-end tests in real webviews: three example-app windows driven through
# tauri-driver + WebKitWebDriver under Xvfb. Called by scripts/test.sh after
# the example app is built; installs what it needs on a fresh machine.
set -euo pipefail
cd "$(dirname "$0")/.."

pkgs=(xvfb webkit2gtk-driver fonts-noto-color-emoji)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "== installing missing system packages: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "missing system packages: ${missing[*]} (sudo apt-get install ${missing[*]})" >&2
    exit 1
  fi
fi
if ! command -v tauri-driver >/dev/null 2>&1; then
  echo "== cargo install tauri-driver"
  cargo install tauri-driver --version '^2' --locked
fi
export PATH="$HOME/.cargo/bin:$PATH"

[ -x target/debug/leader-election-example ] || { npm run build:example && cargo build -p leader-election-example; }

echo "== end-to-end (3 windows, WebKitWebDriver, Xvfb); screenshots in target/e2e-artifacts"
start=$(date +%s)
# A private display unless the caller provides one.
env -u DISPLAY node --test --test-concurrency=1 e2e/
echo "end-to-end suite took $(( $(date +%s) - start )) s"
