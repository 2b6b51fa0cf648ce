"""Tests of qattn.torch on Debian's PyTorch: the tensor function, and route() on small transformers built here, whose
outputs must equal the projections of the same q/k/v through qattn.attention."""
import math
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")  # python3-torch is in the test dependencies; without it the hook cannot exist
import torch.nn.functional as F  # noqa: E402

import qattn  # noqa: E402
import qattn.torch as qt  # noqa: E402

E, H, L = 64, 4, 24


def mha_by_hand(mha, x, method, key_padding_mask=None):
    """nn.MultiheadAttention(x, x, x) (batch_first) with the attention core from qattn.attention on q, k, v."""
    n = x.shape[0]
    qkv = F.linear(x, mha.in_proj_weight, mha.in_proj_bias)
    q, k, v = (t.reshape(n, L, H, E // H).permute(0, 2, 1, 3) for t in qkv.chunk(3, dim=-1))
    outs = []
    for b in range(n):
        mask = None
        if key_padding_mask is not None:
            mask = np.broadcast_to(~key_padding_mask[b].numpy(), (L, L)).copy()
        o = qattn.attention(q[b].detach().numpy(), k[b].detach().numpy(), v[b].detach().numpy(), method,
                            scale=1 / math.sqrt(E // H), mask=mask)
        outs.append(torch.from_numpy(o).float())
    o = torch.stack(outs).permute(0, 2, 1, 3).reshape(n, L, E)
    return F.linear(o, mha.out_proj.weight, mha.out_proj.bias)


@pytest.fixture
def mha():
    torch.manual_seed(1)
    return torch.nn.MultiheadAttention(E, H, batch_first=True).eval()


@pytest.mark.parametrize("method", ["fp32", "intattention@upstream-neon", "sage2@paper-8b", "turbo"])
@pytest.mark.parametrize("grad", [True, False])  # False: PyTorch's fused fast path (torch._native_multi_head_attention)
def test_route_equals_qattn_attention_on_the_same_qkv(mha, method, grad):
    x = torch.randn(2, L, E)
    with torch.set_grad_enabled(grad), qt.route(method) as r:
        y, _ = mha(x, x, x, need_weights=False)
    assert r.calls > 0
    with torch.no_grad():
        expect = mha_by_hand(mha, x, method)
    assert torch.allclose(y, expect, rtol=0, atol=2e-6), (y - expect).abs().max()


def test_route_with_key_padding_and_the_methods_differ(mha):
    x = torch.randn(2, L, E)
    pad = torch.zeros(2, L, dtype=torch.bool)
    pad[1, L - 5:] = True  # the last five keys of sentence 1 are padding
    with torch.no_grad():
        native, _ = mha(x, x, x, key_padding_mask=pad, need_weights=False)
        with qt.route("fp64"):
            ours, _ = mha(x, x, x, key_padding_mask=pad, need_weights=False)
        with qt.route("intattention"):
            quant, _ = mha(x, x, x, key_padding_mask=pad, need_weights=False)
        expect = mha_by_hand(mha, x, "intattention", key_padding_mask=pad)
    assert torch.allclose(ours, native, atol=1e-5)
    assert torch.allclose(quant, expect, rtol=0, atol=2e-6)
    assert (quant - native).abs().max() > 1e-4  # the route really ran the quantized method


def test_route_through_a_transformer_encoder_fast_and_slow_paths():
    torch.manual_seed(2)
    layer = torch.nn.TransformerEncoderLayer(E, H, 2 * E, dropout=0.0, batch_first=True)
    enc = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    x = torch.randn(3, L, E)
    with torch.no_grad():
        native = enc(x)
        with qt.route("fp64") as r:
            fast = enc(x)  # eval + no_grad: torch._transformer_encoder_layer_fwd
    with qt.route("fp64") as r2:
        slow = enc(x)  # gradients on: the Python path through F.multi_head_attention_forward
    assert r.calls == 2 and r2.calls == 2  # one per layer: all three sentences in one call
    assert torch.allclose(fast, native, atol=1e-5) and torch.allclose(slow, native, atol=1e-5)
    assert torch.allclose(fast, slow, rtol=0, atol=1e-6)


def test_route_restores_pytorch_and_refuses_what_it_does_not_model(mha):
    before = (F.multi_head_attention_forward, torch._native_multi_head_attention, torch._transformer_encoder_layer_fwd)
    with pytest.raises(ValueError, match="unknown method"):
        with qt.route("nope"):
            pass
    x = torch.randn(1, L, E)
    with pytest.raises(RuntimeError, match="inside"):
        with qt.route("fp32"):
            raise RuntimeError("inside")
    assert (F.multi_head_attention_forward, torch._native_multi_head_attention,
            torch._transformer_encoder_layer_fwd) == before
    zero = torch.nn.MultiheadAttention(E, H, batch_first=True, add_zero_attn=True).eval()
    with pytest.raises(NotImplementedError, match="add_zero_attn"):
        with qt.route("fp32"):
            zero(x, x, x)
    train = torch.nn.MultiheadAttention(E, H, batch_first=True, dropout=0.1).train()
    with pytest.raises(NotImplementedError, match="dropout"):
        with qt.route("fp32"):
            train(x, x, x)


class HandWrittenAttention(torch.nn.Module):
    """Self-attention as many models write it, softmax(q k^T / sqrt(d)) v in its own forward: no PyTorch attention
    function is called, so route cannot reach it; with ``method`` it calls qattn.torch.attention instead."""

    def __init__(self, method=None):
        super().__init__()
        self.method = method
        self.qkv = torch.nn.Linear(E, 3 * E)
        self.out = torch.nn.Linear(E, E)

    def forward(self, x):
        n = x.shape[0]
        q, k, v = (t.reshape(n, L, H, E // H).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        if self.method is None:
            o = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(E // H), dim=-1) @ v
        else:
            o = qt.attention(q, k, v, self.method)
        return self.out(o.transpose(1, 2).reshape(n, L, E))


def test_route_warns_or_raises_when_no_attention_call_went_through_qattn():
    torch.manual_seed(5)
    model = HandWrittenAttention().eval()
    x = torch.randn(2, L, E)
    with torch.no_grad():
        native = model(x)
        with pytest.warns(qt.RouteWarning, match=r"calls == 0.*multi_head_attention_forward.*"
                                                 r"_transformer_encoder_layer_fwd.*qattn\.torch\.attention") as caught:
            with qt.route("intattention") as r:
                y = model(x)
        assert r.calls == 0 and torch.equal(y, native)
        assert len(caught) == 1 and caught[0].filename == __file__  # pointed at the with statement
        with pytest.raises(RuntimeError, match=r"calls == 0.*qattn\.torch\.attention"):
            with qt.route("intattention", strict=True):
                model(x)
        # What the message says to do: the model's attention calls qattn.torch.attention
        exact, quant = HandWrittenAttention("fp64").eval(), HandWrittenAttention("intattention").eval()
        exact.load_state_dict(model.state_dict())
        quant.load_state_dict(model.state_dict())
        assert torch.allclose(exact(x), native, atol=1e-5) and (quant(x) - native).abs().max() > 1e-4
    # A block that raised reports its own exception, not a missing route
    with warnings.catch_warnings():
        warnings.simplefilter("error", qt.RouteWarning)
        with pytest.raises(KeyError, match="inside"):
            with qt.route("fp32", strict=True):
                raise KeyError("inside")
        with pytest.raises(KeyError, match="inside"):
            with qt.route("fp32"):
                raise KeyError("inside")


def test_route_through_multihead_attention_neither_warns_nor_raises(mha):
    x = torch.randn(2, L, E)
    with warnings.catch_warnings():
        warnings.simplefilter("error", qt.RouteWarning)
        for grad in (True, False):
            with torch.set_grad_enabled(grad), qt.route("intattention", strict=True) as r:
                mha(x, x, x, need_weights=False)
            assert r.calls > 0
            with torch.set_grad_enabled(grad), qt.route("intattention") as r:
                mha(x, x, x, need_weights=False)
            assert r.calls > 0


def test_attention_on_torch_tensors():
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((2, H, L, 16)).astype(np.float32) for _ in range(3))
    o = qt.attention(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v), "intattention", causal=True)
    assert o.dtype == torch.float32 and o.shape == (2, H, L, 16)
    assert torch.equal(o, torch.from_numpy(qattn.attention(q, k, v, "intattention", causal=True)).float())
    o, p = qt.attention(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v), "fp64", return_probs=True)
    assert p.shape == (2, H, L, L) and torch.allclose(p.sum(-1), torch.ones(2, H, L, dtype=torch.float64))
    with pytest.raises(TypeError, match="q: expected dtype"):
        qt.attention(torch.from_numpy(q).int(), torch.from_numpy(k), torch.from_numpy(v), "fp32")
    with pytest.raises(TypeError, match="mask"):
        qt.attention(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v), "fp32", mask=torch.ones(L, L))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_route_and_attention_on_bf16_and_f16_models(mha, dtype):
    q = torch.randn(1, H, L, 16).to(dtype)
    o = qt.attention(q, q, q, "fp64")
    assert o.dtype == dtype
    assert torch.equal(o, qt.attention(q.float(), q.float(), q.float(), "fp64").to(dtype))
    if dtype == torch.float16:
        return  # this PyTorch has no float16 matrix product on the CPU, so no float16 model runs here
    x = torch.randn(2, L, E)
    low = torch.nn.MultiheadAttention(E, H, batch_first=True).eval()
    low.load_state_dict(mha.state_dict())
    low = low.to(dtype)
    with torch.no_grad():
        with qt.route("fp32") as r:
            y, _ = low(x.to(dtype), x.to(dtype), x.to(dtype), need_weights=False)
        expect, _ = mha(x, x, x, need_weights=False)
    assert r.calls > 0 and y.dtype == dtype
    assert torch.allclose(y.float(), expect, atol=0.1)  # the projections run in bfloat16


def test_backward_through_route_raises_instead_of_dropping_gradients(mha):
    x = torch.randn(1, L, E, requires_grad=True)
    with qt.route("fp32"):
        y, _ = mha(x, x, x, need_weights=False)
    with pytest.raises(RuntimeError, match="gradients do not flow through qattn"):
        y.sum().backward()
    with torch.no_grad(), qt.route("fp32"):
        y, _ = mha(x, x, x, need_weights=False)
    assert not y.requires_grad


def test_numpy_float16_inputs_are_widened_exactly():
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((L, 16)).astype(np.float16) for _ in range(3))
    o16 = qattn.attention(q, k, v, "intattention")
    o32 = qattn.attention(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32), "intattention")
    assert np.array_equal(o16, o32)
