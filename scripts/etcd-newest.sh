#!/usr/bin/env bash
# Prints the path of the newest etcd release this project tests against
# (besides Debian's etcd-server): etcd 3.7.2 from crates.io's
# etcd-bin-vendored (the release binary, packaged per platform), fetched by
# cargo into its registry cache. Linux x86_64 only; elsewhere it fails.
#
#   NIP_LE_ETCD=$(bash scripts/etcd-newest.sh) cargo test -p nip-le-lab --test etcd_security
set -euo pipefail
version=3.7.2
[[ "$(uname -s)-$(uname -m)" == Linux-x86_64 ]] || { echo "etcd-newest: Linux x86_64 only" >&2; exit 1; }
dir=${CARGO_TARGET_DIR:-$(cd "$(dirname "$0")/.." && pwd)/target}/etcd-newest
mkdir -p "$dir/src"
cat > "$dir/Cargo.toml" <<TOML
[package]
name = "etcd-newest"
version = "0.0.0"
edition = "2021"
publish = false

[dependencies]
etcd-bin-vendored = { version = "=$version", default-features = false, features = ["linux-x86_64"] }

[workspace]
TOML
echo 'fn main() { println!("{}", etcd_bin_vendored::etcd_bin_path().unwrap().display()) }' > "$dir/src/main.rs"
etcd=$(cargo run -q --manifest-path "$dir/Cargo.toml" --target-dir "$dir/target")
# Read whole, not piped into `grep -q`: grep leaves at its first match, etcd
# then writes into a closed pipe and dies of SIGPIPE, and with pipefail the
# check failed though the version was right (a clean-clone run, once).
said=$("$etcd" --version)
[[ "$said" == *"etcd Version: $version"* ]] || { echo "etcd-newest: $etcd is not etcd $version" >&2; exit 1; }
echo "$etcd"
