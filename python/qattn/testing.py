"""Property-test your own softmax kernel (NumPy or PyTorch) against qattn, with Hypothesis.

The Python side of ``qattn/testing.h`` (docs/testing-your-kernel.md): strategies for the rows that break kernels,
and checkers against any registered method, bit for bit, or against the fp64 / exact softmax within a declared bound.

    from hypothesis import given
    import qattn.testing as qt

    @given(qt.saturating_integer_rows())
    def test_mine_is_index_paper(row):
        qt.assert_bit_exact(my_index_softmax, "index@paper", row)

A failure raises ``AssertionError`` naming the spec, the row's family, the first differing index, both values there
and both outputs around it; Hypothesis shrinks the row first and prints it.
"""
import math
from typing import Callable, NamedTuple, Optional

import numpy as np
from hypothesis import strategies as st

from . import attention, exact_softmax, softmax, softmax_integer

__all__ = ["LogitRow", "IntegerRow", "AttentionInput", "attention_inputs", "Bound", "fp64_contract", "lengths_around_widths", "gaussian_rows",
           "heavy_tailed_rows", "skyscraper_rows", "tied_rows", "masked_rows", "huge_rows", "any_rows",
           "saturating_integer_rows", "integer_row_lengths", "assert_bit_exact", "assert_within_contract"]


class LogitRow(NamedTuple):
    """A row of float64 logits (``-inf`` = masked) and the name of the family that made it."""
    family: str
    logits: np.ndarray


class IntegerRow(NamedTuple):
    """A row of int32 logits, the clip ``c_int`` the kernel is given, and the family's name."""
    family: str
    logits: np.ndarray
    c_int: int


class AttentionInput(NamedTuple):
    """One attention call: q [L, d], k [L, d], v [L, d] (float64), the logit scale, causal or not."""
    family: str
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    scale: float
    causal: bool


# ---- strategies ------------------------------------------------------------------------------------------------

def lengths_around_widths():
    """Lengths 1-3 and k w - 1, k w, k w + 1 for w = 4, 8, 16, 32, 64 and k = 1..4: SIMD loop tails and lane masks."""
    lengths = {1, 2, 3}
    for w in (4, 8, 16, 32, 64):
        for k in range(1, 5):
            lengths.update((k * w - 1, k * w, k * w + 1))
    return st.sampled_from(sorted(lengths))


def _normal_quantile(u):
    """Standard normal quantile of (u + 1/2) / 1001 for integers u in 0..1000 (Newton on erfc, as testing.h does)."""
    p = (u + 0.5) / 1001.0
    x = math.sqrt(2.0) * (-1 if p < 0.5 else 1) * math.sqrt(-math.log(2 * p if p < 0.5 else 2 * (1 - p)))
    for _ in range(40):
        f = 0.5 * math.erfc(-x / math.sqrt(2.0)) - p
        x -= f / (math.exp(-0.5 * x * x) / math.sqrt(2 * math.pi))
    return x


_QUANTILE = np.array([_normal_quantile(u) for u in range(1001)])


def _row(length, f):
    """``length`` values f(u), u in 0..1000; Hypothesis shrinks u toward 0 and the row toward f(0)."""
    return st.lists(st.integers(0, 1000), min_size=length, max_size=length).map(
        lambda u: np.array([f(v) for v in u], dtype=np.float64))


def _sized(length):
    return lengths_around_widths() if length is None else (st.just(length) if isinstance(length, int) else length)


def gaussian_rows(length=None):
    """Mean in [-50, 50], std log-uniform in [0.5, 12] (USE-Lite's logit rows: std 0.9-5.3). The ordinary case."""
    @st.composite
    def make(draw):
        n = draw(_sized(length))
        mu = draw(st.integers(-500, 500)) / 10.0
        sigma = 0.5 * 24.0 ** (draw(st.integers(0, 100)) / 100.0)
        return LogitRow("gaussian", draw(_row(n, lambda u: mu + sigma * _QUANTILE[u])))
    return make()


def heavy_tailed_rows(length=None):
    """Student-t with 1-3 degrees of freedom, scale 1-8: far entries both ways, clipping and saturation paths."""
    @st.composite
    def make(draw):
        n = draw(_sized(length))
        nu, scale = draw(st.integers(1, 3)), draw(st.integers(1, 8))

        def t(u):
            p = (u + 0.5) / 1001.0
            if nu == 1:
                return scale * math.tan(math.pi * (p - 0.5))
            if nu == 2:
                return scale * (2 * p - 1) / math.sqrt(2 * p * (1 - p))
            z = _QUANTILE[u]
            return scale * (z + (z ** 3 + z) / 12.0 + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / 288.0)
        return LogitRow(f"heavy-tailed (t, nu {nu})", draw(_row(n, t)))
    return make()


def skyscraper_rows(length=None):
    """Std-1 entries and one logit 20 to 10^4 above them: the other exps underflow or clip, P is one-hot."""
    @st.composite
    def make(draw):
        n = draw(_sized(length))
        x = draw(_row(n, lambda u: _QUANTILE[u]))
        x[draw(st.integers(0, n - 1))] += 20.0 * 500.0 ** (draw(st.integers(0, 100)) / 100.0)
        return LogitRow("skyscraper", x)
    return make()


def tied_rows(length=None):
    """1 to 4 distinct values 0.25 apart: ties at the maximum, equal entries that must get equal P."""
    @st.composite
    def make(draw):
        n, k = draw(_sized(length)), draw(st.integers(1, 4))
        return LogitRow(f"ties ({k} values)", draw(_row(n, lambda u: 0.25 * (u % k))))
    return make()


def masked_rows(length=None):
    """Gaussian rows with -inf entries; one in ten fully masked: masks in max and sum, no 0/0."""
    @st.composite
    def make(draw):
        r = draw(gaussian_rows(length))
        full = draw(st.integers(0, 9)) == 0
        keep = draw(st.integers(1, 3))
        pick = np.array(draw(st.lists(st.integers(0, 3), min_size=len(r.logits), max_size=len(r.logits))))
        x = r.logits.copy()
        x[(pick >= keep) | full] = -np.inf
        return LogitRow("fully masked" if full else "masked", x)
    return make()


def huge_rows():
    """Gaussian rows of 4,096 to 65,536 entries: accumulators that overflow, tiling over L. Ask for them on their own."""
    return st.integers(0, 4).flatmap(lambda e: gaussian_rows(4096 << e)).map(lambda r: LogitRow("huge L", r.logits))


def any_rows():
    """Any float family but huge rows."""
    return st.one_of(gaussian_rows(), heavy_tailed_rows(), skyscraper_rows(), tied_rows(), masked_rows())


# Lengths past the 257 entries at which a uint16 row sum of 255s wraps (IntAttention's NEON kernel, UPSTREAM.md), and
# the powers of two around them.
_LONG_INTEGER_LENGTHS = [258, 259, 260, 300, 511, 512, 513, 1024, 1025, 4096]


def integer_row_lengths():
    """Half from ``lengths_around_widths()``, half past 257 (258 to 4,096): SIMD tails, and narrow row sums that wrap."""
    return st.one_of(lengths_around_widths(), st.sampled_from(_LONG_INTEGER_LENGTHS))


def saturating_integer_rows(length=None):
    """INT32 rows, c_int log-uniform in [1, 2^20], entries 0 to 4 c_int below the top (every 7th at exactly c_int);
    the top value always present and, with two entries or more, one beyond the clip. One row in four is *near-top*:
    every entry within c_int / 32 of the top, so each maps to the table's first entry (255) and the row sum is as large
    as the length allows. Lengths from ``integer_row_lengths()``: half of them past 257, where a uint16 sum of 255s
    wraps. The clip, index rounding at step boundaries, the table's ends, integer normalisation, narrow accumulators.
    Rows up to 257 entries shrink entry by entry; longer ones take their entries from a drawn seed (they shrink in
    length, c_int and top only), which keeps Hypothesis's example size small."""
    @st.composite
    def make(draw):
        n = draw(integer_row_lengths() if length is None else _sized(length))
        c_int = int(round(2.0 ** (draw(st.integers(0, 200)) / 10.0)))
        top = draw(st.integers(-1000000, 1000000))
        near_top = draw(st.integers(0, 3)) == 0
        if n <= 257:
            u = np.array(draw(st.lists(st.integers(0, 1000), min_size=n, max_size=n)), dtype=np.int64)
        else:
            u = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1))).integers(0, 1001, n)
        if near_top:
            below = (c_int // 32) * u // 1000
        else:
            below = np.where(u % 7 == 3, c_int, (4 * c_int * u) // 1000)
        a = np.clip(top - below, -2 ** 31, 2 ** 31 - 1)
        at = draw(st.integers(0, n - 1))
        a[at] = top
        if n >= 2:
            a[(at + 1) % n] = top - c_int - 1
        return IntegerRow("near-top integer" if near_top else "saturating integer", a.astype(np.int32), c_int)
    return make()


def attention_inputs(length=None):
    """Heads like real ones: L from lengths_around_widths(), d in {16, 32, 64, 128}, Q and V ~ N(0, 1), K with a
    per-channel offset of std 0 to 4 shared by all keys, scale 1/sqrt(d), causal one time in three. INT8 scales,
    channel outliers, integer dot products and their clip. The values come from a drawn seed (they do not shrink)."""
    @st.composite
    def make(draw):
        n = draw(_sized(length))
        d = draw(st.sampled_from([16, 32, 64, 128]))
        offset = draw(st.integers(0, 40)) / 10.0
        g = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
        q, k, v = (g.standard_normal((n, d)) for _ in range(3))
        k = k + offset * g.standard_normal((1, d))
        return AttentionInput(f"gaussian heads, K channel offset {offset}", q, k, v, 1 / math.sqrt(d),
                              draw(st.integers(0, 2)) == 0)
    return make()


# ---- checkers ---------------------------------------------------------------------------------------------------

class Bound(NamedTuple):
    """|kernel_j - p_j| <= element (and <= element_of(p_j, L) when given, L = valid entries); row L1 <= row_l1."""
    element: float = math.inf
    row_l1: float = math.inf
    element_of: Optional[Callable[[float, int], float]] = None


def _pairwise_depth(n):
    if n <= 1:
        return 0
    if n <= 8:
        return n - 1
    return 1 + _pairwise_depth((n + 1) // 2)


def fp64_contract():
    """The declared bound of qattn's double softmax against the exact one (docs/softmax-reference.md section 4):
    u (ln(1/p) + ln L + h(L) + 6) p + 4 denorm_min."""
    u, tau = 2.0 ** -53, 4 * 5e-324

    def f(p, n):
        return u * (math.log(1 / p) + math.log(n) + _pairwise_depth(n) + 6) * p + tau if p > 0 else tau
    return Bound(element_of=f)


def _numpy(x):
    if hasattr(x, "detach"):  # a torch tensor
        x = x.detach().cpu().numpy()
    return np.asarray(x)


def _window(a, i):
    lo, hi = max(0, i - 8), min(len(a), i + 9)
    body = ", ".join(repr(v.item() if hasattr(v, "item") else v) for v in a[lo:hi])
    return ("[... " if lo else "[") + body + (" ...]" if hi < len(a) else "]")


def _fail(what, family, n, i, got, want, detail=""):
    raise AssertionError(f"{what} ({family} row of {n}){detail}: first difference at index {i}: kernel "
                         f"{got[i]!r}, reference {want[i]!r}\n  kernel:    {_window(got, i)}\n"
                         f"  reference: {_window(want, i)}")


def assert_bit_exact(fn, method, row):
    """``fn`` against ``method`` bit for bit on one row.

    For an ``AttentionInput``, ``fn(q, k, v, scale, causal) -> O`` is compared with ``qattn.attention``. For a
    ``LogitRow``, ``fn(logits) -> probabilities`` (float64 array) is compared with ``qattn.softmax(logits,
    method)``; for an ``IntegerRow``, ``fn(logits, c_int) -> raw integer P`` with ``qattn.softmax_integer(logits,
    method, cint=c_int)``. ``fn`` may take and return NumPy arrays or torch tensors.
    """
    if isinstance(row, AttentionInput):
        got = _numpy(fn(row.q, row.k, row.v, row.scale, row.causal)).astype(np.float64, copy=False).ravel()
        want = attention(row.q, row.k, row.v, method, scale=row.scale, causal=row.causal).ravel()
        detail = f", O of {row.q.shape[0]} x {row.v.shape[1]} (flat index)"
        same = (got.view(np.uint64) == want.view(np.uint64)) | (np.isnan(got) & np.isnan(want)) \
            if got.shape == want.shape else None
    elif isinstance(row, IntegerRow):
        got = _numpy(fn(row.logits, row.c_int)).astype(np.int64)
        _, raw, _ = softmax_integer(row.logits, method, cint=row.c_int)
        want = raw.astype(np.int64)
        detail = f", c_int {row.c_int}"
        same = got == want if got.shape == want.shape else None
    else:
        got = _numpy(fn(row.logits)).astype(np.float64, copy=False)
        want = softmax(row.logits, method)
        detail = ""
        same = (got.view(np.uint64) == want.view(np.uint64)) | (np.isnan(got) & np.isnan(want)) \
            if got.shape == want.shape else None
    if same is None:
        raise AssertionError(f"kernel returned shape {got.shape} for a row of {want.shape}")
    if not same.all():
        _fail(f"kernel != {method}", row.family, len(want), int(np.argmin(same)), got, want, detail)


def assert_within_contract(fn, reference, bound, row):
    """``fn(logits) -> probabilities`` against the ``"fp64"`` or ``"exact"`` (50-digit, rounded once) softmax,
    within ``bound`` (a ``Bound``); masked entries must be exactly 0."""
    if reference not in ("fp64", "exact"):
        raise ValueError(f'reference: "fp64" or "exact", got {reference!r}')
    got = _numpy(fn(row.logits)).astype(np.float64, copy=False)
    want = exact_softmax(row.logits) if reference == "exact" else softmax(row.logits, "fp64")
    if got.shape != want.shape:
        raise AssertionError(f"kernel returned shape {got.shape} for a row of {want.shape}")
    masked = row.logits == -np.inf
    valid = int((~masked).sum())
    err = np.abs(got - want)
    limit = np.full(len(want), bound.element)
    if bound.element_of is not None:
        limit = np.minimum(limit, [bound.element_of(float(p), valid) for p in want])
    bad = (masked & (got != 0)) | ~(err <= limit)
    if bad.any():
        i = int(np.argmax(bad))
        detail = ", masked entry not 0" if masked[i] else f", |error| {err[i]:.6g} > bound {limit[i]:.6g}"
        _fail(f"kernel outside its contract against {reference}", row.family, len(want), i, got, want, detail)
    if not err.sum() <= bound.row_l1:
        raise AssertionError(f"kernel outside its contract against {reference} ({row.family} row of {len(want)}): "
                             f"row L1 error {err.sum():.6g} > bound {bound.row_l1:.6g}")
