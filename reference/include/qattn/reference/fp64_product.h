// The float64 matrix products of the fp64 reference and of the softmax models' exact attention (Q K^T and P V),
// in one stated order (docs/softmax-reference.md, section 7).
//
// Every element is a sequential sum over the inner index, each product and each addition rounded once to nearest
// (no fused multiply-add):
//
//   c_ij = fl( ... fl( fl(a_i0 b_0j) + fl(a_i1 b_1j) ) + ... + fl(a_i,K-1 b_K-1,j) ),  starting from 0.
//
// The order belongs to the element alone: it does not depend on the instruction set (the x86-64 build carries an
// AVX2 and a baseline SSE2 copy of the kernel and runs the AVX2 one where the CPU has it; aarch64 runs NEON), on the
// cache sizes, or on which rows or columns are computed together. So a block of rows of the left operand gets the whole product's rows, bit for bit
// (streaming in blocks of query rows, docs/streaming.md), and every machine computes the same reference. Eigen's
// float64 GEMM guarantees neither: its blocking follows the L1 size it reads from the CPU and its row paths follow
// the vector width.
#pragma once

#include "qattn/tensor.h"

namespace qattn::ref {

// Which copy of the kernel runs: the widest this CPU has, or the baseline one (SSE2 on x86-64, NEON on aarch64),
// for checking that both give the same bits.
enum class ProductKernel { widest, baseline };

// C = A B: A [m, K], B [K, n].
RowMatrixXd product_ab(const MatrixView& a, const MatrixView& b, ProductKernel kernel = ProductKernel::widest);

// C = A B^T: A [m, K], B [n, K] (q k^T: both operands by rows). The same order over K as product_ab(A, B^T).
RowMatrixXd product_abt(const MatrixView& a, const MatrixView& b, ProductKernel kernel = ProductKernel::widest);

}  // namespace qattn::ref
