# Shared by the CLI test scripts: sourced as `source lib.sh QATTN_BINARY REPO_ROOT [EMULATOR...]`. Sets bin, root,
# emu, a scratch directory $tmp removed on exit, the pass/fail counters, and:
#   q ARGS...                                   runs qattn (under the emulator, if any)
#   expect CODE PATTERN DESCRIPTION -- ARGS...  runs qattn, checks its exit code and that its output matches PATTERN
#   check DESCRIPTION COMMAND...                passes when COMMAND succeeds
#   sanitized                                   succeeds when the binary is built with ASan or TSan
bin=$(realpath "$1")
root=$(realpath "$2")
shift 2
emu=("$@")
q() { "${emu[@]}" "$bin" "$@"; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
pass=0

expect() {
  local code=$1 pattern=$2 what=$3
  shift 4
  local out rc
  out=$(q "$@" 2>&1)
  rc=$?
  if [ "$rc" -ne "$code" ]; then
    echo "FAIL: $what: exit $rc, expected $code"; echo "$out" | head -5; fail=$((fail + 1)); return
  fi
  if [ -n "$pattern" ] && ! grep -qE -- "$pattern" <<<"$out"; then
    echo "FAIL: $what: output lacks /$pattern/"; echo "$out" | head -5; fail=$((fail + 1)); return
  fi
  pass=$((pass + 1))
}

check() {
  local what=$1
  shift
  if "$@"; then pass=$((pass + 1)); else echo "FAIL: $what"; fail=$((fail + 1)); fi
}

# No pipe into `grep -q`: under `set -o pipefail` grep's early exit kills ldd or nm with SIGPIPE and the pipeline
# fails, so the answer would depend on timing.
sanitized() {
  local libs syms
  libs=$(ldd "$bin" 2>/dev/null)
  case $libs in *libasan* | *libtsan*) return 0 ;; esac
  syms=$(nm "$bin" 2>/dev/null)
  case $syms in *" __asan_init"* | *" __tsan_init"*) return 0 ;; esac
  return 1
}
