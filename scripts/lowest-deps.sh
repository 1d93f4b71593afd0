#!/usr/bin/env bash
# The lowest Rust and the lowest Tauri the plugin claims, together: a copy
# of this checkout whose lock pins the Tauri family to Buzz's desktop lock
# (tauri 2.11.5 and the versions it was released with; `cargo update -p
# tauri --precise 2.11.5` alone leaves a newer tauri-runtime that tauri
# 2.11.5 does not compile against), type-checked with the declared minimum
# Rust (rust-version). Called by scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
msrv=$(sed -n 's/^rust-version = "\(.*\)"$/\1/p' Cargo.toml)
rustup toolchain list | grep -q "^$msrv-" || rustup toolchain install "$msrv" --profile minimal
for t in aarch64-apple-darwin x86_64-pc-windows-gnu; do
  rustup target list --toolchain "$msrv" --installed | grep -qx "$t" || rustup target add --toolchain "$msrv" "$t"
done

copy=target/lowest/src
rm -rf "$copy"
mkdir -p "$copy"
git ls-files -z | (cd "$root" && xargs -0 cp --parents -t "$copy")
cd "$copy"
# In this order: each step keeps what the earlier ones pinned resolvable.
for pv in tauri@2.11.5 tauri-runtime-wry@2.11.4 tauri-macros@2.6.3 tauri-build@2.6.3 \
  tauri-codegen@2.6.3 tauri-plugin@2.6.3 tauri-runtime@2.11.3 tauri-utils@2.9.3 wry@0.55.1; do
  cargo update -q -p "${pv%@*}" --precise "${pv#*@}"
done
for p in tauri tauri-runtime tauri-runtime-wry tauri-utils tauri-plugin wry; do
  printf '%s ' "$p $(grep -A1 "^name = \"$p\"$" Cargo.lock | sed -n 's/^version = "\(.*\)"$/\1/p')"
done
echo
export CARGO_TARGET_DIR="$root/target/msrv"
# Type-checked, not run: the plugin's tests run on the newest Tauri in the
# test command, and linking them a second time against Buzz's Tauri cost
# minutes of a CI budget that had none left; what an older Tauri could
# break (its API, its macros, the build script) fails this check.
echo "== Rust $msrv, Buzz's Tauri: the plugin (every target), the engine and the CLI (every target)"
cargo "+$msrv" check --locked -q -p tauri-plugin-leader-election -p nip-le -p nip-le-cli -p nip-le-lab --all-targets
for t in aarch64-apple-darwin x86_64-pc-windows-gnu; do
  # All features but etcd-tls (ring needs the target's SDK: scripts/cross-check.sh).
  cargo "+$msrv" check --locked -q -p nip-le --features etcd,sim,ts --target "$t"
done
