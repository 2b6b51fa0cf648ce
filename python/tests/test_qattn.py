"""Tests of the Python package qattn: every function, its errors, and bit-equality with the CLI on the embedded
USE-Lite sample. Run by CTest (python_package) with PYTHONPATH set to the build tree's package, QATTN_CLI to the
qattn program and QATTN_SOURCE to the repository."""
import json
import os
import resource
import subprocess
import sys
import threading

import numpy as np
import pytest

import qattn

CLI = os.environ.get("QATTN_CLI", "qattn")
SAMPLE = os.path.join(os.environ.get("QATTN_SOURCE", "."), "experiments", "data", "use-lite")


def sample(name):
    return np.load(os.path.join(SAMPLE, name))


def cli(*args):
    subprocess.run([CLI, *args], check=True, capture_output=True)


def test_methods_match_the_cli_registry():
    listed = json.loads(subprocess.run([CLI, "methods", "--format", "json"], check=True, capture_output=True,
                                       text=True).stdout)
    cli_names = [e["name"] for e in listed if "kind" in e]
    ours = qattn.methods()
    assert [m["name"] for m in ours] == cli_names
    intattention = next(m for m in ours if m["name"] == "intattention")
    keys = [p["key"] for p in intattention["params"]]
    assert "k-group" in keys and "group-max" in keys
    assert {p["name"] for p in intattention["presets"]} >= {"paper", "upstream-sim", "upstream-neon"}
    assert intattention["kind"] == "attention pipeline"
    # the flash kernels name the parts no measured vector validates: sage3's units are MMA-Sim's model
    sage3 = next(e for e in listed if e["name"] == "sage3")
    assert any(p.startswith("S on b200-nvf4") for p in sage3["not_validated"])
    assert "not_validated" not in next(e for e in listed if e["name"] == "intattention")


def test_canonical_spells_out_every_parameter_and_refuses_bad_specs():
    c = qattn.canonical("intattention@upstream-neon:k-group=64")
    assert c.startswith("intattention:") and "k-group=64" in c and "index=q26-round" in c
    with pytest.raises(ValueError, match="unknown method 'nope'"):
        qattn.canonical("nope")
    with pytest.raises(ValueError, match="k-group"):
        qattn.canonical("intattention:k-group=-1")


def test_an_old_preset_spelling_warns_which_preset_it_now_means():
    sage2 = next(m for m in qattn.methods() if m["name"] == "sage2")
    aliases = {p["name"]: p["alias_of"] for p in sage2["presets"] if "alias_of" in p}
    assert aliases == {"8b": "sm90", "4b": "sm89-int4", "hadmdattn": "sm89-hadmdattn", "smoothattn": "sm89-smoothattn"}
    with pytest.warns(FutureWarning, match="sage2@smoothattn now means sage2@sm89-smoothattn"):
        old = qattn.canonical("sage2@smoothattn")
    assert old == qattn.canonical("sage2@sm89-smoothattn")
    # a filter that makes the warning an error raises it from the call (once said, a spelling warns no more)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        with pytest.raises(FutureWarning, match="sage2@hadmdattn now means sage2@sm89-hadmdattn"):
            qattn.canonical("sage2@hadmdattn")


@pytest.mark.parametrize("method", ["intattention@upstream-neon", "intattention:k-group=32,group-max=offset",
                                    "quant-only", "fp32", "sage2@paper-8b", "turbo", "turbo@decode:nh=1", "index@paper"])
def test_attention_equals_the_cli_bit_for_bit(tmp_path, method):
    names = [os.path.join(SAMPLE, "layer1_head2_" + t + ".npy") for t in "qkv"]
    q, k, v = (np.load(n) for n in names)  # [2, 128, 64] float32, the axis before L read as heads
    cli("attention", "--q", names[0], "--k", names[1], "--v", names[2], "--method", method, "--causal",
        "--out", str(tmp_path / "o.npy"), "--probs", str(tmp_path / "p.npy"))
    expect_o, expect_p = np.load(tmp_path / "o.npy"), np.load(tmp_path / "p.npy")
    o, p = qattn.attention(q, k, v, method, causal=True, return_probs=True)  # both run eval::attention
    assert np.array_equal(o.astype(np.float32), expect_o)
    assert np.array_equal(p, expect_p)
    # Each entry alone gives the same bits, except where a method ranks the heads of one call: turbo@decode:nh=1 takes
    # one head of two to 2 bits, and each head alone is that one.
    alone = [qattn.attention(q[b], k[b], v[b], method, causal=True) for b in range(q.shape[0])]
    same = all(np.array_equal(alone[b].astype(np.float32), expect_o[b]) for b in range(q.shape[0]))
    assert same == (method != "turbo@decode:nh=1")


def test_softmax_equals_the_cli_bit_for_bit(tmp_path):
    path = os.path.join(SAMPLE, "layer0_head1_logits.npy")
    for method in ["index@upstream-neon", "exaq@paper:bits=3", "sas", "fp16"]:
        cli("softmax", "--in", path, "--method", method, "--out", str(tmp_path / "p.npy"))
        assert np.array_equal(qattn.softmax(np.load(path), method), np.load(tmp_path / "p.npy")), method


def test_engines_agree_and_fast_refuses_what_it_cannot_run():
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((3, 4, 33, 16)) for _ in range(3))
    mask = rng.random((33, 33)) < 0.8
    for method in ["intattention@paper", "intattention:k-group=8"]:
        fast = qattn.attention(q, k, v, method, mask=mask, causal=True, engine="fast", threads=2)
        ref = qattn.attention(q, k, v, method, mask=mask, causal=True, engine="reference")
        assert np.array_equal(fast, ref)
    with pytest.raises(ValueError, match="engine=fast"):
        qattn.attention(q, k, v, "fp64", engine="fast")
    with pytest.raises(ValueError, match="unknown engine"):
        qattn.attention(q, k, v, "fp64", engine="bogus")
    with pytest.raises(ValueError, match="threads"):
        qattn.attention(q, k, v, "fp64", threads=-1)


def test_attention_shapes_heads_and_defaults():
    rng = np.random.default_rng(4)
    q, k, v = rng.standard_normal((5, 8)), rng.standard_normal((7, 8)), rng.standard_normal((7, 3))
    o = qattn.attention(q, k, v, "fp64")
    s = q @ k.T / np.sqrt(8)
    p = np.exp(s - s.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    assert o.shape == (5, 3) and np.allclose(o, p @ v, rtol=0, atol=1e-12)
    assert np.allclose(qattn.attention(q, k, v, "fp64", scale=0.5), qattn.attention(q * 0.5 * np.sqrt(8), k, v, "fp64"))
    # Leading axes: [batch, heads, L, d] is the same as one call per (batch, head) for a head-independent method.
    q4, k4, v4 = (rng.standard_normal((2, 3, 6, 4)) for _ in range(3))
    o4 = qattn.attention(q4, k4, v4, "intattention")
    for b in range(2):
        for h in range(3):
            assert np.array_equal(o4[b, h], qattn.attention(q4[b, h], k4[b, h], v4[b, h], "intattention"))
    # Any layout and float32 are accepted (converted exactly): a transposed view equals its contiguous copy.
    kt = np.asfortranarray(k)
    assert np.array_equal(qattn.attention(q, kt, v, "intattention"), qattn.attention(q, k.copy(), v, "intattention"))
    assert np.array_equal(qattn.attention(q.astype(np.float32), k, v, "fp64"),
                          qattn.attention(q.astype(np.float32).astype(np.float64), k, v, "fp64"))


def test_c_contiguous_float64_is_read_in_place_and_the_rest_converted_once():
    address = qattn._qattn._input_address
    a = np.random.default_rng(9).standard_normal((3, 16, 8))
    assert address(a) == a.ctypes.data
    assert address(a[1]) == a[1].ctypes.data == a.ctypes.data + 16 * 8 * 8  # a contiguous slice of heads too
    unaligned = np.frombuffer(np.zeros(16 * 8 * 8 + 1, np.uint8)[1:].data, np.float64).reshape(16, 8)
    assert not unaligned.flags.aligned
    for converted in (np.asfortranarray(a), a[:, ::2], a.transpose(0, 2, 1), unaligned):
        assert address(converted) != converted.ctypes.data
    # C-contiguous float32 is read in place too; other float32 layouts are converted.
    a32 = a.astype(np.float32)
    assert address(a32) == a32.ctypes.data
    assert address(a32[2]) == a32.ctypes.data + 2 * 16 * 8 * 4
    for converted in (np.asfortranarray(a32), a32[:, ::2]):
        assert address(converted) != converted.ctypes.data
    # Integer logits: int32, int16 and int8 in place (the model widens one row at a time); other layouts converted.
    logits = np.random.default_rng(3).integers(-120, 0, (4, 32)).astype(np.int32)
    narrow = [logits.astype(np.int16), logits.astype(np.int8)]  # named: alive while their addresses are compared
    for in_place in [logits] + narrow:
        assert address(in_place) == in_place.ctypes.data
    fortran = np.asfortranarray(logits)
    assert address(fortran) != fortran.ctypes.data
    p32 = qattn.softmax_integer(logits, "index", cint=100)
    for other in [fortran] + narrow + [np.asfortranarray(narrow[1])]:
        p = qattn.softmax_integer(other, "index", cint=100)
        assert np.array_equal(p32[0], p[0]) and np.array_equal(p32[1], p[1])
    # The same values give the same bits whichever way they were read.
    q, k, v = a
    for view in (np.asfortranarray(k), k[::-1][::-1], np.concatenate([k, k], 1)[:, :8]):
        assert np.array_equal(qattn.attention(q, view, v, "intattention"), qattn.attention(q, k, v, "intattention"))


def test_float32_softmax_and_compare_give_the_bits_of_their_float64_values():
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((3, 5, 40)) * 4).astype(np.float32)
    x[1, 2, 3] = -np.inf  # masked
    wide = x.astype(np.float64)
    for spec in ("fp64", "fp32", "fp16", "bf16", "exaq", "exaq@paper", "index", "index@upstream-sim", "sas", "ibert",
                 "tflite-int8"):
        assert np.array_equal(qattn.softmax(x, spec), qattn.softmax(wide, spec)), spec
    with pytest.raises(ValueError, match=r"logits: \[2, 0, 1\]: is NaN"):
        bad = x.copy()
        bad[2, 0, 1] = np.nan
        qattn.softmax(bad, "fp32")
    out = qattn.softmax(x, "fp16").astype(np.float32)
    ref = qattn.softmax(x, "fp64").astype(np.float32)
    got, want = qattn.compare(out, ref), qattn.compare(out.astype(np.float64), ref.astype(np.float64))
    assert got == want and 0 < got["rmse"] < 1e-3
    assert qattn.compare(out, ref.astype(np.float64)) == want  # float32 next to float64: both widened


def test_float32_attention_read_in_place_gives_the_bits_of_its_float64_values():
    # float32 widens to float64 exactly, so the float32 entry must give the float64 entry's bits: on the fused kernels
    # (which quantise the float32 buffer directly) and on reference models (which widen it), over batch and heads,
    # with masks, P and raw P.
    rng = np.random.default_rng(17)
    q, k, v = (rng.standard_normal((2, 3, 24, 16)).astype(np.float32) * 3 for _ in range(3))
    k[..., 5] += 6  # a channel offset, as in real K
    wide = [x.astype(np.float64) for x in (q, k, v)]
    for spec in ("intattention", "intattention@paper", "intattention:k-group=8", "quant-only:softmax=lanes16",
                 "fp64", "fp16", "turbo@decode:nh=1", "sage2"):
        for causal in (False, True):
            got = qattn.attention(q, k, v, spec, causal=causal)
            assert got.dtype == np.float64
            assert np.array_equal(got, qattn.attention(*wide, spec, causal=causal)), (spec, causal)
    o32, p32 = qattn.attention(q, k, v, "intattention", return_probs=True, raw=True, engine="fast")
    o64, p64 = qattn.attention(*wide, "intattention", return_probs=True, raw=True, engine="fast")
    assert np.array_equal(o32, o64) and np.array_equal(p32, p64) and p32.dtype == np.uint8
    # float32 next to float64, and a KV quantizer, widen: still the same bits.
    assert np.array_equal(qattn.attention(q, wide[1], v, "intattention"), qattn.attention(*wide, "intattention"))
    assert np.array_equal(qattn.attention(q, k, v, "fp64", kv="kivi:bits=4"),
                          qattn.attention(*wide, "fp64", kv="kivi:bits=4"))
    # The policy holds on the float32 entry, naming the entry in the caller's array.
    bad = k.copy()
    bad[1, 2, 3, 4] = np.inf
    with pytest.raises(ValueError, match=r"K: \[1, 2, 3, 4\]: is \+inf"):
        qattn.attention(q, bad, v, "intattention")


@pytest.mark.parametrize("dtype, method, limit_kib", [
    # float64 K and V of 128 MiB each against one query, on a reference model: far below one more copy of K.
    ("float64", "fp64", 96 * 1024),
    # float32 K and V of 64 MiB each on the fused kernels: their own INT8 codes and packed copies (about 100 MiB at
    # d = 8, where packing pads V to 16 columns) but no float64 copy, which alone would be 256 MiB.
    ("float32", "intattention", 192 * 1024),
])
def test_reading_in_place_adds_no_copy_of_the_inputs(dtype, method, limit_kib):
    # The peak is the process's own VmHWM: ru_maxrss would keep the RSS of the parent this child was forked from
    # (the test runner's, which grows with the tests run before), since Linux carries it across exec.
    script = f"""
import numpy as np, qattn
def kib(field):
    return next(int(line.split()[1]) for line in open('/proc/self/status') if line.startswith(field + ':'))
k = np.ones((1 << 21, 8), np.{dtype}); v = np.ones((1 << 21, 8), np.{dtype}); q = np.ones((1, 8), np.{dtype})
before = kib('VmRSS')
qattn.attention(q, k, v, "{method}")
print(kib('VmHWM') - before)
"""
    grown_kib = int(subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True,
                                   env=dict(os.environ)).stdout)
    assert grown_kib < limit_kib, f"peak grew by {grown_kib} KiB during the call (limit {limit_kib} KiB)"


def test_bad_inputs_name_the_argument():
    q = np.zeros((4, 8))
    with pytest.raises(TypeError, match="k: expected dtype float32 or float64, got int32"):
        qattn.attention(q, q.astype(np.int32), q, "fp64")
    with pytest.raises(TypeError, match="q: expected a NumPy array"):
        qattn.attention([[1.0]], q, q, "fp64")
    with pytest.raises(ValueError, match=r"^k: shape: head dimension d of k \(7\) differs from q \(8\)$"):
        qattn.attention(q, np.zeros((4, 7)), q, "fp64")
    with pytest.raises(ValueError, match=r"^v: shape: v has 3 keys, k has 4$"):
        qattn.attention(q, q, np.zeros((3, 8)), "fp64")
    with pytest.raises(ValueError, match=r"^k: shape: .*q, k and v need the same rank$"):
        qattn.attention(q, q[None], q, "fp64")
    with pytest.raises(ValueError, match="mask: expected a bool array of shape \\(4, 4\\)"):
        qattn.attention(q, q, q, "fp64", mask=np.ones((4, 4)))
    with pytest.raises(ValueError, match="is NaN"):
        qattn.attention(q + np.nan, q, q, "fp64")
    with pytest.raises(ValueError, match="NaN"):
        qattn.softmax(np.array([[0.0, np.nan]]), "fp64")
    # The entry is named by its index in the caller's array, not in the matrix of one head.
    q4 = np.zeros((2, 3, 4, 8))
    q4[1, 2, 3, 5] = np.nan
    with pytest.raises(ValueError, match=r"^Q: \[1, 2, 3, 5\]: is NaN"):
        qattn.attention(q4, np.zeros_like(q4), np.zeros_like(q4), "intattention")
    with pytest.raises(ValueError, match=r"^V: \[1, 2, 3, 5\]: is \+inf"):
        qattn.attention(np.zeros_like(q4), np.zeros_like(q4), np.where(np.isnan(q4), np.inf, 0).astype(np.float32), "fp64")
    with pytest.raises(ValueError, match=r"^logits: \[1, 2, 3, 5\]: is NaN"):
        qattn.softmax(q4, "fp64")
    with pytest.raises(ValueError, match=r"^K: \[2, 3, 5\]: is NaN"):
        qattn.quantize_kv(q4[1], np.zeros((3, 4, 8)), "kivi")
    with pytest.raises(ValueError, match="scalar"):
        qattn.softmax(np.zeros(()), "fp64")
    with pytest.raises(ValueError, match="softmax-only form"):
        qattn.softmax(np.zeros((2, 3)), "intattention")


def test_masked_rows_and_entries():
    x = np.array([[0.0, -np.inf, 1.0], [-np.inf, -np.inf, -np.inf]])
    p = qattn.softmax(x, "fp64")
    assert p[0, 1] == 0 and np.isclose(p[0].sum(), 1) and not p[1].any()


def test_compare_matches_its_definitions():
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal(1000), rng.standard_normal(1000)
    m = qattn.compare(a, b)
    assert m["count"] == 1000 and m["nonfinite"] == 0
    assert np.isclose(m["cossim"], a @ b / np.linalg.norm(a) / np.linalg.norm(b), rtol=1e-12)
    assert np.isclose(m["rel_l1"], np.abs(a - b).sum() / np.abs(b).sum(), rtol=1e-12)
    assert np.isclose(m["rmse"], np.sqrt(np.mean((a - b) ** 2)), rtol=1e-12)
    assert np.isclose(m["max_abs"], np.abs(a - b).max(), rtol=1e-12)
    with pytest.raises(ValueError, match="shapes differ"):
        qattn.compare(a, b[:10])


def test_tensor_files_round_trip(tmp_path):
    q = sample("layer0_head0_q.npy")
    loaded = qattn.load(os.path.join(SAMPLE, "layer0_head0_q.npy"))
    assert list(loaded) == ["layer0_head0_q"] and loaded["layer0_head0_q"].dtype == q.dtype
    assert np.array_equal(loaded["layer0_head0_q"], q)
    arrays = {"a": q, "b": np.arange(6, dtype=np.float64).reshape(2, 3)}
    for name in ["t.npz", "t.safetensors"]:
        qattn.save(str(tmp_path / name), arrays)
        back = qattn.load(str(tmp_path / name))
        assert set(back) == {"a", "b"}
        for key in arrays:
            assert back[key].dtype == arrays[key].dtype and np.array_equal(back[key], arrays[key])
    qattn.save(str(tmp_path / "one.npy"), {"x": q})
    assert np.array_equal(np.load(tmp_path / "one.npy"), q)
    with pytest.raises(ValueError):
        qattn.save(str(tmp_path / "two.npy"), arrays)  # .npy holds exactly one tensor
    with pytest.raises(ValueError, match="missing.npy"):
        qattn.load(str(tmp_path / "missing.npy"))
    assert not (tmp_path / "two.npy").exists()


def test_threads_may_call_concurrently():
    rng = np.random.default_rng(6)
    q, k, v = (rng.standard_normal((64, 32)) for _ in range(3))
    expect = qattn.attention(q, k, v, "intattention")
    results = [None] * 4

    def work(i):
        results[i] = qattn.attention(q, k, v, "intattention")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(np.array_equal(r, expect) for r in results)


def test_no_memory_growth_over_1000_calls():
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((32, 16)) for _ in range(3))
    for _ in range(50):
        qattn.attention(q, k, v, "intattention", return_probs=True)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for _ in range(1000):
        qattn.attention(q, k, v, "intattention", return_probs=True)
        qattn.softmax(q, "index")
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 8 * 1024, grown_kib
