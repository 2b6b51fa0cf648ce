#!/usr/bin/python3
"""Dump Q, K, V per layer and head from a PyTorch model into the files `qattn analyze` reads (docs/dumping.md).

Capture at the attention call: the tensors the model's attention computes with (after RoPE, K/V as the attention
function receives them), its scale and its causal mask:

    from dump_torch import AttentionDumper, capture      # or: from qattn.torch import AttentionDumper, capture
    dumper = AttentionDumper("dump/")
    with torch.no_grad(), capture(dumper):               # wraps torch.nn.functional.scaled_dot_product_attention
        model(**inputs)                                  # e.g. a Hugging Face Llama, attn_implementation="sdpa"
    dumper.write()                                       # layer{L}_head{H}_{q,k,v}.npy + manifest.json

capture(dumper, fn=None, layers=None)
    replaces the function `fn` (default torch.nn.functional.scaled_dot_product_attention, PyTorch 2.0 and later; on
    an older PyTorch name the function your attention calls: "package.module:attr", "package.module.attr" or a
    (module, "attr") pair) for the duration of the `with` block, and always restores it. Each call is recorded, then
    passed to the original function, whose result is returned unchanged. The i-th call of a block is layer i (i % layers
    with `layers`). The function must take scaled_dot_product_attention's arguments: (query, key, value,
    attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False), tensors [..., H, L, d].

Projection hooks (the projections' outputs; what `qattn analyze --weights` needs):
  hook_projections(layer, q_proj, k_proj, v_proj, num_heads, num_kv_heads=None, rope=None)
      three modules whose outputs are [B, L, H*d] (Llama/Mistral/BERT-style q_proj/k_proj/v_proj). Q and K are the
      projections' outputs, before RoPE, unless `rope` is given: the model's rotary function, called as rope(q, k) on
      [B, H, L, d] tensors (K with its num_kv_heads heads) and returning the rotated (q, k). Grouped-query attention
      (num_kv_heads < num_heads) repeats each K/V head for its query heads, as the weights --weights reads.
  hook_fused_qkv(layer, qkv_proj, num_heads)
      one module whose output is [B, L, 3*H*d] in q|k|v order (GPT-2's c_attn, ViT's qkv).
  hook_multihead_attention(layer, mha)
      a torch.nn.MultiheadAttention used as self-attention (its fused in_proj_weight cannot be hooked: a pre-hook
      takes its input and projects it with the module's own weights, as its forward does).
  record(layer, q, k, v, layout="bhld")
      tensors you already have: "bhld" is [B, H, L, d], "blhd" is [B, L, H, d].

The hooks without `rope` also write what `qattn analyze --weights` needs: the projections' input
layer{L}_attn_input.npy [B, L, d_model] and their weights as x W + b, layer{L}_w{q,k,v}.npy [d_model, H*d] and
layer{L}_b{q,k,v}.npy [H*d] (K and V repeated per query head under grouped-query attention, as the head files).
A post-RoPE projection dump (rope=...), capture and record() write none of these: --weights recomputes Q and K from
the projections, before any rotation.

Every head's file is [B, L, d], float32 (float64 where the model's tensor is float64); leading axes are flattened into
the batch B, and several calls of a layer are concatenated on it. Writing is all or nothing: files go to a temporary
directory that is renamed into place. Needs only numpy and torch.
"""
import contextlib
import functools
import importlib
import inspect
import json
import math
import os
import shutil
import tempfile
import warnings

import numpy as np

_SDPA = "torch.nn.functional.scaled_dot_product_attention"
# scaled_dot_product_attention's parameters, in order (enable_gqa: PyTorch 2.5)
_SDPA_PARAMETERS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")


def _head_array(t):
    """One head's [..., L, d] tensor as a new C-ordered NumPy array of [B, L, d] (leading axes flattened): float64
    stays float64, every other float dtype becomes float32 (exact for float16 and bfloat16). Always a copy, so that
    a tensor the model later changes in place (a cache) does not change the dump."""
    import torch

    t = t.detach().to("cpu")
    if t.dtype != torch.float64:
        t = t.float()
    a = np.array(t.numpy(), copy=True, order="C")
    return a.reshape(-1, *a.shape[-2:])


class _Captured:
    """What `with capture(...) as c` gives: c.function (the wrapped function's dotted name) and c.calls (the calls
    recorded so far in this block)."""

    def __init__(self, function):
        self.function = function
        self.calls = 0


class AttentionDumper:
    def __init__(self, out_dir):
        self.out_dir = os.fspath(out_dir)
        self._heads = {}  # (layer, head) -> {"q": [arrays per forward call], ...}
        self._handles = []
        self._meta = {}
        self._inputs = {}   # layer -> [projection inputs per forward call] ([B, L, d_model] float32)
        self._weights = {}  # layer -> {"wq": [d_model, H*d], "bq": [H*d], ...} float32
        self._captured = {}  # layer -> the shapes, scale and causal flags its captured calls agree on

    # ---- capture -------------------------------------------------------------------------------------------------
    def _add(self, layer, kind, x, layout):
        """x: a tensor of one of q/k/v with heads, in `layout`."""
        if layout not in ("bhld", "blhd"):
            raise ValueError(f"layout must be 'bhld' or 'blhd', got {layout!r}")
        if x.dim() != 4:
            raise ValueError(f"layer {layer} {kind}: expected 4 axes [B, H, L, d], got shape {tuple(x.shape)}")
        if layout == "blhd":
            x = x.transpose(1, 2)
        for h in range(x.shape[1]):
            self._heads.setdefault((layer, h), {"q": [], "k": [], "v": []})[kind].append(_head_array(x[:, h]))

    def _set_meta(self, layer, meta, scale, causal):
        """manifest.json entry of a layer; qattn reads "scale" (logit scale, default 1/sqrt(d)), "causal",
        "num_heads" and "num_kv_heads" and checks them against the files."""
        if scale is not None:
            if not (float(scale) > 0 and np.isfinite(float(scale))):
                raise ValueError(f"layer {layer}: scale must be a finite number > 0, got {scale!r}")
            meta["scale"] = float(scale)
        if causal is not None:
            meta["causal"] = bool(causal)
        self._meta[layer] = meta

    def _claim(self, layer, source):
        """A layer holds one source's tensors: the hooks, record() and capture() would otherwise mix their heads
        and manifest entries."""
        old = self._meta.get(layer, {}).get("source")
        if old is not None and old != source:
            raise ValueError(f"layer {layer}: already holds tensors from {old}; {source} would mix them "
                             "(dump each source with its own AttentionDumper)")

    def record(self, layer, q, k, v, layout="bhld", scale=None, causal=None):
        self._claim(layer, "record")
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

    def hook_projections(self, layer, q_proj, k_proj, v_proj, num_heads, num_kv_heads=None, scale=None, causal=None,
                         rope=None):
        """Forward hooks on q_proj, k_proj and v_proj, whose outputs are [B, L, H*d].

        Without `rope` the dump holds the projections' outputs: Q and K before any rotary embedding, which is not
        what a RoPE model's attention computes with (capture() records that), plus the projections' input and
        weights for `qattn analyze --weights`; the manifest says "rope": false. With `rope`, the model's rotary
        function, Q and K are rope(q, k) of each forward call's projections ([B, H, L, d] tensors, K with its
        num_kv_heads heads; bind the positions with a lambda: rope=lambda q, k: apply_rotary_pos_emb(q, k, cos,
        sin)); the manifest says "rope": true, and no --weights files are written (--weights recomputes Q and K from
        the projections, before RoPE). Under grouped-query attention each K/V head is repeated for the
        num_heads / num_kv_heads query heads it serves (contiguous groups, as Hugging Face's repeat_kv), so that the
        head files and the --weights files agree; the manifest then has no num_kv_heads."""
        self._claim(layer, "projections")
        kv_heads = num_kv_heads or num_heads
        if num_heads % kv_heads:
            raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {kv_heads}")
        if rope is not None and not callable(rope):
            raise TypeError(f"layer {layer}: rope must be the model's rotary function, called as rope(q, k); got "
                            f"{type(rope).__name__}")
        import torch

        pending = {}  # this forward call's q and k [B, H, L, d], until both are there for rope(q, k)

        def add(kind, y):  # y: [B, H, L, d] with its own head count
            if y.shape[1] != num_heads:
                y = y.repeat_interleave(num_heads // y.shape[1], dim=1)
            self._add(layer, kind, y, "bhld")

        def rotate():
            q, k = pending.pop("q"), pending.pop("k")
            with torch.no_grad():
                rq, rk = rope(q, k)
            for kind, before, after in (("q", q, rq), ("k", k, rk)):
                if not isinstance(after, torch.Tensor) or after.shape != before.shape:
                    got = tuple(after.shape) if isinstance(after, torch.Tensor) else type(after).__name__
                    raise ValueError(f"layer {layer}: rope(q, k) must return the rotated (q, k) in the shapes it "
                                     f"was given; its {kind} is {got}, given {tuple(before.shape)}")
                add(kind, after)

        def hook(kind, heads):
            def f(_module, inputs, output):
                y = self._split_heads(output, heads).transpose(1, 2).detach()  # [B, H, L, d]
                if rope is None or kind == "v":
                    if kind == "q" and rope is None:
                        self._add_input(layer, inputs[0])
                    add(kind, y)
                    return
                if kind in pending:
                    raise RuntimeError(f"layer {layer}: {kind}_proj ran twice without the other: rope(q, k) needs "
                                       "one q and one k of each forward call")
                pending[kind] = y
                if len(pending) == 2:
                    rotate()
            return f

        for kind, mod, heads in (("q", q_proj, num_heads), ("k", k_proj, kv_heads), ("v", v_proj, kv_heads)):
            self._handles.append(mod.register_forward_hook(hook(kind, heads)))
        if rope is None:
            self._set_weights(layer, (q_proj.weight, k_proj.weight, v_proj.weight),
                              (q_proj.bias, k_proj.bias, v_proj.bias), num_heads, kv_heads)
        self._set_meta(layer, {"source": "projections", "num_heads": num_heads, "rope": rope is not None}, scale,
                       causal)

    def hook_fused_qkv(self, layer, qkv_proj, num_heads, scale=None, causal=None):
        self._claim(layer, "fused_qkv")

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

        self._claim(layer, "multihead_attention")
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

    # ---- capture at the attention call ---------------------------------------------------------------------------
    def _capture_call(self, layer, function, arguments):
        """Checks one call of the wrapped attention function (its arguments by SDPA's names) against what a dump
        can hold and against the layer's earlier calls, and copies its q, k, v. Returns what _commit_call stores
        once the call has returned; raises (ValueError, TypeError) before the model's attention runs."""
        import torch

        where = f"capture: layer {layer} ({function})"
        tensors = [arguments[name] for name in ("query", "key", "value")]
        for name, t in zip(("query", "key", "value"), tensors):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{where}: {name} must be a torch.Tensor, got {type(t).__name__}")
            if t.dim() < 3 or not t.is_floating_point():
                raise ValueError(f"{where}: {name} must be a float tensor [..., H, L, d], got {t.dtype} of shape "
                                 f"{tuple(t.shape)}")
        q, k, v = tensors
        (hq, lq, d), (hk, lk, dk), (hv, lv, dv) = (tuple(t.shape[-3:]) for t in tensors)
        if not (q.shape[:-3] == k.shape[:-3] == v.shape[:-3]):
            raise ValueError(f"{where}: query, key and value need the same leading (batch) axes, got "
                             f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
        if dk != d or hv != hk or lv != lk:
            raise ValueError(f"{where}: key {tuple(k.shape)} and value {tuple(v.shape)} do not fit query "
                             f"{tuple(q.shape)} (key's d must be query's; key and value need the same heads and L)")
        if hq % hk:
            raise ValueError(f"{where}: key and value have {hk} heads, which does not divide the query's {hq} heads "
                             "(grouped-query attention needs H_kv dividing H_q)")
        dropout = arguments.get("dropout_p", 0.0)
        if float(dropout) != 0.0:
            raise ValueError(f"{where}: dropout_p={float(dropout)}: attention dropout makes the computed numbers "
                             "random, so no dump reproduces them; run the model in eval mode (model.eval())")
        scale = arguments.get("scale")
        scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
        if not (scale > 0 and math.isfinite(scale)):
            raise ValueError(f"{where}: scale must be a finite number > 0, got {scale!r}")
        causal = self._causal_flags(where, arguments.get("attn_mask"), bool(arguments.get("is_causal", False)),
                                    q.shape[:-1] + (lk,))
        shapes = {"H_q": hq, "H_kv": hk, "L_q": lq, "L_k": lk, "d": d, "d_v": dv}
        old = self._captured.get(layer)
        if old is None:
            self._claim(layer, "capture")
        else:
            if old["function"] != function:
                raise ValueError(f"{where}: the layer's earlier calls were of {old['function']}")
            if old["shapes"] != shapes:
                raise ValueError(f"{where}: this call's shapes {shapes} differ from the layer's earlier calls "
                                 f"{old['shapes']}; calls of one layer are concatenated on the batch axis, so they "
                                 "need the same heads, L and d (dump each sequence length with its own dumper)")
            if old["scale"] != scale:
                raise ValueError(f"{where}: scale {scale!r} differs from the layer's earlier calls ({old['scale']!r});"
                                 " a dump holds one scale per layer")
            if not causal & old["causal"]:
                raise ValueError(f"{where}: causal is {sorted(causal)[0]} in this call and {sorted(old['causal'])[0]} "
                                 "in the layer's earlier calls; a dump holds one causal flag per layer")
            causal = causal & old["causal"]
        arrays = {kind: [_head_array(t.select(-3, h)) for h in range(t.shape[-3])]
                  for kind, t in zip("qkv", tensors)}
        return layer, function, shapes, scale, causal, arrays

    @staticmethod
    def _causal_flags(where, mask, is_causal, full):
        """The manifest's causal flags (True, False or both) that give the call's mask. The dump's causal mask is
        aligned at the bottom right (query i sees keys j <= i + L_k - L_q); `full` is [..., H, L_q, L_k]."""
        import torch

        lq, lk = full[-2], full[-1]
        bottom_right = torch.ones(lq, lk, dtype=torch.bool).tril(lk - lq)
        if is_causal:
            if mask is not None:
                raise ValueError(f"{where}: is_causal=True with an attn_mask (scaled_dot_product_attention takes "
                                 "one or the other)")
            if lq != lk:
                raise ValueError(f"{where}: is_causal=True with L_q={lq} != L_k={lk}: PyTorch aligns that mask at "
                                 "the top left (query i sees keys j <= i), the dump's causal flag at the bottom right "
                                 "(j <= i + L_k - L_q); the two agree only when L_q == L_k")
            visible = bottom_right
        elif mask is None:
            return {False}
        else:
            if not isinstance(mask, torch.Tensor):
                raise TypeError(f"{where}: attn_mask must be a torch.Tensor, got {type(mask).__name__}")
            try:
                shape = torch.broadcast_shapes(mask.shape, full)
            except RuntimeError:
                shape = None
            if shape != torch.Size(full):
                raise ValueError(f"{where}: attn_mask of shape {tuple(mask.shape)} does not broadcast to "
                                 f"[..., H, L_q, L_k] = {tuple(full)}")
            mask = mask.detach().to("cpu")
            if mask.dtype == torch.bool:
                visible = mask
            elif mask.is_floating_point():
                visible = mask == 0
                hidden = mask <= torch.finfo(mask.dtype).min  # -inf, or the lowest finite value Hugging Face adds
                if not bool((visible | hidden).all()):
                    raise ValueError(f"{where}: attn_mask adds values other than 0 and -inf (a bias such as ALiBi "
                                     "or relative positions); a dump holds only a causal flag per layer")
            else:
                raise TypeError(f"{where}: attn_mask must be bool (True = visible) or float (added to the logits), "
                                f"got {mask.dtype}")
        flags = set()
        if bool(visible.all()):
            flags.add(False)
        if bool((visible == bottom_right).all()):
            flags.add(True)
        if not flags:
            raise ValueError(f"{where}: attn_mask is neither the causal mask (query i sees keys j <= i + L_k - L_q, "
                             "the same for every batch entry and head) nor all-visible; a dump holds one causal flag "
                             "per layer, so padding and other masks cannot be recorded: run sequences of one length "
                             "without padding")
        return flags

    def _commit_call(self, pending):
        layer, function, shapes, scale, causal, arrays = pending
        for kind, heads in arrays.items():
            for h, a in enumerate(heads):
                self._heads.setdefault((layer, h), {"q": [], "k": [], "v": []})[kind].append(a)
        self._captured[layer] = {"function": function, "shapes": shapes, "scale": scale, "causal": causal}
        self._meta[layer] = {"source": "capture", "function": function, "num_heads": shapes["H_q"],
                             "num_kv_heads": shapes["H_kv"], "scale": scale,
                             "causal": causal == {True}}  # both flags give the call's mask: no mask is the plainer

    # ---- write ---------------------------------------------------------------------------------------------------
    def write(self):
        """Writes every captured head (forward calls concatenated on the batch axis) and manifest.json."""
        self.remove_hooks()
        if not self._heads:
            raise RuntimeError("nothing captured: run the model after hooking it, or inside capture()")
        parent = os.path.dirname(os.path.abspath(self.out_dir)) or "."
        os.makedirs(parent, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=".dump-", dir=parent)
        try:
            manifest = {"format": "qattn dump v1", "files": [], "layers": {str(k): v for k, v in self._meta.items()}}
            for (layer, head), parts in sorted(self._heads.items()):
                # a capture keeps grouped-query K/V as given: heads [num_kv_heads, num_heads) have a q file only
                kv_heads = self._meta.get(layer, {}).get("num_kv_heads", head + 1)
                for kind in "qkv":
                    if not parts[kind]:
                        if kind != "q" and head >= kv_heads:
                            continue
                        raise RuntimeError(f"layer {layer} head {head}: no {kind} captured")
                    a = np.concatenate(parts[kind], axis=0)
                    name = f"layer{layer}_head{head}_{kind}.npy"
                    np.save(os.path.join(tmp, name), a)
                    manifest["files"].append({"name": name, "shape": list(a.shape), "dtype": str(a.dtype)})
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


def _resolve(fn):
    """(owner, attribute, dotted name) of the function capture() wraps: setattr(owner, attribute, ...) replaces it
    where the model looks it up at call time."""
    if fn is None:
        import torch
        import torch.nn.functional as F

        if not hasattr(F, "scaled_dot_product_attention"):
            raise ValueError(f"capture: this PyTorch ({torch.__version__}) has no {_SDPA} (it came with PyTorch 2.0); "
                             "pass fn= naming the function your model's attention calls, as 'package.module:attr', "
                             "'package.module.attr' or a (module, 'attr') pair")
        return F, "scaled_dot_product_attention", _SDPA
    if isinstance(fn, tuple) and len(fn) == 2 and isinstance(fn[1], str):
        owner, attr = fn
        name = f"{getattr(owner, '__name__', type(owner).__name__)}.{attr}"
    elif isinstance(fn, str):
        module, _, path = fn.partition(":") if ":" in fn else fn.rpartition(".")
        if not module or not path or "" in path.split("."):
            raise ValueError(f"capture: fn {fn!r}: expected 'package.module:attr' or 'package.module.attr'")
        try:
            owner = importlib.import_module(module)
        except ImportError as e:
            raise ValueError(f"capture: fn {fn!r}: cannot import the module {module!r} ({e})") from e
        *parents, attr = path.split(".")
        for p in parents:
            if not hasattr(owner, p):
                raise ValueError(f"capture: fn {fn!r}: {module} has no attribute {p!r}")
            owner = getattr(owner, p)
        name = f"{module}.{path}"
    else:
        raise TypeError("capture: fn must be None, 'package.module:attr', 'package.module.attr' or a "
                        f"(module, 'attr') pair; got {type(fn).__name__}")
    if not hasattr(owner, attr):
        raise ValueError(f"capture: fn {name}: {getattr(owner, '__name__', owner)!r} has no attribute {attr!r}")
    if not callable(getattr(owner, attr)):
        raise TypeError(f"capture: fn {name} is a {type(getattr(owner, attr)).__name__}, not a function")
    if inspect.isclass(owner) and inspect.isfunction(inspect.getattr_static(owner, attr)):
        raise TypeError(f"capture: fn {name} is a method, which its class's instances call with self; name the "
                        "module-level function that the method calls")
    return owner, attr, name


def _sdpa_arguments(function, args, kwargs):
    """A call's arguments by scaled_dot_product_attention's parameter names."""
    if len(args) > len(_SDPA_PARAMETERS):
        raise TypeError(f"capture: {function} got {len(args)} positional arguments; capture records calls with "
                        f"scaled_dot_product_attention's parameters ({', '.join(_SDPA_PARAMETERS)})")
    arguments = dict(zip(_SDPA_PARAMETERS, args))
    for key, value in kwargs.items():
        if key not in _SDPA_PARAMETERS:
            raise TypeError(f"capture: {function} got the keyword {key!r}; capture records calls with "
                            f"scaled_dot_product_attention's parameters ({', '.join(_SDPA_PARAMETERS)})")
        if key in arguments:
            raise TypeError(f"capture: {function} got {key!r} twice")
        arguments[key] = value
    missing = [p for p in _SDPA_PARAMETERS[:3] if p not in arguments]
    if missing:
        raise TypeError(f"capture: {function} was called without {', '.join(missing)}")
    return arguments


@contextlib.contextmanager
def capture(dumper, fn=None, layers=None):
    """Record into `dumper` what each call of the attention function `fn` receives, for the duration of the block.

    Parameters
    ----------
    dumper : AttentionDumper
    fn : None, str or (object, str)
        The function the model's attention calls, looked up where the model looks it up at call time:
        "package.module:attr" (attr may be dotted: "package.module:Class.attr"), "package.module.attr", or a
        (module, "attr") pair. None: torch.nn.functional.scaled_dot_product_attention (PyTorch 2.0 and later; an older
        PyTorch has none, and fn=None raises ValueError). It must take scaled_dot_product_attention's arguments:
        (query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False).
    layers : int, optional
        The model's number of attention calls per forward pass: call i of the block is layer i % layers, so that
        several forward passes in one block concatenate on the batch axis. Without it, call i is layer i.

    Yields
    ------
    object
        With ``function`` (the wrapped function's dotted name) and ``calls`` (the calls recorded in the block).

    Each call's query [..., H_q, L_q, d], key and value [..., H_kv, L_k, d] (leading axes flattened into the batch;
    grouped-query K/V kept as given, H_kv dividing H_q, query head h using K/V head h // (H_q / H_kv)) are copied to
    NumPy, then the original function runs and its result is returned unchanged. The layer's manifest entry records
    "function", "num_heads" (H_q), "num_kv_heads" (H_kv), "scale" (the call's, or 1/sqrt(d) when None) and
    "causal": True when is_causal=True with L_q == L_k, or when attn_mask (bool, True = visible, or float, 0 and -inf)
    is the causal mask aligned at the bottom right (query i sees keys j <= i + L_k - L_q) for every batch entry and
    head; False with no mask or an all-visible one. Refused, before the model's attention runs (ValueError): dropout_p
    != 0, is_causal=True with L_q != L_k (PyTorch aligns it at the top left), any other mask, H_kv not dividing H_q,
    a call whose shapes, scale or causal flag differ from the layer's earlier calls. Calls of a later block on the
    same dumper append to the batch axis too. The function is restored when the block ends, also on an exception; a
    block that ends without a call warns (UserWarning): the model calls another function, or bound this one at import.
    """
    if not isinstance(dumper, AttentionDumper):
        raise TypeError(f"capture: dumper must be an AttentionDumper, got {type(dumper).__name__}")
    if layers is not None and (isinstance(layers, bool) or not isinstance(layers, int) or layers < 1):
        raise ValueError(f"capture: layers must be an integer >= 1 (attention calls per forward pass), got {layers!r}")
    owner, attr, function = _resolve(fn)
    original = getattr(owner, attr)
    captured = _Captured(function)

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        layer = captured.calls % layers if layers else captured.calls
        pending = dumper._capture_call(layer, function, _sdpa_arguments(function, args, kwargs))
        out = original(*args, **kwargs)
        dumper._commit_call(pending)
        captured.calls += 1
        return out

    setattr(owner, attr, wrapper)
    try:
        yield captured
    finally:
        setattr(owner, attr, original)
    # Only a block that ran to its end gets here: an exception in it propagates from the finally above.
    if captured.calls == 0:
        warnings.warn(f"capture: the block made no call of {function}, so nothing was recorded. The model's attention "
                      "calls another function (name it with fn=), or bound this one at import (`from ... import "
                      "name`: then name the model module's attribute, fn=(that_module, 'name')); Hugging Face models "
                      "call scaled_dot_product_attention only with attn_implementation=\"sdpa\"", UserWarning,
                      stacklevel=3)
