#!/usr/bin/python3
"""Dump Q, K, V per layer and head from a PyTorch model into the files `qattn analyze` reads (docs/dumping.md).

    from dump_torch import AttentionDumper
    dumper = AttentionDumper("dump/")
    for i, layer in enumerate(model.model.layers):          # e.g. a Hugging Face Llama
        attn = layer.self_attn
        dumper.hook_projections(i, attn.q_proj, attn.k_proj, attn.v_proj,
                                num_heads=attn.num_heads, num_kv_heads=attn.num_key_value_heads)
    with torch.no_grad():
        model(**inputs)
    dumper.write()                                             # layer{L}_head{H}_{q,k,v}.npy + manifest.json

Layouts:
  hook_projections(layer, q_proj, k_proj, v_proj, num_heads, num_kv_heads=None)
      three modules whose outputs are [B, L, H*d] (Llama/Mistral/BERT-style q_proj/k_proj/v_proj). Grouped-query
      attention (num_kv_heads < num_heads) repeats each K/V head for its query heads, as the attention does.
  hook_fused_qkv(layer, qkv_proj, num_heads)
      one module whose output is [B, L, 3*H*d] in q|k|v order (GPT-2's c_attn, ViT's qkv).
  hook_multihead_attention(layer, mha)
      a torch.nn.MultiheadAttention used as self-attention (its fused in_proj_weight cannot be hooked: a pre-hook
      takes its input and projects it with the module's own weights, as its forward does).
  record(layer, q, k, v, layout="bhld")
      tensors you already have: "bhld" is [B, H, L, d], "blhd" is [B, L, H, d].

The hooks also write what `qattn analyze --weights` needs: the projections' input
layer{L}_attn_input.npy [B, L, d_model] and their weights as x W + b, layer{L}_w{q,k,v}.npy [d_model, H*d] and
layer{L}_b{q,k,v}.npy [H*d] (K and V repeated per query head under grouped-query attention, as the head files).
record() has no projections, so it writes none of these.

Every head's file is [B, L, d] float32 (the batch axis is kept; qattn flattens leading axes into a batch). The
projections are captured after the bias, before RoPE: apply your model's rotary embedding yourself and use record()
if you want post-RoPE Q and K. Writing is all or nothing: files go to a temporary directory that is renamed into
place. Needs only numpy and torch.
"""
import json
import os
import shutil
import tempfile

import numpy as np


class AttentionDumper:
    def __init__(self, out_dir):
        self.out_dir = os.fspath(out_dir)
        self._heads = {}  # (layer, head) -> {"q": [arrays per forward call], ...}
        self._handles = []
        self._meta = {}
        self._inputs = {}   # layer -> [projection inputs per forward call] ([B, L, d_model] float32)
        self._weights = {}  # layer -> {"wq": [d_model, H*d], "bq": [H*d], ...} float32

    # ---- capture -------------------------------------------------------------------------------------------------
    def _add(self, layer, kind, x, layout):
        """x: a tensor of one of q/k/v with heads, in `layout`."""
        a = x.detach().to("cpu").float().numpy()
        if layout == "blhd":
            a = a.transpose(0, 2, 1, 3)
        elif layout != "bhld":
            raise ValueError(f"layout must be 'bhld' or 'blhd', got {layout!r}")
        if a.ndim != 4:
            raise ValueError(f"layer {layer} {kind}: expected 4 axes [B, H, L, d], got shape {a.shape}")
        for h in range(a.shape[1]):
            self._heads.setdefault((layer, h), {"q": [], "k": [], "v": []})[kind].append(np.ascontiguousarray(a[:, h]))

    def _set_meta(self, layer, meta, scale, causal):
        """manifest.json entry of a layer; qattn reads "scale" (logit scale, default 1/sqrt(d)), "causal" and
        "num_heads" and checks them against the files."""
        if scale is not None:
            if not (float(scale) > 0 and np.isfinite(float(scale))):
                raise ValueError(f"layer {layer}: scale must be a finite number > 0, got {scale!r}")
            meta["scale"] = float(scale)
        if causal is not None:
            meta["causal"] = bool(causal)
        self._meta[layer] = meta

    def record(self, layer, q, k, v, layout="bhld", scale=None, causal=None):
        for kind, x in (("q", q), ("k", k), ("v", v)):
            self._add(layer, kind, x, layout)
        self._set_meta(layer, {"source": "record", "layout": layout}, scale, causal)

    def _add_input(self, layer, x):
        self._inputs.setdefault(layer, []).append(x.detach().to("cpu").float().numpy())

    def _set_weights(self, layer, weights, biases, num_heads, kv_heads):
        """weights[k], biases[k]: torch.nn.Linear's [out, in] and [out] (bias None: zeros) of q, k, v."""
        w = {}
        for kind, wt, bt, heads in zip("qkv", weights, biases, (num_heads, kv_heads, kv_heads)):
            a = wt.detach().to("cpu").float().numpy().T  # [in, out]: y = x W + b
            b = np.zeros(a.shape[1], np.float32) if bt is None else bt.detach().to("cpu").float().numpy()
            if heads != num_heads:  # each K/V head serves num_heads / heads query heads, as the head files
                d = a.shape[1] // heads
                a = np.repeat(a.reshape(a.shape[0], heads, d), num_heads // heads, axis=1).reshape(a.shape[0], -1)
                b = np.repeat(b.reshape(heads, d), num_heads // heads, axis=0).reshape(-1)
            w["w" + kind], w["b" + kind] = np.ascontiguousarray(a), np.ascontiguousarray(b)
        self._weights[layer] = w

    @staticmethod
    def _split_heads(y, heads):
        b, l, hd = y.shape
        if hd % heads:
            raise ValueError(f"projection width {hd} is not a multiple of {heads} heads")
        return y.reshape(b, l, heads, hd // heads)  # blhd

    def hook_projections(self, layer, q_proj, k_proj, v_proj, num_heads, num_kv_heads=None, scale=None, causal=None):
        kv_heads = num_kv_heads or num_heads
        if num_heads % kv_heads:
            raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {kv_heads}")

        def hook(kind, heads):
            def f(_module, inputs, output):
                if kind == "q":
                    self._add_input(layer, inputs[0])
                y = self._split_heads(output, heads)
                if heads != num_heads:  # grouped-query attention: each K/V head serves num_heads / heads queries
                    y = y.repeat_interleave(num_heads // heads, dim=2)
                self._add(layer, kind, y, "blhd")
            return f

        for kind, mod, heads in (("q", q_proj, num_heads), ("k", k_proj, kv_heads), ("v", v_proj, kv_heads)):
            self._handles.append(mod.register_forward_hook(hook(kind, heads)))
        self._set_weights(layer, (q_proj.weight, k_proj.weight, v_proj.weight),
                          (q_proj.bias, k_proj.bias, v_proj.bias), num_heads, kv_heads)
        self._set_meta(layer, {"source": "projections", "num_heads": num_heads, "num_kv_heads": kv_heads}, scale, causal)

    def hook_fused_qkv(self, layer, qkv_proj, num_heads, scale=None, causal=None):
        def f(_module, inputs, output):
            if output.shape[-1] % 3:
                raise ValueError(f"fused qkv width {output.shape[-1]} is not a multiple of 3")
            self._add_input(layer, inputs[0])
            for kind, part in zip("qkv", output.chunk(3, dim=-1)):
                self._add(layer, kind, self._split_heads(part, num_heads), "blhd")

        self._handles.append(qkv_proj.register_forward_hook(f))
        import torch

        # GPT-2's Conv1D keeps its weight as [in, out]; torch.nn.Linear as [out, in]
        w = qkv_proj.weight if isinstance(qkv_proj, torch.nn.Linear) else qkv_proj.weight.t()
        bias = qkv_proj.bias
        self._set_weights(layer, w.chunk(3, dim=0), (None,) * 3 if bias is None else bias.chunk(3), num_heads,
                          num_heads)
        self._set_meta(layer, {"source": "fused_qkv", "num_heads": num_heads}, scale, causal)

    def hook_multihead_attention(self, layer, mha, scale=None, causal=None):
        """torch.nn.MultiheadAttention as self-attention (query, key and value the same tensor). Its projections
        happen inside its forward, on the fused in_proj_weight, so a forward pre-hook takes the input and projects
        it with the module's weights as the forward does (F.linear). Masks passed to the module are not seen: give
        causal=True for a causal mask."""
        import torch
        import torch.nn.functional as F

        heads = mha.num_heads
        if mha.in_proj_weight is not None:
            ws = mha.in_proj_weight.chunk(3, dim=0)
        else:
            ws = (mha.q_proj_weight, mha.k_proj_weight, mha.v_proj_weight)
        bs = (None,) * 3 if mha.in_proj_bias is None else mha.in_proj_bias.chunk(3)
        if mha.bias_k is not None or mha.add_zero_attn:
            raise ValueError(f"layer {layer}: add_bias_kv and add_zero_attn add keys the dump cannot hold; use record()")

        def f(_module, inputs):
            query, key, value = inputs[0], inputs[1], inputs[2]
            if not (key is query and value is query):
                raise ValueError(f"layer {layer}: hook_multihead_attention dumps self-attention (query, key and "
                                 "value one tensor); call record() with the projected tensors for cross-attention")
            x = query.transpose(0, 1) if mha.batch_first else query  # [L, B, E], the layout the forward projects in
            with torch.no_grad():
                if mha.in_proj_weight is not None:  # one packed projection, then split, as the forward does
                    qkv = F.linear(x, mha.in_proj_weight, mha.in_proj_bias).chunk(3, dim=-1)
                else:
                    qkv = tuple(F.linear(x, w, b) for w, b in zip(ws, bs))
                self._add_input(layer, x.transpose(0, 1))
                for kind, y in zip("qkv", qkv):
                    self._add(layer, kind, self._split_heads(y.transpose(0, 1), heads), "blhd")

        self._handles.append(mha.register_forward_pre_hook(f))
        self._set_weights(layer, ws, bs, heads, heads)
        self._set_meta(layer, {"source": "multihead_attention", "num_heads": heads}, scale, causal)

    def remove_hooks(self):
        for h in self._handles:
            h.remove()
        self._handles = []

    # ---- write ---------------------------------------------------------------------------------------------------
    def write(self):
        """Writes every captured head (forward calls concatenated on the batch axis) and manifest.json."""
        self.remove_hooks()
        if not self._heads:
            raise RuntimeError("nothing captured: run the model after hooking it")
        parent = os.path.dirname(os.path.abspath(self.out_dir)) or "."
        os.makedirs(parent, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=".dump-", dir=parent)
        try:
            manifest = {"format": "qattn dump v1", "files": [], "layers": {str(k): v for k, v in self._meta.items()}}
            for (layer, head), parts in sorted(self._heads.items()):
                for kind in "qkv":
                    if not parts[kind]:
                        raise RuntimeError(f"layer {layer} head {head}: no {kind} captured")
                    a = np.concatenate(parts[kind], axis=0)
                    name = f"layer{layer}_head{head}_{kind}.npy"
                    np.save(os.path.join(tmp, name), a)
                    manifest["files"].append({"name": name, "shape": list(a.shape), "dtype": "float32"})
            for layer, parts in sorted(self._inputs.items()):  # what `qattn analyze --weights` reads
                if layer not in self._weights:
                    continue
                arrays = {"attn_input": np.concatenate(parts, axis=0), **self._weights[layer]}
                for kind, a in arrays.items():
                    name = f"layer{layer}_{kind}.npy"
                    np.save(os.path.join(tmp, name), a)
                    manifest["files"].append({"name": name, "shape": list(a.shape), "dtype": "float32"})
            with open(os.path.join(tmp, "manifest.json"), "w") as f:
                json.dump(manifest, f, indent=1)
            if os.path.exists(self.out_dir):  # replace only an earlier dump, never another directory
                old = os.path.join(self.out_dir, "manifest.json")
                try:
                    with open(old) as f:
                        ours = json.load(f).get("format") == "qattn dump v1"
                except (OSError, ValueError):
                    ours = False
                if not ours:
                    raise FileExistsError(f"{self.out_dir}: exists and is not a qattn dump (no manifest.json of ours)")
                shutil.rmtree(self.out_dir)
            os.replace(tmp, self.out_dir)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
