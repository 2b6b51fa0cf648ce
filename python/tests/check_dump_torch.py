#!/usr/bin/python3
"""analysis/dump_torch.py on tiny random modules built here (no downloads): the files it writes hold exactly the
heads of the projections, in qattn's naming, and `qattn analyze` reads them.

    check_dump_torch.py QATTN_BINARY REPO_ROOT
Without PyTorch it reports a skip, except under CI=true, where the project's install script provides it.
"""
import json
import os
import subprocess
import sys
import tempfile

qattn, root = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(root, "analysis"))
try:
    import numpy as np
    import torch
except ImportError as e:
    if os.environ.get("CI") == "true":
        sys.exit(f"FAIL: {e} (scripts/install-deps.sh installs python3-torch)")
    print(f"skipped: {e}")
    sys.exit(0)
from dump_torch import AttentionDumper

torch.manual_seed(0)
B, L, H, KV, D = 2, 9, 4, 2, 8


class Block(torch.nn.Module):  # Llama-style separate projections with grouped-query attention
    def __init__(self):
        super().__init__()
        self.q_proj = torch.nn.Linear(H * D, H * D)
        self.k_proj = torch.nn.Linear(H * D, KV * D)
        self.v_proj = torch.nn.Linear(H * D, KV * D)

    def forward(self, x):
        return self.q_proj(x), self.k_proj(x), self.v_proj(x)


class Fused(torch.nn.Module):  # GPT-2-style fused qkv
    def __init__(self):
        super().__init__()
        self.c_attn = torch.nn.Linear(H * D, 3 * H * D)

    def forward(self, x):
        return self.c_attn(x)


failures = 0


def check(cond, what):
    global failures
    if not cond:
        print("FAIL:", what)
        failures += 1


with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "dump")
    blocks, fused = [Block(), Block()], Fused()
    d = AttentionDumper(out)
    for i, b in enumerate(blocks):
        d.hook_projections(i, b.q_proj, b.k_proj, b.v_proj, num_heads=H, num_kv_heads=KV)
    d.hook_fused_qkv(2, fused.c_attn, num_heads=H, scale=0.5, causal=True)
    x1, x2 = torch.randn(B, L, H * D), torch.randn(1, L, H * D)
    with torch.no_grad():
        for x in (x1, x2):  # two forward calls: concatenated on the batch axis
            for b in blocks:
                b(x)
            fused(x)
    d.write()
    with torch.no_grad():
        for layer in range(3):
            per_call = []
            for x in (x1, x2):  # recomputed call by call, as captured, so the floats are the same
                n = x.shape[0]
                if layer < 2:
                    q, k, v = blocks[layer](x)
                    k = k.reshape(n, L, KV, D).repeat_interleave(H // KV, dim=2)
                    v = v.reshape(n, L, KV, D).repeat_interleave(H // KV, dim=2)
                    q = q.reshape(n, L, H, D)
                else:
                    q, k, v = (t.reshape(n, L, H, D) for t in fused(x).chunk(3, dim=-1))
                per_call.append((q, k, v))
            q, k, v = (torch.cat([c[i] for c in per_call]) for i in range(3))
            for h in range(H):
                for kind, t in zip("qkv", (q, k, v)):
                    f = os.path.join(out, f"layer{layer}_head{h}_{kind}.npy")
                    a = np.load(f)
                    check(a.dtype == np.float32 and a.shape == (B + 1, L, D), f"{f}: {a.dtype} {a.shape}")
                    check(np.array_equal(a, t[:, :, h].numpy()), f"{f}: values differ from the projection's head {h}")
    m = json.load(open(os.path.join(out, "manifest.json")))
    check(m["format"] == "qattn dump v1" and len(m["files"]) == 3 * H * 3, "manifest lists every file")
    check(m["layers"]["2"].get("scale") == 0.5 and m["layers"]["2"].get("causal") is True
          and "scale" not in m["layers"]["0"], f"manifest scale/causal: {m['layers']}")
    try:
        AttentionDumper(os.path.join(tmp, "x")).record(0, *(torch.zeros(1, 1, 2, 2),) * 3, scale=-1.0)
        check(False, "a negative scale was accepted")
    except ValueError:
        pass
    # qattn reads the dump: 12 heads, one row per head plus mean and worst
    r = subprocess.run([qattn, "analyze", "--tensors", out, "--method", "quant-only", "--format", "csv"],
                       capture_output=True, text=True)
    check(r.returncode == 0, f"qattn analyze on the dump: exit {r.returncode}: {r.stderr}")
    rows = [l for l in r.stdout.splitlines()[1:] if l]
    check(len(rows) == 3 * H + 2, f"analyze rows: {len(rows)}")
    # a directory that is not a dump is never replaced
    other = os.path.join(tmp, "other")
    os.makedirs(other)
    open(os.path.join(other, "keep.txt"), "w").write("x")
    d2 = AttentionDumper(other)
    d2.record(0, torch.zeros(1, 1, 2, 2), torch.zeros(1, 1, 2, 2), torch.zeros(1, 1, 2, 2))
    try:
        d2.write()
        check(False, "write over a foreign directory was not refused")
    except FileExistsError:
        check(os.path.exists(os.path.join(other, "keep.txt")), "the foreign directory was touched")

print(f"dump_torch_test: {'FAILED' if failures else 'passed'} ({failures} failures)")
sys.exit(1 if failures else 0)
