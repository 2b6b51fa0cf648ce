// Integer attention pipelines as the papers' code computes them (docs/pipelines/quant-only.md,
// docs/pipelines/intattention.md). One call is one [L, d] matrix per tensor ("per-tensor" = one scale per call).
#pragma once

#include "qattn/method.h"
#include "qattn/quantize.h"
#include "qattn/reference/index_softmax.h"

namespace qattn::ref {

// x ~= scale * values, values in [-127, 127].
struct Int8Matrix {
  RowMatrixXi32 values;
  double scale = 1;
};

// Symmetric per-tensor INT8: s = max|x| / 127 (s = 1 for an all-zero tensor, so every code is 0),
// q = clamp(round_half_even(x / s), -127, 127), all in double.
Int8Matrix quantize_symmetric_int8(const MatrixView& x, Int8Rounding rounding = Int8Rounding::rne);

// a b^T, exact; throws std::overflow_error if a result leaves int32. B = max|a| max|b| (columns of a) bounds every
// partial sum in any order: below 2^24 Eigen's float GEMM on the values computes the exact integers (every partial
// sum, fused or not, is an integer float holds), below 2^31 its double GEMM; beyond, int64 sums with the check.
RowMatrixXi32 int_matmul_abt(const RowMatrixXi32& a, const RowMatrixXi32& b);
// A B^T for one whole A and B, then taken a block of A's rows at a time (a prepared call's Q^ K^T; the results are
// int_matmul_abt's, exact). The path (float, double or int64 sums) is chosen once from max|A| and max|B|, and the
// object holds its own copies in the types the path reads: A as int8 where every code fits (else int32), B as float,
// double or int32. So the caller may release its codes after construction (O(L d) held per head, docs/streaming.md).
// rows() may run on several threads at once.
class IntMatmulAbt {
 public:
  IntMatmulAbt(const RowMatrixXi32& a, const RowMatrixXi32& b);
  // rows [r0, r0 + n) of A B^T; an entry outside int32 is refused with std::overflow_error, as int_matmul_abt does
  RowMatrixXi32 rows(Eigen::Index r0, Eigen::Index n) const;

 private:
  using RowMatrixXi8 = Eigen::Matrix<std::int8_t, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  int path_ = 0;  // 0 float, 1 double, 2 int64
  bool a_int8_ = true;
  RowMatrixXi8 a8_;
  RowMatrixXi32 a32_, b32_;  // a32_ where A does not fit int8; b32_ on the int64 path
  RowMatrixXf bf_;
  RowMatrixXd bd_;
};
// a b, exact, returned as doubles. B = (max over rows of a of sum |a_it|) max|b| bounds every partial sum of every
// entry in any order: the float GEMM below 2^24, the double GEMM below 2^53, else int64 sums.
RowMatrixXd int_matmul_ab(const RowMatrixXi32& a, const RowMatrixXi32& b);
// int_matmul_ab(a, b) for one b and many a (a prepared call's P V): b is held as float where every entry is an
// integer float holds exactly (|b| <= 2^24), else as int32; the path is chosen per a, as int_matmul_ab does, and
// the results are its results. operator() may run on several threads at once.
class IntMatmulAb {
 public:
  explicit IntMatmulAb(const RowMatrixXi32& b);
  RowMatrixXd operator()(const RowMatrixXi32& a) const;

 private:
  std::int64_t b_max_ = 0;  // max |b|
  RowMatrixXf bf_;
  RowMatrixXi32 b32_;  // where b does not fit float
};

// The float softmax inside Quant-Only: softmax_ref<float> (std::exp, pairwise sum), or the fast path's
// softmax_row_lanes16 (qattn/exp_f32.h: one documented exp and the 16-lane sum order), for a bit-exact ladder.
enum class QuantOnlySoftmax { reference, lanes16 };

// Quant-Only INT8 (IntAttention's baseline): INT8 Q, K, V; INT32 Q K^T; S = fl32(A) * fl32(sQ sK scale);
// P = softmax(S) in float; P8 = round_half_even(fl32(127 P)) as INT8; INT32 P8 V; O = fl32(P8 V * sV / 127).
AttentionResult quant_only_attention(const MatrixView& q, const MatrixView& k, const MatrixView& v, double scale,
                                     const AttentionMask& mask,
                                     QuantOnlySoftmax softmax = QuantOnlySoftmax::reference);
// The same call prepared (Method::prepare): the codes and scales of Q, K and V over the whole tensors first, then any
// block of query rows. quant_only_attention is this with one block of every row, so the two agree by construction.
std::unique_ptr<PreparedCall> prepare_quant_only(const MatrixView& q, const MatrixView& k, const MatrixView& v,
                                                 double scale, const AttentionMask& mask, QuantOnlySoftmax softmax);

// How c_int is evaluated from the scales: in double as c / (sQ sK scale), or as the official simulation does,
// ((c / sQ) / sK) / scale in float32, before the CintRounding rule.
enum class CintEvaluation { f64, f32_upstream };

// IntAttention's integer clip for a Q scale s_Q, a K scale s_K and the logit scale: c_int = rounding(c / alpha) with
// alpha = s_Q s_K scale in float64 (f64), or ((c / s_Q) / s_K) / scale in float32 (f32_upstream), then
// params.cint_rounding. An alpha (or c / alpha in float32) that is not a finite number > 0 is refused with an
// InputError (OverflowRule::refuse, docs/non-finite.md). The reference model and the fused engine both call this.
std::int64_t intattention_cint(double s_q, double s_k, double scale, const IndexSoftmaxParams& params,
                               CintEvaluation cint_eval);

// Scale groups of the group-wise IntAttention variant (docs/pipelines/intattention.md, "Group-wise scales" and
// "Group-wise clipping").
enum class VGroup {
  tensor,     // one V scale per call
  channel,    // one per column of V: O[:, c] = fl32(sum_j P V[:, c] s_V,c / s_P)
  key_block,  // one per block of k_rows keys (needs k_rows > 0): O = fl32((sum_j fl64(P_j V_j) s_V^(j)) / s_P),
              // the sum in double over the blocks in key order
};
struct IntAttentionGroups {
  Eigen::Index q_rows = 0;  // Q scale per block of this many query rows (1 = per token); 0 = per tensor
  Eigen::Index k_rows = 0;  // K scale per block of this many keys, with Eq. 16-18 clipping per block; 0 = per tensor
  GroupMax group_max = GroupMax::global;  // the row maximum across key blocks (qattn/key_groups.h)
  VGroup v = VGroup::tensor;
};

// The per-block K quantisation and the clip of one query group, as the reference model and the engine build them.
struct KeyBlocks {
  Int8Matrix codes;             // K's codes, block by block; codes.scale is unused
  std::vector<double> scales;   // s_K^(j)
  std::vector<std::int64_t> ratios;  // rho_j (qattn/key_groups.h)
};
// K in blocks of `rows` keys, each quantised like quantize_symmetric_int8. Throws std::invalid_argument on rows < 1
// and, as key_group_ratios does, on a block scale too small next to the largest.
// The float32 overload gives the float64 one's codes and scales on the widened values (the fused engine quantises a
// caller's float32 K with it).
KeyBlocks quantize_key_blocks(const MatrixView& k, Eigen::Index rows, Int8Rounding rounding);
KeyBlocks quantize_key_blocks(const MatrixViewF& k, Eigen::Index rows, Int8Rounding rounding);
// The KeyGroupClip of a query group with scale s_q: c_int^(j) = intattention_cint(s_q, s_K^(j), ...) (Eq. 16 with
// the `cint` rule, so that equal block scales give the per-tensor c_int), and kappa for the offset reading.
KeyGroupClip key_group_clip(const KeyBlocks& k, Eigen::Index rows, double s_q, double scale,
                            const IndexSoftmaxParams& params, CintEvaluation cint_eval, GroupMax rule);

// IntAttention: INT8 Q, K, V (codes rounded by qround: Eq. 3 prints floor, the official simulation rounds half to
// even); INT32 A = Q K^T; c_int from alpha = sQ sK scale (per Q group); IndexSoftmax of A with the mask; INT32 P V;
// O = fl32(P V * sV / s_P) (sV of the channel's group). With groups.k_rows > 0, K is quantised per block of keys and
// IndexSoftmax clips per block (index_softmax_grouped).
AttentionResult int_attention(const MatrixView& q, const MatrixView& k, const MatrixView& v, double scale,
                              const AttentionMask& mask, const IndexSoftmaxParams& params, CintEvaluation cint_eval,
                              const IntAttentionGroups& groups = {}, Int8Rounding qround = Int8Rounding::rne);
// The same call prepared (Method::prepare): the codes and scales of Q (per tensor or query group), K (per tensor or
// key block) and V (per tensor, channel or key block) and every c_int first, then any block of query rows.
// int_attention is this with one block of every row.
std::unique_ptr<PreparedCall> prepare_int_attention(const MatrixView& q, const MatrixView& k, const MatrixView& v,
                                                    double scale, const AttentionMask& mask,
                                                    const IndexSoftmaxParams& params, CintEvaluation cint_eval,
                                                    const IntAttentionGroups& groups = {},
                                                    Int8Rounding qround = Int8Rounding::rne);

// The registry parameters of the two pipelines, parsed (a resolved ParamMap of "intattention" or "quant-only"): what
// the engine reads to decide whether the fused kernels run a spec.
struct IntAttentionSettings {
  IndexSoftmaxParams softmax;
  CintEvaluation cint_eval = CintEvaluation::f64;
  IntAttentionGroups groups;
  Int8Rounding qround = Int8Rounding::rne;
};
IntAttentionSettings intattention_settings(const ParamMap& params);
QuantOnlySoftmax quant_only_softmax(const ParamMap& params);

}  // namespace qattn::ref
