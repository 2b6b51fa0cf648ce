"""'My' IndexSoftmax row kernel in NumPy, as own_index_softmax.h writes it in C++: IntAttention's paper rules (every
rounding a floor, docs/methods/index-softmax.md section 1) for b = 5, c = 6.6, with the same deliberate bug behind a
flag, and a float softmax with its own. python/tests/test_testing.py checks them with qattn.testing."""
import numpy as np

T1 = 31   # 2^b - 1 table steps, b = 5
C = 6.6   # clip in logit units

LUT = np.floor(255.0 * np.exp(-C * np.arange(T1 + 1) / T1)).astype(np.int64)  # Eq. 13
LUT[0], LUT[T1] = 255, 0


def index_softmax(a, c_int, round_index=False, uint16_sum=False):
    """UINT8 P (x255) of INT32 logits ``a`` with clip ``c_int``. Two bugs behind flags: ``round_index`` (Eq. 11
    rounded half up) and ``uint16_sum`` (the row sum kept in a uint16, as IntAttention's NEON kernel keeps it: it wraps
    once the row sums past 65535, from about 258 entries)."""
    a = np.asarray(a, dtype=np.int64)
    d = np.minimum(a.max() - a, c_int)                                  # Eq. 8 clip
    idx = (2 * d * T1 + c_int) // (2 * c_int) if round_index else d * T1 // c_int   # Eq. 11 floor
    e = LUT[idx]
    s = e.sum() % 65536 if uint16_sum else e.sum()
    if s == 0:  # the wrapped sum can be 0; the kernel would divide by it
        return np.full_like(e, 255)
    return np.minimum((255 * e) // s, 255)                              # Eq. 15 floor (a wrapped s: clipped to a byte)


def softmax(x, skip_max=False):
    """Float softmax with a sequential sum; ``skip_max``: the bug (no max subtraction, exp overflows)."""
    x = np.asarray(x, dtype=np.float64)
    if not np.isfinite(x).any():
        return np.zeros_like(x)
    e = np.exp(x - (0.0 if skip_max else x.max()))
    s = 0.0
    for v in e:  # sequential, as the contract below assumes
        s += v
    return e / s
