#!/usr/bin/python3
"""Rebuilds this embedded subset from a full USE-Lite dump directory.

Usage: make_subset.py FULL_DUMP_DIR [OUT_DIR]

Keeps windows (batch entries) 0 and 1 of every layer{0,1}_head{0..3}_{q,k,v,logits,probs}.npy, byte-for-byte
the same float32 values, C order, .npy format 1.0. Everything else (weights, attention inputs) stays in the
full set.
"""
import os
import sys

import numpy as np

WINDOWS = 2
KINDS = ("q", "k", "v", "logits", "probs")


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
    return 0


if __name__ == "__main__":
    sys.exit(main())
