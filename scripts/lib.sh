# Shared by scripts/test.sh and scripts/e2e.sh.

# ensure_packages PKG...: installs the Debian packages that are missing when
# running as root with apt-get; otherwise names them and fails.
ensure_packages() {
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  ((${#missing[@]})) || return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "== installing missing system packages: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "missing system packages: ${missing[*]}" >&2
    echo "install them with: sudo apt-get install ${missing[*]}" >&2
    return 1
  fi
}

# test_executables CARGO-TEST-ARGS...: builds tests as `cargo test` would
# (`--no-run`) and lists each test executable as its target's name, its
# package directory and its path, tab-separated, one per line. The test
# command runs them with run_test_executables while it builds other things:
# cargo holds a lock on the target directory for as long as it builds, so a
# `cargo test` started then would wait for the build to end. Its subsets are
# picked from one list (pick_tests), not built by another `cargo test --test
# NAME`: cargo's units depend on the targets selected (a dependency built for
# build scripts only gets their profile), so another selection builds
# dependencies again.
test_executables() {
  cargo test --no-run --message-format=json-render-diagnostics "$@" | python3 -c '
import json, os, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print("\t".join((m["target"]["name"], os.path.dirname(m["manifest_path"]), m["executable"])))'
}

# pick_tests LIST NAME...: the lines of LIST whose target is one of NAMEs;
# fails if one is missing.
pick_tests() {
  local list=$1 name
  shift
  for name in "$@"; do
    grep -P "^\Q$name\E\t" "$list" || { echo "no test target $name in $list" >&2; return 1; }
  done
}

# run_test_executables LIST [RUNNER...] [-- TEST-ARGS...]: runs each
# executable of LIST (made by test_executables) from its package directory,
# as cargo does, through RUNNER if given (wine), with TEST-ARGS; stops at the
# first that fails, saying its exit status (one that printed nothing is
# told from a failed test by it).
run_test_executables() {
  local list=$1 runner=() args=() name dir exe rc
  shift
  while (($#)) && [ "$1" != -- ]; do runner+=("$1"); shift; done
  (($#)) && { shift; args=("$@"); }
  [ -s "$list" ] || { echo "no test executables in $list" >&2; return 1; }
  while IFS=$'\t' read -r name dir exe; do
    echo "     Running $name (${exe#"$PWD"/})"
    rc=0
    (cd "$dir" && "${runner[@]}" "$exe" "${args[@]}") </dev/null || rc=$?
    if ((rc)); then
      echo "failed: $exe (exit status $rc)" >&2
      return 1
    fi
  done <"$list"
}
