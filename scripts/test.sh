#!/usr/bin/env bash
# Runs every test of the project. The README's test command and .ci/run call
# exactly this script. It needs Rust (cargo) and python3 (the interop tests'
# independent foreign writer); it installs missing system packages itself
# when it can (root + apt-get) and otherwise says exactly which are missing.
set -euo pipefail
cd "$(dirname "$0")/.."

need_pkgs=()
command -v python3 >/dev/null 2>&1 || need_pkgs+=(python3)
# The Tauri plugin (not written yet) will add its GTK/WebKit dev packages here.
if ((${#need_pkgs[@]})); then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "== installing missing system packages: ${need_pkgs[*]}"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_pkgs[@]}"
  else
    echo "missing system packages: ${need_pkgs[*]} (install them, e.g. sudo apt-get install ${need_pkgs[*]})" >&2
    exit 1
  fi
fi
command -v cargo >/dev/null 2>&1 || { echo "missing: cargo (install Rust with rustup)" >&2; exit 1; }

echo "== cargo fmt --check"
if cargo fmt --version >/dev/null 2>&1; then
  cargo fmt --all -- --check
else
  echo "rustfmt not installed; skipping the format check"
fi

echo "== cargo clippy"
if cargo clippy --version >/dev/null 2>&1; then
  cargo clippy --workspace --all-targets -- -D warnings
else
  echo "clippy not installed; skipping lints"
fi

echo "== cargo test (unit, in-process, multi-process with real signals, interop)"
cargo test --workspace

echo "== nip-le demo (the main job, short timings)"
cargo run -q -p nip-le -- demo --refresh-ms 300 --stale-ms 1500 --stand-down-ms 1500
