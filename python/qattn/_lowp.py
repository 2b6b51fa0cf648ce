"""Low-precision codes and matrix units: FP8/FP6/FP4 encoding and decoding, MX and NVFP4 block quantisation, and the
MMA models (qattn.fp8_encode ... qattn.mma_models, exported by qattn/__init__.py, which documents the package)."""

import qattn._qattn as _qattn  # the native extension; mypy types it as Any (it ships no type information)
from ._calls import _native, _widen16


def fp8_encode(x, format="e4m3fn", saturate=True):
    """FP8 codes (uint8, the shape of ``x``) of float32 values as an NVIDIA H100 converts them.

    Both round to nearest, ties to even. ``saturate=True`` is PTX ``cvt.rn.satfinite`` (beyond the largest finite
    value, infinities included: +-max; NaN: 0x7F); ``saturate=False`` is torch's ``x.to(torch.float8_e4m3fn)`` /
    ``.to(torch.float8_e5m2)`` (E4M3FN overflows to NaN past 464, E5M2 to inf; NaN keeps its sign). Bit-exact to the
    H100's codes (docs/lowp-float.md). float64 input is rounded to float32 first; float16 widens exactly.

    x : a float array of any shape (0-d included), a NumPy float scalar or a Python float (a scalar gives a 0-d
        array). Integer, bool, complex and object input raises TypeError: it is not converted.
    format : {"e4m3fn", "e5m2"}
    """
    return _native("fp8_encode", _qattn.fp8_encode, x, format, saturate)


def lowp_encode(x, fmt, rounding="rn", saturate=True):
    """Codes (uint8, the shape of ``x``) of float32 values in a low-precision format, as the conversion instructions
    write them (docs/lowp-float.md "Conversions"; float64 input is rounded to float32 first, float16 widens exactly).

    fmt : "e4m3fn", "e5m2", "e4m3fnuz", "e5m2fnuz", "e2m1" (one code per byte, 0 to 15), "ue8m0" or "ue4m3" (block
        scales).
    rounding : "rn" (to nearest, ties to even) or "rz" for the element formats; "rz" or "rp" for ue8m0 (PTX
        ``cvt.{rz,rp}.satfinite.ue8m0x2.f32``: from |x|'s float32 exponent); "rn" for ue4m3 (the e4m3 conversion of
        |x|, the sign bit clear). Another raises ValueError naming the roundings the format takes.
    saturate : a finite value beyond the largest, and +-inf, become +-max (PTX ``.satfinite``); without it they
        overflow as the format does (e5m2: inf; e4m3fn: NaN keeping the sign, as torch; FNUZ: 0x80; ue8m0: 0xFF).
        e2m1 has neither NaN nor inf and takes only saturate (NaN -> +6, as PTX ``cvt.rn.satfinite.e2m1x2.f32``).
        ``lowp_encode(x, "e4m3fn")`` is ``fp8_encode(x, "e4m3fn")``: the H100's conversion.
    """
    return _native("lowp_encode", _qattn.lowp_encode, x, fmt, rounding, saturate)


def lowp_decode(codes, fmt):
    """The float32 values (the shape of ``codes``) of uint8 codes of ``fmt`` (as ``lowp_encode``); NaN codes give
    NaN, ue4m3 ignores the sign bit, an e2m1 code above 15 raises ValueError naming the element."""
    return _native("lowp_decode", _qattn.lowp_decode, codes, fmt)


def mx_quantize(x, fmt="e2m1", block=32):
    """OCP MX v1.0 block quantisation over the last axis: ``(codes, scales)``, uint8 codes of ``fmt`` ("e2m1",
    "e4m3fn" or "e5m2") of ``x``'s shape and UE8M0 scale codes [..., K/block].

    Per block the shared scale is 2^X, X = floor(log2 amax) - emax_elem (2 for E2M1, 8 for E4M3, 15 for E5M2),
    clamped to [-127, 127] (an all-zero block: code 0); each element x / 2^X (exact) is rounded to nearest even and
    saturated to the format's largest value. ``lowp_decode(codes, fmt) * lowp_decode(scales, "ue8m0")`` (each scale
    repeated over its block) gives the values back. K must be whole blocks and every x finite (ValueError otherwise).
    """
    return _native("mx_quantize", _qattn.mx_quantize, x, fmt, block)


def nvfp4_quantize(x):
    """NVFP4 over the last axis, Transformer Engine's recipe in float32: ``(codes, scales, global_scale)``.

    S_enc = 2688 / amax (448 x 6, 1 for an all-zero x), ``global_scale`` = 1 / S_enc; per block of 16 the UE4M3 scale
    s_b = e4m3(amax_b x (S_enc x (1/6))) (rounded to nearest even, saturated); each element
    e2m1(x x min(1 / (s_b x global_scale), FLT_MAX)); every operation a float32 one rounded to nearest even. A value
    decodes as ``lowp_decode(code, "e2m1") * lowp_decode(s_b, "ue4m3") * global_scale``. K must be whole blocks of 16
    and every x finite (ValueError otherwise).
    """
    return _native("nvfp4_quantize", _qattn.nvfp4_quantize, x)


def mma(a, bt, c=None, scale_a=None, scale_bt=None, model="h100-wgmma-e4m3"):
    """D = A·B + C as a matrix unit computes it, bit for bit (docs/mma.md).

    a : array [..., M, K]; bt : array [..., N, K] (row n is column n of B). Either uint8 codes (FP8; E2M1 one code
        per byte in the low nibble, 0 to 15), uint16 bit patterns of 16-bit inputs, or floats whose every value is
        exact in the model's input format (round first: ``fp8_encode`` for FP8; anything else raises ValueError
        naming the element).
    scale_a, scale_bt : uint8 arrays [..., M, K/block] and [..., N, K/block] of block scale codes (UE8M0 or UE4M3),
        required by the block-scaled models (``b200-mxf8-e4m3``, ``b200-mxf4`` with blocks of 32, ``b200-nvf4``
        with blocks of 16) and refused by the others; a missing, extra or mis-shaped one raises ValueError naming
        the block size (another dtype: TypeError).
    c : float32 or float16 array [..., M, N], or None (zero). For ``h100-hmma-f16-acc16`` every finite value must be
        a float16 value. The checks are those of ``qattn mma --c``: another dtype raises TypeError, another shape or
        a value the accumulator cannot hold ValueError; nothing is cast.
    model : a preset of ``mma_models()``: measured on an H100, ``h100-wgmma-e4m3`` (FP8 wgmma, fast accumulation),
        ``h100-wgmma-e4m3-promote`` (cuBLASLt's default mode), ``h100-mma-e4m3`` (FP8 mma.sync on sm_90),
        ``h100-hmma-f16``, ``h100-hmma-bf16``, ``h100-hmma-f16-acc16``; from MMA-Sim's published model (not
        measured here), the ``b200-*``, ``ada-mma-e4m3`` and ``mi300-mfma-*`` presets; or the bound
        ``per-product-fp22``.

    Returns float32 [..., M, N], or float16 for the f16 accumulator. K = 0 gives D = C (docs/mma.md "K = 0"). D is
    at most 1 GiB as float32 (2^28 outputs): a larger product raises ValueError naming both shapes and the size,
    before anything is allocated.
    """
    return _native("mma", _qattn.mma, a, bt, c, model, scale_a, scale_bt)


def mma_models():
    """The MMA presets: a list of dicts with ``name``, ``parameters``, ``provenance``, ``validated`` (True when the
    preset reproduces a set of vectors), ``measured`` (True when those vectors were measured on the GPU it names;
    False for the presets validated by MMA-Sim's published model), ``accumulator`` ("f32" or "f16"), ``scale``
    ("UE8M0", "UE4M3" or None) and ``scale_block``."""
    return _qattn.mma_models()
