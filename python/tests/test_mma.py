"""qattn.mma against what an H100 returned (tests/fixtures/h100-mma), and its input rules."""
import os

import numpy as np
import pytest

import qattn

FIXTURES = os.path.join(os.environ.get("QATTN_SOURCE", "."), "tests", "fixtures", "h100-mma")


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
    assert {"h100-wgmma-e4m3", "h100-wgmma-e4m3-promote", "h100-mma-e4m3", "h100-hmma-f16", "h100-hmma-bf16",
            "h100-hmma-f16-acc16", "per-product-fp22"} == set(models)
    assert models["per-product-fp22"]["validated"] is False
    assert models["h100-wgmma-e4m3"]["validated"] is True


def test_version_is_the_programs():
    import subprocess
    cli = os.environ.get("QATTN_CLI")
    assert isinstance(qattn.__version__, str) and qattn.__version__.count(".") == 2
    if cli:
        out = subprocess.run([cli, "--version"], check=True, capture_output=True, text=True).stdout
        assert out.strip() == "qattn " + qattn.__version__
