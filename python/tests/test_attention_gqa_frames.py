"""qattn.attention with grouped-query K/V and with a qattn.Method; analyze's records in the order the methods were
given and as DataFrames; the native binding's type errors in words."""
import os

import numpy as np
import pytest

import qattn

SAMPLE = os.path.join(os.environ.get("QATTN_SOURCE", "."), "experiments", "data", "use-lite")


def np_softmax(logits):
    m = logits.max(axis=1, keepdims=True)
    e = np.exp(logits - np.where(np.isfinite(m), m, 0))
    return e / e.sum(axis=1, keepdims=True)


def qkv(heads=4, kv_heads=2, batch=2, length=24, d=16, dtype=np.float32):
    rng = np.random.default_rng(50)
    q = rng.standard_normal((batch, heads, length, d)).astype(dtype)
    k = rng.standard_normal((batch, kv_heads, length, d)).astype(dtype)
    v = rng.standard_normal((batch, kv_heads, length, d)).astype(dtype)
    return q, k, v


@pytest.mark.parametrize("method", ["fp32", "intattention", "sage2", "turbo", "fa3-fp8"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gqa_equals_the_repeated_heads_bit_for_bit(method, dtype):
    q, k, v = qkv(dtype=dtype)
    o, p = qattn.attention(q, k, v, method, causal=True, return_probs=True)
    kr, vr = np.repeat(k, 2, axis=1), np.repeat(v, 2, axis=1)  # head h reads K/V head h // 2
    o_rep, p_rep = qattn.attention(q, kr, vr, method, causal=True, return_probs=True)
    assert o.shape == q.shape and np.array_equal(o, o_rep) and np.array_equal(p, p_rep)
    # and not K/V head h % 2 (interleaved groups)
    o_wrong = qattn.attention(q, np.tile(k, (1, 2, 1, 1)), np.tile(v, (1, 2, 1, 1)), method, causal=True)
    assert not np.array_equal(o, o_wrong)


def test_gqa_shapes_that_do_not_divide_name_both_counts():
    q, k, v = qkv(heads=4, kv_heads=3)
    with pytest.raises(ValueError, match="4 query heads and 3 K/V heads"):
        qattn.attention(q, k, v, "fp32")
    q, k, _ = qkv(heads=4, kv_heads=2)
    with pytest.raises(ValueError, match="2 heads in k .* but 4 in v"):
        qattn.attention(q, k, q, "fp32")
    with pytest.raises(ValueError, match="do not fit"):  # another leading axis still has to match
        qattn.attention(q, k[:1], k[:1], "fp32")


def test_attention_takes_an_own_method_of_either_kind():
    q, k, v = qkv(dtype=np.float64)
    ref = qattn.attention(q, k, v, "fp64", causal=True)
    o, p = qattn.attention(q, k, v, qattn.Method("np-softmax", np_softmax), causal=True, return_probs=True)
    assert np.abs(o - ref).max() < 1e-12 and np.allclose(p.sum(axis=-1), 1)
    assert np.all(p[..., 0, 1:] == 0)  # the causal mask reached the callable's logits as -inf

    def attn(q, k, v, scale, mask, shift):
        s = scale * q @ k.T + shift
        s = np.where(mask, s, -np.inf) if mask is not None else s
        return np_softmax(s) @ v

    o2 = qattn.attention(q, k, v, qattn.Method("np-attention", attn, kind="attention", shift=0.0), causal=True)
    assert np.abs(o2 - ref).max() < 1e-12
    o3 = qattn.attention(q, k, v, qattn.Method("np-attention", attn, kind="attention", shift=0.0))
    assert np.abs(o3 - ref).max() > 1e-3  # without causal, the callable got no mask: a different O


def test_what_an_own_method_raises_leaves_attention_as_itself():
    q, k, v = qkv()

    def broken(logits):
        raise KeyError("no such table")

    with pytest.raises(KeyError, match="no such table") as e:
        qattn.attention(q, k, v, qattn.Method("broken", broken))
    if hasattr(e.value, "__notes__"):
        assert any("qattn.attention: broken raised KeyError" in n for n in e.value.__notes__)
    with pytest.raises(ValueError, match="has no integer P"):
        qattn.attention(q, k, v, qattn.Method("np-softmax", np_softmax), return_probs=True, raw=True)
    with pytest.raises(TypeError, match="method must be a spec \\(str\\) or a qattn.Method, got int"):
        qattn.attention(q, k, v, 7)


def test_a_binding_type_error_names_the_parameter_not_the_array():
    q, k, v = qkv(length=512, d=64)
    with pytest.raises(TypeError) as e:
        qattn.attention(q, k, v, "fp32", scale="1/8")
    assert str(e.value) == "attention: scale must be None or a real number, got str"
    with pytest.raises(TypeError) as e:
        qattn.softmax(q, "exaq", engine=3)
    assert str(e.value) == "softmax: engine must be a str, got int"
    with pytest.raises(TypeError) as e:
        qattn.compare(q, None)
    assert len(str(e.value)) < 300 and "array(" not in str(e.value)


def test_analyze_keeps_the_order_the_methods_were_given():
    mine = qattn.Method("np-softmax", np_softmax)
    records = qattn.analyze(SAMPLE, [mine, "index@paper", "fp16"])
    assert isinstance(records, list)  # records by default, whatever is installed
    assert [s["method"] for s in records.summary] == ["np-softmax", "index@paper", "fp16"]
    assert [r["method"] for r in records[:6]] == ["np-softmax", "index@paper", "fp16"] * 2
    assert [(r["layer"], r["head"]) for r in records[:3]] == [(0, 0)] * 3
    again = qattn.analyze(SAMPLE, ["fp16", "index@paper"])
    assert [s["method"] for s in again.summary] == ["fp16", "index@paper"]


def test_records_to_frame():
    pandas = pytest.importorskip("pandas")
    records = qattn.analyze(SAMPLE, ["fp16", "index@paper"])
    frame = records.to_frame()
    assert isinstance(frame, pandas.DataFrame) and len(frame) == len(records) == 16
    assert list(frame["method"][:2]) == ["fp16", "index@paper"] and frame.attrs["summary"] == records.summary
    assert frame["O_cossim"].tolist() == [r["O_cossim"] for r in records]
    summary = records.to_frame(summary=True)
    assert list(summary["method"]) == ["fp16", "fp16", "index@paper", "index@paper"]
    assert list(summary["stat"]) == ["mean", "worst"] * 2
    assert summary["O_cossim"][1] == records.summary[0]["worst"]["O_cossim"]
    assert qattn.analyze(SAMPLE, ["fp16"], as_frame=True).equals(qattn.analyze(SAMPLE, ["fp16"]).to_frame())
