#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan+UBSan) and fuzzes each tensor parser for SECONDS (default 200) each.
# Seeds come from tests/fixtures. Prints, per target, the executions done and the crashes found; exits nonzero
# if any target found a crash.
#
#   scripts/fuzz.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-200}
bash scripts/install-deps.sh
build=build-fuzz
CXX=clang++ CC=clang cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DQATTN_BUILD_FUZZERS=ON \
  -DQATTN_BUILD_TESTS=OFF -DQATTN_BUILD_CLI=OFF -DQATTN_SANITIZE=address,undefined \
  -DCMAKE_CXX_FLAGS=-fsanitize=fuzzer-no-link >"$build.configure.log" 2>&1 || { tail -30 "$build.configure.log"; exit 1; }
ninja -C "$build" fuzz_npy fuzz_npz fuzz_safetensors >"$build.build.log" 2>&1 || { tail -30 "$build.build.log"; exit 1; }
status=0
for t in npy npz safetensors; do
  corpus="$build/corpus-$t"
  mkdir -p "$corpus"
  find tests/fixtures -name "*.$t" -exec cp {} "$corpus/" \;
  log="$build/fuzz-$t.log"
  set +e
  mkdir -p "$build/artifacts"
  "$build/fuzz/fuzz_$t" -max_total_time="$seconds" -max_len=65536 -rss_limit_mb=2048 -print_final_stats=1 \
     -artifact_prefix="$build/artifacts/$t-" "$corpus" >"$log" 2>&1
  rc=$?
  set -e
  execs=$(grep -E "^stat::number_of_executed_units" "$log" | awk '{print $2}' || true)
  crashes=$(find "$build/artifacts" -name "$t-*" | wc -l)
  echo "fuzz_$t: ${seconds}s, executions ${execs:-?}, exit code $rc, crash/leak/oom/timeout artifacts $crashes"
  [ "$rc" -eq 0 ] || { status=1; tail -30 "$log"; }
done
exit $status
