#!/usr/bin/env bash
# README command 1: installs what is needed, builds qattn, and on the embedded USE-Lite sample
# (experiments/data/use-lite) or on --tensors DIR:
#   1. draws the (b, c) stability heatmap of IntAttention (qattn reproduce intattn-fig9 --fast) into results/,
#   2. prints the leaderboard: every registered method and preset against the fp64 reference, by mean O CosSim.
# The files land in results/ (the heatmap PNGs and CSVs, the heatmap report, leaderboard.csv).
set -euo pipefail
cd "$(dirname "$0")/.."
tensors=()
while [ $# -gt 0 ]; do
  case "$1" in
    --tensors) [ $# -ge 2 ] || { echo "main-job.sh: --tensors needs a directory" >&2; exit 2; }; tensors=(--tensors "$2"); shift 2 ;;
    -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
    *) echo "main-job.sh: unknown argument '$1' (valid: --tensors DIR)" >&2; exit 2 ;;
  esac
done
bash scripts/install-deps.sh >&2
cmake -S . -B build-release -G Ninja -DCMAKE_BUILD_TYPE=Release -DQATTN_BUILD_TESTS=OFF >/dev/null
ninja -C build-release qattn_cli >&2
mkdir -p results
build-release/qattn reproduce intattn-fig9 --fast "${tensors[@]}" --out-dir results --out results/intattn-fig9.txt
echo "heatmaps: results/heatmap-{paper,upstream-sim,upstream-neon}.png (report: results/intattn-fig9.txt)" >&2
exec build-release/qattn reproduce leaderboard "${tensors[@]}" --out-dir results
