#!/usr/bin/env bash
# What macOS and Windows compile, checked and linted on Linux: `cargo clippy
# -D warnings` (which type-checks: no linking, no SDK needed) of the engine
# with every feature and of the plugin with its etcd feature (the feature's
# own code is the same on every target and is linted both ways on Linux),
# for Apple silicon and Windows. Intel macs compile exactly what Apple
# silicon does (nothing in the code depends on the architecture), so a
# third target would only repeat the check. Installs the targets with
# rustup when missing. Called by scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
targets=(aarch64-apple-darwin x86_64-pc-windows-gnu)
installed=$(rustup target list --installed)
for t in "${targets[@]}"; do
  grep -qx "$t" <<<"$installed" || rustup target add "$t"
done
# Every feature but etcd-tls: its TLS (rustls with ring) is the same code
# on every target, and ring's build compiles C against the target's SDK,
# which a Linux machine does not have.
cross_features=etcd,sim,ts
for t in "${targets[@]}"; do
  echo "== $t: the engine (all features but etcd-tls), the plugin (with etcd)"
  cargo clippy -q -p nip-le --target "$t" --features "$cross_features" -- -D warnings
  cargo clippy -q -p tauri-plugin-leader-election --target "$t" --features etcd -- -D warnings
done
# The architecture claim above, kept true.
if grep -rnE 'target_arch|target_pointer_width' --include=*.rs src crates examples; then
  echo "code depends on the architecture (above): check x86_64-apple-darwin too" >&2
  exit 1
fi
