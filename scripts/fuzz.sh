#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan+UBSan) and fuzzes each for SECONDS (default 200): the three tensor
# parsers (seeds: tests/fixtures), the method-spec / grid grammar with the methods it builds (seeds:
# fuzz/seeds-spec), the MMA vector-file sets of `qattn mma-check` (seeds: fuzz/seeds-mma) and the part files of
# `qattn merge` (seeds: fuzz/seeds-merge). A target's committed corpus, fuzz/corpus-TARGET/ where there is one, is
# read too. Prints, per target, the executions done, the corpus size and the crashes found; exits nonzero if any
# target found a crash. With JOBS=2 two targets run at once. Logs and corpora stay in build-fuzz/; with
# MINIMIZE=1 each target's corpus is then minimised (libFuzzer -merge=1) into fuzz/corpus-TARGET/, to commit.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]      TARGET: npy npz safetensors spec_grammar mma_sets merge_part
#                                              (default: all)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-200}
shift || true
targets=("$@")
[ "${#targets[@]}" -gt 0 ] || targets=(npy npz safetensors spec_grammar mma_sets merge_part)
bash scripts/install-deps.sh
build=build-fuzz
mkdir -p "$build"
CXX=clang++ CC=clang cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DQATTN_BUILD_FUZZERS=ON \
  -DQATTN_BUILD_TESTS=OFF -DQATTN_BUILD_CLI=OFF -DQATTN_SANITIZE=address,undefined \
  -DCMAKE_CXX_FLAGS=-fsanitize=fuzzer-no-link >"$build/configure.log" 2>&1 || { tail -30 "$build/configure.log"; exit 1; }
ninja -C "$build" "${targets[@]/#/fuzz_}" >"$build/build.log" 2>&1 || { tail -30 "$build/build.log"; exit 1; }
fuzz_one() {
  local t=$1 corpus="$build/corpus-$1" log="$build/fuzz-$1.log" rc
  mkdir -p "$corpus" "$build/artifacts"
  case "$t" in
    spec_grammar) cp fuzz/seeds-spec/* "$corpus/" ;;
    mma_sets) cp fuzz/seeds-mma/* "$corpus/" ;;
    merge_part) cp fuzz/seeds-merge/* "$corpus/" ;;
    *) find tests/fixtures -name "*.$t" -exec cp {} "$corpus/" \; ;;
  esac
  if [ -d "fuzz/corpus-$t" ]; then cp fuzz/corpus-$t/* "$corpus/"; fi
  set +e
  "$build/fuzz/fuzz_$t" -max_total_time="$seconds" -max_len=65536 -rss_limit_mb=2048 -timeout=30 -print_final_stats=1 \
     -artifact_prefix="$build/artifacts/$t-" "$corpus" >"$log" 2>&1
  rc=$?
  set -e
  local execs crashes
  execs=$(grep -E "^stat::number_of_executed_units" "$log" | awk '{print $2}' || true)
  crashes=$(find "$build/artifacts" -name "$t-*" | wc -l)
  echo "fuzz_$t: ${seconds}s, executions ${execs:-?}, corpus $(ls "$corpus" | wc -l) files, exit code $rc, crash/leak/oom/timeout artifacts $crashes"
  [ "$rc" -eq 0 ] || { tail -30 "$log"; return 1; }
  if [ "${MINIMIZE:-0}" = 1 ]; then
    rm -rf "fuzz/corpus-$t" && mkdir -p "fuzz/corpus-$t"
    "$build/fuzz/fuzz_$t" -merge=1 -max_len=65536 -rss_limit_mb=2048 -timeout=30 "fuzz/corpus-$t" "$corpus" \
      >"$build/merge-$t.log" 2>&1 || { tail -30 "$build/merge-$t.log"; return 1; }
    echo "fuzz_$t: corpus minimised into fuzz/corpus-$t ($(ls "fuzz/corpus-$t" | wc -l) files)"
  fi
}
status=0
jobs=${JOBS:-1}
pids=()
for t in "${targets[@]}"; do
  fuzz_one "$t" &
  pids+=($!)
  if [ "${#pids[@]}" -ge "$jobs" ]; then wait "${pids[0]}" || status=1; pids=("${pids[@]:1}"); fi
done
for p in "${pids[@]}"; do wait "$p" || status=1; done
exit $status
