// qattn/testing.h: property-test your own softmax kernel against qattn's reference models and exact softmax, with
// RapidCheck (Debian librapidcheck-dev; link the `rapidcheck` target next to qattn::qattn). docs/testing-your-kernel.md
// has the recipe; examples/own-index-softmax/ a worked example that the consumer test runs.
//
//   rc::check("my kernel == index@paper", [](const qattn::testing::IntegerRow& row) {
//     qattn::testing::expect_bit_exact(my_kernel, "index@paper", row);
//   });
//
// Generators. Each row family targets a way kernels break; lengths come from lengths_around_widths(). Rows are built
// from RapidCheck's own containers and ranges, so a failure shrinks (shorter rows, values toward the family's base
// value) before it is printed.
//
// Checkers. expect_bit_exact compares a kernel with a registered method bit for bit; expect_within_contract compares
// it with the fp64 or the 50-digit exact softmax within a declared bound. On a mismatch they fail the property
// (RC_FAIL) with the spec, the row's family, the first differing index, both values there and both outputs.
#pragma once

#include <rapidcheck.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <iomanip>
#include <limits>
#include <memory>
#include <numbers>
#include <random>
#include <ostream>
#include <stdexcept>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "qattn/method.h"
#include "qattn/reference/registry.h"
#include "qattn/reference/softmax.h"

namespace qattn::testing {

// A row of float logits; -inf entries are masked. `family` names the generator, for the failure message.
struct LogitRow {
  std::string family;
  std::vector<double> logits;
};

// A row of integer logits (e.g. INT32 q k^T) and the clip c_int the kernel is given.
struct IntegerRow {
  std::string family;
  std::vector<std::int32_t> logits;
  std::int64_t c_int = 1;
};

// One attention call: q [L_q, d], k [L_k, d], v [L_k, d_v], the logit scale and the mask.
struct AttentionInput {
  std::string family;
  RowMatrixXd q, k, v;
  double scale = 1;
  AttentionMask mask;
};

inline void showValue(const AttentionInput& a, std::ostream& os) {
  os << a.family << ": L_q " << a.q.rows() << ", L_k " << a.k.rows() << ", d " << a.q.cols() << ", d_v " << a.v.cols()
     << ", scale " << std::setprecision(17) << a.scale << (a.mask.causal ? ", causal" : "") << "\n  q row 0: "
     << a.q.row(0) << "\n  k row 0: " << a.k.row(0);
}

inline void showValue(const LogitRow& r, std::ostream& os) {
  os << r.family << " row of " << r.logits.size() << ": [";
  for (std::size_t i = 0; i < r.logits.size(); ++i) os << (i ? ", " : "") << std::setprecision(17) << r.logits[i];
  os << "]";
}
inline void showValue(const IntegerRow& r, std::ostream& os) {
  os << r.family << " row of " << r.logits.size() << ", c_int " << r.c_int << ": [";
  for (std::size_t i = 0; i < r.logits.size(); ++i) os << (i ? ", " : "") << r.logits[i];
  os << "]";
}

// ---- generators ----------------------------------------------------------------------------------------------

// Lengths k w - 1, k w and k w + 1 for vector widths w = 4, 8, 16, 32, 64 and k = 1..4, plus 1, 2, 3: the loop tails
// and lane masks of SIMD kernels, where off-by-one lane handling hides.
inline rc::Gen<int> lengths_around_widths() {
  std::vector<int> lengths = {1, 2, 3};
  for (int w : {4, 8, 16, 32, 64})
    for (int k = 1; k <= 4; ++k)
      for (int d : {-1, 0, 1}) lengths.push_back(k * w + d);
  std::sort(lengths.begin(), lengths.end());
  lengths.erase(std::unique(lengths.begin(), lengths.end()), lengths.end());
  return rc::gen::elementOf(lengths);
}

namespace detail {

// Uniform on [a, b) whatever RapidCheck's current size: inRange alone scales with the size, which starts at 0, so
// that the first cases of every property would all be the family's base row. Shrinking still moves toward a.
template <class T>
rc::Gen<T> any_in(T a, T b) {
  return rc::gen::resize(100, rc::gen::inRange(a, b));
}

// A row of `length` values f(u), u uniform on 0..1000 (RapidCheck shrinks u toward 0, so rows shrink toward f(0)).
template <class F>
rc::Gen<std::vector<double>> row_of(int length, F f) {
  return rc::gen::map(rc::gen::container<std::vector<int>>(static_cast<std::size_t>(length), detail::any_in(0, 1001)),
                      [f](const std::vector<int>& u) {
                        std::vector<double> x(u.size());
                        std::transform(u.begin(), u.end(), x.begin(), f);
                        return x;
                      });
}

// The standard normal quantile of (u + 1/2) / 1001 (Acklam's rational approximation refined by one Newton step on
// erfc, to well below the resolution of u).
inline double normal_quantile(int u) {
  const double p = (u + 0.5) / 1001.0;
  double x = std::sqrt(2.0) * (p < 0.5 ? -1 : 1) * std::sqrt(-std::log(p < 0.5 ? 2 * p : 2 * (1 - p)));
  for (int i = 0; i < 40; ++i) {  // Newton on Phi(x) = p
    const double f = 0.5 * std::erfc(-x / std::sqrt(2.0)) - p;
    x -= f / (std::exp(-0.5 * x * x) / std::sqrt(2 * std::numbers::pi));
  }
  return x;
}

}  // namespace detail

// Gaussian rows: mean in [-50, 50], standard deviation log-uniform in [0.5, 12] (the logit rows of the USE-Lite dump
// have a std of 0.9 to 5.3 and spread up to 56). Target: the ordinary case, accumulation order, exp and rounding.
inline rc::Gen<LogitRow> gaussian_rows(rc::Gen<int> length = lengths_around_widths()) {
  return rc::gen::exec([length] {
    const int n = *length;
    const double mu = *detail::any_in(-500, 501) / 10.0;
    const double sigma = 0.5 * std::pow(24.0, *detail::any_in(0, 101) / 100.0);
    return LogitRow{"gaussian", *detail::row_of(n, [=](int u) { return mu + sigma * detail::normal_quantile(u); })};
  });
}

// Heavy-tailed rows: Student-t with 1 to 3 degrees of freedom, scaled by 1 to 8. Target: a few entries far from the
// rest in both directions, so clipping and saturation paths (and their boundaries) are taken.
inline rc::Gen<LogitRow> heavy_tailed_rows(rc::Gen<int> length = lengths_around_widths()) {
  return rc::gen::exec([length] {
    const int n = *length;
    const int nu = *detail::any_in(1, 4);
    const double scale = *detail::any_in(1, 9);
    auto t = [=](int u) {  // quantile of Student's t by its tan / normal-mixture form for nu = 1, 2, 3
      const double p = (u + 0.5) / 1001.0;
      if (nu == 1) return scale * std::tan(std::numbers::pi * (p - 0.5));
      if (nu == 2) return scale * (2 * p - 1) / std::sqrt(2 * p * (1 - p));
      const double z = detail::normal_quantile(u);  // nu = 3: Cornish-Fisher to second order
      return scale * (z + (z * z * z + z) / 12.0 + (5 * std::pow(z, 5) + 16 * z * z * z + 3 * z) / 288.0);
    };
    return LogitRow{"heavy-tailed (t, nu " + std::to_string(nu) + ")", *detail::row_of(n, t)};
  });
}

// Skyscraper rows: Gaussian entries of std 1 and one logit 20 to 10^4 above them at a random position. Target: every
// other exponential underflows (or clips), P is one-hot, the row sum is the maximum's own term.
inline rc::Gen<LogitRow> skyscraper_rows(rc::Gen<int> length = lengths_around_widths()) {
  return rc::gen::exec([length] {
    const int n = *length;
    std::vector<double> x = *detail::row_of(n, [](int u) { return detail::normal_quantile(u); });
    const int at = *detail::any_in(0, n);
    x[static_cast<std::size_t>(at)] += 20.0 * std::pow(500.0, *detail::any_in(0, 101) / 100.0);
    return LogitRow{"skyscraper", x};
  });
}

// Tied rows: every entry one of 1 to 4 distinct values 0.25 apart. Target: ties at the maximum (which index wins, if
// any), equal entries that must get equal P, rounding of equal shares (a row of n equal logits gives 1/n each).
inline rc::Gen<LogitRow> tied_rows(rc::Gen<int> length = lengths_around_widths()) {
  return rc::gen::exec([length] {
    const int n = *length;
    const int k = *detail::any_in(1, 5);
    return LogitRow{"ties (" + std::to_string(k) + " values)", *detail::row_of(n, [k](int u) { return 0.25 * (u % k); })};
  });
}

// Masked rows: Gaussian rows with entries set to -inf (each with probability 1/4 to 3/4), and one row in ten fully
// masked. Target: masks in the maximum and the sum, and the fully masked row (P = 0, no 0/0).
inline rc::Gen<LogitRow> masked_rows(rc::Gen<int> length = lengths_around_widths()) {
  return rc::gen::exec([length] {
    LogitRow r = *gaussian_rows(length);
    const bool all = *detail::any_in(0, 10) == 0;
    const int keep_in_4 = *detail::any_in(1, 4);
    const std::vector<int> pick = *rc::gen::container<std::vector<int>>(r.logits.size(), detail::any_in(0, 4));
    for (std::size_t i = 0; i < r.logits.size(); ++i)
      if (all || pick[i] >= keep_in_4) r.logits[i] = -std::numeric_limits<double>::infinity();
    r.family = all ? "fully masked" : "masked";
    return r;
  });
}

// Huge rows: Gaussian rows of 4096 to 65536 entries. Target: accumulators that overflow (a uint16 row sum of 255s
// wraps at 258 entries), tiling over L, and error growth with L.
inline rc::Gen<LogitRow> huge_rows() {
  return rc::gen::exec([] {
    LogitRow r = *gaussian_rows(rc::gen::just(4096 << *detail::any_in(0, 5)));
    r.family = "huge L";
    return r;
  });
}

// Any of the float families but huge rows, which a property asks for on its own (`*huge_rows()`): a failing huge
// row shrinks through thousands of long candidates, each checked again, which is slow against the exact softmax.
inline rc::Gen<LogitRow> any_rows() {
  return rc::gen::weightedOneOf<LogitRow>({{4, gaussian_rows()}, {4, heavy_tailed_rows()}, {3, skyscraper_rows()},
                                           {3, tied_rows()}, {5, masked_rows()}});
}

// Lengths for integer rows: half from lengths_around_widths(), half past the 257 entries at which a uint16 row sum of
// 255s wraps (IntAttention's NEON kernel keeps its row sum in a uint16: ../shared/UPSTREAM.md, docs/testing-your-
// kernel.md), up to 4096. Target: SIMD tails, and accumulators too narrow for long rows.
inline rc::Gen<int> integer_row_lengths() {
  return rc::gen::oneOf(lengths_around_widths(), rc::gen::element(258, 259, 260, 300, 511, 512, 513, 1024, 1025, 4096));
}

// Integer rows with a saturating clip: c_int log-uniform in [1, 2^20], entries spread over 0 to 4 c_int below the
// row's top value, so that part of every row lies at or beyond the clip (index T1, E = 0) and part inside it,
// including the boundary distance c_int itself; the top value is always there and, in rows of two or more, an entry
// beyond the clip. One row in four is near-top instead: every entry within c_int / 32 of the top, so each maps to the
// table's first entry (255) and the row sum is as large as the length allows. Lengths from integer_row_lengths(), half
// of them past 257. Rows up to 257 entries shrink entry by entry; longer ones take their entries from a drawn seed
// (they shrink in length, c_int and top only), so that a failure does not shrink through thousands of entries.
// Target: the clip, the index rounding at step boundaries, the table's ends, integer normalisation, narrow sums.
inline rc::Gen<IntegerRow> saturating_integer_rows(rc::Gen<int> length = integer_row_lengths()) {
  return rc::gen::exec([length] {
    const int n = *length;
    const std::int64_t c_int = static_cast<std::int64_t>(std::llround(std::pow(2.0, *detail::any_in(0, 201) / 10.0)));
    const std::int64_t top = *detail::any_in(-1000000, 1000001);
    const bool near_top = *detail::any_in(0, 4) == 0;
    std::vector<int> u;
    if (n <= 257) {
      u = *rc::gen::container<std::vector<int>>(static_cast<std::size_t>(n), detail::any_in(0, 1001));
    } else {
      std::mt19937_64 g(*rc::gen::arbitrary<std::uint64_t>());
      u.resize(static_cast<std::size_t>(n));
      for (int& v : u) v = static_cast<int>(g() % 1001);
    }
    IntegerRow r{near_top ? "near-top integer" : "saturating integer", std::vector<std::int32_t>(u.size()), c_int};
    for (std::size_t i = 0; i < u.size(); ++i) {
      const std::int64_t below = near_top         ? (c_int / 32) * u[i] / 1000
                                 : u[i] % 7 == 3 ? c_int  // every 7th value: the boundary
                                                 : (4 * c_int * u[i]) / 1000;
      r.logits[i] = static_cast<std::int32_t>(std::clamp<std::int64_t>(top - below, INT32_MIN, INT32_MAX));
    }
    // Whatever the draws (and however far they shrink): the top value is in the row, and with two entries or more
    // one lies beyond the clip, one step past it.
    const int at = *detail::any_in(0, n);
    r.logits[static_cast<std::size_t>(at)] = static_cast<std::int32_t>(top);
    if (n >= 2) r.logits[static_cast<std::size_t>((at + 1) % n)] = static_cast<std::int32_t>(top - c_int - 1);
    return r;
  });
}

// Attention inputs shaped like real heads: L_q = L_k from lengths_around_widths(), d in {16, 32, 64, 128}, d_v = d,
// Q ~ N(0, 1) and K with a per-channel offset of std 0 to 4 shared by all keys (the channel-wise bias of real K, 27-62 %
// of its energy in the USE-Lite dump), V ~ N(0, 1), scale 1/sqrt(d), causal one time in three. Target: INT8
// quantisation scales, per-channel outliers, the integer dot products and their clip, tails in L and d.
inline rc::Gen<AttentionInput> attention_inputs(rc::Gen<int> length = lengths_around_widths()) {
  return rc::gen::exec([length] {
    const int n = *length;
    const int d = *rc::gen::element(16, 32, 64, 128);
    const double offset = *detail::any_in(0, 41) / 10.0;
    auto normals = [&](int rows, int cols) {
      // Not shrunk element by element (a head holds up to 257 x 128 values per matrix): L, d, the offset and the
      // mask shrink, and the values are redrawn.
      const std::vector<double> x = *rc::gen::noShrink(detail::row_of(rows * cols, [](int u) { return detail::normal_quantile(u); }));
      RowMatrixXd m(rows, cols);
      std::copy(x.begin(), x.end(), m.data());
      return m;
    };
    AttentionInput a{"gaussian heads, K channel offset " + std::to_string(offset), normals(n, d), normals(n, d),
                     normals(n, d), 1.0 / std::sqrt(static_cast<double>(d)), {}};
    const RowMatrixXd bias = normals(1, d) * offset;
    a.k.rowwise() += bias.row(0);
    a.mask.causal = *detail::any_in(0, 3) == 0;
    return a;
  });
}

// ---- checkers ------------------------------------------------------------------------------------------------

namespace detail {

template <class A>
std::string list(const std::vector<A>& a, std::size_t around) {
  std::ostringstream os;
  os << std::setprecision(17) << "[";
  const std::size_t lo = around > 8 ? around - 8 : 0, hi = std::min(a.size(), around + 9);
  if (lo > 0) os << "... ";
  for (std::size_t i = lo; i < hi; ++i) os << (i > lo ? ", " : "") << a[i];
  if (hi < a.size()) os << " ...";
  return os.str() + "]";
}

template <class T, class U>
[[noreturn]] void fail(const std::string& what, const std::string& family, std::size_t index, std::size_t size,
                       const std::vector<T>& kernel, const std::vector<U>& reference, const std::string& detail = "") {
  std::ostringstream os;
  os << std::setprecision(17) << what << " (" << family << " row of " << size << ")" << detail << ": first difference at index "
     << index << ": kernel " << kernel[index] << ", reference " << reference[index] << "\n  kernel:    "
     << list(kernel, index) << "\n  reference: " << list(reference, index);
  RC_FAIL(os.str());
}

inline std::unique_ptr<Method> method(const std::string& spec) { return ref::reference_registry().create(spec); }

}  // namespace detail

// A float-row kernel, std::vector<double>(std::span<const double> logits), against `spec`'s softmax_rows, bit for
// bit (NaN equal to NaN). `spec` is any registered method with a softmax form (`qattn methods`).
template <class Kernel>
void expect_bit_exact(Kernel&& kernel, const std::string& spec, const LogitRow& row) {
  const std::vector<double> got = kernel(std::span<const double>(row.logits));
  RowMatrixXd x(1, static_cast<Eigen::Index>(row.logits.size()));
  std::copy(row.logits.begin(), row.logits.end(), x.data());
  const RowMatrixXd p = detail::method(spec)->softmax_rows(x);
  const std::vector<double> want(p.data(), p.data() + p.size());
  if (got.size() != want.size()) RC_FAIL("kernel returned " + std::to_string(got.size()) + " values for a row of " + std::to_string(want.size()));
  for (std::size_t i = 0; i < want.size(); ++i) {
    const bool same = std::isnan(got[i]) ? std::isnan(want[i]) : (std::bit_cast<std::uint64_t>(got[i]) == std::bit_cast<std::uint64_t>(want[i]));
    if (!same) detail::fail("kernel != " + spec, row.family, i, want.size(), got, want);
  }
}

// An integer-row kernel, std::vector<std::int32_t>(std::span<const std::int32_t> logits, std::int64_t c_int) that
// returns the raw integer P, against `spec`'s integer softmax (today the `index` method and its presets) with the
// same c_int, bit for bit.
template <class Kernel>
void expect_bit_exact(Kernel&& kernel, const std::string& spec, const IntegerRow& row) {
  const std::vector<std::int32_t> got = kernel(std::span<const std::int32_t>(row.logits), row.c_int);
  const IntegerLogits in{{row.logits.data(), 1, static_cast<Eigen::Index>(row.logits.size())}, row.c_int, std::nullopt};
  const IntegerSoftmaxResult r = detail::method(spec)->softmax_integer(in);
  const Eigen::ArrayXd raw = r.raw->to_double();
  std::vector<std::int32_t> want(static_cast<std::size_t>(raw.size()));
  for (Eigen::Index i = 0; i < raw.size(); ++i) want[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(raw[i]);
  if (got.size() != want.size()) RC_FAIL("kernel returned " + std::to_string(got.size()) + " values for a row of " + std::to_string(want.size()));
  for (std::size_t i = 0; i < want.size(); ++i)
    if (got[i] != want[i])
      detail::fail("kernel != " + spec, row.family, i, want.size(), got, want, ", c_int " + std::to_string(row.c_int));
}

// An attention kernel, RowMatrixXd(const AttentionInput&) returning O [L_q, d_v], against `spec`'s attention (any
// registered method, e.g. "intattention@upstream-neon"), bit for bit.
template <class Kernel>
void expect_bit_exact(Kernel&& kernel, const std::string& spec, const AttentionInput& in) {
  const RowMatrixXd got_m = kernel(in);
  const RowMatrixXd want_m = detail::method(spec)->attention(in.q, in.k, in.v, in.scale, in.mask).o;
  if (got_m.rows() != want_m.rows() || got_m.cols() != want_m.cols())
    RC_FAIL("kernel returned O of " + std::to_string(got_m.rows()) + " x " + std::to_string(got_m.cols()) + ", the method " +
            std::to_string(want_m.rows()) + " x " + std::to_string(want_m.cols()));
  const std::vector<double> got(got_m.data(), got_m.data() + got_m.size()), want(want_m.data(), want_m.data() + want_m.size());
  for (std::size_t i = 0; i < want.size(); ++i)
    if (std::bit_cast<std::uint64_t>(got[i]) != std::bit_cast<std::uint64_t>(want[i]) && !(std::isnan(got[i]) && std::isnan(want[i])))
      detail::fail("kernel O != " + spec, in.family, i, want.size(), got, want,
                   " (O element [" + std::to_string(i / static_cast<std::size_t>(want_m.cols())) + ", " +
                       std::to_string(i % static_cast<std::size_t>(want_m.cols())) + "])");
}

// A declared error bound against a reference softmax: |kernel_j - p_j| <= element for every entry, and
// sum_j |kernel_j - p_j| <= row_l1 for the row (infinite: not checked). `element_of`, when set, bounds each entry by a
// function of its reference probability p and the row's number of valid (unmasked) entries L, and the tighter of it
// and `element` applies.
struct Bound {
  double element = std::numeric_limits<double>::infinity();
  double row_l1 = std::numeric_limits<double>::infinity();
  std::function<double(double p, Eigen::Index valid)> element_of = {};
};

// The declared contract of qattn's own double-precision softmax against the exact one (docs/softmax-reference.md
// section 4): |p^ - p| <= u (ln(1/p) + ln L + h(L) + 6) p + 4 denorm_min, h(L) the depth of its pairwise sum.
inline Bound fp64_contract() {
  return Bound{.element_of = [](double p, Eigen::Index valid) { return ref::SoftmaxRefContract<double>::bound(p, valid); }};
}

// A float-row kernel against the fp64 softmax ("fp64") or the 50-digit exact softmax rounded once to double
// ("exact"), within `bound`. Masked entries (-inf) must give exactly 0.
template <class Kernel>
void expect_within_contract(Kernel&& kernel, const std::string& reference, const Bound& bound, const LogitRow& row) {
  if (reference != "fp64" && reference != "exact")
    throw std::invalid_argument("expect_within_contract: reference must be \"fp64\" or \"exact\", got \"" + reference + "\"");
  const std::vector<double> got = kernel(std::span<const double>(row.logits));
  std::vector<double> want(row.logits.size());
  if (reference == "exact") {
    const auto e = ref::softmax_exact(std::span<const double>(row.logits));
    for (std::size_t i = 0; i < e.size(); ++i) want[i] = static_cast<double>(e[i]);
  } else {
    RowMatrixXd x(1, static_cast<Eigen::Index>(row.logits.size()));
    std::copy(row.logits.begin(), row.logits.end(), x.data());
    const RowMatrixXd p = detail::method("fp64")->softmax_rows(x);
    want.assign(p.data(), p.data() + p.size());
  }
  if (got.size() != want.size()) RC_FAIL("kernel returned " + std::to_string(got.size()) + " values for a row of " + std::to_string(want.size()));
  const auto valid = static_cast<Eigen::Index>(
      std::count_if(row.logits.begin(), row.logits.end(), [](double x) { return x != -std::numeric_limits<double>::infinity(); }));
  double l1 = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double err = std::abs(got[i] - want[i]);
    const bool masked = row.logits[i] == -std::numeric_limits<double>::infinity();
    const double limit = bound.element_of ? std::min(bound.element, bound.element_of(want[i], valid)) : bound.element;
    if ((masked && got[i] != 0) || !(err <= limit)) {
      std::ostringstream d;
      d << std::setprecision(6) << ", ";
      if (masked) d << "masked entry not 0";
      else d << "|error| " << err << " > bound " << limit;
      detail::fail("kernel outside its contract against " + reference, row.family, i, want.size(), got, want, d.str());
    }
    l1 += err;
  }
  if (!(l1 <= bound.row_l1)) {
    std::ostringstream os;
    os << std::setprecision(6) << "kernel outside its contract against " << reference << " (" << row.family << " row of "
       << want.size() << "): row L1 error " << l1 << " > bound " << bound.row_l1;
    RC_FAIL(os.str());
  }
}

}  // namespace qattn::testing

namespace rc {

template <>
struct Arbitrary<qattn::testing::LogitRow> {
  static Gen<qattn::testing::LogitRow> arbitrary() { return qattn::testing::any_rows(); }
};
template <>
struct Arbitrary<qattn::testing::AttentionInput> {
  static Gen<qattn::testing::AttentionInput> arbitrary() { return qattn::testing::attention_inputs(); }
};
template <>
struct Arbitrary<qattn::testing::IntegerRow> {
  static Gen<qattn::testing::IntegerRow> arbitrary() { return qattn::testing::saturating_integer_rows(); }
};

}  // namespace rc
