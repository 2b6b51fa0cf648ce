// What the method files (reference/src/*/*_method.cc) share: the attention wrapper of a softmax model, the entry of
// a pipeline that runs on the one flash loop, fixed traits, and the parameters that more than one method takes
// (IndexSoftmax's, SAS's, the flash pipelines' output dtype and FP8 scaling). Each method file registers its entries
// with `void register_<file stem>(Registry&)`, which the build collects (reference/src/registry.cc).
#pragma once

#include <array>
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

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

// SAS's parameters as "sas" and "turbo" both take them: nr (n_r), poly (the cubic: paper, Eq. 15's coefficients
// kSasPaperPoly, or lsq, the continuous least-squares refit sas_lsq_poly) and half. sas_poly_names lists poly's
// choices. Defined in sas_method.cc.
struct SasParams;
std::vector<std::string> sas_poly_names();
SasParams sas_params(const ParamMap& m);

// Traits that do not depend on the parameters, written with designated initialisers so that each names what it
// declares: fixed_traits({.rows_independent = false, .kv_bits = 8}).
inline std::function<MethodTraits(const ParamMap&)> fixed_traits(MethodTraits t) {
  return [t](const ParamMap&) { return t; };
}

// Traits of a softmax model whose input grid follows the values (I-BERT's S, TFLite's int8 range), taken over the
// whole call or over each row (`per_row`): rows depend on each other unless per row, the tensor-wide range in
// prepare()'s first pass; masked logits (-inf) stay out of the range; P is integer per entry and O = P V in fp64.
inline MethodTraits value_grid_traits(bool per_row) {
  return {.rows_independent = per_row, .key_order_tolerance = 1e-12, .query_block_rows = 64};
}

// out= of the kernels whose output dtype is 16 bits: O rounded to it (true), or kept in float32 (false). bfloat16
// for fa3-fp8, fa4-fp8 and sage3, binary16 for sage1.
inline constexpr Choice<bool> kBf16Outputs[] = {{"bf16", true}, {"fp32", false}};
inline constexpr Choice<bool> kFp16Outputs[] = {{"fp16", true}, {"fp32", false}};
// The parameter out= over one of those tables, the kernel's dtype (the table's first name) its default.
inline ParamInfo output_dtype_param(const Choice<bool> (&outputs)[2], std::string doc) {
  return {"out", ParamType::choice, outputs[0].name, std::move(doc), choice_names(outputs)};
}
inline bool output_rounded(const ParamMap& m, const Choice<bool> (&outputs)[2]) {
  return choice_value(m, "out", outputs);
}

// scale= of the FP8 flash pipelines (fa3-fp8, fa4-fp8): Q, K, V to E4M3 with a descale amax/448 per tensor (amax,
// true), or cast as they are with descale 1 (none, false); and the overflow note that follows from it.
inline constexpr Choice<bool> kE4m3Scalings[] = {{"amax", true}, {"none", false}};
inline ParamInfo e4m3_scale_param(std::string doc) {
  return {"scale", ParamType::choice, "amax", std::move(doc), choice_names(kE4m3Scalings)};
}
inline bool e4m3_amax_scaling(const ParamMap& m) { return choice_value(m, "scale", kE4m3Scalings); }
inline constexpr char kE4m3InputsOverflowNote[] =
    "Q, K, V read as float32 and E4M3 (scale=none refuses |x| >= 464); S s2 beyond float32 is refused";

// The entry of an attention pipeline that is a description for the one flash loop (flash_kernel.h): `kernel` builds
// the description from the resolved parameters (SpecError where they do not fit together); the method runs it
// (make_flash_method), its traits are the description's (flash_kernel_traits; so asking for the traits of parameters
// that do not fit together raises the same SpecError as building the method), and inputs or S beyond their formats
// are refused. The caller adds the name, summary, parameters, presets, overflow_note and doc. Defined in
// kernel_file_method.cc, beside the method of a description read from a file.
struct FlashKernel;
MethodEntry flash_pipeline_entry(std::function<FlashKernel(const ParamMap&)> kernel);

}  // namespace qattn::ref
