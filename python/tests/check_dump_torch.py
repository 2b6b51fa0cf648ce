#!/usr/bin/python3
"""The projection hooks of python/qattn/dump_torch.py (imported as cli/dump_torch.py, a link to that one file) on
tiny random modules built here (no downloads): the files they write hold exactly the heads of the projections, in
qattn's naming (grouped-query K/V repeated per query head), and `qattn analyze` reads them, with --weights too. The
capture at the attention call is tested by python/tests/test_capture.py.

    check_dump_torch.py QATTN_BINARY REPO_ROOT
Without PyTorch it reports a skip, except under CI=true, where the project's install script provides it.
"""
import json
import os
import subprocess
import sys
import tempfile

qattn, root = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(root, "cli"))
sys.path.insert(0, os.path.join(root, "tests", "cli"))
if os.path.realpath(os.path.join(root, "cli", "dump_torch.py")) != \
        os.path.realpath(os.path.join(root, "python", "qattn", "dump_torch.py")):
    sys.exit("FAIL: cli/dump_torch.py is not a link to python/qattn/dump_torch.py (one source)")
try:
    import numpy as np
    import torch
except ImportError as e:
    if os.environ.get("CI") == "true":
        sys.exit(f"FAIL: {e} (scripts/install-deps.sh installs python3-torch)")
    print(f"skipped: {e}")
    sys.exit(0)
from checks import Checks
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


check = Checks("dump_torch_test")

with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "dump")
    blocks, fused = [Block(), Block()], Fused()
    mha = torch.nn.MultiheadAttention(H * D, H, batch_first=False)  # layout [L, B, E]
    d = AttentionDumper(out)
    for i, b in enumerate(blocks):
        d.hook_projections(i, b.q_proj, b.k_proj, b.v_proj, num_heads=H, num_kv_heads=KV)
    d.hook_fused_qkv(2, fused.c_attn, num_heads=H, scale=0.5, causal=True)
    d.hook_multihead_attention(3, mha)
    x1, x2 = torch.randn(B, L, H * D), torch.randn(1, L, H * D)
    with torch.no_grad():
        for x in (x1, x2):  # two forward calls: concatenated on the batch axis
            for b in blocks:
                b(x)
            fused(x)
            xt = x.transpose(0, 1)
            mha(xt, xt, xt)
    d.write()
    with torch.no_grad():
        for layer in range(4):
            per_call = []
            for x in (x1, x2):  # recomputed call by call, as captured, so the floats are the same
                n = x.shape[0]
                if layer < 2:
                    q, k, v = blocks[layer](x)
                    k = k.reshape(n, L, KV, D).repeat_interleave(H // KV, dim=2)
                    v = v.reshape(n, L, KV, D).repeat_interleave(H // KV, dim=2)
                    q = q.reshape(n, L, H, D)
                elif layer == 2:
                    q, k, v = (t.reshape(n, L, H, D) for t in fused(x).chunk(3, dim=-1))
                else:  # MultiheadAttention: its packed in-projection on [L, B, E], as its forward computes it
                    y = torch.nn.functional.linear(x.transpose(0, 1), mha.in_proj_weight, mha.in_proj_bias)
                    q, k, v = (t.transpose(0, 1).reshape(n, L, H, D) for t in y.chunk(3, dim=-1))
                per_call.append((q, k, v))
            q, k, v = (torch.cat([c[i] for c in per_call]) for i in range(3))
            for h in range(H):
                for kind, t in zip("qkv", (q, k, v)):
                    f = os.path.join(out, f"layer{layer}_head{h}_{kind}.npy")
                    a = np.load(f)
                    check(a.dtype == np.float32 and a.shape == (B + 1, L, D), f"{f}: {a.dtype} {a.shape}")
                    check(np.array_equal(a, t[:, :, h].numpy()), f"{f}: values differ from the projection's head {h}")
        # What `analyze --weights` reads: the projections' input and W, b with x W + b = the dumped heads
        for layer in range(4):
            x = np.load(os.path.join(out, f"layer{layer}_attn_input.npy"))
            check(x.shape == (B + 1, L, H * D), f"layer {layer} attn_input shape {x.shape}")
            for kind in "qkv":
                w = np.load(os.path.join(out, f"layer{layer}_w{kind}.npy")).astype(np.float64)
                b = np.load(os.path.join(out, f"layer{layer}_b{kind}.npy")).astype(np.float64)
                y = x.astype(np.float64) @ w + b
                for h in range(H):
                    got = y[:, :, h * D:(h + 1) * D]
                    want = np.load(os.path.join(out, f"layer{layer}_head{h}_{kind}.npy"))
                    check(np.abs(got - want).max() < 1e-4, f"layer {layer} {kind} head {h}: x W + b differs from the "
                          f"dumped head by {np.abs(got - want).max()}")
        # the dumped MultiheadAttention heads are the module's own: attention on them and out_proj give its output
        qkv = [np.stack([np.load(os.path.join(out, f"layer3_head{h}_{kind}.npy"))[:B] for h in range(H)], axis=1)
               for kind in "qkv"]  # [B, H, L, D] of the first call
        q, k, v = (torch.from_numpy(a) for a in qkv)
        o = torch.softmax(q @ k.transpose(-1, -2) / D ** 0.5, dim=-1) @ v
        o = mha.out_proj(o.transpose(1, 2).reshape(B, L, H * D))
        want = mha(x1.transpose(0, 1), x1.transpose(0, 1), x1.transpose(0, 1))[0].transpose(0, 1)
        check((o - want).abs().max().item() < 1e-5, f"MultiheadAttention from the dumped heads differs from the module's "
              f"output by {(o - want).abs().max().item()}")
    m = json.load(open(os.path.join(out, "manifest.json")))
    check(m["format"] == "qattn dump v1" and len(m["files"]) == 4 * H * 3 + 4 * 7, "manifest lists every file")
    check(m["layers"]["2"].get("scale") == 0.5 and m["layers"]["2"].get("causal") is True
          and "scale" not in m["layers"]["0"], f"manifest scale/causal: {m['layers']}")
    # the projections before RoPE, K/V repeated: the files hold H heads of each, so no num_kv_heads
    check(m["layers"]["0"] == {"source": "projections", "num_heads": H, "rope": False},
          f"manifest of a projection dump: {m['layers']['0']}")
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
    check(len(rows) == 4 * H + 2, f"analyze rows: {len(rows)}")
    # every documented option reads the dump: weight quantization needs the projections' input and weights
    r = subprocess.run([qattn, "analyze", "--tensors", out, "--weights", "gptq:bits=3", "--method", "fp32",
                        "--format", "csv"], capture_output=True, text=True)
    check(r.returncode == 0, f"qattn analyze --weights gptq:bits=3 on the dump: exit {r.returncode}: {r.stderr}")
    rows = [l for l in r.stdout.splitlines()[1:] if l]
    check(len(rows) == 4 * H + 2, f"analyze --weights rows: {len(rows)}")
    # cross-attention through MultiheadAttention is refused with the way out
    d3 = AttentionDumper(os.path.join(tmp, "cross"))
    d3.hook_multihead_attention(0, mha)
    try:
        with torch.no_grad():
            mha(xt, torch.randn(3, 1, H * D), torch.randn(3, 1, H * D))
        check(False, "cross-attention through hook_multihead_attention was accepted")
    except ValueError as e:
        check("record()" in str(e), f"the cross-attention message: {e}")
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

check.exit()
