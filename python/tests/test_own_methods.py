"""Methods of the user's own (qattn.Method) in qattn.analyze and qattn.sweep, beside the registry's."""
import os
import subprocess

import numpy as np
import pytest

import qattn

SAMPLE = os.path.join(os.environ.get("QATTN_SOURCE", "."), "experiments", "data", "use-lite")


def np_softmax(logits):
    m = logits.max(axis=1, keepdims=True)
    e = np.exp(logits - np.where(np.isfinite(m), m, 0))
    return e / e.sum(axis=1, keepdims=True)


def topk(logits, k):
    kept = np.argsort(-logits, axis=1, kind="stable")[:, :k]
    masked = np.full_like(logits, -np.inf)
    np.put_along_axis(masked, kept, np.take_along_axis(logits, kept, axis=1), axis=1)
    return np_softmax(masked)


def test_an_own_softmax_is_analysed_beside_the_registry_methods():
    records = qattn.analyze(SAMPLE, ["fp32", qattn.Method("np-softmax", np_softmax)], as_frame=False)
    mine = [r for r in records if r["method"] == "np-softmax"]
    assert len(mine) == 8 and {r["method"] for r in records} == {"fp32", "np-softmax"}
    assert all(abs(1 - r["O_cossim"]) < 1e-12 and 0 <= r["P_kl_mean"] < 1e-12 for r in mine)
    assert [s["method"] for s in records.summary] == ["fp32", "np-softmax"]
    assert records.summary[1]["canonical"] == "np-softmax"


def test_the_report_text_is_qattn_analyzes_with_the_own_methods_rows_after():
    # The registry's rows are the command's, byte for byte; the own method adds its rows and summary after them.
    cli = subprocess.run([os.environ.get("QATTN_CLI", "qattn"), "analyze", "--tensors", SAMPLE, "--method", "fp32",
                          "--method", "index@paper", "--format", "csv"], capture_output=True, text=True,
                         check=True).stdout
    alone = qattn.analyze(SAMPLE, ["fp32", "index@paper"], format="csv")
    assert alone == cli
    mine = qattn.analyze(SAMPLE, ["fp32", "index@paper", qattn.Method("top8", topk, k=8)], format="csv")
    assert all(line + "\n" in mine for line in cli.splitlines())
    assert "\nall,mean,top8:k=8," in mine and len(mine.splitlines()) == len(cli.splitlines()) + 8 + 2
    assert qattn.analyze(SAMPLE, "fp32", format="md").startswith("Attention error vs the fp64 reference on " + SAMPLE)
    with pytest.raises(ValueError, match="format"):
        qattn.analyze(SAMPLE, "fp32", format="html")


def test_sweep_over_an_own_methods_parameter_and_over_a_registry_spec():
    rows = qattn.sweep(SAMPLE, qattn.Method("topk", topk), {"k": [2, 8, 32]}, metric="kl", target="P")
    assert [r["method"] for r in rows] == ["topk:k=2", "topk:k=8", "topk:k=32"]
    assert rows[0]["mean"] > rows[1]["mean"] > rows[2]["mean"] > 0  # fewer keys kept, more mass lost
    # A registry spec: the same means as `qattn sweep`
    mine = qattn.sweep(SAMPLE, "index@paper", {"b": [4, 6]}, metric="cossim", target="O")
    cli = subprocess.run([os.environ.get("QATTN_CLI", "qattn"), "sweep", "--method", "index@paper", "--grid", "b=4,6",
                          "--tensors", SAMPLE], capture_output=True, text=True, check=True).stdout.splitlines()
    means = [float(line.split(",")[3]) for line in cli[1:]]
    assert [round(r["mean"], 8) for r in mine] == means
    with pytest.raises(ValueError, match="metric"):
        qattn.sweep(SAMPLE, "index", {"b": [4]}, metric="kl", target="O")


def test_a_scalar_grid_value_is_one_point_and_an_empty_axis_is_refused():
    def points(grid):
        return [(r["method"], r["mean"], r["worst"]) for r in qattn.sweep(SAMPLE, "index@paper", grid)]

    lists = points({"b": [4], "c": [6.0, 7.0]})
    assert [m for m, _, _ in lists] == ["index@paper:b=4,c=6.0", "index@paper:b=4,c=7.0"]
    for scalars in ({"b": 4, "c": [6.0, 7.0]}, {"b": "4", "c": (6.0, 7.0)},
                    {"b": np.int64(4), "c": np.array([6.0, 7.0])}, {"b": np.array(4), "c": [6.0, 7.0]}):
        assert points(scalars) == lists
    # A string is one value, not its characters ("46" is b = 46, which index refuses, not b = 4 and b = 6)
    with pytest.raises(ValueError, match="46"):
        qattn.sweep(SAMPLE, "index@paper", {"b": "46"})
    # The same for a method of one's own, whose parameter may be any object
    rows = qattn.sweep(SAMPLE, qattn.Method("topk", topk), {"k": 8}, metric="kl", target="P")
    assert [r["method"] for r in rows] == ["topk:k=8"] and rows[0]["k"] == 8
    for empty in ([], (), range(0), np.array([], dtype=np.int64)):
        with pytest.raises(ValueError, match="at least one value; empty: 'b'"):
            qattn.sweep(SAMPLE, "index@paper", {"c": 6.6, "b": empty})
    with pytest.raises(ValueError, match="'b' is a 2-D array"):
        qattn.sweep(SAMPLE, "index@paper", {"b": np.array([[4, 5]])})


def test_an_own_attention_method_with_and_without_p():
    def attention(q, k, v, scale, mask, with_p):
        s = scale * q @ k.T
        if mask is not None:
            s = np.where(mask, s, -np.inf)
        p = np_softmax(s)
        return (p @ v, p) if with_p else p @ v

    both = qattn.Method("np-attention", attention, kind="attention", with_p=True)
    o_only = qattn.Method("np-attention-o", attention, kind="attention", with_p=False)
    records = qattn.analyze(SAMPLE, [both, o_only], as_frame=False)
    by = {m: [r for r in records if r["method"] == m] for m in ("np-attention:with_p=True", "np-attention-o:with_p=False")}
    assert all(abs(1 - r["O_cossim"]) < 1e-12 and abs(1 - r["P_cossim"]) < 1e-12 for r in by["np-attention:with_p=True"])
    assert all(np.isnan(r["P_cossim"]) and abs(1 - r["O_cossim"]) < 1e-12 for r in by["np-attention-o:with_p=False"])


def test_own_methods_that_fail_name_themselves():
    def broken(logits):
        raise RuntimeError("my bug")

    with pytest.raises(RuntimeError, match="my bug") as raised:  # as itself, with a note naming the method
        qattn.analyze(SAMPLE, qattn.Method("broken", broken))
    assert "method broken: broken raised RuntimeError" in raised.value.__notes__[0]
    with pytest.raises(ValueError, match="short.*shape"):
        qattn.analyze(SAMPLE, qattn.Method("short", lambda logits: logits[:, :3]))
    with pytest.raises(ValueError, match="no softmax-only form"):
        qattn.analyze(SAMPLE, qattn.Method("a", lambda q, k, v, s, m: q, kind="attention"), softmax_only=True)
    with pytest.raises(ValueError, match="fp32.*given twice"):
        qattn.analyze(SAMPLE, ["fp32", qattn.Method("fp32", np_softmax)])
    with pytest.raises(TypeError, match="callable"):
        qattn.Method("x", 3)
    with pytest.raises(TypeError, match="qattn.Method"):
        qattn.analyze(SAMPLE, [np_softmax])


def test_a_single_spec_string_is_one_method():
    records = qattn.analyze(SAMPLE, "fp32", as_frame=False)
    assert {r["method"] for r in records} == {"fp32"} and len(records) == 8


def test_fp8_encode_is_the_h100s_torch_cast_and_cvt_satfinite():
    root = os.path.join(os.environ.get("QATTN_SOURCE", "."), "tests", "fixtures", "h100-fp8", "torch_casts_subset")
    d = {k: np.load(os.path.join(root, k + ".npy")) for k in ("bits", "e4m3fn", "e5m2")}
    x = d["bits"].view(np.float32)
    assert np.array_equal(qattn.fp8_encode(x, "e4m3fn", saturate=False), d["e4m3fn"])
    assert np.array_equal(qattn.fp8_encode(x, "e5m2", saturate=False), d["e5m2"])
    sat = qattn.fp8_encode(np.array([1e6, -np.inf, np.nan, 464.0], dtype=np.float32), "e4m3fn")
    assert sat.tolist() == [0x7E, 0xFE, 0x7F, 0x7E] and sat.dtype == np.uint8
    with pytest.raises(ValueError, match="e4m3fn"):
        qattn.fp8_encode(x, "e3m4")
