"""qattn.lowp_encode / lowp_decode and the MX and NVFP4 block quantisers (docs/lowp-float.md "Conversions"),
against models written here in NumPy: every code of every format round-trips, and the quantisers' scales and codes
follow their stated rules on random blocks."""
import numpy as np
import pytest

import qattn

ELEMENTS = {"e4m3fn": 256, "e5m2": 256, "e4m3fnuz": 256, "e5m2fnuz": 256, "e2m1": 16}


def test_every_code_round_trips():
    for fmt, n in ELEMENTS.items():
        codes = np.arange(n, dtype=np.uint8)
        values = qattn.lowp_decode(codes, fmt)
        assert values.dtype == np.float32 and values.shape == (n,)
        finite = np.isfinite(values)
        back = qattn.lowp_encode(values[finite], fmt, saturate=True)
        if fmt.endswith("fnuz"):  # one zero, one NaN (0x80)
            assert np.isnan(values[0x80]) and np.count_nonzero(~finite) == 1
        assert np.array_equal(back, codes[finite]), fmt
    scales = qattn.lowp_decode(np.arange(256, dtype=np.uint8), "ue8m0")
    assert scales[127] == 1.0 and scales[0] == np.float32(2.0**-127) and np.isnan(scales[255])
    assert np.array_equal(qattn.lowp_encode(scales[:255], "ue8m0", rounding="rz"), np.arange(255, dtype=np.uint8))


def test_the_rules_at_the_edges():
    assert qattn.lowp_encode(np.float32(np.nan), "e2m1") == 0x7  # PTX: NaN -> +6
    assert qattn.lowp_encode(np.float32(-0.1), "e2m1") == 0x8    # -0 keeps its sign
    assert qattn.lowp_encode(np.float32(3.0), "ue8m0", rounding="rp") == 129
    assert qattn.lowp_encode(np.float32(3.0), "ue8m0", rounding="rz") == 128
    assert qattn.lowp_encode(np.float32(np.inf), "ue8m0", rounding="rz", saturate=False) == 0xFF
    assert qattn.lowp_encode(np.float32(248.0), "e4m3fnuz", saturate=False) == 0x80
    x = np.random.default_rng(3).standard_normal(4096).astype(np.float32) * 300
    assert np.array_equal(qattn.lowp_encode(x, "e4m3fn"), qattn.fp8_encode(x, "e4m3fn"))
    assert np.array_equal(qattn.lowp_encode(x, "e5m2", saturate=False), qattn.fp8_encode(x, "e5m2", saturate=False))
    with pytest.raises(ValueError, match="rz or rp"):
        qattn.lowp_encode(x, "ue8m0")
    with pytest.raises(ValueError, match="saturate only"):
        qattn.lowp_encode(x, "e2m1", saturate=False)
    with pytest.raises(ValueError, match="not one of e4m3fn"):
        qattn.lowp_encode(x, "fp4")
    with pytest.raises(ValueError, match="element 1: code 16 is not an E2M1 code"):
        qattn.lowp_decode(np.array([1, 16], np.uint8), "e2m1")
    with pytest.raises(TypeError, match="uint8"):
        qattn.lowp_decode(np.array([1, 2], np.int32), "e2m1")


def e2m1_round(v):
    """NumPy model: round to nearest even onto E2M1's grid, saturated at 6."""
    grid = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6])
    a = np.minimum(np.abs(v), 6.0)
    i = np.searchsorted(grid, a, side="right") - 1
    lo = grid[i]
    hi = grid[np.minimum(i + 1, 7)]
    up = (hi - a < a - lo) | ((hi - a == a - lo) & ((np.minimum(i + 1, 7) % 2) == 0))
    return np.copysign(np.where(up, hi, lo), v)


def test_mx_quantize_follows_the_ocp_rule():
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((3, 5, 64)) * np.exp(rng.uniform(-8, 8, (3, 5, 1)))).astype(np.float32)
    x[0, 0, :32] = 0
    codes, scales = qattn.mx_quantize(x, "e2m1", 32)
    assert codes.shape == x.shape and scales.shape == (3, 5, 2)
    blocks = x.reshape(3, 5, 2, 32).astype(np.float64)
    amax = np.abs(blocks).max(axis=-1)
    want = np.where(amax == 0, -127, np.clip(np.floor(np.log2(np.where(amax == 0, 1, amax))) - 2, -127, 127))
    assert np.array_equal(scales.astype(np.int64) - 127, want.astype(np.int64))
    values = qattn.lowp_decode(codes, "e2m1").reshape(3, 5, 2, 32)
    expect = e2m1_round(blocks / 2.0 ** want[..., None])
    assert np.array_equal(values, expect)
    with pytest.raises(ValueError, match="whole blocks of 32"):
        qattn.mx_quantize(x[..., :48], "e2m1", 32)
    with pytest.raises(ValueError, match="not an MX element format"):
        qattn.mx_quantize(x, "e4m3fnuz", 32)


def test_nvfp4_quantize_is_transformer_engines_recipe():
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((4, 128)) * np.exp(rng.uniform(-3, 3, (4, 1)))).astype(np.float32)
    codes, scales, g = qattn.nvfp4_quantize(x)
    assert codes.shape == x.shape and scales.shape == (4, 8)
    f = np.float32
    amax = np.abs(x).max()
    enc = f(2688.0) / f(amax)
    assert g == f(1.0) / enc
    amax_b = np.abs(x.reshape(4, 8, 16)).max(axis=-1).astype(np.float32)
    s = amax_b * (enc * (f(1.0) / f(6.0)))
    assert np.array_equal(scales, qattn.lowp_encode(s, "ue4m3"))
    sb = qattn.lowp_decode(scales, "ue4m3")
    coeff = f(1.0) / (sb * f(g))
    assert np.array_equal(codes.reshape(4, 8, 16), qattn.lowp_encode(x.reshape(4, 8, 16) * coeff[..., None], "e2m1"))
    bad = x.copy()
    bad[1, 3] = np.inf
    with pytest.raises(ValueError, match="element 131 is infinite"):
        qattn.nvfp4_quantize(bad)
