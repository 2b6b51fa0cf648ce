// The "sas" method: TurboAttention's sparse-activated softmax in the registry.
#include "qattn/reference/method_entries.h"
#include "qattn/reference/sas.h"

namespace qattn::ref {
namespace {

class SasMethod final : public SoftmaxModelMethod {
 public:
  explicit SasMethod(SasParams p) : p_(p) {}
  RowMatrixXd softmax_rows_impl(const MatrixView& logits) const override { return sas_softmax_rows(logits, p_); }

 private:
  SasParams p_;
};

enum class SasPoly { paper, lsq };
constexpr Choice<SasPoly> kPolys[] = {{"paper", SasPoly::paper}, {"lsq", SasPoly::lsq}};

}  // namespace

std::vector<std::string> sas_poly_names() { return choice_names(kPolys); }

SasParams sas_params(const ParamMap& m) {
  SasParams p;
  p.n_r = m.real("nr");
  p.poly = choice_value(m, "poly", kPolys) == SasPoly::paper ? kSasPaperPoly : sas_lsq_poly();
  p.half = m.boolean("half");
  return p;
}

void register_sas_method(Registry& registry) {
  MethodEntry e;
  e.name = "sas";
  e.summary = "TurboAttention SAS: entries with x - max < nr dropped, e^-y = LUT[int y] * cubic POLY(frac y), FP normalisation";
  e.params = {
      {"nr", ParamType::real, "-6", "sparsity threshold n_r < 0 (paper setup -6; its text also mentions -5)", {}, -64, -1e-3},
      {"poly", ParamType::choice, "paper", "cubic: paper (Eq. 15 coefficients) or lsq (continuous least-squares refit)",
       sas_poly_names()},
      {"half", ParamType::boolean, "false", "emulate binary16 LUT, POLY (Horner) and product, as the paper runs them"},
  };
  e.presets = {{"paper", {{"nr", "-6"}, {"poly", "paper"}, {"half", "true"}},
                "as the paper runs it: n_r = -6, Eq. 15 cubic, FP16 LUT and POLY (no official code exists)"}};
  e.make = [](const ParamMap& m) -> std::unique_ptr<Method> { return std::make_unique<SasMethod>(sas_params(m)); };
  e.overflow = OverflowRule::refuse;
  e.overflow_note = "logits scale * q k^T in float64; logits beyond its range (+inf) are refused";
  e.kind = MethodKind::softmax_model;
  e.doc = "docs/methods/sas.md";
  // y = max - x per row, row by row between the fp64 products; the FP sum reordered moves P by rounding (one
  // binary16 ulp with half=true).
  e.traits = [](const ParamMap& m) {
    return MethodTraits{.row_shift_invariant = true,
                        .key_order_tolerance = m.boolean("half") ? 0x1p-9 : 1e-12,
                        .query_block_rows = 64};
  };
  registry.add(std::move(e));
}

}  // namespace qattn::ref
