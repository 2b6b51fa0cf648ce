// A dense n-dimensional tensor as read from or written to a file: element type, shape, and the elements in
// C (row-major) order, stored in native byte order. Values are widened to double for analysis; double holds
// every value of every supported dtype exactly except int64 magnitudes above 2^53 (see to_double()).
#pragma once

#include <Eigen/Core>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "qattn/dtype.h"

namespace qattn {

// Row-major dynamic matrix of doubles: the layout used for rows of logits and probabilities.
using RowMatrixXd = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using RowMatrixXi32 = Eigen::Matrix<std::int32_t, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using RowMatrixXb = Eigen::Matrix<bool, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// A read-only view of a row-major float64 matrix: a RowMatrixXd, a block of whole rows, or a buffer that someone else
// owns, such as a C-contiguous NumPy array mapped with Eigen::Map. Methods take their inputs as views, so a caller's
// buffer reaches them without a copy (an Eigen expression is evaluated once into storage the view owns). Rows are
// contiguous (inner stride 1); the row stride is outerStride(), which equals cols() for everything but a block of
// some columns: code that walks data() uses packed_rows() to be sure.
using MatrixView = Eigen::Ref<const RowMatrixXd>;

// x's data() as packed rows (row stride = cols): x itself, or a packed copy of it in `storage`.
const double* packed_rows(const MatrixView& x, RowMatrixXd& storage);

// A read-only view of packed row-major int32 values that someone else owns (IntegerLogits::values): a RowMatrixXi32
// that outlives the view, or a buffer mapped with its shape (a C-contiguous NumPy int32 array). It cannot be made from
// a temporary matrix, which would leave it dangling.
class IntMatrixView : public Eigen::Map<const RowMatrixXi32> {
 public:
  using Base = Eigen::Map<const RowMatrixXi32>;
  IntMatrixView(const RowMatrixXi32& m) : Base(m.data(), m.rows(), m.cols()) {}  // NOLINT(google-explicit-constructor)
  IntMatrixView(RowMatrixXi32&& m) = delete;
  IntMatrixView(const std::int32_t* data, Eigen::Index rows, Eigen::Index cols) : Base(data, rows, cols) {}
};

// Views of each matrix of `m` (the heads of one layer), which must outlive them.
std::vector<MatrixView> views(const std::vector<RowMatrixXd>& m);

struct Tensor {
  DType dtype = DType::f32;
  std::vector<std::int64_t> shape;   // empty shape = scalar (one element)
  std::vector<std::byte> bytes;      // element_count() * dtype_size(dtype) bytes, native endian, C order

  std::int64_t element_count() const;
  // Every element converted to double (exact for all dtypes but int64 beyond +-2^53, which rounds to nearest).
  Eigen::ArrayXd to_double() const;
  // The tensor as a matrix whose rows run over the last axis: [prod(shape[:-1]), shape[-1]].
  // A 0-d or 1-d tensor is one row. Throws std::invalid_argument for a last axis of size 0 with rows > 0.
  RowMatrixXd as_rows() const;

  std::string shape_string() const;  // "(8, 128, 64)"

  // Builds a tensor of `dtype` from doubles. Floats round to nearest-even (through the dtype's own conversion);
  // integers must be exactly representable: a non-integral or out-of-range value throws std::domain_error.
  static Tensor from_double(DType dtype, std::vector<std::int64_t> shape, std::span<const double> values);
};

// Bit-level conversions for the two 16-bit float formats, round-to-nearest-even, NaN kept quiet.
std::uint16_t f32_to_f16_bits(float x);
float f16_bits_to_f32(std::uint16_t h);
std::uint16_t f32_to_bf16_bits(float x);
float bf16_bits_to_f32(std::uint16_t h);

}  // namespace qattn
