// The IEEE-format methods "fp64", "fp32", "fp16" and "bf16" in the registry (docs/softmax-reference.md).
#include "qattn/reference/float_attention.h"
#include "qattn/reference/method_entries.h"

namespace qattn::ref {
namespace {

class FloatMethod final : public Method {
 public:
  explicit FloatMethod(FloatPrecision p) : p_(p) {}
  RowMatrixXd softmax_rows_impl(const MatrixView& logits) const override { return float_softmax_rows(logits, p_); }
  RowMatrixXd softmax_rows_f32_impl(const MatrixViewF& logits) const override { return float_softmax_rows(logits, p_); }
  AttentionResult attention_impl(const MatrixView& q, const MatrixView& k, const MatrixView& v, double scale,
                                 const AttentionMask& mask) const override {
    return float_attention(q, k, v, scale, p_, mask);
  }

 private:
  FloatPrecision p_;
};

MethodEntry float_entry(FloatPrecision p, std::string summary) {
  MethodEntry e{std::string(precision_name(p)), std::move(summary), {}, {},
                [p](const ParamMap&) { return std::make_unique<FloatMethod>(p); }};
  // IEEE formats model overflow as the format does: a logit beyond the range is inf and its row comes out NaN.
  e.overflow = OverflowRule::propagate;
  // Reordering keys reorders the sums: O moves by rounding. With 16-bit storage one P entry and O itself may each
  // round to the neighbouring value (2^-11 relative for binary16, 2^-8 for bfloat16), hence two storage ulps.
  double key_order = 0;
  switch (p) {
    case FloatPrecision::fp64:
      e.overflow_note = "logits in float64: beyond 1.8e308 a row's max is inf, the row NaN";
      key_order = 1e-12;
      break;
    case FloatPrecision::fp32:
      e.overflow_note = "logits in float32: beyond 3.4e38 a row's max is inf, the row NaN";
      key_order = 1e-5;
      break;
    case FloatPrecision::fp16:
      e.overflow_note = "logits stored in binary16: beyond 65504 a row's max is inf, the row NaN";
      key_order = 0x1p-10;
      break;
    case FloatPrecision::bf16:
      e.overflow_note = "logits stored in bfloat16: beyond 3.39e38 a row's max is inf, the row NaN";
      key_order = 0x1p-7;
      break;
  }
  const double bits = p == FloatPrecision::fp64 ? 0 : p == FloatPrecision::fp32 ? 32 : 16;
  e.kind = MethodKind::float_format;
  e.reference = p == FloatPrecision::fp64;
  e.doc = "docs/softmax-reference.md";  // §6 for the three low-precision formats
  // Eigen's float GEMMs give the same element wherever a block of 64 rows starts (the registry property suite checks
  // it, under qemu too); fp64's products (fp64_product.h) give it wherever any block starts.
  e.traits = fixed_traits(
      {.row_shift_invariant = true, .key_order_tolerance = key_order, .kv_bits = bits, .query_block_rows = 64});
  return e;
}

}  // namespace

void register_float_methods(Registry& registry) {
  registry.add(float_entry(FloatPrecision::fp64, "double-precision reference: max-subtracted softmax, pairwise sum"));
  registry.add(float_entry(FloatPrecision::fp32, "binary32 arithmetic throughout"));
  registry.add(float_entry(FloatPrecision::fp16,
                           "binary16 storage (RNE) of inputs, GEMM outputs and softmax output; fp32 arithmetic"));
  registry.add(float_entry(FloatPrecision::bf16,
                           "bfloat16 storage (RNE) of inputs, GEMM outputs and softmax output; fp32 arithmetic"));
}

}  // namespace qattn::ref
