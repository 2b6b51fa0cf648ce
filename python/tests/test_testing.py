"""qattn.testing: the strategies make the rows they document; the checkers pass qattn's own methods, pass the worked
example (examples/own-index-softmax/own_index_softmax.py) and catch its two deliberate bugs with a message naming the
spec and the first differing index."""
import importlib.util
import math
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import qattn
import qattn.testing as qt

SOURCE = os.environ.get("QATTN_SOURCE", ".")
spec = importlib.util.spec_from_file_location(
    "own_index_softmax", os.path.join(SOURCE, "examples", "own-index-softmax", "own_index_softmax.py"))
mine = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mine)

FIXED = settings(max_examples=150, derandomize=True, database=None, deadline=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def my_contract():
    """The example's declared contract: the derivation of docs/softmax-reference.md with a sequential sum."""
    u, tau = 2.0 ** -53, 4 * 5e-324
    return qt.Bound(element_of=lambda p, n: u * (math.log(1 / p) + n + 6) * p + tau if p > 0 else tau)


@FIXED
@given(qt.saturating_integer_rows())
def test_the_example_kernel_is_bit_exact_to_index_paper(row):
    qt.assert_bit_exact(mine.index_softmax, "index@paper", row)


@FIXED
@given(qt.any_rows())
def test_the_example_float_kernel_keeps_its_contract(row):
    qt.assert_within_contract(mine.softmax, "exact", my_contract(), row)


def test_the_deliberate_bugs_are_caught():
    @FIXED
    @given(qt.saturating_integer_rows())
    def rounded_index(row):
        qt.assert_bit_exact(lambda a, c: mine.index_softmax(a, c, round_index=True), "index@paper", row)

    with pytest.raises(AssertionError, match=r"kernel != index@paper \((near-top|saturating) integer row of \d+\), "
                                             r"c_int \d+: first difference at index \d+"):
        rounded_index()

    # The uint16 row sum of IntAttention's NEON kernel (UPSTREAM.md): the default generator reaches the lengths and
    # values where it wraps, with no length given.
    @FIXED
    @given(qt.saturating_integer_rows())
    def narrow_sum(row):
        qt.assert_bit_exact(lambda a, c: mine.index_softmax(a, c, uint16_sum=True), "index@paper", row)

    with pytest.raises(AssertionError, match=r"kernel != index@paper \(near-top integer row of (259|26\d|[3-9]\d\d|\d{4})\)"):
        narrow_sum()

    @FIXED
    @given(qt.any_rows())
    def no_max(row):
        qt.assert_within_contract(lambda x: mine.softmax(x, skip_max=True), "exact", my_contract(), row)

    with np.errstate(all="ignore"), pytest.raises(AssertionError, match="outside its contract against exact"):
        no_max()


@FIXED
@given(qt.any_rows())
def test_qattn_methods_pass_their_own_checks(row):
    for method in ("fp32", "index@upstream-neon", "sas"):
        qt.assert_bit_exact(lambda x: qattn.softmax(x, method), method, row)
    qt.assert_within_contract(lambda x: qattn.softmax(x, "fp64"), "exact", qt.fp64_contract(), row)


def test_a_mutated_method_is_caught_and_torch_functions_work():
    row = qt.LogitRow("gaussian", np.array([0.1, 2.0, -1.0, 0.7]))
    with pytest.raises(AssertionError, match="kernel != fp64 .* first difference at index"):
        qt.assert_bit_exact(lambda x: qattn.softmax(x, "fp32"), "fp64", row)
    with pytest.raises(AssertionError, match="outside its contract"):
        qt.assert_within_contract(lambda x: qattn.softmax(x, "bf16"), "exact", qt.fp64_contract(), row)
    with pytest.raises(ValueError, match="reference"):
        qt.assert_within_contract(lambda x: x, "fp16", qt.Bound(), row)
    torch = pytest.importorskip("torch")
    qt.assert_within_contract(lambda x: torch.softmax(torch.from_numpy(x), 0), "exact", qt.Bound(element=1e-15), row)


WIDTHS = {1, 2, 3} | {k * w + e for w in (4, 8, 16, 32, 64) for k in range(1, 5) for e in (-1, 0, 1)}


@FIXED
@given(qt.masked_rows(), qt.saturating_integer_rows(256), qt.tied_rows(), qt.skyscraper_rows(),
       qt.lengths_around_widths())
def test_the_strategies_make_what_they_document(masked, integer, tied, sky, n):
    assert all(np.isfinite(v) or v == -np.inf for v in masked.logits)
    if masked.family == "fully masked":
        assert (masked.logits == -np.inf).all()
    d = integer.logits.max().astype(np.int64) - integer.logits.astype(np.int64)
    assert (d >= integer.c_int).any() and (d < integer.c_int).any()
    assert len(np.unique(tied.logits)) <= 4
    s = np.sort(sky.logits)
    assert len(s) == 1 or s[-1] - s[-2] >= 20 - 2 * 3.3
    assert n in WIDTHS and len(sky.logits) in WIDTHS


@FIXED
@given(qt.attention_inputs(st.sampled_from([7, 16, 33])))  # L = 1: every method gives O = V
def test_attention_kernels_are_checked_against_methods(a):
    qt.assert_bit_exact(lambda q, k, v, s, c: qattn.attention(q, k, v, "intattention@upstream-neon", scale=s,
                                                              causal=c, engine="fast"),
                        "intattention@upstream-neon", a)
    with pytest.raises(AssertionError, match="kernel != intattention@upstream-neon"):
        qt.assert_bit_exact(lambda q, k, v, s, c: qattn.attention(q, k, v, "quant-only", scale=s, causal=c),
                            "intattention@upstream-neon", a)
