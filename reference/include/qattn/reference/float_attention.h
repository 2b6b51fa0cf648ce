// Floating-point attention and softmax at fp64, fp32, fp16 and bf16 (docs/softmax-reference.md, "FP methods").
//
// fp64 computes everything in double with no rounding beyond double's own: it is the reference of the error
// tables. fp32 computes everything in float. fp16 and bf16 emulate a GPU / NEON FP16 pipeline with fp32
// arithmetic and 16-bit storage; values are rounded to the 16-bit format (round-to-nearest-even, overflow to
// inf) at exactly these points, and nowhere else:
//   R1  the inputs: logits (softmax), or Q, K, V (attention);
//   R2  the GEMM output S = fl32(fl32(Q K^T) * fl32(scale)) (attention only; Q K^T accumulated in fp32);
//   R3  the softmax output P = softmax_ref<float>(S);
//   R4  the GEMM output O = fl32(P V) (attention only; accumulated in fp32).
// The fp32 accumulation order is Eigen's GEMM order; it is not part of the contract.
#pragma once

#include <string_view>

#include "qattn/method.h"
#include "qattn/tensor.h"

namespace qattn::ref {

enum class FloatPrecision { fp64, fp32, fp16, bf16 };

std::string_view precision_name(FloatPrecision p);

// Every entry rounded to the storage format of `p` (identity for fp64), returned as the exact double value.
RowMatrixXd round_to_storage(const MatrixView& m, FloatPrecision p);

RowMatrixXd float_softmax_rows(const MatrixView& logits, FloatPrecision p);
// The same on float32 logits, read as they are: fp32, fp16 and bf16 round them to storage (R1) straight from float32,
// fp64 widens them first. The bits of the float64 overload on the widened values, which float32 widens to exactly.
RowMatrixXd float_softmax_rows(const MatrixViewF& logits, FloatPrecision p);
// Masked pairs get logit -inf before the softmax (after R2), so they contribute exactly 0.
// fp64 only: `logits`, where given, receives the masked logits (q k^T) * scale the softmax read, the ones a softmax
// model's PreparedCall::rows_from_logits takes.
AttentionResult float_attention(const MatrixView& q, const MatrixView& k, const MatrixView& v, double scale,
                                FloatPrecision p, const AttentionMask& mask = {}, RowMatrixXd* logits = nullptr);

}  // namespace qattn::ref
