// The "exaq" method: EXAQ in the registry, with the paper and upstream presets.
#include <mutex>

#include "qattn/error.h"
#include "qattn/reference/exaq.h"
#include "qattn/reference/method_entries.h"

namespace qattn::ref {
namespace {

// In attention, one call (one [L_q, L_k] logit matrix) is one scope for sigma=tensor.
class ExaqMethod final : public SoftmaxModelMethod {
 public:
  ExaqMethod(ExaqParams p, int calib_calls) : p_(p), calibrator_(calib_calls), calibrate_(calib_calls > 0) {}
  RowMatrixXd softmax_rows_impl(const MatrixView& logits) const override {
    if (!calibrate_) return exaq_softmax(logits, p_);
    std::lock_guard<std::mutex> lock(mu_);  // calibration state is shared by the calls of this instance
    return exaq_softmax(logits, p_, nullptr, &calibrator_);
  }

 protected:
  // sigma=tensor without calibration: sigma and min of the call's max-subtracted logits, in two passes (the sum and
  // minimum, then the deviations from the mean), each over the rows in order as exaq_stats sums them.
  std::unique_ptr<LogitScope> logit_scope() const override {
    class Sigma final : public LogitScope {
     public:
      explicit Sigma(const ExaqParams& p) : p_(p) {}
      int passes() const override { return 2; }
      void observe(int pass, const RowMatrixXd& logits) override {
        if (pass == 0) return stats_.add_first(exaq_max_subtracted(logits));
        if (!second_) stats_.begin_second(), second_ = true;
        stats_.add_second(exaq_max_subtracted(logits));
      }
      RowMatrixXd softmax_rows(const MatrixView& logits) const override {
        const ExaqTensorScope scope{stats_.stats(), stats_.rows()};
        return exaq_softmax(logits, p_, nullptr, nullptr, &scope);
      }

     private:
      ExaqParams p_;
      ExaqStatsAccumulator stats_;
      bool second_ = false;
    };
    if (calibrate_ || p_.scope != ExaqScope::tensor) return nullptr;
    return std::make_unique<Sigma>(p_);
  }

 private:
  ExaqParams p_;
  mutable ExaqCalibrator calibrator_;
  mutable std::mutex mu_;
  bool calibrate_;
};

constexpr Choice<ExaqClip> kClips[] = {{"gauss", ExaqClip::gauss}, {"laplace", ExaqClip::laplace},
                                       {"optimal", ExaqClip::optimal}, {"eq14", ExaqClip::eq14},
                                       {"fixed", ExaqClip::fixed},     {"none", ExaqClip::none}};
constexpr Choice<ExaqScope> kScopes[] = {{"tensor", ExaqScope::tensor}, {"row", ExaqScope::row}};
constexpr Choice<ExaqGrid> kGrids[] = {{"upstream", ExaqGrid::upstream}, {"paper", ExaqGrid::paper}};
constexpr Choice<bool> kXhat[] = {{"fp", false}, {"bf16", true}};  // x^ rounded to bfloat16
constexpr Choice<ExaqSum> kSums[] = {{"fp", ExaqSum::fp}, {"q24", ExaqSum::q24_direct}, {"lutsum", ExaqSum::q24_lutsum}};

}  // namespace

void register_exaq_method(Registry& registry) {
  MethodEntry e;
  e.name = "exaq";
  e.summary = "EXAQ: max-subtracted logits clipped (sigma rule) and quantised to 2-4 bits, exp by a 2^b LUT, FP normalisation";
  e.params = {
      {"bits", ParamType::integer, "2", "quantisation bits of x = s - rowmax", {}, 2, 4},
      {"clip", ParamType::choice, "gauss", "clip rule: gauss (Table 1 at 2-3 bits, the official code's line at 4), laplace (the official code's lines), optimal (ACIQ-style error on x), eq14 (Eq. 14 as printed, error after exp), fixed (c=), none (NAIVE)",
       choice_names(kClips)},
      {"c", ParamType::real, "-4", "the clip for clip=fixed", {}, -1e6, -1e-9},
      {"sigma", ParamType::choice, "tensor", "scope of sigma and min: the whole call (upstream) or each row", choice_names(kScopes)},
      {"grid", ParamType::choice, "upstream", "upstream: [max(min,C), 0] with both ends, RNE; paper: step -C/2^b, midpoints",
       choice_names(kGrids)},
      {"xhat", ParamType::choice, "fp", "x^ before exp: fp, or rounded to bf16 (upstream casts to the model dtype)",
       choice_names(kXhat)},
      {"sum", ParamType::choice, "fp", "denominator: fp; q24 (fixed-point LUT values); lutsum (q24 via packed LUT_sum)",
       choice_names(kSums)},
      {"calib", ParamType::integer, "0", "calibrate: mean C and min over the first N calls, then frozen (0 = off)", {}, 0, 100000},
  };
  e.presets = {
      {"upstream", {{"grid", "upstream"}, {"sigma", "tensor"}, {"clip", "gauss"}, {"xhat", "bf16"}, {"sum", "fp"}},
       "the official code: tensor sigma, Table 1 clip, both-ends grid, bf16 x^, FP exp and sum"},
      {"paper", {{"grid", "paper"}, {"sigma", "tensor"}, {"clip", "gauss"}, {"xhat", "fp"}, {"sum", "lutsum"}},
       "as printed: step -C/2^b with midpoints, LUT_exp and LUT_sum"},
  };
  e.make = [](const ParamMap& m) -> std::unique_ptr<Method> {
    ExaqParams p;
    p.bits = static_cast<int>(m.integer("bits"));
    p.clip = choice_value(m, "clip", kClips);
    if (p.clip == ExaqClip::laplace && p.bits == 3)
      throw SpecError("method 'exaq': the official code has Laplace clip lines for 2 and 4 bits only (bits=3 has none)");
    p.fixed_c = m.real("c");
    p.scope = choice_value(m, "sigma", kScopes);
    p.grid = choice_value(m, "grid", kGrids);
    p.xhat_bf16 = choice_value(m, "xhat", kXhat);
    p.sum = choice_value(m, "sum", kSums);
    const int calib = static_cast<int>(m.integer("calib"));
    if (calib > 0 && p.scope != ExaqScope::tensor) throw SpecError("method 'exaq': calib needs sigma=tensor");
    return std::make_unique<ExaqMethod>(p, calib);
  };
  e.overflow = OverflowRule::refuse;
  e.overflow_note =
      "logits scale * q k^T in float64; logits beyond its range (+inf), or spread so wide (~1e154) that their "
      "standard deviation overflows, are refused";
  e.kind = MethodKind::softmax_model;
  e.doc = "docs/methods/exaq.md";
  // sigma=tensor (and calib) take sigma and min over the whole call: rows then depend on each other, and a masked
  // key's logit still counts in them.
  // sigma=tensor: sigma and min in prepare()'s first passes. With calib, the first `calib` calls set the frozen C and
  // min: calls run whole, in order.
  e.traits = [](const ParamMap& m) {
    const bool calibrated = m.integer("calib") > 0;
    const bool per_row = choice_value(m, "sigma", kScopes) == ExaqScope::row && !calibrated;
    return MethodTraits{.rows_independent = per_row,
                        .key_order_tolerance = 1e-12,
                        .masked_keys_dropped = per_row,
                        .query_block_rows = calibrated ? 0 : 64,
                        .calls_in_order = calibrated};
  };
  registry.add(std::move(e));
}

}  // namespace qattn::ref
