#!/usr/bin/env bash
# README command 1: installs what is needed, builds qattn, and prints the error table of every registered
# method against the fp64 reference on the embedded USE-Lite sample (experiments/data/use-lite).
# Extra arguments go to `qattn analyze`, e.g. --tensors DIR, --format csv, --method SPEC.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh >&2
cmake -S . -B build-release -G Ninja -DCMAKE_BUILD_TYPE=Release -DQATTN_BUILD_TESTS=OFF >/dev/null
ninja -C build-release qattn_cli >&2
exec build-release/qattn analyze "$@"
