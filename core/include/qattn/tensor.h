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
using RowMatrixXf = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using RowMatrixXi32 = Eigen::Matrix<std::int32_t, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using RowMatrixXb = Eigen::Matrix<bool, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// A read-only view of a row-major float64 matrix: a RowMatrixXd, a block of whole rows, or a buffer that someone else
// owns, such as a C-contiguous NumPy array mapped with Eigen::Map. Methods take their inputs as views, so a caller's
// buffer reaches them without a copy (an Eigen expression is evaluated once into storage the view owns). Rows are
// contiguous (inner stride 1); the row stride is outerStride(), which equals cols() for everything but a block of
// some columns: code that walks data() uses packed_rows() to be sure.
using MatrixView = Eigen::Ref<const RowMatrixXd>;

// The same for float32 inputs: a caller's float32 buffer, given to the float32 entries of Method (softmax_rows,
// attention_heads; qattn/method.h says which methods read float32 as it is and which widen it).
using MatrixViewF = Eigen::Ref<const RowMatrixXf>;

// x's data() as packed rows (row stride = cols): x itself, or a packed copy of it in `storage`.
const double* packed_rows(const MatrixView& x, RowMatrixXd& storage);
const float* packed_rows(const MatrixViewF& x, RowMatrixXf& storage);

// A read-only view of packed row-major integer logits that someone else owns (IntegerLogits::values): int32, int16 or
// int8, so that a caller's buffer of any of them is read as it is (a C-contiguous NumPy array mapped with its shape,
// or a RowMatrixXi32 that outlives the view). It cannot be made from a temporary matrix, which would leave it
// dangling. The integer models compute on int32 rows: row() hands them the caller's row itself when it holds int32,
// else that one row widened (exactly) into a buffer the caller gives.
class IntMatrixView {
 public:
  // NOLINTNEXTLINE(google-explicit-constructor)
  IntMatrixView(const RowMatrixXi32& m) : IntMatrixView(m.data(), m.rows(), m.cols()) {}
  IntMatrixView(RowMatrixXi32&& m) = delete;
  IntMatrixView(const std::int32_t* data, Eigen::Index rows, Eigen::Index cols)
      : IntMatrixView(DType::i32, data, rows, cols) {}
  IntMatrixView(const std::int16_t* data, Eigen::Index rows, Eigen::Index cols)
      : IntMatrixView(DType::i16, data, rows, cols) {}
  IntMatrixView(const std::int8_t* data, Eigen::Index rows, Eigen::Index cols)
      : IntMatrixView(DType::i8, data, rows, cols) {}

  Eigen::Index rows() const { return rows_; }
  Eigen::Index cols() const { return cols_; }
  DType dtype() const { return dtype_; }   // i32, i16 or i8
  const void* data() const { return data_; }
  std::int32_t operator()(Eigen::Index r, Eigen::Index c) const;
  // Row r as int32 values: a pointer into the viewed buffer (int32), or into `scratch`, resized and filled.
  const std::int32_t* row(Eigen::Index r, std::vector<std::int32_t>& scratch) const;

 private:
  IntMatrixView(DType dtype, const void* data, Eigen::Index rows, Eigen::Index cols)
      : dtype_(dtype), data_(data), rows_(rows), cols_(cols) {}
  DType dtype_;
  const void* data_;
  Eigen::Index rows_, cols_;
};

// Views of each matrix of `m` (the heads of one layer), which must outlive them.
std::vector<MatrixView> views(const std::vector<RowMatrixXd>& m);
std::vector<MatrixViewF> views(const std::vector<RowMatrixXf>& m);

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

// How many leading entries of x are finite: x.size() when all are. A float is finite iff its exponent field is not
// all ones, that is iff (bits & 0x7fff'ffff) < 0x7f80'0000 (0x7fff'ffff'ffff'ffff and 0x7ff0'0000'0000'0000 for
// double); the scan takes the integer maximum of those masked bits over blocks of 256 entries, 16 running maxima that
// the compiler vectorises at the baseline ISA, and looks for the index only inside a block that fails. It reads each
// entry once, so it runs at memory speed (the inputs of every attention call pass through it).
std::size_t finite_prefix(std::span<const float> x);
std::size_t finite_prefix(std::span<const double> x);

}  // namespace qattn
