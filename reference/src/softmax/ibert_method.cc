// The "ibert" method: I-BERT's integer-only softmax (qattn/reference/ibert.h, docs/methods/ibert.md) and its
// registry entry.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "qattn/error.h"
#include "qattn/reference/ibert.h"
#include "qattn/reference/method_entries.h"

namespace qattn::ref {
namespace {

constexpr std::int64_t kInt32Max = std::numeric_limits<std::int32_t>::max();
constexpr double kLn2 = 0.6931471805599453;
// The paper's polynomial L(p) = a (p + b)^2 + c ~ e^p on (-ln 2, 0] (Algorithm 2).
constexpr double kPaperA = 0.3585, kPaperB = 1.353, kPaperC = 0.344;
// The official code's a' (x^2 + b' x + c') with b' = 0.96963238 / a', c' = 1 / a', and its -ln 2 literal.
constexpr double kUpstreamA = 0.35815147, kUpstreamB = 0.96963238 / kUpstreamA, kUpstreamC = 1.0 / kUpstreamA;
constexpr double kUpstreamX0 = -0.6931;
constexpr int kUpstreamN = 30;  // "sufficiently large integer": the clamp at 30 ln 2 and the 2^30 scaling

[[noreturn]] void int32_overflow(const char* what, double scale) {
  throw InputError("logits", "scale",
                   std::string(what) + " leaves int32 at scale S = " + std::to_string(scale) +
                       ": the integer grid is too fine for I-BERT's INT32 arithmetic (lower in-bits)");
}

// floor(v) for a grid constant of Algorithm 1 (or the official code); one beyond 2^31 already breaks the INT32
// budget, so it is refused before the cast (which for |v| >= 2^63 would be undefined).
std::int64_t grid_constant(double v, const char* what, double scale) {
  if (!(std::abs(v) <= static_cast<double>(kInt32Max))) int32_overflow(what, scale);
  return static_cast<std::int64_t>(std::floor(v));
}

// round-half-even(v m / 2^30) for an integer v >= 0 and a double m >= 0, exactly: m = M 2^E with an integer M.
std::int64_t requantize_16(std::int64_t v, double m) {
  int e = 0;
  const double frac = std::frexp(m, &e);                       // m = frac 2^e, frac in [1/2, 1)
  const auto mant = static_cast<std::int64_t>(std::ldexp(frac, 53));  // m = mant 2^(e - 53), exact
  const __int128 product = static_cast<__int128>(v) * mant;   // v m 2^30 = product 2^(e - 53)
  const int shift = 53 - e + 30;                               // v m / 2^30 = product / 2^shift
  if (shift <= 0) return std::numeric_limits<std::int64_t>::max();  // far beyond the 16-bit grid: the caller clamps
  if (shift >= 126) return 0;
  const __int128 q = product >> shift, rem = product - (q << shift), half = static_cast<__int128>(1) << (shift - 1);
  return static_cast<std::int64_t>(q + ((rem > half || (rem == half && (q & 1))) ? 1 : 0));
}

}  // namespace

std::int64_t ibert_exp(std::int64_t q, double scale, IbertExp variant) {
  if (variant == IbertExp::paper) {
    const char* what = "Algorithm 1's (q + q_b)^2 + q_c";
    const std::int64_t q_ln2 = grid_constant(kLn2 / scale, what, scale);
    if (q_ln2 == 0) throw InputError("logits", "scale", "S >= ln 2: Algorithm 2's q_ln2 = floor(ln2 / S) is 0");
    const std::int64_t z = -q / q_ln2;  // q <= 0: floor(-q / q_ln2)
    const std::int64_t q_p = q + z * q_ln2;  // in (-q_ln2, 0]
    const std::int64_t q_b = grid_constant(kPaperB / scale, what, scale);
    const std::int64_t q_c = grid_constant(kPaperC / (kPaperA * scale * scale), what, scale);
    const __int128 t = q_p + q_b;  // |t| < 2^32: its square fits 128 bits
    const __int128 q_l = t * t + q_c;
    if (q_l > kInt32Max) int32_overflow(what, scale);
    return z >= 63 ? 0 : static_cast<std::int64_t>(q_l) >> z;
  }
  const char* what = "the official (r + b_int) r + c_int";
  const std::int64_t x0 = grid_constant(kUpstreamX0 / scale, what, scale);  // < 0
  const std::int64_t q_clamped = std::max(q, kUpstreamN * x0);
  const std::int64_t z = q_clamped / x0;  // both <= 0 (x0 < 0): floor(q' / x0) = q' / x0
  const std::int64_t r = q_clamped - x0 * z;  // in (x0, 0]
  const std::int64_t b_int = grid_constant(kUpstreamB / scale, what, scale);
  const std::int64_t c_int = grid_constant(kUpstreamC / (scale * scale), what, scale);
  const __int128 q_l = static_cast<__int128>(r + b_int) * r + c_int;  // |factors| < 2^32: fits 128 bits
  if (q_l > kInt32Max) int32_overflow(what, scale);
  const std::int64_t exp_int = std::max<std::int64_t>(static_cast<std::int64_t>(q_l), 0) << (kUpstreamN - z);  // z <= 30: exact, < 2^61
  // QuantAct(16): the value exp_int a' S^2 / 2^30 on a symmetric 16-bit grid of step 1 / 32767.
  return std::min<std::int64_t>(requantize_16(exp_int, kUpstreamA * scale * scale * 32767), 32767);
}

std::int64_t ibert_softmax_row(std::span<const std::int64_t> q, std::span<const bool> visible, double scale,
                               const IbertParams& p, std::span<std::int64_t> p_int) {
  std::int64_t max_q = std::numeric_limits<std::int64_t>::min();
  for (std::size_t j = 0; j < q.size(); ++j)
    if (visible[j]) max_q = std::max(max_q, q[j]);
  std::vector<std::int64_t> e(q.size(), 0);
  std::int64_t sum = 0;
  for (std::size_t j = 0; j < q.size(); ++j)
    if (visible[j]) sum += e[j] = ibert_exp(q[j] - max_q, scale, p.exp);
  if (p.norm == IbertNorm::division) {  // floor(q_exp 2^M / sum): q_exp <= 2^31, M <= 16, exact in int64
    for (std::size_t j = 0; j < q.size(); ++j) p_int[j] = sum > 0 ? (e[j] << p.out_bits) / sum : 0;
    return sum;
  }
  const std::int64_t factor = sum > 0 ? (std::int64_t{1} << 32) / sum : 0;  // floor(2^32 / sum)
  for (std::size_t j = 0; j < q.size(); ++j) p_int[j] = (e[j] * factor) >> (32 - p.out_bits);  // e factor <= 2^32
  return sum;
}

double ibert_max_abs(const MatrixView& logits) {
  double m = 0;
  for (Eigen::Index i = 0; i < logits.rows(); ++i)
    for (Eigen::Index j = 0; j < logits.cols(); ++j)
      if (!std::isinf(logits(i, j))) m = std::max(m, std::abs(logits(i, j)));
  return m;
}

RowMatrixXd ibert_softmax_rows(const MatrixView& logits, const IbertParams& p, std::optional<double> tensor_max_abs) {
  RowMatrixXd probs = RowMatrixXd::Zero(logits.rows(), logits.cols());
  const std::size_t n = static_cast<std::size_t>(logits.cols());
  const double levels = std::ldexp(1.0, p.in_bits - 1) - 1;
  const auto scale_of = [&](Eigen::Index r0, Eigen::Index rows) {
    const double m = tensor_max_abs && p.scope == IbertScope::tensor ? *tensor_max_abs : ibert_max_abs(logits.middleRows(r0, rows));
    return (m > 0 ? m : 1.0) / levels;  // all-zero logits: any grid gives q = 0; take that of max|x| = 1
  };
  const double tensor_scale = p.scope == IbertScope::tensor ? scale_of(0, logits.rows()) : 0;
  std::vector<std::int64_t> q(n), out(n);
  const std::unique_ptr<bool[]> visible(new bool[n]);
  for (Eigen::Index i = 0; i < logits.rows(); ++i) {
    const double scale = p.scope == IbertScope::tensor ? tensor_scale : scale_of(i, 1);
    bool any = false;
    for (std::size_t j = 0; j < n; ++j) {
      const double x = logits(i, static_cast<Eigen::Index>(j));
      visible[j] = !std::isinf(x);
      any = any || visible[j];
      q[j] = visible[j] ? static_cast<std::int64_t>(std::nearbyint(x / scale)) : 0;  // round half to even
    }
    if (!any) continue;  // fully masked: P = 0
    ibert_softmax_row(q, std::span<const bool>(visible.get(), n), scale, p, out);
    for (std::size_t j = 0; j < n; ++j) probs(i, static_cast<Eigen::Index>(j)) = std::ldexp(static_cast<double>(out[j]), -p.out_bits);
  }
  return probs;
}

namespace {

class IbertMethod final : public SoftmaxModelMethod {
 public:
  explicit IbertMethod(IbertParams p) : p_(p) {}
  RowMatrixXd softmax_rows_impl(const MatrixView& logits) const override {
    if (const std::unique_ptr<LogitScope> scope = logit_scope()) return softmax_with_scope(*scope, logits);
    return ibert_softmax_rows(logits, p_);
  }

 protected:
  // scope=tensor: max |x| over the call's finite logits (a maximum: the same in any order).
  std::unique_ptr<LogitScope> logit_scope() const override {
    class MaxAbs final : public LogitScope {
     public:
      explicit MaxAbs(const IbertParams& p) : p_(p) {}
      void observe(int, const RowMatrixXd& logits) override { m_ = std::max(m_, ibert_max_abs(logits)); }
      RowMatrixXd softmax_rows(const MatrixView& logits) const override { return ibert_softmax_rows(logits, p_, m_); }

     private:
      IbertParams p_;
      double m_ = 0;
    };
    if (p_.scope != IbertScope::tensor) return nullptr;
    return std::make_unique<MaxAbs>(p_);
  }

 private:
  IbertParams p_;
};

constexpr Choice<IbertExp> kExps[] = {{"paper", IbertExp::paper}, {"upstream", IbertExp::upstream}};
constexpr Choice<IbertNorm> kNorms[] = {{"division", IbertNorm::division}, {"factor32", IbertNorm::factor32}};
constexpr Choice<IbertScope> kScopes[] = {{"tensor", IbertScope::tensor}, {"row", IbertScope::row}};

}  // namespace

void register_ibert_method(Registry& registry) {
  MethodEntry e;
  e.name = "ibert";
  e.summary = "I-BERT integer-only softmax: ln 2 range reduction, second-order polynomial i-exp, integer "
              "normalisation to M = 8 output bits";
  e.params = {
      {"exp", ParamType::choice, "paper",
       "i-exp: paper (Algorithms 1-2: a, b, c = 0.3585, 1.353, 0.344, shift by z) or upstream (official "
       "coefficients, -0.6931, 30-step clamp, 2^30 scaling, QuantAct(16))",
       choice_names(kExps)},
      {"norm", ParamType::choice, "division",
       "normalisation to M bits: division (floor(q_exp 2^M / sum), the paper's integer division) or factor32 (the "
       "official floor(q_exp floor(2^32 / sum) / 2^(32 - M)))",
       choice_names(kNorms)},
      {"in-bits", ParamType::integer, "12", "integer grid of float logits: S = max|x| / (2^(in-bits - 1) - 1)", {}, 4, 24},
      {"out-bits", ParamType::integer, "8", "output bits M of the normalisation (P = P_int / 2^M)", {}, 1, 16},
      {"scope", ParamType::choice, "tensor", "S over the whole call or each row", choice_names(kScopes)},
  };
  e.presets = {{"paper", {{"exp", "paper"}, {"norm", "division"}, {"out-bits", "8"}},
                "Algorithms 1-2 as printed, integer division to 8 output bits"},
               {"upstream", {{"exp", "upstream"}, {"norm", "factor32"}, {"out-bits", "8"}},
                "the official code's i-exp and QuantAct(16) (in exact integers, not its float32 tensors), 8-bit output"}};
  e.make = [](const ParamMap& m) -> std::unique_ptr<Method> {
    IbertParams p;
    p.exp = choice_value(m, "exp", kExps);
    p.in_bits = static_cast<int>(m.integer("in-bits"));
    p.out_bits = static_cast<int>(m.integer("out-bits"));
    p.norm = choice_value(m, "norm", kNorms);
    p.scope = choice_value(m, "scope", kScopes);
    return std::make_unique<IbertMethod>(p);
  };
  e.overflow = OverflowRule::refuse;
  e.overflow_note = "float logits in float64; an integer grid so fine that the int32 polynomial overflows "
                    "(small max |x| / 2^in-bits) is refused, as are logits beyond float64";
  e.kind = MethodKind::softmax_model;
  e.doc = "docs/methods/ibert.md";
  // The grid S = max|x| / (2^(in-bits-1) - 1) depends on the values: max |x| of the call (scope=tensor) or the row.
  e.traits = [](const ParamMap& m) { return value_grid_traits(choice_value(m, "scope", kScopes) == IbertScope::row); };
  registry.add(std::move(e));
}

}  // namespace qattn::ref
