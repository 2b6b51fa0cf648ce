// What the method files (reference/src/*/*_method.cc) share: the attention wrapper of a softmax model, the entry of
// a pipeline that runs on the one flash loop, fixed traits, and the parameters IndexSoftmax and SAS bring to more than
// one method. Each method file registers its entries with `void register_<file stem>(Registry&)`, which the build
// collects (reference/src/registry.cc).
#pragma once

#include <array>
#include <cmath>
#include <functional>
#include <memory>

#include "qattn/method.h"
#include "qattn/reference/index_softmax.h"

namespace qattn::ref {

// A softmax model inside attention: exact fp64 logits scale * q k^T, the model's softmax_rows, exact fp64 P V. The
// attention table of such a method isolates its softmax approximation. Both products are fp64_product.h's, whose
// elements do not depend on which rows are computed together: a block of 64 query rows gets the whole call's rows
// (MethodTraits::query_block_rows) on every instruction set.

// The whole call's state of a softmax model whose rows depend on each other (a tensor-wide scale, EXAQ's tensor
// sigma), gathered from the call's logits one block of rows at a time. Every pass visits every row once, in row
// order, so a statistic summed in row order has the bits of the whole matrix's.
class LogitScope {
 public:
  virtual ~LogitScope() = default;
  virtual int passes() const { return 1; }
  // Rows of the call's logits (masked ones -inf), the next ones in row order, during pass `pass`.
  virtual void observe(int pass, const RowMatrixXd& logits) = 0;
  // The softmax of a block of the call's rows with the state of the whole call (after every pass).
  virtual RowMatrixXd softmax_rows(const MatrixView& logits) const = 0;
};

class SoftmaxModelMethod : public Method {
 public:
  AttentionResult attention_impl(const MatrixView& q, const MatrixView& k, const MatrixView& v, double scale,
                                 const AttentionMask& mask) const override;

 protected:
  // The tensor-wide state of this model's softmax, for prepare(); nullptr where its rows are independent (the
  // default prepare then runs attention() on each block).
  virtual std::unique_ptr<LogitScope> logit_scope() const { return nullptr; }
  std::unique_ptr<PreparedCall> prepare_impl(const MatrixView& q, const MatrixView& k, const MatrixView& v,
                                             double scale, const AttentionMask& mask) const override;
  // softmax_rows of a whole logit matrix through `scope`: every pass over it, then the softmax.
  static RowMatrixXd softmax_with_scope(LogitScope& scope, const MatrixView& logits);
};

// IndexSoftmax's parameters, presets and their parsing, shared by "index" and "intattention".
std::vector<ParamInfo> index_softmax_param_infos();
std::vector<PresetInfo> index_softmax_presets();
IndexSoftmaxParams index_softmax_params(const ParamMap& m);

// SAS's cubic, the choice `poly` of "sas" and "turbo": paper (Eq. 15's coefficients, kSasPaperPoly) or lsq (the
// continuous least-squares refit, sas_lsq_poly). Defined in sas_method.cc.
std::vector<std::string> sas_poly_names();
std::array<double, 4> sas_poly(const ParamMap& m);

// Traits that do not depend on the parameters, written with designated initialisers so that each names what it
// declares: fixed_traits({.rows_independent = false, .kv_bits = 8}).
inline std::function<MethodTraits(const ParamMap&)> fixed_traits(MethodTraits t) {
  return [t](const ParamMap&) { return t; };
}

// out= of the kernels whose output dtype is bfloat16: O rounded to it (true), or kept in float32 (false).
inline constexpr Choice<bool> kBf16Outputs[] = {{"bf16", true}, {"fp32", false}};

// The entry of an attention pipeline that is a description for the one flash loop (flash_kernel.h): `kernel` builds
// the description from the resolved parameters (SpecError where they do not fit together); the method runs it
// (make_flash_method), its traits are the description's (flash_kernel_traits; so asking for the traits of parameters
// that do not fit together raises the same SpecError as building the method), and inputs or S beyond their formats
// are refused. The caller adds the name, summary, parameters, presets, overflow_note and doc. Defined in
// kernel_file_method.cc, beside the method of a description read from a file.
struct FlashKernel;
MethodEntry flash_pipeline_entry(std::function<FlashKernel(const ParamMap&)> kernel);

}  // namespace qattn::ref
