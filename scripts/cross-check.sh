#!/usr/bin/env bash
# What macOS and Windows compile, checked and linted on Linux: `cargo clippy
# -D warnings` (which type-checks: no linking, no SDK needed) of the engine
# with every feature, for Apple silicon and Windows; the plugin has no
# platform code (checked), so Linux's lint of it covers every target. Intel macs compile exactly what Apple
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
  echo "== $t: the engine (all features but etcd-tls)"
  cargo clippy -q -p nip-le --target "$t" --features "$cross_features" -- -D warnings
done
# The plugin's own code is the same on every target (checked below), so a
# cross check of it would only check Tauri for that target again; every
# platform path is in the engine, checked above.
if grep -rnE 'cfg\(.*(target_os|target_family|windows|unix|macos)' --include=*.rs src build.rs; then
  echo "the plugin has platform code (above): cross-check it too" >&2
  exit 1
fi
# The architecture claim above, kept true.
if grep -rnE 'target_arch|target_pointer_width' --include=*.rs src crates examples; then
  echo "code depends on the architecture (above): check x86_64-apple-darwin too" >&2
  exit 1
fi
