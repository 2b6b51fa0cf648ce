// The batched product from a user's arrays (qattn mma, qattn.mma): their shapes, scale codes and C checked against a
// model, one set of checks for both front ends, then D = A Bt^T + C per batch entry by mma_matmul (mma.cc).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <tuple>

#include "qattn/error.h"
#include "qattn/reference/mma.h"
#include "qattn/tensor.h"

namespace qattn::ref {
namespace {

std::string shape_text(std::span<const std::int64_t> shape) {
  return Tensor{DType::u8, {shape.begin(), shape.end()}, {}}.shape_string();
}

// The element count of `shape`: 0 when a dimension is 0 (whatever the others are), nullopt when the product of
// non-zero dimensions overflows size_t.
std::optional<std::size_t> element_count(std::span<const std::int64_t> shape) {
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return 0;
  std::size_t n = 1;
  for (std::int64_t d : shape)
    if (__builtin_mul_overflow(n, static_cast<std::size_t>(d), &n)) return std::nullopt;
  return n;
}

}  // namespace

void mma_check_depth(const MmaModel& m, const MmaShape& shape, const std::string& a_source) {
  if (m.partition == MmaPartition::k_mod4_pairs && shape.depth % 4 != 0)
    throw InputError(a_source, "shape",
                     "K = " + std::to_string(shape.depth) + " (the last axis) is not a multiple of 4, which model " +
                         m.name + " needs: it adds the products in pairs by k mod 4");
  if (m.scale_block > 0 && shape.depth % static_cast<std::size_t>(m.scale_block) != 0)
    throw InputError(a_source, "shape",
                     "K = " + std::to_string(shape.depth) + " (the last axis) is not a multiple of " +
                         std::to_string(m.scale_block) + ", model " + m.name + "'s scale block: one " +
                         mma_scale_name(m.scale) + " scale code per " + std::to_string(m.scale_block) + " k");
}

std::vector<std::uint8_t> mma_scales(const MmaModel& m, const MmaShape& s, bool is_bt, bool given,
                                     std::string_view dtype, std::span<const std::int64_t> shape, const void* data,
                                     const std::string& source) {
  const char* what = is_bt ? "SBt [..., N, K/block]" : "SA [..., M, K/block]";
  if (m.scale == MmaScale::none) {
    if (given)
      throw InputError(source, is_bt ? "--scale-bt" : "--scale-a",
                       "model " + m.name + " takes no block scales (" + m.describe() + ")");
    return {};
  }
  const std::string block = std::to_string(m.scale_block);
  if (!given)
    throw InputError(source, is_bt ? "--scale-bt" : "--scale-a",
                     std::string("missing: model ") + m.name + " takes " + what + ", one " + mma_scale_name(m.scale) +
                         " code (uint8) per block of " + block + " k");
  if (dtype != "uint8")
    throw InputError(source, "dtype", std::string(dtype) + ": expected uint8 " + mma_scale_name(m.scale) + " codes");
  std::vector<std::int64_t> want(s.d.begin(), s.d.end() - 2);
  want.push_back(static_cast<std::int64_t>(is_bt ? s.cols : s.rows));
  want.push_back(static_cast<std::int64_t>(s.depth / static_cast<std::size_t>(m.scale_block)));
  if (!std::equal(shape.begin(), shape.end(), want.begin(), want.end()))
    throw InputError(source, "shape", shape_text(shape) + ": expected " + what + " = " + shape_text(want) +
                                          ", one scale per block of " + block + " k (K = " + std::to_string(s.depth) +
                                          ")");
  std::vector<std::uint8_t> codes(static_cast<std::size_t>(s.batch) * (is_bt ? s.cols : s.rows) *
                                  (s.depth / static_cast<std::size_t>(m.scale_block)));
  if (!codes.empty()) std::memcpy(codes.data(), data, codes.size());
  return codes;
}

MmaShape mma_shape(std::span<const std::int64_t> a, std::span<const std::int64_t> bt, const std::string& a_source,
                   const std::string& bt_source) {
  for (const auto& [shape, source, what] : {std::tuple{a, &a_source, "A [..., M, K]"},
                                            std::tuple{bt, &bt_source, "Bt [..., N, K]"}}) {
    if (shape.size() < 2)
      throw InputError(*source, "shape", shape_text(shape) + " has " + std::to_string(shape.size()) + " dimension" +
                                             (shape.size() == 1 ? "" : "s") + ": " + what +
                                             " needs 2 or more");
    if (std::any_of(shape.begin(), shape.end(), [](std::int64_t d) { return d < 0; }))
      throw InputError(*source, "shape", shape_text(shape) + " has a negative dimension");
  }
  const std::size_t rank = a.size();
  if (bt.size() != rank || !std::equal(a.begin(), a.end() - 2, bt.begin()) || bt.back() != a.back())
    throw InputError(bt_source, "shape", shape_text(bt) + " does not fit A " + shape_text(a) +
                                             ": expected [..., N, K] with A's leading dimensions and K = " +
                                             std::to_string(a.back()));
  MmaShape s;
  s.rows = static_cast<std::size_t>(a[rank - 2]);
  s.depth = static_cast<std::size_t>(a[rank - 1]);
  s.cols = static_cast<std::size_t>(bt[rank - 2]);
  s.d.assign(a.begin(), a.end() - 2);
  s.d.push_back(a[rank - 2]);
  s.d.push_back(bt[rank - 2]);
  const std::string both = "A " + shape_text(a) + " and Bt " + shape_text(bt) + " give D " + shape_text(s.d);
  const std::string bound = "the bound of " + std::to_string(kMmaMaxOutputBytes) + " bytes (1 GiB, docs/mma.md)";
  const std::optional<std::size_t> outputs = element_count(s.d);
  std::size_t bytes = 0;
  if (!outputs || __builtin_mul_overflow(*outputs, sizeof(float), &bytes))
    throw InputError(a_source, "shape", both + ": more than 2^64 bytes of float32 outputs, beyond " + bound);
  if (bytes > kMmaMaxOutputBytes)
    throw InputError(a_source, "shape", both + ": " + std::to_string(bytes) + " bytes of float32 outputs, beyond " +
                                            bound);
  if (!element_count(a) || !element_count(bt))  // a file or an array holding them could not exist
    throw InputError(!element_count(a) ? a_source : bt_source, "shape",
                     both + ": the element count of " + (!element_count(a) ? "A" : "Bt") + " overflows");
  for (const auto& [shape, source, name] : {std::tuple{a, &a_source, "A"}, std::tuple{bt, &bt_source, "Bt"}})
    if (const std::size_t n = *element_count(shape); n > kMmaMaxOperandElements)
      throw InputError(*source, "shape", both + ": " + name + " holds " + std::to_string(n) +
                                             " elements, beyond the bound of " +
                                             std::to_string(kMmaMaxOperandElements) + " (2^30, docs/mma.md)");
  s.outputs = *outputs;
  const std::optional<std::size_t> batch = element_count(a.first(rank - 2));
  s.batch = batch ? *batch : 0;  // overflows only when M or N is 0: D is empty and nothing is computed
  return s;
}

std::vector<float> mma_accumulator(const MmaModel& m, const MmaShape& s, std::string_view dtype,
                                   std::span<const std::int64_t> shape, const void* data, const std::string& source) {
  const bool f16_acc = m.accumulator == MmaAccumulator::f16;
  if (dtype != "float32" && dtype != "float16")
    throw InputError(source, "dtype", std::string(dtype) + ": expected float32 or float16" +
                                          (f16_acc ? " (float16 values: " + m.name + " has an f16 accumulator)" : ""));
  if (!std::equal(shape.begin(), shape.end(), s.d.begin(), s.d.end()))
    throw InputError(source, "shape", shape_text(shape) + ": expected [..., M, N] = " + shape_text(s.d));
  std::vector<float> c(s.outputs);
  if (dtype == "float16") {
    for (std::size_t i = 0; i < c.size(); ++i) {
      std::uint16_t h;
      std::memcpy(&h, static_cast<const std::byte*>(data) + 2 * i, 2);
      c[i] = f16_bits_to_f32(h);
    }
    return c;
  }
  if (!c.empty()) std::memcpy(c.data(), data, 4 * c.size());
  if (f16_acc)
    for (std::size_t i = 0; i < c.size(); ++i)
      if (std::isfinite(c[i]) &&
          lowp_round(c[i], fp16_binary16(), LowpRounding::rne, LowpOverflow::non_saturating) != c[i]) {
        std::ostringstream why;
        why << std::setprecision(9) << c[i] << " is not a float16 value, and " << m.name
            << " has an f16 accumulator (round C to float16 first)";
        throw InputError(source, "element " + std::to_string(i), why.str());
      }
  return c;
}

void mma_batched(const MmaModel& m, const MmaShape& s, std::span<const std::uint16_t> a,
                 std::span<const std::uint16_t> bt, std::span<const float> c, std::span<float> d,
                 std::span<const std::uint8_t> sa, std::span<const std::uint8_t> sbt) {
  if (s.outputs == 0) return;
  const std::size_t blocks = m.scale_block > 0 ? s.depth / static_cast<std::size_t>(m.scale_block) : 0;
  const std::size_t mk = s.rows * s.depth, nk = s.cols * s.depth, mn = s.rows * s.cols, ms = s.rows * blocks,
                    ns = s.cols * blocks;
  if (a.size() != s.batch * mk || bt.size() != s.batch * nk || d.size() != s.outputs ||
      (!c.empty() && c.size() != s.outputs) || sa.size() != s.batch * ms || sbt.size() != s.batch * ns)
    throw std::invalid_argument("mma_batched: the sizes of A, Bt, C, D and the scales do not match the shape");
  for (std::size_t t = 0; t < s.batch; ++t)
    mma_matmul(m, a.subspan(t * mk, mk), bt.subspan(t * nk, nk), c.empty() ? c : c.subspan(t * mn, mn),
               d.subspan(t * mn, mn), s.rows, s.cols, s.depth, sa.subspan(t * ms, ms), sbt.subspan(t * ns, ns));
}

}  // namespace qattn::ref
