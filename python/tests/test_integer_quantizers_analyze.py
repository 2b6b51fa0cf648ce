"""Tests of the integer softmax form, the exact reference, the KV and weight quantizers and analyze: each against the
CLI (bit for bit where the CLI computes the same thing) or against a property that a wrong implementation breaks."""
import decimal
import json
import math
import os
import subprocess

import numpy as np
import pytest

import qattn

CLI = os.environ.get("QATTN_CLI", "qattn")
SAMPLE = os.path.join(os.environ.get("QATTN_SOURCE", "."), "experiments", "data", "use-lite")


def sample(name):
    return np.load(os.path.join(SAMPLE, name))


def cli(*args):
    return subprocess.run([CLI, *args], check=True, capture_output=True, text=True).stdout


# ---- integer softmax --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("clip", [("--cint", "96"), ("--alpha", "0.0625")])
def test_softmax_integer_equals_the_cli_bit_for_bit(tmp_path, clip):
    logits = np.rint(sample("layer0_head1_logits.npy")[0] * 16).astype(np.int32)  # [128, 128]
    np.save(tmp_path / "x.npy", logits)
    cli("softmax", "--in", str(tmp_path / "x.npy"), "--method", "index", clip[0], clip[1], "--raw",
        "--out", str(tmp_path / "raw.npy"))
    cli("softmax", "--in", str(tmp_path / "x.npy"), "--method", "index", clip[0], clip[1],
        "--out", str(tmp_path / "p.npy"))
    kwargs = {"cint": int(clip[1])} if clip[0] == "--cint" else {"alpha": float(clip[1])}
    p, raw, raw_scale = qattn.softmax_integer(logits, "index", **kwargs)
    expect_raw = np.load(tmp_path / "raw.npy")
    assert raw.dtype == expect_raw.dtype == np.uint8
    assert np.array_equal(raw, expect_raw)
    assert np.array_equal(p, np.load(tmp_path / "p.npy"))
    assert raw_scale == 255 and np.array_equal(p, raw / 255.0)


def test_softmax_integer_takes_int8_and_refuses_what_it_cannot_compute():
    x8 = np.array([[-40, 0, 20]], dtype=np.int8)
    p8, raw8, _ = qattn.softmax_integer(x8, "index", cint=64)
    p32, raw32, _ = qattn.softmax_integer(x8.astype(np.int32), "index", cint=64)
    assert np.array_equal(raw8, raw32) and raw8[0, 2] >= raw8[0, 1] >= raw8[0, 0] and raw8[0, 2] > raw8[0, 0]
    with pytest.raises(TypeError, match="logits: expected dtype int8, int16 or int32"):
        qattn.softmax_integer(np.zeros((2, 3)), "index", cint=4)
    with pytest.raises(ValueError, match="give exactly one"):
        qattn.softmax_integer(x8, "index", cint=4, alpha=0.1)
    with pytest.raises(ValueError, match="give exactly one"):
        qattn.softmax_integer(x8, "index")
    with pytest.raises(ValueError, match="cint: must be in"):
        qattn.softmax_integer(x8, "index", cint=0)
    with pytest.raises(ValueError, match="integer"):
        qattn.softmax_integer(x8, "fp32", cint=4)


def test_attention_raw_p_equals_the_cli(tmp_path):
    names = [os.path.join(SAMPLE, "layer0_head3_" + t + ".npy") for t in "qkv"]
    cli("attention", "--q", names[0], "--k", names[1], "--v", names[2], "--method", "intattention", "--raw",
        "--out", str(tmp_path / "o.npy"), "--probs", str(tmp_path / "p.npy"))
    q, k, v = (np.load(n)[0] for n in names)
    o, p_raw = qattn.attention(q, k, v, "intattention", return_probs=True, raw=True)
    expect = np.load(tmp_path / "p.npy")[0]
    assert p_raw.dtype == expect.dtype == np.uint8 and np.array_equal(p_raw, expect)
    _, p = qattn.attention(q, k, v, "intattention", return_probs=True)
    assert np.array_equal(p, p_raw / 255.0)
    with pytest.raises(ValueError, match="return_probs"):
        qattn.attention(q, k, v, "intattention", raw=True)
    with pytest.raises(ValueError, match="no integer P"):
        qattn.attention(q, k, v, "fp32", return_probs=True, raw=True)


# ---- exact reference ---------------------------------------------------------------------------------------------

def test_exact_softmax_is_exact_to_50_digits():
    x = np.array([[0.0, math.log(3.0), -np.inf]])
    d = qattn.exact_softmax(x, decimal=True)
    decimal.getcontext().prec = 60
    # softmax([0, ln 3]) = [1/4, 3/4] up to the rounding of ln 3 to double: within 2^-53 relative of it
    assert abs(d[0, 0] - decimal.Decimal("0.25")) < decimal.Decimal("1e-16") and d[0, 2] == 0
    assert abs(sum(d[0]) - 1) < decimal.Decimal("1e-48")
    logits = sample("layer1_head0_logits.npy")[0]
    e = qattn.exact_softmax(logits)
    dd = qattn.exact_softmax(logits[:4], decimal=True)
    assert np.array_equal(e[:4], np.array([[float(v) for v in row] for row in dd]))  # rounded once
    p64 = qattn.softmax(logits, "fp64")
    assert np.max(np.abs(e - p64) / np.maximum(e, 1e-300)) < 1e-13
    with pytest.raises(ValueError, match="logits"):
        qattn.exact_softmax(np.array([[0.0, np.nan]]))


def test_exact_softmax_equals_the_reference_of_analyze(tmp_path):
    logits = sample("layer1_head3_logits.npy")[:1]
    np.save(tmp_path / "x.npy", logits)
    report = json.loads(cli("analyze", "--logits", str(tmp_path / "x.npy"), "--reference", "exact", "--method",
                            "fp64", "--format", "json"))
    ours = qattn.compare(qattn.softmax(logits, "fp64"), qattn.exact_softmax(logits))
    assert ours["cossim"] == report["heads"][0]["P"]["cossim"]
    assert ours["max_abs"] == report["heads"][0]["P"]["max_abs"]


# ---- quantizers --------------------------------------------------------------------------------------------------

def heads(layer, t):
    return np.stack([sample(f"layer{layer}_head{h}_{t}.npy")[0] for h in range(4)])  # [4, 128, d]


def test_quantizers_list_the_cli_registries():
    listed = json.loads(cli("methods", "--format", "json"))
    cli_names = [e["name"] for e in listed if "kind" not in e]
    ours = qattn.quantizers()
    assert [e["name"] for e in ours["kv"] + ours["weights"]] == cli_names
    assert any(p["key"] == "bits" for p in ours["kv"][0]["params"])


def test_quantize_kv_matches_attention_with_kv_and_the_cli_bits():
    q, k, v = heads(0, "q"), heads(0, "k"), heads(0, "v")
    r = qattn.quantize_kv(k, v, "kivi:bits=2")
    assert r["rotation"] is None and r["k"].shape == k.shape
    assert 0 < np.mean(np.abs(r["k"] - k)) and np.max(np.abs(r["k"] - k)) < np.ptp(k)
    o_kv = qattn.attention(q, k, v, "fp64", kv="kivi:bits=2")
    assert np.array_equal(o_kv, qattn.attention(q, r["k"], r["v"], "fp64"))
    # a rotating quantizer: attention reads K in the rotated basis, Q is rotated the same way
    t = qattn.quantize_kv(k, v, "saw:rotate-v=true")
    assert t["rotation"] is not None and t["v_rotated"]
    rot = t["rotation"]
    assert np.allclose(rot @ rot.T, np.eye(rot.shape[0]), atol=1e-12)
    o_t = qattn.attention(q, k, v, "fp64", kv="saw:rotate-v=true")
    o_manual = qattn.attention(q @ rot, t["k"], t["v"], "fp64")
    o_manual = o_manual @ rot.T
    assert np.max(np.abs(o_t - o_manual)) < 1e-9
    report = json.loads(cli("analyze", "--tensors", SAMPLE, "--kv", "kivi:bits=2", "--method", "fp32", "--format",
                            "json"))
    layer0 = [h for h in report["heads"] if h["layer"] == 0]
    # the CLI averages over both sentences of the sample; per head the cost of one sentence is the same here
    assert r["k_bits"] == pytest.approx(np.mean([h["K_bits"] for h in layer0]), rel=0, abs=1e-12)
    with pytest.raises(ValueError, match="unknown KV quantizer 'nope'"):
        qattn.quantize_kv(k, v, "nope")
    with pytest.raises(ValueError, match="do not fit"):
        qattn.quantize_kv(k, v[:2], "rtn")


def test_quantize_weights_gptq_beats_rtn_on_real_inputs():
    x = sample("layer0_attn_input.npy").reshape(-1, 256)
    w = sample("layer0_wq.npy")
    err = {}
    for spec in ("rtn:bits=3", "gptq:bits=3", "awq:bits=3"):
        w_hat = qattn.quantize_weights(w, x, spec)
        assert w_hat.shape == w.shape and not np.array_equal(w_hat, w)
        err[spec] = np.linalg.norm(x @ w_hat - x @ w) / np.linalg.norm(x @ w)
    assert err["gptq:bits=3"] < err["rtn:bits=3"]
    assert err["awq:bits=3"] <= err["rtn:bits=3"]
    # 8-bit RTN is close, 2-bit is not: the bits reach the grid
    assert np.linalg.norm(qattn.quantize_weights(w, x, "rtn:bits=8") - w) < np.linalg.norm(
        qattn.quantize_weights(w, x, "rtn:bits=2") - w) / 20
    with pytest.raises(ValueError, match="W \\[in, out\\] and X \\[n, in\\]"):
        qattn.quantize_weights(w, x[:, :10], "rtn")


# ---- analyze -----------------------------------------------------------------------------------------------------

def test_analyze_equals_the_cli_report():
    methods = ["intattention", "sage2@paper-8b"]
    records = qattn.analyze(SAMPLE, methods, as_frame=False)
    report = json.loads(cli("analyze", "--tensors", SAMPLE, "--method", methods[0], "--method", methods[1],
                            "--format", "json"))
    assert len(records) == len(report["heads"]) == 2 * 8
    for r, h in zip(records, report["heads"]):
        assert (r["layer"], r["head"], r["method"]) == (h["layer"], h["head"], h["method"])
        assert r["O_cossim"] == h["O"]["cossim"] and r["P_rmse"] == h["P"]["rmse"]
    assert records.summary == report["summary"]


def test_analyze_softmax_only_kv_and_errors(tmp_path):
    soft = qattn.analyze(SAMPLE, ["exaq", "index"], softmax_only=True, reference="exact", as_frame=False)
    assert {r["method"] for r in soft} == {"exaq", "index"} and "O_cossim" not in soft[0]
    assert all(0.9 < r["P_cossim"] <= 1 for r in soft)
    kv = qattn.analyze(SAMPLE, ["fp32"], kv="rtn:bits=4", as_frame=False)
    assert all(r["K_bits"] > 4 for r in kv)
    with pytest.raises(ValueError, match=str(tmp_path / "missing")):
        qattn.analyze(tmp_path / "missing", ["fp32"])
    with pytest.raises(ValueError, match="--reference"):
        qattn.analyze(SAMPLE, ["fp32"], reference="exact")
    with pytest.raises(ValueError, match="unknown method"):
        qattn.analyze(SAMPLE, ["nope"])


def test_analyze_returns_records_and_a_dataframe_on_request():
    assert isinstance(qattn.analyze(SAMPLE, ["fp32"]), list)  # the default, whatever is installed: records
    try:
        import pandas  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError):
            qattn.analyze(SAMPLE, ["fp32"], as_frame=True)
        return
    frame = qattn.analyze(SAMPLE, ["fp32"], as_frame=True)
    assert list(frame["method"].unique()) == ["fp32"] and "summary" in frame.attrs


def test_non_finite_metrics_are_floats_in_records_and_summaries_and_strings_in_json():
    # Without a KV quantizer K_bits is NaN: "nan" in the JSON report (as in the tables), float NaN in Python
    report = json.loads(cli("analyze", "--tensors", SAMPLE, "--method", "fp32", "--format", "json"))
    assert report["heads"][0]["K_bits"] == "nan"
    records = qattn.analyze(SAMPLE, ["fp32"], as_frame=False)
    assert all(isinstance(r["K_bits"], float) and r["K_bits"] != r["K_bits"] for r in records)
    assert all(isinstance(v, float) for s in records.summary for part in ("mean", "worst") for v in s[part].values())
    # KL is D(P_method || P_ref): finite and never negative for a quantised P with zeros and for fp32 alike
    for r in qattn.analyze(SAMPLE, ["intattention", "fp32"], as_frame=False):
        assert 0 <= r["P_kl_mean"] < float("inf")
