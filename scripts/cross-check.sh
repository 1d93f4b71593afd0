#!/usr/bin/env bash
# What macOS and Windows compile, checked and linted on Linux (issue 19,
# item 2): `cargo clippy -D warnings` (which type-checks: no linking, no
# SDK needed) of the engine with every feature and of the plugin (also
# with its etcd feature), for Apple silicon, Intel macs and Windows.
# Installs the targets with rustup when missing. Called by scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
targets=(aarch64-apple-darwin x86_64-apple-darwin x86_64-pc-windows-gnu)
installed=$(rustup target list --installed)
for t in "${targets[@]}"; do
  grep -qx "$t" <<<"$installed" || rustup target add "$t"
done
# Every feature but etcd-tls: its TLS (rustls with ring) is the same code
# on every target, and ring's build compiles C against the target's SDK,
# which a Linux machine has not got for macOS. The contender, the gateway
# and its bounds are in `etcd`, checked here.
cross_features=etcd,sim,ts
for t in "${targets[@]}"; do
  echo "== $t: the engine (all features but etcd-tls), the plugin (with and without etcd)"
  cargo clippy -q -p nip-le --target "$t" --features "$cross_features" -- -D warnings
  cargo clippy -q -p tauri-plugin-leader-election --target "$t" -- -D warnings
  cargo clippy -q -p tauri-plugin-leader-election --target "$t" --features etcd -- -D warnings
done
