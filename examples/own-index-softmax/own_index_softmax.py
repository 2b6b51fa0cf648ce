"""'My' IndexSoftmax row kernel in NumPy, as own_index_softmax.h writes it in C++: IntAttention's paper rules (every
rounding a floor, docs/methods/index-softmax.md section 1) for b = 5, c = 6.6, with the same deliberate bug behind a
flag, and a float softmax with its own. python/tests/test_testing.py checks them with qattn.testing."""
import numpy as np

T1 = 31   # 2^b - 1 table steps, b = 5
C = 6.6   # clip in logit units

LUT = np.floor(255.0 * np.exp(-C * np.arange(T1 + 1) / T1)).astype(np.int64)  # Eq. 13
LUT[0], LUT[T1] = 255, 0


def index_softmax(a, c_int, round_index=False):
    """UINT8 P (x255) of INT32 logits ``a`` with clip ``c_int``; ``round_index``: the bug (Eq. 11 rounded half up)."""
    a = np.asarray(a, dtype=np.int64)
    d = np.minimum(a.max() - a, c_int)                                  # Eq. 8 clip
    idx = (2 * d * T1 + c_int) // (2 * c_int) if round_index else d * T1 // c_int   # Eq. 11 floor
    e = LUT[idx]
    return (255 * e) // e.sum()                                         # Eq. 15 floor


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
