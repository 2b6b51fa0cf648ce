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
    with pytest.raises(ValueError, match=r"k and v have 3 heads .*, q has 4 .*: grouped-query attention needs the "
                                         "K/V head count to divide the query head count"):
        qattn.attention(q, k, v, "fp32")
    q, k, _ = qkv(heads=4, kv_heads=2)
    with pytest.raises(ValueError, match=r"v has 4 heads .*, k has 2 .*: grouped-query attention needs as many K "
                                         "heads as V heads"):
        qattn.attention(q, k, q, "fp32")
    with pytest.raises(ValueError, match="leading \\(batch\\) dimensions"):  # the other leading axes must match
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


def test_analyze_tables_for_a_paper_as_the_cli_writes_them():
    import subprocess
    mine = qattn.Method("np-softmax", np_softmax)
    text = qattn.analyze(SAMPLE, ["fp16", mine, "index@paper"], format="csv", summary=True,
                         columns="P_kl_mean,O_rmse")
    assert text.splitlines()[0] == "layer,head,method,P KL,O RMSE"
    assert [line.split(",")[2] for line in text.splitlines()[1:]] == [
        "fp16", "fp16", "np-softmax", "np-softmax", "index@paper", "index@paper"]
    cli = os.environ.get("QATTN_CLI")
    if cli:
        out = subprocess.run([cli, "analyze", "--tensors", SAMPLE, "--method", "fp16", "--method", "index@paper",
                              "--format", "latex", "--summary", "--columns", "O_one_minus_cossim,P_kl_mean"],
                             check=True, capture_output=True, text=True).stdout
        assert qattn.analyze(SAMPLE, ["fp16", "index@paper"], format="latex", summary=True,
                             columns=["O_one_minus_cossim", "P_kl_mean"]) == out
    with pytest.raises(ValueError, match="column 'nope' is not a column"):
        qattn.analyze(SAMPLE, ["fp16"], format="md", columns="nope")
    with pytest.raises(ValueError, match="records keep every row and metric"):
        qattn.analyze(SAMPLE, ["fp16"], summary=True)
    with pytest.raises(ValueError, match="summary"):
        qattn.analyze(SAMPLE, ["fp16"], format="json", summary=True)


def test_to_frame_chooses_columns():
    pytest.importorskip("pandas")
    records = qattn.analyze(SAMPLE, ["fp16", "index@paper"])
    frame = records.to_frame(columns="P_kl_mean,O_rmse")
    assert list(frame.columns) == ["layer", "head", "method", "P_kl_mean", "O_rmse"]
    summary = records.to_frame(summary=True, columns=["O_rmse"])
    assert list(summary.columns) == ["method", "stat", "O_rmse"] and len(summary) == 4
    with pytest.raises(ValueError, match="column 'O_rmse' is given twice"):
        records.to_frame(columns="O_rmse,O_rmse")
    with pytest.raises(ValueError, match="column 'nope' is not a column; the columns are O_cossim"):
        records.to_frame(columns=["nope"])
