"""qattn inside PyTorch models (CPU tensors, inference only).

``attention(q, k, v, method)`` runs a qattn method on torch tensors ``[B, H, L, d]``; ``route(method)`` is a context
manager under which a model's multi-head attention computes ``softmax(scale q k^T) v`` with that method:

    with qattn.torch.route("intattention@upstream-neon") as r:
        y = model(x)
    r.calls  # how many attention calls went through qattn

``capture(dumper)`` and ``AttentionDumper`` (``qattn.dump_torch``, which needs only NumPy and PyTorch, also found as
``cli/dump_torch.py``) dump the q, k and v a model's attention computes with into the files ``qattn analyze``
reads (docs/dumping.md):

    dumper = qattn.torch.AttentionDumper("dump/")
    with torch.no_grad(), qattn.torch.capture(dumper):  # the calls of torch.nn.functional.scaled_dot_product_attention
        model(**inputs)
    dumper.write()

What ``route`` replaces, for the duration of the ``with`` block (and restores afterwards, also on an exception):

- ``torch.nn.functional.multi_head_attention_forward``: what ``nn.MultiheadAttention`` (and so
  ``nn.TransformerEncoderLayer`` / ``DecoderLayer``) calls outside PyTorch's fused fast path;
- ``torch._native_multi_head_attention`` and ``torch._transformer_encoder_layer_fwd``: the fused fast paths PyTorch
  takes in eval mode without gradients (reimplemented here in PyTorch operations around the qattn attention);
- ``torch.nn.functional.scaled_dot_product_attention`` where it exists (PyTorch 2.0 and newer; tested here only on
  Debian's PyTorch 1.13, which does not have it).

An attention written by hand (``softmax(q @ k.transpose(-2, -1) * scale) @ v`` in the model's own ``forward``) calls
none of these, so ``route`` cannot reach it: call ``qattn.torch.attention(q, k, v, method)`` in its place. A ``with``
block that ends without one call through qattn is never silent: ``route`` warns (``RouteWarning``), or with
``strict=True`` raises ``RuntimeError``, naming the functions it replaced.

The projections, layer norms and feed-forward stay in PyTorch, in the model's dtype; only the attention core runs in
qattn, in float64 inputs converted exactly from the model's float32, float64, float16 or bfloat16 tensors, and its
output is rounded back to the model's dtype. Gradients are not supported: with gradients enabled the output carries a
node whose backward raises (so ``loss.backward()`` fails loudly instead of leaving the projections' gradients silently
wrong), and ``route`` refuses a model in training mode with dropout. Attention shapes PyTorch allows but qattn does not model
(``bias_k``/``bias_v``, ``add_zero_attn``, ``static_k``/``static_v``, per-head 3-D masks, additive float masks
other than 0/-inf) raise ``NotImplementedError`` naming the argument.
"""
import contextlib
import math
import warnings

import numpy as np
import torch
import torch.nn.functional as F

from . import attention as _attention
from .dump_torch import AttentionDumper, capture

__all__ = ["attention", "route", "RouteWarning", "AttentionDumper", "capture"]


class RouteWarning(UserWarning):
    """A ``route`` block ended without one attention call through qattn: the model's attention is not one of the
    functions ``route`` replaces (a hand-written attention, say), and its output is PyTorch's, not the method's."""


_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def _as_numpy(t, name):
    """A CPU tensor's values as a NumPy array: float32 and float64 as they are, float16 and bfloat16 widened to
    float32 (exact)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.device.type != "cpu":
        raise ValueError(f"{name}: qattn runs on the CPU; got a tensor on {t.device}")
    if t.dtype not in _DTYPES:
        raise TypeError(f"{name}: expected dtype torch.float32, float64, float16 or bfloat16, got {t.dtype}")
    t = t.detach()
    return (t.float() if t.dtype in (torch.float16, torch.bfloat16) else t).numpy()


class _NoGradient(torch.autograd.Function):
    """The identity on qattn's output, tied to its inputs, whose backward raises: gradients do not flow through qattn,
    and a backward pass must say so rather than leave the inputs' gradients silently missing."""

    @staticmethod
    def forward(ctx, out, *inputs):
        return out.clone()

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError("qattn.torch: gradients do not flow through qattn's attention; run the model under "
                           "torch.no_grad() (or torch.inference_mode()) while routing it")


def _no_gradient(out, *inputs):
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in inputs):
        return _NoGradient.apply(out, *inputs)
    return out


def attention(q, k, v, method, scale=None, causal=False, mask=None, return_probs=False, **options):
    """``qattn.attention`` on torch tensors.

    Parameters
    ----------
    q, k, v : torch.Tensor of float32, float64, float16 or bfloat16 on the CPU, shape (B, H, L, d) (or any [..., L, d])
    method : str
        Any registered method spec.
    scale : float, optional
        Default ``1 / sqrt(d)``.
    causal : bool
    mask : torch.Tensor of bool, shape (L_q, L_k), optional
        True = visible.
    return_probs : bool
    **options
        ``engine``, ``threads``, ``kv``: as ``qattn.attention``.

    Returns
    -------
    torch.Tensor of q's dtype (and P as float64 with ``return_probs``)
        With gradients enabled and inputs that require them, its backward raises (gradients do not flow through
        qattn).
    """
    m = None
    if mask is not None:
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
            raise TypeError("mask: expected a torch.Tensor of dtype torch.bool (True = visible)")
        m = mask.detach().cpu().numpy()
    r = _attention(_as_numpy(q, "q"), _as_numpy(k, "k"), _as_numpy(v, "v"), method, scale=scale, causal=causal,
                   mask=m, return_probs=return_probs, **options)
    if return_probs:
        return _no_gradient(torch.from_numpy(r[0]).to(q.dtype), q, k, v), torch.from_numpy(r[1])
    return _no_gradient(torch.from_numpy(r).to(q.dtype), q, k, v)


def _visible(attn_mask, key_padding_mask, batch, lq, lk):
    """Per batch entry, the (L_q, L_k) bool mask qattn takes (True = visible), or None for no mask."""
    base = None
    if attn_mask is not None:
        if attn_mask.dim() != 2:
            raise NotImplementedError("attn_mask: only a 2-D (L, S) mask is supported, got shape "
                                      f"{tuple(attn_mask.shape)}")
        if attn_mask.dtype == torch.bool:
            base = ~attn_mask  # PyTorch: True = not allowed
        else:
            a = attn_mask.detach()
            if not bool(((a == 0) | (a == float("-inf"))).all()):
                raise NotImplementedError("attn_mask: an additive float mask must hold only 0 and -inf")
            base = a == 0
    masks = []
    for b in range(batch):
        m = base
        if key_padding_mask is not None:
            kp = key_padding_mask[b]
            keep = ~kp if kp.dtype == torch.bool else kp == 0
            row = keep.view(1, lk).expand(lq, lk)
            m = row if m is None else (m & row)
        masks.append(None if m is None else m.cpu().numpy().astype(bool))
    return masks


class _Route:
    def __init__(self, method, options):
        self.method = method
        self.options = options
        self.calls = 0

    # (N, H, L, hd) q/k/v -> (N, H, L, hd) output and optionally (N, H, L, S) weights
    def core(self, q, k, v, scale, masks, causal, need_weights):
        outs, probs = [], []
        one_mask = all(m is None for m in masks)
        groups = [(slice(None), None)] if one_mask else [(slice(b, b + 1), masks[b]) for b in range(q.shape[0])]
        for sl, m in groups:
            r = _attention(_as_numpy(q[sl], "query"), _as_numpy(k[sl], "key"), _as_numpy(v[sl], "value"), self.method,
                           scale=scale, causal=causal, mask=m, return_probs=need_weights, **self.options)
            self.calls += 1
            if need_weights:
                outs.append(r[0])
                probs.append(r[1])
            else:
                outs.append(r)
        o = _no_gradient(torch.from_numpy(np.concatenate(outs, axis=0)).to(q.dtype), q, k, v)
        p = torch.from_numpy(np.concatenate(probs, axis=0)).to(q.dtype) if need_weights else None
        return o, p

    def mha(self, query, key, value, embed_dim_to_check, num_heads, in_proj_weight, in_proj_bias, bias_k, bias_v,
            add_zero_attn, dropout_p, out_proj_weight, out_proj_bias, training=True, key_padding_mask=None,
            need_weights=True, attn_mask=None, use_separate_proj_weight=False, q_proj_weight=None,
            k_proj_weight=None, v_proj_weight=None, static_k=None, static_v=None, average_attn_weights=True,
            is_causal=False):
        for name, value_ in (("bias_k", bias_k), ("bias_v", bias_v), ("static_k", static_k), ("static_v", static_v)):
            if value_ is not None:
                raise NotImplementedError(f"qattn.torch.route: {name} is not supported")
        if add_zero_attn:
            raise NotImplementedError("qattn.torch.route: add_zero_attn is not supported")
        if training and dropout_p > 0:
            raise NotImplementedError("qattn.torch.route: attention dropout in training mode is not supported "
                                      "(call model.eval())")
        unbatched = query.dim() == 2
        if unbatched:
            query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        lq, batch, embed = query.shape
        lk = key.shape[0]
        hd = embed // num_heads
        if not use_separate_proj_weight:
            q, k, v = F._in_projection_packed(query, key, value, in_proj_weight, in_proj_bias)
        else:
            b = (None, None, None) if in_proj_bias is None else in_proj_bias.chunk(3)
            q, k, v = F._in_projection(query, key, value, q_proj_weight, k_proj_weight, v_proj_weight, *b)
        heads = lambda x, length: x.reshape(length, batch, num_heads, hd).permute(1, 2, 0, 3)  # (N, H, L, hd)
        q, k, v = heads(q, lq), heads(k, lk), heads(v, lk)
        masks = _visible(attn_mask if not is_causal else None, key_padding_mask, batch, lq, lk)
        o, p = self.core(q, k, v, 1.0 / math.sqrt(hd), masks, bool(is_causal), need_weights)
        o = o.permute(2, 0, 1, 3).reshape(lq, batch, embed)
        out = F.linear(o, out_proj_weight, out_proj_bias)
        if need_weights and average_attn_weights:
            p = p.mean(dim=1)
        if unbatched:
            out = out.squeeze(1)
            p = p.squeeze(0) if p is not None else None
        return out, p

    def native_mha(self, query, key, value, embed_dim, num_head, qkv_weight, qkv_bias, proj_weight, proj_bias,
                   mask=None, need_weights=True, average_attn_weights=True, mask_type=None):
        kp = mask if mask_type == 1 else None
        am = mask if mask_type == 0 else None
        out, p = self.mha(query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1), embed_dim, num_head,
                          qkv_weight, qkv_bias, None, None, False, 0.0, proj_weight, proj_bias, training=False,
                          key_padding_mask=kp, need_weights=need_weights, attn_mask=am,
                          average_attn_weights=average_attn_weights)
        return out.transpose(0, 1), p

    def encoder_layer(self, src, embed_dim, num_heads, in_proj_weight, in_proj_bias, out_proj_weight, out_proj_bias,
                      use_gelu, norm_first, eps, norm1_weight, norm1_bias, norm2_weight, norm2_bias, linear1_weight,
                      linear1_bias, linear2_weight, linear2_bias, mask=None, mask_type=None):
        def sa(x):
            return self.native_mha(x, x, x, embed_dim, num_heads, in_proj_weight, in_proj_bias, out_proj_weight,
                                   out_proj_bias, mask, False, True, mask_type)[0]

        def ff(x):
            h = F.linear(x, linear1_weight, linear1_bias)
            h = F.gelu(h) if use_gelu else F.relu(h)
            return F.linear(h, linear2_weight, linear2_bias)

        def norm(x, w, b):
            return F.layer_norm(x, (embed_dim,), w, b, eps)

        x = src
        if norm_first:
            x = x + sa(norm(x, norm1_weight, norm1_bias))
            return x + ff(norm(x, norm2_weight, norm2_bias))
        x = norm(x + sa(x), norm1_weight, norm1_bias)
        return norm(x + ff(x), norm2_weight, norm2_bias)

    def sdpa(self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
        if dropout_p > 0:
            raise NotImplementedError("qattn.torch.route: dropout_p > 0 is not supported")
        lq, lk = query.shape[-2], key.shape[-2]
        masks = [None]
        if attn_mask is not None:
            if attn_mask.dim() != 2:
                raise NotImplementedError("attn_mask: only a 2-D (L, S) mask is supported")
            # scaled_dot_product_attention: a bool mask is True where attention is allowed
            masks = [attn_mask.cpu().numpy() if attn_mask.dtype == torch.bool
                     else _visible(attn_mask, None, 1, lq, lk)[0]]
        s = scale if scale is not None else 1.0 / math.sqrt(query.shape[-1])
        r = _attention(_as_numpy(query, "query"), _as_numpy(key, "key"), _as_numpy(value, "value"), self.method,
                       scale=s, causal=bool(is_causal), mask=masks[0], **self.options)
        self.calls += 1
        return _no_gradient(torch.from_numpy(r).to(query.dtype), query, key, value)


@contextlib.contextmanager
def route(method, strict=False, **options):
    """Route a PyTorch model's multi-head attention through a qattn method inside a ``with`` block.

    Parameters
    ----------
    method : str
        Any registered method spec (checked on entry: ``ValueError`` for a bad one).
    strict : bool
        What a block that ends without one call through qattn does: ``False`` (the default) warns with
        ``RouteWarning``, ``True`` raises ``RuntimeError``. Neither when the block itself raised.
    **options
        ``engine``, ``threads``, ``kv``: as ``qattn.attention``.

    Yields
    ------
    object
        With ``calls``: how many qattn attention calls the block made.

    Warns
    -----
    RouteWarning
        The block ended with ``calls == 0`` (``strict=False``). The message names the functions ``route`` replaced;
        a model that calls none of them (a hand-written attention) routes by calling ``qattn.torch.attention`` in
        its attention instead.

    Raises
    ------
    RuntimeError
        The block ended with ``calls == 0`` (``strict=True``), with the same message.

    Notes
    -----
    Inference only: outputs carry no gradient history. The model's tensors must be on the CPU. See the module's
    docstring for what is replaced and what is refused.
    """
    from . import canonical
    canonical(method)
    r = _Route(method, options)
    saved = [(F, "multi_head_attention_forward", r.mha),
             (torch, "_native_multi_head_attention", r.native_mha),
             (torch, "_transformer_encoder_layer_fwd", r.encoder_layer)]
    if hasattr(F, "scaled_dot_product_attention"):
        saved.append((F, "scaled_dot_product_attention", r.sdpa))
    originals = [(obj, name, getattr(obj, name)) for obj, name, _ in saved]
    try:
        for obj, name, fn in saved:
            setattr(obj, name, fn)
        yield r
    finally:
        for obj, name, fn in originals:
            setattr(obj, name, fn)
    # Only a block that ran to its end gets here: an exception in it propagates from the finally above.
    if r.calls == 0:
        wrapped = ", ".join(obj.__name__ + "." + name for obj, name, _ in saved)
        message = (f"qattn.torch.route({method!r}): no attention call went through qattn (calls == 0), so the "
                   f"block's outputs are PyTorch's own. route replaces {wrapped}; the model called none of them. For "
                   "an attention written by hand, call qattn.torch.attention(q, k, v, method, scale=..., causal=..., "
                   "mask=...) inside it in place of its softmax(q k^T) v.")
        if strict:
            raise RuntimeError(message)
        warnings.warn(message, RouteWarning, stacklevel=3)
