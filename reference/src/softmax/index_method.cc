// The "index" method: IndexSoftmax in the registry, with the paper and upstream presets.
#include <cmath>

#include "qattn/error.h"
#include "qattn/reference/index_softmax.h"
#include "qattn/reference/method_entries.h"
#include "qattn/reference/softmax.h"

namespace qattn::ref {
namespace {

constexpr Choice<PFormat> kPFormats[] = {{"u8", PFormat::u8}, {"s8", PFormat::s8}};

class IndexMethod final : public SoftmaxModelMethod {
 public:
  explicit IndexMethod(IndexSoftmaxParams p) : p_(p) {}

  // Floating-point logits: the IndexSoftmaxOnly variant (clamp and index in double, FP normalisation).
  RowMatrixXd softmax_rows_impl(const MatrixView& logits) const override { return index_softmax_fp(logits, p_); }

  IntegerSoftmaxResult softmax_integer_impl(const IntegerLogits& in) const override {
    const std::int64_t c_int = in.cint ? *in.cint : cint_from_alpha(p_.c, *in.alpha, p_.cint_rounding);
    try {
      validate(p_, c_int);
    } catch (const std::invalid_argument& e) {
      throw SpecError(e.what());
    }
    // Row by row from the caller's buffer: an int8 or int16 row is widened into `row` (exact), one at a time.
    const std::vector<std::uint8_t> lut = index_lut(p_.bits, p_.c, p_.lut_rounding);
    RowMatrixXi32 p(in.values.rows(), in.values.cols());
    std::vector<std::int32_t> row;
    for (Eigen::Index r = 0; r < p.rows(); ++r)
      index_softmax_row(in.values.row(r, row), nullptr, p.cols(), c_int, p_, lut, p.row(r).data());
    IntegerSoftmaxResult r;
    r.raw_scale = p_.p_scale();
    r.probabilities = p.cast<double>() / r.raw_scale;
    std::vector<double> ints(p.data(), p.data() + p.size());
    r.raw = Tensor::from_double(p_.p_format == PFormat::u8 ? DType::u8 : DType::i8, {p.rows(), p.cols()}, ints);
    return r;
  }


 private:
  IndexSoftmaxParams p_;
};

}  // namespace

std::vector<ParamInfo> index_softmax_param_infos() {
  return {
      {"b", ParamType::integer, "5", "table bits: 2^b entries", {}, 1, 8},
      {"c", ParamType::real, "6.6", "clip threshold in logit units", {}, 1e-6, 1e6},
      {"cint", ParamType::choice, "round", "c_int = rounding(c / alpha) (Eq. 8 round; upstream sim trunc)", choice_names(kCintRoundings)},
      {"lut", ParamType::choice, "floor", "table entries floor|round(255 exp(-c i / (2^b-1))) (Eq. 13 floor)", choice_names(kLutRoundings)},
      {"index", ParamType::choice, "floor", "index of the clipped distance (Eq. 11 floor)", choice_names(kIndexRules)},
      {"norm", ParamType::choice, "floor", "normalisation of E to P (Eq. 15 floor)", choice_names(kNormalizations)},
      {"p", ParamType::choice, "u8", "P format: u8 (x255) or s8 (x127)", choice_names(kPFormats)},
  };
}

std::vector<PresetInfo> index_softmax_presets() {
  return {
      {"paper", {{"cint", "round"}, {"lut", "floor"}, {"index", "floor"}, {"norm", "floor"}, {"p", "u8"}},
       "IntAttention as printed: Eq. 8, 11, 13, 15"},
      {"upstream-sim", {{"cint", "trunc"}, {"lut", "round"}, {"index", "floor-f32"}, {"norm", "f32-rne"}, {"p", "u8"}},
       "the official PyTorch simulation (produced the paper's accuracy tables)"},
      {"upstream-neon",
       {{"b", "5"}, {"c", "6.6"}, {"cint", "round"}, {"lut", "round"}, {"index", "q26-round"}, {"norm", "q8-reciprocal"},
        {"p", "u8"}},
       "the official NEON kernel's vector path (without its uint16 row-sum wrap)"},
  };
}

IndexSoftmaxParams index_softmax_params(const ParamMap& m) {
    IndexSoftmaxParams p;
    p.bits = static_cast<int>(m.integer("b"));
    p.c = m.real("c");
    p.cint_rounding = choice_value(m, "cint", kCintRoundings);
    p.lut_rounding = choice_value(m, "lut", kLutRoundings);
    p.index_rule = choice_value(m, "index", kIndexRules);
    p.normalization = choice_value(m, "norm", kNormalizations);
    p.p_format = choice_value(m, "p", kPFormats);
    try {
      validate(p);
    } catch (const std::invalid_argument& e) {
      throw SpecError(e.what());
    }
    return p;
}

void register_index_method(Registry& registry) {
  MethodEntry e;
  e.name = "index";
  e.summary =
      "IndexSoftmax (IntAttention): 2^b-entry UINT8 exp table, integer clip c_int, integer normalisation to "
      "UINT8 (x255) or INT8 (x127) P. Integer logits need --cint or --alpha; FP logits run IndexSoftmaxOnly";
  e.params = index_softmax_param_infos();
  e.presets = index_softmax_presets();
  e.make = [](const ParamMap& m) -> std::unique_ptr<Method> {
    return std::make_unique<IndexMethod>(index_softmax_params(m));
  };
  e.overflow = OverflowRule::refuse;
  e.overflow_note = "float logits in float64 (integer logits are exact); logits beyond its range (+inf) are refused";
  e.kind = MethodKind::softmax_model;
  e.doc = "docs/methods/index-softmax.md";
  // Row by row on x - max (exact for logits the format holds), between the fp64 products; P V in fp64 around it.
  e.traits = fixed_traits({.row_shift_invariant = true, .key_order_tolerance = 1e-12, .query_block_rows = 64});
  registry.add(std::move(e));
}

}  // namespace qattn::ref
