#!/usr/bin/python3
"""Rebuilds this embedded subset from a full USE-Lite dump directory.

Usage: make_subset.py FULL_DUMP_DIR [OUT_DIR]

Keeps windows (batch entries) 0 and 1 of every layer{0,1}_head{0..3}_{q,k,v,logits}.npy, and for the weight
quantizers layer 0's attention input (windows 0 and 1 of layer0_attn_input.npy) and its projection weights and
biases (layer0_{wq,wk,wv,bq,bk,bv}.npy, whole): byte-for-byte the same float32 values, C order, .npy format 1.0.
The probabilities (softmax of the logits), layer 1's weights and the other windows stay in the full set; the
subset stays under 5 MB.
Also writes manifest.json: per layer the logit scale, head count and head dimension read from the full dump's
manifest (which `qattn analyze` checks against the files), and the source of the tensors.
"""
import json
import math
import os
import sys

import numpy as np

WINDOWS = 2
KINDS = ("q", "k", "v", "logits")
WEIGHTS = ("wq", "wk", "wv", "bq", "bk", "bv")


def exact_scale(given, head_dim):
    """The full manifest prints 1/sqrt(128) to 11 digits; write the double nearest 1/sqrt(d) when that is what it
    means, so that the embedded manifest gives the model's own scale bit for bit."""
    full = 1.0 / math.sqrt(head_dim)
    return full if abs(given - full) < 1e-9 else given


def main() -> int:
    if len(sys.argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    src = sys.argv[1]
    dst = sys.argv[2] if len(sys.argv) == 3 else os.path.dirname(os.path.abspath(__file__))
    for layer in (0, 1):
        for head in range(4):
            for kind in KINDS:
                name = f"layer{layer}_head{head}_{kind}.npy"
                full = np.load(os.path.join(src, name))
                if full.dtype != np.float32 or full.ndim != 3:
                    print(f"{name}: expected float32 [n_seq, L, *], got {full.dtype} {full.shape}", file=sys.stderr)
                    return 3
                np.save(os.path.join(dst, name), np.ascontiguousarray(full[:WINDOWS]))
    x = np.load(os.path.join(src, "layer0_attn_input.npy"))
    np.save(os.path.join(dst, "layer0_attn_input.npy"), np.ascontiguousarray(x[:WINDOWS]))
    for name in WEIGHTS:
        a = np.load(os.path.join(src, f"layer0_{name}.npy"))
        if a.dtype != np.float32:
            print(f"layer0_{name}.npy: expected float32, got {a.dtype}", file=sys.stderr)
            return 3
        np.save(os.path.join(dst, f"layer0_{name}.npy"), a)
    with open(os.path.join(src, "manifest.json")) as f:
        full_manifest = json.load(f)
    manifest = {
        "format": "qattn dump v1",
        "source": "Universal Sentence Encoder Lite (Apache-2.0), windows 0-%d of the full dump; see README.md" % (WINDOWS - 1),
        "causal": False,
        "layers": [{"layer": l["layer"], "scale": exact_scale(l["scale"], l["head_dim"]), "num_heads": l["n_heads"],
                    "head_dim": l["head_dim"]} for l in full_manifest["layers"]],
    }
    with open(os.path.join(dst, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
