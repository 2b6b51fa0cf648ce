// The tensor-core MMA models (qattn/reference/mma.h) against what an H100 returned: every preset bit for bit on the
// embedded vectors (experiments/data/h100-mma), and on the whole measurement where it is present; the per-product FP22
// bound's measured distance from the hardware, as docs/mma.md states it.
#include <catch2/catch.hpp>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "qattn/error.h"
#include "qattn/reference/mma.h"
#include "qattn/reference/mma_vectors.h"
#include "qattn/tensor_io.h"
#include "support/test_scale.h"

namespace {

namespace fs = std::filesystem;
using qattn::ref::MmaModel;
using qattn::ref::MmaVectorSet;

const fs::path kEmbedded = fs::path(QATTN_SAMPLE_DATA) / "h100-mma";

// The whole measurement: $QATTN_H100_VECTORS, else ../shared/data/h100-fp8 beside the source tree.
std::optional<fs::path> full_vectors() {
  if (const char* v = std::getenv("QATTN_H100_VECTORS"); v != nullptr && *v != '\0') return fs::path(v);
  const fs::path shared = fs::path(QATTN_SHARED_DATA) / "h100-fp8";
  if (fs::is_directory(shared)) return shared;
  return std::nullopt;
}

// Which preset stands for which file, and which output variant of it ("" = every variant).
struct Stands {
  const char* file;
  const char* preset;
  const char* variant;
};
constexpr Stands kStands[] = {
    {"wgmma_cublaslt_e4m3", "h100-wgmma-e4m3", "fast"},
    {"wgmma_cublaslt_e4m3", "h100-wgmma-e4m3-promote", "default"},
    {"mma_sync_m16n8k32_e4m3", "h100-mma-e4m3", ""},
    {"mma_sync_m16n8k16_f16f32", "h100-hmma-f16", ""},
    {"mma_sync_m16n8k16_bf16f32", "h100-hmma-bf16", ""},
    {"mma_sync_m16n8k16_f16f16", "h100-hmma-f16-acc16", ""},
};

void check_bit_exact(const fs::path& file, const Stands& s) {
  const std::vector<MmaVectorSet> sets = qattn::ref::mma_vector_sets(qattn::read_tensor_file(file), file.string());
  const MmaModel& m = qattn::ref::mma_preset(s.preset);
  std::size_t checked = 0;
  for (const MmaVectorSet& set : sets) {
    if (*s.variant != '\0' && set.variant != s.variant) continue;
    const qattn::ref::MmaAgreement r = qattn::ref::mma_agreement(m, set);
    INFO(file.string() << ": " << s.preset << " on set " << set.name << " " << set.variant << ": " << r.equal << " of "
                       << r.outputs << " bit-equal, max rel. error " << r.max_rel_error);
    CHECK(r.outputs == set.batch * set.rows * set.cols);
    CHECK(r.equal == r.outputs);
    checked += r.outputs;
  }
  CHECK(checked > 0);
}

TEST_CASE("every H100 MMA preset reproduces the embedded H100 vectors bit for bit", "[mma][h100]") {
  for (const Stands& s : kStands) check_bit_exact(kEmbedded / (std::string(s.file) + ".safetensors"), s);
}

TEST_CASE("every preset that claims measured validation stands for an H100 vector file, and no other does", "[mma][h100]") {
  std::set<std::string> standing;
  for (const Stands& s : kStands) standing.insert(s.preset);
  for (const MmaModel& m : qattn::ref::mma_presets()) {
    INFO(m.name);
    CHECK((m.validated && m.measured) == (standing.count(m.name) == 1));
  }
}

TEST_CASE("every H100 MMA preset reproduces every vector of the whole measurement, where present", "[mma][h100]") {
  const std::optional<fs::path> dir = full_vectors();
  if (!dir) {
    WARN("the whole H100 measurement is not here (set QATTN_H100_VECTORS): the embedded subset only");
    return;
  }
  if (!qattn::have_npz()) {
    WARN("built without libzip: the .npz files of " << dir->string() << " cannot be read here");
    return;
  }
  for (const Stands& s : kStands) check_bit_exact(*dir / (std::string(s.file) + ".npz"), s);
}

TEST_CASE("the fast and promoting wgmma presets differ once K passes one promotion interval (128)", "[mma][h100]") {
  const fs::path file = kEmbedded / "wgmma_cublaslt_e4m3.safetensors";
  const std::vector<MmaVectorSet> sets = qattn::ref::mma_vector_sets(qattn::read_tensor_file(file), file.string());
  for (const MmaVectorSet& set : sets) {
    const MmaModel& other = qattn::ref::mma_preset(set.variant == "fast" ? "h100-wgmma-e4m3-promote" : "h100-wgmma-e4m3");
    const qattn::ref::MmaAgreement r = qattn::ref::mma_agreement(other, set);
    INFO(set.name << " " << set.variant << " under " << other.name << ": " << r.equal << " of " << r.outputs);
    if (set.depth <= 128) CHECK(r.equal == r.outputs);
    else CHECK(r.share() < 0.2);
  }
}

// Each rule of the fused step, on one hand-made dot product whose exact result the rule changes.
TEST_CASE("the fused step truncates each term toward zero below 2^(E - fraction bits), then the sum", "[mma]") {
  const MmaModel& wgmma = qattn::ref::mma_preset("h100-wgmma-e4m3");
  const MmaModel& fp22 = qattn::ref::mma_preset("per-product-fp22");
  const auto e4m3 = [](double v) { return static_cast<std::uint16_t>(qattn::ref::lowp_encode(v, qattn::ref::fp8_e4m3fn())); };
  // 1·1 + (-2^-9)·2^-6: E = 0, the second term (-2^-15) is below 2^-13 and truncates to 0, so D = 1; the per-product
  // bound rounds the exact 1 - 2^-15 toward zero onto 1 - 2^-14.
  const std::vector<std::uint16_t> a{e4m3(1), e4m3(-std::ldexp(1.0, -9))}, b{e4m3(1), e4m3(std::ldexp(1.0, -6))};
  CHECK(qattn::ref::mma_dot(wgmma, a, b, 0.0f) == 1.0f);
  CHECK(qattn::ref::mma_dot(fp22, a, b, 0.0f) == static_cast<float>(1 - std::ldexp(1.0, -14)));
  // 448·448 + 3·8: E = 16, both terms are multiples of 2^3 and kept; the sum 200728 needs 18 bits and keeps 14,
  // toward zero: 200720 (to nearest it would be 200736). And 448·448 + 1·1: the 1 is below 2^3 and truncates away.
  const std::vector<std::uint16_t> a2{e4m3(448), e4m3(3)}, b2{e4m3(448), e4m3(8)};
  CHECK(qattn::ref::mma_dot(wgmma, a2, b2, 0.0f) == 200720.0f);
  const std::vector<std::uint16_t> a3{e4m3(448), e4m3(1)}, b3{e4m3(448), e4m3(1)};
  CHECK(qattn::ref::mma_dot(wgmma, a3, b3, 0.0f) == 200704.0f);
  // The accumulator is a term too: C = 2^20 sets E = 20, and 1·1 is below 2^(20-13): D = C.
  CHECK(qattn::ref::mma_dot(wgmma, std::vector<std::uint16_t>{e4m3(1)}, std::vector<std::uint16_t>{e4m3(1)},
                            1048576.0f) == 1048576.0f);
  // HMMA with C added after the two halves (h100-mma-e4m3): C + 1 rounds to nearest even in float32.
  const MmaModel& mma8 = qattn::ref::mma_preset("h100-mma-e4m3");
  std::vector<std::uint16_t> ones(4, e4m3(0)), unit(4, e4m3(0));
  ones[0] = e4m3(1), unit[0] = e4m3(1);
  CHECK(qattn::ref::mma_dot(mma8, ones, unit, 16777216.0f) == 16777216.0f);     // 2^24 + 1: a tie, to even
  CHECK(qattn::ref::mma_dot(mma8, ones, unit, 16777218.0f) == 16777220.0f);     // 2^24 + 3: a tie, up to even
}

// Median relative error against the exact sum, over the outputs of one wgmma set.
double median_rel_error(const std::vector<double>& got, const std::vector<double>& exact) {
  std::vector<double> e;
  for (std::size_t i = 0; i < got.size(); ++i)
    if (exact[i] != 0) e.push_back(std::fabs(got[i] - exact[i]) / std::fabs(exact[i]));
  std::nth_element(e.begin(), e.begin() + static_cast<std::ptrdiff_t>(e.size() / 2), e.end());
  return e[e.size() / 2];
}

// docs/mma.md "The per-product bound", measured on wgmma_cublaslt_e4m3 (fast): the share of outputs the per-product
// FP22 model gets bit-equal to the H100, and its median relative error against the exact sum over the hardware's.
TEST_CASE("per-product-fp22 against the H100's fast wgmma: the agreement and error ratio docs/mma.md states", "[mma][h100]") {
  struct Row {
    std::size_t k;
    double share_percent;  // rounded to 0.01
    double error_ratio;    // rounded to 0.1
  };
  const Row table[] = {{32, 3.49, 6.3}, {64, 1.54, 9.6}, {128, 0.59, 14.7},
                       {256, 0.24, 21.1}, {1024, 0.02, 42.7}, {4096, 0.00, 85.1}};
  const fs::path file = kEmbedded / "wgmma_cublaslt_e4m3.safetensors";
  const std::vector<MmaVectorSet> sets = qattn::ref::mma_vector_sets(qattn::read_tensor_file(file), file.string());
  const MmaModel& fp22 = qattn::ref::mma_preset("per-product-fp22");
  for (const Row& row : table) {
    const auto it = std::find_if(sets.begin(), sets.end(),
                                 [&](const MmaVectorSet& s) { return s.depth == row.k && s.variant == "fast"; });
    REQUIRE(it != sets.end());
    const MmaVectorSet& s = *it;
    std::vector<double> exact, hw, bound;
    std::size_t equal = 0;
    for (std::size_t i = 0; i < s.rows; ++i)
      for (std::size_t j = 0; j < s.cols; ++j) {
        const std::span<const std::uint16_t> a(s.a.data() + i * s.depth, s.depth), b(s.bt.data() + j * s.depth, s.depth);
        // Every E4M3 product is a multiple of 2^-18 below 2^18, so the sum in units of 2^-18 is an exact int64.
        std::int64_t units = 0;
        for (std::size_t k = 0; k < s.depth; ++k)
          units += static_cast<std::int64_t>(std::ldexp(qattn::ref::lowp_decode(a[k], qattn::ref::fp8_e4m3fn()) *
                                                            qattn::ref::lowp_decode(b[k], qattn::ref::fp8_e4m3fn()),
                                                        18));
        exact.push_back(std::ldexp(static_cast<double>(units), -18));
        hw.push_back(s.d[i * s.cols + j]);
        bound.push_back(qattn::ref::mma_dot(fp22, a, b, 0.0f));
        equal += std::bit_cast<std::uint32_t>(static_cast<float>(bound.back())) ==
                 std::bit_cast<std::uint32_t>(static_cast<float>(hw.back()));
      }
    const double share = 100.0 * static_cast<double>(equal) / static_cast<double>(exact.size());
    const double ratio = median_rel_error(bound, exact) / median_rel_error(hw, exact);
    INFO("K = " << row.k << ": per-product-fp22 bit-equal to the H100 in " << share << " % of outputs, median relative "
                << "error " << ratio << " x the hardware's");
    CHECK(std::round(share * 100) / 100 == Approx(row.share_percent).margin(1e-9));
    CHECK(std::round(ratio * 10) / 10 == Approx(row.error_ratio).margin(1e-9));
  }
}

}  // namespace

// ---- the checks of a user's shapes, C and vector files (qattn mma, mma-check, qattn.mma; docs/mma.md "Bounds") ----
namespace {

using qattn::InputError;
using qattn::NamedTensor;
using qattn::Tensor;
using Shape = std::vector<std::int64_t>;

// The InputError a call throws, or a failed check.
template <class F>
InputError input_error(F&& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e;
  }
  FAIL("no InputError");
  throw std::logic_error("unreachable");
}

Tensor tensor_of(qattn::DType dtype, Shape shape, std::size_t bytes_per_element) {
  std::size_t n = 1;
  for (std::int64_t d : shape) n *= static_cast<std::size_t>(d);
  return Tensor{dtype, std::move(shape), std::vector<std::byte>(n * bytes_per_element)};
}

TEST_CASE("mma_shape: products whose count wraps or passes 1 GiB are refused with both shapes and the bytes", "[mma]") {
  // K = 0: the files hold no data, and D's count once wrapped to 0 (SIGSEGV) or to 16 (an out-of-bounds write).
  const InputError wide = input_error([] {
    qattn::ref::mma_shape(Shape{1 << 22, 1 << 21, 0}, Shape{1 << 22, 1 << 21, 0}, "a.npy", "bt.npy");
  });
  CHECK(wide.source() == "a.npy");
  CHECK(wide.field() == "shape");
  CHECK(wide.reason() == "A (4194304, 2097152, 0) and Bt (4194304, 2097152, 0) give D (4194304, 2097152, 2097152): "
                         "more than 2^64 bytes of float32 outputs, beyond the bound of 1073741824 bytes (1 GiB, "
                         "docs/mma.md)");
  const InputError wraps = input_error([] {
    qattn::ref::mma_shape(Shape{(std::int64_t{1} << 60) + 1, 0}, Shape{16, 0}, "a.npy", "bt.npy");
  });
  CHECK(wraps.reason().find("give D (1152921504606846977, 16): more than 2^64 bytes") != std::string::npos);
  const InputError big = input_error([] { qattn::ref::mma_shape(Shape{200000, 0}, Shape{200000, 0}, "a", "bt"); });
  CHECK(big.reason() == "A (200000, 0) and Bt (200000, 0) give D (200000, 200000): 160000000000 bytes of float32 "
                        "outputs, beyond the bound of 1073741824 bytes (1 GiB, docs/mma.md)");
  // The bound itself: 2^28 outputs pass, one row more does not.
  CHECK(qattn::ref::mma_shape(Shape{1 << 14, 0}, Shape{1 << 14, 0}, "a", "bt").outputs == std::size_t{1} << 28);
  CHECK_THROWS_AS(qattn::ref::mma_shape(Shape{(1 << 14) + 1, 0}, Shape{1 << 14, 0}, "a", "bt"), InputError);
  // A one-dimensional operand: the shape it got.
  const InputError flat = input_error([] { qattn::ref::mma_shape(Shape{5}, Shape{4, 5}, "a.npy", "bt.npy"); });
  CHECK(std::string(flat.what()) == "a.npy: shape: (5,) has 1 dimension: A [..., M, K] needs 2 or more");
  const InputError misfit = input_error([] { qattn::ref::mma_shape(Shape{2, 3, 4}, Shape{3, 3, 4}, "a", "bt.npy"); });
  CHECK(misfit.source() == "bt.npy");
  CHECK(misfit.reason().find("(3, 3, 4) does not fit A (2, 3, 4)") == 0);
  // An empty D with a leading product that overflows computes nothing.
  const qattn::ref::MmaShape empty =
      qattn::ref::mma_shape(Shape{1 << 30, 1 << 30, 1 << 30, 0, 0}, Shape{1 << 30, 1 << 30, 1 << 30, 7, 0}, "a", "bt");
  CHECK(empty.outputs == 0);
  CHECK(empty.d == Shape{1 << 30, 1 << 30, 1 << 30, 0, 7});
}

TEST_CASE("K = 0: every output is the empty sum, D = C (a -0 C gives +0 where C is added after the steps)", "[mma]") {
  const qattn::ref::MmaShape s = qattn::ref::mma_shape(Shape{2, 3, 0}, Shape{2, 2, 0}, "a", "bt");
  REQUIRE(s.outputs == 12);
  const std::vector<float> c{1.5f, -0.0f, 3e38f, -2.25f, 0.0f, 7.0f, 1e-40f, -1.0f, 0.5f, 4.0f, -8.0f, 0.25f};
  for (const MmaModel& m : qattn::ref::mma_presets()) {
    if (m.accumulator == qattn::ref::MmaAccumulator::f16) continue;  // 3e38 and 1e-40 are no binary16 values
    std::vector<float> d(s.outputs, 99.0f), zero(s.outputs, 99.0f);
    qattn::ref::mma_batched(m, s, {}, {}, c, d);
    qattn::ref::mma_batched(m, s, {}, {}, {}, zero);
    const bool plus_zero = m.c_add == qattn::ref::MmaCAdd::after || m.promote_steps > 0;
    for (std::size_t i = 0; i < c.size(); ++i) {
      INFO(m.name << " output " << i);
      CHECK(std::bit_cast<std::uint32_t>(d[i]) == std::bit_cast<std::uint32_t>(i == 1 && plus_zero ? 0.0f : c[i]));
      CHECK(std::bit_cast<std::uint32_t>(zero[i]) == 0u);
    }
  }
}

TEST_CASE("mma_accumulator: C float32 or float16, D's shape, and float16 values for an f16 accumulator", "[mma]") {
  const qattn::ref::MmaShape s = qattn::ref::mma_shape(Shape{1, 2, 4}, Shape{1, 2, 4}, "a", "bt");
  const MmaModel& acc16 = qattn::ref::mma_preset("h100-hmma-f16-acc16");
  const MmaModel& acc32 = qattn::ref::mma_preset("h100-hmma-f16");
  const std::vector<double> f64(4, 0.5);
  const InputError f64_error =
      input_error([&] { qattn::ref::mma_accumulator(acc32, s, "float64", Shape{1, 2, 2}, f64.data(), "c.npy"); });
  CHECK(std::string(f64_error.what()) == "c.npy: dtype: float64: expected float32 or float16");
  CHECK_THROWS_AS(qattn::ref::mma_accumulator(acc32, s, "int32", Shape{1, 2, 2}, f64.data(), "c"), InputError);
  const std::vector<float> tenth{0.1f, 1.0f, 2.0f, 3.0f};
  const InputError shape_error =
      input_error([&] { qattn::ref::mma_accumulator(acc32, s, "float32", Shape{2, 2}, tenth.data(), "c"); });
  CHECK(shape_error.reason() == "(2, 2): expected [..., M, N] = (1, 2, 2)");
  const InputError f16_error =
      input_error([&] { qattn::ref::mma_accumulator(acc16, s, "float32", Shape{1, 2, 2}, tenth.data(), "c"); });
  CHECK(f16_error.field() == "element 0");
  CHECK(f16_error.reason() == "0.100000001 is not a float16 value, and h100-hmma-f16-acc16 has an f16 accumulator "
                              "(round C to float16 first)");
  CHECK(qattn::ref::mma_accumulator(acc32, s, "float32", Shape{1, 2, 2}, tenth.data(), "c") == tenth);
  const std::vector<std::uint16_t> half{0x3c00, 0xc000, 0x7c00, 0x0001};  // 1, -2, inf, the least subnormal
  CHECK(qattn::ref::mma_accumulator(acc16, s, "float16", Shape{1, 2, 2}, half.data(), "c") ==
        std::vector<float>{1.0f, -2.0f, INFINITY, std::ldexp(1.0f, -24)});
}

// A vector file of one set "s" (A, Bt [batch, M, K] u8 codes) with `variants` outputs s_v<i>_D.
std::vector<NamedTensor> variants_file(std::size_t variants, Shape a, Shape bt, Shape d) {
  std::vector<NamedTensor> members{{"s_A", tensor_of(qattn::DType::u8, a, 1)},
                                   {"s_Bt", tensor_of(qattn::DType::u8, bt, 1)}};
  for (std::size_t i = 0; i < variants; ++i)
    members.push_back({"s_v" + std::to_string(i) + "_D", tensor_of(qattn::DType::f32, d, 4)});
  return members;
}

TEST_CASE("mma_vector_sets: the variants of a set share its operands, and the scan is linear in the members", "[mma]") {
  // 300 variants of A, Bt [1, 1, 2^23]: once 300 copies of 16 MiB of codes each (3.94 GB, then bad_alloc).
  const std::vector<MmaVectorSet> sets =
      qattn::ref::mma_vector_sets(variants_file(300, {1, 1, 1 << 23}, {1, 1, 1 << 23}, {1, 1, 1}), "v.npz");
  REQUIRE(sets.size() == 300);
  for (const MmaVectorSet& s : sets) {
    CHECK(s.operands == sets[0].operands);
    CHECK(s.a.data() == sets[0].operands->a.data());
    CHECK(s.bt.size() == std::size_t{1} << 23);
  }
  CHECK(sets[299].variant == "v299");
  // 100,000 variants of a tiny set (QATTN_TEST_SCALE of them under qemu or the sanitizers): the scan once compared
  // every output with every member (minutes); now well under a second, bounded here at 20 s for a loaded machine.
  const int n_variants = qattn::test::scaled(100000, 1000);
  qattn::test::announce_scale("mma_vector_sets: variants of one set", n_variants);
  const std::vector<NamedTensor> many = variants_file(n_variants, {1, 1, 4}, {1, 1, 4}, {1, 1, 1});
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<MmaVectorSet> wide = qattn::ref::mma_vector_sets(many, "many.npz");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO("100000 variants read in " << seconds << " s");
  CHECK(wide.size() == static_cast<std::size_t>(n_variants));
  CHECK(seconds < 20);
  // The model runs once for all the variants of a set.
  const std::vector<qattn::ref::MmaAgreement> r =
      qattn::ref::mma_agreements(qattn::ref::mma_preset("h100-wgmma-e4m3"), sets, 1);
  REQUIRE(r.size() == 300);
  CHECK(r[0].outputs == 1);
  CHECK(r[299].equal == 1);  // zeros times zeros: +0
}

TEST_CASE("mma_vector_sets refuses a set without a name or without outputs, and an output S_x_D belongs to set S_x", "[mma]") {
  std::vector<NamedTensor> unnamed{{"_A", tensor_of(qattn::DType::u8, {1, 2, 4}, 1)},
                                   {"_Bt", tensor_of(qattn::DType::u8, {1, 2, 4}, 1)},
                                   {"_D", tensor_of(qattn::DType::f32, {1, 2, 2}, 4)}};
  const InputError no_name = input_error([&] { qattn::ref::mma_vector_sets(unnamed, "v.npz"); });
  CHECK(no_name.field() == "_A");
  CHECK(no_name.reason().find("a set needs a name") == 0);
  const InputError empty =
      input_error([] { qattn::ref::mma_vector_sets(variants_file(1, {0, 2, 4}, {0, 2, 4}, {0, 2, 2}), "v.npz"); });
  CHECK(empty.field() == "s_v0_D");
  CHECK(empty.reason() == "shape (0, 2, 2): no output to check (a set needs tests, M and N of 1 or more)");
  CHECK_THROWS_AS(qattn::ref::mma_vector_sets(variants_file(1, {3, 0, 4}, {3, 2, 4}, {3, 0, 2}), "v.npz"), InputError);
  // Sets s and s_x: s_x_D and s_x_y_D are s_x's, s_y_D is s's.
  std::vector<NamedTensor> nested = variants_file(0, {1, 1, 4}, {1, 1, 4}, {});
  for (const char* name : {"s_x_A", "s_x_Bt"}) nested.push_back({name, tensor_of(qattn::DType::u8, {1, 1, 4}, 1)});
  for (const char* name : {"s_x_D", "s_y_D", "s_x_y_D"}) nested.push_back({name, tensor_of(qattn::DType::f32, {1, 1, 1}, 4)});
  const std::vector<MmaVectorSet> sets = qattn::ref::mma_vector_sets(nested, "v.npz");
  REQUIRE(sets.size() == 3);
  CHECK((sets[0].name == "s" && sets[0].variant == "y"));
  CHECK((sets[1].name == "s_x" && sets[1].variant.empty()));
  CHECK((sets[2].name == "s_x" && sets[2].variant == "y"));
  nested.push_back({"s_A", tensor_of(qattn::DType::u8, {1, 1, 4}, 1)});
  CHECK(input_error([&] { qattn::ref::mma_vector_sets(nested, "v.npz"); }).reason() == "set 's' is given twice");
  // The members' bytes are bounded before anything is converted.
  const InputError large = input_error(
      [] { qattn::ref::mma_vector_sets(variants_file(1, {1, 1, 1 << 27}, {1, 1, 1 << 27}, {1, 1, 1}), "big.npz"); });
  CHECK(large.field() == "members");
  CHECK(large.reason() == "hold 268435460 bytes, beyond the bound of 268435456 bytes (256 MiB, docs/mma.md)");
}

TEST_CASE("mma_agreement counts NaN/inf and GPU-zero mismatches apart from the relative error", "[mma]") {
  std::vector<NamedTensor> members = variants_file(0, {1, 2, 4}, {1, 2, 4}, {});
  members[0].tensor.bytes[0] = std::byte{0x7f};  // an E4M3 NaN in A's first row: both of its outputs are NaN
  Tensor d = tensor_of(qattn::DType::f32, {1, 2, 2}, 4);
  const float gpu[4] = {1.0f, 2.0f, 0.0f, 4.0f};  // the model gives NaN, NaN, +0, +0
  std::memcpy(d.bytes.data(), gpu, sizeof gpu);
  members.push_back({"s_D", std::move(d)});
  const MmaVectorSet set = qattn::ref::mma_vector_sets(members, "v.npz").at(0);
  const qattn::ref::MmaAgreement r = qattn::ref::mma_agreement(qattn::ref::mma_preset("h100-wgmma-e4m3"), set);
  CHECK(r.outputs == 4);
  CHECK(r.equal == 1);
  CHECK(r.nonfinite == 2);
  CHECK(r.gpu_zero == 0);
  CHECK(r.measured() == 1);
  CHECK(r.max_rel_error == 1.0);  // +0 against 4
}

TEST_CASE("mma_fit keeps the start model and its name when no setting reproduces more outputs", "[mma]") {
  const fs::path file = kEmbedded / "mma_sync_m16n8k16_f16f32.safetensors";
  const std::vector<MmaVectorSet> sets = qattn::ref::mma_vector_sets(qattn::read_tensor_file(file), file.string());
  const MmaModel& start = qattn::ref::mma_preset("h100-hmma-f16");
  std::vector<std::string> log;
  const MmaModel fitted = qattn::ref::mma_fit(start, sets, 1, &log);
  CHECK(fitted.name == "h100-hmma-f16");
  CHECK(fitted.validated);
  CHECK(fitted.describe() == start.describe());
  REQUIRE(!log.empty());
  CHECK(log.back().find("no change") == 0);
}

}  // namespace
