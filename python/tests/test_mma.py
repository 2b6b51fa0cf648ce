"""qattn.mma against what an H100 returned (experiments/data/h100-mma), and its input rules."""
import os

import numpy as np
import pytest

import qattn

FIXTURES = os.path.join(os.environ.get("QATTN_SOURCE", "."), "experiments", "data", "h100-mma")


def vectors(name):
    return qattn.load(os.path.join(FIXTURES, name + ".safetensors"))


def test_wgmma_fast_and_default_are_the_h100s_bits():
    v = vectors("wgmma_cublaslt_e4m3")
    for k in (32, 256):
        a, bt = v[f"K{k}_bytes_A"], v[f"K{k}_bytes_Bt"]
        assert a.dtype == np.uint8
        fast = qattn.mma(a, bt, model="h100-wgmma-e4m3")
        default = qattn.mma(a, bt, model="h100-wgmma-e4m3-promote")
        assert fast.dtype == np.float32 and fast.shape == (64, 64)
        assert np.array_equal(fast.view(np.uint32), v[f"K{k}_bytes_fast_D"].view(np.uint32))
        assert np.array_equal(default.view(np.uint32), v[f"K{k}_bytes_default_D"].view(np.uint32))
    # Past one promotion interval (K > 128) the two modes differ, and the fast model is not the default one.
    assert not np.array_equal(qattn.mma(v["K256_bytes_A"], v["K256_bytes_Bt"], model="h100-wgmma-e4m3"),
                              v["K256_bytes_default_D"])


def test_batched_hmma_with_c_and_the_f16_accumulator():
    v = vectors("mma_sync_m16n8k16_f16f32")
    d = qattn.mma(v["random_A"], v["random_Bt"], v["random_C"], model="h100-hmma-f16")
    assert d.shape == v["random_D"].shape
    assert np.array_equal(d.view(np.uint32), v["random_D"].view(np.uint32))
    h = vectors("mma_sync_m16n8k16_f16f16")
    d16 = qattn.mma(h["random_A"], h["random_Bt"], h["random_C"], model="h100-hmma-f16-acc16")
    assert d16.dtype == np.float16
    assert np.array_equal(d16, h["random_D"].astype(np.float16))


def test_float_operands_must_be_exact_in_the_input_format():
    a = np.array([[1.0, 0.5, -2.0, 448.0]], dtype=np.float32)
    bt = np.ones((2, 4), dtype=np.float64)
    d = qattn.mma(a, bt, model="h100-wgmma-e4m3")
    assert d.tolist() == [[447.5, 447.5]]
    with pytest.raises(ValueError, match="element 1"):
        qattn.mma(np.array([[1.0, 0.3]]), np.ones((1, 2)), model="h100-wgmma-e4m3")
    with pytest.raises(ValueError, match="uint16"):
        qattn.mma(np.zeros((2, 4), np.uint8), np.zeros((2, 4), np.uint8), model="h100-hmma-f16")
    with pytest.raises(ValueError, match="presets"):
        qattn.mma(a, bt, model="h200-wgmma")
    with pytest.raises(ValueError, match="does not fit"):
        qattn.mma(a, np.ones((2, 3)), model="h100-wgmma-e4m3")


def test_mma_models_lists_the_presets_and_the_bound():
    models = {m["name"]: m for m in qattn.mma_models()}
    measured = {"h100-wgmma-e4m3", "h100-wgmma-e4m3-promote", "h100-mma-e4m3", "h100-hmma-f16", "h100-hmma-bf16",
                "h100-hmma-f16-acc16"}
    from_model = {"b200-tcgen05-f16", "b200-tcgen05-bf16", "b200-tcgen05-f16-acc16", "b200-tcgen05-e4m3",
                  "b200-tcgen05-e5m2", "b200-mxf8-e4m3", "b200-mxf4", "b200-nvf4", "ada-mma-e4m3", "mi300-mfma-f16",
                  "mi300-mfma-bf16", "mi300-mfma-e4m3fnuz"}
    code_only = {"ada-mma-e4m3-acc16"}  # MMA-Sim's model as its code states it: no vectors of it
    assert measured | from_model | code_only | {"per-product-fp22"} == set(models)
    assert models["per-product-fp22"]["validated"] is False
    assert not models["ada-mma-e4m3-acc16"]["validated"] and not models["ada-mma-e4m3-acc16"]["measured"]
    assert models["ada-mma-e4m3-acc16"]["accumulator"] == "f16"
    assert all(models[n]["validated"] and models[n]["measured"] for n in measured)
    assert all(models[n]["validated"] and not models[n]["measured"] for n in from_model)
    assert all("MMA-Sim model, not measured here" in models[n]["provenance"] for n in from_model)
    assert (models["b200-nvf4"]["scale"], models["b200-nvf4"]["scale_block"]) == ("UE4M3", 16)
    assert (models["b200-mxf4"]["scale"], models["b200-mxf4"]["scale_block"]) == ("UE8M0", 32)
    assert models["b200-tcgen05-e4m3"]["scale"] is None


def test_version_is_the_programs():
    import subprocess
    cli = os.environ.get("QATTN_CLI")
    assert isinstance(qattn.__version__, str) and qattn.__version__.count(".") == 2
    if cli:
        out = subprocess.run([cli, "--version"], check=True, capture_output=True, text=True).stdout
        assert out.strip() == "qattn " + qattn.__version__


def run_isolated(code):
    """Runs `code` in a fresh interpreter (a case that once killed the interpreter cannot take the tests with it)."""
    import subprocess
    import sys
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)


def test_products_beyond_the_bound_are_refused_before_anything_is_allocated():
    # K = 0: a holds no data, and the count of D (2^64 outputs) once wrapped to 0 and killed the interpreter.
    r = run_isolated(
        "import numpy as np, qattn\n"
        "a = np.empty((1 << 22, 1 << 21, 0), np.uint8)\n"
        "try:\n"
        "    qattn.mma(a, a)\n"
        "except ValueError as e:\n"
        "    print('refused:', e)\n")
    assert r.returncode == 0, r.stderr
    assert ("refused: a: shape: A (4194304, 2097152, 0) and Bt (4194304, 2097152, 0) give D (4194304, 2097152, "
            "2097152): more than 2^64 bytes of float32 outputs") in r.stdout
    a = np.empty((200000, 0), np.uint8)
    with pytest.raises(ValueError, match=r"give D \(200000, 200000\): 160000000000 bytes of float32 outputs, beyond "
                                         r"the bound of 1073741824 bytes"):
        qattn.mma(a, a)
    with pytest.raises(ValueError, match=r"a: shape: \(4,\) has 1 dimension: A \[\.\.\., M, K\] needs 2 or more"):
        qattn.mma(np.zeros(4, np.uint8), np.zeros((2, 4), np.uint8))
    # a view of one byte with 2^31 elements: its codes (4 GiB) are refused before they are made
    wide = np.broadcast_to(np.uint8(0), (1, 1 << 31))
    with pytest.raises(ValueError, match=r"a: shape: .*: A holds 2147483648 elements, beyond the bound of 1073741824"):
        qattn.mma(wide, wide)


def test_k_zero_gives_c():
    a, bt = np.zeros((2, 3, 0), np.uint8), np.zeros((2, 2, 0), np.uint8)
    c = (np.arange(12, dtype=np.float32) - 5.5).reshape(2, 3, 2)
    assert np.array_equal(qattn.mma(a, bt, c, model="h100-wgmma-e4m3"), c)
    d = qattn.mma(a, bt)
    assert d.shape == (2, 3, 2) and d.dtype == np.float32 and not d.any()


def test_a_k_the_model_cannot_pair_names_a_and_k():
    with pytest.raises(ValueError, match=r"^a: shape: K = 6 \(the last axis\) is not a multiple of 4, which model "
                                         "h100-mma-e4m3 needs"):
        qattn.mma(np.zeros((16, 6), np.uint8), np.zeros((8, 6), np.uint8), model="h100-mma-e4m3")


def test_c_passes_the_checks_of_the_cli():
    a = np.zeros((1, 2, 16), np.uint16)
    ones = np.ones((1, 2, 2), np.float32)
    for bad in (ones.astype(np.float64), ones.astype(np.int32), ones.astype(np.int64)):
        with pytest.raises(TypeError, match="c: dtype: " + str(bad.dtype) + ": expected float32 or float16"):
            qattn.mma(a, a, bad, model="h100-hmma-f16")
    with pytest.raises(TypeError, match="c: dtype: float64"):
        qattn.mma(a, a, 0.5, model="h100-hmma-f16")
    with pytest.raises(ValueError, match=r"c: shape: \(2, 2\): expected \[\.\.\., M, N\] = \(1, 2, 2\)"):
        qattn.mma(a, a, np.ones((2, 2), np.float32), model="h100-hmma-f16")
    # 0.1 is no float16 value: once cast silently, giving 16.1 with A = B = 4
    with pytest.raises(ValueError, match="c: element 0: 0.100000001 is not a float16 value, and h100-hmma-f16-acc16 "
                                         "has an f16 accumulator"):
        qattn.mma(a, a, np.full((1, 2, 2), 0.1, np.float32), model="h100-hmma-f16-acc16")
    four = np.full((1, 2, 1), np.float16(2.0).view(np.uint16), np.uint16)  # 2 * 2 = 4 in one product
    d = qattn.mma(four, four, np.full((1, 2, 2), 0.25, np.float16), model="h100-hmma-f16-acc16")
    assert d.dtype == np.float16 and d.tolist() == [[[4.25, 4.25], [4.25, 4.25]]]
    assert qattn.mma(four, four, np.full((1, 2, 2), 0.1, np.float32), model="h100-hmma-f16")[0, 0, 0] == np.float32(
        np.float32(0.1) + np.float32(4.0))


def test_fp8_encode_takes_scalars_and_refuses_what_is_not_float():
    three = qattn.fp8_encode(np.array([3.0], np.float32))[0]
    for x in (np.float32(3), np.float64(3), np.float16(3), 3.0, np.array(3.0, np.float32)):
        code = qattn.fp8_encode(x)
        assert code.shape == () and code.dtype == np.uint8 and code == three, type(x)
    assert qattn.fp8_encode(np.float32(1e9), "e5m2", saturate=False) == qattn.fp8_encode(np.array([np.inf]), "e5m2",
                                                                                         saturate=False)[0]
    for bad in (np.array([3], np.int64), np.array([True]), np.array([3 + 0j]), np.int64(3), 3, True,
                np.array(["3"]), np.array([3], np.longdouble)):
        with pytest.raises(TypeError, match="x: "):
            qattn.fp8_encode(bad)


MMASIM = os.path.join(os.environ.get("QATTN_SOURCE", "."), "tests", "fixtures", "mmasim", "mmasim_subset.safetensors")


def test_every_mmasim_preset_with_block_scales_reproduces_its_vectors():
    # vectors computed from MMA-Sim's published model (not measured on a GPU: tests/fixtures/mmasim/README.md)
    v = qattn.load(MMASIM)
    sets = sorted({k.rsplit("_", 1)[0] for k in v})
    presets = {s.split(".")[0] for s in sets}
    assert len(presets) == 12
    models = {m["name"]: m for m in qattn.mma_models()}
    for s in sets:
        preset = s.split(".")[0]
        m = models[preset]
        assert not m["measured"] and m["validated"], m
        kwargs = {"scale_a": v[s + "_SA"], "scale_bt": v[s + "_SBt"]} if s + "_SA" in v else {}
        assert (m["scale"] is not None) == bool(kwargs)
        d = qattn.mma(v[s + "_A"], v[s + "_Bt"], v[s + "_C"], model=preset, **kwargs)
        want = v[s + "_D"]
        if d.dtype == np.float16:
            d, want = d.astype(np.float32), want.astype(np.float32)
        assert np.array_equal(d.view(np.uint32), want.view(np.uint32)), s


def test_block_scales_are_checked_naming_the_block():
    v = qattn.load(MMASIM)
    a, bt, sa, sbt = (v["b200-nvf4.random_" + x] for x in ("A", "Bt", "SA", "SBt"))
    with pytest.raises(ValueError, match="block of 16"):
        qattn.mma(a, bt, model="b200-nvf4")
    with pytest.raises(ValueError, match="one scale per block of 16"):
        qattn.mma(a, bt, scale_a=sa[..., :4], scale_bt=sbt, model="b200-nvf4")
    with pytest.raises(TypeError, match="uint8"):
        qattn.mma(a, bt, scale_a=sa.astype(np.int32), scale_bt=sbt, model="b200-nvf4")
    with pytest.raises(ValueError, match="takes no block scales"):
        qattn.mma(v["b200-tcgen05-e4m3.random_A"], v["b200-tcgen05-e4m3.random_Bt"], scale_a=sa, model="b200-tcgen05-e4m3")
    bad = a.copy()
    bad[0, 0, 5] = 0x17
    with pytest.raises(ValueError, match="element 5 .code 23. is not an E2M1 code"):
        qattn.mma(bad, bt, scale_a=sa, scale_bt=sbt, model="b200-nvf4")
    # MXFP4 with NVFP4's scales: 8 blocks per row where MX takes 4 (blocks of 32)
    with pytest.raises(ValueError, match="block of 32"):
        qattn.mma(a, bt, scale_a=sa, scale_bt=sbt, model="b200-mxf4")
